/*
 * Every driver function the library touches, listed once. Everything else
 * is generated from these two lists: the real-function table and its
 * resolution (driver.c), the hooks, their exports, the dlsym and
 * cuGetProcAddress routes (hooks.c), and the mock driver's coverage check
 * (tests/mockcuda/mockcuda_coverage.c).
 *
 * CA_DRIVER_HOOKED(X): the functions the library handles. Each row is
 *   X(export, field, params, call)
 * export  libcuda's exported name, exactly (the _v2 or _ptsz variant);
 * field   its slot in ca_driver_api (driver.h);
 * params  its prototype's parameters, as cuda.h 13 declares them;
 * call    what the hook returns: the policy's handler (intercept.h,
 *         pointer.h), or the hooks' own look-up for cuGetProcAddress.
 *         Only hooks.c expands it.
 * Every one returns CUresult. Adding a handled function is one row here
 * and its handler.
 *
 * CA_DRIVER_USED(X): what the library calls but never hooks (the
 * backend's contexts, events and streams), as X(export, field, params).
 *
 * The export names are the variants themselves: cuda.h maps some plain
 * names to their _v2 (cuGetProcAddress, cuStreamBeginCapture,
 * cuDevicePrimaryCtxReset, cuDevicePrimaryCtxRelease, cuStreamDestroy),
 * and a file that pastes or declares an export (hooks.c) undefines those
 * maps first. Stringized (#export) they are always what is written.
 */
#ifndef CA_DRIVER_API_H
#define CA_DRIVER_API_H

#define CA_DRIVER_HOOKED(X)                                                    \
  X(cuMemAlloc_v2, mem_alloc, (CUdeviceptr * dptr, size_t size),              \
    ca_on_mem_alloc(dptr, size))                                               \
  X(cuMemFree_v2, mem_free, (CUdeviceptr dptr), ca_on_mem_free(dptr))         \
  X(cuMemGetInfo_v2, mem_get_info, (size_t * free_bytes, size_t * total),     \
    ca_on_mem_get_info(free_bytes, total))                                     \
  X(cuMemAllocPitch_v2, mem_alloc_pitch,                                       \
    (CUdeviceptr * dptr, size_t * pitch, size_t width, size_t height,          \
     unsigned int element_size),                                               \
    ca_on_mem_alloc_pitch(dptr, pitch, width, height, element_size))           \
  X(cuMemAllocManaged, mem_alloc_managed,                                      \
    (CUdeviceptr * dptr, size_t size, unsigned int flags),                     \
    ca_on_mem_alloc_managed(dptr, size, flags))                                \
  X(cuMemAllocAsync, mem_alloc_async,                                          \
    (CUdeviceptr * dptr, size_t size, CUstream stream),                        \
    ca_on_mem_alloc_async(dptr, size, stream, false))                          \
  X(cuMemAllocAsync_ptsz, mem_alloc_async_ptsz,                                \
    (CUdeviceptr * dptr, size_t size, CUstream stream),                        \
    ca_on_mem_alloc_async(dptr, size, stream, true))                           \
  X(cuMemAllocFromPoolAsync, mem_alloc_from_pool_async,                        \
    (CUdeviceptr * dptr, size_t size, CUmemoryPool pool, CUstream stream),     \
    ca_on_mem_alloc_from_pool_async(dptr, size, pool, stream, false))          \
  X(cuMemAllocFromPoolAsync_ptsz, mem_alloc_from_pool_async_ptsz,              \
    (CUdeviceptr * dptr, size_t size, CUmemoryPool pool, CUstream stream),     \
    ca_on_mem_alloc_from_pool_async(dptr, size, pool, stream, true))           \
  X(cuMemFreeAsync, mem_free_async, (CUdeviceptr dptr, CUstream stream),      \
    ca_on_mem_free_async(dptr, stream, false))                                 \
  X(cuMemFreeAsync_ptsz, mem_free_async_ptsz,                                  \
    (CUdeviceptr dptr, CUstream stream),                                       \
    ca_on_mem_free_async(dptr, stream, true))                                  \
  X(cuMemCreate, mem_create,                                                   \
    (CUmemGenericAllocationHandle * handle, size_t size,                       \
     const CUmemAllocationProp *prop, unsigned long long flags),               \
    ca_on_mem_create(handle, size, prop, flags))                               \
  X(cuMemRelease, mem_release, (CUmemGenericAllocationHandle handle),         \
    ca_on_mem_release(handle))                                                 \
  X(cuDevicePrimaryCtxReset, device_primary_ctx_reset_v1, (CUdevice dev),     \
    ca_on_device_primary_ctx_reset(dev, true))                                 \
  X(cuDevicePrimaryCtxReset_v2, device_primary_ctx_reset, (CUdevice dev),     \
    ca_on_device_primary_ctx_reset(dev, false))                                \
  X(cuDevicePrimaryCtxRelease, device_primary_ctx_release_v1, (CUdevice dev), \
    ca_on_device_primary_ctx_release(dev, true))                               \
  X(cuDevicePrimaryCtxRelease_v2, device_primary_ctx_release, (CUdevice dev), \
    ca_on_device_primary_ctx_release(dev, false))                              \
  X(cuCtxDestroy_v2, ctx_destroy, (CUcontext ctx), ca_on_ctx_destroy(ctx))    \
  X(cuStreamBeginCapture, stream_begin_capture_v1, (CUstream stream),         \
    ca_on_stream_begin_capture_v1(stream, false))                              \
  X(cuStreamBeginCapture_ptsz, stream_begin_capture_v1_ptsz,                   \
    (CUstream stream), ca_on_stream_begin_capture_v1(stream, true))            \
  X(cuStreamBeginCapture_v2, stream_begin_capture,                             \
    (CUstream stream, CUstreamCaptureMode mode),                               \
    ca_on_stream_begin_capture(stream, mode, false))                           \
  X(cuStreamBeginCapture_v2_ptsz, stream_begin_capture_ptsz,                   \
    (CUstream stream, CUstreamCaptureMode mode),                               \
    ca_on_stream_begin_capture(stream, mode, true))                            \
  X(cuStreamBeginCaptureToGraph, stream_begin_capture_to_graph,                \
    (CUstream stream, CUgraph graph, const CUgraphNode *deps,                  \
     const CUgraphEdgeData *edges, size_t ndeps, CUstreamCaptureMode mode),    \
    ca_on_stream_begin_capture_to_graph(stream, graph, deps, edges, ndeps,     \
                                        mode, false))                          \
  X(cuStreamBeginCaptureToGraph_ptsz, stream_begin_capture_to_graph_ptsz,      \
    (CUstream stream, CUgraph graph, const CUgraphNode *deps,                  \
     const CUgraphEdgeData *edges, size_t ndeps, CUstreamCaptureMode mode),    \
    ca_on_stream_begin_capture_to_graph(stream, graph, deps, edges, ndeps,     \
                                        mode, true))                           \
  X(cuStreamEndCapture, stream_end_capture,                                    \
    (CUstream stream, CUgraph * graph),                                        \
    ca_on_stream_end_capture(stream, graph, false))                            \
  X(cuStreamEndCapture_ptsz, stream_end_capture_ptsz,                          \
    (CUstream stream, CUgraph * graph),                                        \
    ca_on_stream_end_capture(stream, graph, true))                             \
  X(cuStreamCreate, stream_create, (CUstream * stream, unsigned int flags),   \
    ca_on_stream_create(stream, flags))                                        \
  X(cuStreamCreateWithPriority, stream_create_with_priority,                   \
    (CUstream * stream, unsigned int flags, int priority),                     \
    ca_on_stream_create_with_priority(stream, flags, priority))                \
  X(cuStreamDestroy, stream_destroy_v1, (CUstream stream),                    \
    ca_on_stream_destroy(stream, true))                                        \
  X(cuStreamDestroy_v2, stream_destroy, (CUstream stream),                    \
    ca_on_stream_destroy(stream, false))                                       \
  X(cuMemGetAddressRange_v2, mem_get_address_range,                            \
    (CUdeviceptr * base, size_t * size, CUdeviceptr dptr),                     \
    ca_on_mem_get_address_range(base, size, dptr))                             \
  X(cuPointerGetAttribute, pointer_get_attribute,                              \
    (void *data, CUpointer_attribute attribute, CUdeviceptr ptr),              \
    ca_on_pointer_get_attribute(data, attribute, ptr))                         \
  X(cuPointerGetAttributes, pointer_get_attributes,                            \
    (unsigned int n, CUpointer_attribute *attributes, void **data,             \
     CUdeviceptr ptr),                                                         \
    ca_on_pointer_get_attributes(n, attributes, data, ptr))                    \
  X(cuPointerSetAttribute, pointer_set_attribute,                              \
    (const void *value, CUpointer_attribute attribute, CUdeviceptr ptr),       \
    ca_on_pointer_set_attribute(value, attribute, ptr))                        \
  X(cuIpcGetMemHandle, ipc_get_mem_handle,                                     \
    (CUipcMemHandle * handle, CUdeviceptr dptr),                               \
    ca_on_ipc_get_mem_handle(handle, dptr))                                    \
  X(cuMemGetHandleForAddressRange, mem_get_handle_for_address_range,           \
    (void *handle, CUdeviceptr dptr, size_t size, CUmemRangeHandleType type,   \
     unsigned long long flags),                                                \
    ca_on_mem_get_handle_for_address_range(handle, dptr, size, type, flags))   \
  X(cuGetProcAddress, get_proc_address,                                        \
    (const char *symbol, void **pfn, int version, cuuint64_t flags),           \
    ca__get_proc_address(symbol, pfn, version, flags))                         \
  X(cuGetProcAddress_v2, get_proc_address_v2,                                  \
    (const char *symbol, void **pfn, int version, cuuint64_t flags,            \
     CUdriverProcAddressQueryResult *status),                                  \
    ca__get_proc_address_v2(symbol, pfn, version, flags, status))

/* cuEventRecord and cuStreamWaitEvent, not their _ptsz twins: the backend
 * always names its stream (CU_STREAM_LEGACY or a handle). */
#define CA_DRIVER_USED(X)                                                      \
  X(cuGetErrorName, get_error_name, (CUresult error, const char **name))     \
  X(cuCtxGetCurrent, ctx_get_current, (CUcontext * ctx))                       \
  X(cuCtxGetDevice, ctx_get_device, (CUdevice * device))                       \
  X(cuCtxSynchronize, ctx_synchronize, (void))                                 \
  X(cuCtxPushCurrent_v2, ctx_push_current, (CUcontext ctx))                    \
  X(cuCtxPopCurrent_v2, ctx_pop_current, (CUcontext * ctx))                    \
  X(cuDeviceGet, device_get, (CUdevice * device, int ordinal))                 \
  X(cuDevicePrimaryCtxRetain, device_primary_ctx_retain,                       \
    (CUcontext * ctx, CUdevice device))                                        \
  X(cuDevicePrimaryCtxGetState, device_primary_ctx_get_state,                  \
    (CUdevice device, unsigned int *flags, int *active))                       \
  X(cuThreadExchangeStreamCaptureMode, thread_exchange_stream_capture_mode,    \
    (CUstreamCaptureMode * mode))                                              \
  X(cuStreamIsCapturing, stream_is_capturing,                                  \
    (CUstream stream, CUstreamCaptureStatus * status))                         \
  X(cuEventCreate, event_create, (CUevent * event, unsigned int flags))        \
  X(cuEventRecord, event_record, (CUevent event, CUstream stream))             \
  X(cuEventQuery, event_query, (CUevent event))                                \
  X(cuEventSynchronize, event_synchronize, (CUevent event))                    \
  X(cuEventDestroy_v2, event_destroy, (CUevent event))                         \
  X(cuStreamWaitEvent, stream_wait_event,                                      \
    (CUstream stream, CUevent event, unsigned int flags))                      \
  X(cuMemGetAllocationGranularity, mem_get_allocation_granularity,             \
    (size_t * granularity, const CUmemAllocationProp *prop,                    \
     CUmemAllocationGranularity_flags option))                                 \
  X(cuMemAddressReserve, mem_address_reserve,                                  \
    (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr,       \
     unsigned long long flags))                                                \
  X(cuMemAddressFree, mem_address_free, (CUdeviceptr ptr, size_t size))        \
  X(cuMemMap, mem_map,                                                         \
    (CUdeviceptr ptr, size_t size, size_t offset,                              \
     CUmemGenericAllocationHandle handle, unsigned long long flags))           \
  X(cuMemUnmap, mem_unmap, (CUdeviceptr ptr, size_t size))                     \
  X(cuMemSetAccess, mem_set_access,                                            \
    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))

#endif /* CA_DRIVER_API_H */
