/*
 * Stale bytes: where a free block may hold something else than
 * fresh_byte, under memcheck (ca_pool_stale, pool.h). Each block keeps up
 * to CA__STALE_MAX ranges, in address order, apart; a merged block takes
 * its parts' ranges, a split block its share, and a block past the bound
 * joins its two closest ranges (taking in bytes that hold fresh_byte: a
 * red zone there is set once more than needed, never once less). One
 * range each was too few: a freed block that merged with its stale
 * neighbours spanned its own red zone, which was then set at every
 * allocation of the block. A block handed out with its red zone on stale
 * bytes has it set there and then (ca__hand_out_stale); memcheck says what
 * each free left (ca_pool_stale, bytes.c).
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Stale bytes ---------------------------------------------------------- */

/* Bytes [lo, hi) of b become stale too. */
static void ca__stale_add(ca__block *b, uint64_t lo, uint64_t hi) {
  if (lo >= hi)
    return;
  ca__range v[CA__STALE_MAX + 1];
  unsigned n = 0, i = 0;
  for (; i < b->nstale && b->stale[i].hi < lo; i++) /* wholly before it */
    v[n++] = b->stale[i];
  for (; i < b->nstale && b->stale[i].lo <= hi; i++) { /* touching: joined */
    lo = b->stale[i].lo < lo ? b->stale[i].lo : lo;
    hi = b->stale[i].hi > hi ? b->stale[i].hi : hi;
  }
  v[n++] = (ca__range){lo, hi};
  for (; i < b->nstale; i++) /* wholly after it */
    v[n++] = b->stale[i];
  if (n > CA__STALE_MAX) { /* the two closest join */
    unsigned k = 0;
    for (unsigned m = 1; m + 1 < n; m++)
      if (v[m + 1].lo - v[m].hi < v[k + 1].lo - v[k].hi)
        k = m;
    v[k].hi = v[k + 1].hi;
    memmove(&v[k + 1], &v[k + 2], (n - k - 2) * sizeof(v[0]));
    n--;
  }
  memcpy(b->stale, v, n * sizeof(v[0]));
  b->nstale = (uint8_t)n;
}

/* A split block's share of the stale bytes: those inside it. */
static void ca__stale_clip(ca__block *b) {
  uint64_t lo = b->addr, hi = b->addr + b->size;
  unsigned n = 0;
  for (unsigned i = 0; i < b->nstale; i++) {
    ca__range r = b->stale[i];
    r.lo = r.lo < lo ? lo : r.lo;
    r.hi = r.hi > hi ? hi : r.hi;
    if (r.lo < r.hi)
      b->stale[n++] = r;
  }
  b->nstale = (uint8_t)n;
}

/* n's stale bytes join b's (n merging into b). */
static void ca__stale_join(ca__block *b, const ca__block *n) {
  for (unsigned i = 0; i < n->nstale; i++)
    ca__stale_add(b, n->stale[i].lo, n->stale[i].hi);
}

/* Whether any of [lo, hi) is stale in b. */
static bool ca__stale_meets(const ca__block *b, uint64_t lo, uint64_t hi) {
  for (unsigned i = 0; i < b->nstale; i++)
    if (b->stale[i].lo < hi && lo < b->stale[i].hi)
      return true;
  return false;
}

/* Block b, with stale bytes or a red zone left unset, handed out for
 * `size` bytes on *stream (NULL: plain): where the bytes past the request
 * (its red zone and its rounding) lie on stale ones (ca_pool_stale), they
 * are set to fresh_byte on the request's stream, or the block says they
 * could not be (ca_live_block.red_zone_unset). Under the arena's lock: a
 * rare call, under memcheck only. */
static CA__COLD void ca__hand_out_stale(ca__arena *p, ca__block *b,
                                        uint64_t size, const uint64_t *stream) {
  b->red_zone_unset = false;
  if (!ca__stale_meets(b, b->addr + size, b->addr + b->size))
    return;
  const ca_backend *be = p->backend;
  b->red_zone_unset = be->fill(be->ctx, p->device, b->addr + size,
                               b->size - size, 1, 0, p->opt.fresh_byte,
                               stream) != 0;
}
