/*
 * Checks the mock driver itself, so that an e2e failure under cudalloc can be
 * blamed on cudalloc: each rule the e2e programs (and cudalloc) rely on is
 * exercised here against the mock alone. Run with MOCKCUDA_MEM_MB=64.
 */
#define __CUDA_API_VERSION_INTERNAL 1 /* declares the _ptsz / legacy names */
#include <cuda.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>

#include "mockcuda.h"

static int failures;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      failures++;                                                 \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                               \
      fputc('\n', stderr);                                        \
    }                                                             \
  } while (0)

#define RC(call, want)                                                        \
  do {                                                                        \
    CUresult rc_ = (call);                                                    \
    CHECK(rc_ == (want), "%s returned %d, want %d", #call, (int)rc_, (int)(want)); \
  } while (0)

static mockcuda_counters counters(void) {
  mockcuda_counters c;
  mockcuda_get_counters(&c);
  return c;
}

/* Looks `base` up and checks the export it resolves to, by dladdr. */
static void *expect_proc(const char *base, int version, cuuint64_t flags, const char *want) {
  void *fn = (void *)1;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
  CUresult rc = cuGetProcAddress_v2(base, &fn, version, flags, &st);
  if (!want) { /* the driver's v2 answers success, with the reason in the status */
    CHECK(rc == CUDA_SUCCESS && fn == NULL && st != CU_GET_PROC_ADDRESS_SUCCESS,
          "%s@%d flags %llu: rc %d fn %p status %d, want not found", base, version,
          (unsigned long long)flags, rc, fn, (int)st);
    return NULL;
  }
  Dl_info info;
  int ok = rc == CUDA_SUCCESS && fn && st == CU_GET_PROC_ADDRESS_SUCCESS && dladdr(fn, &info) &&
           info.dli_sname && info.dli_saddr == fn && !strcmp(info.dli_sname, want);
  CHECK(ok, "%s@%d flags %llu -> rc %d, %s, want %s", base, version, (unsigned long long)flags,
        rc, rc == CUDA_SUCCESS && dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "?", want);
  return fn;
}

static void test_proc_address(void) {
  const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  void *a = expect_proc("cuMemAlloc", 13000, 0, "cuMemAlloc_v2");
  CHECK(a == (void *)cuMemAlloc_v2, "look-up differs from the linked address");
  expect_proc("cuMemAlloc", 13000, PT, "cuMemAlloc_v2"); /* no per-thread twin */
  expect_proc("cuMemFree", 12000, 0, "cuMemFree_v2");
  expect_proc("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2");
  expect_proc("cuMemAllocPitch", 13000, 0, "cuMemAllocPitch_v2");
  expect_proc("cuCtxDestroy", 13000, 0, "cuCtxDestroy_v2");
  expect_proc("cuCtxCreate", 13000, 0, "cuCtxCreate_v4");
  expect_proc("cuCtxCreate", 12000, 0, "cuCtxCreate_v3");
  expect_proc("cuCtxCreate", 11000, 0, "cuCtxCreate_v2");
  expect_proc("cuDevicePrimaryCtxRelease", 13000, 0, "cuDevicePrimaryCtxRelease_v2");
  void *async = expect_proc("cuMemAllocAsync", 13000, 0, "cuMemAllocAsync");
  void *async_pt = expect_proc("cuMemAllocAsync", 13000, PT, "cuMemAllocAsync_ptsz");
  CHECK(async != async_pt, "ptsz twin is the same function");
  expect_proc("cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync");
  expect_proc("cuMemFreeAsync", 13000, PT, "cuMemFreeAsync_ptsz");
  expect_proc("cuMemAllocFromPoolAsync", 13000, PT, "cuMemAllocFromPoolAsync_ptsz");
  expect_proc("cuEventRecord", 13000, PT, "cuEventRecord_ptsz");
  expect_proc("cuStreamCreateWithPriority", 13000, 0, "cuStreamCreateWithPriority");
  expect_proc("cuStreamDestroy", 13000, 0, "cuStreamDestroy_v2");
  expect_proc("cuStreamDestroy", 3020, 0, "cuStreamDestroy");
  expect_proc("cuStreamIsCapturing", 13000, PT, "cuStreamIsCapturing_ptsz");
  expect_proc("cuStreamBeginCapture", 13000, 0, "cuStreamBeginCapture_v2");
  expect_proc("cuMemcpyHtoD", 13000, PT, "cuMemcpyHtoD_v2_ptds");
  expect_proc("cuMemsetD8", 13000, 0, "cuMemsetD8_v2");
  expect_proc("cuMemsetD2D16", 13000, PT, "cuMemsetD2D16_v2_ptds");
  expect_proc("cuMemsetD32Async", 13000, PT, "cuMemsetD32Async_ptsz");
  expect_proc("cuMemcpy", 13000, PT, "cuMemcpy_ptds");
  expect_proc("cuMemcpy3DPeerAsync", 13000, 0, "cuMemcpy3DPeerAsync");
  expect_proc("cuMemcpyBatchAsync", 13000, PT, "cuMemcpyBatchAsync_v2_ptsz");
  expect_proc("cuMemcpyBatchAsync", 12080, 0, "cuMemcpyBatchAsync");
  expect_proc("cuMemcpy3DBatchAsync", 13000, 0, "cuMemcpy3DBatchAsync_v2");
  void *g1 = expect_proc("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
  void *g2 = expect_proc("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
  CHECK(g1 != g2, "cuGetProcAddress v1 and v2 are one function");
  expect_proc("cuGetProcAddress", 11020, 0, NULL); /* too old */
  expect_proc("cuMemAlloc", 3000, 0, NULL);        /* 32-bit v1: not simulated */
  expect_proc("cuMemAlloc_v2", 13000, 0, NULL);    /* export names are not base names */
  expect_proc("cuNoSuchFunction", 13000, 0, NULL);

  CUdriverProcAddressQueryResult st;
  void *fn = (void *)1;
  RC(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, &st), CUDA_SUCCESS);
  CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && fn == NULL, "status %d", (int)st);
  RC(cuGetProcAddress_v2("cuGetProcAddress", &fn, 11020, 0, &st), CUDA_SUCCESS);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "status %d", (int)st);
  /* Without a status, or through v1, a miss leaves *pfn as it was. */
  fn = (void *)1;
  RC(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, NULL), CUDA_SUCCESS);
  CHECK(fn == (void *)1, "v2 without status changed pfn");
  RC(cuGetProcAddress("cuNoSuchFunction", &fn, 13000, 0), CUDA_ERROR_NOT_FOUND);
  CHECK(fn == (void *)1, "v1 changed pfn on a miss");
  RC(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 13000,
                         CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL),
     CUDA_SUCCESS);
  CHECK(fn == (void *)cuMemAllocAsync_ptsz, "both stream flags: the per-thread twin wins");
  RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, NULL), CUDA_SUCCESS);
  RC(cuGetProcAddress("cuMemFree", &fn, 13000, 0), CUDA_SUCCESS);
  CHECK(fn == (void *)cuMemFree_v2, "v1 look-up of cuMemFree");
  RC(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 4, NULL), CUDA_ERROR_INVALID_VALUE);
}

static void test_memory(void) {
  mockcuda_counters c0 = counters();
  CUdeviceptr a, b, big;
  RC(cuMemAlloc_v2(&a, 1000), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&b, 1000), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&big, 3u << 20), CUDA_SUCCESS);
  CHECK(a % 512 == 0 && b % 512 == 0 && big % (2u << 20) == 0, "alignment a %llx b %llx big %llx",
        (unsigned long long)a, (unsigned long long)b, (unsigned long long)big);
  CHECK(a != b && (b >= a + 1000 || a >= b + 1000), "overlap");
  CHECK(mockcuda_owns(a, 1000) && !mockcuda_owns(a, 1001) && mockcuda_owns(a + 999, 1) &&
            mockcuda_owns(big + 1, (3u << 20) - 1) && !mockcuda_owns(a + 1000, 1),
        "owns");
  mockcuda_counters c1 = counters();
  CHECK(c1.mem_alloc == c0.mem_alloc + 3 && c1.live_allocs == c0.live_allocs + 3 &&
            c1.live_bytes == c0.live_bytes + 2000 + (3u << 20) &&
            c1.used_bytes == c0.used_bytes + 2048 + (4u << 20),
        "counters after 3 allocs: %llu allocs, %llu live, %llu bytes, %llu used",
        (unsigned long long)c1.mem_alloc, (unsigned long long)c1.live_allocs,
        (unsigned long long)c1.live_bytes, (unsigned long long)c1.used_bytes);

  /* Device memory holds data; out-of-range access is refused. */
  unsigned char buf[1000], out[1000];
  for (int i = 0; i < 1000; i++)
    buf[i] = (unsigned char)(i * 7);
  RC(cuMemsetD8_v2(a, 0xab, 1000), CUDA_SUCCESS);
  RC(cuMemcpyHtoD_v2(a + 10, buf, 500), CUDA_SUCCESS);
  RC(cuMemcpyDtoH_v2(out, a, 1000), CUDA_SUCCESS);
  CHECK(out[0] == 0xab && out[9] == 0xab && !memcmp(out + 10, buf, 500) && out[510] == 0xab &&
            out[999] == 0xab,
        "data round trip");
  RC(cuMemcpyDtoD_v2(b, a, 1000), CUDA_SUCCESS);
  RC(cuMemcpyDtoH_v2(buf, b, 1000), CUDA_SUCCESS);
  CHECK(!memcmp(out, buf, 1000), "device to device");
  RC(cuMemsetD8_v2(a, 0, 1001), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemcpyDtoH_v2(out, a + 1, 1000), CUDA_ERROR_INVALID_VALUE);

  CUdeviceptr base = 0;
  size_t size = 0;
  RC(cuMemGetAddressRange_v2(&base, &size, big + 12345), CUDA_SUCCESS);
  CHECK(base == big && size == (3u << 20), "address range %llx %zu", (unsigned long long)base, size);
  RC(cuMemGetAddressRange_v2(&base, &size, 0x1000), CUDA_ERROR_NOT_FOUND);

  /* Frees: exact bases only; everything else counts as unknown. */
  RC(cuMemFree_v2(a + 512), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemFree_v2(0xdead0000), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemFree_v2(a), CUDA_SUCCESS);
  RC(cuMemFree_v2(a), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemFree_v2(b), CUDA_SUCCESS);
  RC(cuMemFree_v2(0), CUDA_SUCCESS); /* a no-op, not an unknown pointer */
  mockcuda_counters c2 = counters();
  CHECK(c2.mem_free == c0.mem_free + 6 && c2.mem_free_unknown == c0.mem_free_unknown + 3,
        "free counters %llu %llu", (unsigned long long)c2.mem_free,
        (unsigned long long)c2.mem_free_unknown);

  /* The first freed address comes back first. */
  CUdeviceptr again;
  RC(cuMemAlloc_v2(&again, 1000), CUDA_SUCCESS);
  CHECK(again == a, "first fit: got %llx, want %llx", (unsigned long long)again,
        (unsigned long long)a);
  RC(cuMemFree_v2(again), CUDA_SUCCESS);

  /* Capacity: 64 MiB. cuMemGetInfo agrees with what is taken. */
  size_t fr, tot;
  RC(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  mockcuda_counters c3 = counters();
  CHECK(tot == (64u << 20) && fr == tot - c3.used_bytes, "info free %zu total %zu used %llu", fr,
        tot, (unsigned long long)c3.used_bytes);
  CUdeviceptr huge;
  RC(cuMemAlloc_v2(&huge, 65u << 20), CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr fill[64];
  int n = 0;
  while (n < 64 && cuMemAlloc_v2(&fill[n], 8u << 20) == CUDA_SUCCESS)
    n++;
  CHECK(n == 7, "fitted %d blocks of 8 MiB next to 4 MiB, want 7", n);
  RC(cuMemGetInfo_v2(&fr, &tot), CUDA_SUCCESS);
  CHECK(fr == (4u << 20), "free %zu when full", fr);
  CHECK(counters().oom == c0.oom + 2, "oom counter");
  while (n-- > 0)
    RC(cuMemFree_v2(fill[n]), CUDA_SUCCESS);
  RC(cuMemFree_v2(big), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&huge, 0), CUDA_ERROR_INVALID_VALUE);

  /* Pass-through kinds, all freed by cuMemFree_v2 or their own call. */
  CUdeviceptr p, q, r, s;
  size_t pitch;
  RC(cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 4), CUDA_SUCCESS);
  CHECK(pitch == 1024 && mockcuda_owns(p, 10240), "pitch %zu", pitch);
  RC(cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 3), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemAllocManaged(&q, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  RC(cuMemAllocAsync(&r, 4096, NULL), CUDA_SUCCESS);
  CUmemoryPool pool;
  RC(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
  RC(cuMemAllocFromPoolAsync_ptsz(&s, 4096, pool, NULL), CUDA_SUCCESS);
  RC(cuMemFree_v2(p), CUDA_SUCCESS);
  RC(cuMemFree_v2(q), CUDA_SUCCESS);
  RC(cuMemFree_v2(r), CUDA_SUCCESS); /* cudaFree takes async pointers */
  RC(cuMemFreeAsync_ptsz(s, NULL), CUDA_SUCCESS);
  RC(cuMemFreeAsync(s, NULL), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemAllocAsync_ptsz(&r, 4096, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  RC(cuMemFreeAsync(r, CU_STREAM_LEGACY), CUDA_SUCCESS);
  mockcuda_counters c4 = counters();
  CHECK(c4.alloc_pitch == c0.alloc_pitch + 2 && c4.alloc_managed == c0.alloc_managed + 1 &&
            c4.alloc_async == c0.alloc_async + 2 && c4.alloc_async_ptsz == c0.alloc_async_ptsz + 1 &&
            c4.alloc_from_pool_async_ptsz == c0.alloc_from_pool_async_ptsz + 1 &&
            c4.free_async == c0.free_async + 3 && c4.free_async_ptsz == c0.free_async_ptsz + 1 &&
            c4.free_async_unknown == c0.free_async_unknown + 1,
        "pass-through counters");
  CHECK(c4.live_allocs == c0.live_allocs && c4.used_bytes == c0.used_bytes,
        "live %llu used %llu after freeing everything", (unsigned long long)c4.live_allocs,
        (unsigned long long)c4.used_bytes);

  /* Physical allocations: granularity multiples, charged to capacity. */
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  RC(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  CUmemGenericAllocationHandle h;
  RC(cuMemCreate(&h, gran / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  RC(cuMemCreate(&h, gran * 2, &prop, 0), CUDA_SUCCESS);
  CHECK(counters().used_bytes == c0.used_bytes + gran * 2 && counters().live_handles == 1, "handle");
  RC(cuMemRelease(h), CUDA_SUCCESS);
  RC(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
}

/* The memset and copy families move the bytes they describe; range
 * refusals themselves are driver_probe's (driver_facts.txt). */
static void test_copies(void) {
  mockcuda_counters c0 = counters();
  CUdeviceptr a, b;
  unsigned char host[256], out[256];
  uint16_t h16[4];
  uint32_t h32[2];
  for (int i = 0; i < 256; i++)
    host[i] = (unsigned char)i;
  RC(cuMemAlloc_v2(&a, 256), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&b, 256), CUDA_SUCCESS);
  RC(cuMemsetD16_v2(a, 0x1234, 4), CUDA_SUCCESS);
  RC(cuMemsetD32Async_ptsz(a + 8, 0xdeadbeef, 2, NULL), CUDA_SUCCESS);
  RC(cuMemcpyDtoH_v2(h16, a, 8), CUDA_SUCCESS);
  RC(cuMemcpyDtoH_v2(h32, a + 8, 8), CUDA_SUCCESS);
  CHECK(h16[0] == 0x1234 && h16[3] == 0x1234 && h32[0] == 0xdeadbeef && h32[1] == 0xdeadbeef,
        "16- and 32-bit memsets");
  RC(cuMemsetD2D8_v2(a, 64, 0x7f, 10, 3), CUDA_SUCCESS);
  RC(cuMemcpy((CUdeviceptr)(uintptr_t)out, a, 256), CUDA_SUCCESS); /* unified: to the host */
  CHECK(out[0] == 0x7f && out[9] == 0x7f && out[10] == 0xad && out[64] == 0x7f &&
            out[137] == 0x7f,
        "2D memset rows");
  /* A 2D copy between pitches, then a 3D one of 2 layers of 2 rows. */
  CUDA_MEMCPY2D c2 = {.srcMemoryType = CU_MEMORYTYPE_HOST, .srcHost = host, .srcPitch = 16,
                      .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = b, .dstPitch = 64,
                      .WidthInBytes = 8, .Height = 4};
  RC(cuMemcpy2D_v2(&c2), CUDA_SUCCESS);
  CUDA_MEMCPY3D c3 = {.srcMemoryType = CU_MEMORYTYPE_UNIFIED, .srcDevice = b, .srcPitch = 64,
                      .srcHeight = 2, .dstMemoryType = CU_MEMORYTYPE_HOST, .dstHost = out,
                      .dstPitch = 8, .dstHeight = 2, .WidthInBytes = 8, .Height = 2, .Depth = 2};
  RC(cuMemcpy3DAsync_v2_ptsz(&c3, NULL), CUDA_SUCCESS);
  CHECK(out[0] == 0 && out[8] == 16 && out[16] == 32 && out[31] == 55, "2D and 3D copies");
  /* A batch is checked whole: its bad second copy stops its good first. */
  CUdeviceptr dsts[2] = {a, a}, srcs[2] = {b, b};
  size_t sizes[2] = {8, 257}, first = 0, fail = 99;
  CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
  RC(cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &first, 1, &fail, CU_STREAM_PER_THREAD),
     CUDA_ERROR_INVALID_VALUE);
  RC(cuMemcpyDtoH_v2(out, a, 1), CUDA_SUCCESS);
  CHECK(fail == 1 && out[0] == 0x7f, "batch: failIdx %zu, first byte %d", fail, out[0]);
  CUDA_MEMCPY3D_BATCH_OP op = {.src = {.type = CU_MEMCPY_OPERAND_TYPE_POINTER, .op.ptr.ptr = b},
                               .dst = {.type = CU_MEMCPY_OPERAND_TYPE_POINTER, .op.ptr.ptr = a},
                               .extent = {8, 1, 1},
                               .srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
  RC(cuMemcpy3DBatchAsync_v2(1, &op, 0, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  RC(cuMemcpyDtoH_v2(out, a, 8), CUDA_SUCCESS);
  CHECK(!memcmp(out, host, 8), "3D batch copy");
  RC(cuMemcpyDtoA_v2((CUarray)1, 0, a, 8), CUDA_ERROR_INVALID_VALUE); /* no arrays */
  RC(cuMemFree_v2(a), CUDA_SUCCESS);
  RC(cuMemFree_v2(b), CUDA_SUCCESS);
  mockcuda_counters c1 = counters();
  CHECK(c1.memset == c0.memset + 3 && c1.memcpy == c0.memcpy + 10 &&
            c1.ptsz_calls == c0.ptsz_calls + 2,
        "counters: %llu memsets, %llu copies", (unsigned long long)(c1.memset - c0.memset),
        (unsigned long long)(c1.memcpy - c0.memcpy));
}

static void test_contexts(void) {
  mockcuda_counters c0 = counters();
  CUcontext primary, cur, mine;
  RC(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
  RC(cuCtxCreate_v4(&mine, NULL, 0, 1), CUDA_SUCCESS);
  RC(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == mine, "a new context becomes current");
  CUdevice dev = -1;
  RC(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  CHECK(dev == 1, "device %d", dev);
  CUdeviceptr p;
  RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
  RC(cuCtxDestroy_v2(mine), CUDA_SUCCESS);
  CHECK(!mockcuda_owns(p, 1) && counters().live_allocs == c0.live_allocs,
        "a destroyed context frees its memory");
  RC(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  CHECK(cur == primary, "destroy pops the context");
  RC(cuCtxDestroy_v2(primary), CUDA_ERROR_INVALID_CONTEXT);

  /* Push/pop, and no context at all. */
  RC(cuCtxPopCurrent_v2(&cur), CUDA_SUCCESS);
  CHECK(cur == primary, "pop");
  RC(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  RC(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
  size_t fr, tot;
  RC(cuMemGetInfo_v2(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
  RC(cuCtxPushCurrent_v2(primary), CUDA_SUCCESS);

  /* The primary context dies with its last release, memory and all. */
  CUcontext p1;
  RC(cuDevicePrimaryCtxRetain(&p1, 1), CUDA_SUCCESS);
  RC(cuCtxPushCurrent_v2(p1), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
  RC(cuDevicePrimaryCtxRelease_v2(1), CUDA_SUCCESS);
  CHECK(!mockcuda_owns(p, 1), "released primary context kept its memory");
  RC(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  RC(cuDevicePrimaryCtxRelease_v2(1), CUDA_ERROR_INVALID_CONTEXT);
  RC(cuCtxPopCurrent_v2(NULL), CUDA_SUCCESS);
}

static void test_capture(void) {
  CUstream s, nb;
  CUgraph g;
  CUstreamCaptureStatus st;
  CUevent e;
  RC(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  RC(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuEventCreate(&e, 0), CUDA_SUCCESS);
  RC(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);

  /* Global mode: a synchronization invalidates the capture. */
  mockcuda_counters c0 = counters();
  RC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  RC(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "status %d", (int)st);
  RC(cuStreamIsCapturing(NULL, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  RC(cuStreamIsCapturing_ptsz(NULL, &st), CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_NONE, "per-thread stream status %d", (int)st);
  RC(cuEventRecord(e, s), CUDA_SUCCESS);
  CUdeviceptr p;
  RC(cuMemAllocAsync(&p, 4096, s), CUDA_SUCCESS); /* stream-ordered: legal */
  RC(cuMemFreeAsync(p, s), CUDA_SUCCESS);
  RC(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED, "status %d", (int)st);
  RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(g == NULL, "graph from an invalidated capture");
  CHECK(counters().capture_violations == c0.capture_violations + 1, "violations");

  /* Each unsafe call is refused in global mode. */
  RC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  RC(cuEventQuery(e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuEventSynchronize(e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuMemFree_v2(0xdead0000), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuStreamSynchronize(nb), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* e was last recorded into the first capture's graph; recorded again
   * outside any capture it is an ordinary event (see test_events). */
  RC(cuEventRecord(e, s), CUDA_SUCCESS);

  /* Relaxed mode allows them, but never waiting on the capture itself. */
  RC(cuStreamBeginCapture_v2_ptsz(nb, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  RC(cuStreamIsCapturing(NULL, &st), CUDA_SUCCESS); /* non-blocking: no implicit join */
  RC(cuEventQuery(e), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
  RC(cuMemFree_v2(p), CUDA_SUCCESS);
  RC(cuStreamSynchronize(s), CUDA_SUCCESS);
  RC(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuStreamEndCapture(nb, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  RC(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  RC(cuStreamEndCapture_ptsz(nb, &g), CUDA_SUCCESS);
  CHECK(g != NULL, "graph");

  /* A thread made relaxed may allocate during its own global capture, as
   * PyTorch's allocator does; a context-wide synchronization still breaks it. */
  RC(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  RC(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
  CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL, "previous mode %d", (int)m);
  RC(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
  RC(cuMemFree_v2(p), CUDA_SUCCESS);
  RC(cuEventQuery(e), CUDA_SUCCESS);
  RC(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
  RC(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  RC(cuStreamEndCapture(nb, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  /* The per-thread default stream can be captured. */
  RC(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  RC(cuStreamIsCapturing(CU_STREAM_PER_THREAD, &st), CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "status %d", (int)st);
  RC(cuStreamEndCapture(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);

  RC(cuEventRecord_ptsz(e, NULL), CUDA_SUCCESS);
  RC(cuEventQuery(e), CUDA_SUCCESS);
  RC(cuEventSynchronize(e), CUDA_SUCCESS);
  RC(cuStreamSynchronize_ptsz(NULL), CUDA_SUCCESS);
  RC(cuCtxSynchronize(), CUDA_SUCCESS);
  RC(cuEventDestroy_v2(e), CUDA_SUCCESS);
  RC(cuEventDestroy_v2(e), CUDA_ERROR_INVALID_HANDLE);
  RC(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(nb), CUDA_SUCCESS);
  /* The real driver crashes on a destroyed stream's handle: the mock ends
   * the process there too. */
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) {
    cuStreamSynchronize(s);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
        "a call on a destroyed stream did not end the process");
}

/* Events and streams as the markers of stream-ordered reuse use them:
 * counters by stream kind, delays, contexts, captures. */
static void test_event_counters(void) {
  CUstream blk, nb, prio;
  CUevent e;
  mockcuda_counters c0 = counters();
  RC(cuStreamCreate(&blk, 0), CUDA_SUCCESS);
  RC(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuStreamCreateWithPriority(&prio, CU_STREAM_NON_BLOCKING, -1), CUDA_SUCCESS);
  RC(cuStreamCreateWithPriority(&prio, 4, 0), CUDA_ERROR_INVALID_VALUE);
  RC(cuStreamCreateWithPriority(&prio, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  RC(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  RC(cuEventCreate(&e, 0x100), CUDA_ERROR_INVALID_VALUE);
  RC(cuEventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
  RC(cuEventRecord(e, NULL), CUDA_SUCCESS);
  RC(cuEventRecord_ptsz(e, NULL), CUDA_SUCCESS);
  RC(cuEventRecord(e, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  RC(cuEventRecord(e, blk), CUDA_SUCCESS);
  RC(cuEventRecord(e, nb), CUDA_SUCCESS);
  RC(cuEventRecord(e, prio), CUDA_SUCCESS);
  RC(cuEventRecord(e, prio), CUDA_SUCCESS);
  RC(cuEventRecord(e, (CUstream)0xdead0000), CUDA_ERROR_INVALID_HANDLE);
  mockcuda_counters c1 = counters();
  CHECK(c1.stream_create - c0.stream_create == 5 && c1.event_create - c0.event_create == 2,
        "creates: %llu streams, %llu events",
        (unsigned long long)(c1.stream_create - c0.stream_create),
        (unsigned long long)(c1.event_create - c0.event_create));
  CHECK(c1.event_record - c0.event_record == 9 &&
            c1.event_record_legacy - c0.event_record_legacy == 2 &&
            c1.event_record_per_thread - c0.event_record_per_thread == 2 &&
            c1.event_record_blocking - c0.event_record_blocking == 1 &&
            c1.event_record_nonblocking - c0.event_record_nonblocking == 3,
        "records: legacy %llu per-thread %llu blocking %llu non-blocking %llu",
        (unsigned long long)(c1.event_record_legacy - c0.event_record_legacy),
        (unsigned long long)(c1.event_record_per_thread - c0.event_record_per_thread),
        (unsigned long long)(c1.event_record_blocking - c0.event_record_blocking),
        (unsigned long long)(c1.event_record_nonblocking - c0.event_record_nonblocking));
  CHECK(mockcuda_stream_records(prio) == 2 && mockcuda_stream_records(nb) == 1 &&
            mockcuda_stream_records(blk) == 1 && mockcuda_stream_records(NULL) == 0,
        "per-stream records %llu %llu %llu", (unsigned long long)mockcuda_stream_records(prio),
        (unsigned long long)mockcuda_stream_records(nb),
        (unsigned long long)mockcuda_stream_records(blk));
  RC(cuEventDestroy_v2(e), CUDA_SUCCESS);
  RC(cuStreamDestroy(prio), CUDA_SUCCESS); /* the CUDA 2.0 export */
  RC(cuStreamDestroy_v2(prio), CUDA_ERROR_INVALID_HANDLE);
  CHECK(mockcuda_stream_records(prio) == 0, "a destroyed stream still counts records");
  RC(cuStreamDestroy_v2(nb), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(blk), CUDA_SUCCESS);
  CHECK(counters().stream_destroy - c1.stream_destroy == 4, "stream destroys");
}

static void test_event_delay(void) {
  CUstream a, b;
  CUevent ea, eb;
  RC(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuEventCreate(&ea, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  RC(cuEventCreate(&eb, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_SUCCESS); /* never recorded: complete */

  mockcuda_set_event_delay(2);
  mockcuda_counters c0 = counters();
  RC(cuEventRecord(ea, a), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_ERROR_NOT_READY);
  RC(cuEventQuery(ea), CUDA_ERROR_NOT_READY);
  RC(cuEventQuery(ea), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_SUCCESS);
  CHECK(counters().event_not_ready - c0.event_not_ready == 2, "not-ready answers");
  RC(cuEventRecord(ea, a), CUDA_SUCCESS); /* a new record is new work */
  RC(cuEventQuery(ea), CUDA_ERROR_NOT_READY);

  /* Pending until something waits: the event itself, its stream, the
   * context; another stream's synchronization does not help. */
  mockcuda_set_event_delay(-1);
  RC(cuEventRecord(ea, a), CUDA_SUCCESS);
  RC(cuEventRecord(eb, b), CUDA_SUCCESS);
  for (int i = 0; i < 5; i++)
    RC(cuEventQuery(ea), CUDA_ERROR_NOT_READY);
  RC(cuStreamSynchronize(b), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_ERROR_NOT_READY);
  RC(cuEventQuery(eb), CUDA_SUCCESS);
  RC(cuEventSynchronize(ea), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_SUCCESS);
  RC(cuEventRecord(ea, a), CUDA_SUCCESS);
  RC(cuEventRecord(eb, CU_STREAM_LEGACY), CUDA_SUCCESS);
  RC(cuCtxSynchronize(), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_SUCCESS);
  RC(cuEventQuery(eb), CUDA_SUCCESS);
  mockcuda_set_event_delay(0);
  RC(cuEventRecord(ea, a), CUDA_SUCCESS);
  RC(cuEventQuery(ea), CUDA_SUCCESS);
  RC(cuEventDestroy_v2(ea), CUDA_SUCCESS);
  RC(cuEventDestroy_v2(eb), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(a), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(b), CUDA_SUCCESS);
}

/* An event and the stream it is recorded on share one context; a destroyed
 * context's streams and events are invalid handles. */
static void test_event_contexts(void) {
  CUcontext primary, mine;
  CUstream s_primary, s_mine;
  CUevent e_primary, e_mine;
  RC(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
  RC(cuStreamCreate(&s_primary, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuEventCreate(&e_primary, 0), CUDA_SUCCESS);
  RC(cuCtxCreate_v4(&mine, NULL, 0, 0), CUDA_SUCCESS);
  RC(cuStreamCreate(&s_mine, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuEventCreate(&e_mine, 0), CUDA_SUCCESS);
  RC(cuEventRecord(e_mine, s_primary), CUDA_ERROR_INVALID_HANDLE);
  RC(cuEventRecord(e_primary, CU_STREAM_LEGACY), CUDA_ERROR_INVALID_HANDLE);
  RC(cuEventRecord(e_primary, s_primary), CUDA_SUCCESS); /* the stream names its context */
  RC(cuEventRecord(e_mine, CU_STREAM_LEGACY), CUDA_SUCCESS);
  RC(cuEventRecord(e_mine, s_mine), CUDA_SUCCESS);
  RC(cuCtxDestroy_v2(mine), CUDA_SUCCESS);
  RC(cuEventQuery(e_mine), CUDA_ERROR_INVALID_HANDLE);
  RC(cuEventSynchronize(e_mine), CUDA_ERROR_INVALID_HANDLE);
  RC(cuEventRecord(e_primary, s_mine), CUDA_ERROR_INVALID_HANDLE);
  RC(cuStreamDestroy_v2(s_mine), CUDA_ERROR_INVALID_HANDLE);
  RC(cuEventDestroy_v2(e_mine), CUDA_ERROR_INVALID_HANDLE);
  RC(cuEventQuery(e_primary), CUDA_SUCCESS);
  RC(cuEventDestroy_v2(e_primary), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(s_primary), CUDA_SUCCESS);
}

/* Records during a capture: on the legacy stream, refused while a blocking
 * stream (the per-thread default stream included) captures, which breaks
 * the capture; allowed beside a non-blocking capture. An event recorded on
 * the capturing stream becomes part of the graph and cannot be queried. */
static void test_event_capture(void) {
  CUstream s, nb;
  CUevent e;
  CUgraph g;
  CUstreamCaptureStatus st;
  RC(cuStreamCreate(&s, 0), CUDA_SUCCESS);
  RC(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);

  mockcuda_counters c0 = counters();
  RC(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  RC(cuEventRecord(e, nb), CUDA_SUCCESS);
  RC(cuEventRecord(e, CU_STREAM_LEGACY), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  RC(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED, "status %d", (int)st);
  RC(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  mockcuda_counters c1 = counters();
  CHECK(c1.capture_violations == c0.capture_violations + 1 &&
            c1.event_record_legacy == c0.event_record_legacy,
        "legacy record during a blocking capture");

  RC(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  RC(cuEventRecord(e, CU_STREAM_LEGACY), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  RC(cuStreamEndCapture_ptsz(NULL, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  RC(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  RC(cuEventRecord(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
  RC(cuEventRecord(e, s), CUDA_SUCCESS);
  RC(cuEventRecord(e, nb), CUDA_SUCCESS); /* into the graph */
  RC(cuStreamIsCapturing(nb, &st), CUDA_SUCCESS);
  CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "status %d", (int)st);
  RC(cuStreamEndCapture(nb, &g), CUDA_SUCCESS);
  RC(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
  RC(cuEventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT);
  RC(cuEventRecord(e, nb), CUDA_SUCCESS);
  RC(cuEventQuery(e), CUDA_SUCCESS);
  RC(cuEventDestroy_v2(e), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(s), CUDA_SUCCESS);
  RC(cuStreamDestroy_v2(nb), CUDA_SUCCESS);
}

static void *thread_main(void *arg) {
  CUcontext ctx = arg;
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    return (void *)1;
  for (int i = 0; i < 2000; i++) {
    CUdeviceptr p;
    size_t n = 256 + (size_t)(i % 17) * 1000;
    if (cuMemAlloc_v2(&p, n) != CUDA_SUCCESS || !mockcuda_owns(p, n) ||
        cuMemsetD8_v2(p, (unsigned char)i, n) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS)
      return (void *)1;
  }
  return NULL;
}

static void test_threads(CUcontext ctx) {
  mockcuda_counters c0 = counters();
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, thread_main, ctx);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    CHECK(r == NULL, "thread %d failed", i);
  }
  mockcuda_counters c1 = counters();
  CHECK(c1.mem_alloc == c0.mem_alloc + 8000 && c1.mem_free == c0.mem_free + 8000 &&
            c1.live_allocs == c0.live_allocs,
        "threads: %llu allocs", (unsigned long long)(c1.mem_alloc - c0.mem_alloc));
}

/* A kernel's stores and loads reach the allocation's bytes, which the
 * driver's copies then see, and stop at the allocation's end. */
static void test_kernel_access(void) {
  CUdeviceptr a;
  unsigned char out[8], in[4] = {1, 2, 3, 4};
  RC(cuMemAlloc_v2(&a, 1000), CUDA_SUCCESS);
  RC(cuMemsetD8_v2(a, 0xee, 1000), CUDA_SUCCESS);
  CHECK(mockcuda_kernel_write(a + 996, in, 4) == 0, "a store of the last 4 bytes");
  RC(cuMemcpyDtoH_v2(out, a + 992, 8), CUDA_SUCCESS);
  CHECK(out[3] == 0xee && out[4] == 1 && out[7] == 4, "the store seen by a copy");
  CHECK(mockcuda_kernel_read(a + 995, out, 2) == 0 && out[0] == 0xee && out[1] == 1,
        "a load");
  CHECK(mockcuda_kernel_write(a + 997, in, 4) == -1, "a store past the allocation's end");
  CHECK(mockcuda_kernel_read(a, out, 0) == -1, "an empty load");
  RC(cuMemFree_v2(a), CUDA_SUCCESS);
  CHECK(mockcuda_kernel_write(a, in, 1) == -1, "a store into freed memory");
}

int main(void) {
  CUdeviceptr p;
  int v = 0, n = 0;
  RC(cuMemAlloc_v2(&p, 256), CUDA_ERROR_NOT_INITIALIZED);
  RC(cuDriverGetVersion(&v), CUDA_SUCCESS);
  CHECK(v == 13000, "version %d", v);
  test_proc_address(); /* before cuInit, as the runtime may */
  RC(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  RC(cuInit(0), CUDA_SUCCESS);
  RC(cuInit(0), CUDA_SUCCESS);
  RC(cuDeviceGetCount(&n), CUDA_SUCCESS);
  CHECK(n == 2, "devices %d", n);
  CUdevice dev;
  RC(cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  RC(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  char name[64];
  RC(cuDeviceGetName(name, sizeof name, dev), CUDA_SUCCESS);
  size_t total = 0;
  RC(cuDeviceTotalMem_v2(&total, dev), CUDA_SUCCESS);
  CHECK(total == (64u << 20), "total %zu (run with MOCKCUDA_MEM_MB=64)", total);
  RC(cuMemAlloc_v2(&p, 256), CUDA_ERROR_INVALID_CONTEXT);

  mockcuda_set_event_delay(0); /* events complete at once, whatever the environment */
  CUcontext ctx;
  RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  test_memory();
  test_copies();
  test_kernel_access();
  test_contexts();
  test_capture();
  test_event_counters();
  test_event_delay();
  test_event_contexts();
  test_event_capture();
  test_threads(ctx);

  const char *s = NULL;
  RC(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
  CHECK(s && !strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY"), "name %s", s ? s : "(null)");
  RC(cuGetErrorString((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  RC(cuDevicePrimaryCtxRelease_v2(0), CUDA_SUCCESS);

  printf("%s mockcuda_selftest: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
