/*
 * expandable_segments:1 in front of a program, against the mock driver
 * (whose virtual-memory API answers as the H200's, driver_facts.txt).
 * Preloaded with CUDALLOC_CONF=expandable_segments:1,leak_report:0, it
 * checks that
 *  1. large allocations come from mapped pages: the mock holds ranges and
 *     mappings (cuMemAddressReserve, cuMemMap), and the pool reserves just
 *     what the blocks span;
 *  2. a block answers as its own allocation: cuMemGetAddressRange and
 *     RANGE_START_ADDR/RANGE_SIZE of an interior pointer name the block,
 *     IS_LEGACY_CUDA_IPC_CAPABLE says 0, and cuIpcGetMemHandle fails with
 *     CUDA_ERROR_INVALID_VALUE and one line naming expandable_segments:0;
 *     a small block (plain segments) still exports;
 *  3. freeing the middle block of three and cudalloc_empty_cache() gives
 *     its pages back to the driver (the mock's used memory falls by them)
 *     while the blocks around it keep their bytes;
 *  4. everything freed and the cache emptied, the driver holds nothing.
 * With E2E_VMM=refused (the mock's MOCKCUDA_VMM=0: no virtual-memory API)
 * it checks instead that the program is served by plain segments and the
 * library says so in one line. Last line: PASS or FAIL.
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

#define MiB (1ull << 20)

#define E2E_NAME "e2e_expandable"
#include "cudalloc.h"
#include "e2e_check.h"
#include "mockcuda.h"

static void fill(CUdeviceptr p, size_t n, unsigned char v) {
  CHECK(cuMemsetD8(p, v, n));
}

static void expect_bytes(CUdeviceptr p, size_t n, unsigned char v) {
  unsigned char first = 0, last = 0;
  CHECK(cuMemcpyDtoH(&first, p, 1));
  CHECK(cuMemcpyDtoH(&last, p + n - 1, 1));
  if (first != v || last != v)
    FAIL("block %#llx lost its bytes: %#x %#x, expected %#x",
         (unsigned long long)p, first, last, v);
}

/* The library's API, found in the process (the program does not link it). */
static int (*get_stats)(int, cudalloc_device_stats *, size_t);
static uint64_t (*empty_cache)(void);

static uint64_t reserved(void) {
  cudalloc_device_stats s = {0};
  get_stats(0, &s, sizeof(s));
  return s.reserved_bytes.current;
}

static uint64_t driver_used(void) {
  size_t fr = 0, tot = 0;
  CHECK(cuMemGetInfo(&fr, &tot));
  return tot - fr;
}

static void answers_as_its_own_allocation(CUdeviceptr b, size_t n) {
  CUdeviceptr base = 0, start = 0;
  size_t size = 0, rsize = 0;
  unsigned legacy = 7;
  CHECK(cuMemGetAddressRange(&base, &size, b + MiB));
  CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, b + MiB));
  CHECK(cuPointerGetAttribute(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, b + MiB));
  CHECK(cuPointerGetAttribute(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, b));
  if (base != b || size != n || start != b || rsize != n)
    FAIL("block %#llx (%zu bytes) answers range %#llx+%zu, attributes %#llx+%zu",
         (unsigned long long)b, n, (unsigned long long)base, size,
         (unsigned long long)start, rsize);
  if (legacy != 0)
    FAIL("IS_LEGACY_CUDA_IPC_CAPABLE of a mapped block = %u, expected 0", legacy);
  CUipcMemHandle h;
  capture c;
  capture_begin(&c);
  CUresult rc = cuIpcGetMemHandle(&h, b);
  char *err = capture_end(&c);
  if (rc != CUDA_ERROR_INVALID_VALUE)
    FAIL("cuIpcGetMemHandle of a mapped block = %d, expected %d", (int)rc,
         (int)CUDA_ERROR_INVALID_VALUE);
  if (!strstr(err, "expandable_segments:0") || strchr(err, '\n') != strrchr(err, '\n'))
    FAIL("cuIpcGetMemHandle's refusal should be one line naming "
         "expandable_segments:0, got: %s", err);
  free(err);
  CUdeviceptr small = 0;
  CHECK(cuMemAlloc(&small, 4096));
  CHECK(cuIpcGetMemHandle(&h, small)); /* small blocks: plain segments */
  CHECK(cuMemFree(small));
}

static void gives_back_the_middle(void) {
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK(cuMemAlloc(&a, 8 * MiB));
  CHECK(cuMemAlloc(&b, 40 * MiB));
  CHECK(cuMemAlloc(&c, 8 * MiB));
  mockcuda_counters k;
  mockcuda_get_counters(&k);
  if (k.live_handles < 28)
    FAIL("56 MiB of blocks should be 28 pages of the driver's, saw %llu handles",
         (unsigned long long)k.live_handles);
  fill(a, 8 * MiB, 0xa);
  fill(b, 40 * MiB, 0xb);
  fill(c, 8 * MiB, 0xc);
  answers_as_its_own_allocation(b, 40 * MiB);
  uint64_t before = driver_used(), held = reserved();
  CHECK(cuMemFree(b));
  uint64_t back = empty_cache();
  uint64_t after = driver_used();
  if (back < 38 * MiB || before - after < 38 * MiB || held - reserved() < 38 * MiB)
    FAIL("the middle block's pages should go back: empty_cache %llu, driver "
         "%llu -> %llu, reserved %llu -> %llu",
         (unsigned long long)back, (unsigned long long)before,
         (unsigned long long)after, (unsigned long long)held,
         (unsigned long long)reserved());
  expect_bytes(a, 8 * MiB, 0xa);
  expect_bytes(c, 8 * MiB, 0xc);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(c));
  empty_cache();
  if (reserved() != 0 || driver_used() != 0)
    FAIL("all freed and the cache emptied, yet reserved %llu, driver holds %llu",
         (unsigned long long)reserved(), (unsigned long long)driver_used());
}

/* No virtual-memory API: plain segments, one line saying so. */
static void falls_back(void) {
  CUdeviceptr a = 0;
  capture c;
  capture_begin(&c);
  CHECK(cuMemAlloc(&a, 40 * MiB));
  CUdeviceptr b = 0;
  CHECK(cuMemAlloc(&b, 40 * MiB));
  char *err = capture_end(&c);
  if (!strstr(err, "expandable_segments:1 is off") ||
      strchr(err, '\n') != strrchr(err, '\n'))
    FAIL("the fallback should say so in one line, got: %s", err);
  free(err);
  fill(a, 40 * MiB, 1);
  expect_bytes(a, 40 * MiB, 1);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
}

int main(void) {
  e2e_preloaded();
  get_stats = (int (*)(int, cudalloc_device_stats *, size_t))dlsym(
      RTLD_DEFAULT, "cudalloc_get_stats");
  empty_cache = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "cudalloc_empty_cache");
  if (!get_stats || !empty_cache) {
    printf("FAIL " E2E_NAME ": the library's API is not in the process\n");
    return 1;
  }
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  const char *vmm = getenv("E2E_VMM");
  if (vmm && strcmp(vmm, "refused") == 0)
    falls_back();
  else
    gives_back_the_middle();
  if (failures) {
    printf("FAIL " E2E_NAME " (%d failure(s))\n", failures);
    return 1;
  }
  printf("PASS " E2E_NAME "\n");
  return 0;
}
