/*
 * Context deaths, against the mock driver: each pool belongs to one CUDA
 * context, and when a context dies (destroyed, reset, released for the
 * last time) exactly its memory dies. Every block the program is handed
 * afterwards must be usable, and every block of a context still alive must
 * stay the program's. Each case checks it with cuMemsetD8 on the blocks
 * (the mock refuses addresses that no live context owns).
 *
 * Cases:
 *  1. primary first, then the program's own context allocates a segment of
 *     its own, frees it and is destroyed: the next primary allocation must
 *     not come from the dead segment;
 *  2. own context first, then the primary: destroying the own context
 *     leaves the primary's block alive and freeable;
 *  3. the primary released to a count of zero: after a new retain, blocks
 *     are usable;
 *  4. cudaDeviceReset (cuDevicePrimaryCtxReset) with a block unfreed: later
 *     blocks usable;
 *  5. threads each creating a context, allocating (one block left unfreed,
 *     so the death has something to report), using the blocks and
 *     destroying it, over and over at once: a context dying in one thread
 *     must never lend its memory to another thread's new context (the
 *     driver may give the new context the dead one's handle).
 * Runs plain and preloaded (E2E_EXPECT as in e2e_common.h): the same
 * results either way. Last line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static atomic_int failures; /* the threads of case 5 count into it too */

#define E2E_NAME "e2e_contexts"
#include "e2e_check.h"

static CUdevice dev;

static CUcontext primary(void) {
  CUcontext ctx = NULL;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

static void own_context_dies_alone(void) {
  CUcontext prim = primary(), mine = NULL;
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuCtxCreate(&mine, NULL, 0, dev));
  CHECK(cuMemAlloc(&b, 3u << 20));
  CHECK(cuMemFree(b));
  CHECK(cuCtxDestroy(mine));
  CHECK(cuCtxSetCurrent(prim));
  CHECK(cuMemAlloc(&c, 3u << 20));
  CHECK(cuMemsetD8(c, 1, 3u << 20));
  CHECK(cuMemFree(c));
  CHECK(cuMemFree(a));
  CHECK(cuDevicePrimaryCtxRelease(dev));
}

static void primary_survives_own_context(void) {
  CUcontext prim = primary(), mine = NULL;
  CUdeviceptr a = 0, b = 0;
  CHECK(cuCtxCreate(&mine, NULL, 0, dev));
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuCtxPushCurrent(prim));
  CHECK(cuMemAlloc(&b, 4096));
  CHECK(cuCtxPopCurrent(NULL));
  CHECK(cuCtxDestroy(mine));
  CHECK(cuCtxSetCurrent(prim));
  CHECK(cuMemsetD8(b, 1, 4096));
  CHECK(cuMemFree(b));
  CHECK(cuDevicePrimaryCtxRelease(dev));
}

static void last_release_kills_the_primary(void) {
  CUdeviceptr a = 0, b = 0;
  primary();
  CHECK(cuMemAlloc(&a, 4096));
  CHECK(cuMemFree(a));
  CHECK(cuCtxSetCurrent(NULL));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  primary();
  CHECK(cuMemAlloc(&b, 4096));
  CHECK(cuMemsetD8(b, 1, 4096));
  CHECK(cuMemFree(b));
  CHECK(cuDevicePrimaryCtxRelease(dev));
}

static void reset_kills_the_primary(void) {
  CUdeviceptr a = 0, b = 0;
  primary();
  CHECK(cuMemAlloc(&a, 1u << 20)); /* never freed: dies in the reset */
  CHECK(cuDevicePrimaryCtxReset(dev));
  primary();
  CHECK(cuMemAlloc(&b, 1u << 20));
  CHECK(cuMemsetD8(b, 1, 1u << 20));
  CHECK(cuMemFree(b));
  CHECK(cuDevicePrimaryCtxRelease(dev));
}

#define THREADS 4
#define ROUNDS 25

static void *context_churn(void *arg) {
  size_t unit = 4096 * (1 + (size_t)(uintptr_t)arg);
  for (int round = 0; round < ROUNDS; round++) {
    CUcontext ctx = NULL;
    CUdeviceptr p[8];
    CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    for (int i = 0; i < 8; i++) {
      CHECK(cuMemAlloc(&p[i], unit * (size_t)(1 + i)));
      CHECK(cuMemsetD8(p[i], 1, unit * (size_t)(1 + i)));
    }
    for (int i = 0; i < 7; i++)
      CHECK(cuMemFree(p[i]));
    for (int i = 0; i < 4; i++) {
      CHECK(cuMemAlloc(&p[i], unit * (size_t)(1 + i)));
      CHECK(cuMemsetD8(p[i], 2, unit * (size_t)(1 + i)));
      CHECK(cuMemFree(p[i]));
    }
    CHECK(cuCtxDestroy(ctx)); /* p[7] dies unfreed */
  }
  return NULL;
}

static void contexts_die_while_others_allocate(void) {
  pthread_t threads[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&threads[i], NULL, context_churn, (void *)(uintptr_t)i);
  for (int i = 0; i < THREADS; i++)
    pthread_join(threads[i], NULL);
}

int main(void) {
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  own_context_dies_alone();
  primary_survives_own_context();
  last_release_kills_the_primary();
  reset_kills_the_primary();
  contexts_die_while_others_allocate();
  int n = atomic_load(&failures);
  printf("%s e2e_contexts (%d failure(s))\n", n ? "FAIL" : "PASS", n);
  return n ? 1 : 0;
}
