/*
 * The policy behind each handled driver call (see intercept.h).
 *
 * The real functions are reached through the backend's table (ca_driver());
 * this file decides only whether to call them, and what to record. Pooled
 * requests and frees go down a chain of concerns (concerns/), composed
 * here once around the pool.
 */
#include "policy/intercept.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend_cuda.h"
#include "backend/capture.h"
#include "concerns/concern.h"
#include "concerns/memcheck.h"
#include "concerns/site_bytes.h"
#include "support/config.h"
#include "driver/driver.h"
#include "cudalloc.h"
#include "policy/lifecycle.h"
#include "support/log.h"
#include "policy/pointer.h"
#include "policy/regions.h"
#include "policy/oom.h"
#include "policy/room.h"
#include "pool/pool.h"
#include "registry/registry.h"
#include "leaks/sites.h"
#include "backend/streams.h"
#include "timeline/trace.h"
#include "leaks/track.h"

bool ca_intercept_enabled(void) { return ca_config_get()->enabled; }

/* The current context and its device, or NULL and -1: tracking wants a
 * best guess, and a failed query must not change the program's result. */
static int ca__where(CUcontext *ctx) {
  int device = -1;
  *ctx = NULL;
  if (ca_driver_current(&device, ctx) != CUDA_SUCCESS)
    return -1;
  return device;
}

/* Books `size` bytes of passed-through memory in `device`'s budget before
 * the driver is asked for them, giving back the pools' cache there if that
 * makes the room. An unknown device (-1) has no budget to book in. */
static bool ca__book_passed(int device, uint64_t size) {
  ca_budget *b = ca_registry_budget_joined(device);
  if (b == NULL || ca_budget_book(b, size) ||
      (ca_room_make(device, size) && ca_budget_book(b, size)))
    return true;
  ca_room_refused(device, size);
  return false;
}

/* Records a passed-through allocation, booked already, for the report. The
 * driver gave out its address just now, so if a pooled segment still held
 * it, that segment was freed behind the library's back (the pool stops
 * using it); an entry still live at the key was freed by a path we do not
 * see, and its booking ends. */
static void ca__track(ca_track_kind kind, uint64_t key, uint64_t size,
                      int device, CUcontext ctx) {
  ca_tracked gone;
  if (kind != CA_TRACK_VMM)
    ca_registry_lost(key);
  uint32_t stack = ca_site_stack(ca_config_get());
  if (ca_track_add(kind, key, size, device, ctx, stack, &gone))
    ca_registry_unbook(gone.device, gone.size);
  ca_budget *b = ca_registry_budget(device);
  if (b)
    ca_budget_served(b);
  ca_lifecycle_device_used();
  ca_trace_alloc(device, key, size, stack);
}

/* Frees a passed-through allocation with `call`. Its record leaves the
 * table first: once freed, the driver may hand the address out again at
 * once, to another thread, whose record must not be taken for this one.
 * Its booking ends only after the free, so that no allocation takes the
 * room while the memory is still held. A failed free puts the record
 * back. Where the library is off, nothing was recorded. */
#define CA__FREE_TRACKED(vmm, key, call)                                       \
  ({                                                                           \
    ca_tracked t_;                                                             \
    bool had_ = ca_intercept_enabled() &&                                      \
                ((vmm) ? ca_track_forget_handle((key), &t_)                    \
                       : ca_track_forget_addr((key), &t_));                    \
    CUresult r_ = (call);                                                      \
    if (had_ && r_ == CUDA_SUCCESS) {                                          \
      ca_registry_unbook(t_.device, t_.size);                                  \
      ca_trace_free(t_.device, (key), t_.size);                                \
    } else if (had_)                                                           \
      ca_track_restore(&t_);                                                   \
    r_;                                                                        \
  })

/* ------------------------------------------------------------------------ */
/* Pooled                                                                    */

/* The chains' bottom: the pool itself. A block given back leaves the
 * pointer queries' records too (pointer.c). */
static int ca__pool_alloc(const ca_layer *self, ca_ask *a) {
  (void)self;
  return a->stream
             ? ca_pool_alloc_on(a->pool, a->size, a->stack, *a->stream, &a->addr)
             : ca_pool_alloc(a->pool, a->size, a->stack, &a->addr);
}

static int ca__pool_free(const ca_layer *self, ca_give *g) {
  (void)self;
  if (!ca_registry_free(g->addr, g->stream, g->describe ? &g->block : NULL))
    return CA_GIVE_NOT_POOLED;
  ca_pointer_freed(g->addr);
  return 0;
}

/* The live pooled block that starts at `addr`, and its pool. */
static bool ca__live_block(uint64_t addr, ca_pool **pool, ca_live_block *out) {
  ca_registry_span where;
  if (!ca_registry_find(addr, &where) || !where.span.live ||
      where.span.block.addr != addr)
    return false;
  *pool = where.pool;
  *out = where.span.block;
  return true;
}

/* Whether the driver allows cuMemAlloc and cuMemFree now: during a stream
 * capture it refuses them (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) from a
 * thread whose capture mode forbids them, and invalidates the capture
 * (driver_facts.txt). It judges that before anything else, whatever the
 * pointer, cuMemFree(0) included: asked with cuMemFree(0), it gives the
 * exact answer a pooled call must give, and has the same effect on the
 * capture. The capture rule (concerns/capture_rule.c) asks only while a
 * capture the policy saw begin may run. */
static int ca__capture_allows(void) {
  CUresult r = CA_REAL(mem_free, 0);
  return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ||
                 r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
                 r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
                 r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
             ? r
             : CUDA_SUCCESS;
}

/* The two chains of concerns around the pool (concerns/compose.c), made
 * once the configuration is read, at the first pooled request. */
static ca_layer_env ca__env;
static ca_chain ca__chains[2];
static const ca_layer *_Atomic ca__tops[2];
static pthread_once_t ca__chains_once = PTHREAD_ONCE_INIT;
/* ... and composed again, once, when a trace starts at run time: beside
 * the first, which calls in progress may still be walking. */
static ca_layer_env ca__env_traced;
static ca_chain ca__chains_traced[2];
static pthread_once_t ca__traced_once = PTHREAD_ONCE_INIT;

static const ca_layer ca__bottom = {
    .name = "pool", .alloc = ca__pool_alloc, .free = ca__pool_free};

static void ca__compose_chains(void) {
  ca__env = (ca_layer_env){.cfg = ca_config_get(),
                           .oom = CUDA_ERROR_OUT_OF_MEMORY,
                           .make_room = ca_room_make,
                           .no_room = ca_room_refused,
                           .allowed = ca__capture_allows,
                           .capturing = &ca_captures_live,
                           .regions = ca_regions_for_tool(),
                           .block = ca__live_block};
  const ca_layer *tops[2];
  for (int p = CA_PATH_SYNC; p <= CA_PATH_ORDERED; p++)
    tops[p] = ca_compose(&ca__chains[p], &ca__env, (ca_path)p, &ca__bottom);
  if (ca__env.cfg->verbose >= 2) {
    char sync[128], ordered[128];
    ca_chain_describe(&ca__chains[CA_PATH_SYNC], sync, sizeof(sync));
    ca_chain_describe(&ca__chains[CA_PATH_ORDERED], ordered, sizeof(ordered));
    ca_log("layers around the pool: cuMemAlloc and cuMemFree %s; "
           "stream-ordered %s", sync, ordered);
  }
  for (int p = CA_PATH_SYNC; p <= CA_PATH_ORDERED; p++)
    atomic_store_explicit(&ca__tops[p], tops[p], memory_order_release);
}

static void ca__compose_traced(void) {
  pthread_once(&ca__chains_once, ca__compose_chains);
  ca__env_traced = ca__env;
  ca__env_traced.traced = true;
  for (int p = CA_PATH_SYNC; p <= CA_PATH_ORDERED; p++)
    atomic_store_explicit(&ca__tops[p],
                          ca_compose(&ca__chains_traced[p], &ca__env_traced, (ca_path)p,
                                     &ca__bottom),
                          memory_order_release);
}

void ca_intercept_trace_started(void) { pthread_once(&ca__traced_once, ca__compose_traced); }

static inline const ca_layer *ca__chain(ca_path path) {
  const ca_layer *top =
      atomic_load_explicit(&ca__tops[path], memory_order_acquire);
  if (__builtin_expect(top == NULL, 0)) {
    pthread_once(&ca__chains_once, ca__compose_chains);
    top = atomic_load_explicit(&ca__tops[path], memory_order_acquire);
  }
  return top;
}

/* Serves `size` bytes from `pool` through `path`'s chain, on *stream when
 * `stream` is not NULL. */
static CUresult ca__pooled(ca_path path, ca_pool *pool, size_t size,
                           const uint64_t *stream, CUdeviceptr *dptr) {
  ca_ask ask = {.pool = pool, .size = (uint64_t)size, .stream = stream};
  int r = ca_layer_alloc(ca__chain(path), &ask);
  if (r == 0)
    *dptr = (CUdeviceptr)ask.addr;
  return (CUresult)r;
}

/* Stream-ordered: the frameworks' allocator slots. */
CUresult ca_intercept_pooled(ca_pool *pool, size_t size,
                             const uint64_t *stream, CUdeviceptr *dptr) {
  return ca__pooled(CA_PATH_ORDERED, pool, size, stream, dptr);
}

/* The current context's pool, made on its first use (which tells the
 * lifecycle the process uses device memory); NULL without a context. */
static ca_pool *ca__current_pool(void) {
  bool made = false;
  ca_pool *pool = ca_registry_current_pool(&made);
  if (made)
    ca_lifecycle_device_used();
  return pool;
}

/* A missing pointer or a zero-byte request gets the driver's own answer
 * (an error, the capture's refusal first), as does a thread without a
 * current context (no pool). */
CUresult ca_on_mem_alloc(CUdeviceptr *dptr, size_t size) {
  if (!ca_intercept_enabled() || dptr == NULL || size == 0)
    return CA_REAL(mem_alloc, dptr, size);
  ca_pool *pool = ca__current_pool();
  if (pool == NULL)
    return CA_REAL(mem_alloc, dptr, size);
  CUresult r = ca__pooled(CA_PATH_SYNC, pool, size, NULL, dptr);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    ca_oom_refused(ca_pool_device(pool), size, "cuMemAlloc", NULL);
  return r;
}

/* Gives a pooled block back through `path`'s chain (on *stream, when
 * named): 0, CA_GIVE_NOT_POOLED, or a capture's refusal. */
static int ca__free_pooled(ca_path path, CUdeviceptr dptr,
                           const uint64_t *stream) {
  ca_give give = {.addr = (uint64_t)dptr, .stream = stream};
  return ca_layer_free(ca__chain(path), &give);
}

bool ca_intercept_free_pooled(CUdeviceptr dptr, const uint64_t *stream) {
  return ca__free_pooled(CA_PATH_ORDERED, dptr, stream) == 0;
}

/* A free no pool answered for: the driver's. */
CUresult ca_intercept_free_unpooled(CUdeviceptr dptr) {
  /* A pooled block freed twice, at a segment's base: the driver would free
   * the whole segment under the pool. It answers a double free this way. */
  if (ca_registry_holds_segment((uint64_t)dptr))
    return CUDA_ERROR_INVALID_VALUE;
  /* Not ours: pitched, managed or stream-ordered memory (cudaFree accepts
   * them all), or a bad pointer the driver will reject. */
  return CA__FREE_TRACKED(false, (uint64_t)dptr, CA_REAL(mem_free, dptr));
}

CUresult ca_on_mem_free(CUdeviceptr dptr) {
  /* cuMemFree(0) gets the driver's own answer, whatever it is. */
  if (!ca_intercept_enabled() || dptr == 0)
    return CA_REAL(mem_free, dptr);
  int r = ca__free_pooled(CA_PATH_SYNC, dptr, NULL);
  return r == CA_GIVE_NOT_POOLED ? ca_intercept_free_unpooled(dptr)
                                 : (CUresult)r;
}

/* ------------------------------------------------------------------------ */
/* Adjusted                                                                  */

/* Free memory as the program should see it: what one allocation can get.
 * That is what the driver has free plus the pool's segments that hold no
 * live block, which the pool gives back when the driver cannot serve a
 * request; the holes in segments still in use are not counted, since a
 * request larger than them cannot use them. Never above total. Under
 * memory_limit the limit is the total, and free is what the limit leaves
 * beside the memory held (the pool's segments in use, and what went to the
 * driver directly; under shared_limit, all the group's processes hold); it
 * never exceeds what the device itself can give, since a limit cannot
 * create memory. */
static void ca__adjust_info(int device, uint64_t *free_bytes,
                            uint64_t *total_bytes) {
  uint64_t releasable = ca_registry_releasable(device);
  uint64_t free_now = *free_bytes + releasable;
  if (free_now > *total_bytes)
    free_now = *total_bytes;
  const ca_budget *b = ca_registry_budget_joined(device);
  uint64_t limit = b ? ca_budget_limit(b) : 0;
  if (limit > 0) {
    uint64_t booked = ca_budget_held(b);
    uint64_t held = booked > releasable ? booked - releasable : 0;
    uint64_t left = limit > held ? limit - held : 0;
    if (free_now > left)
      free_now = left;
    *total_bytes = limit;
  }
  *free_bytes = free_now;
}

/* The driver answers first, with the program's own arguments (either may
 * be NULL); the adjustment needs both figures, so they are asked again
 * when the program wanted only one. */
CUresult ca_on_mem_get_info(size_t *free_bytes, size_t *total_bytes) {
  CUresult r = CA_REAL(mem_get_info, free_bytes, total_bytes);
  int device = -1;
  CUcontext ctx = NULL;
  if (r != CUDA_SUCCESS || !ca_intercept_enabled() ||
      ca_driver_current(&device, &ctx) != CUDA_SUCCESS)
    return r;
  size_t f = 0, t = 0;
  if (free_bytes && total_bytes) {
    f = *free_bytes;
    t = *total_bytes;
  } else if (CA_REAL(mem_get_info, &f, &t) != CUDA_SUCCESS) {
    return r;
  }
  uint64_t free_now = f, total = t;
  ca__adjust_info(device, &free_now, &total);
  if (free_bytes)
    *free_bytes = (size_t)free_now;
  if (total_bytes)
    *total_bytes = (size_t)total;
  return r;
}

/* ------------------------------------------------------------------------ */
/* Passed through, tracked                                                   */

/* Runs one passed-through allocation under the policy shared by all of
 * them: booked in the device's budget first (refused past the memory
 * limit), and the booking ended if the call fails; retried once after the
 * pool has given back what it holds, when the driver runs out of memory,
 * and told (oom.h) when even that was refused. `call` makes the real call,
 * `name` is the driver function's. */
#define CA__PASS_THROUGH(device, size, name, call)                             \
  ({                                                                           \
    CUresult r_ = CUDA_ERROR_OUT_OF_MEMORY;                                    \
    if (ca__book_passed((device), (size))) {                                   \
      r_ = (call);                                                             \
      if (r_ == CUDA_ERROR_OUT_OF_MEMORY && ca_room_give_back(device))         \
        r_ = (call);                                                           \
      if (r_ != CUDA_SUCCESS)                                                  \
        ca_registry_unbook((device), (size));                                   \
    }                                                                          \
    if (r_ == CUDA_ERROR_OUT_OF_MEMORY)                                        \
      ca_oom_refused((device), (size), (name), NULL);                          \
    r_;                                                                        \
  })

CUresult ca_on_mem_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width,
                               size_t height, unsigned int element_size) {
  if (!ca_intercept_enabled())
    return CA_REAL(mem_alloc_pitch, dptr, pitch, width, height, element_size);
  CUcontext ctx;
  int device = ca__where(&ctx);
  uint64_t asked = (uint64_t)width * height;
  if (height != 0 && asked / height != width) /* past 2^64 bytes */
    return CA_REAL(mem_alloc_pitch, dptr, pitch, width, height, element_size);
  CUresult r = CA__PASS_THROUGH(
      device, asked, "cuMemAllocPitch",
      CA_REAL(mem_alloc_pitch, dptr, pitch, width, height, element_size));
  if (r != CUDA_SUCCESS)
    return r;
  /* The rows' padding is known only now; it is booked as well, or the
   * allocation given back. */
  uint64_t got = (uint64_t)*pitch * height;
  if (got > asked && !ca__book_passed(device, got - asked)) {
    CA_REAL(mem_free, *dptr);
    ca_registry_unbook(device, asked);
    ca_oom_refused(device, got, "cuMemAllocPitch", NULL);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ca__track(CA_TRACK_PITCH, (uint64_t)*dptr, got > asked ? got : asked,
            device, ctx);
  return r;
}

CUresult ca_on_mem_alloc_managed(CUdeviceptr *dptr, size_t size,
                                 unsigned int flags) {
  if (!ca_intercept_enabled())
    return CA_REAL(mem_alloc_managed, dptr, size, flags);
  CUcontext ctx;
  int device = ca__where(&ctx);
  CUresult r = CA__PASS_THROUGH(device, size, "cuMemAllocManaged",
                                CA_REAL(mem_alloc_managed, dptr, size, flags));
  if (r == CUDA_SUCCESS)
    ca__track(CA_TRACK_MANAGED, (uint64_t)*dptr, size, device, ctx);
  return r;
}

CUresult ca_on_mem_alloc_async(CUdeviceptr *dptr, size_t size,
                               CUstream stream, bool ptsz) {
  if (!ca_intercept_enabled())
    return ptsz ? CA_REAL(mem_alloc_async_ptsz, dptr, size, stream)
                : CA_REAL(mem_alloc_async, dptr, size, stream);
  CUcontext ctx;
  int device = ca__where(&ctx);
  CUresult r = CA__PASS_THROUGH(
      device, size, "cuMemAllocAsync",
      ptsz ? CA_REAL(mem_alloc_async_ptsz, dptr, size, stream)
           : CA_REAL(mem_alloc_async, dptr, size, stream));
  if (r == CUDA_SUCCESS)
    ca__track(CA_TRACK_ASYNC, (uint64_t)*dptr, size, device, ctx);
  return r;
}

CUresult ca_on_mem_alloc_from_pool_async(CUdeviceptr *dptr, size_t size,
                                         CUmemoryPool pool, CUstream stream,
                                         bool ptsz) {
  if (!ca_intercept_enabled())
    return ptsz ? CA_REAL(mem_alloc_from_pool_async_ptsz, dptr, size, pool,
                           stream)
                : CA_REAL(mem_alloc_from_pool_async, dptr, size, pool,
                           stream);
  CUcontext ctx;
  int device = ca__where(&ctx);
  CUresult r = CA__PASS_THROUGH(
      device, size, "cuMemAllocFromPoolAsync",
      ptsz ? CA_REAL(mem_alloc_from_pool_async_ptsz, dptr, size, pool, stream)
           : CA_REAL(mem_alloc_from_pool_async, dptr, size, pool, stream));
  if (r == CUDA_SUCCESS)
    ca__track(CA_TRACK_POOL_ASYNC, (uint64_t)*dptr, size, device, ctx);
  return r;
}

CUresult ca_on_mem_free_async(CUdeviceptr dptr, CUstream stream, bool ptsz) {
  /* A pooled block freed stream-ordered: under reuse_policy safe its
   * batch's marker, made after this call, orders its reuse after the work
   * queued on `stream` before the free, so it is taken back like
   * cuMemFree. (Under immediate, as documented, it is not.) */
  if (ca_intercept_enabled() && dptr != 0) {
    if (ca_intercept_free_pooled(dptr, NULL))
      return CUDA_SUCCESS;
    if (ca_registry_holds_segment((uint64_t)dptr))
      return CUDA_ERROR_INVALID_VALUE; /* as in ca_on_mem_free */
  }
  return CA__FREE_TRACKED(false, (uint64_t)dptr,
                          ptsz ? CA_REAL(mem_free_async_ptsz, dptr, stream)
                               : CA_REAL(mem_free_async, dptr, stream));
}

CUresult ca_on_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
                          const CUmemAllocationProp *prop,
                          unsigned long long flags) {
  if (!ca_intercept_enabled() || prop == NULL)
    return CA_REAL(mem_create, handle, size, prop, flags);
  int device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                   ? prop->location.id
                   : -1;
  CUresult r = CA__PASS_THROUGH(device, size, "cuMemCreate",
                                CA_REAL(mem_create, handle, size, prop, flags));
  if (r == CUDA_SUCCESS)
    ca__track(CA_TRACK_VMM, (uint64_t)*handle, size, device, NULL);
  return r;
}

CUresult ca_on_mem_release(CUmemGenericAllocationHandle handle) {
  return CA__FREE_TRACKED(true, (uint64_t)handle, CA_REAL(mem_release, handle));
}

/* ------------------------------------------------------------------------ */
/* Context deaths: passed through, then the pool forgets what died           */

/* memcheck, before a call that may kill a context and its memory: the
 * quarantine checked and given back while the pools still take frees
 * (`first`), then the dying pool's live blocks checked while their memory
 * is there (the static runtime releases its context at exit, before the
 * exit report). */
static void ca__memcheck_before_death(bool first, ca_pool *pool) {
  if (!ca_config_get()->memcheck)
    return;
  if (first)
    ca_memcheck_drain();
  else if (pool != NULL)
    ca_memcheck_check_pool(pool);
}

/* A call that may kill `dev`'s primary context (a reset always does; a
 * release does when it was the last, which leaves the context inactive).
 * Its handle is asked before the call: after it, the context is no longer
 * active to be asked about. `call` is the real function, NULL when the
 * driver lacks it. */
static CUresult ca__primary_call(CUdevice dev, CUresult (*call)(CUdevice),
                                 bool always_dies) {
  if (call == NULL)
    return ca_driver_missing();
  if (!ca_intercept_enabled())
    return call(dev);
  CUcontext primary = ca_driver_primary_peek((int)dev);
  ca__memcheck_before_death(true, NULL);
  ca_pool *pool = ca_registry_dying(primary);
  ca__memcheck_before_death(false, pool);
  CUresult r = call(dev);
  bool died = r == CUDA_SUCCESS &&
              (always_dies || ca_driver_primary_peek((int)dev) == NULL);
  if (died)
    ca_backend_cuda_forget_primary((int)dev);
  if (died && primary != NULL)
    ca_lifecycle_context_gone(primary, pool, (int)dev);
  else
    ca_registry_survived(pool);
  return r;
}

/* cudaDeviceReset. */
CUresult ca_on_device_primary_ctx_reset(CUdevice dev, bool v1) {
  return ca__primary_call(dev,
                          v1 ? ca_driver()->device_primary_ctx_reset_v1
                             : ca_driver()->device_primary_ctx_reset,
                          true);
}

/* The program's last release of a primary context destroys it, and its
 * memory with it. */
CUresult ca_on_device_primary_ctx_release(CUdevice dev, bool v1) {
  return ca__primary_call(dev,
                          v1 ? ca_driver()->device_primary_ctx_release_v1
                             : ca_driver()->device_primary_ctx_release,
                          false);
}

CUresult ca_on_ctx_destroy(CUcontext ctx) {
  if (!ca_intercept_enabled())
    return CA_REAL(ctx_destroy, ctx);
  ca__memcheck_before_death(true, NULL);
  ca_pool *pool = ca_registry_dying(ctx);
  ca__memcheck_before_death(false, pool);
  CUresult r = CA_REAL(ctx_destroy, ctx);
  if (r != CUDA_SUCCESS) {
    ca_registry_survived(pool);
    return r;
  }
  /* Its streams died with it (see the streams below), and its pool. */
  ca_backend_cuda_context_destroyed(ctx);
  ca_lifecycle_context_gone(ctx, pool, -1);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Stream capture: passed through, reported to the backend                   */

/* Reported only when the pool is enabled: with enabled:0 there is no pool
 * to synchronize, and every handler is a plain pass-through. */
static CUresult ca__capture_begun(CUresult r, CUstream stream, bool ptsz) {
  if (r == CUDA_SUCCESS && ca_intercept_enabled())
    ca_capture_begun(stream, ptsz);
  return r;
}

CUresult ca_on_stream_begin_capture_v1(CUstream stream, bool ptsz) {
  CUresult r = ptsz ? CA_REAL(stream_begin_capture_v1_ptsz, stream)
                    : CA_REAL(stream_begin_capture_v1, stream);
  return ca__capture_begun(r, stream, ptsz);
}

CUresult ca_on_stream_begin_capture(CUstream stream, CUstreamCaptureMode mode,
                                    bool ptsz) {
  CUresult r = ptsz ? CA_REAL(stream_begin_capture_ptsz, stream, mode)
                    : CA_REAL(stream_begin_capture, stream, mode);
  return ca__capture_begun(r, stream, ptsz);
}

CUresult ca_on_stream_begin_capture_to_graph(CUstream stream, CUgraph graph,
                                             const CUgraphNode *deps,
                                             const CUgraphEdgeData *edges,
                                             size_t ndeps,
                                             CUstreamCaptureMode mode,
                                             bool ptsz) {
  CUresult r = ptsz ? CA_REAL(stream_begin_capture_to_graph_ptsz, stream,
                               graph, deps, edges, ndeps, mode)
                    : CA_REAL(stream_begin_capture_to_graph, stream, graph,
                               deps, edges, ndeps, mode);
  return ca__capture_begun(r, stream, ptsz);
}

/* The capture may end or not whatever the result (an invalidated capture
 * ends with an error; a call from the wrong thread ends nothing), so the
 * backend asks the driver afterwards. */
CUresult ca_on_stream_end_capture(CUstream stream, CUgraph *graph, bool ptsz) {
  CUresult r = ptsz ? CA_REAL(stream_end_capture_ptsz, stream, graph)
                    : CA_REAL(stream_end_capture, stream, graph);
  if (ca_intercept_enabled())
    ca_capture_ended(stream, ptsz);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Streams: passed through, the non-blocking ones told to the backend        */

/* A pooled free does not wait for the device, so a freed block is reused
 * only once a marker made after the free has passed: an event on the legacy
 * stream (ordered after every blocking stream) and one on each live
 * non-blocking stream, which only these hooks can know of. */
static CUresult ca__stream_created(CUresult r, const CUstream *stream,
                                   unsigned int flags) {
  if (r == CUDA_SUCCESS && ca_intercept_enabled())
    ca_streams_created(*stream, flags);
  return r;
}

CUresult ca_on_stream_create(CUstream *stream, unsigned int flags) {
  return ca__stream_created(CA_REAL(stream_create, stream, flags), stream,
                            flags);
}

CUresult ca_on_stream_create_with_priority(CUstream *stream,
                                           unsigned int flags, int priority) {
  return ca__stream_created(
      CA_REAL(stream_create_with_priority, stream, flags, priority), stream,
      flags);
}

/* memcheck lets go of the blocks freed on the stream, and the pools share
 * the stream's free blocks behind a marker recorded on it while it still
 * lives; the backend makes the real call, so that no marker records on the
 * stream while it is being destroyed. */
CUresult ca_on_stream_destroy(CUstream stream, bool v1) {
  if (!ca_intercept_enabled())
    return v1 ? CA_REAL(stream_destroy_v1, stream)
              : CA_REAL(stream_destroy, stream);
  ca_memcheck_stream_ended((uint64_t)(uintptr_t)stream);
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(-1, pools, CA_REGISTRY_MAX_POOLS);
  for (size_t i = 0; i < n && i < CA_REGISTRY_MAX_POOLS; i++)
    ca_pool_stream_ended(pools[i], (uint64_t)(uintptr_t)stream);
  return ca_streams_destroy(stream, v1);
}
