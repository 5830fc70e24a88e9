/*
 * bench_latency: what one warm allocate+free pair costs, by size, on a real
 * GPU.
 *
 * For each size (256 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB, 1 GiB) it
 * makes one pair to warm up (the first request of a size may grow a pool or
 * map memory) and a few to calibrate, then times pairs in groups: as many
 * pairs per group as make it last about GROUP_NS (one pair for slow
 * allocators, a dozen or so for a cache), so that reading the clock costs
 * little next to what is measured. Groups go on until GROUPS_MAX groups or
 * the size's time budget (BUDGET_MS, 250 ms by default) is spent, whichever
 * comes first, and never fewer than GROUPS_MIN: a cached pair is timed some
 * 25,000 times, a plain cudaMalloc of 1 GiB (about 400 us a pair) some 600
 * times, a few seconds for all sizes. The figure is the median over groups
 * of the time per pair.
 *
 * Modes: "sync" (default) calls cudaMalloc/cudaFree; run it plain and under
 * LD_PRELOAD=libcudalloc.so (scripts/bench-gpu.sh does). "async" calls
 * cudaMallocAsync/cudaFreeAsync on a non-blocking stream, with the device's
 * default memory pool keeping everything (release threshold UINT64_MAX):
 * the driver's own stream-ordered pool, as a reference. In that mode the
 * stream is synchronized between groups, outside the timing, so that the
 * queue of stream-ordered operations cannot grow without bound.
 *
 *   bench_latency [sync|async] [budget_ms_per_size]
 *
 * This is a program, not a test: it checks every CUDA return code and exits
 * 1 on an error, and prints one line per size:
 *   bench_latency: <bytes> B <ns> ns per pair (median of <groups> groups of
 *   <pairs> pairs, min .., max ..), mode <mode>
 */
#define BENCH_NAME "bench_latency"
#include "bench_gpu.h"

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALIBRATION_PAIRS 5
#define GROUP_NS 2000.0
#define GROUP_PAIRS_MAX 64
#define GROUPS_MIN 11
#define GROUPS_MAX 2001

static const size_t sizes[] = {
    256,         4u << 10,    64u << 10,        1u << 20,
    16u << 20,   256u << 20,  (size_t)1 << 30,
};

typedef struct bench {
  int async;
  cudaStream_t stream;
  double budget_ns;
} bench;

/* The time per pair of each group of one size. */
static double group_ns[GROUPS_MAX];

static void one_pair(const bench *b, size_t bytes) {
  void *p = NULL;
  if (b->async) {
    CK(cudaMallocAsync(&p, bytes, b->stream));
    CK(cudaFreeAsync(p, b->stream));
  } else {
    CK(cudaMalloc(&p, bytes));
    CK(cudaFree(p));
  }
}

/* Nanoseconds per pair over PAIRS pairs in a row. */
static double time_pairs(const bench *b, size_t bytes, int pairs) {
  double start = now_ns();
  for (int i = 0; i < pairs; i++)
    one_pair(b, bytes);
  double ns = (now_ns() - start) / pairs;
  if (b->async)
    CK(cudaStreamSynchronize(b->stream));
  return ns;
}

/* Pairs per group: enough that a group lasts about GROUP_NS. */
static int pairs_per_group(double ns_per_pair) {
  if (ns_per_pair <= 0.0)
    return GROUP_PAIRS_MAX;
  double n = GROUP_NS / ns_per_pair + 1.0;
  return n > GROUP_PAIRS_MAX ? GROUP_PAIRS_MAX : (int)n;
}

/* Times one size and prints its line. */
static void measure_size(const bench *b, size_t bytes) {
  time_pairs(b, bytes, 1); /* warm-up */
  /* The fastest of a few single pairs: one slow pair (a page fault, an
   * interrupt) must not shrink the groups of a fast allocator to one. */
  double fastest = time_pairs(b, bytes, 1);
  for (int i = 0; i < CALIBRATION_PAIRS - 1; i++) {
    double ns = time_pairs(b, bytes, 1);
    fastest = ns < fastest ? ns : fastest;
  }
  int pairs = pairs_per_group(fastest);
  int groups = 0;
  double start = now_ns();
  while (groups < GROUPS_MAX &&
         (groups < GROUPS_MIN || now_ns() - start < b->budget_ns))
    group_ns[groups++] = time_pairs(b, bytes, pairs);
  qsort(group_ns, (size_t)groups, sizeof(group_ns[0]), cmp_double);
  printf("bench_latency: %zu B %.1f ns per pair (median of %d groups of %d "
         "pairs, min %.1f, max %.1f), mode %s\n",
         bytes, group_ns[groups / 2], groups, pairs, group_ns[0],
         group_ns[groups - 1], b->async ? "async" : "sync");
  fflush(stdout);
}

static void setup(bench *b, const char *mode, double budget_ms) {
  memset(b, 0, sizeof(*b));
  b->async = strcmp(mode, "async") == 0;
  b->budget_ns = budget_ms * 1e6;
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* the context, outside the timing */
  if (b->async) {
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "sync";
  double budget_ms = argc > 2 ? atof(argv[2]) : 250.0;
  if ((strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0) ||
      budget_ms <= 0.0) {
    fprintf(stderr, "usage: bench_latency [sync|async] [budget_ms_per_size]\n");
    return 2;
  }
  bench b;
  setup(&b, mode, budget_ms);
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    measure_size(&b, sizes[i]);
  if (b.async)
    CK(cudaStreamDestroy(b.stream));
  return 0;
}
