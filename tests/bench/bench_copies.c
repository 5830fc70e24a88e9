/*
 * bench_copies: what a small async copy and memset cost through the
 * driver API, where cudalloc checks every device range against the pooled
 * block it starts in (src/policy/ranges.h). Run it plain, preloaded with
 * `enabled:0` (the hooks only) and preloaded (hooks and checks): the
 * difference is the check. The blocks are many and small (4,096 blocks of
 * 4 KiB, copies of 64 B into the middle of one of them, chosen at random),
 * so each check finds its block among thousands. The last two cases are a
 * memset one byte longer than its block: the driver refuses it, and so does
 * the library, before the driver (preloaded, they time the hook and the
 * check alone), on a random block and on the same one every time (a loop
 * over the same buffers: the thread's last block answers without a lock).
 * Prints one line per case:
 *   bench_copies: <case> <ns> ns per call (median of N rounds of M calls)
 * The GPU machine runs it (scripts/bench-gpu.sh, part copies); CI runs it
 * against the mock driver (scripts/bench-cpu.sh), where the driver's own
 * call is cheap and the check's cost stands out.
 * Build: the project's CMake (target bench_copies), or
 *   cc -O2 -std=c11 -I<cuda>/include bench_copies.c -lcuda
 */
#define _POSIX_C_SOURCE 200809L
#define BENCH_NAME "bench_copies"
#include "bench_gpu.h"

#define BLOCKS 4096
#define BLOCK_SIZE 4096
#define CALLS 20000
#define ROUNDS 11
#define SYNC_EVERY 256 /* keeps the device's queue short */

static CUdeviceptr blocks[BLOCKS];

static CUdeviceptr target(uint64_t *seed) {
  return blocks[next_random(seed) % BLOCKS] + 1024;
}

enum { MEMSET, COPY, PAST_END, PAST_END_SAME, CASES };
static const char *const case_names[CASES] = {
    "cuMemsetD8Async 64 B", "cuMemcpyDtoDAsync 64 B",
    "cuMemsetD8Async 1 B past a block's end (refused)",
    "cuMemsetD8Async 1 B past the same block's end (refused)"};

static double round_ns(CUstream s, int what) {
  uint64_t seed = 42;
  double t0 = now_ns();
  for (int i = 1; i <= CALLS; i++) {
    CUdeviceptr dst = what == PAST_END_SAME ? blocks[0] + 1024 : target(&seed);
    if (what == COPY)
      DK(cuMemcpyDtoDAsync(dst, dst + 64, 64, s));
    else if (what == MEMSET)
      DK(cuMemsetD8Async(dst, (unsigned char)i, 64, s));
    else if (cuMemsetD8Async(dst, 0, BLOCK_SIZE - 1024 + 1, s) !=
             CUDA_ERROR_INVALID_VALUE)
      exit(1);
    if (i % SYNC_EVERY == 0)
      DK(cuStreamSynchronize(s));
  }
  DK(cuStreamSynchronize(s));
  return (now_ns() - t0) / CALLS;
}

int main(void) {
  CUcontext ctx;
  CUstream s;
  DK(cuInit(0));
  DK(cuDevicePrimaryCtxRetain(&ctx, 0));
  DK(cuCtxSetCurrent(ctx));
  DK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < BLOCKS; i++)
    DK(cuMemAlloc(&blocks[i], BLOCK_SIZE));
  for (int what = 0; what < CASES; what++) {
    double ns[ROUNDS];
    round_ns(s, what); /* warm-up */
    for (int r = 0; r < ROUNDS; r++)
      ns[r] = round_ns(s, what);
    qsort(ns, ROUNDS, sizeof(*ns), cmp_double);
    printf(BENCH_NAME ": %s %.1f ns per call (median of %d rounds of %d calls)\n",
           case_names[what], ns[ROUNDS / 2], ROUNDS, CALLS);
  }
  for (int i = 0; i < BLOCKS; i++)
    DK(cuMemFree(blocks[i]));
  DK(cuStreamDestroy(s));
  DK(cuDevicePrimaryCtxRelease(0));
  return 0;
}
