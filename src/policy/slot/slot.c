/*
 * The allocator slot's policy (see slot.h).
 *
 * The slot is called from any thread (autograd runs the backward pass on a
 * thread of its own, where no context is current) and names its device: it
 * is served by the pool of that device's primary context, and the backend
 * pushes that context for the driver calls it makes, so the caller's
 * current context is as it was after.
 */
#include "policy/slot/slot.h"

#include <stdint.h>

#include "backend/capture.h"
#include "support/config.h"
#include "cudalloc.h"
#include "driver/driver.h"
#include "policy/slot/graphs.h"
#include "policy/intercept.h"
#include "policy/lifecycle.h"
#include "support/log.h"
#include "support/stats.h"
#include "policy/slot/recorded.h"
#include "policy/oom.h"
#include "policy/room.h"
#include "registry/registry.h"

/* `device`'s primary context made current for a few driver calls (see
 * ca_driver_enter); ca_driver_leave(*pushed) after. */
static CUresult ca__enter_primary(int device, bool activate, bool *pushed) {
  CUcontext ctx = NULL;
  *pushed = false;
  CUresult r = ca_driver_primary_retained(device, activate, &ctx);
  return r == CUDA_SUCCESS ? ca_driver_enter(ctx, pushed) : r;
}

/* What no pool serves (the library is off, the primary context is being
 * reset) goes to the driver as a plain cuMemAlloc or cuMemFree would, with
 * `device`'s primary context current for the call. */
static CUresult ca__passed(int device, CUdeviceptr *dptr, size_t size,
                           CUdeviceptr freed) {
  bool pushed = false;
  CUresult r = ca__enter_primary(device, true, &pushed);
  if (r != CUDA_SUCCESS)
    return r;
  if (!ca_intercept_enabled())
    r = dptr ? CA_REAL(mem_alloc, dptr, size) : CA_REAL(mem_free, freed);
  else
    r = dptr ? ca_on_mem_alloc(dptr, size) : ca_intercept_free_unpooled(freed);
  ca_driver_leave(pushed);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Saying why a request failed                                               */

/* Says why a request the slot could not serve was refused, `then` saying
 * what the caller does next (or NULL): out of memory as every refusal for
 * memory is told (oom.h), anything else in one line. */
static void ca__say_refused(CUresult r, size_t size, int device,
                            const char *then) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    ca_oom_refused(device, (uint64_t)size, "the allocator slot", then);
    return;
  }
  char asked[32];
  ca_format_bytes(asked, sizeof(asked), (uint64_t)size);
  ca_log("allocator slot: %s asked on device %d refused: %s%s%s", asked,
         device, ca_driver_error_name(r), then ? "; " : "", then ? then : "");
}

/* ------------------------------------------------------------------------ */
/* Graphs                                                                    */

/* The graph whose capture `stream` belongs to, or 0 (no driver call while
 * no capture is open). */
static int ca__graph_of(int device, CUstream stream) {
  if (!ca_graphs_any_open())
    return 0;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  bool pushed = false;
  if (ca__enter_primary(device, false, &pushed) == CUDA_SUCCESS) {
    if (CA_REAL(stream_is_capturing, stream, &status) != CUDA_SUCCESS)
      status = CU_STREAM_CAPTURE_STATUS_NONE;
    ca_driver_leave(pushed);
  }
  return ca_graphs_open(device, (uint64_t)(uintptr_t)stream,
                        status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
}

/* A request of `graph`'s capture: a block the graph holds and the program
 * freed, of the same size, else a new one from the pool, which the graph
 * then holds. As PyTorch's allocator does, this thread's capture mode is
 * relaxed for the pool's call, so that a new segment may be asked of the
 * driver (the graph keeps it: it is never freed before the graph goes). */
static CUresult ca__graph_alloc(ca_pool *pool, int graph, CUdeviceptr *dptr,
                                size_t size, CUstream stream) {
  uint64_t again = ca_graphs_reuse(graph, (uint64_t)size);
  if (again) {
    *dptr = (CUdeviceptr)again;
    return CUDA_SUCCESS;
  }
  uint64_t s = (uint64_t)(uintptr_t)stream;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool relaxed =
      CA_REAL(thread_exchange_stream_capture_mode, &mode) == CUDA_SUCCESS;
  CUresult r = ca_intercept_pooled(pool, size, &s, dptr);
  if (relaxed)
    CA_REAL(thread_exchange_stream_capture_mode, &mode);
  if (r == CUDA_SUCCESS && !ca_graphs_hold(graph, (uint64_t)*dptr, size)) {
    ca_intercept_free_pooled(*dptr, &s);
    r = CUDA_ERROR_NOT_SUPPORTED;
  }
  return r;
}

int ca_slot_graph_begin(int device, CUstream stream) {
  if (!ca_intercept_enabled())
    return -1; /* no pool: nothing to hold */
  int graph = ca_graphs_begin(device, (uint64_t)(uintptr_t)stream);
  if (graph)
    ca_capture_begun(stream, false);
  else
    ca_log("allocator slot: %d CUDA graphs are held already: release one "
           "(graph.reset()) before capturing another", CA_GRAPHS_MAX);
  return graph;
}

void ca_slot_graph_end(int graph) {
  int device = -1;
  uint64_t stream = 0;
  bool pushed = false;
  if (!ca_graphs_where(graph, &device, &stream))
    return;
  ca_graphs_end(graph);
  /* The backend forgets the capture once the driver says it is over. */
  if (ca__enter_primary(device, false, &pushed) == CUDA_SUCCESS) {
    ca_capture_ended((CUstream)(uintptr_t)stream, false);
    ca_driver_leave(pushed);
  }
}

/* A block the released graph held and the program freed: back to the pool
 * (the device has finished the graph's work), or, when that could not be
 * waited for, never handed out again while its segment lives. */
static void ca__graph_block_back(uint64_t addr, void *synced) {
  ca_registry_span where;
  if (!*(bool *)synced && ca_registry_find(addr, &where) && where.span.live)
    ca_pool_share(where.pool, addr);
  ca_intercept_free_pooled((CUdeviceptr)addr, NULL);
}

void ca_slot_graph_release(int graph) {
  int device = -1;
  uint64_t stream = 0;
  if (!ca_graphs_where(graph, &device, &stream))
    return;
  /* A replay may still run: wait for the device, as cudaFree would, unless
   * a capture under way forbids it. */
  bool pushed = false, synced = false;
  if (ca__enter_primary(device, false, &pushed) == CUDA_SUCCESS) {
    synced = !ca_capture_active() && CA_REAL(ctx_synchronize) == CUDA_SUCCESS;
    ca_driver_leave(pushed);
  }
  ca_graphs_release(graph, ca__graph_block_back, &synced);
}

/* ------------------------------------------------------------------------ */
/* Streams a block was used on besides its own                               */

/* Whether a live pooled block starts at `dptr`; *where says which. */
static bool ca__live_start(CUdeviceptr dptr, ca_registry_span *where) {
  return ca_registry_find((uint64_t)dptr, where) && where->span.live &&
         where->span.block.addr == (uint64_t)dptr;
}

/* A pooled block that is never handed out again while its segment lives
 * (ca_pool_share): what keeps a block safe when its other streams cannot
 * be waited for. */
static void ca__retire(CUdeviceptr dptr) {
  ca_registry_span where;
  if (ca__live_start(dptr, &where))
    ca_pool_share(where.pool, (uint64_t)dptr);
}

void ca_slot_record(CUdeviceptr dptr, CUstream stream) {
  ca_registry_span where;
  if (!ca_intercept_enabled() || !ca__live_start(dptr, &where))
    return; /* the driver's own memory waits at its free */
  if (!ca_recorded_add((uint64_t)dptr, (uint64_t)(uintptr_t)stream))
    ca__retire(dptr);
}

/* Orders `stream` (the block's own, where it is freed) after the work
 * queued so far on each stream the block was recorded on: an event on
 * each, waited for by `stream`. The free then goes to `stream`'s free
 * blocks, whose reuse is ordered after that work whichever stream reuses
 * it.
 * Where a wait cannot be set up, the block is retired instead. */
static void ca__after_recorded(CUdeviceptr dptr, int device, CUstream stream) {
  uint64_t others[CA_RECORDED_STREAMS];
  bool overflow = false, pushed = false;
  size_t n = ca_recorded_take((uint64_t)dptr, others, &overflow);
  if (n == 0 && !overflow)
    return;
  CUresult r = ca__enter_primary(device, false, &pushed);
  for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++) {
    CUstream other = (CUstream)(uintptr_t)others[i];
    CUevent ev = NULL;
    if (other == stream)
      continue;
    r = CA_REAL(event_create, &ev, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS)
      r = CA_REAL(event_record, ev, other);
    if (r == CUDA_SUCCESS)
      r = CA_REAL(stream_wait_event, stream, ev, 0);
    if (ev != NULL)
      CA_REAL(event_destroy, ev);
  }
  if (r == CUDA_SUCCESS && overflow)
    r = CA_REAL(ctx_synchronize);
  ca_driver_leave(pushed);
  if (r != CUDA_SUCCESS)
    ca__retire(dptr);
}

/* ------------------------------------------------------------------------ */
/* Requests and frees                                                        */

/* The pool of `device`'s primary context, or the reason there is none. */
static ca_pool *ca__pool(int device, CUresult *why) {
  bool made = false;
  ca_pool *pool = ca_registry_primary_pool(device, &made, why);
  if (made)
    ca_lifecycle_device_used();
  return pool;
}

/* Served as PyTorch's own allocator serves: on out of memory, every cached
 * block of the device is given back (the streams' free blocks, pending
 * frees, the device's other pools) and the request tried once more. */
static CUresult ca__serve(CUdeviceptr *dptr, size_t size, int device,
                          CUstream stream) {
  if (!ca_intercept_enabled())
    return ca__passed(device, dptr, size, 0);
  CUresult r = CUDA_SUCCESS;
  ca_pool *pool = ca__pool(device, &r);
  if (pool == NULL)
    return r == CUDA_ERROR_NOT_READY ? ca__passed(device, dptr, size, 0) : r;
  int graph = ca__graph_of(device, stream);
  if (graph)
    return ca__graph_alloc(pool, graph, dptr, size, stream);
  uint64_t s = (uint64_t)(uintptr_t)stream;
  r = ca_intercept_pooled(pool, size, &s, dptr);
  if (r == CUDA_ERROR_OUT_OF_MEMORY && ca_room_give_back(device))
    r = ca_intercept_pooled(pool, size, &s, dptr);
  return r;
}

CUresult ca_slot_alloc(CUdeviceptr *dptr, size_t size, int device,
                       CUstream stream, const char *then) {
  if (dptr == NULL || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = ca__serve(dptr, size, device, stream);
  if (r != CUDA_SUCCESS)
    ca__say_refused(r, size, device, then);
  return r;
}

CUresult ca_slot_free(CUdeviceptr dptr, int device, CUstream stream) {
  if (dptr == 0)
    return CUDA_SUCCESS;
  uint64_t s = (uint64_t)(uintptr_t)stream;
  if (ca_intercept_enabled()) {
    ca__after_recorded(dptr, device, stream);
    if (ca_graphs_freed((uint64_t)dptr) ||
        ca_intercept_free_pooled(dptr, &s))
      return CUDA_SUCCESS;
  }
  CUresult r = ca__passed(device, NULL, 0, dptr);
  if (r != CUDA_SUCCESS)
    ca_log("allocator slot: the free of %#llx on device %d failed: %s",
           (unsigned long long)dptr, device, ca_driver_error_name(r));
  return r;
}
