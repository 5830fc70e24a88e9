/*
 * e2e_linked: a program linked to libcuda (here the mock, by RPATH) calling
 * the driver by name; cuda.h turns cuMemAlloc into cuMemAlloc_v2 and so on,
 * so these are the ABI names a preloaded library must export.
 */
#include "e2e_common.h"

/* Calls by name, through the PLT, as a linked program makes them. */
static CUresult linked_alloc(CUdeviceptr *p, size_t n) { return cuMemAlloc(p, n); }
static CUresult linked_free(CUdeviceptr p) { return cuMemFree(p); }
static CUresult linked_info(size_t *f, size_t *t) { return cuMemGetInfo(f, t); }

int main(void) {
  e2e_prog = "e2e_linked";
  e2e_mode mode = e2e_detect_mode();
  e2e_api api = {
      .init = cuInit,
      .primary_retain = cuDevicePrimaryCtxRetain,
      .primary_release = cuDevicePrimaryCtxRelease,
      .ctx_set_current = cuCtxSetCurrent,
      .mem_alloc = linked_alloc,
      .mem_free = linked_free,
      .mem_get_info = linked_info,
      .memset_d8 = cuMemsetD8,
      .memcpy_htod = cuMemcpyHtoD,
      .memcpy_dtoh = cuMemcpyDtoH,
      .mem_alloc_async = cuMemAllocAsync,
      .mem_free_async = cuMemFreeAsync,
      .mem_alloc_pitch = cuMemAllocPitch,
      .mem_alloc_managed = cuMemAllocManaged,
      .default_mem_pool = cuDeviceGetDefaultMemPool,
      .mem_alloc_from_pool_async = cuMemAllocFromPoolAsync,
      .mem_create = cuMemCreate,
      .mem_release = cuMemRelease,
      .stream_create = cuStreamCreate,
      .stream_destroy = cuStreamDestroy,
      .begin_capture = cuStreamBeginCapture,
      .end_capture = cuStreamEndCapture,
      .exchange_capture_mode = cuThreadExchangeStreamCaptureMode,
      .graph_destroy = cuGraphDestroy,
      .alloc_entry = (const void *)cuMemAlloc_v2,
      .get_counters = mockcuda_get_counters,
      .owns = mockcuda_owns,
  };
  /* What the program is bound to, what RTLD_DEFAULT and RTLD_NEXT (after
   * this program) find: one and the same function, with or without cudalloc. */
  void *bound = (void *)cuMemAlloc_v2, *dflt = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"),
       *next = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
  char w1[256], w2[256], w3[256];
  E2E_CHECK(bound == dflt && bound == next,
            "cuMemAlloc_v2: bound to %s, RTLD_DEFAULT gives %s, RTLD_NEXT %s",
            e2e_where(bound, w1, sizeof w1), e2e_where(dflt, w2, sizeof w2),
            e2e_where(next, w3, sizeof w3));
  if (mode == E2E_PLAIN) {
    e2e_expect_export(&api, (const void *)cuMemAlloc_v2, "cuMemAlloc_v2");
    e2e_expect_export(&api, (const void *)cuMemFree_v2, "cuMemFree_v2");
  }
  return e2e_run(&api, mode, "linked to libcuda.so.1");
}
