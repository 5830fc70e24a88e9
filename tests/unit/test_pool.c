/*
 * The pool's entry points, driven through the fake backend: what a program
 * sees of it (addresses, errors), the statistics, the live blocks, and a
 * random walk checked after every step (src/pool/entry.c).
 */
#include "pool_fixture.h"
#include "stats_fill.h"

/* Every statistic as current/peak/total, and fragmentation. */
static void keeps_statistics(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a[4];
  for (int i = 0; i < 4; i++)
    a[i] = must_alloc(fx, 512 * KiB - 100);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  assert_true(ca_pool_free(fx->pool, a[2], NULL));
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.device, 0);
  assert_int_equal(s.requested_bytes.current, 2 * (512 * KiB - 100));
  assert_int_equal(s.requested_bytes.peak, 4 * (512 * KiB - 100));
  assert_int_equal(s.requested_bytes.total, 4 * (512 * KiB - 100));
  assert_int_equal(s.allocated_bytes.current, 1 * MiB);
  assert_int_equal(s.allocated_bytes.peak, 2 * MiB);
  assert_int_equal(s.reserved_bytes.current, 2 * MiB);
  assert_int_equal(s.blocks.current, 2);
  assert_int_equal(s.blocks.peak, 4);
  assert_int_equal(s.blocks.total, 4);
  assert_int_equal(s.segments.current, 1);
  assert_int_equal(s.segments.total, 1);
  assert_int_equal(s.free_cached_bytes, 1 * MiB);
  assert_int_equal(s.largest_free_block, 512 * KiB);
  assert_true(s.fragmentation > 0.499 && s.fragmentation < 0.501);
  fixture_free(fx);
}

/* A reset starts every reported peak again from the current figure
 * (PyTorch's reset_peak_memory_stats), and peaks grow from there. */
static void resets_peaks_to_current(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t big = must_alloc(fx, 64 * MiB);
  uint64_t small = must_alloc(fx, 512 * KiB);
  assert_true(ca_pool_free(fx->pool, big, NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 64 * MiB);
  ca_pool_reset_peaks(fx->pool);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.requested_bytes.peak, 512 * KiB);
  assert_int_equal(s.allocated_bytes.peak, 512 * KiB);
  assert_int_equal(s.blocks.peak, 1);
  assert_int_equal(s.segments.peak, 1);
  assert_int_equal(s.reserved_bytes.peak, 2 * MiB);
  assert_int_equal(s.requested_bytes.total, 64 * MiB + 512 * KiB);
  uint64_t again = must_alloc(fx, 4 * MiB);
  s = stats_of(fx);
  assert_int_equal(s.allocated_bytes.peak, 4 * MiB + 512 * KiB);
  assert_int_equal(s.reserved_bytes.peak, s.reserved_bytes.current);
  assert_true(ca_pool_free(fx->pool, again, NULL));
  assert_true(ca_pool_free(fx->pool, small, NULL));
  fixture_free(fx);
}

/* Adding up pools sums every counter of stats.h's lists and keeps the
 * largest free block: a field added to the lists is summed with no other
 * edit. */
static void statistics_add_every_field(void **state) {
  (void)state;
  cudalloc_device_stats s = {.device = 1}, sum = {.device = 1};
  stats_fill_distinct(&s, 7);
  ca_pool_stats_add(&sum, &s);
  ca_pool_stats_add(&sum, &s);
#define CHECK_TRIPLE(field, row, bytes)                                        \
  assert_int_equal(sum.field.current, 2 * s.field.current);                    \
  assert_int_equal(sum.field.peak, 2 * s.field.peak);                          \
  assert_int_equal(sum.field.total, 2 * s.field.total);
#define CHECK_SUM(field) assert_int_equal(sum.field, 2 * s.field);
#define CHECK_MAX(field) assert_int_equal(sum.field, s.field);
  CA_STATS_TRIPLES(CHECK_TRIPLE)
  CA_STATS_COUNTERS(CHECK_SUM)
  CA_STATS_LARGEST(CHECK_MAX)
}

/* Frees of pointers the pool did not hand out change nothing. */
static void refuses_pointers_it_does_not_own(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 4 * KiB);
  assert_false(ca_pool_free(fx->pool, 0, NULL));
  assert_false(ca_pool_free(fx->pool, a + 512, NULL)); /* interior pointer */
  assert_false(ca_pool_free(fx->pool, 0x1234, NULL));
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_false(ca_pool_free(fx->pool, a, NULL)); /* double free */
  assert_int_equal(stats_of(fx).frees, 1);
  fixture_free(fx);
}

static void count_live(const ca_live_block *b, void *arg) {
  uint64_t *seqs = arg;
  assert_true(b->seq >= 1 && b->seq <= 3);
  assert_int_equal(b->tag, 11 * b->seq);
  seqs[b->seq - 1] = b->requested;
}

/* The live table gives the leak report size, sequence, time and the tag
 * (the stack id) each block was allocated with. */
static void lists_live_blocks(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = 0, b = 0, c = 0;
  assert_int_equal(ca_pool_alloc(fx->pool, 100, 11, &a), 0);
  assert_int_equal(ca_pool_alloc(fx->pool, 200, 22, &b), 0);
  assert_int_equal(ca_pool_alloc(fx->pool, 300, 33, &c), 0);
  ca_live_block info;
  assert_true(ca_pool_lookup(fx->pool, a, &info));
  assert_int_equal(info.seq, 1);
  assert_int_equal(info.tag, 11);
  uint64_t seen[3] = {0};
  assert_int_equal(ca_pool_foreach_live(fx->pool, count_live, seen), 3);
  assert_int_equal(seen[0], 100);
  assert_int_equal(seen[1], 200);
  assert_int_equal(seen[2], 300);
  fixture_free(fx);
}

/* memcheck's red zone: a block spans its request and the red zone, while
 * its requested bytes, which queries and statistics report, stay the
 * request. */
static void keeps_a_red_zone_past_each_block(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.red_zone = 512;
  fixture *fx = fixture_new(1024 * MiB, opt, false);
  uint64_t a = 0, b = 0, lo = 0, hi = 0;
  assert_int_equal(ca_pool_alloc(fx->pool, 1000, 1, &a), 0);
  assert_int_equal(ca_pool_alloc(fx->pool, 1536, 2, &b), 0);
  ca_live_block info;
  assert_true(ca_pool_lookup(fx->pool, a, &info));
  assert_int_equal(info.requested, 1000);
  assert_int_equal(info.size, 1536);
  assert_true(ca_pool_lookup(fx->pool, b, &info));
  assert_int_equal(info.size, 2048);
  assert_true(b >= a + 1536);
  assert_int_equal(ca_pool_bounds(a + 999, &lo, &hi), CA_POOL_FOUND);
  assert_int_equal(hi, a + 1000);
  cudalloc_device_stats st;
  ca_pool_get_stats(fx->pool, &st);
  assert_int_equal(st.requested_bytes.current, 2536);
  fixture_free(fx);
}

/* Two devices, two pools on one backend: nothing crosses over. */
static void keeps_devices_apart(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  ca_pool_options opt = default_options();
  ca_pool *other = ca_pool_create(&fx->fake.backend, 1, &opt);
  uint64_t a = must_alloc(fx, 4 * KiB), b = 0;
  assert_int_equal(ca_pool_alloc(other, 4 * KiB, 0, &b), 0);
  assert_true(ca_fake_owns(&fx->fake, 1, b, 4 * KiB));
  assert_false(ca_pool_free(other, a, NULL));
  assert_false(ca_pool_free(fx->pool, b, NULL));
  cudalloc_device_stats s;
  ca_pool_get_stats(other, &s);
  assert_int_equal(s.device, 1);
  assert_int_equal(s.blocks.current, 1);
  assert_int_equal(stats_of(fx).blocks.current, 1);
  assert_true(ca_pool_free(other, b, NULL));
  ca_pool_destroy(other);
  fixture_free(fx);
}

/* After a context reset the driver has freed everything: the pool forgets
 * its segments without giving them back and starts afresh. */
static void drop_all_forgets_without_releasing(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 4 * KiB);
  must_alloc(fx, 64 * MiB);
  ca_pool_drop_all(fx->pool);
  assert_int_equal(fx->fake.releases, 0);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 0);
  assert_int_equal(s.blocks.current, 0);
  assert_int_equal(s.blocks.peak, 2);
  assert_false(ca_pool_free(fx->pool, a, NULL));
  assert_consistent(fx);
  fx->fake.nsegments = 0; /* the "driver" freed them */
  must_alloc(fx, 4 * KiB);
  assert_int_equal(fx->fake.reserves, 3);
  fixture_free(fx);
}

/* A long random run keeps every invariant. */
static void survives_random_operations(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.max_split_size = 48 * MiB;
  opt.gc_threshold = 0.6;
  fixture *fx = fixture_new(8192 * MiB, opt, false);
  uint64_t slot[64] = {0};
  uint64_t rng = 42;
  for (int op = 0; op < 50000; op++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    int i = (int)((rng >> 33) % 64);
    if (slot[i]) {
      assert_true(ca_pool_free(fx->pool, slot[i], NULL));
      slot[i] = 0;
    } else {
      /* log-uniform from 256 B to 64 MiB */
      double u = (double)((rng >> 11) & 0xFFFFF) / (double)0x100000;
      uint64_t size = (uint64_t)(256.0 * __builtin_exp2(u * 18.0));
      assert_int_equal(ca_pool_alloc(fx->pool, size, 0, &slot[i]), 0);
    }
    if (op % 5000 == 0)
      assert_consistent(fx);
  }
  fixture_free(fx);
}

/* The pool knows its segments' bases: a second free of a pooled pointer
 * there must not reach the driver, which would free the whole segment. */
static void knows_its_segment_bases(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 4 * KiB);
  uint64_t b = must_alloc(fx, 4 * KiB);
  assert_true(ca_pool_holds_segment(fx->pool, a));
  assert_false(ca_pool_holds_segment(fx->pool, b)); /* interior */
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_true(ca_pool_holds_segment(fx->pool, a)); /* cached, still ours */
  ca_pool_empty_cache(fx->pool);
  assert_false(ca_pool_holds_segment(fx->pool, a));
  uint64_t c = must_alloc(fx, 64 * MiB);
  ca_pool_drop_all(fx->pool);
  assert_false(ca_pool_holds_segment(fx->pool, c));
  fx->fake.nsegments = 0; /* the "driver" freed them */
  fixture_free(fx);
}

/* ---- Arenas ---------------------------------------------------------------
 * A thread pinned to an arena with ca_pool_set_thread_arena stands for a
 * thread that contention moved there: one test thread plays several. */

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(keeps_statistics),
      cmocka_unit_test(resets_peaks_to_current),
      cmocka_unit_test(statistics_add_every_field),
      cmocka_unit_test(refuses_pointers_it_does_not_own),
      cmocka_unit_test(lists_live_blocks),
      cmocka_unit_test(keeps_a_red_zone_past_each_block),
      cmocka_unit_test(keeps_devices_apart),
      cmocka_unit_test(drop_all_forgets_without_releasing),
      cmocka_unit_test(knows_its_segment_bases),
      cmocka_unit_test(survives_random_operations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
