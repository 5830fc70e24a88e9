/*
 * driver_api: a program that uses the CUDA driver API directly, linked to
 * libcuda (-lcuda), with no runtime in between.
 *
 * Why: such a program binds cuMemAlloc_v2/cuMemFree_v2 at load time, to the
 * first definition in the global scope; only the library's exported driver
 * names (the first of its three ways in) can catch these calls. The runtime
 * programs (alloc_fill) prove the other two ways.
 *
 * What it does and checks: cuInit, the primary context of device 0 made
 * current, then a loop (2000 iterations by default) of mixed sizes, 256 B
 * to 16 MiB (log-uniform, deterministic PRNG), up to 32 buffers live. Each
 * cuMemAlloc'd buffer is checked to be aligned and not to overlap a live
 * one, is filled with cuMemsetD32 (a value unique to the buffer) plus a
 * stamp in its first and last words with cuMemcpyHtoD, and is copied back
 * whole with cuMemcpyDtoH and checked at once and again just before its
 * cuMemFree (a block handed out twice shows as the older buffer's values
 * overwritten). cuMemGetInfo must stay sane. At the end, the library's
 * statistics, held to the expectation given as the first argument (see
 * gpu_check.h). Every driver return code is checked. Last line:
 * "driver_api: PASS" or "driver_api: FAIL: <why>".
 *
 * Usage: driver_api <plain|pooled|passthrough|any> [iterations] [max_log2]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpu_check.h"

static const char *err_name(CUresult r) {
  const char *name = NULL;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
    return "unknown error";
  return name;
}

#define CK(call)                                                               \
  do {                                                                         \
    CUresult ck_r_ = (call);                                                   \
    if (ck_r_ != CUDA_SUCCESS)                                                 \
      gc_fail("%s:%d: %s returned %d (%s)", __FILE__, __LINE__, #call,         \
              (int)ck_r_, err_name(ck_r_));                                    \
  } while (0)

#define MAX_LIVE 32u

typedef struct buffer {
  CUdeviceptr p;
  size_t bytes;
  uint32_t serial;
} buffer;

static uint32_t *host; /* one host buffer of the largest size */
static uint64_t my_allocs, my_frees;
static unsigned long long checked_bytes;

/* The value every word of buffer `serial` holds, and its two stamps. */
static uint32_t fill_value(uint32_t serial) { return gc_pattern(serial, 0); }
static uint32_t head_stamp(uint32_t serial) { return ~serial; }
static uint32_t tail_stamp(uint32_t serial) { return serial ^ 0x5A5A5A5Au; }

static void fill(const buffer *b) {
  size_t n = b->bytes / 4;
  uint32_t head = head_stamp(b->serial), tail = tail_stamp(b->serial);
  CK(cuMemsetD32(b->p, fill_value(b->serial), n));
  CK(cuMemcpyHtoD(b->p, &head, 4));
  CK(cuMemcpyHtoD(b->p + (n - 1) * 4, &tail, 4));
}

static void check(const buffer *b, long iteration, const char *when) {
  size_t n = b->bytes / 4;
  CK(cuMemcpyDtoH(host, b->p, b->bytes));
  uint32_t v = fill_value(b->serial);
  for (size_t i = 0; i < n; i++) {
    uint32_t want = i == 0       ? head_stamp(b->serial)
                    : i == n - 1 ? tail_stamp(b->serial)
                                 : v;
    if (host[i] != want)
      gc_fail("iteration %ld, %s: buffer #%u (%zu bytes at 0x%llx) word %zu "
              "is 0x%08x, expected 0x%08x",
              iteration, when, b->serial, b->bytes, (unsigned long long)b->p,
              i, host[i], want);
  }
  checked_bytes += b->bytes;
}

static void check_placement(const buffer *b, const buffer *live,
                            unsigned nlive, long iteration) {
  if (b->p == 0 || b->p % 256 != 0)
    gc_fail("iteration %ld: cuMemAlloc(%zu) gave 0x%llx, not 256-byte "
            "aligned",
            iteration, b->bytes, (unsigned long long)b->p);
  for (unsigned j = 0; j < nlive; j++) {
    if (b->p < live[j].p + live[j].bytes && live[j].p < b->p + b->bytes)
      gc_fail("iteration %ld: new buffer [0x%llx, +%zu) overlaps live "
              "buffer #%u [0x%llx, +%zu)",
              iteration, (unsigned long long)b->p, b->bytes, live[j].serial,
              (unsigned long long)live[j].p, live[j].bytes);
  }
}

static void check_mem_info(const char *when) {
  size_t free_b = 0, total_b = 0;
  char what[64];
  CK(cuMemGetInfo(&free_b, &total_b));
  snprintf(what, sizeof(what), "cuMemGetInfo %s", when);
  gc_check_mem_info(what, free_b, total_b);
}

int main(int argc, char **argv) {
  gc_args args = gc_start("driver_api", argc, argv, 2000, 24u);
  int expect = args.expect;
  long iterations = args.iterations;
  unsigned max_log2 = args.max_log2;

  int driver_version = 0;
  CUdevice dev;
  CUcontext ctx;
  char name[256];
  CK(cuInit(0));
  CK(cuDriverGetVersion(&driver_version));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDeviceGetName(name, (int)sizeof(name), dev));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  printf("driver_api: device 0 %s, driver %d, %ld iterations, sizes 256 B "
         ".. 2^%u B, up to %u live\n",
         name, driver_version, iterations, max_log2, MAX_LIVE);
  host = malloc((size_t)1 << max_log2);
  if (host == NULL)
    gc_fail("host malloc failed");
  check_mem_info("at start");
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);

  uint64_t rng = 0xD21BE2A91ULL;
  buffer live[MAX_LIVE];
  unsigned nlive = 0;
  uint32_t serial = 1;
  for (long it = 0; it < iterations; it++) {
    if (it == iterations / 2)
      check_mem_info("halfway");
    gc_step s = gc_plan_step(&rng, nlive, MAX_LIVE, max_log2);
    if (s.free_index >= 0) {
      check(&live[s.free_index], it, "before cuMemFree");
      CK(cuMemFree(live[s.free_index].p));
      my_frees++;
      live[s.free_index] = live[--nlive];
    }
    if (s.alloc_bytes > 0) {
      buffer b;
      b.bytes = s.alloc_bytes;
      b.serial = serial++;
      b.p = 0;
      CK(cuMemAlloc(&b.p, b.bytes));
      my_allocs++;
      check_placement(&b, live, nlive, it);
      fill(&b);
      check(&b, it, "after fill");
      live[nlive++] = b;
    }
  }
  for (unsigned j = 0; j < nlive; j++) {
    check(&live[j], iterations, "at the end");
    CK(cuMemFree(live[j].p));
    my_frees++;
  }
  CK(cuCtxSynchronize());
  check_mem_info("at the end");

  double secs = gc_elapsed(&t0);
  printf("driver_api: %llu cuMemAlloc, %llu cuMemFree, %.1f GiB checked, "
         "%.2f s\n",
         (unsigned long long)my_allocs, (unsigned long long)my_frees,
         (double)checked_bytes / (1024.0 * 1024.0 * 1024.0), secs);
  gc_check_stats(expect, (int)dev, my_allocs, my_frees);
  free(host);
  CK(cuDevicePrimaryCtxRelease(dev));
  printf("driver_api: PASS\n");
  return 0;
}
