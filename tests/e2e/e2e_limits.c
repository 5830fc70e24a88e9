/*
 * memory_limit_mb, against the mock driver (whose capacity, 1 GiB by
 * default, is far above the limit): the library, not the driver, must
 * refuse. Preloaded with CUDALLOC_CONF=memory_limit_mb:64,verbose:1,
 * leak_report:0 it checks that
 *  1. a pooled cuMemAlloc past the limit fails with
 *     CUDA_ERROR_OUT_OF_MEMORY, and the library says so in exactly one line
 *     on stderr, "cudalloc: out of memory on device 0: requested ...",
 *     naming "limit 64.0 MiB" (stderr is captured around the call);
 *  2. the limit covers passed-through memory: with 40 MiB of managed memory
 *     held, a pooled 32 MiB allocation fails; after the managed block is
 *     freed it succeeds;
 *  3. and the other way round: managed 40 MiB while the pool holds 32 MiB
 *     live fails; once those 32 MiB are freed it succeeds (the pool gives
 *     its cache back to make room).
 * Run plainly, every one of these calls succeeds: no limit, so a refusal
 * above is the library's. The mode comes from whether cudalloc_version is
 * loaded; E2E_EXPECT (plain|pooled, set by CTest) makes sure the preload
 * really happened. Last line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
static bool limited; /* preloaded: the limit of 64 MiB applies */

#define MiB (1ull << 20)

#define E2E_NAME "e2e_limits"
#include "e2e_check.h"

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
  /* Exactly one line, and it is the out-of-memory line naming the limit. */
  static const char prefix[] =
      "cudalloc: out of memory on device 0: requested";
  int lines = 0, oom_lines = 0;
  bool names_limit = false;
  for (char *line = err, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next)
      *next++ = '\0';
    lines++;
    if (strncmp(line, prefix, sizeof(prefix) - 1) == 0) {
      oom_lines++;
      names_limit = names_limit || strstr(line, "limit 64.0 MiB") != NULL;
    }
    fprintf(stderr, "e2e_limits: captured: %s\n", line);
  }
  if (lines != 1 || oom_lines != 1)
    FAIL("stderr during the refused cuMemAlloc: %d line(s), %d starting "
         "\"%s\"; expected exactly 1",
         lines, oom_lines, prefix);
  if (oom_lines > 0 && !names_limit)
    FAIL("the out-of-memory line does not name \"limit 64.0 MiB\"");
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

  CHECK(cuDevicePrimaryCtxRelease(dev));
  printf("%s e2e_limits (%s, %d failure(s))\n", failures ? "FAIL" : "PASS",
         limited ? "limit 64 MiB" : "plain", failures);
  return failures ? 1 : 0;
}
