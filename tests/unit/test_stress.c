/*
 * Eight threads allocate and free at random through one pool. The fake
 * backend hands out real host memory, so each thread stamps its blocks and
 * checks the stamps before freeing: two threads given overlapping blocks
 * would overwrite each other's stamps. Between rounds the threads stop at a
 * barrier and the whole pool is checked: every live block distinct, none
 * overlapping, reserved = live + cached + pending. Each thread starts on an
 * arena of its own, and between rounds the threads pass their blocks on to
 * the next thread, so that frees cross arenas.
 *
 * The pool runs reuse_policy safe against a "device" thread that moves the
 * fake's progress clock on its own, so markers pass while threads allocate,
 * poll and wait, as on a GPU. One run has room enough; one a memory limit
 * far below what the threads ask for, so that arenas keep taking memory
 * back from each other; one splits the threads over two pools (two
 * contexts of one device) that share the device's limit, which the device
 * must never see passed. Every thread also asks the process-wide address
 * index for its own blocks while the others change it. Two runs name a
 * stream for most requests and free each block on its own stream, from
 * whichever thread holds it then, as an allocator slot does: streams'
 * free blocks are shared behind markers while other threads allocate,
 * wait and give memory back. The last tests let
 * contention alone spread threads, and check that threads stop counting on
 * their arena when they exit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_backend.h"
#include "pool/pool.h"

#define THREADS 8
#define SLOTS 32
#define ROUNDS 8
#define OPS_PER_ROUND 4000

typedef struct slot {
  uint64_t addr, size, stamp;
  uint64_t stream; /* named at allocation, freed on; 0: the plain path */
} slot;

typedef struct worker {
  int id;
  ca_pool *pool;
  slot slots[SLOTS];
  uint64_t rng;
  int failures; /* a stamp overwritten, a free refused, an unexpected error */
  int refused;  /* allocations refused as out of memory, under a limit */
  bool may_refuse;
  bool streams; /* most requests name one of a few streams */
} worker;

static pthread_barrier_t round_start, round_end;
static worker workers[THREADS];

static uint64_t next_random(uint64_t *rng) {
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  return *rng >> 33;
}

/* Sizes from 256 B to 4 MiB, log-uniform, so small and large pools both
 * see traffic. */
static uint64_t random_size(uint64_t *rng) {
  return 256ull << (next_random(rng) % 15) | (next_random(rng) % 256);
}

static void stamp(const slot *s) {
  memcpy((void *)(uintptr_t)s->addr, &s->stamp, sizeof(s->stamp));
  memcpy((void *)(uintptr_t)(s->addr + s->size - sizeof(s->stamp)), &s->stamp,
         sizeof(s->stamp));
}

static int stamp_intact(const slot *s) {
  uint64_t head, tail;
  memcpy(&head, (void *)(uintptr_t)s->addr, sizeof(head));
  memcpy(&tail, (void *)(uintptr_t)(s->addr + s->size - sizeof(tail)),
         sizeof(tail));
  return head == s->stamp && tail == s->stamp;
}

/* The process-wide address index names the thread's own live block for an
 * address inside it, whatever the other threads allocate and free meanwhile
 * (pools whose fakes share addresses may leave it unable to say). */
static int bounds_right(const slot *s, uint64_t addr) {
  uint64_t lo = 0, hi = 0;
  ca_pool_where where = ca_pool_bounds(addr, &lo, &hi);
  return where == CA_POOL_ASK ||
         (where == CA_POOL_FOUND && lo == s->addr && hi == s->addr + s->size);
}

static void step(worker *w) {
  slot *s = &w->slots[next_random(&w->rng) % SLOTS];
  if (s->addr) {
    if (!stamp_intact(s) || !bounds_right(s, s->addr + s->size / 2) ||
        !(s->stream ? ca_pool_free_on(w->pool, s->addr, s->stream, NULL)
                    : ca_pool_free(w->pool, s->addr, NULL)))
      w->failures++;
    s->addr = 0;
    return;
  }
  s->size = random_size(&w->rng);
  uint64_t pick = next_random(&w->rng) % 4;
  s->stream = w->streams && pick ? 0x5000u + pick : 0;
  int rc = s->stream
               ? ca_pool_alloc_on(w->pool, s->size, 0, s->stream, &s->addr)
               : ca_pool_alloc(w->pool, s->size, 0, &s->addr);
  if (rc != 0) {
    if (rc == CA_FAKE_OOM && w->may_refuse)
      w->refused++;
    else
      w->failures++;
    s->addr = 0;
    return;
  }
  s->stamp = ((uint64_t)w->id << 56) | next_random(&w->rng);
  stamp(s);
  if (!bounds_right(s, s->addr + s->size - 1))
    w->failures++;
}

static void *run_worker(void *arg) {
  worker *w = arg;
  ca_pool_set_thread_arena((unsigned)w->id);
  for (int r = 0; r < ROUNDS; r++) {
    pthread_barrier_wait(&round_start);
    for (int i = 0; i < OPS_PER_ROUND; i++)
      step(w);
    pthread_barrier_wait(&round_end);
  }
  return NULL;
}

static int by_addr(const void *a, const void *b) {
  const slot *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* With every thread parked: live blocks are distinct and disjoint, and the
 * pool agrees with what its threads hold. */
static void check_quiescent(ca_pool *pool) {
  static slot live[THREADS * SLOTS];
  size_t n = 0;
  uint64_t bytes = 0;
  for (int t = 0; t < THREADS; t++)
    for (int i = 0; i < SLOTS; i++)
      if (workers[t].pool == pool && workers[t].slots[i].addr) {
        live[n++] = workers[t].slots[i];
        bytes += workers[t].slots[i].size;
      }
  qsort(live, n, sizeof(live[0]), by_addr);
  for (size_t i = 1; i < n; i++)
    assert_true(live[i - 1].addr + live[i - 1].size <= live[i].addr);
  char why[256] = "";
  if (!ca_pool_check(pool, why, sizeof(why)))
    fail_msg("pool inconsistent: %s", why);
  cudalloc_device_stats s;
  ca_pool_get_stats(pool, &s);
  assert_int_equal(s.blocks.current, n);
  assert_int_equal(s.requested_bytes.current, bytes);
  assert_int_equal(s.reserved_bytes.current,
                   s.allocated_bytes.current + s.free_cached_bytes +
                       s.pending_free_bytes);
}

/* With every thread parked: each thread's blocks go to the next thread of
 * the same pool (threads take the `npools` pools in turn), whose arena did
 * not serve them. */
static void pass_blocks_on(int npools) {
  slot first[2][SLOTS];
  for (int k = 0; k < npools; k++)
    memcpy(first[k], workers[k].slots, sizeof(first[k]));
  for (int t = 0; t + npools < THREADS; t++)
    memcpy(workers[t].slots, workers[t + npools].slots, sizeof(first[0]));
  for (int k = 0; k < npools; k++)
    memcpy(workers[THREADS - npools + k].slots, first[k], sizeof(first[k]));
}

static atomic_bool device_stop;

/* The device: catches up with every marker made so far, now and then. */
static void *run_device(void *arg) {
  ca_fake_backend *fake = arg;
  while (!atomic_load(&device_stop)) {
    pthread_mutex_lock(&fake->lock);
    fake->passed = (uint64_t)fake->marks;
    pthread_mutex_unlock(&fake->lock);
    struct timespec pause = {0, 20000};
    nanosleep(&pause, NULL);
  }
  return NULL;
}

/* Runs THREADS workers over `npools` pools (1 or 2) of one fake device of
 * 8 GiB, made with `opt`, the threads taking the pools in turn; with
 * `streams`, most requests name a stream. */
static void run_threads_on(ca_pool_options opt, bool may_refuse, int npools,
                           bool streams) {
  static ca_fake_backend fake;
  ca_fake_init(&fake, 8ull << 30, true, true);
  fake.auto_pass = false;
  ca_pool *pools[2];
  for (int k = 0; k < npools; k++)
    pools[k] = ca_pool_create(&fake.backend, 0, &opt);
  atomic_store(&device_stop, false);
  pthread_t device;
  pthread_create(&device, NULL, run_device, &fake);
  pthread_t threads[THREADS];
  pthread_barrier_init(&round_start, NULL, THREADS + 1);
  pthread_barrier_init(&round_end, NULL, THREADS + 1);
  for (int t = 0; t < THREADS; t++) {
    workers[t] = (worker){.id = t, .pool = pools[t % npools],
                          .rng = 1234u + (uint64_t)t,
                          .may_refuse = may_refuse, .streams = streams};
    pthread_create(&threads[t], NULL, run_worker, &workers[t]);
  }
  for (int r = 0; r < ROUNDS; r++) {
    pthread_barrier_wait(&round_start);
    pthread_barrier_wait(&round_end);
    for (int k = 0; k < npools; k++)
      check_quiescent(pools[k]);
    pass_blocks_on(npools);
  }
  for (int t = 0; t < THREADS; t++) {
    pthread_join(threads[t], NULL);
    assert_int_equal(workers[t].failures, 0);
  }
  atomic_store(&device_stop, true);
  pthread_join(device, NULL);
  /* Under safe reuse, frees came back through markers, polled under
   * contention. */
  if (opt.reuse == CA_REUSE_SAFE) {
    assert_true(fake.marks > 0);
    assert_true(fake.polls > 0);
  }
  /* What the device ever held at once, all pools together. */
  if (opt.budget && opt.budget->limit)
    assert_true(fake.peak_used[0] <= opt.budget->limit);
  for (int k = 0; k < npools; k++) {
    check_quiescent(pools[k]);
    ca_pool_destroy(pools[k]);
  }
  if (opt.budget)
    assert_int_equal(ca_budget_booked(opt.budget), 0);
  assert_int_equal(fake.nsegments, 0);
  assert_int_equal(fake.bad_releases, 0);
  ca_fake_fini(&fake);
  pthread_barrier_destroy(&round_start);
  pthread_barrier_destroy(&round_end);
}

static void run_threads(ca_pool_options opt, bool may_refuse, int npools) {
  run_threads_on(opt, may_refuse, npools, false);
}

/* Three streams and the plain path through one pool, blocks freed on their
 * own stream from the thread that holds them, under room enough and then
 * under a limit far below what the threads ask for. */
static void eight_threads_on_streams_keep_the_pool_consistent(void **state) {
  (void)state;
  ca_pool_options opt = {.max_split_size = 32u << 20, .gc_threshold = 0.5,
                         .reuse = CA_REUSE_SAFE};
  run_threads_on(opt, false, 1, true);
  static ca_budget budget;
  budget = (ca_budget){.limit = 96u << 20};
  opt.budget = &budget;
  run_threads_on(opt, true, 1, true);
}

static void eight_threads_keep_the_pool_consistent(void **state) {
  (void)state;
  ca_pool_options opt = {.max_split_size = 32u << 20, .gc_threshold = 0.5,
                         .reuse = CA_REUSE_SAFE};
  run_threads(opt, false, 1);
}

/* The same under immediate reuse, where a freed small block waits in its
 * quick list still in the live table and the address index (parked): the
 * range look-ups of every step must never find one. */
static void eight_threads_reusing_at_once_keep_the_pool_consistent(void **state) {
  (void)state;
  ca_pool_options opt = {.max_split_size = 32u << 20, .gc_threshold = 0.5,
                         .reuse = CA_REUSE_IMMEDIATE};
  run_threads(opt, false, 1);
  run_threads_on(opt, false, 1, true);
}

/* 96 MiB for threads that ask for more, in eight arenas that each want
 * segments of their own: refusals are expected, and must be out of memory;
 * the limit holds for the pool whatever the arenas do at once. */
static void eight_threads_share_a_tight_limit(void **state) {
  (void)state;
  static ca_budget budget;
  budget = (ca_budget){.limit = 96u << 20};
  ca_pool_options opt = {.max_split_size = 32u << 20, .gc_threshold = 0.5,
                         .budget = &budget, .reuse = CA_REUSE_SAFE};
  run_threads(opt, true, 1);
}

/* The same limit over two pools of one device, four threads each: the
 * device's budget is booked before each segment is asked for, so the two
 * pools together never hold more than the limit. */
static void two_pools_of_a_device_share_its_limit(void **state) {
  (void)state;
  static ca_budget budget;
  budget = (ca_budget){.limit = 96u << 20};
  ca_pool_options opt = {.max_split_size = 32u << 20, .gc_threshold = 0.5,
                         .budget = &budget, .reuse = CA_REUSE_SAFE};
  run_threads(opt, true, 2);
}

#define SPREAD_SECONDS 10

typedef struct spreader {
  ca_pool *pool;
  atomic_int *moved;
  int failures;
} spreader;

/* Allocates and frees in a tight loop, from arena 0, until some thread has
 * moved or time is up. */
static void *run_spreader(void *arg) {
  spreader *w = arg;
  time_t until = time(NULL) + SPREAD_SECONDS;
  while (atomic_load(w->moved) == 0 && time(NULL) < until) {
    for (int i = 0; i < 1000; i++) {
      uint64_t addr = 0;
      if (ca_pool_alloc(w->pool, 4096, 0, &addr) != 0 ||
          !ca_pool_free(w->pool, addr, NULL))
        w->failures++;
    }
    if (ca_pool_thread_arena() != 0)
      atomic_fetch_add(w->moved, 1);
  }
  return NULL;
}

/* A pool with immediate reuse over `fake`, a fake device of 8 GiB. */
static ca_pool *spread_pool(ca_fake_backend *fake) {
  ca_fake_init(fake, 8ull << 30, false, false);
  ca_pool_options opt = {.max_split_size = UINT64_MAX,
                         .reuse = CA_REUSE_IMMEDIATE};
  return ca_pool_create(&fake->backend, 0, &opt);
}

/* Starts THREADS threads running `fn` over `pool`, one spreader each. */
static void start_spreaders(ca_pool *pool, void *(*fn)(void *),
                            atomic_int *moved, pthread_t *threads,
                            spreader *spreaders) {
  for (int t = 0; t < THREADS; t++) {
    spreaders[t] = (spreader){.pool = pool, .moved = moved};
    pthread_create(&threads[t], NULL, fn, &spreaders[t]);
  }
}

/* Joins them; returns their failures, all together. */
static int join_spreaders(pthread_t *threads, const spreader *spreaders) {
  int failures = 0;
  for (int t = 0; t < THREADS; t++) {
    pthread_join(threads[t], NULL);
    failures += spreaders[t].failures;
  }
  return failures;
}

/* Threads that all start on arena 0 and keep finding its lock held move
 * to other arenas. It takes two threads running at once. */
static void contending_threads_spread_over_arenas(void **state) {
  (void)state;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
    skip();
  static ca_fake_backend fake;
  ca_pool *pool = spread_pool(&fake);
  atomic_int moved = 0;
  pthread_t threads[THREADS];
  spreader spreaders[THREADS];
  start_spreaders(pool, run_spreader, &moved, threads, spreaders);
  assert_int_equal(join_spreaders(threads, spreaders), 0);
  assert_true(atomic_load(&moved) > 0);
  char why[256] = "";
  if (!ca_pool_check(pool, why, sizeof(why)))
    fail_msg("pool inconsistent: %s", why);
  ca_pool_destroy(pool);
  assert_int_equal(fake.bad_releases, 0);
  ca_fake_fini(&fake);
}

/* A value another component keeps under pthread key 0, in each thread. */
static int key_zero_value;

static void *run_keeper(void *arg) {
  spreader *w = arg;
  pthread_setspecific(0, &key_zero_value);
  run_spreader(w);
  if (pthread_getspecific(0) != &key_zero_value)
    w->failures++;
  return NULL;
}

/* A process that has used up its pthread keys: the pool cannot make the key
 * that uncounts exiting threads, and must then leave every other key alone
 * (key 0 above all, which an unset pthread_key_t names). Run in a child, the
 * first there to count a thread, where the test owns key 0 (under the
 * sanitizers, whose runtime takes key 0 first, it is skipped). */
static void out_of_keys_leaves_other_keys_alone(void **state) {
  (void)state;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
    skip();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    pthread_key_t key;
    if (pthread_key_create(&key, NULL) != 0 || key != 0)
      _exit(77);
    while (pthread_key_create(&key, NULL) == 0)
      ;
    static ca_fake_backend fake;
    ca_pool *pool = spread_pool(&fake);
    atomic_int moved = 0;
    pthread_t threads[THREADS];
    spreader spreaders[THREADS];
    start_spreaders(pool, run_keeper, &moved, threads, spreaders);
    int failures = join_spreaders(threads, spreaders);
    _exit(failures ? 1 : atomic_load(&moved) == 0 ? 2 : 0);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77)
    skip();
  assert_int_equal(WEXITSTATUS(status), 0);
}

static pthread_key_t late_key;
static pthread_barrier_t late_key_made;

/* Another library's thread-exit destructor, which glibc runs after the
 * pool's own (its key is younger): the thread still uses the pool there,
 * and contention moves it once more. */
static void late_destructor(void *arg) {
  (void)arg;
  ca_pool_set_thread_arena(ca_pool_thread_arena() + 1);
}

static void *run_leaver(void *arg) {
  run_spreader(arg);
  pthread_barrier_wait(&late_key_made);
  pthread_barrier_wait(&late_key_made);
  pthread_setspecific(late_key, arg);
  return NULL;
}

/* Threads that met contention count on their arena while they live, and
 * stop counting when they exit, whatever they do after their count is
 * dropped: a count left behind, or dropped twice (an unsigned count then
 * wraps), would steer every later thread away from that arena or onto it. */
static void leaving_threads_stop_counting(void **state) {
  (void)state;
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
    skip();
  for (unsigned i = 0; i < CA_POOL_ARENAS; i++)
    assert_int_equal(ca_pool_arena_threads(i), 0);
  static ca_fake_backend fake;
  ca_pool *pool = spread_pool(&fake);
  atomic_int moved = 0;
  pthread_t threads[THREADS];
  spreader spreaders[THREADS];
  pthread_barrier_init(&late_key_made, NULL, THREADS + 1);
  start_spreaders(pool, run_leaver, &moved, threads, spreaders);
  /* Made once contention has counted a thread, so that it is younger than
   * the pool's own key. */
  pthread_barrier_wait(&late_key_made);
  assert_int_equal(pthread_key_create(&late_key, late_destructor), 0);
  pthread_barrier_wait(&late_key_made);
  assert_int_equal(join_spreaders(threads, spreaders), 0);
  assert_true(atomic_load(&moved) > 0);
  for (unsigned i = 0; i < CA_POOL_ARENAS; i++)
    assert_int_equal(ca_pool_arena_threads(i), 0);
  pthread_key_delete(late_key);
  pthread_barrier_destroy(&late_key_made);
  ca_pool_destroy(pool);
  ca_fake_fini(&fake);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* First: in its child, no thread may have been counted yet. */
      cmocka_unit_test(out_of_keys_leaves_other_keys_alone),
      cmocka_unit_test(eight_threads_keep_the_pool_consistent),
      cmocka_unit_test(eight_threads_reusing_at_once_keep_the_pool_consistent),
      cmocka_unit_test(eight_threads_on_streams_keep_the_pool_consistent),
      cmocka_unit_test(eight_threads_share_a_tight_limit),
      cmocka_unit_test(two_pools_of_a_device_share_its_limit),
      cmocka_unit_test(contending_threads_spread_over_arenas),
      cmocka_unit_test(leaving_threads_stop_counting),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
