/*
 * Segments: the pool-wide count of reserved memory, the arena's segments,
 * the address index, and blocks that never come back (GONE).
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Reserved memory, pool-wide ------------------------------------------ */

/* What the pool holds or is reserving now, all arenas together: the figure
 * the collection threshold weighs. */
static uint64_t ca__pool_reserved(const ca__arena *p) {
  return atomic_load_explicit(&p->pool->committed, memory_order_relaxed);
}

/* A booked segment was reserved: the pool's count and its peak. */
static void ca__peak_raise(_Atomic uint64_t *peak_at, uint64_t now) {
  uint64_t peak = atomic_load_explicit(peak_at, memory_order_relaxed);
  while (now > peak &&
         !atomic_compare_exchange_weak_explicit(peak_at, &peak, now,
                                                memory_order_relaxed,
                                                memory_order_relaxed))
    ;
}

static void ca__pool_reserved_add(ca__arena *p, uint64_t seg) {
  ca_pool *pool = p->pool;
  uint64_t now =
      atomic_fetch_add_explicit(&pool->reserved, seg, memory_order_relaxed) +
      seg;
  ca__peak_raise(&pool->reserved_peak, now);
  ca__peak_raise(&pool->reported_peak, now);
  ca_budget_served(pool->budget);
}

/* Segments of `bytes` left the pool (given back, or dropped with a
 * context). */
static void ca__pool_reserved_sub(ca__arena *p, uint64_t bytes) {
  atomic_fetch_sub_explicit(&p->pool->reserved, bytes, memory_order_relaxed);
  atomic_fetch_sub_explicit(&p->pool->committed, bytes, memory_order_relaxed);
  ca_budget_unbook(p->pool->budget, bytes);
}

/* ---- Segments ------------------------------------------------------------- */

/* The device memory a segment holds: all of a plain one, the mapped pages
 * of an expandable one. */
static uint64_t ca__segment_bytes(const ca__segment *s) {
  return s->expandable ? s->mapped : s->size;
}

/* Whether no byte of a plain segment is in use: nothing but FREE blocks
 * (one, or a few of different streams, which do not merge) and GONE ones.
 * Free blocks of one owner are merged, so a segment in use shows a block
 * in use among its first few. An expandable segment never is: it gives
 * back pages instead (expandable.c). */
static int ca__segment_is_free(const ca__segment *s) {
  if (s->expandable)
    return 0;
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
  if (s->in_lru) /* a stream's blocks shared at once (stream_free.c) */
    return;
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
  ca__segment **v = ca_grow(p->by_addr, &p->segs_cap, sizeof(*v));
  if (!v)
    return false;
  p->by_addr = v;
  return true;
}

static void ca__addr_insert(ca__arena *p, ca__segment *s) {
  atomic_store_explicit(&s->arena, p, memory_order_release);
  ca__where_add(s);
  size_t i = ca__addr_upper(p, s->addr);
  memmove(&p->by_addr[i + 1], &p->by_addr[i],
          (p->nsegs - i) * sizeof(*p->by_addr));
  p->by_addr[i] = s;
  p->nsegs++;
}

/* Bases in the index are distinct: s sits just below the upper bound. */
static void ca__addr_remove(ca__arena *p, ca__segment *s) {
  ca__where_drop(s);
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
  ca__pool_reserved_sub(p, ca__segment_bytes(s));
  ca__stat_sub(&p->stats.reserved_bytes, ca__segment_bytes(s));
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

static uint64_t ca__unmap_free(ca__arena *p, uint64_t target);

/* Gives back fully free segments, oldest first, then the free pages of
 * expandable ones, until the pool's reserved memory is at most
 * `reserved_target`. Returns the bytes given back. */
static uint64_t ca__release_lru(ca__arena *p, uint64_t reserved_target) {
  uint64_t released = 0;
  while (p->lru_head && ca__pool_reserved(p) > reserved_target) {
    released += p->lru_head->size;
    ca__segment_release(p, p->lru_head);
  }
  if (ca__pool_reserved(p) > reserved_target)
    released += ca__unmap_free(p, reserved_target);
  return released;
}

/* ---- Blocks that never come back ------------------------------------------ */

/* Takes a freed block out of use for as long as its segment lives. */
static void ca__bury(ca__arena *p, ca__block *b) {
  b->state = CA__GONE;
  p->gone_bytes += b->size;
}

/* Forgets a lost segment once nothing in it is live or pending: its bytes
 * are no longer the pool's, so nothing is given back. */
static void ca__drop_if_dead(ca__arena *p, ca__segment *s) {
  for (const ca__block *b = s->first; b; b = b->next)
    if (b->state != CA__GONE)
      return;
  ca__segment_forget(p, s);
  p->gone_bytes -= s->size - s->head; /* its blocks: all GONE */
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
  ca__set_live(p, b, false);
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
    } else { /* pending: GONE when it comes back */
      if (b->listed) /* its address may soon start a new segment's block */
        ca__delist(p, b);
      b->keep_out = true;
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

/* Puts a new segment in the arena's list, its table and address index,
 * and counts it (the caller made room in the index). */
static void ca__segment_link(ca__arena *p, ca__segment *s) {
  s->next = p->segments;
  if (p->segments)
    p->segments->prev = s;
  p->segments = s;
  HASH_ADD(hh, p->segment_table, addr, sizeof(uint64_t), s);
  ca__addr_insert(p, s);
  ca__stat_add(&p->stats.segments, 1);
}

static ca__block *ca__segment_new(ca__arena *p, ca__heap *h, uint64_t addr,
                                  uint64_t size, uint64_t head) {
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
  s->head = head;
  s->heap = h;
  s->first = b;
  s->last_free = p->free_tick; /* files it at the newest end of the LRU */
  ca__segment_link(p, s);
  b->addr = addr + head;
  b->size = size - head;
  b->seg = s;
  b->state = CA__FREE;
  ca__index_insert(b);
  ca__lru_push(p, s);
  p->stats.backend_allocs++;
  ca__pool_reserved_add(p, size);
  ca__stat_add(&p->stats.reserved_bytes, size);
  return b;
}
