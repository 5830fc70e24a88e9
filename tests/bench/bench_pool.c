/*
 * CPU benchmark of the pool over the fake backend: no GPU, no driver, only
 * the pool's own cost.
 *
 *   bench_pool mixed [OPS [REUSE]]   random operations over 64 live slots,
 *                                    sizes log-uniform from 256 B to 64 MiB
 *   bench_pool pair [PAIRS [REUSE]]  cached allocate+free pairs of a few sizes
 *   bench_pool threads [PAIRS [REUSE]]
 *                                    1, 2, 4 and 8 threads, each making PAIRS
 *                                    cached pairs through one pool at once:
 *                                    million pairs per second, against one
 *                                    thread's, and the arenas the threads
 *                                    ended on (contention spreads them)
 *   bench_pool locate [LOOKUPS [REUSE]]
 *                                    which live block holds an address
 *                                    (ca_pool_bounds, the look-up behind the
 *                                    library's range checks): random
 *                                    addresses inside 1 block, 16, then
 *                                    4,112 (4 KiB blocks, 16 of 64 MiB)
 *
 * A fourth argument "expandable" runs each as under expandable_segments:1
 * (the fake maps 2 MiB pages into ranges).
 *
 * COUNT defaults to 1e6. REUSE is "immediate" (freed blocks reused at once),
 * "safe" (reuse_policy safe, the library's default: freed blocks wait until
 * a fence, which the fake backend makes as the CUDA one does, only without
 * a driver behind it, so the cost is the pool's own) or "both" (the
 * default). It prints
 * nanoseconds per operation; scripts/bench-cpu.sh also counts instructions
 * with callgrind, which is repeatable where wall time is not. Threads can
 * scale only as far as the machine has cores: on two, threads mode can show
 * no more than that a second thread does not slow the first down. Under
 * safe, every thread's fences are counted under the fake backend's one
 * mutex, which then limits what threads mode shows.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_backend.h"
#include "pool/pool.h"

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

static int expandable; /* the fourth argument */

/* A pool over a fresh fake backend, which fences under safe reuse as the
 * CUDA backend does (expandable segments need its synchronize). */
static ca_pool *fake_pool(ca_fake_backend *fake, int safe) {
  ca_fake_init(fake, 1ull << 40, safe || expandable, false);
  if (safe)
    fake->backend.fence = ca_fake_fence;
  if (expandable)
    ca_fake_enable_ranges(fake);
  ca_pool_options opt = {.max_split_size = UINT64_MAX,
                         .reuse = safe ? CA_REUSE_SAFE : CA_REUSE_IMMEDIATE,
                         .expandable = expandable};
  return ca_pool_create(&fake->backend, 0, &opt);
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
      if (!ca_pool_free(pool, *s, NULL))
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
      ca_pool_free(pool, slot[i], NULL);
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
    ca_pool_free(pool, addr, NULL);
  }
  double start = now_ns();
  for (long i = 0; i < pairs; i++) {
    int rc = ca_pool_alloc(pool, sizes[i & 3], 0, &addr);
    if (rc)
      die("alloc", rc);
    ca_pool_free(pool, addr, NULL);
  }
  return (now_ns() - start) / (double)pairs;
}

/* Look-ups of random addresses inside the first `spread` of 4,096 live
 * blocks of 4 KiB and 16 of 64 MiB: one block (the thread's last, which
 * answers without a lock), a few (as a loop copying the same tensors over
 * and over asks, caches warm) or all of them. */
enum { LOCATE_SMALL = 4096, LOCATE_LARGE = 16 };
static double run_locate(ca_pool *pool, long lookups, int spread) {
  enum { ALL = LOCATE_SMALL + LOCATE_LARGE };
  static uint64_t block[ALL], size[ALL];
  for (int i = 0; i < ALL; i++) {
    size[i] = i % 257 == 0 && i / 257 < LOCATE_LARGE ? 64ull << 20 : 4096;
    int rc = ca_pool_alloc(pool, size[i], 0, &block[i]);
    if (rc)
      die("alloc", rc);
  }
  uint64_t rng = 11, found = 0;
  double start = now_ns();
  for (long i = 0; i < lookups; i++) {
    uint64_t r = next_random(&rng);
    int b = (int)(r % (uint64_t)spread);
    uint64_t lo, hi;
    found += ca_pool_bounds(block[b] + (r >> 20) % size[b], &lo, &hi) ==
                 CA_POOL_FOUND && lo == block[b];
  }
  double ns = (now_ns() - start) / (double)lookups;
  if (found != (uint64_t)lookups)
    die("locate", (int)(lookups - (long)found));
  for (int i = 0; i < ALL; i++)
    ca_pool_free(pool, block[i], NULL);
  return ns;
}

#define MAX_THREADS 8

typedef struct pairs_thread {
  ca_pool *pool;
  long pairs;
  pthread_barrier_t *start;
  unsigned arena; /* where the thread ended */
} pairs_thread;

static void *run_pairs_thread(void *arg) {
  pairs_thread *t = arg;
  pthread_barrier_wait(t->start);
  run_pairs(t->pool, t->pairs);
  t->arena = ca_pool_thread_arena();
  return NULL;
}

/* `threads` threads, started together, each making `pairs` cached pairs;
 * returns million pairs per second of wall time, and in *arenas a mask of
 * the arenas they ended on. */
static double run_threads(ca_pool *pool, int threads, long pairs,
                          unsigned *arenas) {
  pthread_t tid[MAX_THREADS];
  pairs_thread t[MAX_THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  for (int i = 0; i < threads; i++) {
    t[i] = (pairs_thread){.pool = pool, .pairs = pairs, .start = &start};
    if (pthread_create(&tid[i], NULL, run_pairs_thread, &t[i]))
      die("pthread_create", 0);
  }
  pthread_barrier_wait(&start);
  double begin = now_ns();
  *arenas = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(tid[i], NULL);
    *arenas |= 1u << t[i].arena;
  }
  double elapsed = now_ns() - begin;
  pthread_barrier_destroy(&start);
  return (double)threads * (double)pairs / elapsed * 1e3;
}

/* Threads mode: a fresh pool per thread count. */
static void bench_threads(long pairs, int safe) {
  double one = 0;
  for (int threads = 1; threads <= MAX_THREADS; threads *= 2) {
    static ca_fake_backend fake;
    ca_pool *pool = fake_pool(&fake, safe);
    unsigned arenas;
    double mpairs = run_threads(pool, threads, pairs, &arenas);
    if (threads == 1)
      one = mpairs;
    printf("threads %-9s %d: %7.2f Mpairs/s  (%.2fx one thread; %d arena%s)\n",
           safe ? "safe" : "immediate", threads, mpairs, mpairs / one,
           __builtin_popcount(arenas), arenas == 1 ? "" : "s");
    ca_pool_destroy(pool);
    ca_fake_fini(&fake);
  }
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "mixed";
  long n = argc > 2 ? atol(argv[2]) : 1000000;
  const char *reuse = argc > 3 ? argv[3] : "both";
  expandable = argc > 4 && strcmp(argv[4], "expandable") == 0;
  int mixed = strcmp(mode, "mixed") == 0;
  int threads = strcmp(mode, "threads") == 0;
  int locate = strcmp(mode, "locate") == 0;
  int from = strcmp(reuse, "safe") == 0, to = strcmp(reuse, "immediate") ? 2 : 1;
  if ((!mixed && !threads && !locate && strcmp(mode, "pair") != 0) || n <= 0 ||
      (strcmp(reuse, "both") && !from && to == 2)) {
    fprintf(stderr, "usage: bench_pool mixed|pair|threads|locate "
                    "[COUNT [immediate|safe|both [expandable]]]\n");
    return 2;
  }
  for (int safe = from; safe < to; safe++) {
    if (threads) {
      bench_threads(n, safe);
      continue;
    }
    static ca_fake_backend fake;
    ca_pool *pool = fake_pool(&fake, safe);
    if (locate) {
      for (int spread = 1; spread <= LOCATE_SMALL + LOCATE_LARGE;
           spread = spread == 1 ? 16 : spread * 257)
        printf("locate %-9s %8.1f ns per look-up  (%ld look-ups among %d blocks)\n",
               safe ? "safe" : "immediate", run_locate(pool, n, spread), n, spread);
      ca_pool_destroy(pool);
      ca_fake_fini(&fake);
      continue;
    }
    double ns = mixed ? run_mixed(pool, n) : run_pairs(pool, n);
    cudalloc_device_stats s;
    ca_pool_get_stats(pool, &s);
    printf("%-5s %-9s %8.1f ns per %s  (%ld ops, %.2f%% cache hits, "
           "%llu driver allocations, %d fences, %d markers)\n",
           mode, safe ? "safe" : "immediate", ns, mixed ? "op" : "pair", n,
           s.allocs ? 100.0 * (double)s.cache_hits / (double)s.allocs : 0.0,
           (unsigned long long)s.backend_allocs, fake.fences, fake.marks);
    ca_pool_destroy(pool);
    ca_fake_fini(&fake);
  }
  return 0;
}
