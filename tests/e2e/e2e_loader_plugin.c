/*
 * A plugin whose constructor calls hooked driver functions while dlopen,
 * running it, holds the loader's lock (tests/e2e/e2e_loader_race.c). What
 * it calls, E2E_PLUGIN_MODE says: "alloc" (cuMemAlloc_v2), "gpa"
 * (cuGetProcAddress_v2) or "destroy" (cuCtxDestroy_v2 of a context of its
 * own). With E2E_PLUGIN_GO set to a descriptor, it first writes one byte
 * there and sleeps 100 ms, so that the program's other thread makes its
 * own call while the loader's lock is held.
 */
#include <cuda.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void e2e_plugin_init(void) {
  const char *mode = getenv("E2E_PLUGIN_MODE");
  const char *go = getenv("E2E_PLUGIN_GO");
  CUcontext ctx = NULL;
  if (mode && strcmp(mode, "destroy") == 0)
    cuCtxCreate(&ctx, NULL, 0, 0);
  if (go) {
    if (write(atoi(go), "g", 1) != 1)
      return;
    usleep(100000);
  }
  if (!mode || strcmp(mode, "alloc") == 0) {
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS)
      cuMemFree_v2(p);
  } else if (strcmp(mode, "gpa") == 0) {
    void *fn = NULL;
    cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, NULL);
  } else if (ctx) {
    cuCtxDestroy_v2(ctx);
  }
}
