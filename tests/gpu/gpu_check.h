/*
 * Shared by the GPU check programs (alloc_fill.cu, driver_api.c,
 * graph_replay.cu, hazard.cu, oom_limit.cu), which scripts/gpu-check.sh
 * builds and runs on the GPU machine with and without
 * LD_PRELOAD=libcudalloc.so.
 *
 * What lives here: the deterministic PRNG and the plan of the mixed-size
 * allocation loop (so a run is the same sequence every time, with or without
 * the library), and the reading of the library's statistics. The statistics
 * are found with dlsym(RTLD_DEFAULT, "cudalloc_get_stats"), as any program
 * that is only preloaded would: the programs do not link the library.
 *
 * Every program takes the expectation as its first argument, so that the
 * program itself, not only the script, judges what the statistics show:
 *   plain        the library must be absent (no cudalloc_get_stats);
 *   pooled       the library must be present and must have served every
 *                cudaMalloc/cuMemAlloc the program made, from few driver
 *                allocations (backend_allocs < 10% of allocs);
 *   passthrough  the library must be present with nothing pooled
 *                (CUDALLOC_CONF=enabled:0);
 *   any          no expectation (statistics only printed).
 * Every program ends with one line "<name>: PASS" or "<name>: FAIL: <why>"
 * and exits non-zero on FAIL; the script reads both.
 */
#ifndef CUDALLOC_GPU_CHECK_H
#define CUDALLOC_GPU_CHECK_H

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudalloc.h"

#ifndef RTLD_DEFAULT
#error "define _GNU_SOURCE before any include: RTLD_DEFAULT is needed"
#endif

/* ---- Verdict ------------------------------------------------------------ */

static const char *gc_name = "check";

/* Prints the FAIL verdict with its reason and ends the process. */
static void gc_fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void gc_fail(const char *fmt, ...) {
  va_list ap;
  fflush(stdout);
  printf("%s: FAIL: ", gc_name);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  exit(1);
}

/* ---- Start, timing, memory info ---------------------------------------- */

/* The helpers a program may leave unused are static inline: those draw no
 * unused-function warning, so no program has to silence the warning for
 * its own functions too. */

/* The programs' common arguments: <expectation> [iterations] [max_log2]. */
typedef struct gc_args {
  int expect;
  long iterations;
  unsigned max_log2;
} gc_args;

static int gc_parse_expect(const char *s);

/* Names the program for its verdict, makes stdout line-buffered and reads
 * the arguments, with these defaults; ends with FAIL on bad ones. */
static inline gc_args gc_start(const char *name, int argc, char **argv,
                               long default_iterations,
                               unsigned default_max_log2) {
  gc_args a;
  gc_name = name;
  setvbuf(stdout, NULL, _IOLBF, 0);
  a.expect = gc_parse_expect(argc > 1 ? argv[1] : NULL);
  a.iterations = argc > 2 ? strtol(argv[2], NULL, 10) : default_iterations;
  a.max_log2 = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10)
                        : default_max_log2;
  if (a.iterations < 1 || a.max_log2 < 9 || a.max_log2 > 30)
    gc_fail("bad arguments: iterations %ld, max_log2 %u", a.iterations,
            a.max_log2);
  return a;
}

/* Seconds since `t0` (taken with clock_gettime(CLOCK_MONOTONIC)). */
static inline double gc_elapsed(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) +
         (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Prints what a cudaMemGetInfo/cuMemGetInfo call (`what`) gave and ends with
 * FAIL unless it is sane: free and total non-zero, free not past total. */
static inline void gc_check_mem_info(const char *what, size_t free_b,
                                     size_t total_b) {
  printf("%s: free=%zu total=%zu\n", what, free_b, total_b);
  if (total_b == 0 || free_b == 0 || free_b > total_b)
    gc_fail("%s gave free=%zu total=%zu", what, free_b, total_b);
}

/* ---- Deterministic randomness ------------------------------------------- */

/* Callable from kernels too when compiled by nvcc. */
#ifdef __CUDACC__
/* The CUDA runtime programs: any error fails the check, naming the call
 * and where. A launch reports configuration errors at once and faults at
 * the next synchronizing call; both are checked. */
#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t ck_err_ = (call);                                              \
    if (ck_err_ != cudaSuccess)                                                \
      gc_fail("%s:%d: %s returned %s (%s)", __FILE__, __LINE__, #call,         \
              cudaGetErrorName(ck_err_), cudaGetErrorString(ck_err_));         \
  } while (0)
#define CK_LAUNCH() CK(cudaGetLastError())
#endif

#ifdef __CUDACC__
#define GC_HD __host__ __device__
#else
#define GC_HD
#endif

/* splitmix64: one 64-bit state, good enough mixing for sizes and choices. */
static inline uint64_t gc_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The 32-bit word buffer number `serial` holds at element `i`: differs
 * between buffers at every element, so a block handed out twice (two live
 * buffers overlapping) shows as a mismatch in the one written first. */
GC_HD static inline uint32_t gc_pattern(uint32_t serial, uint64_t i) {
  uint32_t x = serial * 0x9E3779B1u ^ (uint32_t)i * 0x85EBCA77u ^
               (uint32_t)(i >> 32) * 0xC2B2AE3Du;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return x;
}

#ifdef __CUDACC__
/* Fills n words with buffer `serial`'s pattern. */
__global__ static void gc_fill_kernel(uint32_t *p, size_t n, uint32_t serial) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    p[i] = gc_pattern(serial, i);
}

/* Adds to *mismatches the words that do not hold `serial`'s pattern. */
__global__ static void gc_verify_kernel(const uint32_t *p, size_t n,
                                        uint32_t serial,
                                        unsigned long long *mismatches) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long bad = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    bad += p[i] != gc_pattern(serial, i);
  if (bad)
    atomicAdd(mismatches, bad);
}
#endif

/* ---- The mixed-size loop's plan ----------------------------------------- */

/* One step of the loop: which live buffer to free first (-1: none) and how
 * many bytes to allocate next (0: none). Sizes are log-uniform from 2^8 up
 * to (not including) 2^max_log2 bytes, multiples of 4. A full set frees one;
 * an empty set allocates one; otherwise each is a coin toss, weighted so the
 * set fills up and then churns near its maximum. */
typedef struct gc_step {
  int free_index;
  size_t alloc_bytes;
} gc_step;

static inline gc_step gc_plan_step(uint64_t *rng, unsigned live,
                                   unsigned max_live, unsigned max_log2) {
  gc_step s;
  uint64_t r = gc_rand(rng);
  s.free_index = -1;
  if (live > 0 && (live >= max_live || (r & 3u) < 2u))
    s.free_index = (int)((r >> 8) % live);
  unsigned after = live - (s.free_index >= 0 ? 1u : 0u);
  s.alloc_bytes = 0;
  if (after == 0 || (after < max_live && ((r >> 4) & 3u) != 0u)) {
    unsigned bits = 8u + (unsigned)((r >> 24) % (max_log2 - 8u));
    uint64_t base = 1ull << bits;
    uint64_t size = base + ((r >> 32) & (base - 1));
    s.alloc_bytes = (size_t)(size & ~(uint64_t)3);
  }
  return s;
}

/* ---- The library's statistics ------------------------------------------- */

enum { GC_EXPECT_ANY, GC_EXPECT_PLAIN, GC_EXPECT_POOLED, GC_EXPECT_PASSTHROUGH };

static int gc_parse_expect(const char *s) {
  if (s == NULL || strcmp(s, "any") == 0)
    return GC_EXPECT_ANY;
  if (strcmp(s, "plain") == 0)
    return GC_EXPECT_PLAIN;
  if (strcmp(s, "pooled") == 0)
    return GC_EXPECT_POOLED;
  if (strcmp(s, "passthrough") == 0)
    return GC_EXPECT_PASSTHROUGH;
  fprintf(stderr, "expectation must be plain, pooled, passthrough or any, "
                  "not '%s'\n", s);
  exit(2);
}

typedef int (*gc_get_stats_fn)(int device, cudalloc_device_stats *out,
                               size_t out_size);

/* Reads device `device`'s pool statistics through the library, prints them as
 * the line the script parses, and holds them to `expect`. `my_allocs` and
 * `my_frees` are the pooled-kind calls (cudaMalloc/cuMemAlloc, cudaFree/
 * cuMemFree of those) this program made: under "pooled" the pool must have
 * seen at least those (the runtime may add its own). Returns on success;
 * ends the process with a FAIL verdict otherwise. */
static void gc_check_stats(int expect, int device, uint64_t my_allocs,
                           uint64_t my_frees) {
  void *sym = dlsym(RTLD_DEFAULT, "cudalloc_get_stats");
  if (sym == NULL) {
    printf("pooled: none (cudalloc_get_stats not found: library not loaded)\n");
    if (expect == GC_EXPECT_POOLED || expect == GC_EXPECT_PASSTHROUGH)
      gc_fail("cudalloc_get_stats not found, but the library should be "
              "preloaded");
    return;
  }
  gc_get_stats_fn get_stats;
  memcpy(&get_stats, &sym, sizeof(get_stats));
  cudalloc_device_stats s;
  memset(&s, 0xA5, sizeof(s)); /* the call must overwrite every byte */
  int rc = get_stats(device, &s, sizeof(s));
  printf("pooled: allocs=%llu backend_allocs=%llu cache_hits=%llu "
         "(frees=%llu backend_frees=%llu segments=%llu reserved=%llu "
         "failed=%llu rc=%d)\n",
         (unsigned long long)s.allocs, (unsigned long long)s.backend_allocs,
         (unsigned long long)s.cache_hits, (unsigned long long)s.frees,
         (unsigned long long)s.backend_frees,
         (unsigned long long)s.segments.current,
         (unsigned long long)s.reserved_bytes.current,
         (unsigned long long)s.failed_allocs, rc);
  printf("program: allocs=%llu frees=%llu\n", (unsigned long long)my_allocs,
         (unsigned long long)my_frees);
  if (s.device != device)
    gc_fail("statistics name device %d, asked for %d", s.device, device);
  switch (expect) {
  case GC_EXPECT_PLAIN:
    gc_fail("cudalloc_get_stats found, but the library should be absent");
  case GC_EXPECT_PASSTHROUGH:
    if (s.allocs != 0 || s.backend_allocs != 0)
      gc_fail("enabled:0 should pool nothing, yet allocs=%llu "
              "backend_allocs=%llu",
              (unsigned long long)s.allocs,
              (unsigned long long)s.backend_allocs);
    break;
  case GC_EXPECT_POOLED:
    if (rc != 0)
      gc_fail("no pool for device %d (rc=%d): allocations were not pooled",
              device, rc);
    if (s.allocs < my_allocs)
      gc_fail("the pool served %llu allocations, the program made %llu: some "
              "went around the pool",
              (unsigned long long)s.allocs, (unsigned long long)my_allocs);
    if (s.frees < my_frees)
      gc_fail("the pool took back %llu blocks, the program freed %llu",
              (unsigned long long)s.frees, (unsigned long long)my_frees);
    if (s.backend_allocs * 10 >= s.allocs)
      gc_fail("backend_allocs=%llu is not below 10%% of allocs=%llu: little "
              "pooling",
              (unsigned long long)s.backend_allocs,
              (unsigned long long)s.allocs);
    if (s.failed_allocs != 0)
      gc_fail("failed_allocs=%llu, expected none",
              (unsigned long long)s.failed_allocs);
    break;
  default:
    break;
  }
}

#endif /* CUDALLOC_GPU_CHECK_H */
