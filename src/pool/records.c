/*
 * Records and slabs: small helpers, the statistics' arithmetic, and the
 * slabs every block, segment and batch record comes from (so serving a
 * request never calls malloc; their memory is the library's own, meta.h).
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Small helpers ------------------------------------------------------ */

static inline uint64_t ca__round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

static uint64_t ca__clock_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
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
    char *chunk = ca_meta_alloc(CA__SLAB_CHUNK);
    if (!chunk)
      return NULL;
    *(void **)chunk = s->chunks;
    s->chunks = chunk;
    char *objs = chunk + sizeof(void *);
    size_t n = (CA__SLAB_CHUNK - sizeof(void *)) / s->obj_size;
    for (size_t i = 0; i < n; i++) {
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
    ca_meta_free(s->chunks, CA__SLAB_CHUNK);
    s->chunks = next;
  }
  s->free = NULL;
}
