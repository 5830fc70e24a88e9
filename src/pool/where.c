/*
 * Where an address lies: which live block holds a device address, for every
 * pool of the process, in a few loads and one lock (docs/POOL.md).
 *
 * A radix table over 2 MiB chunks of the address space names the segment
 * that holds each chunk; it is read without a lock. Each segment keeps one
 * record per chunk it spans: a bitmap of the granules where a live block
 * starts (with a summary word over it), and the start of the live block
 * that covers the chunk's first byte. The block holding an address is then
 * the nearest live start at or below it in its chunk, or the block
 * covering the chunk: found in constant time, whatever the segment holds.
 *
 * The records are written under the segment's arena lock, the table by
 * atomic operations (segments of different arenas come and go at once). A
 * reader loads the segment from the table, locks its arena and checks the
 * table still names the segment and the segment holds the address (segment
 * records are never unmapped while the pool lives, so a stale one is safe to
 * read). A small block freed stays marked, pending or in its quick list
 * (entry.c's ca__stay_listed): the look-up that finds it checks its state. The
 * newest segment over a chunk is the one named: the driver handing out
 * addresses that a pool still lists means that pool's segment is gone (its
 * context is being destroyed, or a library freed it behind the pool's back),
 * and the pool about to forget it must not answer for them. Each chunk
 * counts the segments over it; one that two live segments share (only a
 * backend whose segments are not 2 MiB-aligned makes one) answers for the
 * newest, and for any other address says it cannot tell: then each pool is
 * asked, the old way.
 */

#define CA__CHUNK_SHIFT 21u
#define CA__GRANULE_SHIFT 9u /* log2(CA_GRANULE) */
#define CA__CHUNK_GRANULES (1u << (CA__CHUNK_SHIFT - CA__GRANULE_SHIFT))
/* Device addresses are user-space virtual addresses: 47 bits on x86-64,
 * 48 on aarch64. The table covers 2^48 bytes in leaves of 2^13 chunks. */
#define CA__INDEX_BITS 48u
#define CA__LEAF_BITS 13u
#define CA__LEAF_SLOTS (1u << CA__LEAF_BITS)
#define CA__LEAVES (1u << (CA__INDEX_BITS - CA__CHUNK_SHIFT - CA__LEAF_BITS))
#define CA__SHARED ((ca__segment *)1)

_Static_assert((1u << CA__GRANULE_SHIFT) == CA_GRANULE, "granule");

struct ca__chunk {
  uint64_t covers;  /* start of the block last live over its first byte */
  uint64_t summary; /* bit i: starts[i] is not 0 */
  uint64_t starts[CA__CHUNK_GRANULES / 64];
};

typedef struct ca__leaf {
  _Atomic(ca__segment *) named[CA__LEAF_SLOTS]; /* or CA__SHARED */
  atomic_uint segments[CA__LEAF_SLOTS];         /* over the chunk */
} ca__leaf;
static _Atomic(ca__leaf *) ca__leaves[CA__LEAVES];
/* Some segment could not be indexed (no memory for its records, or outside
 * the table): a chunk the table does not name may still be pooled. */
static atomic_bool ca__where_partial;

static uint64_t ca__chunk_of(uint64_t addr) { return addr >> CA__CHUNK_SHIFT; }
static unsigned ca__leaf_index(uint64_t chunk) {
  return (unsigned)(chunk & (CA__LEAF_SLOTS - 1));
}

/* The leaf holding `chunk`, or NULL when it is not made. */
static inline ca__leaf *ca__leaf_of(uint64_t chunk) {
  uint64_t leaf = chunk >> CA__LEAF_BITS;
  return leaf < CA__LEAVES
             ? atomic_load_explicit(&ca__leaves[leaf], memory_order_acquire)
             : NULL;
}

/* The same, made if need be (two arenas may race to make it). */
static ca__leaf *ca__leaf_made(uint64_t chunk) {
  uint64_t leaf = chunk >> CA__LEAF_BITS;
  if (leaf >= CA__LEAVES)
    return NULL;
  ca__leaf *l = atomic_load_explicit(&ca__leaves[leaf], memory_order_acquire);
  if (!l) {
    ca__leaf *fresh = ca_meta_alloc(sizeof(ca__leaf));
    if (!fresh)
      return NULL;
    if (atomic_compare_exchange_strong(&ca__leaves[leaf], &l, fresh))
      l = fresh;
    else
      ca_meta_free(fresh, sizeof(ca__leaf)); /* l is the winner's */
  }
  return l;
}

static uint64_t ca__chunks_in(const ca__segment *s) {
  return ca__chunk_of(s->addr + s->size - 1) - ca__chunk_of(s->addr) + 1;
}

/* Names s in the table for every chunk it spans (a segment without records
 * as one the table cannot answer for). Under its arena's lock. */
static void ca__where_add(ca__segment *s) {
  uint64_t n = ca__chunks_in(s);
  if (s->addr % CA_GRANULE == 0)
    s->chunks = ca_meta_alloc(n * sizeof(ca__chunk));
  for (uint64_t c = ca__chunk_of(s->addr), i = 0; i < n; i++, c++) {
    ca__leaf *l = ca__leaf_made(c);
    if (!l) {
      atomic_store(&ca__where_partial, true);
      continue;
    }
    atomic_fetch_add(&l->segments[ca__leaf_index(c)], 1);
    atomic_store_explicit(&l->named[ca__leaf_index(c)],
                          s->chunks ? s : CA__SHARED, memory_order_release);
  }
}

/* Takes s out of the table: a chunk no segment is over any more names
 * none; one s was named for, that another is still over, cannot tell. */
static void ca__where_drop(ca__segment *s) {
  uint64_t n = ca__chunks_in(s);
  for (uint64_t c = ca__chunk_of(s->addr), i = 0; i < n; i++, c++) {
    ca__leaf *l = ca__leaf_of(c);
    if (!l)
      continue;
    unsigned k = ca__leaf_index(c);
    unsigned left = atomic_fetch_sub(&l->segments[k], 1) - 1;
    ca__segment *was = s->chunks ? s : CA__SHARED;
    if (!atomic_compare_exchange_strong(&l->named[k], &was,
                                        left ? CA__SHARED : NULL) &&
        !left && was == CA__SHARED)
      atomic_compare_exchange_strong(&l->named[k], &was, NULL);
  }
  ca_meta_free(s->chunks, n * sizeof(ca__chunk));
  s->chunks = NULL;
}

/* Arenas freed, ever (a pool's destruction): a remembered block's arena
 * is still there while this has not moved. */
static _Atomic uint64_t ca__arenas_freed;

/* The live block the calling thread's last look-up found, and the counts
 * that say it still is: a loop over the same buffers needs no lock. Its
 * start is kept masked: thread-local storage is host memory the leak
 * report's scan reads, and a plain copy would make the block, once the
 * program loses it, read as still reachable. */
#define CA__RECENT_MASK 0x5a5a5a5a5a5a5a5aull
typedef struct ca__recent {
  ca__arena *arena;
  uint64_t removals, arenas_freed;
  uint64_t masked_lo, size; /* its requested bytes: start ^ mask, size */
} ca__recent;
static __thread ca__recent ca__recent_block CA__TLS;

/* A live block of arena p left use. Under its lock. */
static inline void ca__where_removed(ca__arena *p) {
  atomic_store_explicit(
      &p->removals,
      atomic_load_explicit(&p->removals, memory_order_relaxed) + 1,
      memory_order_release);
}

/* Records that block b became live, or left the index: its start's bit,
 * and, made live, the covering start of every chunk it runs over. A
 * covering start is never cleared: a look-up checks the block it names is
 * live and holds the address, and only a live block over the chunk's first
 * byte writes it, so a stale one names no block. A freed block kept listed
 * keeps its bit and its covering starts: no other block can start within
 * it. */
static inline void ca__where_mark(const ca__block *b, bool live) {
  ca__chunk *chunks = b->seg->chunks;
  if (!chunks)
    return;
  uint64_t first = ca__chunk_of(b->seg->addr), k = ca__chunk_of(b->addr);
  unsigned g = (unsigned)(b->addr >> CA__GRANULE_SHIFT) % CA__CHUNK_GRANULES;
  ca__chunk *c = &chunks[k - first];
  uint64_t bit = 1ull << (g % 64);
  if (live) {
    c->starts[g / 64] |= bit;
    c->summary |= 1ull << (g / 64);
  } else {
    if (!(c->starts[g / 64] &= ~bit))
      c->summary &= ~(1ull << (g / 64));
    return;
  }
  uint64_t last = ca__chunk_of(b->addr + b->size - 1);
  for (uint64_t j = k + 1; j <= last; j++)
    chunks[j - first].covers = b->addr;
}

/* Block b of arena p, out of use already (ca__where_removed counted it),
 * leaves the live table and the address index: freed, or a listed block
 * merging (bins.c) or in a lost segment (segments.c). Under its lock. */
static inline void ca__delist(ca__arena *p, ca__block *b) {
  ca__live_remove(&p->live, b);
  ca__where_mark(b, false);
  b->listed = false;
}

/* Block b of arena p became live, or stopped being: in the arena's live
 * table and in the address index, which answer together. Under its lock;
 * inlined whole, so that each caller keeps only its own half. */
static inline __attribute__((always_inline)) void
ca__set_live(ca__arena *p, ca__block *b, bool live) {
  if (live) {
    ca__live_add(&p->live, b);
    ca__where_mark(b, true);
  } else {
    ca__where_removed(p);
    ca__delist(p, b);
  }
}

static unsigned ca__top_bit(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

/* The start of the live block of s at or below addr nearest to it, by its
 * chunk's record; 0 if none. */
static uint64_t ca__where_start(const ca__segment *s, uint64_t addr) {
  const ca__chunk *c = &s->chunks[ca__chunk_of(addr) - ca__chunk_of(s->addr)];
  uint64_t base = addr & ~((1ull << CA__CHUNK_SHIFT) - 1);
  unsigned g = (unsigned)((addr - base) >> CA__GRANULE_SHIFT), w = g / 64;
  uint64_t here = c->starts[w] & (~0ull >> (63 - g % 64));
  if (!here) {
    uint64_t below = c->summary & ((1ull << w) - 1);
    if (!below)
      return c->covers;
    w = ca__top_bit(below);
    here = c->starts[w];
  }
  return base + (((uint64_t)w * 64 + ca__top_bit(here)) << CA__GRANULE_SHIFT);
}

/* What the table says of addr: its segment, NULL when no pool holds it,
 * CA__SHARED when it cannot say; *slot is where it said so (NULL: no
 * slot). */
static ca__segment *ca__where_segment(uint64_t addr,
                                      _Atomic(ca__segment *) **slot) {
  ca__leaf *l = ca__leaf_of(ca__chunk_of(addr));
  *slot = l ? &l->named[ca__leaf_index(ca__chunk_of(addr))] : NULL;
  ca__segment *s =
      *slot ? atomic_load_explicit(*slot, memory_order_acquire) : NULL;
  if (!s && atomic_load_explicit(&ca__where_partial, memory_order_relaxed))
    return CA__SHARED;
  return s;
}

/* The segment holding addr with its arena locked, as the table names it;
 * NULL (nothing locked) when no pool holds addr; CA__SHARED when the table
 * cannot say. */
static ca__segment *ca__where_lock(uint64_t addr, ca__arena **arena) {
  for (;;) {
    _Atomic(ca__segment *) *slot;
    ca__segment *s = ca__where_segment(addr, &slot);
    if (!s || s == CA__SHARED)
      return s;
    ca__arena *p = atomic_load_explicit(&s->arena, memory_order_acquire);
    if (!p)
      continue; /* a record being made again: ask again */
    ca_lock_acquire(&p->lock);
    if (atomic_load_explicit(slot, memory_order_relaxed) == s &&
        atomic_load_explicit(&s->arena, memory_order_relaxed) == p) {
      if (addr - s->addr < s->size) {
        *arena = p;
        return s;
      }
      ca_lock_release(&p->lock);
      return CA__SHARED; /* another segment's part of a shared chunk */
    }
    ca_lock_release(&p->lock); /* changed under us: ask again */
  }
}

/* The live block of s holding addr (within its rounded size), or NULL.
 * Under the arena's lock. The nearest start may be a listed freed
 * block's, which holds no live bytes. */
static ca__block *ca__where_block(ca__arena *p, const ca__segment *s,
                                  uint64_t addr) {
  uint64_t start = ca__where_start(s, addr);
  ca__block *b = start ? ca__live_get(&p->live, start) : NULL;
  return b && b->state == CA__LIVE && b->seg == s && addr - b->addr < b->size
             ? b
             : NULL;
}

/* Whether addr lies in the live block the calling thread found last, and
 * that block is still live: then [*lo, *hi) are its requested bytes. */
static inline bool ca__where_recent(uint64_t addr, uint64_t *lo, uint64_t *hi) {
  const ca__recent *r = &ca__recent_block;
  uint64_t start = r->masked_lo ^ CA__RECENT_MASK;
  if (!r->arena || addr - start >= r->size ||
      atomic_load_explicit(&ca__arenas_freed, memory_order_acquire) !=
          r->arenas_freed ||
      atomic_load_explicit(&r->arena->removals, memory_order_acquire) !=
          r->removals)
    return false;
  *lo = start;
  *hi = start + r->size;
  return true;
}

/* Remembers the live block of arena p at [lo, lo + requested) for the
 * calling thread. Under the arena's lock. */
static void ca__where_remember(ca__arena *p, uint64_t lo, uint64_t requested) {
  ca__recent_block = (ca__recent){
      .arena = p,
      .removals = atomic_load_explicit(&p->removals, memory_order_relaxed),
      .arenas_freed = atomic_load_explicit(&ca__arenas_freed, memory_order_relaxed),
      .masked_lo = lo ^ CA__RECENT_MASK,
      .size = requested};
}

/* The requested bytes of the live block of s holding addr, by its slot
 * alone (no block record read; a listed freed block's slot asks for none): true
 * with [*lo, *hi) set, else false. Under the arena's lock; s is indexed. */
static bool ca__where_bounds(ca__arena *p, const ca__segment *s, uint64_t addr,
                             uint64_t *lo, uint64_t *hi) {
  uint64_t start = ca__where_start(s, addr);
  const ca__live_slot *slot = start ? ca__live_slot_of(&p->live, start) : NULL;
  if (!slot || addr - start >= slot->requested)
    return false;
  *lo = start;
  *hi = start + slot->requested;
  return true;
}
