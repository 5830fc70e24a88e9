/*
 * Sizes, size classes, splitting and merging: where a request lands, and
 * what a freed block becomes (src/pool/bins.c, blocks.c).
 */
#include <string.h>

#include "pool_fixture.h"

/* Requests are rounded to 512 B; the program's own size is kept too. */
static void rounds_requests_to_the_granule(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t sizes[] = {0, 1, 511, 512, 513, 4096 + 1};
  uint64_t rounded[] = {512, 512, 512, 512, 1024, 4608};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    ca_live_block b;
    uint64_t addr = must_alloc(fx, sizes[i]);
    assert_true(ca_pool_lookup(fx->pool, addr, &b));
    assert_int_equal(b.size, rounded[i]);
    assert_int_equal(b.requested, sizes[i]);
    assert_int_equal(addr % 512, 0);
  }
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.requested_bytes.current, 0 + 1 + 511 + 512 + 513 + 4097);
  assert_int_equal(s.allocated_bytes.current, 512 * 4 + 1024 + 4608);
  fixture_free(fx);
}

/* Small requests share 2 MiB segments; medium ones share 20 MiB segments;
 * large ones get a segment of their own rounded to 2 MiB. */
static void sizes_segments_like_pytorch(void **state) {
  (void)state;
  fixture *fx = fixture_new(4096 * MiB, default_options(), false);
  for (int i = 0; i < 4096; i++)
    must_alloc(fx, 512); /* 4096 x 512 B fill one 2 MiB segment exactly */
  assert_int_equal(fx->fake.reserves, 1);
  must_alloc(fx, 1 * MiB);
  assert_int_equal(fx->fake.reserves, 2);
  assert_int_equal(fx->fake.segments[1].size, 2 * MiB);
  must_alloc(fx, 1 * MiB + 1);
  assert_int_equal(fx->fake.segments[2].size, 20 * MiB);
  must_alloc(fx, 25 * MiB);
  assert_int_equal(fx->fake.segments[3].size, 26 * MiB);
  must_alloc(fx, 30 * MiB);
  assert_int_equal(fx->fake.segments[4].size, 30 * MiB);
  /* No coarser rounding: no unused tail (it was 52 MiB). */
  must_alloc(fx, 49 * MiB);
  assert_int_equal(fx->fake.segments[5].size, 50 * MiB);
  assert_int_equal(stats_of(fx).segments.current, 6);
  fixture_free(fx);
}

/* With a segment head (leak_scan), no block starts where a segment does:
 * small and medium segments keep their sizes and their density (1 MiB
 * requests move to the medium heap, since two no longer fill a small
 * segment), a segment for one large request grows to hold the head, and a
 * fully free segment serves its whole size but the head again. */
static void segment_heads_keep_blocks_off_segment_bases(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.segment_head = 512;
  fixture *fx = fixture_new(4096 * MiB, opt, false);
  uint64_t sizes[] = {1 * MiB - 512, 1 * MiB - 512, 1 * MiB, 24 * MiB, 25 * MiB, 512};
  uint64_t seg_sizes[] = {2 * MiB, 20 * MiB, 26 * MiB, 26 * MiB};
  uint64_t a[6];
  for (int i = 0; i < 6; i++)
    a[i] = must_alloc(fx, sizes[i]);
  assert_int_equal(fx->fake.reserves, 4);
  for (int i = 0; i < 4; i++)
    assert_int_equal(fx->fake.segments[i].size, seg_sizes[i]);
  uint64_t seg0 = fx->fake.segments[0].addr;
  assert_int_equal(a[0], seg0 + 512);
  assert_int_equal(a[1], seg0 + 1 * MiB);
  assert_int_equal(a[5], seg0 + 2 * MiB - 512); /* the small segment is full */
  for (int i = 2; i < 5; i++)
    assert_int_equal(a[i], fx->fake.segments[i - 1].addr + 512);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 74 * MiB);
  assert_consistent(fx);
  for (int i = 0; i < 6; i++)
    assert_true(ca_pool_free(fx->pool, a[i], NULL));
  assert_consistent(fx);
  int reserves = fx->fake.reserves;
  must_alloc(fx, 26 * MiB - 512);
  assert_int_equal(fx->fake.reserves, reserves);
  fixture_free(fx);
}

/* Where only the head does not fit (the device, or the memory limit, holds
 * exactly the request), the segment goes without one: the request is
 * served as cudaMalloc would serve it, its block at the segment's base. */
static void segment_head_never_costs_a_request(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.segment_head = 512;
  fixture *fx = fixture_new(24 * MiB, opt, false);
  ca_pool_span span;
  uint64_t a = must_alloc(fx, 24 * MiB);
  assert_true(ca_pool_find(fx->pool, a, &span));
  assert_int_equal(a, span.segment);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_consistent(fx);
  fixture_free(fx);

  static ca_budget budget;
  opt = limited_options(&budget, 24 * MiB);
  opt.segment_head = 512;
  fx = fixture_new(4096 * MiB, opt, false);
  a = must_alloc(fx, 24 * MiB);
  assert_true(ca_pool_find(fx->pool, a, &span));
  assert_int_equal(a, span.segment);
  assert_int_equal(atomic_load(&budget.booked), 24 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  fixture_free(fx);
}

/* A freed block is served again without the backend. */
static void serves_repeat_requests_from_the_cache(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t sizes[] = {256, 64 * KiB, 3 * MiB, 64 * MiB};
  for (size_t i = 0; i < 4; i++) {
    uint64_t a = must_alloc(fx, sizes[i]);
    assert_true(ca_pool_free(fx->pool, a, NULL));
    int reserves = fx->fake.reserves;
    for (int k = 0; k < 100; k++) {
      uint64_t b = must_alloc(fx, sizes[i]);
      assert_int_equal(b, a);
      assert_true(ca_pool_free(fx->pool, b, NULL));
    }
    assert_int_equal(fx->fake.reserves, reserves);
  }
  cudalloc_device_stats s = stats_of(fx);
  /* 64 KiB came from the segment the 256 B request opened; the 64 MiB
   * miss merged the free 20 MiB segment of the 3 MiB request into its
   * own. */
  assert_int_equal(s.cache_hits, 401);
  assert_int_equal(s.backend_allocs, 3);
  assert_int_equal(s.backend_frees, 1);
  assert_int_equal(s.allocs, 404);
  assert_int_equal(s.frees, 404);
  fixture_free(fx);
}

/* A same-sized request between class boundaries still finds the block it
 * freed, rather than growing: repeated workloads must not leak segments. */
static void reuses_exact_sizes_between_class_boundaries(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t odd = 4 * MiB + 100 * KiB; /* not on a class boundary */
  uint64_t a[4];
  for (int i = 0; i < 4; i++)
    a[i] = must_alloc(fx, odd); /* four blocks from one 20 MiB segment */
  assert_int_equal(fx->fake.reserves, 1);
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  assert_int_equal(must_alloc(fx, odd), a[1]);
  assert_int_equal(fx->fake.reserves, 1);
  fixture_free(fx);
}

/* Reading the statistics moves no block: parked blocks are counted as
 * the free block they would merge into, and stay parked, so the next
 * request of their size takes the one freed last, as it would have. */
static void statistics_leave_parked_blocks_where_they_are(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 512 * KiB);
  uint64_t b = must_alloc(fx, 512 * KiB);
  uint64_t c = must_alloc(fx, 512 * KiB);
  uint64_t d = must_alloc(fx, 512 * KiB); /* the segment is full */
  assert_int_equal(fx->fake.reserves, 1);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL)); /* parked last: taken first */
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.largest_free_block, 1 * MiB); /* a and b, merged */
  assert_int_equal(s.free_cached_bytes, 1 * MiB);
  assert_true(s.fragmentation == 0.0);
  assert_int_equal(must_alloc(fx, 512 * KiB), b);
  assert_int_equal(must_alloc(fx, 512 * KiB), a);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_true(ca_pool_free(fx->pool, c, NULL));
  assert_true(ca_pool_free(fx->pool, d, NULL));
  assert_int_equal(stats_of(fx).largest_free_block, 2 * MiB);
  assert_consistent(fx);
  fixture_free(fx);
}

/* Freed blocks merge with free neighbours; a fully free segment is one
 * block again. */
static void splits_and_merges_within_a_segment(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 512 * KiB);
  uint64_t b = must_alloc(fx, 512 * KiB);
  uint64_t c = must_alloc(fx, 512 * KiB);
  assert_int_equal(fx->fake.reserves, 1);
  assert_int_equal(b, a + 512 * KiB);
  assert_int_equal(c, b + 512 * KiB);
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_int_equal(stats_of(fx).largest_free_block, 512 * KiB);
  assert_true(ca_pool_free(fx->pool, a, NULL)); /* merges with b */
  assert_int_equal(stats_of(fx).largest_free_block, 1 * MiB);
  assert_consistent(fx);
  assert_true(ca_pool_free(fx->pool, c, NULL)); /* merges both sides */
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.largest_free_block, 2 * MiB);
  assert_int_equal(s.free_cached_bytes, 2 * MiB);
  assert_true(s.fragmentation == 0.0);
  /* The whole segment can serve one 1 MiB request at its start. */
  assert_int_equal(must_alloc(fx, 1 * MiB), a);
  fixture_free(fx);
}

/* In the large pool a block splits only when more than 1 MiB would remain. */
static void large_blocks_split_only_for_a_worthwhile_rest(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 2 * MiB); /* from a new 20 MiB segment */
  assert_true(ca_pool_free(fx->pool, a, NULL));
  ca_live_block info;
  uint64_t b = must_alloc(fx, 19 * MiB + 512 * KiB); /* 512 KiB would remain */
  assert_true(ca_pool_lookup(fx->pool, b, &info));
  assert_int_equal(info.size, 20 * MiB);
  assert_true(ca_pool_free(fx->pool, b, NULL));
  uint64_t c = must_alloc(fx, 18 * MiB); /* 2 MiB remain: split */
  assert_true(ca_pool_lookup(fx->pool, c, &info));
  assert_int_equal(info.size, 18 * MiB);
  assert_int_equal(must_alloc(fx, 2 * MiB), c + 18 * MiB);
  assert_int_equal(fx->fake.reserves, 1);
  fixture_free(fx);
}

/* max_split_size: cached blocks that large are never split and serve only
 * requests at or above it, wasting under 20 MiB. */
static void honours_max_split_size(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.max_split_size = 40 * MiB;
  fixture *fx = fixture_new(4096 * MiB, opt, false);
  uint64_t big = must_alloc(fx, 50 * MiB);
  assert_true(ca_pool_free(fx->pool, big, NULL));
  /* A request below max_split_size does not take the oversize block. */
  uint64_t small = must_alloc(fx, 30 * MiB);
  assert_true(small != big);
  assert_int_equal(fx->fake.reserves, 2);
  /* A request above it takes the block whole when the waste is < 20 MiB. */
  ca_live_block info;
  uint64_t again = must_alloc(fx, 45 * MiB);
  assert_int_equal(again, big);
  assert_true(ca_pool_lookup(fx->pool, again, &info));
  assert_int_equal(info.size, 50 * MiB);
  assert_true(ca_pool_free(fx->pool, again, NULL));
  /* Not when it would waste 20 MiB or more. */
  uint64_t huge = must_alloc(fx, 100 * MiB);
  assert_true(ca_pool_free(fx->pool, huge, NULL));
  int reserves = fx->fake.reserves;
  assert_true(must_alloc(fx, 60 * MiB) != huge);
  assert_int_equal(fx->fake.reserves, reserves + 1);
  assert_int_equal(must_alloc(fx, 85 * MiB), huge);
  assert_int_equal(fx->fake.reserves, reserves + 1);
  fixture_free(fx);
}

/* Large blocks merge with their free neighbours as they are freed, so the
 * exact fit two of them form is found before a larger block is split. */
static void large_blocks_merge_at_once(void **state) {
  (void)state;
  fixture *fx = fixture_new(4096 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 4 * MiB), b = must_alloc(fx, 4 * MiB);
  must_alloc(fx, 12 * MiB); /* fills the first 20 MiB segment */
  must_alloc(fx, 6 * MiB);  /* a second one, 14 MiB of it free */
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_int_equal(must_alloc(fx, 8 * MiB), a);
  assert_int_equal(fx->fake.reserves, 2);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A pool over host memory that memcheck's fill reaches (fill_fresh, a red
 * zone), as the registry makes one under memcheck:1. */
static fixture *bytes_fixture(void) {
  fixture *fx = calloc(1, sizeof(*fx));
  assert_non_null(fx);
  ca_fake_init(&fx->fake, 256 * MiB, false, true);
  ca_fake_enable_bytes(&fx->fake);
  ca_pool_options opt = default_options();
  opt.red_zone = 512;
  opt.fill_fresh = true;
  opt.fresh_byte = 0xFF;
  fx->pool = ca_pool_create(&fx->fake.backend, 0, &opt);
  assert_non_null(fx->pool);
  return fx;
}

static bool holds(uint64_t addr, uint64_t n, unsigned char byte) {
  for (uint64_t i = 0; i < n; i++)
    if (((const unsigned char *)(uintptr_t)addr)[i] != byte)
      return false;
  return true;
}

/* Bytes a freed block left stale (memcheck set only its ends back) are
 * remembered through the free, the merge with the rest of the segment and
 * a split: a red zone handed out on them is set to the fill (and says so
 * when it cannot be), one off them costs nothing. */
static void red_zones_on_stale_bytes_are_set_as_handed_out(void **state) {
  (void)state;
  fixture *fx = bytes_fixture();
  uint64_t a = must_alloc(fx, 4 * MiB);
  memset((void *)(uintptr_t)a, 0x42, 4 * MiB); /* the program's bytes */
  assert_true(ca_pool_stale(fx->pool, a, a + 4608, a + 4 * MiB - 4608));
  assert_false(ca_pool_stale(fx->pool, a + 512, a, a + 1));
  assert_true(ca_pool_free(fx->pool, a, NULL));
  int fills = fx->fake.fills;
  /* The same size again: its red zone lies past the stale bytes. */
  assert_int_equal(must_alloc(fx, 4 * MiB), a);
  assert_int_equal(fx->fake.fills, fills);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  /* A smaller block: its red zone lands on them and is set. */
  assert_int_equal(must_alloc(fx, 2 * MiB), a);
  assert_int_equal(fx->fake.fills, fills + 1);
  assert_true(holds(a + 2 * MiB, 512, 0xFF));
  assert_true(holds(a + 2 * MiB + 512, 512, 0x42)); /* the rest left alone */
  ca_live_block b;
  assert_true(ca_pool_lookup(fx->pool, a, &b));
  assert_false(b.red_zone_unset);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  /* A fill refused (a capture): the block says its red zone is unset,
   * until it is handed out again with one set. */
  memset((void *)(uintptr_t)(a + 3 * MiB), 0x42, 512);
  fx->fake.refuse_fills = true;
  assert_int_equal(must_alloc(fx, 3 * MiB), a);
  assert_true(ca_pool_lookup(fx->pool, a, &b));
  assert_true(b.red_zone_unset);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  fx->fake.refuse_fills = false;
  assert_int_equal(must_alloc(fx, 3 * MiB), a);
  assert_true(ca_pool_lookup(fx->pool, a, &b));
  assert_false(b.red_zone_unset);
  assert_true(holds(a + 3 * MiB, 512, 0xFF));
  assert_true(ca_pool_free(fx->pool, a, NULL));
  fixture_free(fx);
}

/* A block keeps four stale ranges; a fifth joins the two closest, taking
 * in the bytes between them: five freed neighbours, each with its middle
 * stale, merge into one block whose red zone costs a fill in the gap
 * joined and none in a gap kept. */
static void the_two_closest_stale_ranges_join_past_four(void **state) {
  (void)state;
  fixture *fx = bytes_fixture();
  const uint64_t size = 2 * MiB, span = 2 * MiB + 512; /* a block, red zone in */
  const uint64_t tail_gap[5] = {8192, 8192, 1024, 8192, 8192};
  uint64_t b[5];
  for (int i = 0; i < 5; i++) {
    b[i] = must_alloc(fx, size);
    assert_int_equal(b[i], b[0] + (uint64_t)i * span);
  }
  /* Ranges [b + 4608, b + span - tail_gap): the gaps between them are
   * 4608 + tail_gap, the least between the third and the fourth. */
  for (int i = 0; i < 5; i++)
    assert_true(ca_pool_stale(fx->pool, b[i], b[i] + 4608, b[i] + span - tail_gap[i]));
  for (int i = 0; i < 5; i++)
    assert_true(ca_pool_free(fx->pool, b[i], NULL));
  int fills = fx->fake.fills;
  /* A red zone in the gap kept, between the first two ranges. */
  assert_int_equal(must_alloc(fx, span - 512), b[0]);
  assert_int_equal(fx->fake.fills, fills);
  assert_true(ca_pool_free(fx->pool, b[0], NULL));
  /* A red zone in the gap joined, between the third and the fourth. */
  assert_int_equal(must_alloc(fx, 3 * span - 512), b[0]);
  assert_int_equal(fx->fake.fills, fills + 1);
  assert_true(ca_pool_free(fx->pool, b[0], NULL));
  fixture_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rounds_requests_to_the_granule),
      cmocka_unit_test(sizes_segments_like_pytorch),
      cmocka_unit_test(segment_heads_keep_blocks_off_segment_bases),
      cmocka_unit_test(segment_head_never_costs_a_request),
      cmocka_unit_test(serves_repeat_requests_from_the_cache),
      cmocka_unit_test(reuses_exact_sizes_between_class_boundaries),
      cmocka_unit_test(statistics_leave_parked_blocks_where_they_are),
      cmocka_unit_test(splits_and_merges_within_a_segment),
      cmocka_unit_test(large_blocks_split_only_for_a_worthwhile_rest),
      cmocka_unit_test(honours_max_split_size),
      cmocka_unit_test(large_blocks_merge_at_once),
      cmocka_unit_test(red_zones_on_stale_bytes_are_set_as_handed_out),
      cmocka_unit_test(the_two_closest_stale_ranges_join_past_four),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
