/*
 * bench_gpu.h: what the GPU benchmark programs (bench_latency, bench_mixed,
 * bench_threads, bench_fence, bench_vmm) share: error checks that end the
 * program (CK for the runtime, DK for the driver), a clock, a
 * comparison for qsort and a seeded random number generator, so that every
 * program times, sorts and draws alike.
 *
 * Define BENCH_NAME (the program's name, a string) before including it.
 */
#ifndef BENCH_GPU_H
#define BENCH_GPU_H

#include <cuda.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* A benchmark checks every CUDA return code: a failed call ends it with 1. */
#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t ck_err_ = (call);                                              \
    if (ck_err_ != cudaSuccess) {                                              \
      fprintf(stderr, BENCH_NAME ": %s:%d: %s returned %s\n", __FILE__,        \
              __LINE__, #call, cudaGetErrorName(ck_err_));                     \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Ends the program on a driver error, as CK does for the runtime. */
#define DK(call)                                                               \
  do {                                                                         \
    CUresult dk_err_ = (call);                                                 \
    if (dk_err_ != CUDA_SUCCESS) {                                             \
      const char *dk_name_ = NULL;                                             \
      cuGetErrorName(dk_err_, &dk_name_);                                      \
      fprintf(stderr, BENCH_NAME ": %s:%d: %s returned %s\n", __FILE__,       \
              __LINE__, #call, dk_name_ ? dk_name_ : "?");                     \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

static inline double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* splitmix64: the same sequence for the same seed, on every machine. */
static inline uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

#endif /* BENCH_GPU_H */
