/*
 * One process, two devices, against the mock driver (two devices by
 * default), preloaded. It checks that
 *  1. allocations on each device come from that device's pool: the
 *     statistics per device count what was made there, and every block's
 *     DEVICE_ORDINAL is its device;
 *  2. four threads switching between the two devices' contexts at every
 *     step allocate, write and free (half of the frees with the other
 *     device current) with every block on the device that was current,
 *     and both pools end empty;
 *  3. a device-to-device copy between pooled blocks of the two devices
 *     carries the bytes;
 *  4. a reset of device 1 drops its pool and leaves device 0's blocks,
 *     bytes and statistics as they were; device 1 serves again after;
 *  5. cudalloc_print_report groups live blocks by device;
 * and, with E2E_LIMIT=64 (CUDALLOC_CONF=memory_limit_mb:64), that the
 * limit is each device's: 48 MiB fit on each, a second 48 MiB on device 0
 * does not. Last line: PASS or FAIL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int failures;

#define MiB (1ull << 20)
#define E2E_NAME "e2e_multi"
#include "cudalloc.h"
#include "e2e_check.h"

static CUcontext ctx[2];
static int (*get_stats)(int, cudalloc_device_stats *, size_t);
static void (*print_report)(void);

static cudalloc_device_stats stats(int device) {
  cudalloc_device_stats s = {0};
  get_stats(device, &s, sizeof(s));
  return s;
}

static int ordinal_of(CUdeviceptr p) {
  int ord = -1;
  CHECK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
  return ord;
}

static CUdeviceptr alloc_on(int device, size_t size) {
  CUdeviceptr p = 0;
  CHECK(cuCtxSetCurrent(ctx[device]));
  CHECK(cuMemAlloc(&p, size));
  if (p && ordinal_of(p) != device)
    FAIL("a block allocated on device %d lies on device %d", device, ordinal_of(p));
  return p;
}

static void per_device_pools(void) {
  uint64_t allocs0 = stats(0).allocs, allocs1 = stats(1).allocs;
  CUdeviceptr a[3], b[2];
  for (int i = 0; i < 3; i++)
    a[i] = alloc_on(0, (i + 1) * MiB);
  for (int i = 0; i < 2; i++)
    b[i] = alloc_on(1, 4096);
  cudalloc_device_stats s0 = stats(0), s1 = stats(1);
  if (s0.allocs - allocs0 != 3 || s1.allocs - allocs1 != 2 ||
      s0.requested_bytes.current != 6 * MiB || s1.requested_bytes.current != 8192)
    FAIL("per device: %llu/%llu allocations, %llu/%llu bytes live; want 3/2, 6 MiB/8 KiB",
         (unsigned long long)(s0.allocs - allocs0), (unsigned long long)(s1.allocs - allocs1),
         (unsigned long long)s0.requested_bytes.current,
         (unsigned long long)s1.requested_bytes.current);
  /* Freed with the other device current. */
  CHECK(cuCtxSetCurrent(ctx[1]));
  for (int i = 0; i < 3; i++)
    CHECK(cuMemFree(a[i]));
  CHECK(cuCtxSetCurrent(ctx[0]));
  for (int i = 0; i < 2; i++)
    CHECK(cuMemFree(b[i]));
  if (stats(0).blocks.current != 0 || stats(1).blocks.current != 0)
    FAIL("frees with the other device current left blocks live");
}

static void *switching_thread(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  CUdeviceptr held[8] = {0};
  for (int step = 0; step < 400; step++) {
    int device = step & 1, i = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 8;
    CHECK(cuCtxSetCurrent(ctx[device]));
    if (held[i]) {
      CHECK(cuMemFree(held[i]));
      held[i] = 0;
      continue;
    }
    size_t size = 512 + ((seed >> 8) % 4096) * 512;
    CHECK(cuMemAlloc(&held[i], size));
    if (held[i] && ordinal_of(held[i]) != device)
      FAIL("thread: a block allocated on device %d lies on device %d", device,
           ordinal_of(held[i]));
    CHECK(cuMemsetD8(held[i], (unsigned char)step, size));
  }
  CHECK(cuCtxSetCurrent(ctx[0]));
  for (int i = 0; i < 8; i++)
    if (held[i])
      CHECK(cuMemFree(held[i]));
  return NULL;
}

static void threads_switching_devices(void) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, switching_thread, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  if (stats(0).blocks.current != 0 || stats(1).blocks.current != 0)
    FAIL("after the threads: %llu and %llu blocks still live",
         (unsigned long long)stats(0).blocks.current,
         (unsigned long long)stats(1).blocks.current);
}

static void copy_between_devices(void) {
  CUdeviceptr a = alloc_on(0, 2 * MiB), b = alloc_on(1, 2 * MiB);
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemsetD8(a, 0x5e, 2 * MiB));
  CHECK(cuMemcpyDtoD(b, a, 2 * MiB));
  unsigned char last = 0;
  CHECK(cuMemcpyDtoH(&last, b + 2 * MiB - 1, 1));
  if (last != 0x5e)
    FAIL("device 1's block holds %#x after the copy from device 0", last);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
}

static void reset_one_device(void) {
  CUdeviceptr a = alloc_on(0, 3 * MiB);
  CHECK(cuMemsetD8(a, 0x11, 3 * MiB));
  alloc_on(1, 3 * MiB); /* dies with the reset */
  cudalloc_device_stats before = stats(0);
  CHECK(cuDevicePrimaryCtxReset(1));
  cudalloc_device_stats after = stats(0), s1 = stats(1);
  unsigned char first = 0;
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemcpyDtoH(&first, a, 1));
  if (first != 0x11 || after.blocks.current != before.blocks.current ||
      after.reserved_bytes.current != before.reserved_bytes.current)
    FAIL("device 1's reset touched device 0's pool (byte %#x, %llu -> %llu blocks)", first,
         (unsigned long long)before.blocks.current, (unsigned long long)after.blocks.current);
  if (s1.blocks.current != 0 || s1.reserved_bytes.current != 0)
    FAIL("device 1's pool outlived its reset: %llu blocks",
         (unsigned long long)s1.blocks.current);
  CUdevice d1;
  CHECK(cuDeviceGet(&d1, 1));
  CHECK(cuDevicePrimaryCtxRetain(&ctx[1], d1));
  CHECK(cuMemFree(alloc_on(1, MiB)));
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFree(a));
}

static void report_groups_by_device(void) {
  CUdeviceptr a = alloc_on(0, 5 * MiB), b = alloc_on(1, 7 * MiB);
  capture c;
  capture_begin(&c);
  print_report();
  char *out = capture_end(&c);
  if (!strstr(out, "in 1 allocation(s) of 5242880 bytes on device 0") ||
      !strstr(out, "in 1 allocation(s) of 7340032 bytes on device 1"))
    FAIL("the report does not group the live blocks by device:\n%s", out);
  free(out);
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
}

static void limit_per_device(void) {
  CUdeviceptr a = alloc_on(0, 48 * MiB), b = alloc_on(1, 48 * MiB), c = 0;
  CHECK(cuCtxSetCurrent(ctx[0]));
  CUresult rc = cuMemAlloc(&c, 48 * MiB);
  if (rc != CUDA_ERROR_OUT_OF_MEMORY)
    FAIL("a second 48 MiB on device 0 under a 64 MiB limit: %d, want out of memory", (int)rc);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
}

int main(void) {
  e2e_preloaded();
  get_stats = (int (*)(int, cudalloc_device_stats *, size_t))dlsym(RTLD_DEFAULT,
                                                                   "cudalloc_get_stats");
  print_report = (void (*)(void))dlsym(RTLD_DEFAULT, "cudalloc_print_report");
  if (!get_stats || !print_report) {
    printf("FAIL " E2E_NAME ": the library's API is not in the process\n");
    return 1;
  }
  int n = 0;
  CHECK(cuInit(0));
  CHECK(cuDeviceGetCount(&n));
  if (n < 2) {
    printf("FAIL " E2E_NAME ": the mock has %d device(s), want 2\n", n);
    return 1;
  }
  for (int d = 0; d < 2; d++) {
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, d));
    CHECK(cuDevicePrimaryCtxRetain(&ctx[d], dev));
  }
  if (getenv("E2E_LIMIT")) {
    limit_per_device();
  } else {
    per_device_pools();
    threads_switching_devices();
    copy_between_devices();
    reset_one_device();
    report_groups_by_device();
  }
  int f = atomic_load(&failures);
  printf("%s " E2E_NAME " (%d failure(s))\n", f ? "FAIL" : "PASS", f);
  return f ? 1 : 0;
}
