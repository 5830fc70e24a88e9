/*
 * What the three e2e programs share: the workload and every assertion.
 *
 * Each program reaches the (mock) driver its own way -- the static runtime's
 * cuGetProcAddress path, direct linking, dlsym of exact names -- fills an
 * e2e_api with what it found, and calls e2e_run(). The same program runs
 * three ways: plainly, with LD_PRELOAD=libcudalloc.so, and with cudalloc
 * preloaded but CUDALLOC_CONF=enabled:0. It detects which from whether
 * cudalloc_version is loaded, and E2E_EXPECT (plain|pooled|passthrough, set
 * by CTest) makes sure the preload really happened: ld.so ignores a bad
 * LD_PRELOAD with a warning, which would otherwise pass as a plain run.
 *
 * Failures print "FAIL <program>: <assertion> (<numbers>)" on stderr; the
 * last line is one PASS/FAIL summary on stdout; the exit status is 1 on any
 * failure.
 */
#ifndef E2E_COMMON_H
#define E2E_COMMON_H

#include <cuda.h>

#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudalloc.h"
#include "mockcuda.h"

#define E2E_OPS 2000           /* allocations in the main loop */
#define E2E_MAX_LIVE 64
#define E2E_MIN_SIZE 256u
#define E2E_MAX_SIZE (8u << 20)
#define E2E_ALIGN 256u         /* cudaMalloc's documented alignment */
#define E2E_BOGUS_PTR 0xdead0000ull

typedef enum { E2E_PLAIN, E2E_POOLED, E2E_PASSTHROUGH } e2e_mode;
static const char *const e2e_mode_names[] = {"plain", "pooled", "passthrough"};

/* The driver as the program reached it. Optional entries may be NULL. */
typedef struct e2e_api {
  CUresult (*init)(unsigned int);
  CUresult (*primary_retain)(CUcontext *, CUdevice);
  CUresult (*primary_release)(CUdevice);
  CUresult (*ctx_set_current)(CUcontext);
  CUresult (*mem_alloc)(CUdeviceptr *, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*mem_get_info)(size_t *, size_t *);
  CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
  CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
  /* pass-through paths */
  CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
  CUresult (*mem_free_async)(CUdeviceptr, CUstream);
  CUresult (*mem_alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
  CUresult (*mem_free_async_ptsz)(CUdeviceptr, CUstream);
  CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
  CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned int);
  CUresult (*default_mem_pool)(CUmemoryPool *, CUdevice);
  CUresult (*mem_alloc_from_pool_async)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
  CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                         unsigned long long);
  CUresult (*mem_release)(CUmemGenericAllocationHandle);
  /* stream capture (all or none) */
  CUresult (*stream_create)(CUstream *, unsigned int);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
  CUresult (*end_capture)(CUstream, CUgraph *);
  CUresult (*exchange_capture_mode)(CUstreamCaptureMode *);
  CUresult (*graph_destroy)(CUgraph);
  /* optional: per-thread twins, to capture the per-thread default stream as
   * stream 0 (what a program built with per-thread default streams does) */
  CUresult (*begin_capture_ptsz)(CUstream, CUstreamCaptureMode);
  CUresult (*end_capture_ptsz)(CUstream, CUgraph *);
  /* What the program got for cuMemAlloc_v2, when mem_alloc is a wrapper
   * around it (NULL: mem_alloc itself). For messages and the check that the
   * pool's hook, not the driver, is in place. */
  const void *alloc_entry;
  /* the mock's own queries */
  mockcuda_get_counters_fn get_counters;
  mockcuda_owns_fn owns;
} e2e_api;

static const char *e2e_prog = "e2e";
static int e2e_failures;

#define E2E_CHECK(cond, ...)                                      \
  do {                                                            \
    if (!(cond)) {                                                \
      e2e_failures++;                                             \
      fprintf(stderr, "FAIL %s: %s (", e2e_prog, #cond);          \
      fprintf(stderr, __VA_ARGS__);                               \
      fprintf(stderr, ") [%s:%d]\n", __FILE__, __LINE__);         \
    }                                                             \
  } while (0)

#define E2E_RC(call, want)                                                          \
  do {                                                                              \
    CUresult rc_ = (call);                                                          \
    E2E_CHECK(rc_ == (want), "%s returned %d, want %d", #call, (int)rc_, (int)(want)); \
  } while (0)

/* A counter of the mock moved by exactly `want` between two snapshots. */
#define E2E_DELTA(c0, c1, field, want)                                                  \
  E2E_CHECK((c1).field - (c0).field == (uint64_t)(want),                                \
            "mock " #field " went from %" PRIu64 " to %" PRIu64 ", want +%" PRIu64,    \
            (c0).field, (c1).field, (uint64_t)(want))

static void e2e_fatal(const char *fmt, const char *arg) {
  fprintf(stderr, "FAIL %s: ", e2e_prog);
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  printf("FAIL %s: could not start\n", e2e_prog);
  exit(1);
}

static mockcuda_counters e2e_counters(const e2e_api *api) {
  mockcuda_counters c;
  api->get_counters(&c);
  return c;
}

/* Which run this is, and whether that is the one CTest asked for. */
static e2e_mode e2e_detect_mode(void) {
  e2e_mode m = E2E_PLAIN;
  if (dlsym(RTLD_DEFAULT, "cudalloc_version")) {
    const char *conf = getenv("CUDALLOC_CONF");
    m = conf && (strstr(conf, "enabled:0") || strstr(conf, "enabled:false")) ? E2E_PASSTHROUGH
                                                                             : E2E_POOLED;
  }
  const char *want = getenv("E2E_EXPECT");
  if (want && *want)
    E2E_CHECK(!strcmp(want, e2e_mode_names[m]),
              "E2E_EXPECT=%s but this run is %s: cudalloc_version %s (LD_PRELOAD=%s)", want,
              e2e_mode_names[m], m == E2E_PLAIN ? "not loaded" : "loaded",
              getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "unset");
  return m;
}

/* dlsym(RTLD_NEXT) searches the objects after its caller's: a dlsym
 * replacement that calls the real one from inside the library changes the
 * caller and with it the answer. From this program (first in the search
 * order), the next cudalloc_version is the preloaded library's. */
static void e2e_check_rtld_next(e2e_mode mode) {
  void *next = dlsym(RTLD_NEXT, "cudalloc_version");
  void *dflt = dlsym(RTLD_DEFAULT, "cudalloc_version");
  if (mode == E2E_PLAIN)
    E2E_CHECK(next == NULL, "dlsym(RTLD_NEXT, cudalloc_version) found %p without cudalloc", next);
  else
    E2E_CHECK(next != NULL && next == dflt,
              "dlsym(RTLD_NEXT, cudalloc_version) from the program gave %p, RTLD_DEFAULT %p: "
              "the dlsym replacement lost its caller",
              next, dflt);
}

/* "file:symbol" of a function pointer, for messages. */
static const char *e2e_where(const void *fn, char *buf, size_t len) {
  Dl_info info;
  if (!fn || !dladdr(fn, &info) || !info.dli_fname) {
    snprintf(buf, len, "%p (no object)", fn);
    return buf;
  }
  const char *base = strrchr(info.dli_fname, '/');
  snprintf(buf, len, "%s:%s", base ? base + 1 : info.dli_fname,
           info.dli_sname && info.dli_saddr == fn ? info.dli_sname : "?");
  return buf;
}

/* Whether fn is a function of the mock library itself (not a hook). */
static int e2e_in_mock(const e2e_api *api, const void *fn) {
  Dl_info a, b;
  return fn && dladdr(fn, &a) && dladdr((const void *)api->get_counters, &b) &&
         a.dli_fbase == b.dli_fbase;
}

/* Plain runs only: fn must be exactly the mock's export `name`, as the real
 * driver's look-ups give exactly its exports. */
static void e2e_expect_export(const e2e_api *api, const void *fn, const char *name) {
  Dl_info info;
  char buf[256];
  int ok = e2e_in_mock(api, fn) && dladdr(fn, &info) && info.dli_sname &&
           info.dli_saddr == fn && !strcmp(info.dli_sname, name);
  E2E_CHECK(ok, "resolved to %s, want the mock's %s", e2e_where(fn, buf, sizeof buf), name);
}

/* ---- the workload ----------------------------------------------------- */

typedef struct e2e_block {
  CUdeviceptr p;
  size_t size;
  uint32_t id;
} e2e_block;

static uint64_t e2e_next(uint64_t *s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

/* Sizes spread evenly over powers of two from 256 B to 8 MiB, odd ones
 * included, as in a real program's mix of tensors. */
static size_t e2e_size(uint64_t *s) {
  unsigned e = 8 + (unsigned)(e2e_next(s) % 15); /* 2^8 .. 2^22 */
  size_t base = (size_t)1 << e;
  return base + (size_t)(e2e_next(s) % base);
}

static unsigned char e2e_byte(uint32_t id) { return (unsigned char)(id * 131u + 7u) | 1u; }

/* A distinct pattern: the body set to one byte, a tag at each end. */
static int e2e_fill(const e2e_api *api, const e2e_block *b) {
  uint64_t tag[2] = {0xC0DA110C00000000ull | b->id, b->size};
  CUresult rc = api->memset_d8(b->p, e2e_byte(b->id), b->size);
  if (rc == CUDA_SUCCESS && b->size >= 16)
    rc = api->memcpy_htod(b->p, tag, 16);
  if (rc == CUDA_SUCCESS && b->size >= 32)
    rc = api->memcpy_htod(b->p + b->size - 16, tag, 16);
  E2E_CHECK(rc == CUDA_SUCCESS, "writing block %u (0x%llx, %zu B) failed with %d", b->id,
            (unsigned long long)b->p, b->size, (int)rc);
  return rc == CUDA_SUCCESS;
}

static void e2e_verify(const e2e_api *api, const e2e_block *b, unsigned char *buf) {
  CUresult rc = api->memcpy_dtoh(buf, b->p, b->size);
  E2E_CHECK(rc == CUDA_SUCCESS, "reading block %u (0x%llx, %zu B) failed with %d", b->id,
            (unsigned long long)b->p, b->size, (int)rc);
  if (rc != CUDA_SUCCESS)
    return;
  uint64_t tag[2] = {0xC0DA110C00000000ull | b->id, b->size};
  unsigned char want = e2e_byte(b->id);
  size_t head = b->size >= 16 ? 16 : 0, tail = b->size >= 32 ? 16 : 0;
  size_t body = b->size - head - tail;
  /* Fast path: tags match and the body is one byte repeated (comparing the
   * body with itself shifted by one). The slow loop finds the offset. */
  int ok = (!head || !memcmp(buf, tag, 16)) && (!tail || !memcmp(buf + b->size - 16, tag, 16)) &&
           (!body || (buf[head] == want && !memcmp(buf + head, buf + head + 1, body - 1)));
  size_t bad = b->size;
  for (size_t i = 0; !ok && i < b->size && bad == b->size; i++) {
    unsigned char w = i < head                ? ((unsigned char *)tag)[i]
                      : i >= b->size - tail ? ((unsigned char *)tag)[i - (b->size - 16)]
                                            : want;
    if (buf[i] != w)
      bad = i;
  }
  E2E_CHECK(bad == b->size,
            "block %u (0x%llx, %zu B) read back wrong at offset %zu: 0x%02x, want the pattern "
            "(another block overlaps it, or the memory was reused while live)",
            b->id, (unsigned long long)b->p, b->size, bad, buf[bad]);
}

/* Checks a fresh block against the rules and every live block. */
static void e2e_check_new(const e2e_api *api, const e2e_block *b, const e2e_block *live, int n) {
  E2E_CHECK(b->p % E2E_ALIGN == 0, "block %u at 0x%llx is not %u-byte aligned", b->id,
            (unsigned long long)b->p, E2E_ALIGN);
  E2E_CHECK(api->owns(b->p, b->size),
            "block %u [0x%llx, +%zu) is not inside memory the driver handed out", b->id,
            (unsigned long long)b->p, b->size);
  for (int i = 0; i < n; i++) {
    const e2e_block *o = &live[i];
    int overlap = b->p < o->p + o->size && o->p < b->p + b->size;
    E2E_CHECK(!overlap, "block %u [0x%llx, +%zu) overlaps live block %u [0x%llx, +%zu)", b->id,
              (unsigned long long)b->p, b->size, o->id, (unsigned long long)o->p, o->size);
  }
}

typedef struct e2e_loop_result {
  mockcuda_counters before, after;
  int allocs, frees;
  double seconds;
} e2e_loop_result;

static double e2e_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* E2E_OPS allocations of mixed sizes, up to E2E_MAX_LIVE live; each block
 * written, checked on read-back and freed. Stops at the first failed call. */
static e2e_loop_result e2e_loop(const e2e_api *api) {
  static e2e_block live[E2E_MAX_LIVE];
  e2e_loop_result r = {0};
  unsigned char *buf = malloc(E2E_MAX_SIZE);
  if (!buf)
    e2e_fatal("%s", "out of host memory");
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  int n = 0;
  r.before = e2e_counters(api);
  double t0 = e2e_now();
  while (r.allocs < E2E_OPS || n > 0) {
    int alloc = r.allocs < E2E_OPS && n < E2E_MAX_LIVE && (n == 0 || e2e_next(&rng) % 100 < 60);
    if (alloc) {
      e2e_block b = {0, e2e_size(&rng), (uint32_t)r.allocs};
      CUresult rc = api->mem_alloc(&b.p, b.size);
      r.allocs++;
      E2E_CHECK(rc == CUDA_SUCCESS && b.p, "allocation %u of %zu B failed: rc %d, ptr 0x%llx",
                b.id, b.size, (int)rc, (unsigned long long)b.p);
      if (rc != CUDA_SUCCESS || !b.p)
        break;
      e2e_check_new(api, &b, live, n);
      e2e_fill(api, &b);
      live[n++] = b;
    } else {
      int i = (int)(e2e_next(&rng) % (uint64_t)n);
      e2e_verify(api, &live[i], buf);
      CUresult rc = api->mem_free(live[i].p);
      r.frees++;
      E2E_CHECK(rc == CUDA_SUCCESS, "freeing block %u (0x%llx) failed: rc %d", live[i].id,
                (unsigned long long)live[i].p, (int)rc);
      live[i] = live[--n];
    }
    if (e2e_failures > 20)
      break; /* enough to see the pattern */
  }
  r.seconds = e2e_now() - t0;
  r.after = e2e_counters(api);
  free(buf);
  return r;
}

/* What the driver saw of the loop, by mode. */
static void e2e_check_loop(e2e_mode mode, const e2e_loop_result *r) {
  const mockcuda_counters *b = &r->before, *a = &r->after;
  uint64_t d_alloc = a->mem_alloc - b->mem_alloc, d_free = a->mem_free - b->mem_free;
  E2E_CHECK(r->allocs == E2E_OPS && r->frees == E2E_OPS, "loop ran %d allocations, %d frees of %d",
            r->allocs, r->frees, E2E_OPS);
  E2E_DELTA(*b, *a, mem_free_unknown, 0); /* no pool block ever reaches the driver */
  if (mode == E2E_POOLED) {
    E2E_CHECK(d_alloc * 10 < (uint64_t)r->allocs,
              "pooled: driver saw %" PRIu64 " cuMemAlloc_v2 for %d program allocations, want < 10%%",
              d_alloc, r->allocs);
    E2E_CHECK(d_free * 10 < (uint64_t)r->frees,
              "pooled: driver saw %" PRIu64 " cuMemFree_v2 for %d program frees, want < 10%%",
              d_free, r->frees);
    /* The pool's own books: every allocation and free went through it. */
    int (*get_stats)(int, cudalloc_device_stats *, size_t) =
        (int (*)(int, cudalloc_device_stats *, size_t))dlsym(RTLD_DEFAULT, "cudalloc_get_stats");
    cudalloc_device_stats st;
    int rc = get_stats ? get_stats(0, &st, sizeof st) : -2;
    E2E_CHECK(rc == 0, "cudalloc_get_stats(0) returned %d (-2: not exported)", rc);
    if (rc == 0) {
      E2E_CHECK(st.allocs >= (uint64_t)r->allocs && st.frees >= (uint64_t)r->frees,
                "pool stats: %" PRIu64 " allocs, %" PRIu64 " frees, want at least %d each",
                st.allocs, st.frees, r->allocs);
      E2E_CHECK(st.blocks.current == 0, "pool stats: %" PRIu64 " blocks live after freeing all",
                st.blocks.current);
      E2E_CHECK(st.reserved_bytes.current <= a->used_bytes,
                "pool reserves %" PRIu64 " B but the driver has only %" PRIu64 " B out",
                st.reserved_bytes.current, a->used_bytes);
    }
  } else {
    E2E_CHECK(d_alloc == (uint64_t)r->allocs,
              "%s: driver saw %" PRIu64 " cuMemAlloc_v2 for %d program allocations, want equal",
              e2e_mode_names[mode], d_alloc, r->allocs);
    E2E_CHECK(d_free == (uint64_t)r->frees,
              "%s: driver saw %" PRIu64 " cuMemFree_v2 for %d program frees, want equal",
              e2e_mode_names[mode], d_free, r->frees);
    E2E_DELTA(*b, *a, live_allocs, 0);
  }
}

/* ---- pass-through paths: the driver sees exactly what the program did -- */

/* A stream-ordered pointer freed with cuMemFree_v2 (cudaFree accepts them):
 * not the pool's, so it must reach the driver, once. */
static void e2e_async_freed_by_free(const e2e_api *api) {
  if (!api->mem_alloc_async)
    return;
  mockcuda_counters c0 = e2e_counters(api), c1, c2;
  CUdeviceptr p = 0;
  E2E_RC(api->mem_alloc_async(&p, 1u << 20, NULL), CUDA_SUCCESS);
  c1 = e2e_counters(api);
  E2E_DELTA(c0, c1, alloc_async, 1);
  E2E_DELTA(c0, c1, mem_alloc, 0);
  E2E_CHECK(api->owns(p, 1u << 20), "cuMemAllocAsync gave 0x%llx, not a driver allocation",
            (unsigned long long)p);
  E2E_RC(api->mem_free(p), CUDA_SUCCESS);
  c2 = e2e_counters(api);
  E2E_DELTA(c1, c2, mem_free, 1);
  E2E_DELTA(c1, c2, mem_free_unknown, 0);
  E2E_CHECK(c2.live_allocs == c0.live_allocs && !api->owns(p, 1),
            "async block 0x%llx still live at the driver after cuMemFree_v2",
            (unsigned long long)p);
}

/* A pointer nobody allocated: the driver's own error comes back, unchanged,
 * and the driver saw it exactly once. */
static void e2e_bogus_free(const e2e_api *api) {
  E2E_CHECK(!api->owns(E2E_BOGUS_PTR, 1), "the bogus pointer 0x%llx is a real allocation",
            E2E_BOGUS_PTR);
  mockcuda_counters c0 = e2e_counters(api), c1;
  E2E_RC(api->mem_free((CUdeviceptr)E2E_BOGUS_PTR), CUDA_ERROR_INVALID_VALUE);
  c1 = e2e_counters(api);
  E2E_DELTA(c0, c1, mem_free_unknown, 1);
  E2E_DELTA(c0, c1, mem_free, 1);
}

static void e2e_async_pairs(const e2e_api *api) {
  CUdeviceptr p = 0;
  mockcuda_counters c0, c1;
  if (api->mem_alloc_async && api->mem_free_async) {
    c0 = e2e_counters(api);
    E2E_RC(api->mem_alloc_async(&p, 3000, NULL), CUDA_SUCCESS);
    E2E_RC(api->mem_free_async(p, NULL), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, alloc_async, 1);
    E2E_DELTA(c0, c1, free_async, 1);
    E2E_DELTA(c0, c1, alloc_async_ptsz, 0);
    E2E_DELTA(c0, c1, free_async_ptsz, 0);
  }
  /* The per-thread twins must reach the driver's per-thread twins. */
  if (api->mem_alloc_async_ptsz && api->mem_free_async_ptsz) {
    c0 = e2e_counters(api);
    E2E_RC(api->mem_alloc_async_ptsz(&p, 3000, NULL), CUDA_SUCCESS);
    E2E_RC(api->mem_free_async_ptsz(p, NULL), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, alloc_async_ptsz, 1);
    E2E_DELTA(c0, c1, free_async_ptsz, 1);
    E2E_DELTA(c0, c1, alloc_async, 1);
    E2E_DELTA(c0, c1, free_async, 1);
  }
  if (api->default_mem_pool && api->mem_alloc_from_pool_async && api->mem_free_async) {
    CUmemoryPool pool = NULL;
    E2E_RC(api->default_mem_pool(&pool, 0), CUDA_SUCCESS);
    c0 = e2e_counters(api);
    E2E_RC(api->mem_alloc_from_pool_async(&p, 5000, pool, NULL), CUDA_SUCCESS);
    E2E_RC(api->mem_free_async(p, NULL), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, alloc_from_pool_async, 1);
    E2E_DELTA(c0, c1, free_async, 1);
    E2E_DELTA(c0, c1, live_allocs, 0);
  }
}

static void e2e_other_allocs(const e2e_api *api) {
  CUdeviceptr p = 0;
  mockcuda_counters c0, c1;
  if (api->mem_alloc_pitch) {
    size_t pitch = 0;
    c0 = e2e_counters(api);
    E2E_RC(api->mem_alloc_pitch(&p, &pitch, 1000, 7, 4), CUDA_SUCCESS);
    E2E_CHECK(pitch >= 1000 && api->owns(p, pitch * 7), "pitch %zu at 0x%llx", pitch,
              (unsigned long long)p);
    E2E_RC(api->mem_free(p), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, alloc_pitch, 1);
    E2E_DELTA(c0, c1, mem_alloc, 0);
    E2E_DELTA(c0, c1, mem_free, 1);
    E2E_DELTA(c0, c1, mem_free_unknown, 0);
  }
  if (api->mem_alloc_managed) {
    c0 = e2e_counters(api);
    E2E_RC(api->mem_alloc_managed(&p, 10000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    E2E_RC(api->mem_free(p), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, alloc_managed, 1);
    E2E_DELTA(c0, c1, mem_free, 1);
    E2E_DELTA(c0, c1, mem_free_unknown, 0);
  }
  if (api->mem_create && api->mem_release) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    c0 = e2e_counters(api);
    E2E_RC(api->mem_create(&h, 4u << 20, &prop, 0), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, mem_create, 1);
    E2E_DELTA(c0, c1, used_bytes, 4u << 20);
    E2E_RC(api->mem_release(h), CUDA_SUCCESS);
    c1 = e2e_counters(api);
    E2E_DELTA(c0, c1, mem_release, 1);
    E2E_DELTA(c0, c1, live_handles, 0);
  }
}

/* A program allocating and freeing during a stream capture the way
 * PyTorch's allocator does (a global capture, the thread made relaxed around
 * cudaMalloc/cudaFree, which the driver then allows) must keep its capture:
 * the pool may not synchronize while it lasts (the driver refuses
 * cuCtxSynchronize during any capture and invalidates it). A block freed just
 * before makes the pool want a synchronization before reusing it. One round
 * per kind of capturing stream: a blocking one, the per-thread default
 * stream, and a non-blocking one (PyTorch's side streams). */
static void e2e_capture(const e2e_api *api) {
  if (!api->stream_create)
    return;
  static const struct {
    const char *what;
    int make;           /* create a stream with these flags, else use `fixed` */
    unsigned flags;
    CUstream fixed;
  } rounds[] = {
      {"blocking stream", 1, CU_STREAM_DEFAULT, NULL},
      {"per-thread default stream", 0, 0, CU_STREAM_PER_THREAD},
      {"non-blocking stream", 1, CU_STREAM_NON_BLOCKING, NULL},
  };
  for (size_t i = 0; i < sizeof rounds / sizeof *rounds; i++) {
    const char *what = rounds[i].what;
    CUstream s = rounds[i].fixed;
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = api->begin_capture;
    CUresult (*end)(CUstream, CUgraph *) = api->end_capture;
    if (s == CU_STREAM_PER_THREAD && api->begin_capture_ptsz && api->end_capture_ptsz) {
      s = NULL; /* stream 0 is the per-thread stream to the _ptsz twins */
      begin = api->begin_capture_ptsz;
      end = api->end_capture_ptsz;
    }
    if (rounds[i].make)
      E2E_RC(api->stream_create(&s, rounds[i].flags), CUDA_SUCCESS);
    CUdeviceptr before = 0, p = 0;
    E2E_RC(api->mem_alloc(&before, 1u << 20), CUDA_SUCCESS);
    E2E_RC(api->mem_free(before), CUDA_SUCCESS);
    mockcuda_counters c0 = e2e_counters(api);
    E2E_RC(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    api->exchange_capture_mode(&m);
    CUresult ra = api->mem_alloc(&p, 1u << 20);
    CUresult rf = ra == CUDA_SUCCESS ? api->mem_free(p) : CUDA_SUCCESS;
    api->exchange_capture_mode(&m);
    CUgraph g = NULL;
    CUresult re = end(s, &g);
    mockcuda_counters c1 = e2e_counters(api);
    E2E_CHECK(ra == CUDA_SUCCESS && rf == CUDA_SUCCESS,
              "capture on a %s: cuMemAlloc_v2 returned %d, cuMemFree_v2 %d", what, (int)ra,
              (int)rf);
    E2E_CHECK(re == CUDA_SUCCESS && c1.capture_violations == c0.capture_violations,
              "capture on a %s ended with %d after %" PRIu64 " refused call(s) "
              "(cuCtxSynchronize %" PRIu64 " -> %" PRIu64 "): the pool synchronized during the capture",
              what, (int)re, c1.capture_violations - c0.capture_violations, c0.ctx_synchronize,
              c1.ctx_synchronize);
    if (g && api->graph_destroy)
      api->graph_destroy(g);
    if (rounds[i].make)
      E2E_RC(api->stream_destroy(s), CUDA_SUCCESS);
  }
}

/* Free never exceeds total; with the pool, memory it caches counts as free
 * (it is this process's to use), so free is at least what the driver says. */
static void e2e_mem_info(const e2e_api *api, e2e_mode mode) {
  size_t fr = 0, tot = 0;
  E2E_RC(api->mem_get_info(&fr, &tot), CUDA_SUCCESS);
  mockcuda_counters c = e2e_counters(api);
  uint64_t driver_free = c.capacity_bytes - c.used_bytes; /* device 0 only is used */
  E2E_CHECK(fr <= tot && tot > 0, "cuMemGetInfo: free %zu > total %zu", fr, tot);
  const char *conf = getenv("CUDALLOC_CONF");
  int limited = conf && strstr(conf, "memory_limit_mb");
  if (mode != E2E_POOLED) {
    E2E_CHECK(tot == c.capacity_bytes && fr == driver_free,
              "cuMemGetInfo passed through gives free %zu total %zu, driver has %" PRIu64
              " of %" PRIu64,
              fr, tot, driver_free, c.capacity_bytes);
  } else if (!limited) {
    E2E_CHECK(tot == c.capacity_bytes, "cuMemGetInfo total %zu, device has %" PRIu64, tot,
              c.capacity_bytes);
    E2E_CHECK(fr >= driver_free, "cuMemGetInfo free %zu below the driver's own %" PRIu64
              " (cached blocks must count as free)", fr, driver_free);
  }
}

/* The whole test, given how the program reached the driver. `path` names
 * that way, for the summary. */
static int e2e_run(const e2e_api *api, e2e_mode mode, const char *path) {
  CUcontext ctx = NULL;
  int failed_before = e2e_failures;
  E2E_RC(api->init(0), CUDA_SUCCESS);
  E2E_RC(api->primary_retain(&ctx, 0), CUDA_SUCCESS);
  E2E_RC(api->ctx_set_current(ctx), CUDA_SUCCESS);
  if (e2e_failures != failed_before)
    e2e_fatal("%s", "driver set-up failed");

  char where[256];
  const void *entry = api->alloc_entry ? api->alloc_entry : (const void *)api->mem_alloc;
  e2e_where(entry, where, sizeof where);
  if (mode == E2E_POOLED)
    E2E_CHECK(!e2e_in_mock(api, entry),
              "with cudalloc preloaded, the program's cuMemAlloc_v2 is still the driver's own %s",
              where);

  e2e_check_rtld_next(mode);
  e2e_loop_result r = e2e_loop(api);
  e2e_check_loop(mode, &r);
  e2e_async_freed_by_free(api);
  e2e_bogus_free(api);
  e2e_async_pairs(api);
  e2e_other_allocs(api);
  e2e_mem_info(api, mode);
  e2e_capture(api);

  mockcuda_counters end = e2e_counters(api);
  if (api->primary_release)
    E2E_RC(api->primary_release(0), CUDA_SUCCESS);

  if (e2e_failures) {
    printf("FAIL %s [%s, %s]: %d assertion(s) failed\n", e2e_prog, e2e_mode_names[mode], path,
           e2e_failures);
    return 1;
  }
  printf("PASS %s [%s, %s]: %d allocations in %.2f s; driver saw %" PRIu64 " cuMemAlloc_v2, %" PRIu64
         " cuMemFree_v2, %" PRIu64 " cuCtxSynchronize; peak %" PRIu64 " MiB; cuMemAlloc_v2 is %s\n",
         e2e_prog, e2e_mode_names[mode], path, r.allocs, r.seconds,
         r.after.mem_alloc - r.before.mem_alloc, r.after.mem_free - r.before.mem_free,
         end.ctx_synchronize, end.peak_used_bytes >> 20, where);
  return 0;
}

#endif /* E2E_COMMON_H */
