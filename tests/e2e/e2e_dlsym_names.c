/*
 * e2e_dlsym_names: reaches the driver as JAX/XLA does: dlopen of
 * libcuda.so.1 (RTLD_LOCAL, so nothing is found through RTLD_DEFAULT) and
 * dlsym of the exact exported names, versioned ones included.
 */
#include "e2e_common.h"

static e2e_api api;
static e2e_mode mode;
static void *lib;

static void *need(const char *name) {
  void *p = dlsym(lib, name);
  if (!p)
    e2e_fatal("dlsym(libcuda.so.1, %s) failed", name);
  if (mode == E2E_PLAIN)
    e2e_expect_export(&api, p, name);
  return p;
}

#define NEED(field, name) api.field = (__typeof__(api.field))need(name)

int main(void) {
  e2e_prog = "e2e_dlsym_names";
  mode = e2e_detect_mode();
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    e2e_fatal("dlopen(libcuda.so.1): %s", dlerror());
  api.get_counters = (mockcuda_get_counters_fn)dlsym(lib, "mockcuda_get_counters");
  api.owns = (mockcuda_owns_fn)dlsym(lib, "mockcuda_owns");
  if (!api.get_counters || !api.owns)
    e2e_fatal("%s", "libcuda.so.1 is not the mock: set LD_LIBRARY_PATH to tests/mockcuda's build folder");

  NEED(init, "cuInit");
  NEED(primary_retain, "cuDevicePrimaryCtxRetain");
  NEED(primary_release, "cuDevicePrimaryCtxRelease_v2");
  NEED(ctx_set_current, "cuCtxSetCurrent");
  NEED(mem_alloc, "cuMemAlloc_v2");
  NEED(mem_free, "cuMemFree_v2");
  NEED(mem_get_info, "cuMemGetInfo_v2");
  NEED(memset_d8, "cuMemsetD8_v2");
  NEED(memcpy_htod, "cuMemcpyHtoD_v2");
  NEED(memcpy_dtoh, "cuMemcpyDtoH_v2");
  NEED(mem_alloc_async, "cuMemAllocAsync");
  NEED(mem_free_async, "cuMemFreeAsync");
  NEED(mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz");
  NEED(mem_free_async_ptsz, "cuMemFreeAsync_ptsz");
  NEED(mem_alloc_pitch, "cuMemAllocPitch_v2");
  NEED(mem_alloc_managed, "cuMemAllocManaged");
  NEED(default_mem_pool, "cuDeviceGetDefaultMemPool");
  NEED(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync");
  NEED(mem_create, "cuMemCreate");
  NEED(mem_release, "cuMemRelease");
  NEED(stream_create, "cuStreamCreate");
  NEED(stream_destroy, "cuStreamDestroy_v2");
  NEED(begin_capture, "cuStreamBeginCapture_v2");
  NEED(end_capture, "cuStreamEndCapture");
  NEED(exchange_capture_mode, "cuThreadExchangeStreamCaptureMode");
  NEED(graph_destroy, "cuGraphDestroy");
  NEED(begin_capture_ptsz, "cuStreamBeginCapture_v2_ptsz");
  NEED(end_capture_ptsz, "cuStreamEndCapture_ptsz");

  char w[256];
  void *gpa = need("cuGetProcAddress_v2");
  if (mode == E2E_POOLED)
    E2E_CHECK(!e2e_in_mock(&api, gpa),
              "dlsym(libcuda, cuGetProcAddress_v2) gave the driver's own %s, not the hook",
              e2e_where(gpa, w, sizeof w));
  /* A function nobody hooks is handed out untouched. */
  void *name_fn = need("cuDeviceGetName");
  E2E_CHECK(e2e_in_mock(&api, name_fn), "dlsym(libcuda, cuDeviceGetName) gave %s",
            e2e_where(name_fn, w, sizeof w));
  /* Names the driver does not have stay missing. */
  E2E_CHECK(dlsym(lib, "cuNoSuchFunction") == NULL, "dlsym found cuNoSuchFunction");

  return e2e_run(&api, mode, "dlopen + dlsym of exact names");
}
