/*
 * The entry points of pool.h.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Public entry points -------------------------------------------------- */

ca_pool *ca_pool_create(const ca_backend *backend, int device,
                        const ca_pool_options *options) {
  ca_pool *pool = ca_meta_alloc(sizeof(*pool)); /* zeroed, line-aligned */
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
    ca_meta_free(pool, sizeof(*pool));
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
  ca_meta_free(pool, sizeof(*pool));
}

static void ca__drop_all(ca__arena *p) {
  ca_lock_acquire(&p->lock);
  ca__pool_reserved_sub(p, p->stats.reserved_bytes.current);
  ca__forget_all(p, 0);
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
  if (size <= ca__small_max(p) || ++p->large_since_fence < CA__FENCE_EVERY)
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
  if (!b && (p->held_head || p->batch_head || ca__sfree_held(p)) &&
      (ca__fence_pending(p) || ca__recover_pending(p))) {
    /* A block of this very size that came back is taken as it is,
     * unmerged, as under immediate reuse (ca__take_cached). Large blocks
     * merge as they come back: their heap's quick lists stay empty. */
    if (h->quick_fl_bitmap && (b = ca__quick_take(p, size)))
      return b;
    ca__heap_flush(p, h);
    b = ca__find(p, size);
  }
  return b;
}

/* A cached block for a request that names its stream: its stream's own
 * and the shared ones, then the parked ones merged, then what has passed
 * of the pending ones, then, last, every other stream's blocks shared
 * behind markers on their own streams (oldest first), of which what has
 * passed comes back at once. Never a fence: the pool grows only after
 * waiting for pending blocks that could serve it (ca__grow). */
static ca__block *ca__find_cached_on(ca__arena *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  ca__block *b = ca__find(p, size);
  if (!b && h->quick_fl_bitmap) {
    ca__heap_flush(p, h);
    b = ca__find(p, size);
  }
  if (!b && p->batch_head && ca__reap(p)) {
    ca__heap_flush(p, h);
    b = ca__find(p, size);
  }
  if (!b && ca__sfree_close_others(p) && ca__reap(p)) {
    ca__heap_flush(p, h);
    b = ca__find(p, size);
  }
  return b;
}

/* For a request that p could not serve even after every arena gave back
 * what it could: a block from another arena's cache. A nearly full device
 * may keep its free memory in other arenas' partly used segments, which no
 * arena can give back. The block lives on in that arena, where frees find
 * it. Returns the arena locked now: the one that served *out, p released;
 * or p, locked again, with *out NULL when none could. */
static CA__COLD ca__arena *ca__obtain_elsewhere(ca__arena *p, uint64_t size,
                                                const uint64_t *stream,
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
    ca__want(o, stream);
    if (ca__live_room(&o->live) &&
        (*out = stream ? ca__find_cached_on(o, size)
                       : ca__find_cached(o, size))) {
      o->stats.cache_hits++;
      ca__take_cached(o, *out, size);
      return o;
    }
    ca_lock_release(&o->lock);
  }
  ca_lock_acquire(&p->lock);
  ca__want(p, stream);
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

/* Hands block b out for a request of `size` bytes on *stream: live,
 * numbered, counted. A listed block's slot and index marks are there
 * already: its slot is given the bytes asked. Releases the arena's lock. */
static inline __attribute__((always_inline)) void
ca__give_out(ca__arena *p, ca__block *b, bool listed, uint64_t size,
             uint32_t tag, const uint64_t *stream, uint64_t *addr) {
  if (__builtin_expect(b->nstale | b->red_zone_unset, 0))
    ca__hand_out_stale(p, b, size, stream);
  b->requested = size;
  b->tag = tag;
  b->seq = ca__next_seq(p);
  if (listed)
    ca__live_slot_of(&p->live, b->addr)->requested = size;
  else
    ca__set_live(p, b, true);
  p->stats.allocs++;
  ca__stat_add(&p->stats.requested_bytes, size);
  ca__stat_add(&p->stats.allocated_bytes, b->size);
  ca__stat_add(&p->stats.blocks, 1);
  *addr = b->addr;
  ca_lock_release(&p->lock);
}

/* Finds or makes a free block of at least `size` bytes, out of every index
 * (`ordered`: for a request that names its stream). */
static inline __attribute__((always_inline)) int
ca__obtain(ca__arena *p, uint64_t size, bool ordered, ca__block **out) {
  ca__block *b = ordered ? ca__find_cached_on(p, size)
                         : ca__find_cached(p, size);
  if (b) {
    p->stats.cache_hits++;
    ca__take_cached(p, b, size);
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

/* Both ways in, the plain one and the one that names a stream (NULL:
 * plain), inlined into each with `stream` known. */
static inline __attribute__((always_inline)) int
ca__alloc(ca_pool *pool, uint64_t size, uint32_t tag, const uint64_t *stream,
          uint64_t *addr) {
  if (size > CA__MAX_REQUEST)
    return pool->backend->oom_code;
  uint64_t rounded =
      ca__round_up((size ? size : 1) + pool->opt.red_zone, CA_GRANULE);
  ca__arena *p = ca__enter(pool);
  if (!ca__live_room(&p->live)) {
    p->stats.failed_allocs++;
    ca_lock_release(&p->lock);
    return pool->backend->oom_code; /* no host memory for its record */
  }
  ca__want(p, stream);
  ca__block *b = stream ? NULL : ca__quick_take(p, rounded);
  if (b) {
    p->stats.cache_hits++;
    b->state = CA__LIVE;
  } else {
    int rc = ca__obtain(p, rounded, stream != NULL, &b);
    if (rc == p->backend->oom_code) {
      p = ca__obtain_elsewhere(p, rounded, stream, &b);
      rc = b ? 0 : rc;
    }
    if (rc != 0) {
      p->stats.failed_allocs++;
      ca_lock_release(&p->lock);
      return rc;
    }
  }
  ca__give_out(p, b, b->listed, size, tag, stream, addr);
  return 0;
}

int ca_pool_alloc(ca_pool *pool, uint64_t size, uint32_t tag, uint64_t *addr) {
  return ca__alloc(pool, size, tag, NULL, addr);
}

int ca_pool_alloc_on(ca_pool *pool, uint64_t size, uint32_t tag,
                     uint64_t stream, uint64_t *addr) {
  return ca__alloc(pool, size, tag, &stream, addr);
}

/* The live table's slot of the live block starting at addr, or NULL (a
 * listed freed block is not live). */
static inline ca__live_slot *ca__live_at(ca__arena *p, uint64_t addr) {
  ca__live_slot *s = addr != 0 ? ca__live_slot_of(&p->live, addr) : NULL;
  return s && s->block->state == CA__LIVE ? s : NULL;
}

/* The live block starting at addr, or NULL. */
static ca__block *ca__live_find(ca__arena *p, uint64_t addr) {
  ca__live_slot *s = ca__live_at(p, addr);
  return s ? s->block : NULL;
}

/* Keeps small block b, just freed, in the live table (its slot, at
 * `slot`, asks for no bytes now) and the address index: parked in its
 * quick list, or pending and then parked, the next request of its size
 * takes it back with neither changed, and only a merge (ca__heap_flush)
 * delists it. A large block merges as it comes back instead, a kept-out
 * one never comes back. */
static inline bool ca__stay_listed(ca__block *b, ca__live_slot *slot) {
  if (__builtin_expect(b->keep_out, 0) || b->seg->heap->large)
    return false;
  slot->requested = 0;
  b->owner = NULL;
  b->listed = true;
  return true;
}

/* A freed block's way back to the cache, by policy (`slot`: its live
 * table slot). device_sync waits under the lock: it is a debugging policy,
 * and cudaFree itself stalls the whole device. */
static inline __attribute__((always_inline)) void
ca__retire(ca__arena *p, ca__block *b, ca__live_slot *slot) {
  bool now = p->opt.reuse == CA_REUSE_IMMEDIATE ||
             (p->opt.reuse == CA_REUSE_DEVICE_SYNC &&
              p->backend->synchronize(p->backend->ctx, p->device) == 0);
  if (!ca__stay_listed(b, slot))
    ca__delist(p, b);
  if (now)
    ca__cache(p, b);
  else
    ca__hold(p, b);
}

/* The arena that holds the live block at `addr`, locked; NULL when none
 * does, not a pointer of this pool. `own`, an arena already asked (a free
 * asks the calling thread's first), is skipped: NULL, or locked and
 * released here. The address index names the arena; only a chunk it
 * cannot say of is searched for, arena by arena. */
static CA__COLD ca__arena *ca__owner(ca_pool *pool, ca__arena *own,
                                     uint64_t addr) {
  if (own)
    ca_lock_release(&own->lock);
  ca__arena *p;
  ca__segment *s = ca__where_lock(addr, &p);
  if (!s)
    return NULL;
  if (s != CA__SHARED) {
    if (p->pool == pool && ca__live_find(p, addr))
      return p;
    ca_lock_release(&p->lock);
    return NULL;
  }
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

static void ca__describe(const ca__arena *p, const ca__block *b,
                         ca_live_block *out) {
  out->addr = b->addr;
  out->requested = b->requested;
  out->size = b->size;
  out->seq = b->seq;
  out->device = p->device;
  out->tag = b->tag;
  out->page = b->seg->expandable ? ca__page_size(p) : 0;
  out->at_base = b->addr == b->seg->addr ||
                 (out->page && b->addr % out->page == 0);
  out->red_zone_unset = b->red_zone_unset;
}

/* A block freed on `stream`: free at once among its stream's blocks,
 * merged with its neighbours of that stream and shared ones; or, with no
 * index to be had for the stream (or no markers to share its blocks
 * with), among the ordinary pending frees (a fence or a marker over every
 * stream covers it too). */
static void ca__retire_on(ca__arena *p, ca__block *b, uint64_t stream,
                          ca__live_slot *slot) {
  ca__sfree *s = b->keep_out || !p->backend->mark
                     ? NULL
                     : ca__sfree_of(p, stream, true);
  if (!s) {
    ca__retire(p, b, slot);
    return;
  }
  ca__delist(p, b);
  s->used = p->free_tick;
  b->owner = s;
  ca__block_make_free(p, b);
}

/* Takes the live block at `addr` out of use, its arena locked on return
 * (NULL, nothing locked, when no arena holds it); the caller takes it out
 * of the live table (*slot) and the address index, or parks it there. The
 * thread's own arena is asked first: threads mostly free what they
 * allocated. */
static inline __attribute__((always_inline)) ca__arena *
ca__take_back(ca_pool *pool, uint64_t addr, ca_live_block *freed,
              ca__block **out, ca__live_slot **slot) {
  ca__arena *p = ca__arena_at(pool, ca__thread_arena);
  ca__live_slot *at = NULL;
  if (p) {
    ca__enter_own(p);
    at = ca__live_at(p, addr);
  }
  if (!at) {
    if (!(p = ca__owner(pool, p, addr)))
      return NULL;
    at = ca__live_at(p, addr);
  }
  ca__block *b = at->block;
  if (freed)
    ca__describe(p, b, freed);
  ca__where_removed(p);
  *slot = at;
  b->seg->last_free = ++p->free_tick;
  p->stats.frees++;
  ca__stat_sub(&p->stats.requested_bytes, b->requested);
  ca__stat_sub(&p->stats.allocated_bytes, b->size);
  ca__stat_sub(&p->stats.blocks, 1);
  *out = b;
  return p;
}

bool ca_pool_free(ca_pool *pool, uint64_t addr, ca_live_block *freed) {
  ca__block *b;
  ca__live_slot *slot;
  ca__arena *p = ca__take_back(pool, addr, freed, &b, &slot);
  if (!p)
    return false;
  ca__retire(p, b, slot);
  ca_lock_release(&p->lock);
  return true;
}

bool ca_pool_free_on(ca_pool *pool, uint64_t addr, uint64_t stream,
                     ca_live_block *freed) {
  ca__block *b;
  ca__live_slot *slot;
  ca__arena *p = ca__take_back(pool, addr, freed, &b, &slot);
  if (!p)
    return false;
  ca__retire_on(p, b, stream, slot);
  ca_lock_release(&p->lock);
  return true;
}

void ca_pool_stream_ended(ca_pool *pool, uint64_t stream) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++) {
    ca__arena *p = all[i];
    ca_lock_acquire(&p->lock);
    ca__sfree *s = ca__sfree_of(p, stream, false);
    if (s && !ca__sfree_close(p, s))
      for (ca__block *b; (b = ca__sfree_pop(s));) {
        ca__lru_remove(p, b->seg);
        ca__hold(p, b);
      }
    ca_lock_release(&p->lock);
  }
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

/* The block of segment s holding addr: a live one by the address index;
 * in a segment the index could not take, by the live table when addr is a
 * live block's start (what queries mostly ask about), else by walking. */
static ca__block *ca__block_at(ca__arena *p, ca__segment *s, uint64_t addr) {
  if (s->chunks)
    return ca__where_block(p, s, addr);
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
  out->expandable = s->expandable;
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
  ca__arena *p;
  ca__segment *s = ca__where_lock(addr, &p);
  if (!s)
    return false;
  if (s != CA__SHARED) {
    bool mine = p->pool == pool;
    if (mine)
      fn(p, s, addr, arg);
    ca_lock_release(&p->lock);
    if (mine)
      return true;
  }
  /* The index names another pool's newer segment, or cannot tell: this
   * pool may still list a segment there (one freed behind its back, or of
   * a context being destroyed), found arena by arena. */
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

/* Whether b is a live block whose requested bytes hold addr: then
 * [*lo, *hi) are they (a segment the address index could not record). */
static bool ca__block_bounds(const ca__block *b, uint64_t addr, uint64_t *lo,
                             uint64_t *hi) {
  if (!b || b->state != CA__LIVE || addr - b->addr >= b->requested)
    return false;
  *lo = b->addr;
  *hi = b->addr + b->requested;
  return true;
}

ca_pool_where ca_pool_bounds(uint64_t addr, uint64_t *start, uint64_t *end) {
  if (ca__where_recent(addr, start, end))
    return CA_POOL_FOUND;
  ca__arena *p;
  ca__segment *s = ca__where_lock(addr, &p);
  if (!s || s == CA__SHARED)
    return s ? CA_POOL_ASK : CA_POOL_NOWHERE;
  bool live = s->chunks ? ca__where_bounds(p, s, addr, start, end)
                        : ca__block_bounds(ca__block_at(p, s, addr), addr, start, end);
  if (live)
    ca__where_remember(p, *start, *end - *start);
  else
    *start = *end = 0;
  ca_lock_release(&p->lock);
  return CA_POOL_FOUND;
}

ca_pool_where ca_pool_locate(uint64_t addr, ca_pool **pool,
                             ca_pool_span *out) {
  ca__arena *p;
  ca__segment *s = ca__where_lock(addr, &p);
  if (!s || s == CA__SHARED)
    return s ? CA_POOL_ASK : CA_POOL_NOWHERE;
  ca__span(p, s, addr, out);
  *pool = p->pool;
  ca_lock_release(&p->lock);
  return CA_POOL_FOUND;
}

/* An expandable segment's pages are mapped into a range the pool
 * reserved: no cuMemFree can free them (the driver refuses VMM ranges). */
static void ca__lose_at(ca__arena *p, ca__segment *s, uint64_t addr,
                        void *unused) {
  (void)addr, (void)unused;
  if (!s->expandable)
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
    for (const ca__segment *s = all[i]->segments; s; s = s->next) {
      if (!s->lost && ca__live_in(s) == 0)
        bytes += ca__segment_bytes(s); /* all of it goes back */
      else if (s->expandable)
        bytes += ca__expandable_releasable(all[i], s);
    }
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
