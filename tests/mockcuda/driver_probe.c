/*
 * driver_probe: asks a driver the questions whose answers the mock
 * simulates, and prints one "question: answer" line each -- no addresses,
 * names or sizes that differ between machines. Run on a GPU against the real
 * libcuda.so.1, its output is driver_facts.txt; run here against the mock
 * (the mockcuda_fidelity test), it must print the same, so the mock's
 * semantics are the measured driver's and not our guesses.
 *
 * Build on a GPU machine: cc -std=c11 -D_GNU_SOURCE -I<cuda>/include
 *   -I../../src driver_probe*.c -o driver_probe -lcuda -ldl -lpthread
 */
#define __CUDA_API_VERSION_INTERNAL 1 /* declares the _ptsz / legacy names */
#include <cuda.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_probe.h"

const char *rc_name(CUresult r) {
  switch (r) {
#define N(c) \
  case c:    \
    return #c;
    N(CUDA_SUCCESS)
    N(CUDA_ERROR_INVALID_VALUE)
    N(CUDA_ERROR_OUT_OF_MEMORY)
    N(CUDA_ERROR_NOT_INITIALIZED)
    N(CUDA_ERROR_NO_DEVICE)
    N(CUDA_ERROR_INVALID_DEVICE)
    N(CUDA_ERROR_INVALID_CONTEXT)
    N(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    N(CUDA_ERROR_INVALID_HANDLE)
    N(CUDA_ERROR_NOT_FOUND)
    N(CUDA_ERROR_NOT_READY)
    N(CUDA_ERROR_ILLEGAL_STATE)
    N(CUDA_ERROR_NOT_SUPPORTED)
    N(CUDA_ERROR_NOT_PERMITTED)
    N(CUDA_ERROR_ALREADY_MAPPED)
    N(CUDA_ERROR_LAUNCH_FAILED)
    N(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    N(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    N(CUDA_ERROR_STREAM_CAPTURE_MERGE)
    N(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
    N(CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
    N(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    N(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    N(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
    N(CUDA_ERROR_CAPTURED_EVENT)
    N(CUDA_ERROR_ILLEGAL_ADDRESS)
    N(CUDA_ERROR_UNKNOWN)
#undef N
  default: {
    static char buf[32];
    snprintf(buf, sizeof buf, "CUresult(%d)", (int)r);
    return buf;
  }
  }
}

static const char *cap_name(CUstreamCaptureStatus s) {
  return s == CU_STREAM_CAPTURE_STATUS_NONE     ? "none"
         : s == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active"
                                                : "invalidated";
}

/* The export a look-up resolves to, by dladdr. */
static void gpa(const char *what, const char *sym, int ver, cuuint64_t flags) {
  void *fn = (void *)1;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
  CUresult r = cuGetProcAddress_v2(sym, &fn, ver, flags, &st);
  Dl_info info;
  const char *name = fn == NULL ? "NULL" : "?";
  if (fn && fn != (void *)1 && dladdr(fn, &info) && info.dli_sname && info.dli_saddr == fn)
    name = info.dli_sname;
  printf("gpa %s: %s status %d -> %s\n", what, rc_name(r), (int)st, name);
}

static CUstream g_capture_stream;
static void *other_thread_alloc(void *ctx) {
  CUdeviceptr p = 0;
  cuCtxSetCurrent(ctx);
  CUresult r = cuMemAlloc_v2(&p, 4096);
  printf("capture global, other thread: cuMemAlloc: %s\n", rc_name(r));
  if (r == CUDA_SUCCESS)
    cuMemFree_v2(p);
  return NULL;
}

/* Begins a capture of `s` in `mode`, runs the lines of `body`, reports the
 * capture's state and how it ended. */
#define CAPTURE(label, s, mode, body)                                                    \
  do {                                                                                 \
    CUstreamCaptureStatus st_ = CU_STREAM_CAPTURE_STATUS_NONE;                          \
    CUgraph g_ = NULL;                                                                 \
    const char *l_ = label;                                                            \
    CUresult b_ = cuStreamBeginCapture_v2(s, mode);                                    \
    printf("capture %s: begin: %s\n", l_, rc_name(b_));                                \
    body;                                                                              \
    cuStreamIsCapturing(s, &st_);                                                      \
    printf("capture %s: status after: %s\n", l_, cap_name(st_));                       \
    printf("capture %s: end: %s\n", l_, rc_name(cuStreamEndCapture(s, &g_)));          \
    if (g_)                                                                            \
      cuGraphDestroy(g_);                                                              \
  } while (0)
#define IN(label_call, call) printf("capture %s: %s: %s\n", l_, label_call, rc_name(call))

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 4 && strcmp(argv[1], "ipc-import") == 0)
    return probe_ipc_import(atoi(argv[2]), atoi(argv[3]));
  const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  CUdeviceptr p = 0, q = 0, r = 0;
  size_t fr, tot;

  /* Before cuInit. */
  Q("before init: cuMemAlloc", cuMemAlloc_v2(&p, 256));
  gpa("before init cuMemAlloc@13000", "cuMemAlloc", 13000, 0);
  Q("cuInit(1)", cuInit(1));
  Q("cuInit(0)", cuInit(0));

  /* cuGetProcAddress: variants, versions, flags. */
  gpa("cuMemAlloc@13000", "cuMemAlloc", 13000, 0);
  gpa("cuMemAlloc@13000 ptds", "cuMemAlloc", 13000, PT);
  gpa("cuMemAlloc_v2@13000", "cuMemAlloc_v2", 13000, 0);
  gpa("cuMemFree@12000", "cuMemFree", 12000, 0);
  gpa("cuMemGetInfo@13000", "cuMemGetInfo", 13000, 0);
  gpa("cuMemAllocPitch@13000", "cuMemAllocPitch", 13000, 0);
  gpa("cuCtxCreate@13000", "cuCtxCreate", 13000, 0);
  gpa("cuCtxCreate@12000", "cuCtxCreate", 12000, 0);
  gpa("cuCtxCreate@11000", "cuCtxCreate", 11000, 0);
  gpa("cuCtxDestroy@13000", "cuCtxDestroy", 13000, 0);
  gpa("cuDevicePrimaryCtxRelease@13000", "cuDevicePrimaryCtxRelease", 13000, 0);
  gpa("cuMemAllocAsync@13000", "cuMemAllocAsync", 13000, 0);
  gpa("cuMemAllocAsync@13000 ptds", "cuMemAllocAsync", 13000, PT);
  gpa("cuMemAllocAsync@13000 legacy", "cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  gpa("cuMemAllocAsync@13000 both", "cuMemAllocAsync", 13000, PT | CU_GET_PROC_ADDRESS_LEGACY_STREAM);
  gpa("cuMemAllocAsync@13000 flags 4", "cuMemAllocAsync", 13000, 4);
  gpa("cuMemAllocAsync@11010", "cuMemAllocAsync", 11010, 0);
  gpa("cuMemFreeAsync@13000 ptds", "cuMemFreeAsync", 13000, PT);
  gpa("cuMemAllocFromPoolAsync@13000 ptds", "cuMemAllocFromPoolAsync", 13000, PT);
  gpa("cuEventRecord@13000 ptds", "cuEventRecord", 13000, PT);
  gpa("cuStreamIsCapturing@13000 ptds", "cuStreamIsCapturing", 13000, PT);
  gpa("cuStreamSynchronize@13000 ptds", "cuStreamSynchronize", 13000, PT);
  gpa("cuStreamBeginCapture@13000", "cuStreamBeginCapture", 13000, 0);
  gpa("cuStreamBeginCapture@13000 ptds", "cuStreamBeginCapture", 13000, PT);
  gpa("cuStreamEndCapture@13000 ptds", "cuStreamEndCapture", 13000, PT);
  gpa("cuMemsetD8@13000", "cuMemsetD8", 13000, 0);
  gpa("cuMemsetD8@13000 ptds", "cuMemsetD8", 13000, PT);
  gpa("cuMemcpyHtoD@13000 ptds", "cuMemcpyHtoD", 13000, PT);
  gpa("cuMemcpyDtoH@13000 ptds", "cuMemcpyDtoH", 13000, PT);
  gpa("cuMemCreate@13000", "cuMemCreate", 13000, 0);
  gpa("cuGetProcAddress@11030", "cuGetProcAddress", 11030, 0);
  gpa("cuGetProcAddress@12000", "cuGetProcAddress", 12000, 0);
  gpa("cuGetProcAddress@11020", "cuGetProcAddress", 11020, 0);
  gpa("cuNoSuchFunction@13000", "cuNoSuchFunction", 13000, 0);
  gpa("cuThreadExchangeStreamCaptureMode@13000", "cuThreadExchangeStreamCaptureMode", 13000, 0);
  gpa("cuDevicePrimaryCtxGetState@13000", "cuDevicePrimaryCtxGetState", 13000, 0);
  {
    void *fn = (void *)1;
    printf("gpa v1 cuNoSuchFunction: %s, pfn %s\n",
           rc_name(cuGetProcAddress("cuNoSuchFunction", &fn, 13000, 0)),
           fn == (void *)1 ? "untouched" : fn ? "set" : "NULL");
    fn = (void *)1;
    printf("gpa v1 cuGetProcAddress@11020: %s, pfn %s\n",
           rc_name(cuGetProcAddress("cuGetProcAddress", &fn, 11020, 0)),
           fn == (void *)1 ? "untouched" : fn ? "set" : "NULL");
    fn = (void *)1;
    printf("gpa v2 cuNoSuchFunction, no status: %s, pfn %s\n",
           rc_name(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, NULL)),
           fn == (void *)1 ? "untouched" : fn ? "set" : "NULL");
    fn = (void *)1;
    printf("gpa v2 cuGetProcAddress@11020, no status: %s, pfn %s\n",
           rc_name(cuGetProcAddress_v2("cuGetProcAddress", &fn, 11020, 0, NULL)),
           fn == (void *)1 ? "untouched" : fn ? "set" : "NULL");
    fn = (void *)1;
    printf("gpa v2 flags 4, no status: %s, pfn %s\n",
           rc_name(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 4, NULL)),
           fn == (void *)1 ? "untouched" : fn ? "set" : "NULL");
  }

  /* Contexts. */
  CUdevice dev;
  int n = 0;
  Q("cuDeviceGet(count)", (cuDeviceGetCount(&n), cuDeviceGet(&dev, n)));
  Q("no context: cuMemAlloc", cuMemAlloc_v2(&p, 256));
  Q("no context: cuMemGetInfo", cuMemGetInfo_v2(&fr, &tot));
  Q("no context: cuCtxGetDevice", cuCtxGetDevice(&dev));
  Q("no context: cuCtxSynchronize", cuCtxSynchronize());
  Q("no context: cuCtxPopCurrent", cuCtxPopCurrent_v2(NULL));
  Q("no context: cuCtxSetCurrent(NULL)", cuCtxSetCurrent(NULL));
  Q("cuDevicePrimaryCtxRelease unretained", cuDevicePrimaryCtxRelease_v2(0));
  unsigned flags = 0;
  int active = -1;
  Q("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState(0, &flags, &active));
  printf("primary active before retain: %d\n", active);
  CUcontext ctx;
  Q("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain(&ctx, 0));
  cuDevicePrimaryCtxGetState(0, &flags, &active);
  printf("primary active after retain: %d\n", active);
  Q("cuCtxSetCurrent", cuCtxSetCurrent(ctx));
  Q("cuCtxDestroy(primary)", cuCtxDestroy_v2(ctx));
  CUcontext cur = NULL;
  cuCtxGetCurrent(&cur);
  printf("primary still current after cuCtxDestroy: %d\n", cur == ctx);
  cuCtxSetCurrent(ctx);

  /* Memory. */
  Q("cuMemAlloc(0)", cuMemAlloc_v2(&p, 0));
  Q("cuMemAlloc(NULL pointer)", cuMemAlloc_v2(NULL, 1000));
  Q("cuMemAlloc(1000)", cuMemAlloc_v2(&p, 1000));
  Q("cuMemAlloc(1000) again", cuMemAlloc_v2(&q, 1000));
  printf("1000 B blocks 512-aligned: %d, at least 1024 apart: %d\n", p % 512 == 0 && q % 512 == 0,
         (q > p ? q - p : p - q) >= 1024);
  Q("cuMemAlloc(3 MiB)", cuMemAlloc_v2(&r, 3u << 20));
  printf("3 MiB block 2 MiB-aligned: %d\n", r % (2u << 20) == 0);
  {
    CUdeviceptr base = 0;
    size_t size = 0;
    Q("cuMemGetAddressRange(interior)", cuMemGetAddressRange_v2(&base, &size, r + 12345));
    printf("address range of interior: base ok %d, size %zu\n", base == r, size);
    Q("cuMemGetAddressRange(0xdead0000)", cuMemGetAddressRange_v2(&base, &size, 0xdead0000));
  }
  Q("cuMemsetD8 whole block", cuMemsetD8_v2(p, 1, 1000));
  Q("cuMemsetD8 past a 3 MiB block's end", cuMemsetD8_v2(r, 1, (3u << 20) + (4u << 20)));
  {
    static unsigned char buf[8u << 20];
    Q("cuMemcpyDtoH past a 3 MiB block's end", cuMemcpyDtoH_v2(buf, r, (3u << 20) + (4u << 20)));
    Q("cuMemcpyHtoD from NULL", cuMemcpyHtoD_v2(p, NULL, 16));
  }
  Q("cuMemFree(interior)", cuMemFree_v2(p + 512));
  Q("cuMemFree(0xdead0000)", cuMemFree_v2(0xdead0000));
  Q("cuMemFree(0)", cuMemFree_v2(0));
  Q("cuMemFree(p)", cuMemFree_v2(p));
  Q("cuMemFree(p) again", cuMemFree_v2(p));
  cuMemFree_v2(q);
  cuMemFree_v2(r);
  {
    size_t pitch = 0;
    Q("cuMemAllocPitch(1000, 10, 4)", cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 4));
    printf("pitch of 1000 B rows: %zu\n", pitch);
    cuMemFree_v2(p);
    Q("cuMemAllocPitch(elem 3)", cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 3));
  }
  Q("cuMemAllocManaged(flags 0)", cuMemAllocManaged(&p, 4096, 0));
  Q("cuMemAllocManaged(global)", cuMemAllocManaged(&p, 4096, CU_MEM_ATTACH_GLOBAL));
  Q("cuMemFree(managed)", cuMemFree_v2(p));
  Q("cuMemAllocAsync", cuMemAllocAsync(&p, 4096, NULL));
  Q("cuMemFree(async pointer)", cuMemFree_v2(p));
  Q("cuMemAlloc for cuMemFreeAsync", cuMemAlloc_v2(&p, 4096));
  Q("cuMemFreeAsync(cuMemAlloc pointer)", cuMemFreeAsync(p, NULL));
  cuCtxSynchronize();
  Q("cuMemFreeAsync(0xdead0000)", cuMemFreeAsync(0xdead0000, NULL));
  Q("cuMemGetInfo(NULL, &total)", cuMemGetInfo_v2(NULL, &tot));
  {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("granularity: %zu\n", gran);
    CUmemGenericAllocationHandle h;
    Q("cuMemCreate(1 MiB)", cuMemCreate(&h, 1u << 20, &prop, 0));
    Q("cuMemCreate(2 MiB)", cuMemCreate(&h, 2u << 20, &prop, 0));
    Q("cuMemRelease", cuMemRelease(h));
    Q("cuMemRelease again", cuMemRelease(h));
  }

  /* Stream capture: which calls a capture refuses, and whether that breaks
   * the capture. */
  CUstream s, nb;
  CUevent e;
  cuStreamCreate(&s, 0);
  cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING);
  cuEventCreate(&e, 0);
  cuEventRecord(e, s);
  cuCtxSynchronize();
  g_capture_stream = s;
  Q("capture legacy stream: begin", cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
  {
    CUgraph g;
    Q("end capture of a stream not capturing", cuStreamEndCapture(s, &g));
  }
  CAPTURE("global blocking, legacy query", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    CUstreamCaptureStatus x = CU_STREAM_CAPTURE_STATUS_NONE;
    IN("cuStreamIsCapturing(legacy)", cuStreamIsCapturing(CU_STREAM_LEGACY, &x));
    IN("cuStreamIsCapturing(NULL)", cuStreamIsCapturing(NULL, &x));
    IN("cuStreamIsCapturing(per-thread)", cuStreamIsCapturing(CU_STREAM_PER_THREAD, &x));
    printf("capture %s: per-thread status: %s\n", l_, cap_name(x));
    IN("cuStreamIsCapturing_ptsz(NULL)", cuStreamIsCapturing_ptsz(NULL, &x));
  });
  CAPTURE("global non-blocking, legacy query", nb, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    CUstreamCaptureStatus x = CU_STREAM_CAPTURE_STATUS_NONE;
    IN("cuStreamIsCapturing(legacy)", cuStreamIsCapturing(CU_STREAM_LEGACY, &x));
    printf("capture %s: legacy status: %s\n", l_, cap_name(x));
  });
  CAPTURE("global, cuMemAlloc", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuMemAlloc", cuMemAlloc_v2(&p, 4096));
  });
  Q("cuMemAlloc after", cuMemAlloc_v2(&p, 4096));
  CAPTURE("global, cuMemFree", s, CU_STREAM_CAPTURE_MODE_GLOBAL, { IN("cuMemFree", cuMemFree_v2(p)); });
  cuMemFree_v2(p);
  CAPTURE("global, cuMemGetInfo", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuMemGetInfo", cuMemGetInfo_v2(&fr, &tot));
  });
  CAPTURE("global, cuMemAllocPitch", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    size_t pitch;
    IN("cuMemAllocPitch", cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 4));
  });
  CAPTURE("global, cuEventQuery", s, CU_STREAM_CAPTURE_MODE_GLOBAL, { IN("cuEventQuery", cuEventQuery(e)); });
  CAPTURE("global, cuEventSynchronize", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuEventSynchronize", cuEventSynchronize(e));
  });
  CAPTURE("global, cuCtxSynchronize", nb, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuCtxSynchronize", cuCtxSynchronize());
  });
  CAPTURE("global, sync of another stream", nb, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuStreamSynchronize(other)", cuStreamSynchronize(s));
  });
  CAPTURE("global, sync of itself", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuStreamSynchronize(self)", cuStreamSynchronize(s));
  });
  CAPTURE("global, stream-ordered", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    IN("cuMemAllocAsync", cuMemAllocAsync(&p, 4096, s));
    IN("cuMemFreeAsync", cuMemFreeAsync(p, s));
  });
  CAPTURE("global, thread relaxed", nb, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    IN("exchange to relaxed", cuThreadExchangeStreamCaptureMode(&m));
    printf("capture %s: previous thread mode: %d\n", l_, (int)m);
    IN("cuMemAlloc", cuMemAlloc_v2(&p, 4096));
    IN("cuMemFree", cuMemFree_v2(p));
    IN("cuEventQuery", cuEventQuery(e));
    IN("cuCtxSynchronize", cuCtxSynchronize());
    IN("exchange back", cuThreadExchangeStreamCaptureMode(&m));
  });
  CAPTURE("relaxed", nb, CU_STREAM_CAPTURE_MODE_RELAXED, {
    IN("cuMemAlloc", cuMemAlloc_v2(&p, 4096));
    IN("cuMemFree", cuMemFree_v2(p));
    IN("cuEventQuery", cuEventQuery(e));
    IN("cuStreamSynchronize(other)", cuStreamSynchronize(s));
  });
  CAPTURE("relaxed, cuCtxSynchronize", nb, CU_STREAM_CAPTURE_MODE_RELAXED, {
    IN("cuCtxSynchronize", cuCtxSynchronize());
  });
  CAPTURE("thread-local, cuMemAlloc", s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, {
    IN("cuMemAlloc", cuMemAlloc_v2(&p, 4096));
  });
  CAPTURE("global, other thread", nb, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    pthread_t t;
    pthread_create(&t, NULL, other_thread_alloc, ctx);
    pthread_join(t, NULL);
  });
  CAPTURE("per-thread stream", CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL, {
    CUstreamCaptureStatus x = CU_STREAM_CAPTURE_STATUS_NONE;
    IN("cuStreamIsCapturing(legacy)", cuStreamIsCapturing(CU_STREAM_LEGACY, &x));
  });

  {
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    cuMemAddressReserve(&va, 8u << 20, 0, 0, 0);
    cuMemCreate(&h, 2u << 20, &prop, 0);
    cuMemMap(va, 2u << 20, 0, h, 0);
    cuMemSetAccess(va, 2u << 20, &acc, 1);
    CUdeviceptr va2 = 0;
    CAPTURE("global, virtual memory", s, CU_STREAM_CAPTURE_MODE_GLOBAL, {
      IN("cuMemAddressReserve", cuMemAddressReserve(&va2, 2u << 20, 0, 0, 0));
      IN("cuMemCreate", cuMemCreate(&h2, 2u << 20, &prop, 0));
      IN("cuMemMap", cuMemMap(va + (2u << 20), 2u << 20, 0, h2, 0));
      IN("cuMemSetAccess", cuMemSetAccess(va + (2u << 20), 2u << 20, &acc, 1));
      IN("cuMemUnmap", cuMemUnmap(va, 2u << 20));
    });
    cuMemUnmap(va, 2u << 20);
    cuMemUnmap(va + (2u << 20), 2u << 20);
    cuMemRelease(h);
    if (h2)
      cuMemRelease(h2);
    cuMemAddressFree(va, 8u << 20);
    if (va2)
      cuMemAddressFree(va2, 2u << 20);
  }

  probe_pointers(ctx);
  probe_ranges(ctx);
  probe_ipc(argv[0]);
  probe_free_memory();
  probe_vmm();
  probe_kernels();

  /* The primary context's last release frees its memory. */
  Q("cuMemAlloc before release", cuMemAlloc_v2(&p, 4096));
  Q("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2(0));
  cuDevicePrimaryCtxGetState(0, &flags, &active);
  printf("primary active after last release: %d\n", active);
  Q("released context current: cuMemAlloc", cuMemAlloc_v2(&q, 4096));
  Q("released context current: cuMemFree(old)", cuMemFree_v2(p));
  Q("released context current: cuCtxGetDevice", cuCtxGetDevice(&dev));
  {
    const char *str = NULL;
    Q("cuGetErrorString(12345)", cuGetErrorString((CUresult)12345, &str));
  }
  return 0;
}
