/*
 * memory_limit_mb, against the mock driver (whose capacity, 1 GiB by
 * default, is far above the limit): the library, not the driver, must
 * refuse. Preloaded with CUDALLOC_CONF=memory_limit_mb:64,verbose:1,
 * leak_report:0 it checks that
 *  1. a pooled cuMemAlloc past the limit fails with
 *     CUDA_ERROR_OUT_OF_MEMORY, and the library reports it on stderr: the
 *     first line "cudalloc: out of memory on device 0: requested ...",
 *     naming "limit 64.0 MiB", the last the advice to raise the limit
 *     (stderr is captured around the call);
 *  2. the limit covers passed-through memory: with 40 MiB of managed memory
 *     held, a pooled 32 MiB allocation fails; after the managed block is
 *     freed it succeeds;
 *  3. and the other way round: managed 40 MiB while the pool holds 32 MiB
 *     live fails; once those 32 MiB are freed it succeeds (the pool gives
 *     its cache back to make room);
 *  4. the limit is the device's: 8 threads in two contexts of device 0 (two
 *     pools) allocate and free pooled and managed memory at random, far
 *     past the limit together; the mock never holds more than 64 MiB at
 *     once (its own peak), refusals are out of memory, both contexts are
 *     served, and once all is freed and the second context destroyed,
 *     cuMemGetInfo reports the whole 64 MiB free again.
 * Run plainly, every one of these calls succeeds: no limit, so a refusal
 * above is the library's. The mode comes from whether cudalloc_version is
 * loaded; E2E_EXPECT (plain|pooled, set by CTest) makes sure the preload
 * really happened. Last line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static bool limited; /* preloaded: the limit of 64 MiB applies */

#define MiB (1ull << 20)

#define E2E_NAME "e2e_limits"
#include "e2e_check.h"
#include "mockcuda.h"

/* The call must succeed plainly and fail with CUDA_ERROR_OUT_OF_MEMORY
 * under the limit. */
#define EXPECT_OOM_IF_LIMITED(call)                                            \
  do {                                                                         \
    CUresult rc_ = (call);                                                     \
    CUresult want_ = limited ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;        \
    if (rc_ != want_)                                                          \
      FAIL("%s = %d, expected %d (line %d)", #call, (int)rc_, (int)want_,      \
           __LINE__);                                                          \
  } while (0)

static void pooled_past_the_limit(void) {
  CUdeviceptr p = 0;
  capture c;
  capture_begin(&c);
  CUresult rc = cuMemAlloc(&p, 80 * MiB);
  char *err = capture_end(&c);
  if (!limited) {
    if (rc != CUDA_SUCCESS)
      FAIL("plain cuMemAlloc(80 MiB) = %d", (int)rc);
    else
      CHECK(cuMemFree(p));
    fputs(err, stderr);
    free(err);
    return;
  }
  if (rc != CUDA_ERROR_OUT_OF_MEMORY)
    FAIL("cuMemAlloc(80 MiB) past a 64 MiB limit = %d, expected %d", (int)rc,
         (int)CUDA_ERROR_OUT_OF_MEMORY);
  if (rc == CUDA_SUCCESS)
    CHECK(cuMemFree(p));
  /* One report: its first line the request naming the limit, its last
   * what would help. */
  static const char prefix[] =
      "cudalloc: out of memory on device 0: requested";
  static const char advice[] =
      "cudalloc: what would help: memory_limit_mb caps the device";
  int lines = 0, oom_lines = 0;
  bool names_limit = false, advised = false;
  for (char *line = err, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next)
      *next++ = '\0';
    if (lines++ == 0 && strncmp(line, prefix, sizeof(prefix) - 1) == 0)
      names_limit = strstr(line, "limit 64.0 MiB") != NULL;
    oom_lines += strncmp(line, prefix, sizeof(prefix) - 1) == 0;
    advised = strncmp(line, advice, sizeof(advice) - 1) == 0;
    fprintf(stderr, "e2e_limits: captured: %s\n", line);
  }
  if (oom_lines != 1 || !names_limit || !advised)
    FAIL("stderr during the refused cuMemAlloc: %d line(s), %d starting "
         "\"%s\" (the first naming \"limit 64.0 MiB\": %d), the last the "
         "advice: %d; expected one report",
         lines, oom_lines, prefix, names_limit, advised);
  free(err);
}

static void passed_through_counts_toward_the_limit(void) {
  CUdeviceptr managed = 0, pooled = 0, other = 0;

  /* Managed memory held: the pool may not take 32 MiB more. */
  CHECK(cuMemAllocManaged(&managed, 40 * MiB, CU_MEM_ATTACH_GLOBAL));
  EXPECT_OOM_IF_LIMITED(cuMemAlloc(&pooled, 32 * MiB));
  if (!limited)
    CHECK(cuMemFree(pooled));
  CHECK(cuMemFree(managed));
  /* Gone: now it may. */
  pooled = 0;
  CHECK(cuMemAlloc(&pooled, 32 * MiB));
  CHECK(cuMemsetD8(pooled, 0x5a, 32 * MiB));

  /* The pool's 32 MiB live: managed memory may not take 40 MiB more. */
  EXPECT_OOM_IF_LIMITED(
      cuMemAllocManaged(&other, 40 * MiB, CU_MEM_ATTACH_GLOBAL));
  if (!limited)
    CHECK(cuMemFree(other));
  /* Freed, they sit in the pool's cache: it gives them back to make room. */
  CHECK(cuMemFree(pooled));
  other = 0;
  CHECK(cuMemAllocManaged(&other, 40 * MiB, CU_MEM_ATTACH_GLOBAL));
  CHECK(cuMemsetD8(other, 0xa5, 40 * MiB));
  CHECK(cuMemFree(other));
}

#define RACERS 8
#define RACER_SLOTS 4
#define RACER_STEPS 2000

/* The racers start together: on a loaded machine threads started one by
 * one could each finish before the next began, and never meet the limit
 * together (expandable segments, which hold no cache, then saw no
 * refusal at all). */
static pthread_barrier_t racers_ready;

typedef struct racer {
  CUcontext ctx;
  unsigned rng;
  int served, refused, failed;
} racer;

/* Allocates and frees at random in its context: pooled and managed blocks
 * of 2 to 12 MiB (managed in whole 2 MiB, so that the mock takes exactly
 * what is asked), up to RACER_SLOTS at once. */
static void *race(void *arg) {
  racer *r = arg;
  CUdeviceptr held[RACER_SLOTS] = {0};
  bool managed[RACER_SLOTS] = {false};
  if (cuCtxSetCurrent(r->ctx) != CUDA_SUCCESS)
    r->failed++;
  pthread_barrier_wait(&racers_ready);
  if (r->failed)
    return NULL;
  for (int step = 0; step < RACER_STEPS; step++) {
    int i = rand_r(&r->rng) % RACER_SLOTS;
    if (held[i]) {
      if (cuMemFree(held[i]) != CUDA_SUCCESS)
        r->failed++;
      held[i] = 0;
      continue;
    }
    size_t size = (size_t)(1 + rand_r(&r->rng) % 6) * 2 * MiB;
    managed[i] = rand_r(&r->rng) % 4 == 0;
    CUresult rc = managed[i]
                      ? cuMemAllocManaged(&held[i], size, CU_MEM_ATTACH_GLOBAL)
                      : cuMemAlloc(&held[i], size);
    if (rc == CUDA_SUCCESS)
      r->served++;
    else if (rc == CUDA_ERROR_OUT_OF_MEMORY)
      r->refused++;
    else
      r->failed++;
    if (rc != CUDA_SUCCESS)
      held[i] = 0;
  }
  for (int i = 0; i < RACER_SLOTS; i++)
    if (held[i] && cuMemFree(held[i]) != CUDA_SUCCESS)
      r->failed++;
  return NULL;
}

static void two_contexts_share_the_limit(CUcontext primary, CUdevice dev) {
  CUcontext second = NULL;
  CHECK(cuCtxCreate(&second, NULL, 0, dev));
  CHECK(cuCtxSetCurrent(primary));
  racer racers[RACERS];
  pthread_t threads[RACERS];
  capture c; /* each refused pooled request says so (verbose:1) */
  capture_begin(&c);
  pthread_barrier_init(&racers_ready, NULL, RACERS);
  for (int t = 0; t < RACERS; t++) {
    racers[t] = (racer){.ctx = t % 2 ? second : primary, .rng = 77u + t};
    pthread_create(&threads[t], NULL, race, &racers[t]);
  }
  int served[2] = {0, 0}, refused = 0, failed = 0;
  for (int t = 0; t < RACERS; t++) {
    pthread_join(threads[t], NULL);
    served[t % 2] += racers[t].served;
    refused += racers[t].refused;
    failed += racers[t].failed;
  }
  pthread_barrier_destroy(&racers_ready);
  free(capture_end(&c));
  mockcuda_counters n;
  mockcuda_get_counters(&n);
  printf("e2e_limits: two contexts, %d threads: %d + %d served, %d refused, "
         "device peak %llu MiB\n",
         RACERS, served[0], served[1], refused,
         (unsigned long long)(n.peak_used_bytes / MiB));
  if (failed)
    FAIL("%d calls failed other than out of memory", failed);
  if (!served[0] || !served[1])
    FAIL("a context was never served (%d, %d)", served[0], served[1]);
  if (limited && n.peak_used_bytes > 64 * MiB)
    FAIL("the device held %llu MiB at once under a 64 MiB limit",
         (unsigned long long)(n.peak_used_bytes / MiB));
  /* The race must have pressed on the limit: something refused, or the
   * device full to the limit (a pool that keeps no cache, as with
   * expandable segments, can serve every request of a run whose live
   * bytes never passed it). */
  if (limited && refused == 0 && n.peak_used_bytes < 64 * MiB)
    FAIL("nothing was refused and the device peaked at %llu MiB: the threads "
         "never reached the limit", (unsigned long long)(n.peak_used_bytes / MiB));
  CHECK(cuCtxDestroy(second));
  CHECK(cuCtxSetCurrent(primary));
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  if (limited && (free_bytes != 64 * MiB || total != 64 * MiB))
    FAIL("with nothing held, cuMemGetInfo = %zu free of %zu, expected 64 MiB "
         "of 64 MiB",
         free_bytes, total);
}

int main(void) {
  limited = e2e_preloaded();

  CUdevice dev;
  CUcontext ctx = NULL;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));

  pooled_past_the_limit();
  passed_through_counts_toward_the_limit();
  two_contexts_share_the_limit(ctx, dev);

  CHECK(cuDevicePrimaryCtxRelease(dev));
  printf("%s e2e_limits (%s, %d failure(s))\n", failures ? "FAIL" : "PASS",
         limited ? "limit 64 MiB" : "plain", failures);
  return failures ? 1 : 0;
}
