/*
 * memcheck:1 (src/concerns/memcheck.c) over a real pool and a host-backed
 * fake backend, whose fills and copies act on host memory at once: what a
 * block holds when handed out, a write past its end and one after its
 * free found with the block's figures, the quarantine holding freed blocks
 * back, and leaving it in batches while the device lags, threads
 * allocating and freeing at once (run under
 * ThreadSanitizer in CI, label stress) with nothing found, and two threads
 * freeing one block at once answered as without memcheck.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <string.h>

#include <cmocka.h>

#include "concerns/concern.h"
#include "concerns/memcheck.h"
#include "log_capture.h"
#include "pool_fixture.h"

#define STREAM 7

static ca_fake_backend fake;
static ca_pool *pool;
static ca_config cfg;
static ca_layer_env env;
static ca_chain chain;
static const ca_layer *top;
static atomic_int capturing;

/* The chain's bottom: the pool, stream-ordered, as the slot's chain. */
static int pool_alloc(const ca_layer *self, ca_ask *a) {
  (void)self;
  return ca_pool_alloc_on(a->pool, a->size, a->stack, *a->stream, &a->addr);
}

static int pool_free(const ca_layer *self, ca_give *g) {
  (void)self;
  return ca_pool_free_on(pool, g->addr, *g->stream, &g->block)
             ? 0
             : CA_GIVE_NOT_POOLED;
}

static const ca_layer bottom = {
    .name = "pool", .alloc = pool_alloc, .free = pool_free};

/* When set, each free waits here once it found its block live: two frees
 * of one block meet past every check made before the quarantine. */
static pthread_barrier_t *frees_meet;

static bool live_block(uint64_t addr, ca_pool **p, ca_live_block *out) {
  if (!ca_pool_lookup(pool, addr, out) || out->addr != addr)
    return false;
  *p = pool;
  if (frees_meet)
    pthread_barrier_wait(frees_meet);
  return true;
}

static bool no_room(int device, uint64_t bytes) {
  (void)bytes;
  (void)device;
  return false;
}

static void refused(int device, uint64_t bytes) {
  (void)bytes;
  (void)device;
}

static int allowed(void) { return 0; }

static int setup(void **state) {
  ca_fake_init(&fake, 4096 * MiB, true, true);
  ca_fake_enable_bytes(&fake);
  ca_pool_options opt = default_options();
  opt.red_zone = CA_MEMCHECK_RED_ZONE;
  opt.fill_fresh = true;
  opt.fresh_byte = CA_MEMCHECK_FILL;
  pool = ca_pool_create(&fake.backend, 0, &opt);
  ca_config_defaults(&cfg);
  if (pool == NULL || ca_config_parse(&cfg, "memcheck:1,python_frames:0") != 0)
    return -1;
  env = (ca_layer_env){.cfg = &cfg, .oom = CA_FAKE_OOM, .make_room = no_room,
                       .no_room = refused, .allowed = allowed,
                       .capturing = &capturing,
                       .block = live_block};
  top = ca_compose(&chain, &env, CA_PATH_ORDERED, &bottom);
  return capture_log(state);
}

static int teardown(void **state) {
  ca_memcheck_drain();
  ca_pool_destroy(pool);
  ca_fake_fini(&fake);
  return release_log(state);
}

static uint64_t alloc(uint64_t size) {
  uint64_t stream = STREAM;
  ca_ask a = {.pool = pool, .size = size, .stream = &stream};
  assert_int_equal(ca_layer_alloc(top, &a), 0);
  return a.addr;
}

static void release(uint64_t addr) {
  uint64_t stream = STREAM;
  ca_give g = {.addr = addr, .stream = &stream};
  assert_int_equal(ca_layer_free(top, &g), 0);
}

static unsigned char *bytes(uint64_t addr) { return (unsigned char *)(uintptr_t)addr; }

static uint64_t findings(void) {
  ca_memcheck_totals t = ca_memcheck_totals_now();
  return t.overflows + t.after_free;
}

/* The chain holds the layer; a block and its red zone hold the fill. */
static void test_blocks_are_handed_out_filled(void **state) {
  (void)state;
  char names[128];
  ca_chain_describe(&chain, names, sizeof(names));
  assert_string_equal(names, "site_bytes+memcheck+pool");
  uint64_t a = alloc(1000);
  for (int i = 0; i < 1000 + CA_MEMCHECK_RED_ZONE; i++)
    assert_int_equal(bytes(a)[i], CA_MEMCHECK_FILL);
  memset(bytes(a), 0x42, 1000);
  release(a);
  for (int i = 0; i < 1000; i++)
    assert_int_equal(bytes(a)[i], CA_MEMCHECK_FILL); /* set again at its free */
  ca_memcheck_drain();
  take_log();
}

/* Three bytes past the end: one finding, its figures, at the drain. */
static void test_a_write_past_the_end_is_found(void **state) {
  (void)state;
  uint64_t before = ca_memcheck_totals_now().overflows;
  uint64_t a = alloc(1000);
  memset(bytes(a + 1000 + 5), 0x11, 3);
  release(a);
  ca_memcheck_drain();
  assert_int_equal(ca_memcheck_totals_now().overflows, before + 1);
  const char *log = take_log();
  assert_non_null(strstr(log, "memcheck: 3 bytes written past the end of a "
                              "block of 1000 bytes at 0x"));
  assert_non_null(strstr(log, "the first 5 past it"));
  assert_non_null(strstr(log, "allocated at:"));
  assert_non_null(strstr(log, "freed at:"));
}

/* A large block is checked at its head and its tail, not in between. */
static void test_a_write_after_free_is_found_at_head_and_tail(void **state) {
  (void)state;
  uint64_t before = ca_memcheck_totals_now().after_free;
  uint64_t a = alloc(20000);
  release(a);
  bytes(a)[100] = 0;
  bytes(a)[19990] = 0;
  bytes(a)[10000] = 0; /* the middle: not checked */
  ca_memcheck_drain();
  assert_int_equal(ca_memcheck_totals_now().after_free, before + 1);
  assert_non_null(strstr(take_log(),
                         "memcheck: write after free at offset 100 of a block "
                         "of 20000 bytes (19.5 KiB) at 0x"));
}

/* A large block freed on a stream is set to the fill only where it is
 * checked; blocks later carved out of the bytes between, which still hold
 * the program's, find their red zones holding the fill all the same:
 * nothing is found in blocks written only inside. */
static void test_stale_bytes_between_the_rows_find_nothing(void **state) {
  (void)state;
  uint64_t found = findings();
  uint64_t a = alloc(8 * MiB);
  memset(bytes(a), 0x42, 8 * MiB);
  release(a);
  assert_true(ca_memcheck_holds(a));
  assert_int_equal(bytes(a)[0], CA_MEMCHECK_FILL);
  assert_int_equal(bytes(a)[8 * MiB - 1], CA_MEMCHECK_FILL);
  assert_int_equal(bytes(a)[4 * MiB], 0x42); /* not the device's work now */
  ca_memcheck_drain();
  assert_false(ca_memcheck_holds(a));
  /* Blocks of other sizes over the same bytes: red zones on stale ones. */
  enum { N = 4 };
  uint64_t b[N];
  int inside = 0;
  for (int i = 0; i < N; i++) {
    uint64_t size = MiB + 4096 * (uint64_t)(i + 1);
    b[i] = alloc(size);
    if (b[i] + size > a + 4608 && b[i] + size < a + 8 * MiB - 4608) {
      inside++;
      for (int k = 0; k < CA_MEMCHECK_RED_ZONE; k++)
        assert_int_equal(bytes(b[i] + size)[k], CA_MEMCHECK_FILL);
    }
    memset(bytes(b[i]), 1, size);
  }
  assert_true(inside > 0);
  for (int i = 0; i < N; i++)
    release(b[i]);
  ca_memcheck_drain();
  assert_int_equal(findings(), found);
  assert_string_equal(take_log(), "");
}

/* A block carved out of stale bytes has its red zone set once, as it is
 * first handed out; each free then says exactly what it left stale, so
 * the same block handed out again at its size costs no fill: one fill a
 * free, a 2D one, in a loop that frees and asks again. */
static void test_a_block_reused_at_its_size_costs_one_fill_a_free(void **state) {
  (void)state;
  uint64_t a = alloc(8 * MiB);
  release(a);
  ca_memcheck_drain();
  int fills = fake.fills;
  for (int i = 0; i < 5; i++) {
    assert_int_equal(alloc(2 * MiB), a);
    release(a);
    ca_memcheck_drain();
  }
  assert_int_equal(fake.fills - fills, 5 + 1);
  assert_string_equal(take_log(), "");
}

/* A freed block is not handed out again while it is in the quarantine. */
static void test_the_quarantine_holds_freed_blocks(void **state) {
  (void)state;
  uint64_t a = alloc(4096);
  release(a);
  assert_true(ca_memcheck_holds(a));
  uint64_t b = alloc(4096);
  assert_int_not_equal(a, b);
  release(b);
  ca_memcheck_drain();
  assert_false(ca_memcheck_holds(a));
  take_log();
}

/* Blocks leave the quarantine in batches of up to 64 under one marker,
 * also while the device lags and earlier copies are still in flight. */
static void test_blocks_leave_in_batches_while_the_device_lags(void **state) {
  (void)state;
  enum { N = 600 };
  static uint64_t a[N];
  uint64_t found = findings();
  for (int i = 0; i < N; i++)
    a[i] = alloc(MiB);
  fake.auto_pass = false; /* no marker passes unless the pool waits */
  int marks = fake.marks + fake.marks_on, fetches = fake.fetches;
  int calls = fake.fetch_calls;
  for (int i = 0; i < N; i++)
    release(a[i]);
  int batches = fake.marks + fake.marks_on - marks;
  int copies = fake.fetches - fetches;
  assert_true(copies >= N / 2);      /* past the bound, blocks left */
  assert_true(copies >= 32 * batches); /* and not one marker each */
  assert_true(copies >= 32 * (fake.fetch_calls - calls)); /* one ask a batch */
  fake.auto_pass = true;
  ca_memcheck_drain();
  assert_int_equal(findings(), found);
  assert_string_equal(take_log(), "");
}

/* The backend compares a batch's rows with the fill where they lie and
 * copies back only those that differ: of ten blocks, the one written past
 * its end; all ten are checked. */
static void test_only_blocks_that_differ_are_copied_back(void **state) {
  (void)state;
  enum { N = 10 };
  uint64_t a[N];
  for (int i = 0; i < N; i++)
    a[i] = alloc(1000 + 4096 * (uint64_t)i);
  ca_memcheck_drain();
  uint64_t checked = ca_memcheck_totals_now().checked;
  uint64_t over = ca_memcheck_totals_now().overflows;
  int copies = fake.fetch_copies;
  bytes(a[7] + 1000 + 4096 * 7)[2] = 0x11;
  for (int i = 0; i < N; i++)
    release(a[i]);
  ca_memcheck_drain();
  assert_int_equal(ca_memcheck_totals_now().checked - checked, N);
  assert_int_equal(ca_memcheck_totals_now().overflows - over, 1);
  assert_int_equal(fake.fetch_copies - copies, 1);
  assert_non_null(strstr(take_log(), "1 byte written past the end of a block "
                                     "of 29672 bytes"));
}

/* Copies the backend did not start (a launch or a copy refused): their
 * blocks go back to the pool unchecked, those it started are judged, and
 * nothing is lost or found. */
static void test_copies_not_started_go_back_unchecked(void **state) {
  (void)state;
  enum { N = 10 };
  uint64_t a[N];
  for (int i = 0; i < N; i++)
    a[i] = alloc(1000);
  ca_memcheck_drain();
  uint64_t checked = ca_memcheck_totals_now().checked;
  fake.fetch_cap = 3;
  for (int i = 0; i < N; i++)
    release(a[i]);
  ca_memcheck_drain();
  fake.fetch_cap = 0;
  assert_int_equal(ca_memcheck_totals_now().checked - checked, 3);
  for (int i = 0; i < N; i++)
    assert_false(ca_memcheck_holds(a[i]));
  cudalloc_device_stats s;
  ca_pool_get_stats(pool, &s);
  assert_int_equal(s.requested_bytes.current, 0);
  assert_string_equal(take_log(), "");
}

typedef struct worker {
  unsigned seed;
  int frees;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  uint64_t live[8] = {0};
  for (int i = 0; i < 3000; i++) {
    uint64_t *slot = &live[rand_r(&w->seed) % 8];
    if (*slot) {
      release(*slot);
      w->frees++;
    }
    uint64_t size = 1 + rand_r(&w->seed) % 100000;
    *slot = alloc(size);
    bytes(*slot)[0] = 1;
    bytes(*slot)[size - 1] = 1;
  }
  for (int i = 0; i < 8; i++)
    if (live[i]) {
      release(live[i]);
      w->frees++;
    }
  return NULL;
}

/* Four threads at once, writing only inside their blocks: every block
 * checked, nothing found. */
static void test_threads_find_nothing_in_correct_blocks(void **state) {
  (void)state;
  uint64_t found = findings();
  uint64_t checked = ca_memcheck_totals_now().checked;
  pthread_t t[4];
  worker w[4];
  int frees = 0;
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){.seed = 17u * (unsigned)i + 1};
    assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    frees += w[i].frees;
  }
  ca_memcheck_drain();
  assert_int_equal(findings(), found);
  assert_int_equal(ca_memcheck_totals_now().checked, checked + (uint64_t)frees);
  assert_string_equal(take_log(), "");
}

static void *free_once(void *arg) {
  uint64_t *addr_then_result = arg;
  uint64_t stream = STREAM;
  ca_give g = {.addr = addr_then_result[0], .stream = &stream};
  addr_then_result[1] = (uint64_t)(int64_t)ca_layer_free(top, &g);
  return NULL;
}

/* Two threads free one block at once (a racing double free): as without
 * memcheck, one free takes it and the other finds no live block there,
 * and the block goes back to the pool once, not handed out twice. */
static void test_a_racing_double_free_is_answered_once(void **state) {
  (void)state;
  pthread_barrier_t meet;
  pthread_barrier_init(&meet, NULL, 2);
  for (int round = 0; round < 50; round++) {
    uint64_t a = alloc(4096);
    uint64_t job[2][2] = {{a, 99}, {a, 99}};
    pthread_t t[2];
    frees_meet = &meet;
    for (int i = 0; i < 2; i++)
      assert_int_equal(pthread_create(&t[i], NULL, free_once, job[i]), 0);
    for (int i = 0; i < 2; i++)
      pthread_join(t[i], NULL);
    frees_meet = NULL;
    int64_t r0 = (int64_t)job[0][1], r1 = (int64_t)job[1][1];
    assert_true((r0 == 0 && r1 == CA_GIVE_NOT_POOLED) ||
                (r1 == 0 && r0 == CA_GIVE_NOT_POOLED));
    ca_memcheck_drain();
    uint64_t b = alloc(4096), c = alloc(4096);
    assert_int_not_equal(b, c);
    release(b);
    release(c);
  }
  pthread_barrier_destroy(&meet);
  ca_memcheck_drain();
  assert_string_equal(take_log(), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocks_are_handed_out_filled),
      cmocka_unit_test(test_a_write_past_the_end_is_found),
      cmocka_unit_test(test_a_write_after_free_is_found_at_head_and_tail),
      cmocka_unit_test(test_stale_bytes_between_the_rows_find_nothing),
      cmocka_unit_test(test_a_block_reused_at_its_size_costs_one_fill_a_free),
      cmocka_unit_test(test_the_quarantine_holds_freed_blocks),
      cmocka_unit_test(test_blocks_leave_in_batches_while_the_device_lags),
      cmocka_unit_test(test_only_blocks_that_differ_are_copied_back),
      cmocka_unit_test(test_copies_not_started_go_back_unchecked),
      cmocka_unit_test(test_threads_find_nothing_in_correct_blocks),
      cmocka_unit_test(test_a_racing_double_free_is_answered_once),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
