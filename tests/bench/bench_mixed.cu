/*
 * bench_mixed: the mixed allocation workload of issue 6, on a real GPU.
 *
 * What a program that allocates per iteration costs: 20,000 random
 * operations over 64 slots (an empty slot gets an allocation, a full one is
 * freed), sizes log-uniform from 256 B to 64 MiB from a fixed-seed PRNG (the
 * same sequence in every run and round), and every 64 operations a small
 * kernel, on a non-blocking stream, writes into the newest block, so that
 * frees have device work queued before them, as in a real program. The
 * time of a round includes waiting for those kernels at its end. Prints the
 * median, over ROUNDS rounds (5) after one warm-up round, of the time per
 * operation.
 *
 * Modes: "sync" (default) calls cudaMalloc/cudaFree; run it plain and under
 * LD_PRELOAD=libcudalloc.so with each CUDALLOC_CONF=reuse_policy:... to
 * compare (scripts/bench-gpu.sh does). "async" calls cudaMallocAsync/
 * cudaFreeAsync on the kernels' stream, with the device's default memory
 * pool keeping everything (release threshold UINT64_MAX): the driver's own
 * stream-ordered pool, as a reference.
 *
 * --deep runs every round from the bottom of a call chain DEEP_FRAMES (24)
 * frames deep, as a framework calls the allocator, so that under
 * CUDALLOC_CONF=backtrace_depth:N a capture of 8 or 16 frames has that many
 * real frames to walk: the difference from backtrace_depth:0 is what the
 * allocation stacks cost.
 *
 *   bench_mixed [--deep] [sync|async] [ops_per_round] [rounds]
 *
 * This is a program, not a test: it checks every CUDA return code and exits
 * 1 on an error, and prints one line "bench_mixed: <us> us per op ...".
 */
#define BENCH_NAME "bench_mixed"
#include "bench_gpu.h"

#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOTS 64
#define TOUCH_EVERY 64
#define MAX_ROUNDS 64
#define SEED 0x6D1CED5EEDull
#define DEEP_FRAMES 24

typedef struct bench {
  int async;
  cudaStream_t stream;
  void *slot[SLOTS];
  size_t bytes[SLOTS];
  long allocs, frees, kernels;
} bench;

/* Writes up to 2048 words at the start of a block. */
__global__ void touch_kernel(uint32_t *p, size_t words, uint32_t value) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < words)
    p[i] = value + (uint32_t)i;
}

/* 256 B .. 64 MiB, log-uniform, a multiple of 4. */
static size_t log_uniform_size(uint64_t *rng) {
  double u = (double)(next_random(rng) >> 11) / 9007199254740992.0;
  size_t bytes = (size_t)(256.0 * exp2(u * 18.0));
  return bytes & ~(size_t)3;
}

static void alloc_slot(bench *b, int s, size_t bytes) {
  if (b->async)
    CK(cudaMallocAsync(&b->slot[s], bytes, b->stream));
  else
    CK(cudaMalloc(&b->slot[s], bytes));
  b->bytes[s] = bytes;
  b->allocs++;
}

static void free_slot(bench *b, int s) {
  if (b->async)
    CK(cudaFreeAsync(b->slot[s], b->stream));
  else
    CK(cudaFree(b->slot[s]));
  b->slot[s] = NULL;
  b->frees++;
}

static void touch(bench *b, int s, long op) {
  size_t words = b->bytes[s] / 4;
  if (words > 2048)
    words = 2048;
  unsigned blocks = (unsigned)((words + 255) / 256);
  touch_kernel<<<blocks, 256, 0, b->stream>>>((uint32_t *)b->slot[s], words,
                                              (uint32_t)op);
  CK(cudaGetLastError());
  b->kernels++;
}

/* One round: the operations, then the wait for the kernels. Nanoseconds
 * per operation. Frees what is left afterwards, untimed. */
static double one_round(bench *b, long ops) {
  uint64_t rng = SEED;
  int newest = -1;
  double start = now_ns();
  for (long op = 0; op < ops; op++) {
    int s = (int)(next_random(&rng) % SLOTS);
    if (b->slot[s] != NULL) {
      free_slot(b, s);
      if (s == newest)
        newest = -1;
    } else {
      alloc_slot(b, s, log_uniform_size(&rng));
      newest = s;
    }
    if (op % TOUCH_EVERY == TOUCH_EVERY - 1 && newest >= 0)
      touch(b, newest, op);
  }
  CK(cudaStreamSynchronize(b->stream));
  double ns = (now_ns() - start) / (double)ops;
  for (int s = 0; s < SLOTS; s++)
    if (b->slot[s] != NULL)
      free_slot(b, s);
  CK(cudaDeviceSynchronize());
  return ns;
}

static void setup(bench *b, const char *mode) {
  memset(b, 0, sizeof(*b));
  b->async = strcmp(mode, "async") == 0;
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* the context, outside the timing */
  CK(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
  if (b->async) {
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
}

/* The warm-up round, then ROUNDS timed ones; microseconds per operation of
 * each timed round in US, sorted. Returns the warm-up round's figure. */
static double all_rounds(bench *b, long ops, int rounds, double *us) {
  double first = one_round(b, ops) / 1e3; /* warm-up, not counted */
  for (int r = 0; r < rounds; r++)
    us[r] = one_round(b, ops) / 1e3;
  qsort(us, (size_t)rounds, sizeof(us[0]), cmp_double);
  return first;
}

/* Counts the levels returned through; its update after each call keeps the
 * call from becoming a jump, so every level stays a real frame. */
static volatile int levels_done;

/* all_rounds from LEVEL more frames down. */
__attribute__((noinline)) static double rounds_at(int level, bench *b,
                                                  long ops, int rounds,
                                                  double *us) {
  if (level == 0)
    return all_rounds(b, ops, rounds, us);
  double first = rounds_at(level - 1, b, ops, rounds, us);
  levels_done = levels_done + 1;
  return first;
}

static int usage(void) {
  fprintf(stderr,
          "usage: bench_mixed [--deep] [sync|async] [ops_per_round] "
          "[rounds (1..%d)]\n",
          MAX_ROUNDS);
  return 2;
}

int main(int argc, char **argv) {
  int deep = argc > 1 && strcmp(argv[1], "--deep") == 0;
  if (deep) {
    argv++;
    argc--;
  }
  const char *mode = argc > 1 ? argv[1] : "sync";
  long ops = argc > 2 ? atol(argv[2]) : 20000;
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  if ((strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0) || ops < 1 ||
      rounds < 1 || rounds > MAX_ROUNDS)
    return usage();
  static bench b;
  double us[MAX_ROUNDS];
  setup(&b, mode);
  double first = rounds_at(deep ? DEEP_FRAMES : 0, &b, ops, rounds, us);
  long per_round = b.allocs / (rounds + 1);
  printf("bench_mixed: %.3f us per op (median of %d rounds of %ld ops, min "
         "%.3f, max %.3f; warm-up round %.3f), mode %s%s, per round %ld "
         "allocations, %ld kernels\n",
         us[rounds / 2], rounds, ops, us[0], us[rounds - 1], first, mode,
         deep ? " --deep" : "", per_round, b.kernels / (rounds + 1));
  CK(cudaStreamDestroy(b.stream));
  return 0;
}
