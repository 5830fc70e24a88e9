/*
 * Arenas: a thread pinned to an arena with ca_pool_set_thread_arena stands
 * for a thread that contention moved there, so one test thread plays
 * several (src/pool/arenas.c).
 */
#include "pool_fixture.h"

/* Each arena test starts on arena 0, where every thread starts. */
static int start_on_arena_zero(void **state) {
  (void)state;
  ca_pool_set_thread_arena(0);
  return 0;
}

/* One thread never meets contention: it stays on arena 0. */
static void one_thread_stays_on_arena_zero(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  for (int i = 0; i < 10000; i++)
    assert_true(ca_pool_free(fx->pool, must_alloc(fx, 4 * KiB << (i % 8)), NULL));
  assert_int_equal(ca_pool_thread_arena(), 0);
  fixture_free(fx);
}

/* A block goes back to the arena that served it, whichever thread frees
 * it: that arena reuses it, the freeing thread's arena never sees it. */
static void frees_a_block_another_arena_served(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  ca_pool_set_thread_arena(1);
  uint64_t a = must_alloc(fx, 64 * KiB);
  ca_pool_set_thread_arena(0);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_false(ca_pool_free(fx->pool, a, NULL)); /* no arena holds it now */
  assert_int_equal(stats_of(fx).frees, 1);
  assert_true(must_alloc(fx, 64 * KiB) != a);
  assert_int_equal(fx->fake.reserves, 2);
  ca_pool_set_thread_arena(1);
  assert_int_equal(must_alloc(fx, 64 * KiB), a);
  assert_int_equal(fx->fake.reserves, 2);
  fixture_free(fx);
}

/* The pool's statistics are its arenas' added up; reserved memory is the
 * pool's own count. */
static void statistics_add_up_the_arenas(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a[3];
  for (unsigned i = 0; i < 3; i++) {
    ca_pool_set_thread_arena(i);
    a[i] = must_alloc(fx, 1 * MiB); /* a 2 MiB segment in each arena */
  }
  ca_pool_set_thread_arena(0);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  assert_true(ca_pool_free(fx->pool, a[2], NULL));
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.allocs, 3);
  assert_int_equal(s.frees, 2);
  assert_int_equal(s.backend_allocs, 3);
  assert_int_equal(s.blocks.current, 1);
  assert_int_equal(s.blocks.total, 3);
  assert_int_equal(s.segments.current, 3);
  assert_int_equal(s.allocated_bytes.current, 1 * MiB);
  assert_int_equal(s.reserved_bytes.current, 6 * MiB);
  assert_int_equal(s.reserved_bytes.peak, 6 * MiB);
  assert_int_equal(s.free_cached_bytes, 5 * MiB);
  assert_int_equal(s.largest_free_block, 2 * MiB);
  fixture_free(fx);
}

static void note_live(const ca_live_block *b, void *arg) {
  ca_live_block *seen = arg;
  assert_true(b->tag >= 1 && b->tag <= 3);
  seen[b->tag - 1] = *b;
}

/* The leak report's view covers every arena: each live block once, with
 * an allocation number no other block of the pool has, in allocation
 * order across arenas. Lookups find blocks and segments of any arena. */
static void lists_live_blocks_of_every_arena(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  unsigned arenas[3] = {0, 3, 5};
  uint64_t addr[3];
  for (uint32_t i = 0; i < 3; i++) {
    ca_pool_set_thread_arena(arenas[i]);
    assert_int_equal(ca_pool_alloc(fx->pool, 100 * (i + 1), i + 1, &addr[i]),
                     0);
  }
  ca_live_block seen[3] = {{0}};
  assert_int_equal(ca_pool_foreach_live(fx->pool, note_live, seen), 3);
  assert_true(seen[0].seq >= 1);
  assert_true(seen[0].seq < seen[1].seq && seen[1].seq < seen[2].seq);
  ca_pool_set_thread_arena(7); /* an arena no pool has made */
  for (int i = 0; i < 3; i++) {
    ca_live_block info;
    assert_int_equal(seen[i].addr, addr[i]);
    assert_true(ca_pool_lookup(fx->pool, addr[i], &info));
    assert_int_equal(info.requested, 100 * (i + 1));
    assert_int_equal(info.seq, seen[i].seq);
    assert_true(ca_pool_holds_segment(fx->pool, addr[i]));
  }
  fixture_free(fx);
}

/* memory_limit_mb caps the whole pool: an arena may not grow past it while
 * another holds the memory, and it makes the other give back its cached
 * segment to stay under it. */
static void memory_limit_covers_every_arena(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 100 * MiB);
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 60 * MiB), addr = 0;
  ca_pool_set_thread_arena(1);
  assert_int_equal(ca_pool_alloc(fx->pool, 60 * MiB, 0, &addr), CA_FAKE_OOM);
  assert_true(stats_of(fx).reserved_bytes.peak <= 100 * MiB);
  ca_pool_set_thread_arena(0);
  assert_true(ca_pool_free(fx->pool, a, NULL)); /* cached in arena 0 */
  ca_pool_set_thread_arena(1);
  must_alloc(fx, 60 * MiB);
  assert_int_equal(fx->fake.releases, 1);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 60 * MiB);
  assert_int_equal(s.reserved_bytes.peak, 60 * MiB);
  assert_int_equal(s.failed_allocs, 1);
  fixture_free(fx);
}

/* garbage_collection_threshold weighs the whole pool too: another arena's
 * cached segment goes when one arena's growth would pass it. */
static void collection_threshold_weighs_every_arena(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.gc_threshold = 0.5;
  fixture *fx = fixture_new(1000 * MiB, opt, false); /* budget: 500 MiB */
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 400 * MiB), NULL));
  ca_pool_set_thread_arena(1);
  must_alloc(fx, 200 * MiB);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(fx->fake.releases, 1);
  assert_int_equal(s.gc_segments_released, 1);
  assert_int_equal(s.reserved_bytes.current, 200 * MiB);
  fixture_free(fx);
}

/* Out of device memory, an arena makes the others give back their cached
 * segments and retries once. */
static void out_of_memory_takes_back_other_arenas_cache(void **state) {
  (void)state;
  fixture *fx = fixture_new(64 * MiB, default_options(), false);
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 40 * MiB), NULL));
  ca_pool_set_thread_arena(1);
  must_alloc(fx, 40 * MiB);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.oom_retries, 1);
  assert_int_equal(s.backend_frees, 1);
  assert_int_equal(s.failed_allocs, 0);
  fixture_free(fx);
}

/* Before failing, the other arenas' pending frees are waited for too. */
static void out_of_memory_waits_for_other_arenas_frees(void **state) {
  (void)state;
  fixture *fx = safe_fixture(64 * MiB, default_options());
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 40 * MiB), NULL));
  ca_pool_set_thread_arena(1);
  must_alloc(fx, 40 * MiB);
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.forgets, 1);
  assert_int_equal(stats_of(fx).backend_frees, 1);
  fixture_free(fx);
}

/* A full device whose only free memory sits in another arena's partly
 * used segment still serves a request that fits there: the block is
 * borrowed, and stays that arena's. */
static void borrows_from_another_arenas_cache(void **state) {
  (void)state;
  fixture *fx = fixture_new(2 * MiB, default_options(), false);
  uint64_t a[4];
  fill_small_segment(fx, a); /* the whole device, in arena 0 */
  assert_true(ca_pool_free(fx->pool, a[2], NULL));
  ca_pool_set_thread_arena(1);
  assert_int_equal(must_alloc(fx, 512 * KiB), a[2]);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.failed_allocs, 0);
  assert_int_equal(s.cache_hits, 3 + 1); /* the fill's splits, then a[2] */
  assert_int_equal(s.segments.current, 1);
  assert_true(ca_pool_free(fx->pool, a[2], NULL));
  ca_pool_set_thread_arena(0);
  assert_int_equal(must_alloc(fx, 512 * KiB), a[2]);
  fixture_free(fx);
}

/* empty_cache gives back every arena's free segments; a context reset
 * forgets every arena's blocks. */
static void empty_cache_and_drop_all_reach_every_arena(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a[3];
  for (unsigned i = 0; i < 3; i++) {
    ca_pool_set_thread_arena(i);
    a[i] = must_alloc(fx, 64 * MiB);
  }
  ca_pool_set_thread_arena(0);
  for (int i = 0; i < 3; i++)
    assert_true(ca_pool_free(fx->pool, a[i], NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 3 * 64 * MiB);
  assert_int_equal(fx->fake.nsegments, 0);
  uint64_t b = must_alloc(fx, 4 * KiB);
  ca_pool_set_thread_arena(1);
  uint64_t c = must_alloc(fx, 4 * KiB);
  ca_pool_drop_all(fx->pool);
  assert_int_equal(fx->fake.releases, 3);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 0);
  assert_int_equal(s.blocks.current, 0);
  assert_false(ca_pool_free(fx->pool, b, NULL));
  assert_false(ca_pool_free(fx->pool, c, NULL));
  assert_false(ca_pool_holds_segment(fx->pool, c));
  assert_consistent(fx);
  fx->fake.nsegments = 0; /* the "driver" freed them */
  fixture_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(one_thread_stays_on_arena_zero,
                             start_on_arena_zero),
      cmocka_unit_test_setup(frees_a_block_another_arena_served,
                             start_on_arena_zero),
      cmocka_unit_test_setup(statistics_add_up_the_arenas,
                             start_on_arena_zero),
      cmocka_unit_test_setup(lists_live_blocks_of_every_arena,
                             start_on_arena_zero),
      cmocka_unit_test_setup(memory_limit_covers_every_arena,
                             start_on_arena_zero),
      cmocka_unit_test_setup(collection_threshold_weighs_every_arena,
                             start_on_arena_zero),
      cmocka_unit_test_setup(out_of_memory_takes_back_other_arenas_cache,
                             start_on_arena_zero),
      cmocka_unit_test_setup(out_of_memory_waits_for_other_arenas_frees,
                             start_on_arena_zero),
      cmocka_unit_test_setup(borrows_from_another_arenas_cache,
                             start_on_arena_zero),
      cmocka_unit_test_setup(empty_cache_and_drop_all_reach_every_arena,
                             start_on_arena_zero),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
