/*
 * The pool (see pool.h): segments from the backend, carved into blocks.
 *
 * Layout of the state:
 * - Every segment keeps its blocks in address order (prev/next), so a freed
 *   block finds its neighbours in O(1) and merges with the free ones.
 * - Free blocks below max_split_size sit in a two-level segregated fit index
 *   (TLSF): 16 size classes per power of two, with a bitmap per level, so the
 *   first class holding a block large enough is found with two bit scans.
 * - Free blocks at or above max_split_size sit apart, in a list sorted by
 *   size: they are few, never split, and serve only large requests.
 * - Live blocks sit in a hash table keyed by address (uthash): it answers
 *   "is this pointer ours?" on free and is what the leak report reads.
 * - Segments whose every byte is free also sit in a least-recently-freed
 *   list: the garbage collector and the memory limit give those back first.
 * - Under CA_REUSE_SAFE, freed blocks wait until device work queued before
 *   their free has finished. They gather in an open batch; when the pool
 *   next misses, the backend makes one marker for the whole batch, which
 *   joins a FIFO of closed batches; a batch whose marker has passed (polled
 *   without waiting) goes back to the cache. Growing is the last resort:
 *   while what is pending could serve the request, the pool waits for the
 *   markers, oldest first, before it reserves more (a wait for work already
 *   queued, never longer than the wait cudaFree makes at every free). So a
 *   free costs a list append, the driver is asked once per batch, not once
 *   per free, and the pool stays as small as under immediate reuse.
 *   A backend that can fence (the CUDA one) makes waiting rare: a fence
 *   orders all later device work after all earlier work on the device
 *   itself, so every pending block may be handed out at once, the host
 *   never blocked. The pool fences at a miss, and before a large request
 *   (large blocks must merge as freed, as under immediate reuse) when the
 *   cache would serve it poorly and enough is pending to be worth it, but
 *   not more often than once per CA__FENCE_EVERY large requests: a fence
 *   costs 0.5-1.5 us of driver calls (tests/bench/bench_fence.cu).
 * - Freed small blocks (requests up to CA_SMALL_REQUEST) are not merged at
 *   once: they wait, whole, in a LIFO "quick" list per size class (deferred
 *   coalescing, as dlmalloc's fast bins), so the steady state of a training
 *   loop, which frees and asks again for the same sizes, costs a list push
 *   and a pop. Any request of the small heap that the quick lists and the
 *   bins cannot serve first merges every quick block into the bins (a large
 *   request leaves them parked: they cannot serve it); so does every
 *   operation that needs the merged picture (growing, giving memory back,
 *   statistics).
 *   Large blocks merge at once: parked unmerged, they kept their neighbours
 *   from forming the larger blocks that later requests needed, and a
 *   ResNet training loop reserved 20-30% more (tests/bench/bench_replay).
 * - The pool grows past the most it ever reserved only after giving back
 *   the fully free segments that have stayed idle (CA_TRADE_IDLE_FREES):
 *   memory the program no longer asks for in that shape is traded for the
 *   shape it asks for now.
 * - A miss merges: the heap's other fully free segments are all smaller
 *   than the request (else one would have served it), so they go back and
 *   the new segment is made as large as they were together, when that is
 *   larger than the request's own. Their bytes return as one range that
 *   serves the request and, split, whatever they served, so the pool grows
 *   by the request at most and never needs those shapes back: freed pieces
 *   of one range merge, pieces of separate segments never could. On
 *   recorded ResNet training traces, merging with large segments rounded to
 *   2 MiB only keeps 4-13% less reserved (tests/bench/bench_replay), at the
 *   cost of more segments given back in the first two steps, none later.
 *
 * - A pool is split into up to CA_POOL_ARENAS arenas, each the whole of the
 *   above under its own lock, so that threads allocating at once do not
 *   queue on one lock. A thread uses one arena, the same index in every
 *   pool, until it keeps finding that arena's lock held; then it moves to
 *   the arena fewest threads use. So a single-threaded program, and threads
 *   that rarely overlap, stay on arena 0 and share one cache, while threads
 *   that allocate at the same time spread out. A block lives in the arena
 *   that served it; a free asks the thread's own arena first (threads mostly
 *   free what they allocated), then the others. Reserved memory is also
 *   counted pool-wide, so the memory limit and the collection threshold
 *   weigh the whole pool; an arena short of memory makes the others give
 *   back their free segments, and one that cannot serve a request at all
 *   borrows from their caches before failing. No code holds two arena locks
 *   at once (but the consistency check, which takes them in index order).
 *
 * Block and segment records come from each arena's own slabs, so serving a
 * request never calls malloc.
 */
#include "pool.h"

#include "fork.h"
#include "lock.h"
#include "stats.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Addresses are granule-aligned, so their low bits carry nothing: mix with a
 * multiplicative hash and keep the high half. */
static inline unsigned ca__hash_addr(uint64_t addr) {
  return (unsigned)((addr * 0x9E3779B97F4A7C15ull) >> 32);
}
#define HASH_FUNCTION(keyptr, keylen, hashv)                                   \
  ((hashv) = ca__hash_addr(*(const uint64_t *)(keyptr)))
#define HASH_KEYCMP(a, b, len)                                                 \
  (*(const uint64_t *)(a) != *(const uint64_t *)(b))
/* A failed bucket expansion only makes chains longer; never abort. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

/* Size classes: CA__SL_COUNT per power of two of granules. */
#define CA__SL_BITS 4
#define CA__SL_COUNT (1u << CA__SL_BITS)
#define CA__FL_COUNT 40
/* Requests above this (64 TiB) cannot be real; refuse before any arithmetic
 * on them can overflow. */
#define CA__MAX_REQUEST (1ull << 46)
/* How many blocks of the request's own size class are looked at for a
 * tighter fit before falling back to the next class up. */
#define CA__CLASS_SCAN 8
/* A large request fences first only when the pending blocks are at least
 * 1/2^CA__FENCE_SHARE of the pool and the cache's best block wastes more
 * than 1/2^CA__FENCE_WASTE of the request (see ca__fence_first): on
 * recorded ResNet traces, a seventh of the fences of fencing before every
 * large request, for 0-3% more memory. */
#define CA__FENCE_SHARE 5
#define CA__FENCE_WASTE 2
/* ... and at most once per this many large requests: on the same traces,
 * 25-45% fewer fences than fencing whenever the rule above says so, a
 * quarter of them on a random mix of sizes (tests/bench/bench_pool), for
 * memory within 1%. */
#define CA__FENCE_EVERY 16
/* Off the hot path: a thread on its own arena, uncontended, never calls
 * these, and the compiler lays out the hot path around them. */
#define CA__COLD __attribute__((cold, noinline))
/* Records allocated at once when a slab runs dry. */
#define CA__SLAB_BATCH 128

/* A block's state. GONE: freed, but its bytes are never handed out again
 * while its segment lives (they were shared with another process, or the
 * segment was freed behind the pool's back); it never merges. */
enum { CA__FREE = 1, CA__LIVE, CA__HELD, CA__QUICK, CA__GONE };

typedef struct ca__segment ca__segment;
typedef struct ca__heap ca__heap;
typedef struct ca__batch ca__batch;

typedef struct ca__block {
  uint64_t addr;
  uint64_t size;
  uint64_t requested;
  uint64_t seq;
  uint64_t time_ns;
  struct ca__block *prev, *next;           /* neighbours in the segment */
  struct ca__block *link_prev, *link_next; /* bin, oversize, held or quick */
  ca__segment *seg;
  int state;
  /* GONE when freed: shared with another process, or pending in a lost
   * segment (one flag, so a free checks one byte it already has). */
  bool keep_out;
  unsigned fl, sl; /* size class, while in the bins */
  uint32_t tag;    /* the caller's, while CA__LIVE */
  UT_hash_handle hh; /* in the live table while CA__LIVE */
} ca__block;

struct ca__segment {
  uint64_t addr;
  uint64_t size;
  ca__heap *heap;
  ca__block *first;
  ca__segment *prev, *next;         /* all segments of the arena */
  ca__segment *lru_prev, *lru_next; /* fully free segments, oldest first */
  uint64_t last_free; /* free_tick of the latest free inside it */
  int in_lru;
  bool has_gone; /* holds GONE blocks: "fully free" means FREE or GONE */
  bool lost;     /* freed behind the pool's back: never used or released
                    again; its records go when its last block does */
  UT_hash_handle hh; /* in the arena's segment table, keyed by base */
};

/* Blocks freed before one backend marker, waiting for it to pass. */
struct ca__batch {
  uint64_t marker;
  ca__block *head, *tail;
  uint64_t bytes;
  ca__batch *next;
};

struct ca__heap {
  uint64_t fl_bitmap;
  uint32_t sl_bitmap[CA__FL_COUNT];
  ca__block *bins[CA__FL_COUNT][CA__SL_COUNT];
  ca__block *oversize;    /* ascending by size */
  ca__block *quick[CA__FL_COUNT][CA__SL_COUNT]; /* freed, not yet merged */
  uint64_t quick_fl_bitmap;
  uint32_t quick_sl_bitmap[CA__FL_COUNT];
  uint64_t oversize_from; /* blocks this large are oversize */
  int large;
};

typedef struct ca__slab {
  void *free;
  void *chunks;
  size_t obj_size;
} ca__slab;

/* A cache line. Arenas start on one and the pool's counters that arenas
 * write sit on their own: a line that threads on different arenas write
 * would pass from core to core at every call. */
#define CA__LINE 64

/* One lock's share of a pool. The functions below that serve requests work
 * within one arena, named `p` as they would name a pool of one arena. */
typedef struct ca__arena {
  _Alignas(CA__LINE) ca_lock lock;
  ca_pool *pool;
  unsigned index; /* in pool->arenas */
  /* The pool's, copied when the arena is made (they never change), so that
   * the arena's code reads them in one step. */
  const ca_backend *backend;
  int device;
  ca_pool_options opt;
  ca__heap small, large;
  ca__segment *segments;
  ca__segment *segment_table; /* the same segments, by base address */
  /* The same segments sorted by address, for "which holds this address"
   * (pointer queries); lost ones leave it. */
  ca__segment **by_addr;
  size_t nsegs, segs_cap;
  ca__segment *lru_head, *lru_tail;
  ca__block *held_head, *held_tail; /* the open batch: no marker yet */
  uint64_t open_bytes;
  ca__batch *batch_head, *batch_tail; /* closed batches, oldest first */
  uint64_t held_bytes; /* in the open batch and the closed ones */
  unsigned large_since_fence; /* large requests since the last fence */
  uint64_t quick_bytes;
  uint64_t gone_bytes; /* in GONE blocks */
  uint64_t generation; /* bumped by drop_all: lets a waiter see it */
  uint64_t gc_budget;  /* bytes; 0 until known */
  uint64_t next_seq, seq_end; /* the allocation numbers the arena holds */
  uint64_t free_tick; /* counts frees: orders the LRU list */
  ca__block *live;     /* the live table */
  ca__block sentinel;  /* keeps the table allocated while it is empty */
  ca__slab block_slab, segment_slab, batch_slab;
  /* The arena's own figures. Its reserved_bytes count its own segments; the
   * pool's count is pool->reserved. */
  cudalloc_device_stats stats;
} ca__arena;

struct ca_pool {
  /* Arena 0 is made with the pool, the others when a thread first needs
   * them; each is published once and lives as long as the pool. */
  _Atomic(ca__arena *) arenas[CA_POOL_ARENAS];
  const ca_backend *backend;
  int device;
  ca_pool_options opt;
  /* Bytes of the segments the arenas hold, and their peak: exact for the
   * pool, whichever arenas reserve and release. */
  _Alignas(CA__LINE) _Atomic uint64_t reserved;
  _Atomic uint64_t reserved_peak;
  /* reserved, plus the segments being asked of the backend right now: what
   * the collection threshold weighs; booked in the device's budget too. */
  _Atomic uint64_t committed;
  ca_budget *budget; /* the device's (options), or `unlimited` */
  ca_budget unlimited;
  _Atomic uint64_t seq; /* allocation numbers handed to the arenas so far */
};

/* Arena `index` of the pool, or NULL when not made yet. */
static inline ca__arena *ca__arena_at(ca_pool *pool, unsigned index) {
  return atomic_load_explicit(&pool->arenas[index], memory_order_acquire);
}

/* The arenas made so far, in index order, into `out`; returns how many. */
static unsigned ca__arenas(ca_pool *pool, ca__arena *out[CA_POOL_ARENAS]) {
  unsigned n = 0;
  for (unsigned i = 0; i < CA_POOL_ARENAS; i++)
    if ((out[n] = ca__arena_at(pool, i)) != NULL)
      n++;
  return n;
}

/* ---- Small helpers ------------------------------------------------------ */

static inline uint64_t ca__round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

static uint64_t ca__clock_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* When a block was allocated: to within a few milliseconds is enough. */
static uint64_t ca__now_ns(void) {
  return ca__clock_ns(CLOCK_MONOTONIC_COARSE);
}

static void ca__stat_add(cudalloc_stat *s, uint64_t v) {
  s->current += v;
  s->total += v;
  if (s->current > s->peak)
    s->peak = s->current;
}

static void ca__stat_sub(cudalloc_stat *s, uint64_t v) { s->current -= v; }

static void *ca__slab_get(ca__slab *s) {
  if (!s->free) {
    char *chunk = malloc(sizeof(void *) + s->obj_size * CA__SLAB_BATCH);
    if (!chunk)
      return NULL;
    *(void **)chunk = s->chunks;
    s->chunks = chunk;
    char *objs = chunk + sizeof(void *);
    for (size_t i = 0; i < CA__SLAB_BATCH; i++) {
      *(void **)(objs + i * s->obj_size) = s->free;
      s->free = objs + i * s->obj_size;
    }
  }
  void *obj = s->free;
  s->free = *(void **)obj;
  return obj;
}

static void ca__slab_put(ca__slab *s, void *obj) {
  *(void **)obj = s->free;
  s->free = obj;
}

static void ca__slab_destroy(ca__slab *s) {
  while (s->chunks) {
    void *next = *(void **)s->chunks;
    free(s->chunks);
    s->chunks = next;
  }
  s->free = NULL;
}

/* ---- Size classes --------------------------------------------------------- */

static inline void ca__class_of(uint64_t size, unsigned *fl, unsigned *sl) {
  uint64_t n = size / CA_GRANULE;
  if (n < CA__SL_COUNT) {
    *fl = 0;
    *sl = (unsigned)n;
    return;
  }
  unsigned msb = 63u - (unsigned)__builtin_clzll(n);
  *fl = msb - CA__SL_BITS + 1;
  *sl = (unsigned)(n >> (msb - CA__SL_BITS)) & (CA__SL_COUNT - 1);
}

/* The smallest class boundary at or above `size`: every block of that class
 * or above fits a request of `size`. */
static inline uint64_t ca__class_ceiling(uint64_t size) {
  uint64_t n = size / CA_GRANULE;
  if (n < CA__SL_COUNT)
    return size;
  unsigned msb = 63u - (unsigned)__builtin_clzll(n);
  uint64_t step = (1ull << (msb - CA__SL_BITS)) - 1;
  return ((n + step) & ~step) * CA_GRANULE;
}

/* ---- Free-block index ----------------------------------------------------- */

static inline int ca__is_oversize(const ca__heap *h, uint64_t size) {
  return size >= h->oversize_from;
}

static void ca__link_remove(ca__block **head, ca__block *b) {
  if (b->link_prev)
    b->link_prev->link_next = b->link_next;
  else
    *head = b->link_next;
  if (b->link_next)
    b->link_next->link_prev = b->link_prev;
  b->link_prev = b->link_next = NULL;
}

static void ca__index_insert(ca__block *b) {
  ca__heap *h = b->seg->heap;
  if (ca__is_oversize(h, b->size)) {
    ca__block **at = &h->oversize, *prev = NULL;
    while (*at && (*at)->size < b->size) {
      prev = *at;
      at = &(*at)->link_next;
    }
    b->link_prev = prev;
    b->link_next = *at;
    if (*at)
      (*at)->link_prev = b;
    *at = b;
    return;
  }
  unsigned fl, sl;
  ca__class_of(b->size, &fl, &sl);
  b->fl = fl;
  b->sl = sl;
  ca__block **head = &h->bins[fl][sl];
  b->link_prev = NULL;
  b->link_next = *head;
  if (*head)
    (*head)->link_prev = b;
  *head = b;
  h->sl_bitmap[fl] |= 1u << sl;
  h->fl_bitmap |= 1ull << fl;
}

static void ca__index_remove(ca__block *b) {
  ca__heap *h = b->seg->heap;
  if (ca__is_oversize(h, b->size)) {
    ca__link_remove(&h->oversize, b);
    return;
  }
  unsigned fl = b->fl, sl = b->sl;
  ca__link_remove(&h->bins[fl][sl], b);
  if (!h->bins[fl][sl]) {
    h->sl_bitmap[fl] &= ~(1u << sl);
    if (!h->sl_bitmap[fl])
      h->fl_bitmap &= ~(1ull << fl);
  }
}

/* The first block of the first non-empty class at or above (fl, sl). */
static ca__block *ca__first_from(ca__heap *h, unsigned fl, unsigned sl) {
  uint32_t slmap = h->sl_bitmap[fl] & (~0u << sl);
  if (!slmap) {
    uint64_t flmap = fl + 1 < 64 ? h->fl_bitmap & (~0ull << (fl + 1)) : 0;
    if (!flmap)
      return NULL;
    fl = (unsigned)__builtin_ctzll(flmap);
    slmap = h->sl_bitmap[fl];
  }
  return h->bins[fl][__builtin_ctz(slmap)];
}

/* A good fit among blocks below max_split_size: the tightest of the first few
 * blocks in the request's own class, else any block of the next class that
 * is guaranteed to fit. */
static ca__block *ca__find_binned(ca__heap *h, uint64_t size) {
  unsigned fl, sl;
  uint64_t ceiling = ca__class_ceiling(size);
  if (ceiling != size) {
    ca__class_of(size, &fl, &sl);
    ca__block *best = NULL;
    ca__block *b = h->bins[fl][sl];
    for (int i = 0; b && i < CA__CLASS_SCAN; b = b->link_next, i++) {
      if (b->size >= size && (!best || b->size < best->size)) {
        best = b;
        if (b->size == size)
          break;
      }
    }
    if (best)
      return best;
  }
  ca__class_of(ceiling, &fl, &sl);
  if (fl >= CA__FL_COUNT)
    return NULL;
  return ca__first_from(h, fl, sl);
}

/* Oversize blocks serve only requests at or above max_split_size, and only
 * when they waste less than CA_OVERSIZE_MAX_WASTE. */
static ca__block *ca__find_oversize(ca__heap *h, uint64_t size) {
  for (ca__block *b = h->oversize; b; b = b->link_next) {
    if (b->size >= size)
      return b->size - size < CA_OVERSIZE_MAX_WASTE ? b : NULL;
  }
  return NULL;
}

static ca__heap *ca__heap_for(ca__arena *p, uint64_t size) {
  return size <= CA_SMALL_REQUEST ? &p->small : &p->large;
}

static ca__block *ca__find(ca__arena *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  if (ca__is_oversize(h, size))
    return ca__find_oversize(h, size);
  return ca__find_binned(h, size);
}

/* ---- Quick lists ---------------------------------------------------------- */

/* Parks a freed block, unmerged, where a request of its exact size finds it
 * first. */
static void ca__quick_push(ca__arena *p, ca__block *b) {
  ca__heap *h = b->seg->heap;
  unsigned fl, sl;
  ca__class_of(b->size, &fl, &sl);
  b->state = CA__QUICK;
  b->fl = fl;
  b->sl = sl;
  b->link_next = h->quick[fl][sl];
  h->quick[fl][sl] = b;
  h->quick_sl_bitmap[fl] |= 1u << sl;
  h->quick_fl_bitmap |= 1ull << fl;
  p->quick_bytes += b->size;
}

static ca__block *ca__quick_pop(ca__arena *p, ca__heap *h, unsigned fl,
                                unsigned sl) {
  ca__block *b = h->quick[fl][sl];
  h->quick[fl][sl] = b->link_next;
  b->link_next = NULL;
  if (!h->quick[fl][sl]) {
    h->quick_sl_bitmap[fl] &= ~(1u << sl);
    if (!h->quick_sl_bitmap[fl])
      h->quick_fl_bitmap &= ~(1ull << fl);
  }
  p->quick_bytes -= b->size;
  return b;
}

/* The most recently freed block of exactly `size` bytes, if it heads its
 * class's quick list. Oversize requests never get here. */
static ca__block *ca__quick_take(ca__arena *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  unsigned fl, sl;
  ca__class_of(size, &fl, &sl);
  ca__block *b = h->quick[fl][sl];
  if (!b || b->size != size)
    return NULL;
  return ca__quick_pop(p, h, fl, sl);
}

static void ca__block_make_free(ca__arena *p, ca__block *b);

/* Merges the parked blocks of heap h into its bins. */
static void ca__heap_flush(ca__arena *p, ca__heap *h) {
  while (h->quick_fl_bitmap) {
    unsigned fl = (unsigned)__builtin_ctzll(h->quick_fl_bitmap);
    unsigned sl = (unsigned)__builtin_ctz(h->quick_sl_bitmap[fl]);
    ca__block_make_free(p, ca__quick_pop(p, h, fl, sl));
  }
}

/* Merges every parked block into the bins. */
static void ca__quick_flush(ca__arena *p) {
  ca__heap_flush(p, &p->small);
  ca__heap_flush(p, &p->large);
}

/* ---- Reserved memory, pool-wide ------------------------------------------ */

/* What the pool holds or is reserving now, all arenas together: the figure
 * the collection threshold weighs. */
static uint64_t ca__pool_reserved(const ca__arena *p) {
  return atomic_load_explicit(&p->pool->committed, memory_order_relaxed);
}

/* A booked segment was reserved: the pool's count and its peak. */
static void ca__pool_reserved_add(ca__arena *p, uint64_t seg) {
  ca_pool *pool = p->pool;
  uint64_t now =
      atomic_fetch_add_explicit(&pool->reserved, seg, memory_order_relaxed) +
      seg;
  uint64_t peak = atomic_load_explicit(&pool->reserved_peak,
                                       memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(&pool->reserved_peak, &peak,
                                                now, memory_order_relaxed,
                                                memory_order_relaxed))
    ;
}

/* Segments of `bytes` left the pool (given back, or dropped with a
 * context). */
static void ca__pool_reserved_sub(ca__arena *p, uint64_t bytes) {
  atomic_fetch_sub_explicit(&p->pool->reserved, bytes, memory_order_relaxed);
  atomic_fetch_sub_explicit(&p->pool->committed, bytes, memory_order_relaxed);
  ca_budget_unbook(p->pool->budget, bytes);
}

/* ---- Segments ------------------------------------------------------------- */

/* Whether no byte of the segment is in use: one free block, or, once it
 * holds GONE blocks, nothing but FREE and GONE ones. */
static int ca__segment_is_free(const ca__segment *s) {
  if (!s->has_gone)
    return s->first->state == CA__FREE && !s->first->next;
  for (const ca__block *b = s->first; b; b = b->next)
    if (b->state != CA__FREE && b->state != CA__GONE)
      return 0;
  return 1;
}

static void ca__lru_remove(ca__arena *p, ca__segment *s) {
  if (!s->in_lru)
    return;
  if (s->lru_prev)
    s->lru_prev->lru_next = s->lru_next;
  else
    p->lru_head = s->lru_next;
  if (s->lru_next)
    s->lru_next->lru_prev = s->lru_prev;
  else
    p->lru_tail = s->lru_prev;
  s->lru_prev = s->lru_next = NULL;
  s->in_lru = 0;
}

/* Files a segment that just became fully free by the time of its last free:
 * parked frees merge late, so the latest-freed segment does not always come
 * last. The search starts from the newest end, where it nearly always
 * stops. */
static void ca__lru_push(ca__arena *p, ca__segment *s) {
  ca__segment *after = p->lru_tail;
  while (after && after->last_free > s->last_free)
    after = after->lru_prev;
  s->lru_prev = after;
  s->lru_next = after ? after->lru_next : p->lru_head;
  if (s->lru_next)
    s->lru_next->lru_prev = s;
  else
    p->lru_tail = s;
  if (after)
    after->lru_next = s;
  else
    p->lru_head = s;
  s->in_lru = 1;
}

/* ---- The address index ---------------------------------------------------- */

/* The position in by_addr of the first segment based above `addr`. */
static size_t ca__addr_upper(const ca__arena *p, uint64_t addr) {
  size_t lo = 0, hi = p->nsegs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->by_addr[mid]->addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The segment of the arena that holds `addr`, or NULL. */
static ca__segment *ca__segment_at(const ca__arena *p, uint64_t addr) {
  size_t i = ca__addr_upper(p, addr);
  if (i == 0)
    return NULL;
  ca__segment *s = p->by_addr[i - 1];
  return addr - s->addr < s->size ? s : NULL;
}

/* Room for one more segment in the index (grown only when a segment is
 * reserved, a driver call anyway). */
static bool ca__addr_room(ca__arena *p) {
  if (p->nsegs < p->segs_cap)
    return true;
  size_t cap = p->segs_cap ? 2 * p->segs_cap : 16;
  ca__segment **v = realloc(p->by_addr, cap * sizeof(*v));
  if (!v)
    return false;
  p->by_addr = v;
  p->segs_cap = cap;
  return true;
}

static void ca__addr_insert(ca__arena *p, ca__segment *s) {
  size_t i = ca__addr_upper(p, s->addr);
  memmove(&p->by_addr[i + 1], &p->by_addr[i],
          (p->nsegs - i) * sizeof(*p->by_addr));
  p->by_addr[i] = s;
  p->nsegs++;
}

/* Bases in the index are distinct: s sits just below the upper bound. */
static void ca__addr_remove(ca__arena *p, ca__segment *s) {
  size_t i = ca__addr_upper(p, s->addr);
  memmove(&p->by_addr[i - 1], &p->by_addr[i],
          (p->nsegs - i) * sizeof(*p->by_addr));
  p->nsegs--;
}

/* Gives a segment's records back to the slabs. */
static void ca__segment_put(ca__arena *p, ca__segment *s) {
  for (ca__block *b = s->first, *next; b; b = next) {
    next = b->next;
    ca__slab_put(&p->block_slab, b);
  }
  ca__slab_put(&p->segment_slab, s);
}

/* Takes a segment out of the arena's list and its counts: it holds no
 * memory of the pool's any more. */
static void ca__segment_forget(ca__arena *p, ca__segment *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    p->segments = s->next;
  if (s->next)
    s->next->prev = s->prev;
  ca__pool_reserved_sub(p, s->size);
  ca__stat_sub(&p->stats.reserved_bytes, s->size);
  ca__stat_sub(&p->stats.segments, 1);
}

/* Gives a fully free segment back to the backend. Whatever the backend says,
 * the pool forgets the segment: keeping a segment the driver may have freed
 * would be worse than leaking one it did not. */
static void ca__segment_release(ca__arena *p, ca__segment *s) {
  ca__lru_remove(p, s);
  HASH_DELETE(hh, p->segment_table, s);
  ca__addr_remove(p, s);
  p->backend->release(p->backend->ctx, p->device, s->addr, s->size);
  p->stats.backend_frees++;
  ca__segment_forget(p, s);
  for (ca__block *b = s->first; b; b = b->next) {
    if (b->state == CA__FREE)
      ca__index_remove(b);
    else
      p->gone_bytes -= b->size; /* a fully free segment holds no other */
  }
  ca__segment_put(p, s);
}

/* Gives back fully free segments, oldest first, until the pool's reserved
 * memory is at most `reserved_target`. Returns the bytes given back. */
static uint64_t ca__release_lru(ca__arena *p, uint64_t reserved_target) {
  uint64_t released = 0;
  while (p->lru_head && ca__pool_reserved(p) > reserved_target) {
    released += p->lru_head->size;
    ca__segment_release(p, p->lru_head);
  }
  return released;
}

/* ---- Blocks that never come back ------------------------------------------ */

/* Takes a freed block out of use for as long as its segment lives. */
static void ca__bury(ca__arena *p, ca__block *b) {
  b->state = CA__GONE;
  b->seg->has_gone = true;
  p->gone_bytes += b->size;
}

/* Forgets a lost segment once nothing in it is live or pending: its bytes
 * are no longer the pool's, so nothing is given back. */
static void ca__drop_if_dead(ca__arena *p, ca__segment *s) {
  for (const ca__block *b = s->first; b; b = b->next)
    if (b->state != CA__GONE)
      return;
  ca__segment_forget(p, s);
  p->gone_bytes -= s->size;
  ca__segment_put(p, s);
}

static size_t ca__live_in(const ca__segment *s) {
  size_t n = 0;
  for (const ca__block *b = s->first; b; b = b->next)
    n += b->state == CA__LIVE;
  return n;
}

/* A live block whose memory the driver freed: no longer the program's
 * (its address may already name another allocation). */
static void ca__forget_live(ca__arena *p, ca__block *b) {
  HASH_DELETE(hh, p->live, b);
  ca__stat_sub(&p->stats.requested_bytes, b->requested);
  ca__stat_sub(&p->stats.allocated_bytes, b->size);
  ca__stat_sub(&p->stats.blocks, 1);
  ca__bury(p, b);
}

/* A segment the driver freed behind the pool's back (it gave the bytes out
 * again, or says they are no allocation): a library calling the driver's
 * own cuMemFree on a pooled pointer, which no hook sees. None of its bytes
 * is handed out again, nor given back (they may be someone else's now),
 * and its live blocks are forgotten: their memory is gone. Its records stay,
 * counted as reserved, until its pending frees have come back. */
static void ca__segment_lose(ca__arena *p, ca__segment *s) {
  ca__quick_flush(p); /* its parked blocks become FREE, then GONE */
  ca__lru_remove(p, s);
  HASH_DELETE(hh, p->segment_table, s);
  ca__addr_remove(p, s);
  s->lost = true;
  size_t live = ca__live_in(s);
  for (ca__block *b = s->first; b; b = b->next) {
    if (b->state == CA__FREE) {
      ca__index_remove(b);
      ca__bury(p, b);
    } else if (b->state == CA__LIVE) {
      ca__forget_live(p, b);
    } else {
      b->keep_out = true; /* pending: GONE when it comes back */
    }
  }
  if (p->opt.warn) {
    char line[320];
    snprintf(line, sizeof(line),
             "device %d: pooled segment %#llx (%llu bytes) was freed behind "
             "the pool's back (a library calling libcuda's cuMemFree "
             "directly, e.g. one loaded with RTLD_DEEPBIND); its %zu live "
             "block(s) are lost, and none of it is used again",
             p->device, (unsigned long long)s->addr,
             (unsigned long long)s->size, live);
    p->opt.warn(line);
  }
  ca__drop_if_dead(p, s);
}

/* The driver just gave out [addr, addr + size): any segment of the arena it
 * overlaps was freed behind the pool's back. */
static void ca__lose_overlapped(ca__arena *p, uint64_t addr, uint64_t size) {
  for (size_t i = ca__addr_upper(p, addr + size - 1); i > 0; i--) {
    ca__segment *s = p->by_addr[i - 1];
    if (s->addr + s->size <= addr)
      break;
    ca__segment_lose(p, s);
  }
}

/* A freed block whose bytes must not be handed out again: shared with
 * another process, or in a lost segment. */
static CA__COLD void ca__retire_gone(ca__arena *p, ca__block *b) {
  ca__segment *s = b->seg;
  ca__bury(p, b);
  if (s->lost)
    ca__drop_if_dead(p, s);
  else if (ca__segment_is_free(s))
    ca__lru_push(p, s);
}

static ca__block *ca__segment_new(ca__arena *p, ca__heap *h, uint64_t addr,
                                  uint64_t size) {
  if (!ca__addr_room(p))
    return NULL;
  ca__lose_overlapped(p, addr, size);
  ca__segment *s = ca__slab_get(&p->segment_slab);
  ca__block *b = s ? ca__slab_get(&p->block_slab) : NULL;
  if (!b) {
    if (s)
      ca__slab_put(&p->segment_slab, s);
    return NULL;
  }
  memset(s, 0, sizeof(*s));
  memset(b, 0, sizeof(*b));
  s->addr = addr;
  s->size = size;
  s->heap = h;
  s->first = b;
  s->last_free = p->free_tick; /* files it at the newest end of the LRU */
  s->next = p->segments;
  if (p->segments)
    p->segments->prev = s;
  p->segments = s;
  HASH_ADD(hh, p->segment_table, addr, sizeof(uint64_t), s);
  ca__addr_insert(p, s);
  b->addr = addr;
  b->size = size;
  b->seg = s;
  b->state = CA__FREE;
  ca__index_insert(b);
  ca__lru_push(p, s);
  p->stats.backend_allocs++;
  ca__pool_reserved_add(p, size);
  ca__stat_add(&p->stats.reserved_bytes, size);
  ca__stat_add(&p->stats.segments, 1);
  return b;
}

/* ---- Blocks --------------------------------------------------------------- */

static void ca__block_merge_next(ca__arena *p, ca__block *b) {
  ca__block *n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (n->next)
    n->next->prev = b;
  ca__slab_put(&p->block_slab, n);
}

/* Returns a block to the free index, merged with its free neighbours. */
static void ca__block_make_free(ca__arena *p, ca__block *b) {
  if (b->next && b->next->state == CA__FREE) {
    ca__index_remove(b->next);
    ca__block_merge_next(p, b);
  }
  if (b->prev && b->prev->state == CA__FREE) {
    ca__block *prev = b->prev;
    ca__index_remove(prev);
    ca__block_merge_next(p, prev);
    b = prev;
  }
  b->state = CA__FREE;
  ca__index_insert(b);
  if (ca__segment_is_free(b->seg))
    ca__lru_push(p, b->seg);
}

static int ca__worth_splitting(const ca__heap *h, uint64_t rest) {
  return h->large ? rest > CA_LARGE_MIN_REMAINDER : rest >= CA_GRANULE;
}

/* Takes a free block out of the index for a request of `size`, splitting off
 * the rest when it is worth keeping. Oversize blocks are never split. */
static void ca__block_take(ca__arena *p, ca__block *b, uint64_t size) {
  ca__heap *h = b->seg->heap;
  int oversize = ca__is_oversize(h, b->size);
  ca__index_remove(b);
  ca__lru_remove(p, b->seg);
  uint64_t rest = b->size - size;
  ca__block *r = NULL;
  if (!oversize && ca__worth_splitting(h, rest))
    r = ca__slab_get(&p->block_slab);
  if (r) {
    r->addr = b->addr + size;
    r->size = rest;
    r->seg = b->seg;
    r->state = CA__FREE;
    r->keep_out = false; /* slab records come uninitialized */
    r->prev = b;
    r->next = b->next;
    if (b->next)
      b->next->prev = r;
    b->next = r;
    b->size = size;
    ca__index_insert(r);
  }
  b->state = CA__LIVE;
}

/* A freed block that may be reused now: small ones park in the quick
 * lists, large ones merge with their free neighbours at once. */
static void ca__cache(ca__arena *p, ca__block *b) {
  if (__builtin_expect(b->keep_out, 0))
    ca__retire_gone(p, b);
  else if (b->seg->heap->large)
    ca__block_make_free(p, b);
  else
    ca__quick_push(p, b);
}

/* ---- Frees waiting for the device ---------------------------------------- */

/* Puts a freed block in the open batch (CA__HELD until its marker passes). */
static void ca__hold(ca__arena *p, ca__block *b) {
  b->state = CA__HELD;
  b->link_next = NULL;
  b->link_prev = p->held_tail;
  if (p->held_tail)
    p->held_tail->link_next = b;
  else
    p->held_head = b;
  p->held_tail = b;
  p->open_bytes += b->size;
  p->held_bytes += b->size;
}

/* Hands a list of pending blocks (linked by link_next) back to the cache. */
static void ca__cache_list(ca__arena *p, ca__block *head) {
  for (ca__block *b = head, *next; b; b = next) {
    next = b->link_next;
    b->link_prev = b->link_next = NULL;
    ca__cache(p, b);
  }
}

/* Hands the blocks of a passed batch back to the cache. */
static void ca__release_batch(ca__arena *p, ca__batch *batch) {
  ca__cache_list(p, batch->head);
  p->held_bytes -= batch->bytes;
  p->backend->forget(p->backend->ctx, p->device, batch->marker);
  ca__slab_put(&p->batch_slab, batch);
}

/* Closes the open batch under a new marker. Returns false, leaving the
 * batch open, when there is nothing to close or no marker may be made now
 * (a stream capture): the blocks then simply wait longer. */
static bool ca__close_batch(ca__arena *p) {
  if (!p->held_head || !p->backend->mark)
    return false;
  ca__batch *batch = ca__slab_get(&p->batch_slab);
  uint64_t marker = 0;
  if (!batch)
    return false;
  if (p->backend->mark(p->backend->ctx, p->device, &marker) != 0) {
    ca__slab_put(&p->batch_slab, batch);
    return false;
  }
  *batch = (ca__batch){.marker = marker,
                       .head = p->held_head,
                       .tail = p->held_tail,
                       .bytes = p->open_bytes};
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  if (p->batch_tail)
    p->batch_tail->next = batch;
  else
    p->batch_head = batch;
  p->batch_tail = batch;
  return true;
}

static void ca__pop_batch(ca__arena *p) {
  p->batch_head = p->batch_head->next;
  if (!p->batch_head)
    p->batch_tail = NULL;
}

/* Releases the closed batches whose markers have passed, oldest first,
 * without waiting. Returns true when blocks came back. */
static bool ca__reap(ca__arena *p) {
  bool any = false;
  while (p->batch_head &&
         p->backend->poll(p->backend->ctx, p->device,
                          p->batch_head->marker) == 0) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    ca__release_batch(p, batch);
    any = true;
  }
  return any;
}

/* Fences the device (see ca_backend.fence) and hands every pending block
 * back to the cache at once. Returns false, changing nothing, when there is
 * nothing pending or the backend cannot fence now. */
static bool ca__fence_pending(ca__arena *p) {
  if (!p->backend->fence || (!p->held_head && !p->batch_head) ||
      p->backend->fence(p->backend->ctx, p->device) != 0)
    return false;
  ca__cache_list(p, p->held_head);
  p->held_bytes -= p->open_bytes;
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  p->large_since_fence = 0;
  while (p->batch_head) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    ca__release_batch(p, batch);
  }
  return true;
}

/* On a miss: what has passed comes back; what was freed since the last
 * marker gets one, which has often passed already (the program synchronized
 * since). Returns true when blocks came back. */
static bool ca__recover_pending(ca__arena *p) {
  bool any = ca__reap(p);
  if (ca__close_batch(p))
    any |= ca__reap(p);
  return any;
}

/* Waits for the oldest batch, the lock released meanwhile so that other
 * threads keep allocating. Returns true when blocks came back; false when
 * there was nothing to wait for, the wait was refused (a stream capture),
 * or drop_all forgot the batch while we waited. */
static bool ca__wait_oldest(ca__arena *p) {
  if (!p->batch_head && !ca__close_batch(p))
    return false;
  ca__batch *batch = p->batch_head;
  uint64_t generation = p->generation;
  ca__pop_batch(p);
  ca_lock_release(&p->lock);
  int rc = p->backend->wait(p->backend->ctx, p->device, batch->marker);
  ca_lock_acquire(&p->lock);
  if (generation != p->generation) {
    p->backend->forget(p->backend->ctx, p->device, batch->marker);
    ca__slab_put(&p->batch_slab, batch);
    return false;
  }
  if (rc != 0) { /* not now: back at the head, still the oldest */
    batch->next = p->batch_head;
    p->batch_head = batch;
    if (!p->batch_tail)
      p->batch_tail = batch;
    return false;
  }
  ca__release_batch(p, batch);
  return true;
}

/* ---- Growing -------------------------------------------------------------- */

/* The smallest segment that can serve `size`: what large requests get, and
 * what any request gets when memory is short. */
static uint64_t ca__segment_size_min(uint64_t size) {
  return ca__round_up(size, CA_LARGE_ROUND);
}

/* The segment a request of `size` would like: PyTorch's scheme. */
static uint64_t ca__segment_size(uint64_t size) {
  if (size <= CA_SMALL_REQUEST)
    return CA_SMALL_SEGMENT;
  if (size < CA_MEDIUM_REQUEST)
    return CA_MEDIUM_SEGMENT;
  return ca__segment_size_min(size);
}

static uint64_t ca__gc_budget(ca__arena *p) {
  if (!p->gc_budget) {
    uint64_t free_bytes = 0, total = 0;
    if (p->pool->budget->limit)
      p->gc_budget = p->pool->budget->limit;
    else if (p->backend->mem_info(p->backend->ctx, p->device, &free_bytes,
                                  &total) == 0)
      p->gc_budget = total;
  }
  return p->gc_budget;
}

/* Makes p give back its fully free segments, oldest first, while the
 * pool's reserved memory is above `target`; with `wait`, after waiting for
 * all its pending frees. Takes and releases p's lock. Adds the segments
 * given back to *segments; returns their bytes. */
static uint64_t ca__give_back(ca__arena *p, uint64_t target, bool wait,
                              uint64_t *segments) {
  ca_lock_acquire(&p->lock);
  while (wait && ca__wait_oldest(p))
    ;
  ca__quick_flush(p);
  uint64_t before = p->stats.segments.current;
  uint64_t released = ca__release_lru(p, target);
  *segments += before - p->stats.segments.current;
  ca_lock_release(&p->lock);
  return released;
}

/* When p's own free segments were not enough: makes the other arenas give
 * back theirs while the pool's reserved memory is above `target`; with
 * `wait`, each first waits for its pending frees (the last resort before
 * failing). p's lock is released meanwhile and taken again after: arenas
 * that hold one lock at most can help each other without deadlock. Returns
 * the number of segments given back. */
static uint64_t ca__release_others(ca__arena *p, uint64_t target, bool wait) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(p->pool, all);
  uint64_t segments = 0;
  if (n < 2 || ca__pool_reserved(p) <= target)
    return 0;
  ca_lock_release(&p->lock);
  for (unsigned i = 0; i < n; i++)
    if (all[i] != p)
      ca__give_back(all[i], target, wait, &segments);
  ca_lock_acquire(&p->lock);
  return segments;
}

/* Before growing by `seg`, give back the oldest free segments that would
 * push reserved memory past the garbage collection threshold: p's own,
 * then, if the pool is still past it, the other arenas'. */
static void ca__collect_garbage(ca__arena *p, uint64_t seg) {
  if (p->opt.gc_threshold <= 0)
    return;
  uint64_t budget = ca__gc_budget(p);
  if (!budget)
    return;
  uint64_t allowed = (uint64_t)(p->opt.gc_threshold * (double)budget);
  uint64_t target = allowed > seg ? allowed - seg : 0;
  uint64_t before = p->stats.segments.current;
  ca__release_lru(p, target);
  p->stats.gc_segments_released += before - p->stats.segments.current;
  p->stats.gc_segments_released += ca__release_others(p, target, false);
}

/* What the memory limit leaves the pool: the limit less the device memory
 * booked beside it (other pools of the device, allocations passed through
 * to the driver). UINT64_MAX when there is no limit. */
static uint64_t ca__limit_room(const ca__arena *p) {
  const ca_budget *b = p->pool->budget;
  if (!b->limit)
    return UINT64_MAX;
  uint64_t booked = ca_budget_booked(b), own = ca__pool_reserved(p);
  uint64_t outside = booked > own ? booked - own : 0;
  return b->limit > outside ? b->limit - outside : 0;
}

static int ca__fits_limit(const ca__arena *p, uint64_t seg) {
  return ca__pool_reserved(p) + seg <= ca__limit_room(p);
}

/* Picks a segment size for `size`, `seg` bytes if it can, within the
 * memory limit, giving back cached segments first (p's own, then the other
 * arenas') if need be. Returns 0 when nothing fits. */
static uint64_t ca__segment_within_limit(ca__arena *p, uint64_t size,
                                         uint64_t seg) {
  if (ca__fits_limit(p, seg))
    return seg;
  uint64_t min = ca__segment_size_min(size), room = ca__limit_room(p);
  if (room >= min) {
    ca__release_lru(p, room - min);
    ca__release_others(p, room - min, false);
  }
  if (ca__fits_limit(p, seg))
    return seg;
  return ca__fits_limit(p, min) ? min : 0;
}

/* Books `seg` bytes in the device's budget before the backend is asked for
 * them, in one atomic step, so that two arenas (or pools, or a pass-through
 * allocation) growing at once cannot both take the last room. Returns
 * false, booking nothing, when the device would pass the limit. */
static bool ca__book_segment(ca__arena *p, uint64_t seg) {
  if (!ca_budget_book(p->pool->budget, seg))
    return false;
  atomic_fetch_add_explicit(&p->pool->committed, seg, memory_order_relaxed);
  return true;
}

static void ca__unbook_segment(ca__arena *p, uint64_t seg) {
  atomic_fetch_sub_explicit(&p->pool->committed, seg, memory_order_relaxed);
  ca_budget_unbook(p->pool->budget, seg);
}

/* A refused booking reads as the backend running out: the caller's
 * recovery is the same. */
static int ca__reserve(ca__arena *p, ca__heap *h, uint64_t seg,
                       ca__block **out) {
  uint64_t addr = 0;
  if (!ca__book_segment(p, seg))
    return p->backend->oom_code;
  int rc = p->backend->reserve(p->backend->ctx, p->device, seg, &addr);
  if (rc != 0) {
    ca__unbook_segment(p, seg);
    return rc;
  }
  *out = ca__segment_new(p, h, addr, seg);
  if (!*out) {
    p->backend->release(p->backend->ctx, p->device, addr, seg);
    ca__unbook_segment(p, seg);
    return p->backend->oom_code;
  }
  return 0;
}

/* Waits for pending batches, oldest first, until one of their blocks serves
 * `size`. Returns true with *out set when one does. */
static bool ca__wait_for_fit(ca__arena *p, uint64_t size, ca__block **out) {
  while (ca__wait_oldest(p)) {
    ca__quick_flush(p);
    if ((*out = ca__find(p, size)))
      return true;
  }
  return false;
}

/* Before growing by `seg` past the most the pool ever reserved, gives back
 * the arena's fully free segments idle for CA_TRADE_IDLE_FREES of its frees,
 * oldest first: the pool then trades them for the new one instead of
 * holding both. */
static void ca__trade_idle(ca__arena *p, uint64_t seg) {
  uint64_t peak =
      atomic_load_explicit(&p->pool->reserved_peak, memory_order_relaxed);
  while (p->lru_head && ca__pool_reserved(p) + seg > peak &&
         p->free_tick - p->lru_head->last_free >= CA_TRADE_IDLE_FREES)
    ca__segment_release(p, p->lru_head);
}

/* At a miss: gives back the fully free segments of heap h, oldest first,
 * and returns their bytes, for the new segment to take in (see the merging
 * above). A merged segment must stay below max_split_size, where blocks are
 * no longer split and one request would take it all; an oversize request
 * gets a segment of its own size, nothing merged. */
static uint64_t ca__merge_free(ca__arena *p, ca__heap *h, uint64_t size) {
  uint64_t merged = 0;
  if (ca__is_oversize(h, size))
    return 0;
  for (ca__segment *s = p->lru_head, *next; s; s = next) {
    next = s->lru_next;
    if (s->heap == h && merged + s->size < h->oversize_from) {
      merged += s->size;
      ca__segment_release(p, s);
    }
  }
  return merged;
}

/* Serves a cache miss with a new segment. Pending blocks are waited for
 * first, oldest first, until one serves the request; idle free segments are
 * traded in, the other free ones merged. When the backend or the memory
 * limit refuses the segment: give back every cached segment (the other
 * arenas' too) and retry once with the smallest segment that serves the
 * request. */
static int ca__grow(ca__arena *p, uint64_t size, ca__block **out) {
  ca__heap *h = ca__heap_for(p, size);
  int oom = p->backend->oom_code;
  uint64_t seg = ca__segment_size(size);
  ca__quick_flush(p); /* what follows weighs fully free segments */
  if (ca__wait_for_fit(p, size, out))
    return 0;
  ca__collect_garbage(p, seg);
  ca__trade_idle(p, seg);
  uint64_t merged = ca__merge_free(p, h, size);
  seg = ca__segment_within_limit(p, size, merged > seg ? merged : seg);
  if (seg) {
    int rc = ca__reserve(p, h, seg, out);
    if (rc != oom)
      return rc;
    p->stats.oom_retries++;
  }
  ca__release_lru(p, 0);
  ca__release_others(p, 0, true);
  seg = ca__segment_size_min(size);
  if (!ca__fits_limit(p, seg))
    return oom;
  return ca__reserve(p, h, seg, out);
}

/* ---- Arenas --------------------------------------------------------------- */

static void ca__heap_init(ca__heap *h, int large, uint64_t max_split_size) {
  memset(h, 0, sizeof(*h));
  h->large = large;
  /* Small blocks are never large enough to be kept whole. */
  h->oversize_from = large ? max_split_size : UINT64_MAX;
}

static int ca__live_init(ca__arena *p) {
  p->live = NULL;
  memset(&p->sentinel, 0, sizeof(p->sentinel));
  HASH_ADD(hh, p->live, addr, sizeof(uint64_t), &p->sentinel);
  return p->live != NULL;
}

/* Zeroed memory on whole cache lines of its own (`size` is a multiple of
 * CA__LINE: the size of a type aligned to it). */
static void *ca__alloc_lines(size_t size) {
  void *mem = aligned_alloc(CA__LINE, size);
  return mem ? memset(mem, 0, size) : NULL;
}

/* An empty arena for `pool`; NULL when the host is out of memory. */
static ca__arena *ca__arena_new(ca_pool *pool, unsigned index) {
  ca__arena *p = ca__alloc_lines(sizeof(*p));
  if (!p)
    return NULL;
  p->pool = pool;
  p->index = index;
  p->backend = pool->backend;
  p->device = pool->device;
  p->opt = pool->opt;
  ca__heap_init(&p->small, 0, p->opt.max_split_size);
  ca__heap_init(&p->large, 1, p->opt.max_split_size);
  p->block_slab.obj_size = sizeof(ca__block);
  p->segment_slab.obj_size = sizeof(ca__segment);
  p->batch_slab.obj_size = sizeof(ca__batch);
  p->stats.device = pool->device;
  if (!ca__live_init(p)) {
    free(p);
    return NULL;
  }
  return p;
}

/* Frees every record and forgets every segment, leaving an empty arena. */
static void ca__forget_all(ca__arena *p, int release) {
  HASH_CLEAR(hh, p->segment_table);
  while (p->segments) {
    ca__segment *s = p->segments;
    p->segments = s->next;
    if (release && !s->lost)
      p->backend->release(p->backend->ctx, p->device, s->addr, s->size);
    ca__segment_put(p, s);
  }
  HASH_CLEAR(hh, p->live);
  ca__heap_init(&p->small, 0, p->opt.max_split_size);
  ca__heap_init(&p->large, 1, p->opt.max_split_size);
  p->lru_head = p->lru_tail = NULL;
  while (p->batch_head) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    p->backend->forget(p->backend->ctx, p->device, batch->marker);
    ca__slab_put(&p->batch_slab, batch);
  }
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  p->held_bytes = 0;
  p->quick_bytes = 0;
  p->gone_bytes = 0;
  p->nsegs = 0;
  p->generation++;
}

/* Gives every segment of the arena back and frees it. */
static void ca__arena_free(ca__arena *p) {
  ca__forget_all(p, 1);
  free(p->by_addr);
  ca__slab_destroy(&p->block_slab);
  ca__slab_destroy(&p->segment_slab);
  ca__slab_destroy(&p->batch_slab);
  free(p);
}

/* The library is preloaded, so its thread-locals sit in the static TLS
 * block and are reached without a call. */
#define CA__TLS __attribute__((tls_model("initial-exec")))

/* A thread moves to a less used arena after CA__MOVE_AFTER contended takes
 * of its arena's lock within CA__MOVE_WINDOW_NS. Threads that allocate in a
 * tight loop together find the lock held every few microseconds and spread
 * out within their first calls. Threads that overlap only now and then
 * stay together and keep sharing one cache: PyTorch's main and autograd
 * threads are such a pair (its own caching allocator calls cudaMalloc
 * rarely, mostly from one of them at a time), and never meet four
 * contended takes in one millisecond. One contended take alone proves
 * nothing: two threads that happen to free at the same moment meet a few
 * in a row. */
#define CA__MOVE_AFTER 4
#define CA__MOVE_WINDOW_NS 1000000ull

/* The calling thread's arena index, the same in every pool: 0 until
 * contention moves the thread. */
static __thread unsigned ca__thread_arena CA__TLS;
/* The thread's contended takes of its arena in the current window, and
 * when that window began. */
static __thread unsigned ca__contended CA__TLS;
static __thread uint64_t ca__contended_since CA__TLS;

/* Threads that have met contention, by arena index, process-wide. A
 * thread moves only to an arena fewer of them use: moving blindly, eight
 * busy threads on eight arenas would each land on a taken arena and move
 * on for ever, dragging their blocks' frees along. Threads that never met
 * contention are not counted; they leave no mark on where others go. */
static atomic_uint ca__arena_threads[CA_POOL_ARENAS];
static __thread bool ca__counted CA__TLS;
static pthread_key_t ca__count_key;
/* Whether ca__count_key was made: out of keys, it names no key of ours (an
 * unset key is 0, which is another component's), so it is never set. */
static bool ca__count_key_made;
static pthread_once_t ca__count_once = PTHREAD_ONCE_INIT;
/* Where the search for the least used arena starts: ties spread. */
static atomic_uint ca__arena_turn;

/* A counted thread that exits stops counting. It may still use a pool in
 * a thread-exit destructor that runs after this one: no longer counted,
 * a move then leaves the counts alone instead of dropping this one twice,
 * and new contention counts it afresh (its key set again, this destructor
 * runs again). */
static void ca__uncount(void *unused) {
  (void)unused;
  atomic_fetch_sub_explicit(&ca__arena_threads[ca__thread_arena], 1,
                            memory_order_relaxed);
  ca__counted = false;
}

/* A forked child runs one thread of its parent's: only that one counts. */
static void ca__recount_in_child(void) {
  for (unsigned i = 0; i < CA_POOL_ARENAS; i++)
    atomic_store_explicit(&ca__arena_threads[i], 0, memory_order_relaxed);
  if (ca__counted)
    atomic_store_explicit(&ca__arena_threads[ca__thread_arena], 1,
                          memory_order_relaxed);
}

static const ca_fork_handlers ca__pool_fork = {.child = ca__recount_in_child};

static void ca__count_setup(void) {
  ca__count_key_made = pthread_key_create(&ca__count_key, ca__uncount) == 0;
  ca_fork_register(CA_FORK_POOL, &ca__pool_fork);
}

/* Starts counting the calling thread. Its key's value only makes the key's
 * destructor run at the thread's exit. Should the process be out of keys,
 * a thread that exits goes on counting: others avoid its arena, no more. */
static void ca__count_thread(void) {
  pthread_once(&ca__count_once, ca__count_setup);
  ca__counted = true;
  atomic_fetch_add_explicit(&ca__arena_threads[ca__thread_arena], 1,
                            memory_order_relaxed);
  if (ca__count_key_made)
    pthread_setspecific(ca__count_key, &ca__counted);
}

/* Puts the calling thread on arena `to`, its count with it. */
static void ca__move_to(unsigned to) {
  if (ca__counted) {
    atomic_fetch_sub_explicit(&ca__arena_threads[ca__thread_arena], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&ca__arena_threads[to], 1,
                              memory_order_relaxed);
  }
  ca__thread_arena = to;
}

/* The arena fewest counted threads use, if moving there spreads threads
 * out: the calling thread's arena, where it just met contention, has two
 * threads at least, counted or not. */
static bool ca__least_used(unsigned *to) {
  unsigned here = atomic_load_explicit(&ca__arena_threads[ca__thread_arena],
                                       memory_order_relaxed);
  unsigned start = atomic_fetch_add_explicit(&ca__arena_turn, 1,
                                             memory_order_relaxed);
  unsigned fewest = UINT_MAX;
  for (unsigned k = 0; k < CA_POOL_ARENAS; k++) {
    unsigned i = (start + k) % CA_POOL_ARENAS;
    unsigned n = atomic_load_explicit(&ca__arena_threads[i],
                                      memory_order_relaxed);
    if (i != ca__thread_arena && n < fewest) {
      fewest = n;
      *to = i;
    }
  }
  return fewest + 1 < (here > 2 ? here : 2);
}

/* Counts a contended take of the calling thread's arena. Returns true when
 * this one moved the thread to another arena. */
static CA__COLD bool ca__contention(void) {
  /* The coarse clock ticks in milliseconds: too slowly for the window. */
  uint64_t now = ca__clock_ns(CLOCK_MONOTONIC);
  if (now - ca__contended_since > CA__MOVE_WINDOW_NS) {
    ca__contended_since = now;
    ca__contended = 0;
  }
  if (++ca__contended < CA__MOVE_AFTER)
    return false;
  ca__contended = 0;
  if (!ca__counted)
    ca__count_thread();
  unsigned to = ca__thread_arena;
  if (!ca__least_used(&to))
    return false;
  ca__move_to(to);
  return true;
}

/* Makes arena `index` of `pool` and publishes it, or takes the one another
 * thread published first. Out of host memory, the thread goes back to
 * arena 0, which every pool has. */
static ca__arena *ca__arena_make(ca_pool *pool, unsigned index) {
  ca__arena *made = ca__arena_new(pool, index), *found = NULL;
  if (!made) {
    ca__move_to(0);
    return ca__arena_at(pool, 0);
  }
  if (atomic_compare_exchange_strong_explicit(&pool->arenas[index], &found,
                                              made, memory_order_acq_rel,
                                              memory_order_acquire))
    return made;
  ca__arena_free(made);
  return found;
}

/* The calling thread's arena of `pool`, made on first use. */
static ca__arena *ca__arena_of(ca_pool *pool) {
  ca__arena *p = ca__arena_at(pool, ca__thread_arena);
  return p ? p : ca__arena_make(pool, ca__thread_arena);
}

/* The slow half of ca__enter: the thread's arena is not made yet, or its
 * lock is held. When the contention met moves the thread, the arena it
 * moved to is taken instead. */
static CA__COLD ca__arena *ca__enter_slow(ca_pool *pool) {
  ca__arena *p = ca__arena_of(pool);
  if (ca_lock_try_acquire(&p->lock))
    return p;
  if (ca__contention())
    p = ca__arena_of(pool);
  ca_lock_acquire(&p->lock);
  return p;
}

/* The calling thread's arena, locked. */
static inline ca__arena *ca__enter(ca_pool *pool) {
  ca__arena *p = ca__arena_at(pool, ca__thread_arena);
  if (p && ca_lock_try_acquire(&p->lock))
    return p;
  return ca__enter_slow(pool);
}

/* Takes the lock of p, the calling thread's own arena, noting contention
 * (which moves only the thread's later calls). */
static void ca__enter_own(ca__arena *p) {
  if (!ca_lock_try_acquire(&p->lock)) {
    ca__contention();
    ca_lock_acquire(&p->lock);
  }
}

void ca_pool_set_thread_arena(unsigned index) {
  ca__move_to(index % CA_POOL_ARENAS);
  ca__contended = 0;
}

unsigned ca_pool_thread_arena(void) { return ca__thread_arena; }

unsigned ca_pool_arena_threads(unsigned index) {
  return atomic_load_explicit(&ca__arena_threads[index % CA_POOL_ARENAS],
                              memory_order_relaxed);
}

/* ---- Public entry points -------------------------------------------------- */

ca_pool *ca_pool_create(const ca_backend *backend, int device,
                        const ca_pool_options *options) {
  ca_pool *pool = ca__alloc_lines(sizeof(*pool));
  if (!pool)
    return NULL;
  pool->backend = backend;
  pool->device = device;
  pool->opt = *options;
  pool->budget = options->budget ? options->budget : &pool->unlimited;
  /* Without markers a pool cannot order reuse after device work: it falls
   * back to synchronizing at each free, or to reusing at once. */
  if (pool->opt.reuse == CA_REUSE_SAFE && !backend->mark)
    pool->opt.reuse = backend->synchronize ? CA_REUSE_DEVICE_SYNC
                                           : CA_REUSE_IMMEDIATE;
  if (pool->opt.reuse == CA_REUSE_DEVICE_SYNC && !backend->synchronize)
    pool->opt.reuse = CA_REUSE_IMMEDIATE;
  ca__arena *first = ca__arena_new(pool, 0);
  if (!first) {
    free(pool);
    return NULL;
  }
  atomic_store_explicit(&pool->arenas[0], first, memory_order_release);
  return pool;
}

void ca_pool_destroy(ca_pool *pool) {
  if (!pool)
    return;
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++) {
    uint64_t held = all[i]->stats.reserved_bytes.current;
    ca__arena_free(all[i]); /* gives the segments back */
    ca_budget_unbook(pool->budget, held);
  }
  free(pool);
}

static void ca__drop_all(ca__arena *p) {
  ca_lock_acquire(&p->lock);
  ca__pool_reserved_sub(p, p->stats.reserved_bytes.current);
  ca__forget_all(p, 0);
  ca__live_init(p);
  p->stats.requested_bytes.current = 0;
  p->stats.allocated_bytes.current = 0;
  p->stats.reserved_bytes.current = 0;
  p->stats.blocks.current = 0;
  p->stats.segments.current = 0;
  ca_lock_release(&p->lock);
}

void ca_pool_drop_all(ca_pool *pool) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++)
    ca__drop_all(all[i]);
}

/* Whether a large request should fence before taking `found`: when what is
 * pending could serve it, is worth a fence (a share of the arena), and the
 * cache offers only a poor fit. Large blocks must see the frees to merge,
 * as under immediate reuse, or the pool fragments; but a fence costs driver
 * calls, so it is made only when the cache would split a block much larger
 * than the request, or has none, and CA__FENCE_EVERY large requests have
 * come since the last fence. Counts the request. */
static bool ca__fence_first(ca__arena *p, uint64_t size,
                            const ca__block *found) {
  if (size <= CA_SMALL_REQUEST || ++p->large_since_fence < CA__FENCE_EVERY)
    return false;
  return p->held_bytes >= size &&
         p->held_bytes >= p->stats.reserved_bytes.current >> CA__FENCE_SHARE &&
         (!found || found->size - size > size >> CA__FENCE_WASTE);
}

/* Finds a free block of at least `size` bytes in the cache: the quick lists
 * first, then the bins, then both again after merging the parked blocks of
 * the request's heap (the other heap's cannot serve it, and stay parked for
 * the requests they can) and, last, after taking back the pending blocks:
 * all of them behind a fence, else those whose device work has passed
 * (never waiting for any). A large request may fence first
 * (ca__fence_first). */
static ca__block *ca__find_cached(ca__arena *p, uint64_t size) {
  ca__block *b = ca__find(p, size);
  if (ca__fence_first(p, size, b) && ca__fence_pending(p))
    b = ca__find(p, size);
  if (b)
    return b;
  ca__heap *h = ca__heap_for(p, size);
  if (h->quick_fl_bitmap) {
    ca__heap_flush(p, h);
    b = ca__find(p, size);
  }
  if (!b && (p->held_head || p->batch_head) &&
      (ca__fence_pending(p) || ca__recover_pending(p))) {
    ca__heap_flush(p, h);
    b = ca__find(p, size);
  }
  return b;
}

/* Finds or makes a free block of at least `size` bytes, out of every index. */
static int ca__obtain(ca__arena *p, uint64_t size, ca__block **out) {
  ca__block *b = ca__find_cached(p, size);
  if (b) {
    p->stats.cache_hits++;
    ca__block_take(p, b, size);
    *out = b;
    return 0;
  }
  int rc = ca__grow(p, size, &b);
  if (rc == 0) {
    ca__block_take(p, b, size);
    *out = b;
  }
  return rc;
}

/* For a request that p could not serve even after every arena gave back
 * what it could: a block from another arena's cache. A nearly full device
 * may keep its free memory in other arenas' partly used segments, which no
 * arena can give back. The block lives on in that arena, where frees find
 * it. Returns the arena locked now: the one that served *out, p released;
 * or p, locked again, with *out NULL when none could. */
static CA__COLD ca__arena *ca__obtain_elsewhere(ca__arena *p, uint64_t size,
                                                ca__block **out) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(p->pool, all);
  *out = NULL;
  if (n < 2)
    return p;
  ca_lock_release(&p->lock);
  for (unsigned i = 0; i < n; i++) {
    ca__arena *o = all[i];
    if (o == p)
      continue;
    ca_lock_acquire(&o->lock);
    if ((*out = ca__find_cached(o, size))) {
      o->stats.cache_hits++;
      ca__block_take(o, *out, size);
      return o;
    }
    ca_lock_release(&o->lock);
  }
  ca_lock_acquire(&p->lock);
  return p;
}

/* Arenas draw allocation numbers from the pool in runs of this many: unique
 * in the pool and, across arenas, in allocation order to within a run,
 * without every allocation touching one counter all threads share. A pool
 * of one arena numbers 1, 2, 3, ... */
#define CA__SEQ_RUN 64

static uint64_t ca__next_seq(ca__arena *p) {
  if (p->next_seq == p->seq_end) {
    p->next_seq = atomic_fetch_add_explicit(&p->pool->seq, CA__SEQ_RUN,
                                            memory_order_relaxed);
    p->seq_end = p->next_seq + CA__SEQ_RUN;
  }
  return ++p->next_seq;
}

int ca_pool_alloc(ca_pool *pool, uint64_t size, uint32_t tag, uint64_t *addr) {
  if (size > CA__MAX_REQUEST)
    return pool->backend->oom_code;
  uint64_t rounded = ca__round_up(size ? size : 1, CA_GRANULE);
  ca__arena *p = ca__enter(pool);
  ca__block *b = ca__quick_take(p, rounded);
  if (b) {
    p->stats.cache_hits++;
    b->state = CA__LIVE;
  } else {
    int rc = ca__obtain(p, rounded, &b);
    if (rc == p->backend->oom_code) {
      p = ca__obtain_elsewhere(p, rounded, &b);
      rc = b ? 0 : rc;
    }
    if (rc != 0) {
      p->stats.failed_allocs++;
      ca_lock_release(&p->lock);
      return rc;
    }
  }
  b->requested = size;
  b->tag = tag;
  b->seq = ca__next_seq(p);
  b->time_ns = ca__now_ns();
  HASH_ADD(hh, p->live, addr, sizeof(uint64_t), b);
  p->stats.allocs++;
  ca__stat_add(&p->stats.requested_bytes, size);
  ca__stat_add(&p->stats.allocated_bytes, b->size);
  ca__stat_add(&p->stats.blocks, 1);
  *addr = b->addr;
  ca_lock_release(&p->lock);
  return 0;
}

static ca__block *ca__live_find(ca__arena *p, uint64_t addr) {
  ca__block *b = NULL;
  if (addr != 0)
    HASH_FIND(hh, p->live, &addr, sizeof(uint64_t), b);
  return b;
}

/* A freed block's way back to the cache, by policy. device_sync waits
 * under the lock: it is a debugging policy, and cudaFree itself stalls
 * the whole device. */
static void ca__retire(ca__arena *p, ca__block *b) {
  if (p->opt.reuse == CA_REUSE_IMMEDIATE ||
      (p->opt.reuse == CA_REUSE_DEVICE_SYNC &&
       p->backend->synchronize(p->backend->ctx, p->device) == 0))
    ca__cache(p, b);
  else
    ca__hold(p, b);
}

/* The arena that holds the live block at `addr`, locked; NULL when none
 * does, not a pointer of this pool. `own`, an arena already asked (a free
 * asks the calling thread's first), is skipped: NULL, or locked and
 * released here. */
static CA__COLD ca__arena *ca__owner(ca_pool *pool, ca__arena *own,
                                     uint64_t addr) {
  if (own)
    ca_lock_release(&own->lock);
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++) {
    if (all[i] == own)
      continue;
    ca_lock_acquire(&all[i]->lock);
    if (ca__live_find(all[i], addr))
      return all[i];
    ca_lock_release(&all[i]->lock);
  }
  return NULL;
}

/* The thread's own arena is asked first: threads mostly free what they
 * allocated. */
bool ca_pool_free(ca_pool *pool, uint64_t addr) {
  ca__arena *p = ca__arena_at(pool, ca__thread_arena);
  ca__block *b = NULL;
  if (p) {
    ca__enter_own(p);
    b = ca__live_find(p, addr);
  }
  if (!b) {
    if (!(p = ca__owner(pool, p, addr)))
      return false;
    b = ca__live_find(p, addr);
  }
  HASH_DELETE(hh, p->live, b);
  b->seg->last_free = ++p->free_tick;
  p->stats.frees++;
  ca__stat_sub(&p->stats.requested_bytes, b->requested);
  ca__stat_sub(&p->stats.allocated_bytes, b->size);
  ca__stat_sub(&p->stats.blocks, 1);
  ca__retire(p, b);
  ca_lock_release(&p->lock);
  return true;
}

static void ca__describe(const ca__arena *p, const ca__block *b,
                         ca_live_block *out) {
  out->addr = b->addr;
  out->requested = b->requested;
  out->size = b->size;
  out->seq = b->seq;
  out->time_ns = b->time_ns;
  out->device = p->device;
  out->tag = b->tag;
}

int ca_pool_device(const ca_pool *pool) { return pool->device; }

bool ca_pool_lookup(ca_pool *pool, uint64_t addr, ca_live_block *out) {
  ca__arena *p = ca__owner(pool, NULL, addr);
  if (!p)
    return false;
  if (out)
    ca__describe(p, ca__live_find(p, addr), out);
  ca_lock_release(&p->lock);
  return true;
}

bool ca_pool_holds_segment(ca_pool *pool, uint64_t addr) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++) {
    ca__segment *s = NULL;
    ca_lock_acquire(&all[i]->lock);
    HASH_FIND(hh, all[i]->segment_table, &addr, sizeof(uint64_t), s);
    ca_lock_release(&all[i]->lock);
    if (s)
      return true;
  }
  return false;
}

/* The block of segment s holding addr: by the live table when addr is a
 * live block's start (what queries mostly ask about), else by walking. */
static ca__block *ca__block_at(ca__arena *p, ca__segment *s, uint64_t addr) {
  ca__block *b = ca__live_find(p, addr);
  if (b && b->seg == s)
    return b;
  for (b = s->first; b && addr - b->addr >= b->size; b = b->next)
    ;
  return b;
}

static void ca__span(ca__arena *p, ca__segment *s, uint64_t addr,
                     ca_pool_span *out) {
  ca__block *b = ca__block_at(p, s, addr);
  memset(out, 0, sizeof(*out));
  out->segment = s->addr;
  out->segment_size = s->size;
  out->live = b && b->state == CA__LIVE && addr - b->addr < b->requested;
  if (out->live)
    ca__describe(p, b, &out->block);
}

/* Runs fn on the arena and segment holding addr, under that arena's lock;
 * returns false when no segment of the pool holds it. */
static bool ca__at_segment(ca_pool *pool, uint64_t addr,
                           void (*fn)(ca__arena *, ca__segment *, uint64_t,
                                      void *),
                           void *arg) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++) {
    ca_lock_acquire(&all[i]->lock);
    ca__segment *s = ca__segment_at(all[i], addr);
    if (s)
      fn(all[i], s, addr, arg);
    ca_lock_release(&all[i]->lock);
    if (s)
      return true;
  }
  return false;
}

static void ca__find_in(ca__arena *p, ca__segment *s, uint64_t addr,
                        void *out) {
  ca__span(p, s, addr, out);
}

bool ca_pool_find(ca_pool *pool, uint64_t addr, ca_pool_span *out) {
  return ca__at_segment(pool, addr, ca__find_in, out);
}

static void ca__lose_at(ca__arena *p, ca__segment *s, uint64_t addr,
                        void *unused) {
  (void)addr, (void)unused;
  ca__segment_lose(p, s);
}

bool ca_pool_segment_lost(ca_pool *pool, uint64_t addr) {
  return ca__at_segment(pool, addr, ca__lose_at, NULL);
}

bool ca_pool_share(ca_pool *pool, uint64_t addr) {
  ca__arena *p = ca__owner(pool, NULL, addr);
  if (!p)
    return false;
  ca__live_find(p, addr)->keep_out = true;
  ca_lock_release(&p->lock);
  return true;
}

uint64_t ca_pool_releasable(ca_pool *pool) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  uint64_t bytes = 0;
  for (unsigned i = 0; i < n; i++) {
    ca_lock_acquire(&all[i]->lock);
    for (const ca__segment *s = all[i]->segments; s; s = s->next)
      if (!s->lost && ca__live_in(s) == 0)
        bytes += s->size;
    ca_lock_release(&all[i]->lock);
  }
  return bytes;
}

uint64_t ca_pool_empty_cache(ca_pool *pool) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  uint64_t released = 0, segments = 0;
  for (unsigned i = 0; i < n; i++)
    released += ca__give_back(all[i], 0, true, &segments);
  return released;
}

static uint64_t ca__largest_free(const ca__arena *p) {
  uint64_t largest = 0;
  const ca__heap *heaps[2] = {&p->small, &p->large};
  for (int i = 0; i < 2; i++) {
    const ca__heap *h = heaps[i];
    for (const ca__block *b = h->oversize; b; b = b->link_next)
      largest = b->size > largest ? b->size : largest;
    if (!h->fl_bitmap)
      continue;
    unsigned fl = 63u - (unsigned)__builtin_clzll(h->fl_bitmap);
    unsigned sl = 31u - (unsigned)__builtin_clz(h->sl_bitmap[fl]);
    for (const ca__block *b = h->bins[fl][sl]; b; b = b->link_next)
      largest = b->size > largest ? b->size : largest;
  }
  return largest;
}

void ca_pool_stats_add(cudalloc_device_stats *sum,
                       const cudalloc_device_stats *s) {
#define CA__ADD_TRIPLE(field, row, bytes)                                      \
  sum->field.current += s->field.current;                                      \
  sum->field.peak += s->field.peak;                                            \
  sum->field.total += s->field.total;
#define CA__ADD(field) sum->field += s->field;
#define CA__MAX(field)                                                         \
  if (s->field > sum->field)                                                   \
    sum->field = s->field;
  CA_STATS_TRIPLES(CA__ADD_TRIPLE)
  CA_STATS_COUNTERS(CA__ADD)
  CA_STATS_LARGEST(CA__MAX)
#undef CA__ADD_TRIPLE
#undef CA__ADD
#undef CA__MAX
}

/* One arena's figures, under its lock. */
static void ca__arena_stats(ca__arena *p, cudalloc_device_stats *out) {
  ca_lock_acquire(&p->lock);
  ca__quick_flush(p);
  *out = p->stats;
  out->pending_free_bytes = p->held_bytes;
  out->free_cached_bytes = p->stats.reserved_bytes.current -
                           p->stats.allocated_bytes.current - p->held_bytes -
                           p->gone_bytes;
  out->largest_free_block = ca__largest_free(p);
  ca_lock_release(&p->lock);
}

/* The arenas' figures added up, one arena locked at a time (never all
 * threads stopped at once). Reserved memory is the pool's own exact count
 * and peak; the other peaks are sums of the arenas' peaks, at least the
 * pool's true peak, since arenas peak at different times. */
void ca_pool_get_stats(ca_pool *pool, cudalloc_device_stats *out) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  memset(out, 0, sizeof(*out));
  for (unsigned i = 0; i < n; i++) {
    cudalloc_device_stats s;
    ca__arena_stats(all[i], &s);
    ca_pool_stats_add(out, &s);
  }
  out->device = pool->device;
  out->reserved_bytes.current = atomic_load(&pool->reserved);
  out->reserved_bytes.peak = atomic_load(&pool->reserved_peak);
  out->fragmentation = ca_pool_fragmentation(out);
}

double ca_pool_fragmentation(const cudalloc_device_stats *s) {
  return s->free_cached_bytes ? 1.0 - (double)s->largest_free_block /
                                          (double)s->free_cached_bytes
                              : 0.0;
}

size_t ca_pool_foreach_live(ca_pool *pool,
                            void (*fn)(const ca_live_block *b, void *arg),
                            void *arg) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n_arenas = ca__arenas(pool, all);
  size_t n = 0;
  for (unsigned i = 0; i < n_arenas; i++) {
    ca__arena *p = all[i];
    ca_lock_acquire(&p->lock);
    for (ca__block *b = p->live; b; b = b->hh.next) {
      if (b == &p->sentinel)
        continue;
      ca_live_block info;
      ca__describe(p, b, &info);
      fn(&info, arg);
      n++;
    }
    ca_lock_release(&p->lock);
  }
  return n;
}

/* ---- Consistency check (tests) -------------------------------------------- */

#define CA__CHECK(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (why)                                                                 \
        snprintf(why, why_len, __VA_ARGS__);                                   \
      return false;                                                            \
    }                                                                          \
  } while (0)

static bool ca__in_index(const ca__block *b) {
  const ca__heap *h = b->seg->heap;
  const ca__block *it;
  if (ca__is_oversize(h, b->size)) {
    it = h->oversize;
  } else {
    unsigned fl, sl;
    ca__class_of(b->size, &fl, &sl);
    it = h->bins[fl][sl];
  }
  for (; it; it = it->link_next)
    if (it == b)
      return true;
  return false;
}

static size_t ca__count_index(const ca__heap *h) {
  size_t n = 0;
  for (const ca__block *b = h->oversize; b; b = b->link_next)
    n++;
  for (unsigned fl = 0; fl < CA__FL_COUNT; fl++)
    for (unsigned sl = 0; sl < CA__SL_COUNT; sl++)
      for (const ca__block *b = h->bins[fl][sl]; b; b = b->link_next)
        n++;
  return n;
}

static bool ca__check_locked(ca__arena *p, char *why, size_t why_len) {
  uint64_t reserved = 0, live = 0, free_bytes = 0, held = 0, quick = 0;
  uint64_t gone = 0;
  size_t nfree = 0, nlive = 0, nseg = 0, nlost = 0;
  for (ca__segment *s = p->segments; s; s = s->next, nseg++) {
    uint64_t at = s->addr;
    CA__CHECK(s->first && !s->first->prev, "segment %#llx: bad first block",
              (unsigned long long)s->addr);
    for (ca__block *b = s->first; b; b = b->next) {
      CA__CHECK(b->addr == at && b->seg == s && b->size > 0,
                "block %#llx does not follow its neighbour",
                (unsigned long long)b->addr);
      CA__CHECK(!b->next || b->next->prev == b, "broken neighbour links");
      CA__CHECK(b->state != CA__FREE || !b->next ||
                    b->next->state != CA__FREE,
                "two free neighbours at %#llx were not merged",
                (unsigned long long)b->addr);
      if (b->state == CA__FREE) {
        CA__CHECK(ca__in_index(b), "free block %#llx not indexed",
                  (unsigned long long)b->addr);
        free_bytes += b->size;
        nfree++;
      } else if (b->state == CA__LIVE) {
        CA__CHECK(ca__live_find(p, b->addr) == b, "live block %#llx unknown",
                  (unsigned long long)b->addr);
        live += b->size;
        nlive++;
      } else if (b->state == CA__QUICK) {
        quick += b->size;
      } else if (b->state == CA__GONE) {
        CA__CHECK(s->has_gone, "segment %#llx hides a GONE block",
                  (unsigned long long)s->addr);
        gone += b->size;
      } else {
        held += b->size;
      }
      CA__CHECK(!b->keep_out || b->state != CA__FREE,
                "kept-out block %#llx went back to the cache",
                (unsigned long long)b->addr);
      at += b->size;
    }
    CA__CHECK(at == s->addr + s->size, "segment %#llx not tiled",
              (unsigned long long)s->addr);
    CA__CHECK(s->in_lru == (!s->lost && ca__segment_is_free(s)),
              "segment %#llx: LRU membership wrong",
              (unsigned long long)s->addr);
    CA__CHECK(s->lost || ca__segment_at(p, s->addr) == s,
              "segment %#llx missing from the address index",
              (unsigned long long)s->addr);
    nlost += s->lost;
    reserved += s->size;
  }
  CA__CHECK(p->nsegs + nlost == nseg, "address index holds %zu of %zu",
            p->nsegs, nseg - nlost);
  for (size_t i = 1; i < p->nsegs; i++)
    CA__CHECK(p->by_addr[i - 1]->addr + p->by_addr[i - 1]->size <=
                  p->by_addr[i]->addr,
              "address index out of order at %zu", i);
  CA__CHECK(nfree == ca__count_index(&p->small) + ca__count_index(&p->large),
            "index holds blocks that are not free");
  CA__CHECK(nlive + 1 == HASH_COUNT(p->live), "live table size %u != %zu",
            HASH_COUNT(p->live) - 1, nlive);
  CA__CHECK(held == p->held_bytes, "held bytes disagree");
  CA__CHECK(quick == p->quick_bytes, "parked bytes disagree");
  CA__CHECK(reserved == p->stats.reserved_bytes.current,
            "reserved %llu != stats %llu", (unsigned long long)reserved,
            (unsigned long long)p->stats.reserved_bytes.current);
  CA__CHECK(live == p->stats.allocated_bytes.current,
            "allocated %llu != stats %llu", (unsigned long long)live,
            (unsigned long long)p->stats.allocated_bytes.current);
  CA__CHECK(gone == p->gone_bytes, "gone bytes disagree");
  CA__CHECK(reserved == live + free_bytes + held + quick + gone,
            "reserved != live + cached + held + gone");
  CA__CHECK(nlive == p->stats.blocks.current, "block count disagrees");
  CA__CHECK(nseg == p->stats.segments.current, "segment count disagrees");
  return true;
}

/* Every arena's invariants, then the pool's counts against theirs. */
static bool ca__check_arenas(ca_pool *pool, ca__arena *const *all,
                             unsigned n, char *why, size_t why_len) {
  uint64_t reserved = 0;
  for (unsigned i = 0; i < n; i++) {
    CA__CHECK(all[i]->pool == pool &&
                  ca__arena_at(pool, all[i]->index) == all[i],
              "arena %u is not where it says", i);
    if (!ca__check_locked(all[i], why, why_len))
      return false;
    reserved += all[i]->stats.reserved_bytes.current;
  }
  uint64_t counted = atomic_load(&pool->reserved);
  CA__CHECK(reserved == counted, "arenas reserve %llu, the pool counts %llu",
            (unsigned long long)reserved, (unsigned long long)counted);
  /* Every booking is made and settled under its arena's lock. */
  CA__CHECK(atomic_load(&pool->committed) == counted,
            "booked bytes disagree with reserved ones");
  CA__CHECK(atomic_load(&pool->reserved_peak) >= counted,
            "reserved bytes above their peak");
  return true;
}

/* All arenas locked at once, in index order, for one picture of the pool:
 * no other code holds two arena locks, so this cannot deadlock. An arena
 * made meanwhile is not seen: check while the pool is quiet. */
bool ca_pool_check(ca_pool *pool, char *why, size_t why_len) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++)
    ca_lock_acquire(&all[i]->lock);
  bool ok = ca__check_arenas(pool, all, n, why, why_len);
  for (unsigned i = n; i-- > 0;)
    ca_lock_release(&all[i]->lock);
  return ok;
}
