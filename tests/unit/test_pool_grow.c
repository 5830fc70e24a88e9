/*
 * Growing and giving back: the collection threshold, the memory limit,
 * out-of-memory retries, trading idle segments, merging at a miss
 * (src/pool/grow.c).
 */
#include "pool_fixture.h"

/* Before a new segment would pass threshold x budget, the least recently
 * freed segments are given back, oldest first, and only as many as needed. */
static void garbage_collects_oldest_segments_first(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.gc_threshold = 0.5;
  fixture *fx = fixture_new(1000 * MiB, opt, false); /* budget: 500 MiB */
  uint64_t a[10];
  for (int i = 0; i < 10; i++)
    a[i] = must_alloc(fx, 40 * MiB);
  int order[10] = {3, 7, 1, 9, 0, 2, 4, 5, 6, 8};
  for (int i = 0; i < 10; i++)
    assert_true(ca_pool_free(fx->pool, a[order[i]], NULL));
  /* 400 MiB cached; 200 MiB more needs reserved <= 300 MiB first: the
   * three oldest go. The seven left, each too small, then merge into one
   * segment of 280 MiB, which serves the request: within the threshold. */
  must_alloc(fx, 200 * MiB);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.gc_segments_released, 3);
  assert_int_equal(fx->fake.releases, 10);
  for (int i = 0; i < 10; i++)
    assert_int_equal(fx->fake.released_addrs[i], a[order[i]]);
  assert_int_equal(s.reserved_bytes.current, 280 * MiB);
  assert_int_equal(s.segments.current, 1);
  fixture_free(fx);
}

/* With memory_limit_mb the budget is the limit, not the device's size. */
static void garbage_collection_budget_is_the_limit_when_set(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 200 * MiB);
  opt.gc_threshold = 0.5;
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 80 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  must_alloc(fx, 90 * MiB); /* 80 + 90 > 100: the cached 80 MiB goes */
  assert_int_equal(fx->fake.releases, 1);
  assert_int_equal(fx->fake.mem_infos, 0);
  fixture_free(fx);
}

/* memory_limit_mb caps reserved memory: the cache is given back first, and
 * past that the request fails with the backend's out-of-memory code. */
static void enforces_the_memory_limit(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 100 * MiB);
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t big = must_alloc(fx, 90 * MiB);
  assert_true(ca_pool_free(fx->pool, big, NULL));
  /* Small requests need 2 MiB segments: the cached 90 MiB must make room. */
  for (int i = 0; i < 12; i++)
    must_alloc(fx, 1 * MiB);
  assert_int_equal(fx->fake.releases, 1);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 12 * MiB);
  uint64_t addr = 0;
  assert_int_equal(ca_pool_alloc(fx->pool, 90 * MiB, 0, &addr), CA_FAKE_OOM);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.failed_allocs, 1);
  assert_true(s.reserved_bytes.peak <= 100 * MiB);
  /* A medium request that fits only without its 20 MiB segment still
   * succeeds with a smaller one. */
  must_alloc(fx, 80 * MiB);
  assert_int_equal(ca_pool_alloc(fx->pool, 3 * MiB, 0, &addr), 0);
  assert_true(stats_of(fx).reserved_bytes.current <= 100 * MiB);
  fixture_free(fx);
}

/* The limit is the device's: memory booked beside the pool in its budget
 * (other pools of the device, allocations passed through to the driver)
 * counts. The pool gives its own cache back to make room, refuses what
 * would pass the limit with the rest counted, and its bookings end with
 * its segments. */
static void limit_counts_memory_outside_the_pool(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 100 * MiB);
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 30 * MiB), addr = 0;
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_budget_book(&budget, 50 * MiB)); /* passed through */
  assert_int_equal(ca_pool_alloc(fx->pool, 40 * MiB, 0, &addr), 0);
  assert_int_equal(fx->fake.releases, 1); /* the cached 30 MiB made room */
  assert_int_equal(ca_pool_alloc(fx->pool, 20 * MiB, 0, &addr), CA_FAKE_OOM);
  ca_budget_unbook(&budget, 50 * MiB);
  assert_int_equal(ca_pool_alloc(fx->pool, 20 * MiB, 0, &addr), 0);
  assert_int_equal(ca_budget_booked(&budget),
                   stats_of(fx).reserved_bytes.current);
  fixture_free(fx);
  assert_int_equal(ca_budget_booked(&budget), 0);
}

/* Two pools of one device (two contexts) share its limit: what one holds,
 * cached or in use, the other cannot have until it is given back. */
static void pools_of_one_device_share_its_limit(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 64 * MiB);
  fixture *a = fixture_new(1000 * MiB, opt, false);
  fixture *b = fixture_new(1000 * MiB, opt, false);
  uint64_t in_a = must_alloc(a, 40 * MiB), addr = 0;
  assert_int_equal(ca_pool_alloc(b->pool, 40 * MiB, 0, &addr), CA_FAKE_OOM);
  must_alloc(b, 20 * MiB);
  assert_true(ca_pool_free(a->pool, in_a, NULL)); /* cached by a: still booked */
  assert_int_equal(ca_pool_alloc(b->pool, 40 * MiB, 0, &addr), CA_FAKE_OOM);
  assert_int_equal(ca_pool_empty_cache(a->pool), 40 * MiB);
  must_alloc(b, 40 * MiB);
  assert_int_equal(ca_budget_booked(&budget), 60 * MiB);
  assert_true(stats_of(a).reserved_bytes.peak + stats_of(b).reserved_bytes.peak
              > 64 * MiB); /* over time, not at once */
  fixture_free(a);
  fixture_free(b);
  assert_int_equal(ca_budget_booked(&budget), 0);
  /* The device's peak is what both held at once, and stays. */
  assert_int_equal(atomic_load(&budget.peak), 60 * MiB);
  assert_true(atomic_load(&budget.peak_ns) > 0);
}

/* A request is booked before the backend is asked for it; one the backend
 * refuses never held memory, and the device's peak (what the report and
 * the trace call the most held at once) does not count it. */
static void a_refused_request_is_no_peak(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 0); /* no limit: counted only */
  fixture *fx = fixture_new(100 * MiB, opt, false);
  must_alloc(fx, 30 * MiB);
  uint64_t addr = 0;
  assert_int_equal(ca_pool_alloc(fx->pool, 64 * 1024 * MiB, 0, &addr), CA_FAKE_OOM);
  assert_int_equal(atomic_load(&budget.peak), 30 * MiB);
  fixture_free(fx);
}

/* When the backend runs out, every cached segment is given back and the
 * request is retried once; other errors pass through unchanged. */
static void retries_once_after_out_of_memory(void **state) {
  (void)state;
  fixture *fx = fixture_new(21 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 19 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  must_alloc(fx, 4 * KiB); /* needs 2 MiB more than the device has */
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.oom_retries, 1);
  assert_int_equal(s.backend_frees, 1);
  uint64_t addr = 0;
  assert_int_equal(ca_pool_alloc(fx->pool, 50 * MiB, 0, &addr), CA_FAKE_OOM);
  assert_int_equal(stats_of(fx).oom_retries, 2);
  assert_int_equal(stats_of(fx).failed_allocs, 1);
  fx->fake.fail_reserves = 1;
  fx->fake.fail_code = 201; /* CUDA_ERROR_INVALID_CONTEXT */
  assert_int_equal(ca_pool_alloc(fx->pool, 8 * MiB, 0, &addr), 201);
  assert_int_equal(stats_of(fx).oom_retries, 2);
  fixture_free(fx);
}

/* A medium request near the device's end gets a smaller segment on retry. */
static void retries_with_the_smallest_segment(void **state) {
  (void)state;
  fixture *fx = fixture_new(10 * MiB, default_options(), false);
  must_alloc(fx, 3 * MiB); /* the 20 MiB segment cannot be had; 4 MiB can */
  assert_int_equal(fx->fake.segments[0].size, 4 * MiB);
  fixture_free(fx);
}

/* Emptying the cache gives back exactly the fully free segments. */
static void empty_cache_gives_back_free_segments_only(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t keep = must_alloc(fx, 4 * KiB);
  uint64_t drop1 = must_alloc(fx, 64 * MiB);
  uint64_t drop2 = must_alloc(fx, 2 * MiB);
  assert_true(ca_pool_free(fx->pool, drop1, NULL));
  assert_true(ca_pool_free(fx->pool, drop2, NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 64 * MiB + 20 * MiB);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 2 * MiB);
  assert_int_equal(s.blocks.current, 1);
  assert_true(ca_pool_lookup(fx->pool, keep, NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 0);
  fixture_free(fx);
}

/* Two free 40 MiB segments, and a small one the program keeps using. */
static void free_two_large_segments(fixture *fx, uint64_t *a, uint64_t *b,
                                    int small_frees) {
  *a = must_alloc(fx, 40 * MiB);
  *b = must_alloc(fx, 40 * MiB);
  assert_true(ca_pool_free(fx->pool, *a, NULL));
  assert_true(ca_pool_free(fx->pool, *b, NULL));
  for (int i = 0; i < small_frees; i++)
    assert_true(ca_pool_free(fx->pool, must_alloc(fx, 4 * KiB), NULL));
  assert_int_equal(stats_of(fx).reserved_bytes.peak, 82 * MiB);
}

/* Before it grows past the most it ever reserved, the pool gives back the
 * fully free segments that stayed idle for CA_TRADE_IDLE_FREES frees,
 * oldest first, and only as many as keep it at that peak: given back, not
 * merged into the new segment, so reserved memory falls. */
static void trades_idle_segments_before_growing(void **state) {
  (void)state;
  fixture *fx = fixture_new(4096 * MiB, default_options(), false);
  uint64_t a, b;
  free_two_large_segments(fx, &a, &b, CA_TRADE_IDLE_FREES);
  must_alloc(fx, 60 * MiB); /* 82 - 40 + 60 > 82: both go */
  assert_int_equal(fx->fake.releases, 2);
  assert_int_equal(fx->fake.released_addrs[0], a);
  assert_int_equal(fx->fake.released_addrs[1], b);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 62 * MiB);
  assert_int_equal(s.reserved_bytes.peak, 82 * MiB);
  assert_consistent(fx);
  fixture_free(fx);
}

/* At a miss, the heap's fully free segments, each too small for the
 * request, go back, and one segment as large as they were together
 * replaces them: the pool grows by no more than the request, and their
 * bytes serve what they served. The small heap's segment is not merged. */
static void merges_free_segments_at_a_miss(void **state) {
  (void)state;
  fixture *fx = fixture_new(4096 * MiB, default_options(), false);
  uint64_t a, b;
  free_two_large_segments(fx, &a, &b, 1); /* not idle: merged */
  uint64_t x = must_alloc(fx, 60 * MiB);
  assert_int_equal(fx->fake.releases, 2);
  assert_int_equal(fx->fake.released_addrs[0], a);
  assert_int_equal(fx->fake.released_addrs[1], b);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 82 * MiB); /* 2 + 80 */
  assert_int_equal(s.reserved_bytes.peak, 82 * MiB);
  assert_int_equal(s.segments.current, 2);
  /* Two 10 MiB requests fit the merged segment's rest. */
  assert_int_equal(must_alloc(fx, 10 * MiB), x + 60 * MiB);
  assert_int_equal(must_alloc(fx, 10 * MiB), x + 70 * MiB);
  /* A request larger than all it merges gets a segment of its own size:
   * the free 30 MiB go into the 100 MiB one, and the pool grows by 70. */
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 30 * MiB), NULL));
  must_alloc(fx, 100 * MiB);
  assert_int_equal(fx->fake.releases, 3);
  s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 182 * MiB);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A merged segment stays below max_split_size: a block that large is never
 * split, and one request would take all of it. An oversize request merges
 * nothing: its block is never split either. */
static void merges_below_max_split_size(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.max_split_size = 100 * MiB;
  fixture *fx = fixture_new(4096 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 40 * MiB), b = must_alloc(fx, 40 * MiB);
  uint64_t c = must_alloc(fx, 40 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_true(ca_pool_free(fx->pool, c, NULL));
  uint64_t x = must_alloc(fx, 60 * MiB); /* a and b merge; c would pass */
  assert_int_equal(fx->fake.releases, 2);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 120 * MiB);
  assert_int_equal(must_alloc(fx, 20 * MiB), x + 60 * MiB); /* split */
  must_alloc(fx, 150 * MiB); /* oversize: c stays */
  assert_int_equal(fx->fake.releases, 2);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 270 * MiB);
  assert_consistent(fx);
  fixture_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(garbage_collects_oldest_segments_first),
      cmocka_unit_test(garbage_collection_budget_is_the_limit_when_set),
      cmocka_unit_test(enforces_the_memory_limit),
      cmocka_unit_test(a_refused_request_is_no_peak),
      cmocka_unit_test(limit_counts_memory_outside_the_pool),
      cmocka_unit_test(pools_of_one_device_share_its_limit),
      cmocka_unit_test(retries_once_after_out_of_memory),
      cmocka_unit_test(retries_with_the_smallest_segment),
      cmocka_unit_test(empty_cache_gives_back_free_segments_only),
      cmocka_unit_test(trades_idle_segments_before_growing),
      cmocka_unit_test(merges_free_segments_at_a_miss),
      cmocka_unit_test(merges_below_max_split_size),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
