/*
 * Frees and the device: batches, markers, fences, captures, and the three
 * reuse policies (src/pool/pending.c).
 */
#include "pool_fixture.h"

/* Safe reuse: a freed block comes back only once a marker made after its
 * free has passed. A free costs no driver call; the next miss marks the
 * pending frees and, the device being past them, takes them back at once. */
static void safe_reuses_after_marker_passes(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  assert_true(ca_pool_free(fx->pool, a[3], NULL));
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.pending_free_bytes, 1 * MiB);
  assert_int_equal(s.free_cached_bytes, 0);
  assert_int_equal(fx->fake.marks, 0); /* a free costs no driver call */
  fx->fake.auto_pass = true; /* an idle device: markers pass as made */
  uint64_t x = must_alloc(fx, 512 * KiB), y = must_alloc(fx, 512 * KiB);
  assert_true((x == a[1] && y == a[3]) || (x == a[3] && y == a[1]));
  assert_int_equal(fx->fake.reserves, 1);
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(fx->fake.waits, 0);
  assert_int_equal(fx->fake.forgets, 1);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A block that comes back of the very size asked is handed out as it is,
 * as under immediate reuse: the most recently freed first, unmerged with
 * its free neighbour, which waits parked for the next such request. */
static void a_block_back_of_the_size_asked_is_reused_as_it_is(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  fx->fake.auto_pass = true; /* merged, the two would serve from a[0] */
  assert_int_equal(must_alloc(fx, 512 * KiB), a[1]);
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(must_alloc(fx, 512 * KiB), a[0]);
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(fx->fake.reserves, 1);
  assert_consistent(fx);
  fixture_free(fx);
}

/* However many frees came before, one miss makes one marker for all. */
static void one_marker_per_batch(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.auto_pass = true;
  uint64_t a[64];
  for (int i = 0; i < 64; i++)
    a[i] = must_alloc(fx, 64 * KiB + (uint64_t)i * 512);
  for (int i = 0; i < 64; i++)
    assert_true(ca_pool_free(fx->pool, a[i], NULL));
  assert_int_equal(fx->fake.marks, 0);
  must_alloc(fx, 4 * KiB); /* the segment's free tail serves it: no miss */
  int reserves = fx->fake.reserves;
  must_alloc(fx, 1 * MiB); /* a miss: one marker, passed, all come back */
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_int_equal(fx->fake.reserves, reserves);
  assert_consistent(fx);
  fixture_free(fx);
}

/* Growing is the last resort: while the device is still busy with the work
 * before the frees, the pool waits for their marker rather than reserve
 * more, and the waited blocks merge with their free neighbours. */
static void waits_for_pending_frees_before_growing(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  assert_int_equal(must_alloc(fx, 1 * MiB), a[0]); /* a[0] and a[1], merged */
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.reserves, 1);
  /* Nothing pending: a miss grows without a marker or a wait. */
  must_alloc(fx, 512 * KiB);
  assert_int_equal(fx->fake.marks, 1);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.reserves, 2);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A backend that fences: every pending block comes back at once behind a
 * fence, with no marker and no wait, when a request misses; a hit fences
 * nothing. */
static void fence_hands_pending_blocks_back_at_once(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.backend.fence = ca_fake_fence;
  uint64_t big = must_alloc(fx, 16 * MiB);
  uint64_t a[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, big, NULL));
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  assert_int_equal(fx->fake.fences, 0); /* a free costs no driver call */
  assert_int_equal(must_alloc(fx, 16 * MiB), big);
  assert_int_equal(fx->fake.fences, 1);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  assert_int_equal(must_alloc(fx, 512 * KiB), a[0]); /* a quick hit */
  assert_int_equal(fx->fake.fences, 1);
  assert_int_equal(must_alloc(fx, 512 * KiB), a[1]); /* a miss: fences */
  assert_int_equal(fx->fake.fences, 2);
  assert_int_equal(fx->fake.marks + fx->fake.waits, 0);
  assert_int_equal(fx->fake.reserves, 2);
  assert_consistent(fx);
  fixture_free(fx);
}

static bool is_one_of(uint64_t addr, const uint64_t *set, int n) {
  for (int i = 0; i < n; i++)
    if (set[i] == addr)
      return true;
  return false;
}

/* A large request that the cache would serve poorly (a slice of a much
 * larger block) while enough is pending fences first, so that the pending
 * blocks can serve it and merge, but at most once per 16 large requests:
 * in between it takes the poor fit, the fence's driver calls saved. */
static void fences_first_once_per_sixteen_large_requests(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.backend.fence = ca_fake_fence;
  uint64_t p[4], got[12];
  for (int i = 0; i < 4; i++)
    p[i] = must_alloc(fx, 10 * MiB);
  uint64_t big = must_alloc(fx, 400 * MiB);
  assert_true(ca_pool_free(fx->pool, big, NULL));
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, p[i], NULL));
  /* A miss fences: every block is cached, and the p blocks, exact fits,
   * come back (in some order). */
  for (int i = 0; i < 4; i++)
    assert_true(is_one_of(must_alloc(fx, 10 * MiB), p, 4));
  assert_int_equal(fx->fake.fences, 1);
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, p[i], NULL));
  /* 40 MiB pending, the big block cached: the 4th to the 15th large
   * request since the fence (the miss's own request reset the count) take
   * slices of the big block. */
  for (int i = 0; i < 12; i++) {
    got[i] = must_alloc(fx, 10 * MiB);
    assert_true(got[i] >= big && got[i] < big + 400 * MiB);
  }
  assert_int_equal(fx->fake.fences, 1);
  /* The 16th fences first and gets a pending block's exact fit. */
  assert_true(is_one_of(must_alloc(fx, 10 * MiB), p, 4));
  assert_int_equal(fx->fake.fences, 2);
  assert_int_equal(fx->fake.reserves, 5);
  assert_consistent(fx);
  fixture_free(fx);
}

/* During a stream capture no fence may be made either: the pool falls back
 * to markers (refused too) and grows; after the capture it fences. */
static void capture_refuses_fences(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.backend.fence = ca_fake_fence;
  uint64_t a[4], b[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  fx->fake.refuse_sync = true;
  fill_small_segment(fx, b);
  assert_true(fx->fake.refused_fences > 0);
  assert_int_equal(fx->fake.fences + fx->fake.marks, 0);
  assert_int_equal(fx->fake.reserves, 2);
  fx->fake.refuse_sync = false;
  assert_int_equal(must_alloc(fx, 512 * KiB), a[0]);
  assert_int_equal(fx->fake.fences, 1);
  assert_consistent(fx);
  fixture_free(fx);
}

/* During a stream capture no marker may be made: freed blocks stay pending
 * and the pool grows; after the capture the next miss marks them. */
static void capture_keeps_frees_pending(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.auto_pass = true;
  uint64_t a[4], b[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  fx->fake.refuse_sync = true;
  fill_small_segment(fx, b); /* the miss's poll and its wait each ask */
  assert_int_equal(fx->fake.refused_marks, 2);
  assert_int_equal(fx->fake.marks, 0);
  for (int i = 0; i < 4; i++)
    assert_true(b[i] != a[0]);
  assert_int_equal(stats_of(fx).pending_free_bytes, 512 * KiB);
  fx->fake.refuse_sync = false;
  assert_int_equal(must_alloc(fx, 512 * KiB), a[0]);
  assert_int_equal(fx->fake.marks, 1);
  assert_consistent(fx);
  fixture_free(fx);
}

/* Short of memory (the limit): wait for the oldest batch rather than fail
 * or grow past the limit. */
static void limit_waits_for_pending_frees(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = limited_options(&budget, 2 * MiB);
  fixture *fx = safe_fixture(1024 * MiB, opt);
  uint64_t a[4];
  fill_small_segment(fx, a);
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, a[i], NULL));
  uint64_t x = must_alloc(fx, 512 * KiB);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.reserves, 1);
  assert_true(x == a[0] || x == a[1] || x == a[2] || x == a[3]);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A full device: the pending blocks are waited for and serve the request;
 * the device is never asked, so it never refuses. */
static void out_of_memory_waits_for_pending_frees(void **state) {
  (void)state;
  fixture *fx = safe_fixture(2 * MiB, default_options());
  uint64_t a[4];
  fill_small_segment(fx, a);
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, a[i], NULL));
  must_alloc(fx, 1 * MiB);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.reserves, 1);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.oom_retries, 0);
  assert_int_equal(s.failed_allocs, 0);
  assert_consistent(fx);
  fixture_free(fx);
}

/* immediate: the block is reused at once, and no marker is ever made. */
static void immediate_reuses_at_once(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.reuse = CA_REUSE_IMMEDIATE;
  fixture *fx = fixture_new(1024 * MiB, opt, true);
  uint64_t a = must_alloc(fx, 1 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_int_equal(must_alloc(fx, 1 * MiB), a);
  assert_int_equal(fx->fake.marks + fx->fake.syncs, 0);
  fixture_free(fx);
}

/* device_sync: every free waits for the device, then the block is reusable
 * at once; during a capture the free waits like under safe instead. */
static void device_sync_waits_at_each_free(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.reuse = CA_REUSE_DEVICE_SYNC;
  fixture *fx = fixture_new(1024 * MiB, opt, true);
  uint64_t a = must_alloc(fx, 1 * MiB), b = must_alloc(fx, 1 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_int_equal(fx->fake.syncs, 1);
  assert_int_equal(must_alloc(fx, 1 * MiB), a);
  fx->fake.refuse_sync = true;
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_int_equal(stats_of(fx).pending_free_bytes, 1 * MiB);
  fx->fake.refuse_sync = false;
  assert_int_equal(must_alloc(fx, 1 * MiB), b); /* marked, passed */
  assert_int_equal(fx->fake.marks, 1);
  assert_consistent(fx);
  fixture_free(fx);
}

/* empty_cache waits for pending blocks, so their segments can go back. */
static void empty_cache_waits_for_pending(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a = must_alloc(fx, 64 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 64 * MiB);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.forgets, 1);
  assert_int_equal(fx->fake.nsegments, 0);
  fixture_free(fx);
}

/* A context reset forgets pending frees too, and every marker with them. */
static void drop_all_forgets_pending_markers(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4], b[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[0], NULL));
  fill_small_segment(fx, b); /* marks a[0]'s batch, grows */
  assert_true(ca_pool_free(fx->pool, b[0], NULL)); /* a new open batch */
  ca_pool_drop_all(fx->pool);
  assert_int_equal(fx->fake.forgets, fx->fake.marks);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_consistent(fx);
  fx->fake.nsegments = 0; /* the "driver" freed them */
  fixture_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(safe_reuses_after_marker_passes),
      cmocka_unit_test(a_block_back_of_the_size_asked_is_reused_as_it_is),
      cmocka_unit_test(one_marker_per_batch),
      cmocka_unit_test(waits_for_pending_frees_before_growing),
      cmocka_unit_test(fence_hands_pending_blocks_back_at_once),
      cmocka_unit_test(fences_first_once_per_sixteen_large_requests),
      cmocka_unit_test(capture_refuses_fences),
      cmocka_unit_test(capture_keeps_frees_pending),
      cmocka_unit_test(limit_waits_for_pending_frees),
      cmocka_unit_test(out_of_memory_waits_for_pending_frees),
      cmocka_unit_test(immediate_reuses_at_once),
      cmocka_unit_test(device_sync_waits_at_each_free),
      cmocka_unit_test(empty_cache_waits_for_pending),
      cmocka_unit_test(drop_all_forgets_pending_markers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
