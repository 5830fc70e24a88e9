/*
 * e2e_deepbind: a library loaded with RTLD_DEEPBIND and linked to libcuda
 * calls the driver's own cuMemFree_v2 (e2e_deepbind_lib.c), which no
 * LD_PRELOAD hook can see. On a pooled pointer at a segment's start that
 * frees the whole segment under the pool. The library cannot prevent it;
 * it must notice when the driver hands the segment's range out again, say
 * so in one line, and never serve the segment's bytes again:
 *  1. a 4 KiB block p (the first of a 2 MiB segment) and q beside it are
 *     allocated; the deep-bound library frees p (and, preloaded, q's
 *     memory with it: the damage no hook can prevent);
 *  2. managed memory allocated next lands in the freed range (the mock
 *     places first fit): preloaded, one line says the segment was freed
 *     behind the pool's back;
 *  3. a 30 MiB block L, freed the same way, then a pooled 30 MiB request
 *     whose new segment lands at L's address: a second line;
 *  4. new pooled blocks never overlap the managed block or each other, and
 *     every byte written reads back (no two allocations share memory).
 * That is with leak_scan:0. By default (leak_scan:1) no pooled block starts
 * at a segment's base, so the driver refuses both frees as it refuses any
 * address it did not hand out (CUDA_ERROR_INVALID_VALUE): nothing dies
 * under the pool, no line is printed, the program frees p and L through
 * the hooks, and the same data checks hold.
 * Plainly the frees are the program's own (p and L are allocations of
 * their own), no line is printed, and the same data checks hold. Last
 * line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures;

#define MiB (1ull << 20)
#define KiB (1ull << 10)

#define E2E_NAME "e2e_deepbind"
#include "e2e_check.h"

typedef CUresult (*free_fn)(CUdeviceptr);

typedef struct region {
  CUdeviceptr addr;
  size_t size;
  unsigned char byte;
} region;

static void fill(region *r, unsigned char byte) {
  r->byte = byte;
  CHECK(cuMemsetD8_v2(r->addr, byte, r->size));
}

/* Every region holds its own byte, start to end, and none overlaps another. */
static void verify(const region *r, int n) {
  for (int i = 0; i < n; i++) {
    unsigned char first = 0, last = 0;
    CHECK(cuMemcpyDtoH_v2(&first, r[i].addr, 1));
    CHECK(cuMemcpyDtoH_v2(&last, r[i].addr + r[i].size - 1, 1));
    if (first != r[i].byte || last != r[i].byte)
      FAIL("region %d at %#llx reads %#x..%#x, expected %#x", i,
           (unsigned long long)r[i].addr, first, last, r[i].byte);
    for (int j = 0; j < i; j++)
      if (r[i].addr < r[j].addr + r[j].size && r[j].addr < r[i].addr + r[i].size)
        FAIL("regions %d and %d overlap", i, j);
  }
}

/* The deep-bound free of a pooled block: refused where segments have heads
 * (then freed through the hooks), the driver's own free otherwise. */
static void deep_free_pooled(free_fn deep_free, CUdeviceptr p, bool heads) {
  CUresult rc = deep_free(p);
  if (!heads) {
    CHECK(rc);
    return;
  }
  if (rc != CUDA_ERROR_INVALID_VALUE)
    FAIL("the driver's free of pooled %#llx returned %d, expected %d",
         (unsigned long long)p, (int)rc, (int)CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree_v2(p));
}

static int count(const char *text, const char *what) {
  int n = 0;
  for (const char *at = text; (at = strstr(at, what)) != NULL; at++)
    n++;
  return n;
}

int main(void) {
  bool preloaded = e2e_preloaded();
  const char *conf = getenv("CUDALLOC_CONF");
  bool heads = preloaded && !(conf && strstr(conf, "leak_scan:0"));
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK(cuCtxSetCurrent(ctx));
  void *lib = dlopen("libe2e_deepbind.so", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  free_fn deep_free = lib ? (free_fn)dlsym(lib, "e2e_deepbind_free") : NULL;
  if (!deep_free) {
    FAIL("cannot load libe2e_deepbind.so: %s", dlerror());
    return 1;
  }
  region r[16];
  int n = 0;
  CUdeviceptr p = 0, big = 0;
  capture c;
  capture_begin(&c);
  CUdeviceptr q = 0; /* beside p: preloaded, it dies with p's segment */
  CHECK(cuMemAlloc_v2(&p, 4 * KiB));
  CHECK(cuMemAlloc_v2(&q, 4 * KiB));
  deep_free_pooled(deep_free, p, heads);
  r[n] = (region){0, 1 * MiB, 0};
  CHECK(cuMemAllocManaged(&r[n].addr, r[n].size, CU_MEM_ATTACH_GLOBAL));
  fill(&r[n++], 0x52);
  CHECK(cuMemAlloc_v2(&big, 30 * MiB));
  deep_free_pooled(deep_free, big, heads);
  r[n] = (region){0, 30 * MiB, 0};
  CHECK(cuMemAlloc_v2(&r[n].addr, r[n].size));
  fill(&r[n++], 0x53);
  for (int i = 0; i < 8; i++) {
    r[n] = (region){0, 4 * KiB, 0};
    CHECK(cuMemAlloc_v2(&r[n].addr, r[n].size));
    fill(&r[n++], (unsigned char)(0x60 + i));
  }
  char *err = capture_end(&c);
  fputs(err, stderr);
  verify(r, n);
  int lines = count(err, "freed behind the pool's back");
  int expected = preloaded && !heads ? 2 : 0;
  if (lines != expected)
    FAIL("%d line(s) say a segment was freed behind the pool's back, "
         "expected %d", lines, expected);
  free(err);
  printf("%s " E2E_NAME " (%s, %d failure(s))\n", failures ? "FAIL" : "PASS",
         preloaded ? "preloaded" : "plain", failures);
  return failures ? 1 : 0;
}
