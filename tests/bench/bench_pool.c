/*
 * CPU benchmark of the pool over the fake backend: no GPU, no driver, only
 * the pool's own cost.
 *
 *   bench_pool mixed [OPS [REUSE]]   random operations over 64 live slots,
 *                                    sizes log-uniform from 256 B to 64 MiB
 *   bench_pool pair [PAIRS [REUSE]]  cached allocate+free pairs of a few sizes
 *
 * COUNT defaults to 1e6. REUSE is "immediate" (freed blocks reused at once),
 * "safe" (reuse_policy safe, the library's default: frees wait in batches for
 * a marker, here of an idle device whose markers pass at once, so the cost
 * is the batching's own) or "both" (the default). It prints
 * nanoseconds per operation; scripts/bench-cpu.sh also counts instructions
 * with callgrind, which is repeatable where wall time is not.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_backend.h"
#include "pool.h"

#define SLOTS 64

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t next_random(uint64_t *rng) {
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  return *rng >> 11;
}

static uint64_t log_uniform_size(uint64_t *rng) {
  double u = (double)(next_random(rng) & 0xFFFFFFF) / (double)0x10000000;
  return (uint64_t)(256.0 * exp2(u * 18.0)); /* 256 B .. 64 MiB */
}

static void die(const char *what, int rc) {
  fprintf(stderr, "bench_pool: %s failed (%d)\n", what, rc);
  exit(1);
}

/* Random allocations and frees over SLOTS slots. */
static double run_mixed(ca_pool *pool, long ops) {
  uint64_t slot[SLOTS] = {0}, rng = 7;
  double start = now_ns();
  for (long i = 0; i < ops; i++) {
    uint64_t *s = &slot[next_random(&rng) % SLOTS];
    if (*s) {
      if (!ca_pool_free(pool, *s))
        die("free", 0);
      *s = 0;
    } else {
      int rc = ca_pool_alloc(pool, log_uniform_size(&rng), 0, s);
      if (rc)
        die("alloc", rc);
    }
  }
  double elapsed = now_ns() - start;
  for (int i = 0; i < SLOTS; i++)
    if (slot[i])
      ca_pool_free(pool, slot[i]);
  return elapsed / (double)ops;
}

/* Allocate+free pairs the cache serves: the steady state of a training
 * loop. */
static double run_pairs(ca_pool *pool, long pairs) {
  static const uint64_t sizes[] = {4096, 65536, 1 << 20, 16 << 20};
  uint64_t addr;
  for (int i = 0; i < 4; i++) { /* warm: one segment per size */
    if (ca_pool_alloc(pool, sizes[i], 0, &addr))
      die("alloc", 0);
    ca_pool_free(pool, addr);
  }
  double start = now_ns();
  for (long i = 0; i < pairs; i++) {
    int rc = ca_pool_alloc(pool, sizes[i & 3], 0, &addr);
    if (rc)
      die("alloc", rc);
    ca_pool_free(pool, addr);
  }
  return (now_ns() - start) / (double)pairs;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "mixed";
  long n = argc > 2 ? atol(argv[2]) : 1000000;
  const char *reuse = argc > 3 ? argv[3] : "both";
  int mixed = strcmp(mode, "mixed") == 0;
  int from = strcmp(reuse, "safe") == 0, to = strcmp(reuse, "immediate") ? 2 : 1;
  if ((!mixed && strcmp(mode, "pair") != 0) || n <= 0 ||
      (strcmp(reuse, "both") && !from && to == 2)) {
    fprintf(stderr, "usage: bench_pool mixed|pair [COUNT [immediate|safe|both]]\n");
    return 2;
  }
  for (int safe = from; safe < to; safe++) {
    static ca_fake_backend fake;
    ca_fake_init(&fake, 1ull << 40, safe, false);
    ca_pool_options opt = {.max_split_size = UINT64_MAX,
                           .reuse = safe ? CA_REUSE_SAFE : CA_REUSE_IMMEDIATE};
    ca_pool *pool = ca_pool_create(&fake.backend, 0, &opt);
    double ns = mixed ? run_mixed(pool, n) : run_pairs(pool, n);
    cudalloc_device_stats s;
    ca_pool_get_stats(pool, &s);
    printf("%-5s %-9s %8.1f ns per %s  (%ld ops, %.2f%% cache hits, "
           "%llu driver allocations, %d markers)\n",
           mode, safe ? "safe" : "immediate", ns, mixed ? "op" : "pair", n,
           s.allocs ? 100.0 * (double)s.cache_hits / (double)s.allocs : 0.0,
           (unsigned long long)s.backend_allocs, fake.marks);
    ca_pool_destroy(pool);
    ca_fake_fini(&fake);
  }
  return 0;
}
