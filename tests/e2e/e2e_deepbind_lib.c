/*
 * A library that frees device memory with the driver's own cuMemFree_v2:
 * linked to libcuda and loaded with RTLD_DEEPBIND, its references bind to
 * its own dependencies first, so no preloaded hook sees its calls
 * (tests/e2e/e2e_deepbind.c).
 */
#include <cuda.h>

__attribute__((visibility("default"))) CUresult e2e_deepbind_free(CUdeviceptr p) {
  return cuMemFree_v2(p);
}
