/*
 * oom_limit: running out of memory under CUDALLOC_CONF=memory_limit_mb, the
 * way a program sees it.
 *
 * Why: memory_limit_mb is a hard cap on what the pool reserves per device;
 * past it, after giving back its cache, the library fails the allocation
 * with CUDA_ERROR_OUT_OF_MEMORY. A program (and every framework) expects
 * exactly what the driver gives when the GPU is full: cudaMalloc returns
 * cudaErrorMemoryAllocation, the error is not sticky (cudaGetLastError
 * clears it, the context stays usable), and memory freed afterwards can be
 * allocated again, also when the freed blocks are still held back by the
 * reuse policy (pending, not yet reusable) at the moment of the request.
 *
 * What it does (blocks of 64 MiB, each filled by a kernel with a pattern
 * unique to it as soon as it is allocated):
 *  1. cudaMemGetInfo: with --limit-mb L, total must be L MiB (the library
 *     reports the limit as the total);
 *  2. allocates blocks until cudaMalloc fails or --max blocks are live.
 *     With --limit-mb L it must fail before --max, with
 *     cudaErrorMemoryAllocation, after at least L/64 - 2 blocks (the slack:
 *     the program's own small allocation and the runtime's). Without it it
 *     must reach --max without failing (the plain run: --max keeps it from
 *     taking the whole GPU);
 *  3. after a failure: cudaGetLastError returns that error once, then
 *     cudaSuccess, and a kernel runs and synchronizes cleanly;
 *  4. frees every other block (no synchronization) and allocates again, the
 *     same way: at least half as many blocks as were freed must come back;
 *  5. checks every live block's contents with a kernel (a block handed out
 *     twice shows as the older one's pattern overwritten), frees all;
 *  6. with the library loaded and --limit-mb L: its statistics must show a
 *     reserved peak of at most L MiB and the failed allocations counted.
 * Every other CUDA return code is checked. It prints the line
 *   oom_limit: result first=N freed=F regained=G failures=K
 * and last "oom_limit: PASS" or "oom_limit: FAIL: <why>".
 *
 * Usage: oom_limit [--limit-mb L] [--max N]   (N: 32 by default)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

#define BLOCK_BYTES ((size_t)64 << 20)
#define BLOCK_WORDS (BLOCK_BYTES / 4)
#define MAX_BLOCKS 4096
#define THREADS 256u
#define GRID 1024u

typedef struct blocks {
  uint32_t *p[MAX_BLOCKS];
  uint32_t serial[MAX_BLOCKS];
  int live; /* slots 0..live-1 in use; NULL: freed */
  uint32_t next_serial;
  unsigned long long *d_bad;
  long failures;
  uint64_t my_allocs, my_frees; /* cudaMalloc / cudaFree calls that worked */
} blocks;

/* The library's statistics, when it is loaded: 0 and *s filled, else -1. */
static int library_stats(cudalloc_device_stats *s) {
  void *sym = dlsym(RTLD_DEFAULT, "cudalloc_get_stats");
  gc_get_stats_fn fn;
  if (sym == NULL)
    return -1;
  memcpy(&fn, &sym, sizeof(fn));
  return fn(0, s, sizeof(*s)) == 0 ? 0 : -1;
}

/* After a failed cudaMalloc: the error must be the out-of-memory one, must
 * be the last error once and then cleared, and the context must still run
 * kernels. */
static void check_failure(blocks *b, cudaError_t e, const char *phase) {
  if (e != cudaErrorMemoryAllocation)
    gc_fail("%s: cudaMalloc(64 MiB) failed with %s (%s), expected "
            "cudaErrorMemoryAllocation",
            phase, cudaGetErrorName(e), cudaGetErrorString(e));
  cudaError_t last = cudaGetLastError();
  if (last != cudaErrorMemoryAllocation)
    gc_fail("%s: cudaGetLastError after the failure gave %s, expected "
            "cudaErrorMemoryAllocation",
            phase, cudaGetErrorName(last));
  last = cudaGetLastError();
  if (last != cudaSuccess)
    gc_fail("%s: the error was not cleared: cudaGetLastError then gave %s",
            phase, cudaGetErrorName(last));
  gc_fill_kernel<<<1, 32>>>((uint32_t *)b->d_bad, 2, 0);
  CK_LAUNCH();
  CK(cudaDeviceSynchronize());
  b->failures++;
}

/* Allocates 64 MiB blocks, each filled at once, until cudaMalloc fails or
 * `max_live` are live; new blocks take the freed slots first. Returns how
 * many it got; *failed says whether it stopped on a failure. */
static int allocate_until_full(blocks *b, int max_live, const char *phase,
                               int *failed) {
  int got = 0, live_now = 0;
  for (int i = 0; i < b->live; i++)
    live_now += b->p[i] != NULL;
  *failed = 0;
  for (int i = 0; live_now < max_live && i < MAX_BLOCKS; i++) {
    if (i < b->live && b->p[i] != NULL)
      continue;
    uint32_t *p = NULL;
    cudaError_t e = cudaMalloc((void **)&p, BLOCK_BYTES);
    if (e != cudaSuccess) {
      check_failure(b, e, phase);
      *failed = 1;
      break;
    }
    b->my_allocs++;
    b->p[i] = p;
    b->serial[i] = b->next_serial++;
    gc_fill_kernel<<<GRID, THREADS>>>(p, BLOCK_WORDS, b->serial[i]);
    CK_LAUNCH();
    if (i >= b->live)
      b->live = i + 1;
    got++;
    live_now++;
  }
  return got;
}

/* Frees blocks 0, 2, 4, ... without waiting for their fills. */
static int free_every_other(blocks *b) {
  int freed = 0;
  for (int i = 0; i < b->live; i += 2) {
    if (b->p[i] == NULL)
      continue;
    CK(cudaFree(b->p[i]));
    b->my_frees++;
    b->p[i] = NULL;
    freed++;
  }
  return freed;
}

/* Every live block must still hold its own pattern. Returns the count
 * checked. */
static int verify_all(blocks *b) {
  int checked = 0;
  unsigned long long bad = ~0ull;
  CK(cudaMemset(b->d_bad, 0, sizeof(*b->d_bad)));
  for (int i = 0; i < b->live; i++) {
    if (b->p[i] == NULL)
      continue;
    gc_verify_kernel<<<GRID, THREADS>>>(b->p[i], BLOCK_WORDS, b->serial[i],
                                     b->d_bad);
    CK_LAUNCH();
    checked++;
  }
  CK(cudaMemcpy(&bad, b->d_bad, sizeof(bad), cudaMemcpyDeviceToHost));
  if (bad != 0)
    gc_fail("%llu words wrong in the %d live blocks: a block was handed out "
            "twice or written after its free",
            bad, checked);
  return checked;
}

static void free_all(blocks *b) {
  for (int i = 0; i < b->live; i++)
    if (b->p[i] != NULL) {
      CK(cudaFree(b->p[i]));
      b->my_frees++;
      b->p[i] = NULL;
    }
  CK(cudaFree(b->d_bad));
  b->my_frees++;
  CK(cudaDeviceSynchronize());
}

static void check_info(long limit_mb) {
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  gc_check_mem_info("cudaMemGetInfo", free_b, total_b);
  if (limit_mb > 0 && total_b != (size_t)limit_mb << 20)
    gc_fail("under memory_limit_mb:%ld cudaMemGetInfo gave total=%zu, "
            "expected the limit, %zu",
            limit_mb, total_b, (size_t)limit_mb << 20);
}

/* With the library and a limit: the pool never reserved past it, and it
 * counted the failures. */
static void check_library(long limit_mb, long failures) {
  cudalloc_device_stats s;
  if (library_stats(&s) != 0) {
    printf("oom_limit: library statistics: none (not loaded)\n");
    return;
  }
  printf("oom_limit: library: reserved peak %llu, failed_allocs %llu, "
         "oom_retries %llu, allocs %llu, backend_allocs %llu\n",
         (unsigned long long)s.reserved_bytes.peak,
         (unsigned long long)s.failed_allocs, (unsigned long long)s.oom_retries,
         (unsigned long long)s.allocs, (unsigned long long)s.backend_allocs);
  if (limit_mb <= 0)
    return;
  if (s.reserved_bytes.peak > (uint64_t)limit_mb << 20)
    gc_fail("the pool reserved %llu bytes at its peak, past the limit of "
            "%ld MiB",
            (unsigned long long)s.reserved_bytes.peak, limit_mb);
  if (s.failed_allocs < (uint64_t)failures)
    gc_fail("the program saw %ld failed allocations, the library counted "
            "%llu",
            failures, (unsigned long long)s.failed_allocs);
}

static void parse(int argc, char **argv, long *limit_mb, int *max_blocks) {
  *limit_mb = 0;
  *max_blocks = 32;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--limit-mb") == 0 && i + 1 < argc)
      *limit_mb = strtol(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc)
      *max_blocks = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: oom_limit [--limit-mb L] [--max N]\n");
      exit(2);
    }
  }
  if (*limit_mb < 0 || *max_blocks < 2 || *max_blocks > MAX_BLOCKS)
    gc_fail("bad arguments: --limit-mb %ld --max %d", *limit_mb, *max_blocks);
}

int main(int argc, char **argv) {
  gc_name = "oom_limit";
  setvbuf(stdout, NULL, _IOLBF, 0);
  long limit_mb;
  int max_blocks, failed = 0;
  parse(argc, argv, &limit_mb, &max_blocks);
  blocks *b = (blocks *)calloc(1, sizeof(blocks));
  if (b == NULL)
    gc_fail("host calloc failed");
  b->next_serial = 1;
  CK(cudaSetDevice(0));
  CK(cudaMalloc((void **)&b->d_bad, sizeof(*b->d_bad)));
  b->my_allocs++;
  check_info(limit_mb);

  int first = allocate_until_full(b, max_blocks, "first fill", &failed);
  int want_first = limit_mb > 0 ? (int)(limit_mb / 64) - 2 : max_blocks;
  printf("oom_limit: first fill: %d blocks of 64 MiB, then %s\n", first,
         failed ? "cudaErrorMemoryAllocation" : "--max reached");
  if (limit_mb > 0 && !failed)
    gc_fail("%d blocks of 64 MiB (%d MiB) under a limit of %ld MiB and no "
            "failure: the limit is not enforced",
            first, first * 64, limit_mb);
  if (limit_mb == 0 && failed)
    gc_fail("out of memory after %d blocks of 64 MiB with no limit", first);
  if (first < want_first)
    gc_fail("only %d blocks of 64 MiB before the failure, expected at least "
            "%d",
            first, want_first);

  int freed = free_every_other(b);
  int regained = allocate_until_full(b, max_blocks, "refill", &failed);
  printf("oom_limit: freed %d, regained %d, then %s\n", freed, regained,
         failed ? "cudaErrorMemoryAllocation" : "--max reached");
  if (regained < (freed + 1) / 2)
    gc_fail("freed %d blocks of 64 MiB but could allocate only %d again", freed,
            regained);
  int checked = verify_all(b);
  printf("oom_limit: %d live blocks verified\n", checked);
  free_all(b);
  printf("oom_limit: result first=%d freed=%d regained=%d failures=%ld\n",
         first, freed, regained, b->failures);
  gc_check_stats(GC_EXPECT_ANY, 0, b->my_allocs, b->my_frees);
  check_library(limit_mb, b->failures);
  free(b);
  printf("oom_limit: PASS\n");
  return 0;
}
