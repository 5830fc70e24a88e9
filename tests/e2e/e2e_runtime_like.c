/*
 * e2e_runtime_like: reaches the driver as the CUDA runtime (static or
 * shared) does: dlopen("libcuda.so.1"), ONE dlsym of cuGetProcAddress_v2,
 * then every function through cuGetProcAddress -- including
 * cuGetProcAddress itself at 11030 (v1, four arguments) and 12000 (v2), and
 * stream-sensitive functions twice, with and without the per-thread flag.
 */
#include "e2e_common.h"

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);

#define PTDS CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM

static e2e_api api;
static e2e_mode mode;
static gpa2_fn gpa_dlsym, gpa_v2;
static gpa1_fn gpa_v1;

/* Looks `name` up three ways -- the dlsym'd v2 with a status, the looked-up
 * v2 without one, the looked-up v1 -- which must agree. A plain run also
 * checks it is exactly the driver's export `want`. */
static void *lookup(const char *name, cuuint64_t flags, const char *want) {
  void *a = NULL, *b = NULL, *c = NULL;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
  CUresult ra = gpa_dlsym(name, &a, 13000, flags, &st);
  CUresult rb = gpa_v2(name, &b, 13000, flags, NULL);
  CUresult rc = gpa_v1(name, &c, 13000, flags);
  E2E_CHECK(ra == CUDA_SUCCESS && st == CU_GET_PROC_ADDRESS_SUCCESS && a,
            "cuGetProcAddress_v2(%s, 13000, flags %llu): rc %d, status %d", name,
            (unsigned long long)flags, (int)ra, (int)st);
  char wa[256], wb[256], wc[256];
  E2E_CHECK(rb == CUDA_SUCCESS && rc == CUDA_SUCCESS && a == b && a == c,
            "%s (flags %llu) resolves differently: dlsym'd v2 %s, looked-up v2 %s (rc %d), "
            "looked-up v1 %s (rc %d)",
            name, (unsigned long long)flags, e2e_where(a, wa, sizeof wa),
            e2e_where(b, wb, sizeof wb), (int)rb, e2e_where(c, wc, sizeof wc), (int)rc);
  if (mode == E2E_PLAIN)
    e2e_expect_export(&api, a, want);
  if (!a)
    e2e_fatal("cannot go on without %s", name);
  return a;
}

#define LOOKUP(field, name, flags, want) api.field = (__typeof__(api.field))lookup(name, flags, want)

int main(void) {
  e2e_prog = "e2e_runtime_like";
  mode = e2e_detect_mode();
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h)
    e2e_fatal("dlopen(libcuda.so.1): %s", dlerror());
  gpa_dlsym = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
  if (!gpa_dlsym)
    e2e_fatal("dlsym(libcuda.so.1, cuGetProcAddress_v2): %s", dlerror());
  /* The runtime would stop here; the test also needs the mock's queries. */
  api.get_counters = (mockcuda_get_counters_fn)dlsym(RTLD_DEFAULT, "mockcuda_get_counters");
  api.owns = (mockcuda_owns_fn)dlsym(RTLD_DEFAULT, "mockcuda_owns");
  if (!api.get_counters || !api.owns)
    e2e_fatal("%s", "libcuda.so.1 is not the mock: set LD_LIBRARY_PATH to tests/mockcuda's build folder");
  char w1[256], w2[256];
  if (mode == E2E_PLAIN)
    e2e_expect_export(&api, (const void *)gpa_dlsym, "cuGetProcAddress_v2");
  else if (mode == E2E_POOLED)
    E2E_CHECK(!e2e_in_mock(&api, (const void *)gpa_dlsym),
              "dlsym(libcuda, cuGetProcAddress_v2) gave the driver's own %s, not the hook",
              e2e_where((const void *)gpa_dlsym, w1, sizeof w1));

  /* cuGetProcAddress itself, as the runtime asks for it. */
  void *v1 = NULL, *v2 = NULL;
  CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)-1;
  E2E_RC(gpa_dlsym("cuGetProcAddress", &v1, 11030, 0, &st), CUDA_SUCCESS);
  E2E_CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS, "status %d", (int)st);
  E2E_RC(gpa_dlsym("cuGetProcAddress", &v2, 12000, 0, NULL), CUDA_SUCCESS);
  E2E_CHECK(v1 && v2 && v1 != v2,
            "cuGetProcAddress at 11030 gave %s and at 12000 %s: want the v1 and the v2 function",
            e2e_where(v1, w1, sizeof w1), e2e_where(v2, w2, sizeof w2));
  if (!v1 || !v2)
    e2e_fatal("%s", "cannot go on without cuGetProcAddress");
  if (mode == E2E_PLAIN) {
    e2e_expect_export(&api, v1, "cuGetProcAddress");
    e2e_expect_export(&api, v2, "cuGetProcAddress_v2");
  }
  gpa_v1 = (gpa1_fn)v1;
  gpa_v2 = (gpa2_fn)v2;
  void *again = NULL;
  E2E_RC(gpa_v1("cuGetProcAddress", &again, 13000, 0), CUDA_SUCCESS);
  E2E_CHECK(again == v2, "v1 look-up of cuGetProcAddress at 13000 gave %s, want the v2 %s",
            e2e_where(again, w1, sizeof w1), e2e_where(v2, w2, sizeof w2));

  /* Misses get the driver's own answers, as measured (driver_facts.txt):
   * v2 succeeds with *pfn = NULL and the reason in the status, or leaves
   * *pfn alone without a status; v1 fails with CUDA_ERROR_NOT_FOUND and
   * leaves *pfn alone. */
  void *fn = (void *)1;
  st = (CUdriverProcAddressQueryResult)-1;
  E2E_RC(gpa_dlsym("cuNoSuchFunction", &fn, 13000, 0, &st), CUDA_SUCCESS);
  E2E_CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            "v2 look-up of an unknown name: pfn %p, status %d", fn, (int)st);
  fn = (void *)1;
  E2E_RC(gpa_v2("cuNoSuchFunction", &fn, 13000, 0, NULL), CUDA_SUCCESS);
  E2E_CHECK(fn == (void *)1, "v2 look-up of an unknown name without a status set pfn to %p", fn);
  fn = (void *)1;
  E2E_RC(gpa_v1("cuNoSuchFunction", &fn, 13000, 0), CUDA_ERROR_NOT_FOUND);
  E2E_CHECK(fn == (void *)1, "v1 look-up of an unknown name set pfn to %p", fn);
  fn = (void *)1;
  st = (CUdriverProcAddressQueryResult)-1;
  E2E_RC(gpa_v2("cuGetProcAddress", &fn, 11020, 0, &st), CUDA_SUCCESS);
  E2E_CHECK(fn == NULL && st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
            "cuGetProcAddress at 11020: pfn %p, status %d", fn, (int)st);

  LOOKUP(init, "cuInit", 0, "cuInit");
  LOOKUP(primary_retain, "cuDevicePrimaryCtxRetain", 0, "cuDevicePrimaryCtxRetain");
  LOOKUP(primary_release, "cuDevicePrimaryCtxRelease", 0, "cuDevicePrimaryCtxRelease_v2");
  LOOKUP(ctx_set_current, "cuCtxSetCurrent", 0, "cuCtxSetCurrent");
  LOOKUP(mem_alloc, "cuMemAlloc", 0, "cuMemAlloc_v2");
  LOOKUP(mem_free, "cuMemFree", 0, "cuMemFree_v2");
  LOOKUP(mem_get_info, "cuMemGetInfo", 0, "cuMemGetInfo_v2");
  LOOKUP(memset_d8, "cuMemsetD8", 0, "cuMemsetD8_v2");
  LOOKUP(memcpy_htod, "cuMemcpyHtoD", 0, "cuMemcpyHtoD_v2");
  LOOKUP(memcpy_dtoh, "cuMemcpyDtoH", 0, "cuMemcpyDtoH_v2");
  LOOKUP(mem_alloc_pitch, "cuMemAllocPitch", 0, "cuMemAllocPitch_v2");
  LOOKUP(default_mem_pool, "cuDeviceGetDefaultMemPool", 0, "cuDeviceGetDefaultMemPool");
  LOOKUP(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync", 0, "cuMemAllocFromPoolAsync");
  LOOKUP(mem_alloc_async, "cuMemAllocAsync", 0, "cuMemAllocAsync");
  LOOKUP(mem_free_async, "cuMemFreeAsync", 0, "cuMemFreeAsync");
  LOOKUP(mem_alloc_async_ptsz, "cuMemAllocAsync", PTDS, "cuMemAllocAsync_ptsz");
  LOOKUP(mem_free_async_ptsz, "cuMemFreeAsync", PTDS, "cuMemFreeAsync_ptsz");
  LOOKUP(stream_create, "cuStreamCreate", 0, "cuStreamCreate");
  LOOKUP(stream_destroy, "cuStreamDestroy", 0, "cuStreamDestroy_v2");
  LOOKUP(begin_capture, "cuStreamBeginCapture", 0, "cuStreamBeginCapture_v2");
  LOOKUP(end_capture, "cuStreamEndCapture", 0, "cuStreamEndCapture");
  LOOKUP(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode", 0,
         "cuThreadExchangeStreamCaptureMode");
  LOOKUP(graph_destroy, "cuGraphDestroy", 0, "cuGraphDestroy");
  LOOKUP(begin_capture_ptsz, "cuStreamBeginCapture", PTDS, "cuStreamBeginCapture_v2_ptsz");
  LOOKUP(end_capture_ptsz, "cuStreamEndCapture", PTDS, "cuStreamEndCapture_ptsz");

  /* Per-thread twins are other functions; functions without one are not. */
  E2E_CHECK((void *)api.mem_alloc_async != (void *)api.mem_alloc_async_ptsz &&
                (void *)api.mem_free_async != (void *)api.mem_free_async_ptsz,
            "the per-thread look-up gave the default-stream function: alloc %s, free %s",
            e2e_where((void *)api.mem_alloc_async_ptsz, w1, sizeof w1),
            e2e_where((void *)api.mem_free_async_ptsz, w2, sizeof w2));
  void *alloc_pt = lookup("cuMemAlloc", PTDS, "cuMemAlloc_v2");
  E2E_CHECK(alloc_pt == (void *)api.mem_alloc,
            "cuMemAlloc with the per-thread flag gave %s, without %s: want the same",
            e2e_where(alloc_pt, w1, sizeof w1), e2e_where((void *)api.mem_alloc, w2, sizeof w2));
  lookup("cuEventRecord", PTDS, "cuEventRecord_ptsz");

  /* A function nobody hooks is handed out untouched. */
  void *name_fn = lookup("cuDeviceGetName", 0, "cuDeviceGetName");
  E2E_CHECK(e2e_in_mock(&api, name_fn), "cuDeviceGetName is not the driver's own: %s",
            e2e_where(name_fn, w1, sizeof w1));

  return e2e_run(&api, mode, "dlopen + cuGetProcAddress");
}
