/*
 * pool_demo: what a training loop asks of the driver, and what cudalloc
 * makes of it.
 *
 * Each "step" allocates activations of a few sizes, frees them, and keeps one
 * small buffer on some steps (a forgotten cache: the leak cudalloc reports).
 * It talks to the driver API directly, so the same binary runs on a GPU and
 * against the project's mock driver. When cudalloc is preloaded, the demo
 * finds its public API with dlsym and prints the pool's statistics at the
 * end, and the library reports the forgotten buffers at exit; without it,
 * the demo only times itself.
 *
 *   LD_PRELOAD=libcudalloc.so ./pool_demo [steps]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda.h>

#include "cudalloc.h"

#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult rc_ = (call);                                                     \
    if (rc_ != CUDA_SUCCESS) {                                                 \
      fprintf(stderr, "pool_demo: %s failed: error %d\n", #call, (int)rc_);    \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 200;
  static const size_t sizes[] = {3 << 20, 12 << 20, 512 << 10, 64 << 10,
                                 12 << 20, 3 << 20, 1 << 20, 40 << 20};
  enum { N = sizeof(sizes) / sizeof(sizes[0]) };
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));

  int kept = 0;
  double start = now_us();
  for (int step = 0; step < steps; step++) {
    CUdeviceptr act[N];
    for (int i = 0; i < N; i++) {
      CHECK(cuMemAlloc(&act[i], sizes[i]));
      CHECK(cuMemsetD8(act[i], (unsigned char)step, 256));
    }
    for (int i = N - 1; i >= 0; i--)
      CHECK(cuMemFree(act[i]));
    if (step % 50 == 7) { /* a per-step cache nobody frees */
      CUdeviceptr forgotten;
      CHECK(cuMemAlloc(&forgotten, 256 << 10));
      kept++;
    }
  }
  CHECK(cuCtxSynchronize());
  double per_op = (now_us() - start) / (double)(steps * N * 2 + kept);
  printf("pool_demo: %d steps, %d allocations and frees, %.2f us per call; "
         "%d buffers kept\n",
         steps, steps * N * 2, per_op, kept);

  /* When preloaded, cudalloc's API is there to be found. */
  void (*print_stats)(void) =
      (void (*)(void))dlsym(RTLD_DEFAULT, "cudalloc_print_stats");
  if (print_stats) {
    fflush(stdout); /* the library writes straight to stderr */
    print_stats();  /* the leak report follows at exit */
  } else {
    printf("pool_demo: cudalloc is not loaded (run with "
           "LD_PRELOAD=libcudalloc.so)\n");
  }
  return 0;
}
