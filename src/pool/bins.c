/*
 * Size classes, the free-block indexes (TLSF) and the quick lists.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
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

/* The index a free block sits in: its stream's, or its heap's shared one. */
static inline ca__bins *ca__bins_of(const ca__block *b) {
  return b->owner ? &b->owner->bins[b->seg->heap->large] : &b->seg->heap->free;
}

static void ca__index_insert(ca__block *b) {
  ca__heap *h = b->seg->heap;
  ca__bins *x = ca__bins_of(b);
  if (b->owner)
    b->owner->bytes += b->size;
  if (ca__is_oversize(h, b->size)) {
    ca__block **at = &x->oversize, *prev = NULL;
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
  ca__block **head = &x->bins[fl][sl];
  b->link_prev = NULL;
  b->link_next = *head;
  if (*head)
    (*head)->link_prev = b;
  *head = b;
  x->sl_bitmap[fl] |= 1u << sl;
  x->fl_bitmap |= 1ull << fl;
}

static void ca__index_remove(ca__block *b) {
  ca__heap *h = b->seg->heap;
  ca__bins *x = ca__bins_of(b);
  if (b->owner)
    b->owner->bytes -= b->size;
  if (ca__is_oversize(h, b->size)) {
    ca__link_remove(&x->oversize, b);
    return;
  }
  unsigned fl = b->fl, sl = b->sl;
  ca__link_remove(&x->bins[fl][sl], b);
  if (!x->bins[fl][sl]) {
    x->sl_bitmap[fl] &= ~(1u << sl);
    if (!x->sl_bitmap[fl])
      x->fl_bitmap &= ~(1ull << fl);
  }
}

/* The first block of the first non-empty class at or above (fl, sl). */
static ca__block *ca__first_from(ca__bins *x, unsigned fl, unsigned sl) {
  uint32_t slmap = x->sl_bitmap[fl] & (~0u << sl);
  if (!slmap) {
    uint64_t flmap = fl + 1 < 64 ? x->fl_bitmap & (~0ull << (fl + 1)) : 0;
    if (!flmap)
      return NULL;
    fl = (unsigned)__builtin_ctzll(flmap);
    slmap = x->sl_bitmap[fl];
  }
  return x->bins[fl][__builtin_ctz(slmap)];
}

/* A good fit among blocks below max_split_size: the tightest of the first few
 * blocks in the request's own class, else any block of the next class that
 * is guaranteed to fit. */
static ca__block *ca__find_binned(ca__bins *x, uint64_t size) {
  unsigned fl, sl;
  uint64_t ceiling = ca__class_ceiling(size);
  if (ceiling != size) {
    ca__class_of(size, &fl, &sl);
    ca__block *best = NULL;
    ca__block *b = x->bins[fl][sl];
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
  return ca__first_from(x, fl, sl);
}

/* Oversize blocks serve only requests at or above max_split_size, and only
 * when they waste less than CA_OVERSIZE_MAX_WASTE. */
static ca__block *ca__find_oversize(ca__bins *x, uint64_t size) {
  for (ca__block *b = x->oversize; b; b = b->link_next) {
    if (b->size >= size)
      return b->size - size < CA_OVERSIZE_MAX_WASTE ? b : NULL;
  }
  return NULL;
}

/* The most a request served from the small heap may ask: two fill a small
 * segment but for its head, as they did without one. */
static uint64_t ca__small_max(const ca__arena *p) {
  return CA_SMALL_REQUEST - p->opt.segment_head;
}

static ca__heap *ca__heap_for(ca__arena *p, uint64_t size) {
  return size <= ca__small_max(p) ? &p->small : &p->large;
}

static ca__block *ca__find_among(const ca__heap *h, ca__bins *x, uint64_t size) {
  return ca__is_oversize(h, size) ? ca__find_oversize(x, size)
                                  : ca__find_binned(x, size);
}

/* A free block for `size` bytes that the request being served may take at
 * once: its stream's own first (p->want), else a shared one. */
static ca__block *ca__find(ca__arena *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  ca__block *b = p->want ? ca__find_among(h, &p->want->bins[h->large], size)
                         : NULL;
  return b ? b : ca__find_among(h, &h->free, size);
}

/* ---- Quick lists ---------------------------------------------------------- */

/* Parks a freed block, unmerged, where a request of its exact size finds it
 * first (still in the live table and the address index if b->listed). */
static inline __attribute__((always_inline)) void
ca__quick_push(ca__arena *p, ca__block *b) {
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

static inline __attribute__((always_inline)) ca__block *
ca__quick_pop(ca__arena *p, ca__heap *h, unsigned fl, unsigned sl) {
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
static inline __attribute__((always_inline)) ca__block *
ca__quick_take(ca__arena *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  unsigned fl, sl;
  ca__class_of(size, &fl, &sl);
  ca__block *b = h->quick[fl][sl];
  if (!b || b->size != size)
    return NULL;
  return ca__quick_pop(p, h, fl, sl);
}

static ca__block *ca__block_make_free(ca__arena *p, ca__block *b);

/* Merges the parked blocks of heap h into its bins. */
static void ca__heap_flush(ca__arena *p, ca__heap *h) {
  while (h->quick_fl_bitmap) {
    unsigned fl = (unsigned)__builtin_ctzll(h->quick_fl_bitmap);
    unsigned sl = (unsigned)__builtin_ctz(h->quick_sl_bitmap[fl]);
    ca__block *b = ca__quick_pop(p, h, fl, sl);
    if (b->listed)
      ca__delist(p, b);
    ca__block_make_free(p, b);
  }
}

/* Merges every parked block into the bins. */
static void ca__quick_flush(ca__arena *p) {
  ca__heap_flush(p, &p->small);
  ca__heap_flush(p, &p->large);
}
