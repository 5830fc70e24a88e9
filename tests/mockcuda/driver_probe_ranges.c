/*
 * driver_probe, part 4: what the driver answers a memset or a copy whose
 * range leaves the allocation its start lies in (every family: 1D, 2D, 3D,
 * sync and async, peer, batched), one that starts in a freed allocation or
 * past a requested end, a free during a capture of a pointer that is no
 * allocation, and how the driver aligns allocations of a few sizes.
 */
#define __CUDA_API_VERSION_INTERNAL 1 /* declares the _ptds / _ptsz names */
#include <cuda.h>

#include <stdio.h>
#include <string.h>

#include "driver_probe.h"

static unsigned char g_host[4096];

static void probe_memsets(CUdeviceptr p) {
  Q("range: cuMemsetD8 1000 B of a 1000 B block", cuMemsetD8_v2(p, 1, 1000));
  Q("range: cuMemsetD8 1016 B of a 1000 B block", cuMemsetD8_v2(p, 1, 1016));
  Q("range: cuMemsetD8 1001 B of a 1000 B block", cuMemsetD8_v2(p, 1, 1001));
  Q("range: cuMemsetD8 500 B from 500 B in", cuMemsetD8_v2(p + 500, 1, 500));
  Q("range: cuMemsetD8 501 B from 500 B in", cuMemsetD8_v2(p + 500, 1, 501));
  Q("range: cuMemsetD8 8 B from the requested end", cuMemsetD8_v2(p + 1000, 1, 8));
  Q("range: cuMemsetD8 0 B from the requested end", cuMemsetD8_v2(p + 1000, 1, 0));
  Q("range: cuMemsetD8 0 B past the block", cuMemsetD8_v2(p, 1, 0));
  Q("range: cuMemsetD16 500 of a 1000 B block", cuMemsetD16_v2(p, 1, 500));
  Q("range: cuMemsetD16 501 of a 1000 B block", cuMemsetD16_v2(p, 1, 501));
  Q("range: cuMemsetD32 250 of a 1000 B block", cuMemsetD32_v2(p, 1, 250));
  Q("range: cuMemsetD32 251 of a 1000 B block", cuMemsetD32_v2(p, 1, 251));
  Q("range: cuMemsetD8Async 1016 B", cuMemsetD8Async(p, 1, 1016, NULL));
  Q("range: cuMemsetD16Async 501", cuMemsetD16Async(p, 1, 501, NULL));
  Q("range: cuMemsetD32Async 251", cuMemsetD32Async(p, 1, 251, NULL));
  Q("range: cuMemsetD8_v2_ptds 1016 B", cuMemsetD8_v2_ptds(p, 1, 1016));
  Q("range: cuMemsetD8Async_ptsz 1016 B", cuMemsetD8Async_ptsz(p, 1, 1016, NULL));
  Q("range: cuMemsetD2D8 2 rows of 500 B, pitch 500", cuMemsetD2D8_v2(p, 500, 1, 500, 2));
  Q("range: cuMemsetD2D8 2 rows of 500 B, pitch 512", cuMemsetD2D8_v2(p, 512, 1, 500, 2));
  Q("range: cuMemsetD2D16 2 rows of 250, pitch 512", cuMemsetD2D16_v2(p, 512, 1, 250, 2));
  Q("range: cuMemsetD2D32 2 rows of 125, pitch 512", cuMemsetD2D32_v2(p, 512, 1, 125, 2));
  Q("range: cuMemsetD2D8Async 2 rows of 500 B, pitch 512", cuMemsetD2D8Async(p, 512, 1, 500, 2, NULL));
  cuCtxSynchronize();
}

static void probe_copies(CUcontext ctx, CUdeviceptr p, CUdeviceptr q) {
  Q("range: cuMemcpyHtoD 1000 B", cuMemcpyHtoD_v2(p, g_host, 1000));
  Q("range: cuMemcpyHtoD 1001 B", cuMemcpyHtoD_v2(p, g_host, 1001));
  Q("range: cuMemcpyDtoH 1001 B", cuMemcpyDtoH_v2(g_host, p, 1001));
  Q("range: cuMemcpyDtoH 1 B from the requested end", cuMemcpyDtoH_v2(g_host, p + 1000, 1));
  Q("range: cuMemcpyDtoD 1000 B", cuMemcpyDtoD_v2(q, p, 1000));
  Q("range: cuMemcpyDtoD 1001 B", cuMemcpyDtoD_v2(q, p, 1001));
  Q("range: cuMemcpyDtoD 1000 B to 8 B in", cuMemcpyDtoD_v2(q + 8, p, 1000));
  Q("range: cuMemcpyDtoD 1000 B from 8 B in", cuMemcpyDtoD_v2(q, p + 8, 1000));
  Q("range: cuMemcpy 1001 B", cuMemcpy(q, p, 1001));
  Q("range: cuMemcpy 1001 B from the host", cuMemcpy(q, (CUdeviceptr)g_host, 1001));
  Q("range: cuMemcpyAsync 1001 B", cuMemcpyAsync(q, p, 1001, NULL));
  Q("range: cuMemcpyHtoDAsync 1001 B", cuMemcpyHtoDAsync_v2(p, g_host, 1001, NULL));
  Q("range: cuMemcpyDtoHAsync 1001 B", cuMemcpyDtoHAsync_v2(g_host, p, 1001, NULL));
  Q("range: cuMemcpyDtoDAsync 1001 B", cuMemcpyDtoDAsync_v2(q, p, 1001, NULL));
  Q("range: cuMemcpyHtoD_v2_ptds 1001 B", cuMemcpyHtoD_v2_ptds(p, g_host, 1001));
  Q("range: cuMemcpyHtoDAsync_v2_ptsz 1001 B", cuMemcpyHtoDAsync_v2_ptsz(p, g_host, 1001, NULL));
  Q("range: cuMemcpyPeer 1000 B", cuMemcpyPeer(q, ctx, p, ctx, 1000));
  Q("range: cuMemcpyPeer 1001 B", cuMemcpyPeer(q, ctx, p, ctx, 1001));
  Q("range: cuMemcpyPeerAsync 1001 B", cuMemcpyPeerAsync(q, ctx, p, ctx, 1001, NULL));
  cuCtxSynchronize();
}

static void copy2d(const char *what, CUdeviceptr p, size_t pitch, size_t width, size_t height) {
  CUDA_MEMCPY2D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = g_host;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = p;
  c.dstPitch = pitch;
  c.WidthInBytes = width;
  c.Height = height;
  printf("range: cuMemcpy2D %s: %s\n", what, rc_name(cuMemcpy2D_v2(&c)));
  printf("range: cuMemcpy2DAsync %s: %s\n", what, rc_name(cuMemcpy2DAsync_v2(&c, NULL)));
  printf("range: cuMemcpy2DUnaligned %s: %s\n", what, rc_name(cuMemcpy2DUnaligned_v2(&c)));
  CUDA_MEMCPY3D d;
  memset(&d, 0, sizeof d);
  d.srcMemoryType = CU_MEMORYTYPE_HOST;
  d.srcHost = g_host;
  d.srcPitch = pitch;
  d.srcHeight = height;
  d.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  d.dstDevice = p;
  d.dstPitch = pitch;
  d.dstHeight = height;
  d.WidthInBytes = width;
  d.Height = height;
  d.Depth = 1;
  printf("range: cuMemcpy3D %s: %s\n", what, rc_name(cuMemcpy3D_v2(&d)));
  printf("range: cuMemcpy3DAsync %s: %s\n", what, rc_name(cuMemcpy3DAsync_v2(&d, NULL)));
  cuCtxSynchronize();
}

static void probe_batch(CUstream s, CUdeviceptr p, CUdeviceptr q, size_t n) {
  CUdeviceptr dsts[2] = {q, q}, srcs[2] = {p, p};
  size_t sizes[2] = {16, n}, idx = 0;
  CUmemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attr.srcLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
  attr.dstLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
  printf("range: cuMemcpyBatchAsync, its second copy %zu B: %s\n", n,
         rc_name(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, &attr, &idx, 1, s)));
  cuStreamSynchronize(s);
}

/* The smallest alignment, capped at 2 MiB, of three allocations of `size`
 * made one after another (held until all three are made). */
static void probe_alignment(const char *what, size_t size) {
  CUdeviceptr a[3] = {0, 0, 0};
  unsigned long long align = 2u << 20;
  for (int i = 0; i < 3; i++) {
    if (cuMemAlloc_v2(&a[i], size) != CUDA_SUCCESS)
      break;
    while (align > 1 && a[i] % align != 0)
      align /= 2;
  }
  printf("alignment of %s allocations: %llu\n", what, align);
  for (int i = 0; i < 3; i++)
    if (a[i])
      cuMemFree_v2(a[i]);
}

void probe_ranges(CUcontext ctx) {
  CUdeviceptr p = 0, q = 0, gone = 0, big = 0;
  CUstream s = NULL;
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  Q("range: cuMemAlloc(1000)", cuMemAlloc_v2(&p, 1000));
  Q("range: cuMemAlloc(1000) again", cuMemAlloc_v2(&q, 1000));
  Q("range: cuMemAlloc(1000) to free", cuMemAlloc_v2(&gone, 1000));
  Q("range: cuMemAlloc(64 KiB)", cuMemAlloc_v2(&big, 64u << 10));
  cuMemFree_v2(gone);
  probe_memsets(p);
  probe_copies(ctx, p, q);
  copy2d("2 rows of 500 B, pitch 500", p, 500, 500, 2);
  copy2d("2 rows of 500 B, pitch 512", p, 512, 500, 2);
  probe_batch(s, p, q, 1000);
  probe_batch(s, p, q, 1001);
  Q("range: cuMemcpyDtoD 1000 B from the 64 KiB block", cuMemcpyDtoD_v2(q, big, 1000));
  Q("range: cuMemcpyDtoD 1001 B from the 64 KiB block", cuMemcpyDtoD_v2(q, big, 1001));
  Q("range: cuMemsetD8 a freed block", cuMemsetD8_v2(gone, 1, 1000));
  Q("range: cuMemcpyDtoH from a freed block", cuMemcpyDtoH_v2(g_host, gone, 16));
  cuCtxSynchronize();
  cuMemFree_v2(p);
  cuMemFree_v2(q);
  cuMemFree_v2(big);

  /* A free of what is no allocation, during a global capture. */
  const char *labels[2] = {"cuMemFree(0xdead0000)", "cuMemFree(0)"};
  CUdeviceptr ptrs[2] = {0xdead0000, 0};
  for (int i = 0; i < 2; i++) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph g = NULL;
    cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    printf("capture global, %s: %s\n", labels[i], rc_name(cuMemFree_v2(ptrs[i])));
    cuStreamIsCapturing(s, &st);
    printf("capture global, %s: status after: %s\n", labels[i],
           st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active"
           : st == CU_STREAM_CAPTURE_STATUS_NONE ? "none" : "invalidated");
    cuStreamEndCapture(s, &g);
    if (g)
      cuGraphDestroy(g);
  }
  cuStreamDestroy_v2(s);

  probe_alignment("512 B", 512);
  probe_alignment("64 KiB", 64u << 10);
  probe_alignment("1 MiB - 512 B", (1u << 20) - 512);
  probe_alignment("1 MiB", 1u << 20);
  probe_alignment("1 MiB + 512 B", (1u << 20) + 512);
  probe_alignment("2 MiB - 512 B", (2u << 20) - 512);
  probe_alignment("2 MiB", 2u << 20);
  probe_alignment("2 MiB + 512 B", (2u << 20) + 512);
  probe_alignment("3 MiB", 3u << 20);
  probe_alignment("20 MiB", 20u << 20);
}
