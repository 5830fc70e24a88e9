/*
 * The consistency check (ca_pool_check), for the tests.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
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
  const ca__bins *x = ca__bins_of(b);
  const ca__block *it;
  if (ca__is_oversize(b->seg->heap, b->size)) {
    it = x->oversize;
  } else {
    unsigned fl, sl;
    ca__class_of(b->size, &fl, &sl);
    it = x->bins[fl][sl];
  }
  for (; it; it = it->link_next)
    if (it == b)
      return true;
  return false;
}

/* The blocks of one index; their bytes added to *bytes. */
static size_t ca__count_index(const ca__bins *x, uint64_t *bytes) {
  size_t n = 0;
  for (const ca__block *b = x->oversize; b; b = b->link_next, n++)
    *bytes += b->size;
  for (unsigned fl = 0; fl < CA__FL_COUNT; fl++)
    for (unsigned sl = 0; sl < CA__SL_COUNT; sl++)
      for (const ca__block *b = x->bins[fl][sl]; b; b = b->link_next, n++)
        *bytes += b->size;
  return n;
}

/* The blocks of every index, shared and streams'; false when a stream's
 * count of its bytes disagrees with its blocks. */
static bool ca__count_indexes(const ca__arena *p, size_t *n) {
  uint64_t bytes = 0;
  *n = ca__count_index(&p->small.free, &bytes) +
       ca__count_index(&p->large.free, &bytes);
  for (unsigned i = 0; i < p->nstreams; i++) {
    const ca__sfree *s = p->streams[i];
    bytes = 0;
    *n += ca__count_index(&s->bins[0], &bytes) +
          ca__count_index(&s->bins[1], &bytes);
    if (bytes != s->bytes)
      return false;
  }
  return true;
}

static bool ca__check_locked(ca__arena *p, char *why, size_t why_len) {
  uint64_t reserved = 0, live = 0, free_bytes = 0, held = 0, quick = 0;
  uint64_t gone = 0, heads = 0;
  size_t nfree = 0, nlive = 0, nlisted = 0, nseg = 0, nlost = 0, nexp = 0;
  for (ca__segment *s = p->segments; s; s = s->next, nseg++) {
    uint64_t at = s->addr + s->head, unmapped = 0;
    CA__CHECK(s->first && !s->first->prev, "segment %#llx: bad first block",
              (unsigned long long)s->addr);
    for (ca__block *b = s->first; b; b = b->next) {
      CA__CHECK(b->addr == at && b->seg == s && b->size > 0,
                "block %#llx does not follow its neighbour",
                (unsigned long long)b->addr);
      CA__CHECK(!b->next || b->next->prev == b, "broken neighbour links");
      CA__CHECK(b->state != CA__FREE || !b->next ||
                    b->next->state != CA__FREE || b->next->owner != b->owner,
                "two free neighbours at %#llx were not merged",
                (unsigned long long)b->addr);
      CA__CHECK(b->state == CA__FREE || !b->owner,
                "block %#llx not free but a stream's",
                (unsigned long long)b->addr);
      if (b->state == CA__FREE) {
        CA__CHECK(ca__in_index(b), "free block %#llx not indexed",
                  (unsigned long long)b->addr);
        CA__CHECK(!s->chunks || ca__where_block(p, s, b->addr) == NULL,
                  "free block %#llx found by the address index",
                  (unsigned long long)b->addr);
        free_bytes += b->size;
        nfree++;
      } else if (b->state == CA__LIVE) {
        CA__CHECK(ca__live_find(p, b->addr) == b, "live block %#llx unknown",
                  (unsigned long long)b->addr);
        CA__CHECK(!s->chunks ||
                      (ca__where_block(p, s, b->addr) == b &&
                       ca__where_block(p, s, b->addr + b->size - 1) == b),
                  "live block %#llx not found by the address index",
                  (unsigned long long)b->addr);
        live += b->size;
        nlive++;
      } else if (b->state == CA__QUICK || b->state == CA__HELD) {
        const char *what = b->state == CA__QUICK ? "quick" : "pending";
        const ca__live_slot *slot = ca__live_slot_of(&p->live, b->addr);
        CA__CHECK(b->listed ? slot && slot->block == b && slot->requested == 0
                            : !slot || slot->block != b,
                  "%s block %#llx %s the live table", what,
                  (unsigned long long)b->addr,
                  b->listed ? "listed but not in" : "not listed but in");
        CA__CHECK(!s->chunks || ca__where_block(p, s, b->addr) == NULL,
                  "%s block %#llx found by the address index", what,
                  (unsigned long long)b->addr);
        nlisted += b->listed;
        if (b->state == CA__QUICK)
          quick += b->size;
        else
          held += b->size;
      } else if (b->state == CA__UNMAPPED) {
        CA__CHECK(s->expandable && b->addr % ca__page_size(p) == 0 &&
                      b->size % ca__page_size(p) == 0 &&
                      b->addr >= s->addr + ca__page_size(p),
                  "unmapped block %#llx is not whole pages of an expandable "
                  "segment past its first",
                  (unsigned long long)b->addr);
        CA__CHECK(!b->next || b->next->state != CA__UNMAPPED,
                  "two unmapped neighbours at %#llx were not merged",
                  (unsigned long long)b->addr);
        unmapped += b->size;
      } else {
        CA__CHECK(b->state == CA__GONE, "block %#llx in no known state",
                  (unsigned long long)b->addr);
        gone += b->size;
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
    CA__CHECK(!s->expandable || s->mapped + unmapped == s->size,
              "segment %#llx maps %llu bytes, its blocks say %llu",
              (unsigned long long)s->addr, (unsigned long long)s->mapped,
              (unsigned long long)(s->size - unmapped));
    nlost += s->lost;
    nexp += s->expandable;
    reserved += ca__segment_bytes(s);
    heads += s->head;
  }
  CA__CHECK(p->nsegs + nlost == nseg, "address index holds %zu of %zu",
            p->nsegs, nseg - nlost);
  for (size_t i = 1; i < p->nsegs; i++)
    CA__CHECK(p->by_addr[i - 1]->addr + p->by_addr[i - 1]->size <=
                  p->by_addr[i]->addr,
              "address index out of order at %zu", i);
  size_t indexed = 0;
  CA__CHECK(ca__count_indexes(p, &indexed), "a stream's bytes disagree");
  CA__CHECK(nfree == indexed, "index holds blocks that are not free");
  CA__CHECK(nlive + nlisted == p->live.count, "live table size %llu != %zu",
            (unsigned long long)p->live.count, nlive + nlisted);
  CA__CHECK(held == p->held_bytes, "held bytes disagree");
  CA__CHECK(quick == p->quick_bytes, "parked bytes disagree");
  CA__CHECK(reserved == p->stats.reserved_bytes.current,
            "reserved %llu != stats %llu", (unsigned long long)reserved,
            (unsigned long long)p->stats.reserved_bytes.current);
  CA__CHECK(live == p->stats.allocated_bytes.current,
            "allocated %llu != stats %llu", (unsigned long long)live,
            (unsigned long long)p->stats.allocated_bytes.current);
  CA__CHECK(gone == p->gone_bytes, "gone bytes disagree");
  CA__CHECK(reserved == live + free_bytes + held + quick + gone + heads,
            "reserved != live + cached + held + gone + heads");
  CA__CHECK(nlive == p->stats.blocks.current, "block count disagrees");
  CA__CHECK(nseg == p->stats.segments.current, "segment count disagrees");
  CA__CHECK(nexp == p->nexpandable, "expandable segment count disagrees");
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
