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
 * and its handler. CA_DRIVER_RANGED, a part of the list, holds the
 * memsets and copies.
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
  X(cuMemAlloc_v2, mem_alloc, (CUdeviceptr * dptr, size_t size),               \
    ca_on_mem_alloc(dptr, size))                                               \
  X(cuMemFree_v2, mem_free, (CUdeviceptr dptr), ca_on_mem_free(dptr))          \
  X(cuMemGetInfo_v2, mem_get_info, (size_t * free_bytes, size_t * total),      \
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
  X(cuMemFreeAsync, mem_free_async, (CUdeviceptr dptr, CUstream stream),       \
    ca_on_mem_free_async(dptr, stream, false))                                 \
  X(cuMemFreeAsync_ptsz, mem_free_async_ptsz,                                  \
    (CUdeviceptr dptr, CUstream stream),                                       \
    ca_on_mem_free_async(dptr, stream, true))                                  \
  X(cuMemCreate, mem_create,                                                   \
    (CUmemGenericAllocationHandle * handle, size_t size,                       \
     const CUmemAllocationProp *prop, unsigned long long flags),               \
    ca_on_mem_create(handle, size, prop, flags))                               \
  X(cuMemRelease, mem_release, (CUmemGenericAllocationHandle handle),          \
    ca_on_mem_release(handle))                                                 \
  X(cuDevicePrimaryCtxReset, device_primary_ctx_reset_v1, (CUdevice dev),      \
    ca_on_device_primary_ctx_reset(dev, true))                                 \
  X(cuDevicePrimaryCtxReset_v2, device_primary_ctx_reset, (CUdevice dev),      \
    ca_on_device_primary_ctx_reset(dev, false))                                \
  X(cuDevicePrimaryCtxRelease, device_primary_ctx_release_v1, (CUdevice dev),  \
    ca_on_device_primary_ctx_release(dev, true))                               \
  X(cuDevicePrimaryCtxRelease_v2, device_primary_ctx_release, (CUdevice dev),  \
    ca_on_device_primary_ctx_release(dev, false))                              \
  X(cuCtxDestroy_v2, ctx_destroy, (CUcontext ctx), ca_on_ctx_destroy(ctx))     \
  X(cuStreamBeginCapture, stream_begin_capture_v1, (CUstream stream),          \
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
  X(cuStreamCreate, stream_create, (CUstream * stream, unsigned int flags),    \
    ca_on_stream_create(stream, flags))                                        \
  X(cuStreamCreateWithPriority, stream_create_with_priority,                   \
    (CUstream * stream, unsigned int flags, int priority),                     \
    ca_on_stream_create_with_priority(stream, flags, priority))                \
  X(cuStreamDestroy, stream_destroy_v1, (CUstream stream),                     \
    ca_on_stream_destroy(stream, true))                                        \
  X(cuStreamDestroy_v2, stream_destroy, (CUstream stream),                     \
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
    ca__get_proc_address_v2(symbol, pfn, version, flags, status))              \
  CA_DRIVER_RANGED(X)

/* The memsets and copies that take a device range (every one of cuda.h 13
 * with a 64-bit device pointer: 1D, 2D and 3D, sync and async, peer and
 * batched, each with its _ptds or _ptsz twin), in the same shape: each
 * hook checks the ranges (ranges.h) before the driver's function runs;
 * CA_CHECKED(check, field, args) answers CUDA_ERROR_INVALID_VALUE, as the
 * driver would for its own allocation, when the check fails. */
#define CA_DRIVER_RANGED(X)                                                    \
  X(cuMemsetD8_v2, memset_d8, (CUdeviceptr dst, unsigned char uc, size_t n),   \
    CA_CHECKED(ca_range_ok(dst, n), memset_d8, (dst, uc, n)))                  \
  X(cuMemsetD8_v2_ptds, memset_d8_ptds,                                        \
    (CUdeviceptr dst, unsigned char uc, size_t n),                             \
    CA_CHECKED(ca_range_ok(dst, n), memset_d8_ptds, (dst, uc, n)))             \
  X(cuMemsetD8Async, memset_d8_async,                                          \
    (CUdeviceptr dst, unsigned char uc, size_t n, CUstream stream),            \
    CA_CHECKED(ca_range_ok(dst, n), memset_d8_async, (dst, uc, n, stream)))    \
  X(cuMemsetD8Async_ptsz, memset_d8_async_ptsz,                                \
    (CUdeviceptr dst, unsigned char uc, size_t n, CUstream stream),            \
    CA_CHECKED(ca_range_ok(dst, n), memset_d8_async_ptsz,                      \
               (dst, uc, n, stream)))                                          \
  X(cuMemsetD16_v2, memset_d16,                                                \
    (CUdeviceptr dst, unsigned short us, size_t n),                            \
    CA_CHECKED(ca_range_ok(dst, n * 2), memset_d16, (dst, us, n)))             \
  X(cuMemsetD16_v2_ptds, memset_d16_ptds,                                      \
    (CUdeviceptr dst, unsigned short us, size_t n),                            \
    CA_CHECKED(ca_range_ok(dst, n * 2), memset_d16_ptds, (dst, us, n)))        \
  X(cuMemsetD16Async, memset_d16_async,                                        \
    (CUdeviceptr dst, unsigned short us, size_t n, CUstream stream),           \
    CA_CHECKED(ca_range_ok(dst, n * 2), memset_d16_async,                      \
               (dst, us, n, stream)))                                          \
  X(cuMemsetD16Async_ptsz, memset_d16_async_ptsz,                              \
    (CUdeviceptr dst, unsigned short us, size_t n, CUstream stream),           \
    CA_CHECKED(ca_range_ok(dst, n * 2), memset_d16_async_ptsz,                 \
               (dst, us, n, stream)))                                          \
  X(cuMemsetD32_v2, memset_d32, (CUdeviceptr dst, unsigned int ui, size_t n),  \
    CA_CHECKED(ca_range_ok(dst, n * 4), memset_d32, (dst, ui, n)))             \
  X(cuMemsetD32_v2_ptds, memset_d32_ptds,                                      \
    (CUdeviceptr dst, unsigned int ui, size_t n),                              \
    CA_CHECKED(ca_range_ok(dst, n * 4), memset_d32_ptds, (dst, ui, n)))        \
  X(cuMemsetD32Async, memset_d32_async,                                        \
    (CUdeviceptr dst, unsigned int ui, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok(dst, n * 4), memset_d32_async,                      \
               (dst, ui, n, stream)))                                          \
  X(cuMemsetD32Async_ptsz, memset_d32_async_ptsz,                              \
    (CUdeviceptr dst, unsigned int ui, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok(dst, n * 4), memset_d32_async_ptsz,                 \
               (dst, ui, n, stream)))                                          \
  X(cuMemsetD2D8_v2, memset_d2d8,                                              \
    (CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width,            \
     size_t height),                                                           \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width, height), memset_d2d8,    \
               (dst, pitch, uc, width, height)))                               \
  X(cuMemsetD2D8_v2_ptds, memset_d2d8_ptds,                                    \
    (CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width,            \
     size_t height),                                                           \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width, height),                 \
               memset_d2d8_ptds, (dst, pitch, uc, width, height)))             \
  X(cuMemsetD2D8Async, memset_d2d8_async,                                      \
    (CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width,            \
     size_t height, CUstream stream),                                          \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width, height),                 \
               memset_d2d8_async, (dst, pitch, uc, width, height, stream)))    \
  X(cuMemsetD2D8Async_ptsz, memset_d2d8_async_ptsz,                            \
    (CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width,            \
     size_t height, CUstream stream),                                          \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width, height),                 \
               memset_d2d8_async_ptsz,                                         \
               (dst, pitch, uc, width, height, stream)))                       \
  X(cuMemsetD2D16_v2, memset_d2d16,                                            \
    (CUdeviceptr dst, size_t pitch, unsigned short us, size_t width,           \
     size_t height),                                                           \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 2, height),             \
               memset_d2d16, (dst, pitch, us, width, height)))                 \
  X(cuMemsetD2D16_v2_ptds, memset_d2d16_ptds,                                  \
    (CUdeviceptr dst, size_t pitch, unsigned short us, size_t width,           \
     size_t height),                                                           \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 2, height),             \
               memset_d2d16_ptds, (dst, pitch, us, width, height)))            \
  X(cuMemsetD2D16Async, memset_d2d16_async,                                    \
    (CUdeviceptr dst, size_t pitch, unsigned short us, size_t width,           \
     size_t height, CUstream stream),                                          \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 2, height),             \
               memset_d2d16_async, (dst, pitch, us, width, height, stream)))   \
  X(cuMemsetD2D16Async_ptsz, memset_d2d16_async_ptsz,                          \
    (CUdeviceptr dst, size_t pitch, unsigned short us, size_t width,           \
     size_t height, CUstream stream),                                          \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 2, height),             \
               memset_d2d16_async_ptsz,                                        \
               (dst, pitch, us, width, height, stream)))                       \
  X(cuMemsetD2D32_v2, memset_d2d32,                                            \
    (CUdeviceptr dst, size_t pitch, unsigned int ui, size_t width,             \
     size_t height),                                                           \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 4, height),             \
               memset_d2d32, (dst, pitch, ui, width, height)))                 \
  X(cuMemsetD2D32_v2_ptds, memset_d2d32_ptds,                                  \
    (CUdeviceptr dst, size_t pitch, unsigned int ui, size_t width,             \
     size_t height),                                                           \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 4, height),             \
               memset_d2d32_ptds, (dst, pitch, ui, width, height)))            \
  X(cuMemsetD2D32Async, memset_d2d32_async,                                    \
    (CUdeviceptr dst, size_t pitch, unsigned int ui, size_t width,             \
     size_t height, CUstream stream),                                          \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 4, height),             \
               memset_d2d32_async, (dst, pitch, ui, width, height, stream)))   \
  X(cuMemsetD2D32Async_ptsz, memset_d2d32_async_ptsz,                          \
    (CUdeviceptr dst, size_t pitch, unsigned int ui, size_t width,             \
     size_t height, CUstream stream),                                          \
    CA_CHECKED(ca_range_ok_pitched(dst, pitch, width * 4, height),             \
               memset_d2d32_async_ptsz,                                        \
               (dst, pitch, ui, width, height, stream)))                       \
  X(cuMemcpy, memcpy, (CUdeviceptr dst, CUdeviceptr src, size_t n),            \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy, (dst, src, n)))          \
  X(cuMemcpy_ptds, memcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n),  \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_ptds, (dst, src, n)))     \
  X(cuMemcpyAsync, memcpy_async,                                               \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_async,                    \
               (dst, src, n, stream)))                                         \
  X(cuMemcpyAsync_ptsz, memcpy_async_ptsz,                                     \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_async_ptsz,               \
               (dst, src, n, stream)))                                         \
  X(cuMemcpyHtoD_v2, memcpy_htod,                                              \
    (CUdeviceptr dst, const void *src, size_t n),                              \
    CA_CHECKED(ca_range_ok(dst, n), memcpy_htod, (dst, src, n)))               \
  X(cuMemcpyHtoD_v2_ptds, memcpy_htod_ptds,                                    \
    (CUdeviceptr dst, const void *src, size_t n),                              \
    CA_CHECKED(ca_range_ok(dst, n), memcpy_htod_ptds, (dst, src, n)))          \
  X(cuMemcpyDtoH_v2, memcpy_dtoh, (void *dst, CUdeviceptr src, size_t n),      \
    CA_CHECKED(ca_range_ok(src, n), memcpy_dtoh, (dst, src, n)))               \
  X(cuMemcpyDtoH_v2_ptds, memcpy_dtoh_ptds,                                    \
    (void *dst, CUdeviceptr src, size_t n),                                    \
    CA_CHECKED(ca_range_ok(src, n), memcpy_dtoh_ptds, (dst, src, n)))          \
  X(cuMemcpyDtoD_v2, memcpy_dtod,                                              \
    (CUdeviceptr dst, CUdeviceptr src, size_t n),                              \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_dtod, (dst, src, n)))     \
  X(cuMemcpyDtoD_v2_ptds, memcpy_dtod_ptds,                                    \
    (CUdeviceptr dst, CUdeviceptr src, size_t n),                              \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_dtod_ptds,                \
               (dst, src, n)))                                                 \
  X(cuMemcpyHtoDAsync_v2, memcpy_htod_async,                                   \
    (CUdeviceptr dst, const void *src, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok(dst, n), memcpy_htod_async, (dst, src, n, stream))) \
  X(cuMemcpyHtoDAsync_v2_ptsz, memcpy_htod_async_ptsz,                         \
    (CUdeviceptr dst, const void *src, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok(dst, n), memcpy_htod_async_ptsz,                    \
               (dst, src, n, stream)))                                         \
  X(cuMemcpyDtoHAsync_v2, memcpy_dtoh_async,                                   \
    (void *dst, CUdeviceptr src, size_t n, CUstream stream),                   \
    CA_CHECKED(ca_range_ok(src, n), memcpy_dtoh_async, (dst, src, n, stream))) \
  X(cuMemcpyDtoHAsync_v2_ptsz, memcpy_dtoh_async_ptsz,                         \
    (void *dst, CUdeviceptr src, size_t n, CUstream stream),                   \
    CA_CHECKED(ca_range_ok(src, n), memcpy_dtoh_async_ptsz,                    \
               (dst, src, n, stream)))                                         \
  X(cuMemcpyDtoDAsync_v2, memcpy_dtod_async,                                   \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_dtod_async,               \
               (dst, src, n, stream)))                                         \
  X(cuMemcpyDtoDAsync_v2_ptsz, memcpy_dtod_async_ptsz,                         \
    (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream),             \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_dtod_async_ptsz,          \
               (dst, src, n, stream)))                                         \
  X(cuMemcpyDtoA_v2, memcpy_dtoa,                                              \
    (CUarray dst, size_t dst_offset, CUdeviceptr src, size_t n),               \
    CA_CHECKED(ca_range_ok(src, n), memcpy_dtoa, (dst, dst_offset, src, n)))   \
  X(cuMemcpyAtoD_v2, memcpy_atod,                                              \
    (CUdeviceptr dst, CUarray src, size_t src_offset, size_t n),               \
    CA_CHECKED(ca_range_ok(dst, n), memcpy_atod, (dst, src, src_offset, n)))   \
  X(cuMemcpyDtoA_v2_ptds, memcpy_dtoa_ptds,                                    \
    (CUarray dst, size_t dst_offset, CUdeviceptr src, size_t n),               \
    CA_CHECKED(ca_range_ok(src, n), memcpy_dtoa_ptds,                          \
               (dst, dst_offset, src, n)))                                     \
  X(cuMemcpyAtoD_v2_ptds, memcpy_atod_ptds,                                    \
    (CUdeviceptr dst, CUarray src, size_t src_offset, size_t n),               \
    CA_CHECKED(ca_range_ok(dst, n), memcpy_atod_ptds,                          \
               (dst, src, src_offset, n)))                                     \
  X(cuMemcpyPeer, memcpy_peer,                                                 \
    (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,   \
     size_t n),                                                                \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_peer,                     \
               (dst, dst_ctx, src, src_ctx, n)))                               \
  X(cuMemcpyPeer_ptds, memcpy_peer_ptds,                                       \
    (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,   \
     size_t n),                                                                \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_peer_ptds,                \
               (dst, dst_ctx, src, src_ctx, n)))                               \
  X(cuMemcpyPeerAsync, memcpy_peer_async,                                      \
    (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,   \
     size_t n, CUstream stream),                                               \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_peer_async,               \
               (dst, dst_ctx, src, src_ctx, n, stream)))                       \
  X(cuMemcpyPeerAsync_ptsz, memcpy_peer_async_ptsz,                            \
    (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,   \
     size_t n, CUstream stream),                                               \
    CA_CHECKED(ca_range_ok_copy(dst, src, n), memcpy_peer_async_ptsz,          \
               (dst, dst_ctx, src, src_ctx, n, stream)))                       \
  X(cuMemcpy2D_v2, memcpy_2d, (const CUDA_MEMCPY2D *copy),                     \
    CA_CHECKED(ca_range_ok_2d(copy), memcpy_2d, (copy)))                       \
  X(cuMemcpy2D_v2_ptds, memcpy_2d_ptds, (const CUDA_MEMCPY2D *copy),           \
    CA_CHECKED(ca_range_ok_2d(copy), memcpy_2d_ptds, (copy)))                  \
  X(cuMemcpy2DUnaligned_v2, memcpy_2d_unaligned, (const CUDA_MEMCPY2D *copy),  \
    CA_CHECKED(ca_range_ok_2d(copy), memcpy_2d_unaligned, (copy)))             \
  X(cuMemcpy2DUnaligned_v2_ptds, memcpy_2d_unaligned_ptds,                     \
    (const CUDA_MEMCPY2D *copy),                                               \
    CA_CHECKED(ca_range_ok_2d(copy), memcpy_2d_unaligned_ptds, (copy)))        \
  X(cuMemcpy3D_v2, memcpy_3d, (const CUDA_MEMCPY3D *copy),                     \
    CA_CHECKED(ca_range_ok_3d(copy), memcpy_3d, (copy)))                       \
  X(cuMemcpy3D_v2_ptds, memcpy_3d_ptds, (const CUDA_MEMCPY3D *copy),           \
    CA_CHECKED(ca_range_ok_3d(copy), memcpy_3d_ptds, (copy)))                  \
  X(cuMemcpy2DAsync_v2, memcpy_2d_async,                                       \
    (const CUDA_MEMCPY2D *copy, CUstream stream),                              \
    CA_CHECKED(ca_range_ok_2d(copy), memcpy_2d_async, (copy, stream)))         \
  X(cuMemcpy2DAsync_v2_ptsz, memcpy_2d_async_ptsz,                             \
    (const CUDA_MEMCPY2D *copy, CUstream stream),                              \
    CA_CHECKED(ca_range_ok_2d(copy), memcpy_2d_async_ptsz, (copy, stream)))    \
  X(cuMemcpy3DAsync_v2, memcpy_3d_async,                                       \
    (const CUDA_MEMCPY3D *copy, CUstream stream),                              \
    CA_CHECKED(ca_range_ok_3d(copy), memcpy_3d_async, (copy, stream)))         \
  X(cuMemcpy3DAsync_v2_ptsz, memcpy_3d_async_ptsz,                             \
    (const CUDA_MEMCPY3D *copy, CUstream stream),                              \
    CA_CHECKED(ca_range_ok_3d(copy), memcpy_3d_async_ptsz, (copy, stream)))    \
  X(cuMemcpy3DPeer, memcpy_3d_peer, (const CUDA_MEMCPY3D_PEER *copy),          \
    CA_CHECKED(ca_range_ok_3d_peer(copy), memcpy_3d_peer, (copy)))             \
  X(cuMemcpy3DPeer_ptds, memcpy_3d_peer_ptds,                                  \
    (const CUDA_MEMCPY3D_PEER *copy),                                          \
    CA_CHECKED(ca_range_ok_3d_peer(copy), memcpy_3d_peer_ptds, (copy)))        \
  X(cuMemcpy3DPeerAsync, memcpy_3d_peer_async,                                 \
    (const CUDA_MEMCPY3D_PEER *copy, CUstream stream),                         \
    CA_CHECKED(ca_range_ok_3d_peer(copy), memcpy_3d_peer_async,                \
               (copy, stream)))                                                \
  X(cuMemcpy3DPeerAsync_ptsz, memcpy_3d_peer_async_ptsz,                       \
    (const CUDA_MEMCPY3D_PEER *copy, CUstream stream),                         \
    CA_CHECKED(ca_range_ok_3d_peer(copy), memcpy_3d_peer_async_ptsz,           \
               (copy, stream)))                                                \
  X(cuMemcpyBatchAsync, memcpy_batch_async_v1,                                 \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,     \
     CUmemcpyAttributes * attrs, size_t * attrs_idxs, size_t nattrs,           \
     size_t * fail_idx, CUstream stream),                                      \
    CA_CHECKED(ca_range_ok_batch(dsts, srcs, sizes, count, fail_idx),          \
               memcpy_batch_async_v1,                                          \
               (dsts, srcs, sizes, count, attrs, attrs_idxs, nattrs, fail_idx, \
                stream)))                                                      \
  X(cuMemcpyBatchAsync_ptsz, memcpy_batch_async_v1_ptsz,                       \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,     \
     CUmemcpyAttributes * attrs, size_t * attrs_idxs, size_t nattrs,           \
     size_t * fail_idx, CUstream stream),                                      \
    CA_CHECKED(ca_range_ok_batch(dsts, srcs, sizes, count, fail_idx),          \
               memcpy_batch_async_v1_ptsz,                                     \
               (dsts, srcs, sizes, count, attrs, attrs_idxs, nattrs, fail_idx, \
                stream)))                                                      \
  X(cuMemcpyBatchAsync_v2, memcpy_batch_async,                                 \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,     \
     CUmemcpyAttributes * attrs, size_t * attrs_idxs, size_t nattrs,           \
     CUstream stream),                                                         \
    CA_CHECKED(ca_range_ok_batch(dsts, srcs, sizes, count, NULL),              \
               memcpy_batch_async,                                             \
               (dsts, srcs, sizes, count, attrs, attrs_idxs, nattrs, stream))) \
  X(cuMemcpyBatchAsync_v2_ptsz, memcpy_batch_async_ptsz,                       \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,     \
     CUmemcpyAttributes * attrs, size_t * attrs_idxs, size_t nattrs,           \
     CUstream stream),                                                         \
    CA_CHECKED(ca_range_ok_batch(dsts, srcs, sizes, count, NULL),              \
               memcpy_batch_async_ptsz,                                        \
               (dsts, srcs, sizes, count, attrs, attrs_idxs, nattrs, stream))) \
  X(cuMemcpy3DBatchAsync, memcpy_3d_batch_async_v1,                            \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, size_t * fail_idx,            \
     unsigned long long flags, CUstream stream),                               \
    CA_CHECKED(ca_range_ok_3d_batch(count, ops, fail_idx),                     \
               memcpy_3d_batch_async_v1,                                       \
               (count, ops, fail_idx, flags, stream)))                         \
  X(cuMemcpy3DBatchAsync_ptsz, memcpy_3d_batch_async_v1_ptsz,                  \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, size_t * fail_idx,            \
     unsigned long long flags, CUstream stream),                               \
    CA_CHECKED(ca_range_ok_3d_batch(count, ops, fail_idx),                     \
               memcpy_3d_batch_async_v1_ptsz,                                  \
               (count, ops, fail_idx, flags, stream)))                         \
  X(cuMemcpy3DBatchAsync_v2, memcpy_3d_batch_async,                            \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, unsigned long long flags,     \
     CUstream stream),                                                         \
    CA_CHECKED(ca_range_ok_3d_batch(count, ops, NULL), memcpy_3d_batch_async,  \
               (count, ops, flags, stream)))                                   \
  X(cuMemcpy3DBatchAsync_v2_ptsz, memcpy_3d_batch_async_ptsz,                  \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, unsigned long long flags,     \
     CUstream stream),                                                         \
    CA_CHECKED(ca_range_ok_3d_batch(count, ops, NULL),                         \
               memcpy_3d_batch_async_ptsz, (count, ops, flags, stream)))

/* cuEventRecord, cuStreamWaitEvent and cuLaunchKernel, not their _ptsz
 * twins: the backend always names its stream (CU_STREAM_LEGACY or a
 * handle). */
#define CA_DRIVER_USED(X)                                                      \
  X(cuGetErrorName, get_error_name, (CUresult error, const char **name))       \
  X(cuCtxGetCurrent, ctx_get_current, (CUcontext * ctx))                       \
  X(cuCtxGetDevice, ctx_get_device, (CUdevice * device))                       \
  X(cuCtxSynchronize, ctx_synchronize, (void))                                 \
  X(cuCtxPushCurrent_v2, ctx_push_current, (CUcontext ctx))                    \
  X(cuCtxPopCurrent_v2, ctx_pop_current, (CUcontext * ctx))                    \
  X(cuDeviceGet, device_get, (CUdevice * device, int ordinal))                 \
  X(cuDeviceGetUuid_v2, device_get_uuid, (CUuuid * uuid, CUdevice dev))        \
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
    (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)) \
  X(cuMemHostAlloc, mem_host_alloc,                                            \
    (void **pp, size_t size, unsigned int flags))                              \
  X(cuModuleLoadData, module_load_data, (CUmodule * module, const void *image)) \
  X(cuModuleGetFunction, module_get_function,                                  \
    (CUfunction * fn, CUmodule module, const char *name))                      \
  X(cuLaunchKernel, launch_kernel,                                             \
    (CUfunction fn, unsigned int grid_x, unsigned int grid_y,                  \
     unsigned int grid_z, unsigned int block_x, unsigned int block_y,          \
     unsigned int block_z, unsigned int shared_bytes, CUstream stream,         \
     void **params, void **extra))

#endif /* CA_DRIVER_API_H */
