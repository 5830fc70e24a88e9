/*
 * The CUDA backend (see backend_cuda.h): the pool's backend over the real
 * driver, each call run in the context it belongs to.
 */
#include "backend/backend_cuda.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/capture.h"
#include "backend/gather.h"
#include "cudalloc.h"
#include "driver/driver.h"
#include "backend/marks.h"
#include "backend/streams.h"
#include "support/nvtx.h"
#include "timeline/trace.h"

/* ------------------------------------------------------------------------ */
/* Context deaths                                                            */

/* Forgets what the backend kept of what died: its streams and fence
 * events, its spare events, its gather kernels, and which of its contexts
 * was primary; its markers count as passed. */
static void ca__forget_dead(const ca_grave *g) {
  ca_streams_bury(g);
  ca_marks_bury(g);
  ca_gather_bury(g);
  ca_driver_kinds_forget(g->device);
}

void ca_backend_cuda_forget_primary(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return;
  ca_grave g = {.device = device, .primary_only = true};
  ca__forget_dead(&g);
  ca_driver_primary_forget(device);
}

void ca_backend_cuda_context_destroyed(CUcontext ctx) {
  if (ctx == NULL)
    return;
  ca_grave g = {.device = -1, .ctx = ctx};
  ca__forget_dead(&g);
}

/* ------------------------------------------------------------------------ */
/* Running a driver call in the right context                               */

/* One driver call of the backend, with its arguments. */
typedef struct ca__call {
  int kind;
  uint64_t size;
  uint64_t addr;
  size_t free_bytes, total_bytes;
  /* Where it runs: set by ca__in_device (the context the call runs in, and
   * whether we pushed the primary one), or by ca__run. */
  ca_where where;
  uint64_t marker;     /* mark: the new handle */
  uint64_t stream;     /* mark_on: the stream */
  const ca_mark *mark; /* poll, wait: the marker */
  bool passed;         /* poll: the answer */
  const uint64_t *on;  /* fill, fetch: their stream, or NULL */
  unsigned char byte;  /* fill: the value */
  void *host;          /* host_alloc: what it got */
  uint64_t rows, pitch; /* fill: `rows` rows of `size` bytes, pitch apart */
  const ca_backend_rows *sets; /* fetch: its copies, n of them, */
  size_t n, started;           /* those started, */
  unsigned char expect;        /* and the byte they may all hold */
} ca__call;

enum { CA__RESERVE, CA__RELEASE, CA__MEM_INFO, CA__SYNC, CA__MARK, CA__POLL,
       CA__WAIT, CA__FENCE, CA__VA_RESERVE, CA__VA_RELEASE, CA__MAP,
       CA__UNMAP, CA__MARK_ON, CA__FILL, CA__FETCH, CA__HOST_ALLOC };

static CUresult ca__do(const ca_driver_api *d, ca__call *c);

/* Runs `c` in `ctx` (a marker's context, which may be a context the
 * program created): as it is when current, else pushed for the call and
 * popped after (ca_driver_enter). */
static CUresult ca__in_context(CUcontext ctx, ca__call *c) {
  bool pushed = false;
  CUresult r = ca_driver_enter(ctx, &pushed);
  if (r != CUDA_SUCCESS)
    return r;
  r = ca__do(ca_driver(), c);
  ca_driver_leave(pushed);
  return r;
}

/* Runs `c` with a context of `device` current: the caller's own when it
 * already is one (the normal case: the pool reserves inside cuMemAlloc), else
 * the device's primary context, pushed for the call and popped after (from
 * cudalloc_empty_cache on any thread, or at exit). */
static CUresult ca__in_device(int device, ca__call *c) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  const ca_driver_api *d = ca_driver();
  int cur = -1;
  CUcontext ctx = NULL;
  c->where.device = device;
  if (ca_driver_current(&cur, &ctx) == CUDA_SUCCESS && cur == device) {
    c->where.ctx = ctx;
    c->where.primary = false; /* not known */
    return ca__do(d, c);
  }
  if (d->ctx_push_current == NULL || d->ctx_pop_current == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = ca_driver_primary_retained(device, false, &ctx);
  if (r != CUDA_SUCCESS)
    return r;
  c->where.ctx = ctx;
  c->where.primary = true;
  return ca__in_context(ctx, c);
}

/* Runs `c` for a pool: in the pool's context when the registry gave it one
 * (the backend's ctx, a CUcontext), so that segments, frees and markers
 * all belong to the context the pool serves; else in a context of
 * `device`. */
static CUresult ca__run(void *pool_ctx, int device, ca__call *c) {
  if (pool_ctx == NULL)
    return ca__in_device(device, c);
  c->where.device = device;
  c->where.ctx = (CUcontext)pool_ctx;
  c->where.primary = false; /* not known */
  return ca__in_context((CUcontext)pool_ctx, c);
}


/* ------------------------------------------------------------------------ */
/* Address ranges (expandable segments)                                      */

/* The unit the pool maps in. Each page has memory of its own (one
 * cuMemCreate), since the driver unmaps only whole mappings and the pool
 * gives pages back one by one: mapping costs about 43 us a page on the
 * H200 (docs/BENCHMARKS.md), so the pool maps only at a miss. */
#define CA__PAGE (2ull << 20)

static bool ca__has_ranges(const ca_driver_api *d) {
  return d->mem_address_reserve && d->mem_address_free && d->mem_map &&
         d->mem_unmap && d->mem_set_access && d->mem_create &&
         d->mem_release && d->mem_get_allocation_granularity &&
         d->device_get;
}

static CUmemAllocationProp ca__page_prop(CUdevice dev) {
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = (int)dev;
  return prop;
}

/* Reserves a range for the pool, once the driver says a page is a whole
 * number of its mapping granules. */
static CUresult ca__va_reserve(const ca_driver_api *d, ca__call *c) {
  CUdevice dev = 0;
  size_t granule = 0;
  if (!ca__has_ranges(d))
    return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = d->device_get(&dev, c->where.device);
  CUmemAllocationProp prop = ca__page_prop(dev);
  if (r == CUDA_SUCCESS)
    r = d->mem_get_allocation_granularity(&granule, &prop,
                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r == CUDA_SUCCESS && (granule == 0 || CA__PAGE % granule != 0))
    r = CUDA_ERROR_NOT_SUPPORTED;
  CUdeviceptr p = 0;
  if (r == CUDA_SUCCESS)
    r = d->mem_address_reserve(&p, (size_t)c->size, CA__PAGE, 0, 0);
  c->addr = (uint64_t)p;
  return r;
}

/* One call unmaps a range of whole mappings (measured: driver_facts.txt). */
static CUresult ca__unmap_pages(const ca_driver_api *d, uint64_t addr,
                                uint64_t size) {
  return size ? d->mem_unmap((CUdeviceptr)addr, (size_t)size) : CUDA_SUCCESS;
}

/* Maps one page of memory at `at`; the handle is released at once, so the
 * memory lives exactly as long as its mapping. */
static CUresult ca__map_page(const ca_driver_api *d,
                             const CUmemAllocationProp *prop, uint64_t at) {
  CUmemGenericAllocationHandle h = 0;
  CUresult r = d->mem_create(&h, CA__PAGE, prop, 0);
  if (r != CUDA_SUCCESS)
    return r;
  r = d->mem_map((CUdeviceptr)at, CA__PAGE, 0, h, 0);
  d->mem_release(h);
  return r;
}

/* Maps [addr, addr + size) page by page, then opens it to the device in
 * one call; on any failure, unmaps what it mapped. */
static CUresult ca__map(const ca_driver_api *d, ca__call *c) {
  CUdevice dev = 0;
  CUresult r = d->device_get(&dev, c->where.device);
  CUmemAllocationProp prop = ca__page_prop(dev);
  uint64_t at = c->addr, end = c->addr + c->size;
  for (; r == CUDA_SUCCESS && at < end; at += CA__PAGE)
    if ((r = ca__map_page(d, &prop, at)) != CUDA_SUCCESS)
      break;
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access = {0};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d->mem_set_access((CUdeviceptr)c->addr, (size_t)c->size, &access, 1);
  }
  if (r != CUDA_SUCCESS)
    ca__unmap_pages(d, c->addr, at - c->addr);
  return r;
}

/* ------------------------------------------------------------------------ */
/* The bytes of blocks (memcheck)                                            */

/* A copy of rows of a block's bytes to the host on s: one row plainly,
 * more as one 2D copy. */
static CUresult ca__copy_rows(const ca_driver_api *d, const ca_backend_rows *r,
                              CUstream s) {
  if (r->rows == 1)
    return d->memcpy_dtoh_async(r->host, (CUdeviceptr)r->addr,
                                (size_t)r->width, s);
  CUDA_MEMCPY2D m = {.srcMemoryType = CU_MEMORYTYPE_DEVICE,
                     .srcDevice = (CUdeviceptr)r->addr,
                     .srcPitch = (size_t)r->pitch,
                     .dstMemoryType = CU_MEMORYTYPE_HOST,
                     .dstHost = r->host,
                     .dstPitch = (size_t)r->width,
                     .WidthInBytes = (size_t)r->width,
                     .Height = (size_t)r->rows};
  return d->memcpy_2d_async(&m, s);
}

/* A fetch's copies, on the call's stream (the legacy one for none), in
 * order: a batch at a time as one launch of the gather kernel where it
 * serves them (gather.h), else one copy each, said copied at once. */
static CUresult ca__fetch(const ca_driver_api *d, ca__call *c) {
  CUstream s = c->on ? (CUstream)(uintptr_t)*c->on : CU_STREAM_LEGACY;
  while (c->started < c->n) {
    const ca_backend_rows *next = c->sets + c->started;
    size_t k = ca_gather(&c->where, next, c->n - c->started, c->expect, s);
    if (k == 0) {
      CUresult r = ca__copy_rows(d, next, s);
      if (r != CUDA_SUCCESS)
        return r;
      *next->copied = 1;
      k = 1;
    }
    c->started += k;
  }
  return CUDA_SUCCESS;
}

/* One row of the bytes to set, or rows pitch apart as one 2D memset (one
 * operation in the stream, not one per row). Whole words are set a word at
 * a time, which the device does faster than bytes. */
static CUresult ca__memset(const ca_driver_api *d, const ca__call *c,
                           CUstream s) {
  CUdeviceptr at = (CUdeviceptr)c->addr;
  unsigned int word = c->byte * 0x01010101u;
  bool words = (c->addr | c->size | (c->rows > 1 ? c->pitch : 0)) % 4 == 0;
  if (c->rows > 1) {
    if (words && d->memset_d2d32_async)
      return d->memset_d2d32_async(at, (size_t)c->pitch, word,
                                   (size_t)c->size / 4, (size_t)c->rows, s);
    return d->memset_d2d8_async ? d->memset_d2d8_async(at, (size_t)c->pitch,
                                                       c->byte, (size_t)c->size,
                                                       (size_t)c->rows, s)
                                : CUDA_ERROR_NOT_SUPPORTED;
  }
  if (words && d->memset_d32_async)
    return d->memset_d32_async(at, word, (size_t)c->size / 4, s);
  return d->memset_d8_async(at, c->byte, (size_t)c->size, s);
}

/* A fill of a block's bytes on the call's stream; with none, on the legacy
 * stream between two fences: after the work queued so far on every stream,
 * and before any queued later. */
static CUresult ca__fill_bytes(const ca_driver_api *d, ca__call *c) {
  bool all = c->on == NULL;
  CUstream s = all ? CU_STREAM_LEGACY : (CUstream)(uintptr_t)*c->on;
  CUresult r = all ? ca_streams_fence(&c->where) : CUDA_SUCCESS;
  if (r == CUDA_SUCCESS)
    r = ca__memset(d, c, s);
  return r == CUDA_SUCCESS && all ? ca_streams_fence(&c->where) : r;
}

/* Pinned, and usable from every context (portable): a copy into it runs
 * while the host goes on. */
static CUresult ca__host_alloc(const ca_driver_api *d, ca__call *c) {
  if (d->mem_host_alloc == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  return d->mem_host_alloc(&c->host, (size_t)c->size,
                           CU_MEMHOSTALLOC_PORTABLE);
}

/* ------------------------------------------------------------------------ */
/* The backend                                                               */

static CUresult ca__do(const ca_driver_api *d, ca__call *c) {
  switch (c->kind) {
  case CA__RESERVE: {
    if (d->mem_alloc == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr p = 0;
    CUresult r = d->mem_alloc(&p, (size_t)c->size);
    c->addr = (uint64_t)p;
    return r;
  }
  case CA__RELEASE:
    if (d->mem_free == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    return d->mem_free((CUdeviceptr)c->addr);
  case CA__MEM_INFO:
    if (d->mem_get_info == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    return d->mem_get_info(&c->free_bytes, &c->total_bytes);
  case CA__SYNC:
    if (d->ctx_synchronize == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    if (ca_capture_active())
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return d->ctx_synchronize();
  case CA__MARK:
    return ca_marks_make(&c->where, &c->marker);
  case CA__MARK_ON:
    return ca_marks_make_on(&c->where, (CUstream)(uintptr_t)c->stream,
                            &c->marker);
  case CA__POLL:
    return ca_marks_query(c->mark, &c->passed);
  case CA__WAIT:
    return ca_marks_sync(c->mark);
  case CA__FENCE:
    return ca_streams_fence(&c->where);
  case CA__VA_RESERVE:
    return ca__va_reserve(d, c);
  case CA__VA_RELEASE:
    return d->mem_address_free ? d->mem_address_free((CUdeviceptr)c->addr,
                                                     (size_t)c->size)
                               : CUDA_ERROR_NOT_SUPPORTED;
  case CA__MAP:
    return ca__map(d, c);
  case CA__UNMAP:
    return d->mem_unmap ? ca__unmap_pages(d, c->addr, c->size)
                        : CUDA_ERROR_NOT_SUPPORTED;
  case CA__FILL:
    return d->memset_d8_async ? ca__fill_bytes(d, c) : CUDA_ERROR_NOT_SUPPORTED;
  case CA__FETCH:
    return d->memcpy_dtoh_async && d->memcpy_2d_async
               ? ca__fetch(d, c)
               : CUDA_ERROR_NOT_SUPPORTED;
  case CA__HOST_ALLOC:
    return ca__host_alloc(d, c);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static int ca__cuda_reserve(void *ctx, int device, uint64_t size,
                            uint64_t *addr) {
  if (size > (uint64_t)SIZE_MAX)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ca__call c = {.kind = CA__RESERVE, .size = size};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS) {
    *addr = c.addr;
    ca_trace_memory(device, c.addr, size, CA_TRACE_SEGMENT);
  }
  return (int)r;
}

static int ca__cuda_release(void *ctx, int device, uint64_t addr,
                            uint64_t size) {
  ca_nvtx_heap_remove(addr);
  /* Recorded first: once released, the address may be another's. */
  ca_trace_memory(device, addr, size, CA_TRACE_RELEASE);
  ca__call c = {.kind = CA__RELEASE, .addr = addr};
  return (int)ca__run(ctx, device, &c);
}

static int ca__cuda_mem_info(void *ctx, int device, uint64_t *free_bytes,
                             uint64_t *total_bytes) {
  ca__call c = {.kind = CA__MEM_INFO};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS) {
    *free_bytes = c.free_bytes;
    *total_bytes = c.total_bytes;
  }
  return (int)r;
}

static int ca__cuda_synchronize(void *ctx, int device) {
  ca__call c = {.kind = CA__SYNC};
  return (int)ca__run(ctx, device, &c);
}

static int ca__cuda_mark(void *ctx, int device, uint64_t *marker) {
  ca__call c = {.kind = CA__MARK};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    *marker = c.marker;
  return (int)r;
}

static int ca__cuda_mark_on(void *ctx, int device, uint64_t stream,
                            uint64_t *marker) {
  ca__call c = {.kind = CA__MARK_ON, .stream = stream};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    *marker = c.marker;
  return (int)r;
}

/* A marker whose context died has passed; while a capture we saw is under
 * way, nothing is asked of the driver (the registry says so without a
 * call). A context that cannot be made current answers "not yet". */
static int ca__cuda_poll(void *ctx, int device, uint64_t marker) {
  (void)ctx;
  (void)device;
  ca_mark m;
  if (!ca_marks_find(marker, &m))
    return 1;
  if (m.dead)
    return 0;
  if (ca_capture_seen())
    return 1;
  ca__call c = {.kind = CA__POLL, .mark = &m};
  return ca__in_context(m.ctx, &c) == CUDA_SUCCESS && c.passed ? 0 : 1;
}

static int ca__cuda_wait(void *ctx, int device, uint64_t marker) {
  (void)ctx;
  (void)device;
  ca_mark m;
  if (!ca_marks_find(marker, &m))
    return CUDA_ERROR_INVALID_VALUE;
  if (m.dead)
    return 0;
  if (ca_capture_seen())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  ca__call c = {.kind = CA__WAIT, .mark = &m};
  return (int)ca__in_context(m.ctx, &c);
}

static void ca__cuda_forget(void *ctx, int device, uint64_t marker) {
  (void)ctx;
  (void)device;
  ca_marks_forget(marker);
}

static int ca__cuda_fence(void *ctx, int device) {
  if (ca_capture_seen())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  ca__call c = {.kind = CA__FENCE};
  return (int)ca__run(ctx, device, &c);
}

/* Mapping and unmapping wait for no stream, but the pool may not change
 * what memory a capture's kernels see: during one, a plain segment serves
 * the request, and free pages stay. */
static int ca__cuda_va_reserve(void *ctx, int device, uint64_t size,
                               uint64_t *addr) {
  if (ca_capture_seen())
    return CA_BACKEND_BUSY;
  ca__call c = {.kind = CA__VA_RESERVE, .size = size};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    *addr = c.addr;
  return (int)r;
}

static int ca__cuda_va_release(void *ctx, int device, uint64_t addr,
                               uint64_t size) {
  ca_nvtx_heap_remove(addr);
  ca__call c = {.kind = CA__VA_RELEASE, .addr = addr, .size = size};
  return (int)ca__run(ctx, device, &c);
}

static int ca__cuda_map(void *ctx, int device, uint64_t addr, uint64_t size) {
  if (ca_capture_seen())
    return CA_BACKEND_BUSY;
  ca__call c = {.kind = CA__MAP, .addr = addr, .size = size};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    ca_trace_memory(device, addr, size, CA_TRACE_MAP);
  return (int)r;
}

static int ca__cuda_unmap(void *ctx, int device, uint64_t addr,
                          uint64_t size) {
  if (ca_capture_seen())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  ca__call c = {.kind = CA__UNMAP, .addr = addr, .size = size};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    ca_trace_memory(device, addr, size, CA_TRACE_UNMAP);
  return (int)r;
}

/* A capture may not take the bytes' work into its graph: refused during
 * one, as markers are. */
static int ca__cuda_fill(void *ctx, int device, uint64_t addr, uint64_t width,
                         uint64_t rows, uint64_t pitch, unsigned char byte,
                         const uint64_t *stream) {
  if (ca_capture_seen())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  ca__call c = {.kind = CA__FILL, .addr = addr, .size = width, .rows = rows,
                .pitch = pitch, .byte = byte, .on = stream};
  return (int)ca__run(ctx, device, &c);
}

static int ca__cuda_fetch(void *ctx, int device, const ca_backend_rows *sets,
                          size_t n, unsigned char expect,
                          const uint64_t *stream, size_t *started) {
  ca__call c = {.kind = CA__FETCH, .sets = sets, .n = n, .expect = expect,
                .on = stream};
  int r = ca_capture_seen() ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
                            : (int)ca__run(ctx, device, &c);
  *started = c.started;
  return r;
}

static void *ca__cuda_host_alloc(void *ctx, int device, uint64_t size) {
  ca__call c = {.kind = CA__HOST_ALLOC, .size = size};
  return ca__run(ctx, device, &c) == CUDA_SUCCESS ? c.host : NULL;
}

static const ca_backend ca__backend = {
    .ctx = NULL,
    .oom_code = CUDA_ERROR_OUT_OF_MEMORY,
    .reserve = ca__cuda_reserve,
    .release = ca__cuda_release,
    .mem_info = ca__cuda_mem_info,
    .mark = ca__cuda_mark,
    .mark_on = ca__cuda_mark_on,
    .poll = ca__cuda_poll,
    .wait = ca__cuda_wait,
    .forget = ca__cuda_forget,
    .fence = ca__cuda_fence,
    .synchronize = ca__cuda_synchronize,
    .page = CA__PAGE,
    .va_reserve = ca__cuda_va_reserve,
    .va_release = ca__cuda_va_release,
    .map = ca__cuda_map,
    .unmap = ca__cuda_unmap,
    .fill = ca__cuda_fill,
    .fetch = ca__cuda_fetch,
    .host_alloc = ca__cuda_host_alloc,
};

const ca_backend *ca_backend_cuda(void) { return &ca__backend; }
