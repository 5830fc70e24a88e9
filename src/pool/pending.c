/*
 * Frees waiting for the device: the open batch, closed batches and their
 * markers, waiting, fences.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Frees waiting for the device ---------------------------------------- */

/* Puts a freed block in the open batch (CA__HELD until its marker passes). */
static void ca__hold(ca__arena *p, ca__block *b) {
  b->state = CA__HELD;
  b->link_next = NULL;
  b->link_prev = p->held_tail;
  if (p->held_tail)
    p->held_tail->link_next = b;
  else
    p->held_head = b;
  p->held_tail = b;
  p->open_bytes += b->size;
  p->held_bytes += b->size;
}

/* Hands a list of pending blocks (linked by link_next) back to the cache. */
static void ca__cache_list(ca__arena *p, ca__block *head) {
  for (ca__block *b = head, *next; b; b = next) {
    next = b->link_next;
    b->link_prev = b->link_next = NULL;
    ca__cache(p, b);
  }
}

/* Hands the blocks of a passed batch back to the cache. */
static void ca__release_batch(ca__arena *p, ca__batch *batch) {
  ca__cache_list(p, batch->head);
  p->held_bytes -= batch->bytes;
  p->backend->forget(p->backend->ctx, p->device, batch->marker);
  ca__slab_put(&p->batch_slab, batch);
}

/* An empty batch under a new marker: recorded on *stream alone (the
 * backend's mark_on, where it has one), or after the work on every stream
 * (stream NULL). NULL, nothing made, when the host is out of memory or no
 * marker may be made now (a stream capture). */
static ca__batch *ca__batch_marked(ca__arena *p, const uint64_t *stream) {
  const ca_backend *be = p->backend;
  uint64_t marker = 0;
  ca__batch *batch = be->mark ? ca__slab_get(&p->batch_slab) : NULL;
  if (!batch)
    return NULL;
  int rc = stream && be->mark_on
               ? be->mark_on(be->ctx, p->device, *stream, &marker)
               : be->mark(be->ctx, p->device, &marker);
  if (rc != 0) {
    ca__slab_put(&p->batch_slab, batch);
    return NULL;
  }
  *batch = (ca__batch){.marker = marker};
  return batch;
}

/* Puts a filled batch behind the closed ones: they pass in the order made. */
static void ca__batch_queue(ca__arena *p, ca__batch *batch) {
  if (p->batch_tail)
    p->batch_tail->next = batch;
  else
    p->batch_head = batch;
  p->batch_tail = batch;
}

/* Closes the open batch under a new marker. Returns false, leaving the
 * batch open, when there is nothing to close or no marker may be made now
 * (a stream capture): the blocks then simply wait longer. */
static bool ca__close_batch(ca__arena *p) {
  ca__batch *batch = p->held_head ? ca__batch_marked(p, NULL) : NULL;
  if (!batch)
    return false;
  batch->head = p->held_head;
  batch->tail = p->held_tail;
  batch->bytes = p->open_bytes;
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  ca__batch_queue(p, batch);
  return true;
}

static void ca__pop_batch(ca__arena *p) {
  p->batch_head = p->batch_head->next;
  if (!p->batch_head)
    p->batch_tail = NULL;
}

/* Releases the closed batches whose markers have passed, oldest first,
 * without waiting. Returns true when blocks came back. */
static bool ca__reap(ca__arena *p) {
  bool any = false;
  while (p->batch_head &&
         p->backend->poll(p->backend->ctx, p->device,
                          p->batch_head->marker) == 0) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    ca__release_batch(p, batch);
    any = true;
  }
  return any;
}

/* Fences the device (see ca_backend.fence) and hands every pending block
 * back to the cache at once, and every stream's free blocks with them.
 * Returns false, changing nothing, when there is nothing pending or the
 * backend cannot fence now. */
static bool ca__fence_pending(ca__arena *p) {
  if (!p->backend->fence || (!p->held_head && !p->batch_head) ||
      p->backend->fence(p->backend->ctx, p->device) != 0)
    return false;
  ca__sfree_share_all(p);
  ca__cache_list(p, p->held_head);
  p->held_bytes -= p->open_bytes;
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  p->large_since_fence = 0;
  while (p->batch_head) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    ca__release_batch(p, batch);
  }
  return true;
}

/* On a miss: what has passed comes back; what was freed since the last
 * marker gets one, and so do the streams' free blocks, markers that have
 * often passed already (the program synchronized since). Returns true when
 * blocks came back. */
static bool ca__recover_pending(ca__arena *p) {
  bool any = ca__reap(p);
  if (ca__close_batch(p) | ca__sfree_close_others(p))
    any |= ca__reap(p);
  return any;
}

/* Waits for the oldest batch, the lock released meanwhile so that other
 * threads keep allocating. Returns true when blocks came back; false when
 * there was nothing to wait for, the wait was refused (a stream capture),
 * or drop_all forgot the batch while we waited. */
static bool ca__wait_oldest(ca__arena *p) {
  if (!p->batch_head && !ca__close_batch(p))
    return false;
  ca__batch *batch = p->batch_head;
  uint64_t generation = p->generation, stream;
  const uint64_t *want = ca__wanted(p, &stream);
  ca__pop_batch(p);
  ca_lock_release(&p->lock);
  int rc = p->backend->wait(p->backend->ctx, p->device, batch->marker);
  ca_lock_acquire(&p->lock);
  ca__want(p, want);
  if (generation != p->generation) {
    p->backend->forget(p->backend->ctx, p->device, batch->marker);
    ca__slab_put(&p->batch_slab, batch);
    return false;
  }
  if (rc != 0) { /* not now: back at the head, still the oldest */
    batch->next = p->batch_head;
    p->batch_head = batch;
    if (!p->batch_tail)
      p->batch_tail = batch;
    return false;
  }
  ca__release_batch(p, batch);
  return true;
}

/* The bytes a pending block can make once back: itself and the blocks
 * beside it in its segment that are free or pending too, with which it
 * merges at most; `want` or more (enough) as soon as they reach it, or
 * where they meet unmapped pages, which mapping can add. */
static uint64_t ca__pending_reach(const ca__block *b, uint64_t want) {
  uint64_t bytes = b->size;
  const ca__block *n = b->next;
  for (int side = 0; side < 2; side++, n = b->prev) {
    for (; n && bytes < want; n = side ? n->prev : n->next) {
      if (n->state == CA__UNMAPPED)
        return want;
      if (n->state != CA__FREE && n->state != CA__HELD && n->state != CA__QUICK)
        break;
      bytes += n->size;
    }
  }
  return bytes;
}

static bool ca__list_could_serve(const ca__heap *h, const ca__block *b,
                                 uint64_t size) {
  for (; b; b = b->link_next)
    if (b->seg->heap == h && ca__pending_reach(b, size) >= size)
      return true;
  return false;
}

/* Whether waiting for the pending blocks could serve a request of `size`
 * bytes from heap h: one of them makes that many once back. A wait that
 * cannot serve it would stop the host for nothing: for another stream's
 * work, on the stream path. */
static bool ca__pending_could_serve(const ca__arena *p, const ca__heap *h,
                                    uint64_t size) {
  if (ca__list_could_serve(h, p->held_head, size))
    return true;
  for (const ca__batch *batch = p->batch_head; batch; batch = batch->next)
    if (ca__list_could_serve(h, batch->head, size))
      return true;
  return false;
}

/* Waits for every pending block, oldest first, for a caller that gives
 * memory back: a segment is fully free only once its blocks are back. */
static void ca__wait_all(ca__arena *p) {
  while (ca__wait_oldest(p))
    ;
  ca__quick_flush(p);
}
