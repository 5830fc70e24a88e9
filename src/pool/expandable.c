/*
 * Expandable segments (expandable_segments:1): the large heap's segments
 * are address ranges reserved without memory, as large as the device's
 * memory. A miss maps the fewest new pages that, with the free block
 * before them, serve the request; giving memory back unmaps the whole
 * pages inside free blocks, wherever they lie, so a few long-lived blocks
 * no longer pin a whole segment. Blocks never move. The first page of a
 * segment stays mapped while the segment lives (it holds the head), so
 * every UNMAPPED block is whole pages.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Expandable segments ------------------------------------------------- */

/* A miss at the pool's peak trades the pages of blocks free for this many
 * of the arena's frees (ca__trade_pages)... */
#define CA__TRADE_IDLE (4 * CA_TRADE_IDLE_FREES)
/* ...and, for a request of 1/2^CA__TRADE_LARGE of the peak or more, any
 * free pages. */
#define CA__TRADE_LARGE 5

static inline uint64_t ca__page_size(const ca__arena *p) {
  return p->backend->page;
}

static inline uint64_t ca__round_down(uint64_t n, uint64_t to) {
  return n / to * to;
}

/* A new block record of segment s; NULL when the host is out of memory. */
static ca__block *ca__block_new(ca__arena *p, ca__segment *s, uint64_t addr,
                                uint64_t size, int state) {
  ca__block *b = ca__slab_get(&p->block_slab);
  if (b)
    *b = (ca__block){.addr = addr, .size = size, .seg = s, .state = state};
  return b;
}

/* Pages were mapped into s: the pool's, the arena's and the segment's
 * reserved bytes grow by them (booked already). */
static void ca__mapped_add(ca__arena *p, ca__segment *s, uint64_t bytes) {
  s->mapped += bytes;
  ca__pool_reserved_add(p, bytes);
  ca__stat_add(&p->stats.reserved_bytes, bytes);
  p->stats.backend_allocs++;
}

static void ca__mapped_sub(ca__arena *p, ca__segment *s, uint64_t bytes) {
  s->mapped -= bytes;
  ca__pool_reserved_sub(p, bytes);
  ca__stat_sub(&p->stats.reserved_bytes, bytes);
  p->stats.backend_frees++;
}

/* The whole pages inside block b that may be unmapped: [*lo, *hi), empty
 * when *hi <= *lo. The segment's first page never is. */
static void ca__span_pages(const ca__arena *p, const ca__segment *s,
                           uint64_t start, uint64_t end, uint64_t *lo,
                           uint64_t *hi) {
  uint64_t page = ca__page_size(p), first_end = s->addr + page;
  *lo = ca__round_up(start, page);
  *lo = *lo < first_end ? first_end : *lo;
  *hi = ca__round_down(end, page);
}

static void ca__block_pages(const ca__arena *p, const ca__block *b,
                            uint64_t *lo, uint64_t *hi) {
  ca__span_pages(p, b->seg, b->addr, b->addr + b->size, lo, hi);
}

/* Merges an UNMAPPED block with UNMAPPED neighbours; returns the one left. */
static ca__block *ca__unmapped_merge(ca__arena *p, ca__block *u) {
  if (u->next && u->next->state == CA__UNMAPPED)
    ca__block_merge_next(p, u);
  if (u->prev && u->prev->state == CA__UNMAPPED) {
    u = u->prev;
    ca__block_merge_next(p, u);
  }
  return u;
}

/* ---- Making and dropping segments ---------------------------------------- */

/* How large a range an expandable segment reserves: the device's memory,
 * so that one range serves any program the device can hold. */
static uint64_t ca__va_size(ca__arena *p) {
  if (!p->va_size) {
    uint64_t free_bytes = 0, total = 0;
    if (p->backend->mem_info(p->backend->ctx, p->device, &free_bytes,
                             &total) != 0 || !total)
      total = 64ull << 30;
    p->va_size = ca__round_up(total, ca__page_size(p));
  }
  return p->va_size;
}

/* Gives a segment's pages and range back to the backend (device work
 * using them has ended). */
static void ca__expandable_free(ca__arena *p, ca__segment *s) {
  const ca_backend *be = p->backend;
  uint64_t start = s->addr, end = s->addr + s->size;
  for (const ca__block *b = s->first; b; b = b->next) {
    if (b->state != CA__UNMAPPED)
      continue;
    if (b->addr > start)
      be->unmap(be->ctx, p->device, start, b->addr - start);
    start = b->addr + b->size;
  }
  if (end > start)
    be->unmap(be->ctx, p->device, start, end - start);
  be->va_release(be->ctx, p->device, s->addr, s->size);
}

/* The records of a new segment over [addr, addr + size), its first page
 * mapped: a free block after the head, the rest UNMAPPED. */
static ca__segment *ca__expandable_records(ca__arena *p, ca__heap *h,
                                           uint64_t addr, uint64_t size) {
  uint64_t page = ca__page_size(p), head = p->opt.segment_head;
  ca__segment *s = ca__slab_get(&p->segment_slab);
  if (!s)
    return NULL;
  *s = (ca__segment){.addr = addr, .size = size, .head = head, .heap = h,
                     .expandable = true, .last_free = p->free_tick};
  ca__block *b = ca__block_new(p, s, addr + head, page - head, CA__FREE);
  if (b)
    b->freed_at = p->free_tick;
  ca__block *u = b ? ca__block_new(p, s, addr + page, size - page,
                                   CA__UNMAPPED)
                   : NULL;
  if (!u) {
    if (b)
      ca__slab_put(&p->block_slab, b);
    ca__slab_put(&p->segment_slab, s);
    return NULL;
  }
  b->next = u;
  u->prev = b;
  s->first = b;
  return s;
}

/* Reserves a new expandable segment for heap h that can hold `size` bytes
 * after its first page; returns 0, the backend's refusal, or oom_code. */
static int ca__expandable_new(ca__arena *p, ca__heap *h, uint64_t size) {
  const ca_backend *be = p->backend;
  uint64_t page = ca__page_size(p), addr = 0;
  uint64_t va = ca__va_size(p), least = ca__round_up(size, page) + page;
  va = va > least ? va : least;
  if (!ca__addr_room(p) || !ca__book_segment(p, page))
    return be->oom_code;
  int rc = be->va_reserve(be->ctx, p->device, va, &addr);
  if (rc != 0 && rc != CA_BACKEND_BUSY && va > least) {
    va = least; /* the driver bounds the addresses a process reserves */
    rc = be->va_reserve(be->ctx, p->device, va, &addr);
  }
  if (rc == 0 && (rc = be->map(be->ctx, p->device, addr, page)) != 0)
    be->va_release(be->ctx, p->device, addr, va);
  if (rc == 0)
    ca__fresh(p, addr, page);
  if (rc != 0) {
    ca__unbook_segment(p, page);
    return rc;
  }
  ca__segment *s = ca__expandable_records(p, h, addr, va);
  if (!s) {
    be->unmap(be->ctx, p->device, addr, page);
    be->va_release(be->ctx, p->device, addr, va);
    ca__unbook_segment(p, page);
    return be->oom_code;
  }
  ca__segment_link(p, s);
  p->nexpandable++;
  ca__mapped_add(p, s, page);
  ca__index_insert(s->first);
  return 0;
}

/* Whether s holds nothing but its first page, free: then it can go. */
static bool ca__expandable_idle(const ca__segment *s) {
  const ca__block *b = s->first;
  return b->state == CA__FREE && b->next && b->next->state == CA__UNMAPPED &&
         !b->next->next;
}

/* Gives an idle segment back whole (the device is synchronized). */
static void ca__expandable_release(ca__arena *p, ca__segment *s) {
  ca__index_remove(s->first);
  HASH_DELETE(hh, p->segment_table, s);
  ca__addr_remove(p, s);
  ca__expandable_free(p, s);
  ca__mapped_sub(p, s, s->mapped);
  ca__segment_forget(p, s);
  p->nexpandable--;
  ca__segment_put(p, s);
}

/* ---- Giving pages back --------------------------------------------------- */

/* Unmaps the whole pages inside free block b, which becomes up to three
 * blocks: free, UNMAPPED, free. Returns the UNMAPPED block left after
 * merging, or NULL (nothing changed) when b holds no such page, the host
 * is out of memory or the backend refuses. */
static ca__block *ca__unmap_block(ca__arena *p, ca__block *b) {
  const ca_backend *be = p->backend;
  ca__segment *s = b->seg;
  uint64_t lo, hi, end = b->addr + b->size;
  ca__block_pages(p, b, &lo, &hi);
  if (hi <= lo)
    return NULL;
  ca__block *mid = lo > b->addr ? ca__block_new(p, s, lo, hi - lo,
                                                CA__UNMAPPED)
                                : b;
  ca__block *tail = hi < end && mid ? ca__block_new(p, s, hi, end - hi,
                                                    CA__FREE)
                                    : NULL;
  if (tail) {
    tail->freed_at = b->freed_at; /* as long free as the block it was */
    tail->owner = b->owner;
  }
  if (!mid || (hi < end && !tail) ||
      be->unmap(be->ctx, p->device, lo, hi - lo) != 0) {
    if (mid && mid != b)
      ca__slab_put(&p->block_slab, mid);
    if (tail)
      ca__slab_put(&p->block_slab, tail);
    return NULL;
  }
  ca__index_remove(b);
  if (mid != b) {
    b->size = lo - b->addr;
    ca__block_link_after(b, mid);
    ca__index_insert(b);
  } else {
    b->state = CA__UNMAPPED;
    b->owner = NULL;
    b->size = hi - lo;
  }
  if (tail) {
    ca__block_link_after(mid, tail);
    ca__index_insert(tail);
  }
  ca__mapped_sub(p, s, hi - lo);
  return ca__unmapped_merge(p, mid);
}

/* Unmapping memory a kernel still uses would fault it, so a round of
 * unmapping waits for the device once first, as cuMemFree does. *synced:
 * -1 before the wait, then whether it waited (not during a capture).
 * Returns whether pages may be unmapped now. */
static bool ca__synced(ca__arena *p, int *synced) {
  if (*synced < 0)
    *synced = p->backend->synchronize(p->backend->ctx, p->device) == 0;
  return *synced > 0;
}

/* Unmaps free pages of segment s, of blocks free for `idle` frees of the
 * arena at least, until the pool's reserved memory is at most `target`.
 * Returns the bytes given back. */
static uint64_t ca__unmap_segment(ca__arena *p, ca__segment *s,
                                  uint64_t target, uint64_t idle,
                                  int *synced) {
  uint64_t released = 0;
  for (ca__block *b = s->first; b && ca__pool_reserved(p) > target;
       b = b->next) {
    uint64_t lo, hi;
    if (b->state != CA__FREE || p->free_tick - b->freed_at < idle)
      continue;
    ca__block_pages(p, b, &lo, &hi);
    if (hi <= lo)
      continue;
    if (!ca__synced(p, synced))
      return released;
    ca__block *u = ca__unmap_block(p, b);
    if (u) {
      released += hi - lo;
      b = u;
    }
  }
  return released;
}

/* One pass of ca__unmap_idle over every expandable segment. */
static uint64_t ca__unmap_segments(ca__arena *p, uint64_t target,
                                   uint64_t idle, int *synced) {
  uint64_t released = 0;
  for (ca__segment *s = p->segments; s && *synced != 0; s = s->next)
    if (s->expandable)
      released += ca__unmap_segment(p, s, target, idle, synced);
  return released;
}

/* Gives back the free pages of the arena's expandable segments (of blocks
 * free for `idle` frees at least), then the idle segments whole, while the
 * pool's reserved memory is above `target`. Free blocks of different
 * streams do not merge, so a page may lie across two of them: with
 * `share`, once the device has been waited for (every stream's work is
 * done), their blocks are shared, merged, and looked at again. Trading at
 * the peak does without: sharing there changed which pages it trades, and
 * left the ResNet-50 bf16 trace 2.9% over its peak instead of 1.2%
 * (bench_replay). Returns the bytes given back. */
static uint64_t ca__unmap_idle(ca__arena *p, uint64_t target, uint64_t idle,
                               bool share) {
  uint64_t released = 0;
  int synced = -1;
  if (!p->nexpandable)
    return 0;
  released += ca__unmap_segments(p, target, idle, &synced);
  if (share && ca__sfree_held(p) && ca__pool_reserved(p) > target &&
      ca__synced(p, &synced)) {
    ca__sfree_share_all(p);
    released += ca__unmap_segments(p, target, idle, &synced);
  }
  for (ca__segment *s = p->segments, *next; s && synced != 0; s = next) {
    next = s->next;
    if (ca__pool_reserved(p) <= target)
      break;
    if (s->expandable && ca__expandable_idle(s) && ca__synced(p, &synced)) {
      released += s->mapped;
      ca__expandable_release(p, s);
    }
  }
  return released;
}

/* Every free page, as the collection threshold, the memory limit,
 * out-of-memory recovery and empty_cache ask (segments.c). */
static uint64_t ca__unmap_free(ca__arena *p, uint64_t target) {
  return ca__unmap_idle(p, target, 0, true);
}

/* Free pages an expandable segment could give back now: the whole pages
 * inside each run of free blocks, whatever streams they are of (giving
 * back waits for the device, and then shares them all). */
static uint64_t ca__expandable_releasable(const ca__arena *p,
                                          const ca__segment *s) {
  uint64_t bytes = 0;
  for (const ca__block *b = s->first; b; b = b->next) {
    uint64_t lo, hi;
    if (b->state != CA__FREE)
      continue;
    const ca__block *last = b;
    while (last->next && last->next->state == CA__FREE)
      last = last->next;
    ca__span_pages(p, s, b->addr, last->addr + last->size, &lo, &hi);
    bytes += hi > lo ? hi - lo : 0;
    b = last;
  }
  return bytes;
}

/* Free pages of heap h's segments. */
static uint64_t ca__heap_free_pages(const ca__arena *p, const ca__heap *h) {
  uint64_t bytes = 0;
  for (const ca__segment *s = p->segments; s; s = s->next)
    if (s->expandable && s->heap == h)
      bytes += ca__expandable_releasable(p, s);
  return bytes;
}

/* ---- Mapping pages for a request ---------------------------------------- */

/* Whether free block b would join new pages mapped for the request being
 * served (ca__map_at): its stream's, or shared. */
static bool ca__joins(const ca__arena *p, const ca__block *b) {
  return b && b->state == CA__FREE && (!b->owner || b->owner == p->want);
}

/* Where heap h serves `size` bytes by mapping the fewest new bytes: the
 * start of an UNMAPPED block, extending the free block before it. Returns
 * the UNMAPPED block and the bytes to map there, or NULL. */
static ca__block *ca__map_site(ca__arena *p, const ca__heap *h, uint64_t size,
                               uint64_t *bytes) {
  ca__block *best = NULL;
  *bytes = UINT64_MAX;
  for (ca__segment *s = p->segments; s; s = s->next) {
    if (!s->expandable || s->heap != h)
      continue;
    for (ca__block *u = s->first; u; u = u->next) {
      if (u->state != CA__UNMAPPED)
        continue;
      const ca__block *prev = u->prev, *next = u->next;
      uint64_t before = ca__joins(p, prev) ? prev->size : 0;
      uint64_t after = ca__joins(p, next) ? next->size : 0;
      uint64_t need =
          before >= size ? 0 : ca__round_up(size - before, ca__page_size(p));
      if (need > u->size && before + u->size + after >= size)
        need = u->size;
      if (need <= u->size && need < *bytes) {
        best = u;
        *bytes = need;
      }
    }
  }
  return best;
}

/* Maps `bytes` at the start of UNMAPPED block u. Returns 0 with the free
 * block now holding them (merged with its free neighbours) in *out, or the
 * backend's status. */
static int ca__map_at(ca__arena *p, ca__block *u, uint64_t bytes,
                      ca__block **out) {
  const ca_backend *be = p->backend;
  ca__block *rest = NULL;
  if (bytes < u->size &&
      !(rest = ca__block_new(p, u->seg, u->addr + bytes, u->size - bytes,
                             CA__UNMAPPED)))
    return be->oom_code;
  int rc = ca__book_segment(p, bytes) ? 0 : be->oom_code;
  if (rc == 0 && (rc = be->map(be->ctx, p->device, u->addr, bytes)) != 0)
    ca__unbook_segment(p, bytes);
  if (rc == 0)
    ca__fresh(p, u->addr, bytes);
  if (rc != 0) {
    if (rest)
      ca__slab_put(&p->block_slab, rest);
    return rc;
  }
  if (rest) {
    u->size = bytes;
    ca__block_link_after(u, rest);
  }
  ca__mapped_add(p, u->seg, bytes);
  u->owner = p->want; /* takes in only what the request may use */
  *out = ca__block_make_free(p, u);
  return 0;
}

/* Before mapping `bytes` past the most the pool ever reserved, gives back
 * free pages of the heap for them, as many as it has up to that: reserved
 * memory then grows only by what the program holds, not by the free bytes
 * scattered between its blocks. Below the peak nothing is traded: a steady
 * loop maps and unmaps nothing (unmapping waits for the device, and pages
 * cost about 20 us per MiB to map and as much to unmap). Returns whether
 * pages went back. */
static bool ca__trade_pages(ca__arena *p, const ca__heap *h, uint64_t bytes) {
  uint64_t peak =
      atomic_load_explicit(&p->pool->reserved_peak, memory_order_relaxed);
  uint64_t reserved = ca__pool_reserved(p);
  if (reserved + bytes <= peak || !ca__heap_free_pages(p, h))
    return false;
  uint64_t target = peak > bytes ? peak - bytes : 0;
  target = target < reserved ? target : reserved;
  uint64_t traded = ca__unmap_idle(p, target, CA__TRADE_IDLE, false);
  if (ca__pool_reserved(p) > target && bytes >= peak >> CA__TRADE_LARGE)
    traded += ca__unmap_idle(p, target, 0, false);
  return traded > 0;
}

/* One try at serving `size` from heap h's ranges, within the memory limit
 * (giving back cached memory first if need be). */
static int ca__expand_once(ca__arena *p, ca__heap *h, uint64_t size,
                           ca__block **out) {
  uint64_t bytes;
  ca__block *u = ca__map_site(p, h, size, &bytes);
  if (u && bytes && ca__trade_pages(p, h, bytes))
    u = ca__map_site(p, h, size, &bytes);
  if (!u || !ca__fits_limit(p, bytes)) {
    uint64_t room = ca__limit_room(p), want = u ? bytes : ca__page_size(p) * 2;
    uint64_t target = room > want ? room - want : 0;
    ca__release_lru(p, target);
    ca__release_others(p, target, false);
    if ((*out = ca__find(p, size)))
      return 0;
    u = ca__map_site(p, h, size, &bytes);
  }
  if (!u) {
    int rc = ca__expandable_new(p, h, size);
    if (rc != 0)
      return rc;
    if ((*out = ca__find(p, size)))
      return 0; /* the first page serves it */
    u = ca__map_site(p, h, size, &bytes);
  }
  if (bytes == 0) { /* the free block before it serves the request */
    *out = u->prev;
    return 0;
  }
  if (!ca__fits_limit(p, bytes))
    return p->backend->oom_code;
  return ca__map_at(p, u, bytes, out);
}

/* Turns ranges off for the heap and every arena made later, saying once
 * per pool why. */
static void ca__expandable_off(ca__arena *p, ca__heap *h, int rc) {
  h->expandable = false;
  if (!atomic_exchange_explicit(&p->pool->ranges_off, true,
                                memory_order_relaxed) &&
      p->opt.warn) {
    char line[256];
    snprintf(line, sizeof(line),
             "device %d: expandable_segments:1 is off: the driver refused "
             "its virtual-memory calls (status %d); plain segments serve "
             "the program instead",
             p->device, rc);
    p->opt.warn(line);
  }
}

/* Serves a miss of heap h by mapping pages: 0 with *out set, oom_code when
 * the device is full even after every cache gave back what it could, or
 * CA_BACKEND_BUSY when the caller should use a plain segment (ranges may
 * not be mapped now, or the backend has none). */
static int ca__expand(ca__arena *p, ca__heap *h, uint64_t size,
                      ca__block **out) {
  int oom = p->backend->oom_code;
  ca__collect_garbage(p, ca__round_up(size, ca__page_size(p)));
  int rc = ca__expand_once(p, h, size, out);
  if (rc == oom) {
    p->stats.oom_retries++;
    if (ca__empty_caches(p, size, out))
      return 0;
    rc = ca__expand_once(p, h, size, out);
  }
  if (rc != 0 && rc != oom && rc != CA_BACKEND_BUSY) {
    ca__expandable_off(p, h, rc);
    rc = CA_BACKEND_BUSY;
  }
  return rc;
}
