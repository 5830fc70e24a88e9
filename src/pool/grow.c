/*
 * Growing: segment sizes, the collection threshold, the memory limit,
 * trading idle segments, merging at a miss, out-of-memory retries.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Growing -------------------------------------------------------------- */

/* The smallest segment that can serve `size` after a head of `head` bytes:
 * what large requests get, and what any request gets when memory is
 * short. */
static uint64_t ca__segment_size_min(uint64_t size, uint64_t head) {
  return ca__round_up(size + head, CA_LARGE_ROUND);
}

/* The segment a request of `size` would like: PyTorch's scheme. */
static uint64_t ca__segment_size(const ca__arena *p, uint64_t size) {
  if (size <= ca__small_max(p))
    return CA_SMALL_SEGMENT;
  if (size < CA_MEDIUM_REQUEST)
    return CA_MEDIUM_SEGMENT;
  return ca__segment_size_min(size, p->opt.segment_head);
}

static uint64_t ca__gc_budget(ca__arena *p) {
  if (!p->gc_budget) {
    uint64_t free_bytes = 0, total = 0;
    uint64_t limit = ca_budget_limit(p->pool->budget);
    if (limit)
      p->gc_budget = limit;
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
  if (wait)
    ca__wait_all(p);
  else
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
  uint64_t segments = 0, stream;
  if (n < 2 || ca__pool_reserved(p) <= target)
    return 0;
  const uint64_t *want = ca__wanted(p, &stream);
  ca_lock_release(&p->lock);
  for (unsigned i = 0; i < n; i++)
    if (all[i] != p)
      ca__give_back(all[i], target, wait, &segments);
  ca_lock_acquire(&p->lock);
  ca__want(p, want);
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
 * to the driver, under shared_limit the group's other processes).
 * UINT64_MAX when there is no limit. */
static uint64_t ca__limit_room(const ca__arena *p) {
  const ca_budget *b = p->pool->budget;
  uint64_t limit = ca_budget_limit(b);
  if (!limit)
    return UINT64_MAX;
  uint64_t booked = ca_budget_held(b), own = ca__pool_reserved(p);
  uint64_t outside = booked > own ? booked - own : 0;
  return limit > outside ? limit - outside : 0;
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
  uint64_t min = ca__segment_size_min(size, p->opt.segment_head);
  uint64_t room = ca__limit_room(p);
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

/* New memory from the backend set to options.fresh_byte, where it is
 * asked and the backend can: a fill that fails only leaves it as it came. */
static void ca__fresh(ca__arena *p, uint64_t addr, uint64_t size) {
  const ca_backend *be = p->backend;
  if (p->opt.fill_fresh && be->fill)
    be->fill(be->ctx, p->device, addr, size, 1, 0, p->opt.fresh_byte, NULL);
}

/* A refused booking reads as the backend running out: the caller's
 * recovery is the same. */
static int ca__reserve(ca__arena *p, ca__heap *h, uint64_t seg,
                       uint64_t head, ca__block **out) {
  uint64_t addr = 0;
  if (!ca__book_segment(p, seg))
    return p->backend->oom_code;
  int rc = p->backend->reserve(p->backend->ctx, p->device, seg, &addr);
  if (rc != 0) {
    ca__unbook_segment(p, seg);
    return rc;
  }
  ca__fresh(p, addr, seg);
  *out = ca__segment_new(p, h, addr, seg, head);
  if (!*out) {
    p->backend->release(p->backend->ctx, p->device, addr, seg);
    ca__unbook_segment(p, seg);
    return p->backend->oom_code;
  }
  return 0;
}

/* Waits for pending batches, oldest first, until one of their blocks serves
 * `size`, while one could. Returns true with *out set when one does. */
static bool ca__wait_for_fit(ca__arena *p, uint64_t size, ca__block **out) {
  const ca__heap *h = ca__heap_for(p, size);
  while (ca__pending_could_serve(p, h, size) && ca__wait_oldest(p)) {
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

/* When the device is out of memory: waits for every pending block, then
 * serves `size` from the cache if it now can (true, *out set); else gives
 * back every cached segment, p's and the other arenas', for a last try. */
static bool ca__empty_caches(ca__arena *p, uint64_t size, ca__block **out) {
  ca__wait_all(p);
  if ((*out = ca__find(p, size)))
    return true;
  ca__release_lru(p, 0);
  ca__release_others(p, 0, true);
  return false;
}

/* The last try, all caches given back: the smallest segment, with its head;
 * then, where the head is what does not fit, without one, since a request
 * that cudaMalloc would serve must not fail for the leak report's sake (its
 * block starts at the segment's base, and the report cannot class it). */
static int ca__reserve_last(ca__arena *p, ca__heap *h, uint64_t size,
                            ca__block **out) {
  int rc = p->backend->oom_code;
  uint64_t head = p->opt.segment_head;
  uint64_t seg = ca__segment_size_min(size, head);
  if (ca__fits_limit(p, seg))
    rc = ca__reserve(p, h, seg, head, out);
  uint64_t bare = ca__segment_size_min(size, 0);
  if (rc == p->backend->oom_code && bare < seg && ca__fits_limit(p, bare))
    rc = ca__reserve(p, h, bare, 0, out);
  return rc;
}

static int ca__expand(ca__arena *p, ca__heap *h, uint64_t size,
                      ca__block **out);

/* Serves a cache miss with a new segment, or new pages of an expandable
 * one (expandable.c). Pending blocks are waited for first, oldest first,
 * until one serves the request; idle free segments are traded in, the
 * other free ones merged. When the backend or the memory limit refuses the
 * segment: give back every cached segment (the other arenas' too) and
 * retry once with the smallest segment that serves the request. */
static int ca__grow(ca__arena *p, uint64_t size, ca__block **out) {
  ca__heap *h = ca__heap_for(p, size);
  int oom = p->backend->oom_code;
  uint64_t seg = ca__segment_size(p, size);
  ca__quick_flush(p); /* what follows weighs fully free segments */
  if (ca__wait_for_fit(p, size, out))
    return 0;
  if (h->expandable) {
    int rc = ca__expand(p, h, size, out);
    if (rc != CA_BACKEND_BUSY)
      return rc;
  }
  ca__collect_garbage(p, seg);
  ca__trade_idle(p, seg);
  uint64_t merged = ca__merge_free(p, h, size);
  seg = ca__segment_within_limit(p, size, merged > seg ? merged : seg);
  if (seg) {
    int rc = ca__reserve(p, h, seg, p->opt.segment_head, out);
    if (rc != oom)
      return rc;
    p->stats.oom_retries++;
  }
  if (ca__empty_caches(p, size, out))
    return 0;
  return ca__reserve_last(p, h, size, out);
}
