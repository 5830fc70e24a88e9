/*
 * bench_stacks: what backtrace_depth costs a program, on a real GPU.
 *
 * Times warm cudaMalloc+cudaFree pairs (the pool serves every one from its
 * cache) made from the bottom of a call chain 24 frames deep, as in a
 * framework, so a capture of depth 16 has 16 real frames to walk. Run it
 * under LD_PRELOAD=libcudalloc.so with CUDALLOC_CONF=backtrace_depth:N for
 * N = 0, 8, 16 (scripts/bench-stacks.sh does): the difference between the
 * runs is the cost of the stacks. Prints the median over ROUNDS rounds of
 * the time per pair.
 *
 *   bench_stacks [pairs_per_round] [rounds]
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define DEPTH 24

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Counts the levels returned through; its update after each call keeps the
 * call from becoming a jump, so every level is a real frame. */
static volatile int levels_done;

__attribute__((noinline)) static int pairs_at(int level, int pairs) {
  if (level > 0) {
    int failures = pairs_at(level - 1, pairs);
    levels_done = levels_done + 1;
    return failures;
  }
  int failures = 0;
  for (int i = 0; i < pairs; i++) {
    void *p = NULL;
    if (cudaMalloc(&p, 256 << (i & 7)) != cudaSuccess)
      failures++;
    if (cudaFree(p) != cudaSuccess)
      failures++;
  }
  return failures;
}

int main(int argc, char **argv) {
  int pairs = argc > 1 ? atoi(argv[1]) : 100000;
  int rounds = argc > 2 ? atoi(argv[2]) : 7;
  double ns[64];
  if (rounds > 64)
    rounds = 64;
  if (cudaFree(0) != cudaSuccess || pairs_at(DEPTH, 1000) != 0) {
    fprintf(stderr, "bench_stacks: CUDA failed\n");
    return 1;
  }
  for (int r = 0; r < rounds; r++) {
    double start = now_ns();
    if (pairs_at(DEPTH, pairs) != 0) {
      fprintf(stderr, "bench_stacks: an allocation failed\n");
      return 1;
    }
    ns[r] = (now_ns() - start) / pairs;
  }
  qsort(ns, (size_t)rounds, sizeof(ns[0]), cmp_double);
  printf("bench_stacks: %.1f ns per cudaMalloc+cudaFree pair (median of %d "
         "rounds of %d, min %.1f, max %.1f)\n",
         ns[rounds / 2], rounds, pairs, ns[0], ns[rounds - 1]);
  return 0;
}
