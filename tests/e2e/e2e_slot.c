/*
 * The allocator-slot pair (cudalloc_stream_malloc / cudalloc_stream_free),
 * against the mock driver, as PyTorch's pluggable allocator drives it: the
 * library is dlopen'ed (RTLD_LOCAL, as ctypes loads it) or, with
 * E2E_EXPECT=pooled, preloaded as well. It checks that
 *  1. a block freed on stream A serves the next request on A at once: the
 *     same address, no event recorded, no stream made to wait (no fence);
 *  2. a block freed on A serves a request on stream B only behind an event
 *     recorded on A: preloaded, the request on B gets it after the pool
 *     recorded one event on A (a created, blocking stream) and waited for
 *     it, still no stream made to wait, and no new segment; dlopen'ed, the
 *     library never saw A made and records nothing on it;
 *  3. the bytes written through the slot are the block's (memset, copy
 *     back);
 *  4. a device the machine does not have is refused with one line (the
 *     checking variant returns NULL);
 *  5. the pool's statistics count the slot's blocks;
 *  6. with E2E_SLOT_LIMIT (CUDALLOC_CONF=memory_limit_mb:8), the limit
 *     holds through the slot: a second 6 MiB block is refused (NULL from
 *     the checking variant) until the first is freed;
 * and leaves one block unfreed, which the leak report at exit must list
 * (the checker, through ctest's PASS_REGULAR_EXPRESSION). Last line of its
 * own: PASS or FAIL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define MiB (1ull << 20)
#define E2E_NAME "e2e_slot"
#include "cudalloc.h"
#include "e2e_check.h"
#include "mockcuda.h"

typedef void *(*slot_malloc)(size_t, int, void *);
typedef void (*slot_free)(void *, size_t, int, void *);
typedef int (*stats_fn)(int, cudalloc_device_stats *, size_t);

static mockcuda_counters counters(void) {
  mockcuda_counters k;
  mockcuda_get_counters(&k);
  return k;
}

int main(int argc, char **argv) {
  void *lib = e2e_slot_library(argc, argv);
  slot_malloc sm = (slot_malloc)dlsym(lib, "cudalloc_stream_malloc");
  slot_malloc try_sm = (slot_malloc)dlsym(lib, "cudalloc_stream_try_malloc");
  slot_free sf = (slot_free)dlsym(lib, "cudalloc_stream_free");
  stats_fn stats = (stats_fn)dlsym(lib, "cudalloc_get_stats");
  if (!sm || !try_sm || !sf || !stats) {
    printf("FAIL " E2E_NAME ": the slot pair is not exported\n");
    return 1;
  }
  CUdevice dev;
  CUcontext ctx;
  CUstream a, b;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CHECK(cuStreamCreate(&a, 0));
  CHECK(cuStreamCreate(&b, 0));

  if (getenv("E2E_SLOT_LIMIT")) {
    void *x = try_sm(6 * MiB, 0, a), *y = try_sm(6 * MiB, 0, a);
    if (!x || y)
      FAIL("under an 8 MiB limit: first 6 MiB %p, second %p (want a block, then NULL)", x, y);
    sf(x, 6 * MiB, 0, a);
    y = sm(6 * MiB, 0, b);
    if (!y)
      FAIL("the second 6 MiB was refused after the first was freed");
    sf(y, 6 * MiB, 0, b);
    printf("%s " E2E_NAME " (limit)\n", failures ? "FAIL" : "PASS");
    return failures ? 1 : 0;
  }
  void *p = sm(MiB, 0, a);
  if (!p)
    FAIL("cudalloc_stream_malloc(1 MiB) on stream A returned NULL");
  CHECK(cuMemsetD8((CUdeviceptr)p, 0x3c, MiB));
  unsigned char last = 0;
  CHECK(cuMemcpyDtoH(&last, (CUdeviceptr)p + MiB - 1, 1));
  if (last != 0x3c)
    FAIL("the block does not hold what was written (%#x)", last);
  mockcuda_counters k0 = counters();
  sf(p, MiB, 0, a);
  void *q = sm(MiB, 0, a);
  mockcuda_counters k1 = counters();
  if (q != p)
    FAIL("a block freed on stream A was not reused on A at once (%p, %p)", p, q);
  if (k1.event_record != k0.event_record ||
      k1.wait_event_other + k1.wait_event_legacy + k1.wait_event_nonblocking !=
          k0.wait_event_other + k0.wait_event_legacy + k0.wait_event_nonblocking)
    FAIL("reuse on the same stream recorded %llu event(s) or made a stream wait",
         (unsigned long long)(k1.event_record - k0.event_record));

  /* Freed on A, q took in the rest of its segment: B finds nothing free
   * but A's blocks. Preloaded, the library saw A made and knows it lives:
   * B gets them behind one event on A, with no new segment, and the rest
   * of them, shared now, serves B again at once. Loaded alone, it never
   * records on a stream it did not see made (the driver crashes on a
   * destroyed one's handle): A's blocks stay A's, as PyTorch keeps them,
   * until their segment goes back to the driver. */
  const char *expect = getenv("E2E_EXPECT");
  bool preloaded = expect && strcmp(expect, "pooled") == 0;
  sf(q, MiB, 0, a);
  void *r = sm(MiB, 0, b);
  void *other = sm(MiB, 0, b);
  mockcuda_counters k2 = counters();
  uint64_t on_a = k2.event_record_blocking - k1.event_record_blocking;
  if (preloaded && (r != q || !other))
    FAIL("stream B did not get stream A's block once its event passed");
  if (preloaded && on_a != 1)
    FAIL("%llu event(s) recorded on a created stream, want 1 (on A)",
         (unsigned long long)on_a);
  if (preloaded && k2.mem_alloc != k1.mem_alloc)
    FAIL("stream B's requests grew the pool (%llu new segment(s)) while A's "
         "freed blocks could serve them",
         (unsigned long long)(k2.mem_alloc - k1.mem_alloc));
  if (!preloaded && (on_a != 0 || (r == q && k2.mem_free == k1.mem_free)))
    FAIL("a stream the library did not see made: %llu event(s) on it, "
         "its block %s", (unsigned long long)on_a,
         r == q ? "served B without going back to the driver" : "kept");
  if (k2.event_record_legacy != k1.event_record_legacy ||
      k2.wait_event_other + k2.wait_event_legacy + k2.wait_event_nonblocking !=
          k1.wait_event_other + k1.wait_event_legacy + k1.wait_event_nonblocking)
    FAIL("cross-stream reuse fenced (a legacy-stream event or a stream wait)");

  capture c;
  capture_begin(&c);
  void *wrong = try_sm(MiB, 7, a);
  char *err = capture_end(&c);
  if (wrong || !strstr(err, "device 7") || !strstr(err, "CUDA_ERROR_INVALID_DEVICE"))
    FAIL("an allocation for a device the machine lacks: %p, said: %s", wrong, err);
  free(err);

  cudalloc_device_stats s = {0};
  stats(0, &s, sizeof(s));
  if (s.allocs < 4 || s.cache_hits < 2 || s.requested_bytes.current != 2 * MiB)
    FAIL("statistics: %llu allocs, %llu hits, %llu bytes live",
         (unsigned long long)s.allocs, (unsigned long long)s.cache_hits,
         (unsigned long long)s.requested_bytes.current);
  sf(other, MiB, 0, b); /* r stays: the report at exit lists it */
  printf("%s " E2E_NAME "\n", failures ? "FAIL" : "PASS");
  return failures ? 1 : 0;
}
