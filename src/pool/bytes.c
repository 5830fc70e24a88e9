/*
 * The bytes of blocks, through the pool's backend (backend.h: fill, fetch,
 * host_alloc): what memcheck writes into blocks and reads back, and what
 * it tells the pool of the bytes it left (stale.c). The pool only hands
 * the calls on; it never looks at the bytes itself.
 */

bool ca_pool_touches_bytes(const ca_pool *pool) {
  const ca_backend *be = pool->backend;
  return be->fill && be->fetch && be->host_alloc && be->mark && be->poll &&
         be->wait && be->forget;
}

int ca_pool_fill(ca_pool *pool, uint64_t addr, uint64_t width, uint64_t rows,
                 uint64_t pitch, unsigned char byte, const uint64_t *stream) {
  const ca_backend *be = pool->backend;
  return be->fill(be->ctx, pool->device, addr, width, rows, pitch, byte,
                  stream);
}

int ca_pool_fetch(ca_pool *pool, const ca_backend_rows *sets, size_t n,
                  unsigned char expect, const uint64_t *stream,
                  size_t *started) {
  const ca_backend *be = pool->backend;
  return be->fetch(be->ctx, pool->device, sets, n, expect, stream, started);
}

int ca_pool_mark_after(ca_pool *pool, const uint64_t *stream,
                       uint64_t *marker) {
  const ca_backend *be = pool->backend;
  if (stream && be->mark_on)
    return be->mark_on(be->ctx, pool->device, *stream, marker);
  return be->mark(be->ctx, pool->device, marker);
}

int ca_pool_fetched(ca_pool *pool, uint64_t marker, bool wait) {
  const ca_backend *be = pool->backend;
  int r = wait ? be->wait(be->ctx, pool->device, marker)
               : be->poll(be->ctx, pool->device, marker);
  if (r == 0 || wait)
    be->forget(be->ctx, pool->device, marker);
  return r;
}

void *ca_pool_host_alloc(ca_pool *pool, uint64_t size) {
  const ca_backend *be = pool->backend;
  return be->host_alloc(be->ctx, pool->device, size);
}

bool ca_pool_stale(ca_pool *pool, uint64_t addr, uint64_t lo, uint64_t hi) {
  ca__arena *p = ca__owner(pool, NULL, addr);
  if (!p)
    return false;
  ca__block *b = ca__live_find(p, addr);
  b->nstale = 0;
  ca__stale_add(b, lo, hi);
  ca_lock_release(&p->lock);
  return true;
}
