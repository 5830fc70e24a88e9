/*
 * bench_hooks: a cached cuMemAlloc and cuMemFree through the library, for
 * counting the instructions the library adds to each (scripts/bench-cpu.sh
 * counts them with callgrind, inside cuMemAlloc_v2 and cuMemFree_v2, with
 * the library preloaded over the mock driver: a cached request never
 * reaches the driver's own allocation, so what is counted is the hooks,
 * the policy and the pool).
 *
 *   bench_hooks [PAIRS [BYTES]]
 *
 * Allocates and frees one block of BYTES (default 4096) PAIRS times
 * (default 100000) after a warm-up, so every request but the first is
 * served from the cache; prints the pairs made.
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

static void check(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "bench_hooks: %s failed (%d)\n", what, (int)r);
    exit(1);
  }
}

int main(int argc, char **argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 100000;
  size_t bytes = argc > 2 ? strtoull(argv[2], NULL, 10) : 4096;
  if (pairs <= 0 || bytes == 0) {
    fprintf(stderr, "usage: bench_hooks [PAIRS [BYTES]]\n");
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  check(cuInit(0), "cuInit");
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  CUdeviceptr p;
  for (int i = 0; i < 16; i++) { /* the pool's segment, and the thread's state */
    check(cuMemAlloc(&p, bytes), "cuMemAlloc");
    check(cuMemFree(p), "cuMemFree");
  }
  for (long i = 0; i < pairs; i++) {
    check(cuMemAlloc(&p, bytes), "cuMemAlloc");
    check(cuMemFree(p), "cuMemFree");
  }
  printf("bench_hooks: %ld pairs\n", pairs);
  return 0;
}
