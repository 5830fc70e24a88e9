/*
 * Lanes: stream-ordered reuse for callers that name the stream of each
 * allocation and free (ca_pool_alloc_on, ca_pool_free_on: a framework's
 * allocator slot). A block freed on stream S waits in S's lane, where the
 * next request on S takes it at once: work queued on S after the request
 * runs after the work queued before the free, so no marker is needed.
 * Requests on other streams get it only after the lane is closed, under a
 * marker recorded on S alone, and that marker has passed: the lane's
 * blocks then join the ordinary pending batches. No fence is ever made for
 * them. Lanes close when they fill up, when a request on another stream
 * misses, and whenever the pool gives memory back.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Lanes ---------------------------------------------------------------- */

/* Gives lane l's blocks a marker recorded on its stream and moves them to
 * the closed batches, oldest last. Returns false, changing nothing, when
 * the lane is empty or no marker may be made now (the stream is
 * capturing): the blocks then stay reusable on their stream only. */
static bool ca__lane_close(ca__arena *p, ca__lane *l) {
  const ca_backend *be = p->backend;
  uint64_t marker = 0;
  if (!l->head || !be->mark)
    return false;
  ca__batch *batch = ca__slab_get(&p->batch_slab);
  if (!batch)
    return false;
  int rc = be->mark_on ? be->mark_on(be->ctx, p->device, l->stream, &marker)
                       : be->mark(be->ctx, p->device, &marker);
  if (rc != 0) {
    ca__slab_put(&p->batch_slab, batch);
    return false;
  }
  for (ca__block *b = l->head; b; b = b->link_next)
    b->state = CA__HELD;
  *batch = (ca__batch){.marker = marker, .head = l->head, .tail = l->tail,
                       .bytes = l->bytes};
  if (p->batch_tail)
    p->batch_tail->next = batch;
  else
    p->batch_head = batch;
  p->batch_tail = batch;
  l->head = l->tail = NULL;
  l->n = 0;
  l->bytes = 0;
  return true;
}

static void ca__lanes_close(ca__arena *p) {
  for (unsigned i = 0; i < CA__LANES; i++)
    ca__lane_close(p, &p->lanes[i]);
}

/* The lane of `stream`; with `make`, one is given to it if it has none:
 * an empty one, else the one its number picks, closed first (its blocks
 * are then on their way to every stream). NULL when it has none and may
 * not get one now. */
static ca__lane *ca__lane_of(ca__arena *p, uint64_t stream, bool make) {
  ca__lane *empty = NULL;
  for (unsigned i = 0; i < CA__LANES; i++) {
    ca__lane *l = &p->lanes[i];
    if (l->stream == stream)
      return l;
    if (!l->head && !empty)
      empty = l;
  }
  if (!make)
    return NULL;
  ca__lane *l = empty ? empty
                      : &p->lanes[ca__hash_addr(stream) % CA__LANES];
  if (l->head && !ca__lane_close(p, l))
    return NULL;
  l->stream = stream;
  return l;
}

/* Puts a block freed on l's stream at the head of its lane. */
static void ca__lane_push(ca__arena *p, ca__lane *l, ca__block *b) {
  b->state = CA__LANE;
  b->link_prev = NULL;
  b->link_next = l->head;
  if (l->head)
    l->head->link_prev = b;
  else
    l->tail = b;
  l->head = b;
  l->n++;
  l->bytes += b->size;
  p->held_bytes += b->size;
  if (l->n > CA__LANE_MAX)
    ca__lane_close(p, l);
}

/* The tightest block of lane l that serves `size` bytes wasting at most an
 * eighth of them (never one that must not come back), out of the lane; or
 * NULL. Lane blocks are taken whole: they are the stream's recent frees,
 * which a loop asks for again at the same sizes. */
static ca__block *ca__lane_take(ca__arena *p, ca__lane *l, uint64_t size) {
  ca__block *best = NULL;
  for (ca__block *b = l->head; b; b = b->link_next)
    if (b->size >= size && b->size - size <= size / 8 && !b->keep_out &&
        (!best || b->size < best->size))
      best = b;
  if (!best)
    return NULL;
  if (best->link_prev)
    best->link_prev->link_next = best->link_next;
  else
    l->head = best->link_next;
  if (best->link_next)
    best->link_next->link_prev = best->link_prev;
  else
    l->tail = best->link_prev;
  best->link_prev = best->link_next = NULL;
  l->n--;
  l->bytes -= best->size;
  p->held_bytes -= best->size;
  return best;
}
