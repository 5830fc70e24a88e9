/*
 * Blocks: merging freed blocks with their free neighbours, and splitting
 * a free block for a request.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Blocks --------------------------------------------------------------- */

static void ca__block_merge_next(ca__arena *p, ca__block *b) {
  ca__block *n = b->next;
  if (__builtin_expect(n->nstale, 0))
    ca__stale_join(b, n);
  b->size += n->size;
  b->next = n->next;
  if (n->next)
    n->next->prev = b;
  ca__slab_put(&p->block_slab, n);
}

/* Links block n into b's segment, right after b. */
static void ca__block_link_after(ca__block *b, ca__block *n) {
  n->prev = b;
  n->next = b->next;
  if (b->next)
    b->next->prev = n;
  b->next = n;
}

/* Whether block b, being freed, merges with its neighbour n: n is free and
 * of b's stream, or shared while b is a stream's. A shared block's bytes
 * are safe for any stream, so the stream's block takes them in: a
 * stream's freed block and the rest of its segment form the larger blocks
 * its requests need, as on one stream they would. A shared block never
 * takes in a stream's, which would hand that stream's bytes to others. */
static inline bool ca__mergeable(const ca__block *b, const ca__block *n) {
  return n && n->state == CA__FREE &&
         (n->owner == b->owner || (b->owner && !n->owner));
}

/* Returns a block to the free index of its owner (b->owner), merged with
 * the free neighbours it may take in; returns the merged block. A stream's
 * block that takes in a shared neighbour may meet another block of its
 * stream behind it, which a shared block between them kept apart: hence
 * the loops. */
static ca__block *ca__block_make_free(ca__arena *p, ca__block *b) {
  while (ca__mergeable(b, b->next)) {
    ca__index_remove(b->next);
    ca__block_merge_next(p, b);
  }
  while (ca__mergeable(b, b->prev)) {
    ca__block *prev = b->prev;
    ca__index_remove(prev);
    ca__block_merge_next(p, prev);
    prev->owner = b->owner;
    b = prev;
  }
  b->state = CA__FREE;
  b->freed_at = p->free_tick;
  ca__index_insert(b);
  if (ca__segment_is_free(b->seg))
    ca__lru_push(p, b->seg);
  return b;
}

/* A large block keeps a remainder of up to 1 MiB rather than leave a
 * piece no large request could use; in an expandable heap a piece that
 * can serve one is split off, since keeping it would cost a page that
 * cannot be given back (1 MiB requests took 2 MiB each on the H200). */
static int ca__worth_splitting(const ca__arena *p, const ca__heap *h,
                               uint64_t rest) {
  if (h->expandable)
    return rest > ca__small_max(p);
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
  if (!oversize && ca__worth_splitting(p, h, rest))
    r = ca__slab_get(&p->block_slab);
  if (r) {
    r->addr = b->addr + size;
    r->size = rest;
    r->seg = b->seg;
    r->state = CA__FREE;
    r->keep_out = r->listed = false; /* slab records come uninitialized */
    r->freed_at = b->freed_at;
    r->owner = b->owner;
    r->nstale = b->nstale;
    ca__block_link_after(b, r);
    b->size = size;
    if (__builtin_expect(b->nstale, 0)) { /* under memcheck only */
      memcpy(r->stale, b->stale, sizeof(r->stale));
      ca__stale_clip(r);
      ca__stale_clip(b);
    }
    ca__index_insert(r);
  }
  b->state = CA__LIVE;
  b->owner = NULL;
}

/* Takes a cached block for a request of `size` bytes: a parked one (of
 * that very size, from its quick list) as it is, a free one out of its
 * bins, split. */
static void ca__take_cached(ca__arena *p, ca__block *b, uint64_t size) {
  if (b->state == CA__QUICK)
    b->state = CA__LIVE;
  else
    ca__block_take(p, b, size);
}

/* A freed block that any stream may reuse now: small ones park in the
 * quick lists (still listed if they were), large ones merge with their
 * free neighbours at once. */
static inline __attribute__((always_inline)) void
ca__cache(ca__arena *p, ca__block *b) {
  b->owner = NULL;
  if (__builtin_expect(b->keep_out, 0))
    ca__retire_gone(p, b);
  else if (b->seg->heap->large)
    ca__block_make_free(p, b);
  else
    ca__quick_push(p, b);
}
