/*
 * What the pool tells of itself: its statistics, and walks over its live
 * blocks and over every block (the leak report, the snapshot, the tests).
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Statistics and walks ------------------------------------------------ */

/* The largest block of one index, or `largest` if that is larger. */
static uint64_t ca__bins_largest(const ca__bins *x, uint64_t largest) {
  for (const ca__block *b = x->oversize; b; b = b->link_next)
    largest = b->size > largest ? b->size : largest;
  if (!x->fl_bitmap)
    return largest;
  unsigned fl = 63u - (unsigned)__builtin_clzll(x->fl_bitmap);
  unsigned sl = 31u - (unsigned)__builtin_clz(x->sl_bitmap[fl]);
  for (const ca__block *b = x->bins[fl][sl]; b; b = b->link_next)
    largest = b->size > largest ? b->size : largest;
  return largest;
}

/* Whether b belongs to the free run a parked block merges into: parked
 * itself, or free and shared (parked blocks are shared: ca__mergeable). */
static bool ca__in_parked_run(const ca__block *b) {
  return b && (b->state == CA__QUICK || (b->state == CA__FREE && !b->owner));
}

/* The bytes of parked block b's run, counted once: from its first parked
 * block (0 from the others). The way back is short: two free shared
 * neighbours would have merged, so parked blocks of a run lie at most one
 * free block apart. */
static uint64_t ca__parked_run(const ca__block *b) {
  const ca__block *first = b;
  while (ca__in_parked_run(first->prev)) {
    first = first->prev;
    if (first->state == CA__QUICK)
      return 0;
  }
  uint64_t run = 0;
  for (const ca__block *x = first; ca__in_parked_run(x); x = x->next)
    run += x->size;
  return run;
}

/* The largest block heap h's parked blocks would make merged with their
 * free neighbours, or `largest` if that is larger: what a flush of the
 * quick lists would put in the bins, found without moving a block. */
static uint64_t ca__parked_largest(const ca__heap *h, uint64_t largest) {
  for (uint64_t fls = h->quick_fl_bitmap; fls; fls &= fls - 1) {
    unsigned fl = (unsigned)__builtin_ctzll(fls);
    for (uint32_t sls = h->quick_sl_bitmap[fl]; sls; sls &= sls - 1)
      for (const ca__block *b = h->quick[fl][__builtin_ctz(sls)]; b;
           b = b->link_next) {
        uint64_t run = ca__parked_run(b);
        largest = run > largest ? run : largest;
      }
  }
  return largest;
}

/* The largest free block, shared or a stream's, parked ones as merged
 * (only small blocks park: ca__cache). */
static uint64_t ca__largest_free(const ca__arena *p) {
  uint64_t largest = ca__bins_largest(&p->small.free, 0);
  largest = ca__bins_largest(&p->large.free, largest);
  largest = ca__parked_largest(&p->small, largest);
  for (unsigned i = 0; i < p->nstreams; i++)
    for (unsigned j = 0; j < 2; j++)
      largest = ca__bins_largest(&p->streams[i]->bins[j], largest);
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

/* One arena's figures, under its lock. Reading them moves no block. */
static void ca__arena_stats(ca__arena *p, cudalloc_device_stats *out) {
  ca_lock_acquire(&p->lock);
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
  out->reserved_bytes.peak = atomic_load(&pool->reported_peak);
  out->fragmentation = ca_pool_fragmentation(out);
}

#define CA__PEAK_TO_CURRENT(field, row, bytes)                                 \
  p->stats.field.peak = p->stats.field.current;

void ca_pool_reset_peaks(ca_pool *pool) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n = ca__arenas(pool, all);
  for (unsigned i = 0; i < n; i++) {
    ca__arena *p = all[i];
    ca_lock_acquire(&p->lock);
    CA_STATS_TRIPLES(CA__PEAK_TO_CURRENT)
    ca_lock_release(&p->lock);
  }
  atomic_store(&pool->reported_peak, atomic_load(&pool->reserved));
}
#undef CA__PEAK_TO_CURRENT

double ca_pool_fragmentation(const cudalloc_device_stats *s) {
  return s->free_cached_bytes ? 1.0 - (double)s->largest_free_block /
                                          (double)s->free_cached_bytes
                              : 0.0;
}

/* walk(arena, arg) for each of the pool's arenas, under its lock: the
 * blocks the walks visited. */
static size_t ca__each_arena(ca_pool *pool,
                             size_t (*walk)(ca__arena *p, void *arg),
                             void *arg) {
  ca__arena *all[CA_POOL_ARENAS];
  unsigned n_arenas = ca__arenas(pool, all);
  size_t n = 0;
  for (unsigned i = 0; i < n_arenas; i++) {
    ca_lock_acquire(&all[i]->lock);
    n += walk(all[i], arg);
    ca_lock_release(&all[i]->lock);
  }
  return n;
}

typedef struct ca__live_visit {
  void (*fn)(const ca_live_block *b, void *arg);
  void *arg;
} ca__live_visit;

static size_t ca__walk_live(ca__arena *p, void *arg) {
  const ca__live_visit *v = arg;
  size_t n = 0;
  uint64_t at = 0;
  for (ca__block *b; (b = ca__live_next(&p->live, &at));) {
    if (b->state != CA__LIVE) /* parked or pending, still listed */
      continue;
    n++;
    ca_live_block info;
    ca__describe(p, b, &info);
    v->fn(&info, v->arg);
  }
  return n;
}

size_t ca_pool_foreach_live(ca_pool *pool,
                            void (*fn)(const ca_live_block *b, void *arg),
                            void *arg) {
  ca__live_visit v = {fn, arg};
  return ca__each_arena(pool, ca__walk_live, &v);
}

static ca_pool_block_state ca__view_state(const ca__block *b) {
  switch (b->state) {
  case CA__LIVE:
    return CA_POOL_BLOCK_LIVE;
  case CA__HELD:
    return CA_POOL_BLOCK_PENDING;
  case CA__UNMAPPED:
    return CA_POOL_BLOCK_UNMAPPED;
  default: /* free, in a quick list, or kept out of use */
    return CA_POOL_BLOCK_FREE;
  }
}

typedef struct ca__block_visit {
  void (*fn)(const ca_pool_block_view *v, void *arg);
  void *arg;
} ca__block_visit;

static size_t ca__walk_blocks(ca__arena *p, void *arg) {
  const ca__block_visit *visit = arg;
  size_t n = 0;
  for (const ca__segment *s = p->segments; s; s = s->next)
    for (const ca__block *b = s->first; b; b = b->next, n++) {
      ca_pool_block_view v = {.seg_addr = s->addr, .seg_size = s->size,
                              .expandable = s->expandable, .device = p->device,
                              .addr = b->addr, .size = b->size,
                              .state = ca__view_state(b)};
      if (v.state == CA_POOL_BLOCK_LIVE) {
        v.requested = b->requested;
        v.tag = b->tag;
      }
      visit->fn(&v, visit->arg);
    }
  return n;
}

size_t ca_pool_foreach_block(ca_pool *pool,
                             void (*fn)(const ca_pool_block_view *v, void *arg),
                             void *arg) {
  ca__block_visit v = {fn, arg};
  return ca__each_arena(pool, ca__walk_blocks, &v);
}
