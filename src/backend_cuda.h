/*
 * The CUDA backend: the real driver functions, and the backend contract
 * (backend.h) implemented on top of them.
 *
 * This is the only part of the library that owns pointers to CUDA driver
 * functions. They are resolved once, lazily (never in a constructor, so a
 * process that never uses CUDA never loads libcuda because of us), from
 * libcuda.so.1, with the real dlsym, so that our own look-ups never meet our
 * dlsym replacement. The hook and intercept layers call the real functions
 * through ca_driver() when they pass a call through.
 */
#ifndef CA_BACKEND_CUDA_H
#define CA_BACKEND_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda.h>

#include "backend.h"

/* The real driver functions. A field is NULL when the loaded libcuda does not
 * export that function (an old driver, or a test's mock); every caller checks
 * before calling. `handle` is NULL when libcuda could not be loaded at all. */
typedef struct ca_driver_api {
  void *handle;

  /* The handled functions, each the exact export of the same name. */
  CUresult (*get_proc_address)(const char *symbol, void **pfn, int version,
                               cuuint64_t flags);
  CUresult (*get_proc_address_v2)(const char *symbol, void **pfn, int version,
                                  cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status);
  CUresult (*mem_alloc)(CUdeviceptr *dptr, size_t size);
  CUresult (*mem_free)(CUdeviceptr dptr);
  CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
  CUresult (*mem_alloc_pitch)(CUdeviceptr *dptr, size_t *pitch, size_t width,
                              size_t height, unsigned int element_size);
  CUresult (*mem_alloc_managed)(CUdeviceptr *dptr, size_t size,
                                unsigned int flags);
  CUresult (*mem_alloc_async)(CUdeviceptr *dptr, size_t size, CUstream stream);
  CUresult (*mem_alloc_async_ptsz)(CUdeviceptr *dptr, size_t size,
                                   CUstream stream);
  CUresult (*mem_alloc_from_pool_async)(CUdeviceptr *dptr, size_t size,
                                        CUmemoryPool pool, CUstream stream);
  CUresult (*mem_alloc_from_pool_async_ptsz)(CUdeviceptr *dptr, size_t size,
                                             CUmemoryPool pool,
                                             CUstream stream);
  CUresult (*mem_free_async)(CUdeviceptr dptr, CUstream stream);
  CUresult (*mem_free_async_ptsz)(CUdeviceptr dptr, CUstream stream);
  CUresult (*mem_create)(CUmemGenericAllocationHandle *handle, size_t size,
                         const CUmemAllocationProp *prop,
                         unsigned long long flags);
  CUresult (*mem_release)(CUmemGenericAllocationHandle handle);
  CUresult (*device_primary_ctx_reset_v1)(CUdevice device);
  CUresult (*device_primary_ctx_reset)(CUdevice device);
  CUresult (*device_primary_ctx_release_v1)(CUdevice device);
  CUresult (*ctx_destroy)(CUcontext ctx);
  CUresult (*stream_begin_capture_v1)(CUstream stream);
  CUresult (*stream_begin_capture_v1_ptsz)(CUstream stream);
  CUresult (*stream_begin_capture)(CUstream stream, CUstreamCaptureMode mode);
  CUresult (*stream_begin_capture_ptsz)(CUstream stream,
                                        CUstreamCaptureMode mode);
  CUresult (*stream_begin_capture_to_graph)(CUstream stream, CUgraph graph,
                                            const CUgraphNode *deps,
                                            const CUgraphEdgeData *edges,
                                            size_t ndeps,
                                            CUstreamCaptureMode mode);
  CUresult (*stream_begin_capture_to_graph_ptsz)(CUstream stream,
                                                 CUgraph graph,
                                                 const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges,
                                                 size_t ndeps,
                                                 CUstreamCaptureMode mode);
  CUresult (*stream_end_capture)(CUstream stream, CUgraph *graph);
  CUresult (*stream_end_capture_ptsz)(CUstream stream, CUgraph *graph);
  CUresult (*stream_create)(CUstream *stream, unsigned int flags);
  CUresult (*stream_create_with_priority)(CUstream *stream, unsigned int flags,
                                          int priority);
  CUresult (*stream_destroy_v1)(CUstream stream);
  CUresult (*stream_destroy)(CUstream stream);
  CUresult (*mem_get_address_range)(CUdeviceptr *base, size_t *size,
                                    CUdeviceptr dptr);
  CUresult (*pointer_get_attribute)(void *data, CUpointer_attribute attribute,
                                    CUdeviceptr ptr);
  CUresult (*pointer_get_attributes)(unsigned int n,
                                     CUpointer_attribute *attributes,
                                     void **data, CUdeviceptr ptr);
  CUresult (*pointer_set_attribute)(const void *value,
                                    CUpointer_attribute attribute,
                                    CUdeviceptr ptr);
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle *handle, CUdeviceptr dptr);
  CUresult (*mem_get_handle_for_address_range)(void *handle, CUdeviceptr dptr,
                                               size_t size,
                                               CUmemRangeHandleType type,
                                               unsigned long long flags);

  /* What the backend and the policy need besides. */
  CUresult (*ctx_get_current)(CUcontext *ctx);
  CUresult (*ctx_get_device)(CUdevice *device);
  CUresult (*ctx_synchronize)(void);
  CUresult (*ctx_push_current)(CUcontext ctx);
  CUresult (*ctx_pop_current)(CUcontext *ctx);
  CUresult (*device_get)(CUdevice *device, int ordinal);
  CUresult (*device_primary_ctx_retain)(CUcontext *ctx, CUdevice device);
  CUresult (*device_primary_ctx_release)(CUdevice device);
  CUresult (*device_primary_ctx_get_state)(CUdevice device,
                                           unsigned int *flags, int *active);
  CUresult (*stream_is_capturing)(CUstream stream,
                                  CUstreamCaptureStatus *status);
  CUresult (*get_error_name)(CUresult error, const char **name);
  /* The markers' events. cuEventRecord, not its _ptsz twin: the backend
   * always names its stream explicitly (CU_STREAM_LEGACY or a handle). */
  CUresult (*event_create)(CUevent *event, unsigned int flags);
  CUresult (*event_record)(CUevent event, CUstream stream);
  CUresult (*event_query)(CUevent event);
  CUresult (*event_synchronize)(CUevent event);
  CUresult (*event_destroy)(CUevent event);
  /* Fences (see ca_backend.fence): cuStreamWaitEvent, plain for the same
   * reason. */
  CUresult (*stream_wait_event)(CUstream stream, CUevent event,
                                unsigned int flags);
} ca_driver_api;

/* The real driver functions, resolved on the first call (thread-safe, and
 * with no lock held across the loader calls: see lazy.h). Never NULL; see
 * ca_driver_api for missing functions. */
const ca_driver_api *ca_driver(void);

/* What a call of a driver function the loaded driver lacks returns: only
 * reachable through our exports, by a program that never loaded a driver,
 * or one too old for the function. */
static inline CUresult ca_driver_missing(void) {
  return ca_driver()->handle == NULL ? CUDA_ERROR_NOT_INITIALIZED
                                     : CUDA_ERROR_NOT_FOUND;
}

/* Calls the real driver function `field` with the given arguments. */
#define CA_REAL(field, ...)                                                   \
  (ca_driver()->field != NULL ? ca_driver()->field(__VA_ARGS__)               \
                              : ca_driver_missing())

/* The real address of libcuda's export `name` (looked up in libcuda itself,
 * never through our dlsym), or NULL. */
void *ca_driver_symbol(const char *name);

/* The device of the calling thread's current context. Returns CUDA_SUCCESS
 * and stores it, or the driver's error (no context current, not
 * initialized). Never touches *device on failure. */
CUresult ca_driver_current_device(int *device);

/* Like ca_driver_current_device, also storing the current context. */
CUresult ca_driver_current(int *device, CUcontext *context);

/* The calling thread's current context alone (one driver call, not two):
 * CUDA_SUCCESS and the context, or the driver's error, or
 * CUDA_ERROR_INVALID_CONTEXT when none is current. */
CUresult ca_driver_current_context(CUcontext *context);

/* The primary context of `device` when it is active (call it before a
 * reset or a release, not after), else NULL. Keeps no reference. */
CUcontext ca_backend_cuda_primary_of(int device);

/* After a reset of `device`'s primary context: the handle the backend kept
 * for it is asked for again when next needed, and what the markers kept of
 * that context (its non-blocking streams, its spare events) is forgotten;
 * markers made in it count as passed (a reset context holds no work). */
void ca_backend_cuda_forget_primary(int device);

/* After a successful cuCtxDestroy of `ctx` (never a primary context): its
 * non-blocking streams and spare events are forgotten, and markers made in
 * it count as passed. Events of a dead context are never destroyed (the
 * handle may already name another context's event) nor reused. */
void ca_backend_cuda_context_destroyed(CUcontext ctx);

/* A context of `device` died and the pool goes with it: forgets every
 * spare event and every known stream of the device, whatever its context,
 * and makes its markers count as passed (forget still comes for each). The
 * two calls above already do this precisely, context by context; this one
 * is for the pool's own bookkeeping when it drops everything. */
void ca_backend_cuda_context_gone(int device);

/* The program's streams, as the hooks see them made and destroyed. Only
 * streams created with CU_STREAM_NON_BLOCKING are recorded, with the
 * context current at creation: an event recorded on CU_STREAM_LEGACY is
 * ordered after all prior work of every blocking stream of its context
 * (per-thread default streams included), so a marker needs one more event,
 * and a fence one more tie-in, only for each live non-blocking stream.
 * Call after a successful create. */
void ca_backend_cuda_stream_created(CUstream stream, unsigned int flags);

/* Destroys `stream` with the real cuStreamDestroy_v2 (`v1`: the plain
 * cuStreamDestroy export) and, when that succeeds, forgets it. A marker
 * being made holds the destroy back until its events are recorded, so no
 * event is ever recorded on a destroyed stream we know of. Returns the
 * driver's result. */
CUresult ca_backend_cuda_destroy_stream(CUstream stream, bool v1);

/* Stream captures, as the policy sees them begin and end. Synchronizing a
 * device invalidates every capture on it (measured on the H200, driver 580:
 * any capture mode, blocking or non-blocking stream, from any thread), and
 * no driver query finds a capture on a non-blocking stream, so the backend
 * is told. `stream` is the handle the program passed and `per_thread` whether
 * it was called through a _ptsz entry point (where stream 0 means the
 * calling thread's default stream). */
void ca_backend_cuda_capture_begun(CUstream stream, bool per_thread);

/* After an end-capture call, whatever it returned: forgets the capture if
 * the stream no longer captures. */
void ca_backend_cuda_capture_ended(CUstream stream, bool per_thread);

/* The backend over the real driver; the pool's production backend. Status
 * codes are CUresult; oom_code is CUDA_ERROR_OUT_OF_MEMORY. Its ctx is NULL:
 * calls then run in a context of the device they name. A copy whose ctx is
 * a CUcontext runs every call in that context (one per pool). */
const ca_backend *ca_backend_cuda(void);

/* The same backend, exported under this name for tests/e2e/e2e_streams.c
 * only (found with dlsym in a preloaded process): it makes markers on
 * request and counts the mock's events, whatever the pool does. */
__attribute__((visibility("default"))) const ca_backend *
ca_test_backend_cuda(void);

#endif /* CA_BACKEND_CUDA_H */
