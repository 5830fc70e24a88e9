/*
 * Streams' free blocks: stream-ordered reuse for callers that name the
 * stream of each allocation and free (ca_pool_alloc_on, ca_pool_free_on: a
 * framework's allocator slot), inside the pool's own free structures.
 *
 * A block freed on stream S stays FREE, in an index of S's own (its
 * `owner`), merged at once with its neighbours of S and with shared ones.
 * A request on S takes the best fit among S's blocks, then among the
 * shared ones, with no marker: work queued on S after the request runs
 * after the work queued before the free. A request on another stream gets
 * S's blocks only once they are shared: behind a marker recorded on S
 * alone that has passed (they wait in the pending batches meanwhile), or
 * at once after a fence. Before the pool grows, a miss shares every other
 * stream's blocks, oldest first. A stream that is capturing gets no
 * marker: its blocks stay its own until the capture ends.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Streams' free blocks ------------------------------------------------- */

/* Some block of s's indexes, or NULL when it has none. */
static ca__block *ca__sfree_any(ca__sfree *s) {
  for (unsigned i = 0; i < 2; i++) {
    ca__bins *x = &s->bins[i];
    if (x->oversize)
      return x->oversize;
    if (x->fl_bitmap) {
      unsigned fl = (unsigned)__builtin_ctzll(x->fl_bitmap);
      return x->bins[fl][__builtin_ctz(x->sl_bitmap[fl])];
    }
  }
  return NULL;
}

/* Takes some block out of s, shared from now on (not indexed); NULL when
 * s is empty. */
static ca__block *ca__sfree_pop(ca__sfree *s) {
  ca__block *b = ca__sfree_any(s);
  if (b) {
    ca__index_remove(b);
    b->owner = NULL;
  }
  return b;
}

/* pending.c's, which comes after: a batch under a marker, and queueing it. */
static ca__batch *ca__batch_marked(ca__arena *p, const uint64_t *stream);
static void ca__batch_queue(ca__arena *p, ca__batch *batch);

/* Shares s's blocks behind a marker recorded on its stream: they join the
 * pending batches, which come back to the cache as the marker passes.
 * Returns false, changing nothing, when no marker may be made now (the
 * stream is capturing) or the host is out of memory; true when s is
 * empty then. */
static bool ca__sfree_close(ca__arena *p, ca__sfree *s) {
  if (!s->bytes)
    return true;
  ca__batch *batch = ca__batch_marked(p, &s->stream);
  if (!batch)
    return false;
  batch->bytes = s->bytes;
  for (ca__block *b; (b = ca__sfree_pop(s));) {
    ca__lru_remove(p, b->seg);
    b->state = CA__HELD;
    b->link_next = batch->head;
    batch->head = b;
    if (!batch->tail)
      batch->tail = b;
  }
  p->held_bytes += batch->bytes;
  ca__batch_queue(p, batch);
  return true;
}

/* Whether any stream holds free blocks not yet shared. */
static bool ca__sfree_held(const ca__arena *p) {
  for (unsigned i = 0; i < p->nstreams; i++)
    if (p->streams[i]->bytes)
      return true;
  return false;
}

/* Shares every stream's blocks at once: a fence just ordered all later
 * work after the work queued before it, on every stream (or the device
 * was waited for). A block keeps how long it has been free, which trading
 * idle pages weighs. */
static void ca__sfree_share_all(ca__arena *p) {
  for (unsigned i = 0; i < p->nstreams; i++)
    for (ca__block *b; (b = ca__sfree_pop(p->streams[i]));) {
      uint64_t freed_at = b->freed_at;
      ca__block *m = ca__block_make_free(p, b);
      m->freed_at = freed_at < m->freed_at ? freed_at : m->freed_at;
    }
}

/* The stream, not `except` nor one in `tried` (a mask of p->streams),
 * whose blocks not yet shared were freed longest ago; its place in *at.
 * NULL when none holds any. */
static ca__sfree *ca__sfree_oldest(ca__arena *p, const ca__sfree *except,
                                   unsigned tried, unsigned *at) {
  ca__sfree *oldest = NULL;
  for (unsigned i = 0; i < p->nstreams; i++) {
    ca__sfree *s = p->streams[i];
    if (s != except && s->bytes && !(tried >> i & 1u) &&
        (!oldest || s->used < oldest->used)) {
      oldest = s;
      *at = i;
    }
  }
  return oldest;
}

/* Shares the blocks of every stream but the one being served, oldest
 * first, each behind a marker on its own stream. Returns whether any
 * were. */
static bool ca__sfree_close_others(ca__arena *p) {
  unsigned tried = 0, at = 0;
  bool any = false;
  for (ca__sfree *s; (s = ca__sfree_oldest(p, p->want, tried, &at));) {
    tried |= 1u << at;
    any |= ca__sfree_close(p, s);
  }
  return any;
}

/* The free blocks of `stream`, or NULL when it has none yet. With `make`,
 * a stream that has none gets an empty index: a new one, or one whose
 * stream holds no block now, or, with all CA__STREAMS holding blocks, the
 * index of the stream that freed longest ago, its blocks shared first;
 * NULL when none may be had now. */
static ca__sfree *ca__sfree_of(ca__arena *p, uint64_t stream, bool make) {
  ca__sfree *spare = NULL;
  for (unsigned i = 0; i < p->nstreams; i++) {
    ca__sfree *s = p->streams[i];
    if (s->stream == stream)
      return s;
    if (!s->bytes && (!spare || s->used < spare->used))
      spare = s;
  }
  if (!make)
    return NULL;
  if (!spare && p->nstreams < CA__STREAMS &&
      (spare = ca_meta_alloc(sizeof(*spare))) != NULL)
    p->streams[p->nstreams++] = spare;
  unsigned tried = 0, at = 0;
  for (ca__sfree *s; !spare && (s = ca__sfree_oldest(p, NULL, tried, &at));) {
    tried |= 1u << at;
    if (ca__sfree_close(p, s))
      spare = s;
  }
  if (spare)
    spare->stream = stream;
  return spare;
}

/* Serves the request being made on `stream` (NULL: none named) from its
 * stream's blocks first (ca__find). Set at every request, and again
 * whenever the arena's lock was let go meanwhile (another request may have
 * set it, or given the index to another stream). */
static inline void ca__want(ca__arena *p, const uint64_t *stream) {
  p->want_named = stream != NULL;
  p->want_stream = stream ? *stream : 0;
  p->want = stream ? ca__sfree_of(p, *stream, false) : NULL;
}

/* What ca__want was told, for setting it again after the lock was let go. */
static inline const uint64_t *ca__wanted(const ca__arena *p, uint64_t *keep) {
  *keep = p->want_stream;
  return p->want_named ? keep : NULL;
}
