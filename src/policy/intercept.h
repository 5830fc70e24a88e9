/*
 * The policy: what happens to each handled driver call, once the hook layer
 * has caught it. Pooled (cuMemAlloc_v2, cuMemFree_v2), adjusted
 * (cuMemGetInfo_v2), or passed to the real driver and tracked (everything
 * else). With `enabled:0` every handler is a plain pass-through.
 *
 * Each handler has the driver function's contract: same arguments, same
 * result codes. The `ptsz` flag selects the per-thread-default-stream twin
 * of the real function, so a pass-through keeps the program's stream
 * semantics.
 */
#ifndef CA_INTERCEPT_H
#define CA_INTERCEPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "pool/pool.h"

CUresult ca_on_mem_alloc(CUdeviceptr *dptr, size_t size);
CUresult ca_on_mem_free(CUdeviceptr dptr);
/* What the allocator slot's policy (slot/slot.c) shares with this one. */
bool ca_intercept_enabled(void);

/* A trace was started at run time (cudalloc_trace_start): the chains of
 * layers around the pool are composed again, once, with its layer. */
void ca_intercept_trace_started(void);
/* Serves `size` bytes from `pool` through the stream-ordered chain of
 * concerns (on *stream when `stream` is not NULL: stream-ordered reuse). */
CUresult ca_intercept_pooled(ca_pool *pool, size_t size,
                             const uint64_t *stream, CUdeviceptr *dptr);
/* Gives a pooled block back through the same chain (on *stream when
 * named): whether one was live at `dptr`. */
bool ca_intercept_free_pooled(CUdeviceptr dptr, const uint64_t *stream);
/* A free no pool answered for: the driver's, in the current context. */
CUresult ca_intercept_free_unpooled(CUdeviceptr dptr);
CUresult ca_on_mem_get_info(size_t *free_bytes, size_t *total_bytes);
CUresult ca_on_mem_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width,
                               size_t height, unsigned int element_size);
CUresult ca_on_mem_alloc_managed(CUdeviceptr *dptr, size_t size,
                                 unsigned int flags);
CUresult ca_on_mem_alloc_async(CUdeviceptr *dptr, size_t size,
                               CUstream stream, bool ptsz);
CUresult ca_on_mem_alloc_from_pool_async(CUdeviceptr *dptr, size_t size,
                                         CUmemoryPool pool, CUstream stream,
                                         bool ptsz);
CUresult ca_on_mem_free_async(CUdeviceptr dptr, CUstream stream, bool ptsz);
CUresult ca_on_mem_create(CUmemGenericAllocationHandle *handle, size_t size,
                          const CUmemAllocationProp *prop,
                          unsigned long long flags);
CUresult ca_on_mem_release(CUmemGenericAllocationHandle handle);

/* Context deaths: passed through; when the driver has freed a context's
 * memory, the pool forgets the blocks that lived in it, reporting those the
 * program never freed. `v1` is cuDevicePrimaryCtxReset without _v2. */
CUresult ca_on_device_primary_ctx_reset(CUdevice dev, bool v1);
CUresult ca_on_device_primary_ctx_release(CUdevice dev, bool v1);
CUresult ca_on_ctx_destroy(CUcontext ctx);

/* Stream capture: passed through; the backend is told which captures are in
 * progress, so that it never synchronizes the device during one. `v1` is the
 * mode-less cuStreamBeginCapture of CUDA 10.0. */
CUresult ca_on_stream_begin_capture_v1(CUstream stream, bool ptsz);
CUresult ca_on_stream_begin_capture(CUstream stream, CUstreamCaptureMode mode,
                                    bool ptsz);
CUresult ca_on_stream_begin_capture_to_graph(CUstream stream, CUgraph graph,
                                             const CUgraphNode *deps,
                                             const CUgraphEdgeData *edges,
                                             size_t ndeps,
                                             CUstreamCaptureMode mode,
                                             bool ptsz);
CUresult ca_on_stream_end_capture(CUstream stream, CUgraph *graph, bool ptsz);

/* Streams: passed through; the backend records those created with
 * CU_STREAM_NON_BLOCKING (a marker records an event on each) and forgets
 * them when destroyed. `v1` is the plain cuStreamDestroy export, which
 * cuda.h maps to cuStreamDestroy_v2 for callers. */
CUresult ca_on_stream_create(CUstream *stream, unsigned int flags);
CUresult ca_on_stream_create_with_priority(CUstream *stream,
                                           unsigned int flags, int priority);
CUresult ca_on_stream_destroy(CUstream stream, bool v1);

#endif /* CA_INTERCEPT_H */
