/*
 * The pool, driven through the fake backend: what a program sees of it
 * (addresses, errors) and what the statistics say.
 */
#include "pool_fixture.h"
#include "stats.h"

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

/* A freed block is served again without the backend. */
static void serves_repeat_requests_from_the_cache(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t sizes[] = {256, 64 * KiB, 3 * MiB, 64 * MiB};
  for (size_t i = 0; i < 4; i++) {
    uint64_t a = must_alloc(fx, sizes[i]);
    assert_true(ca_pool_free(fx->pool, a));
    int reserves = fx->fake.reserves;
    for (int k = 0; k < 100; k++) {
      uint64_t b = must_alloc(fx, sizes[i]);
      assert_int_equal(b, a);
      assert_true(ca_pool_free(fx->pool, b));
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
  assert_true(ca_pool_free(fx->pool, a[1]));
  assert_int_equal(must_alloc(fx, odd), a[1]);
  assert_int_equal(fx->fake.reserves, 1);
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
  assert_true(ca_pool_free(fx->pool, b));
  assert_int_equal(stats_of(fx).largest_free_block, 512 * KiB);
  assert_true(ca_pool_free(fx->pool, a)); /* merges with b */
  assert_int_equal(stats_of(fx).largest_free_block, 1 * MiB);
  assert_consistent(fx);
  assert_true(ca_pool_free(fx->pool, c)); /* merges both sides */
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
  assert_true(ca_pool_free(fx->pool, a));
  ca_live_block info;
  uint64_t b = must_alloc(fx, 19 * MiB + 512 * KiB); /* 512 KiB would remain */
  assert_true(ca_pool_lookup(fx->pool, b, &info));
  assert_int_equal(info.size, 20 * MiB);
  assert_true(ca_pool_free(fx->pool, b));
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
  assert_true(ca_pool_free(fx->pool, big));
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
  assert_true(ca_pool_free(fx->pool, again));
  /* Not when it would waste 20 MiB or more. */
  uint64_t huge = must_alloc(fx, 100 * MiB);
  assert_true(ca_pool_free(fx->pool, huge));
  int reserves = fx->fake.reserves;
  assert_true(must_alloc(fx, 60 * MiB) != huge);
  assert_int_equal(fx->fake.reserves, reserves + 1);
  assert_int_equal(must_alloc(fx, 85 * MiB), huge);
  assert_int_equal(fx->fake.reserves, reserves + 1);
  fixture_free(fx);
}

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
    assert_true(ca_pool_free(fx->pool, a[order[i]]));
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
  ca_pool_options opt = default_options();
  static ca_budget budget;
  budget = (ca_budget){.limit = 200 * MiB};
  opt.gc_threshold = 0.5;
  opt.budget = &budget;
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 80 * MiB);
  assert_true(ca_pool_free(fx->pool, a));
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
  budget = (ca_budget){.limit = 100 * MiB};
  ca_pool_options opt = default_options();
  opt.budget = &budget;
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t big = must_alloc(fx, 90 * MiB);
  assert_true(ca_pool_free(fx->pool, big));
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
  budget = (ca_budget){.limit = 100 * MiB};
  ca_pool_options opt = default_options();
  opt.budget = &budget;
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 30 * MiB), addr = 0;
  assert_true(ca_pool_free(fx->pool, a));
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
  budget = (ca_budget){.limit = 64 * MiB};
  ca_pool_options opt = default_options();
  opt.budget = &budget;
  fixture *a = fixture_new(1000 * MiB, opt, false);
  fixture *b = fixture_new(1000 * MiB, opt, false);
  uint64_t in_a = must_alloc(a, 40 * MiB), addr = 0;
  assert_int_equal(ca_pool_alloc(b->pool, 40 * MiB, 0, &addr), CA_FAKE_OOM);
  must_alloc(b, 20 * MiB);
  assert_true(ca_pool_free(a->pool, in_a)); /* cached by a: still booked */
  assert_int_equal(ca_pool_alloc(b->pool, 40 * MiB, 0, &addr), CA_FAKE_OOM);
  assert_int_equal(ca_pool_empty_cache(a->pool), 40 * MiB);
  must_alloc(b, 40 * MiB);
  assert_int_equal(ca_budget_booked(&budget), 60 * MiB);
  assert_true(stats_of(a).reserved_bytes.peak + stats_of(b).reserved_bytes.peak
              > 64 * MiB); /* over time, not at once */
  fixture_free(a);
  fixture_free(b);
  assert_int_equal(ca_budget_booked(&budget), 0);
}

/* When the backend runs out, every cached segment is given back and the
 * request is retried once; other errors pass through unchanged. */
static void retries_once_after_out_of_memory(void **state) {
  (void)state;
  fixture *fx = fixture_new(21 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 19 * MiB);
  assert_true(ca_pool_free(fx->pool, a));
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
  assert_true(ca_pool_free(fx->pool, drop1));
  assert_true(ca_pool_free(fx->pool, drop2));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 64 * MiB + 20 * MiB);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.reserved_bytes.current, 2 * MiB);
  assert_int_equal(s.blocks.current, 1);
  assert_true(ca_pool_lookup(fx->pool, keep, NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 0);
  fixture_free(fx);
}

/* Every statistic as current/peak/total, and fragmentation. */
static void keeps_statistics(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a[4];
  for (int i = 0; i < 4; i++)
    a[i] = must_alloc(fx, 512 * KiB - 100);
  assert_true(ca_pool_free(fx->pool, a[0]));
  assert_true(ca_pool_free(fx->pool, a[2]));
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

/* Frees of pointers the pool did not hand out change nothing. */
static void refuses_pointers_it_does_not_own(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 4 * KiB);
  assert_false(ca_pool_free(fx->pool, 0));
  assert_false(ca_pool_free(fx->pool, a + 512)); /* interior pointer */
  assert_false(ca_pool_free(fx->pool, 0x1234));
  assert_true(ca_pool_free(fx->pool, a));
  assert_false(ca_pool_free(fx->pool, a)); /* double free */
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
  assert_true(info.time_ns > 0);
  uint64_t seen[3] = {0};
  assert_int_equal(ca_pool_foreach_live(fx->pool, count_live, seen), 3);
  assert_int_equal(seen[0], 100);
  assert_int_equal(seen[1], 200);
  assert_int_equal(seen[2], 300);
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
  assert_false(ca_pool_free(other, a));
  assert_false(ca_pool_free(fx->pool, b));
  cudalloc_device_stats s;
  ca_pool_get_stats(other, &s);
  assert_int_equal(s.device, 1);
  assert_int_equal(s.blocks.current, 1);
  assert_int_equal(stats_of(fx).blocks.current, 1);
  assert_true(ca_pool_free(other, b));
  ca_pool_destroy(other);
  fixture_free(fx);
}

/* A pool with the fake's markers (reuse_policy safe), whose device is
 * busy until the test says otherwise. */
static fixture *safe_fixture(uint64_t capacity, ca_pool_options opt) {
  opt.reuse = CA_REUSE_SAFE;
  fixture *fx = fixture_new(capacity, opt, true);
  fx->fake.auto_pass = false;
  return fx;
}

/* Four 512 KiB blocks fill one small segment. */
static void fill_small_segment(fixture *fx, uint64_t a[4]) {
  for (int i = 0; i < 4; i++)
    a[i] = must_alloc(fx, 512 * KiB);
}

/* Large blocks merge with their free neighbours as they are freed, so the
 * exact fit two of them form is found before a larger block is split. */
static void large_blocks_merge_at_once(void **state) {
  (void)state;
  fixture *fx = fixture_new(4096 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 4 * MiB), b = must_alloc(fx, 4 * MiB);
  must_alloc(fx, 12 * MiB); /* fills the first 20 MiB segment */
  must_alloc(fx, 6 * MiB);  /* a second one, 14 MiB of it free */
  assert_true(ca_pool_free(fx->pool, a));
  assert_true(ca_pool_free(fx->pool, b));
  assert_int_equal(must_alloc(fx, 8 * MiB), a);
  assert_int_equal(fx->fake.reserves, 2);
  assert_consistent(fx);
  fixture_free(fx);
}

/* Two free 40 MiB segments, and a small one the program keeps using. */
static void free_two_large_segments(fixture *fx, uint64_t *a, uint64_t *b,
                                    int small_frees) {
  *a = must_alloc(fx, 40 * MiB);
  *b = must_alloc(fx, 40 * MiB);
  assert_true(ca_pool_free(fx->pool, *a));
  assert_true(ca_pool_free(fx->pool, *b));
  for (int i = 0; i < small_frees; i++)
    assert_true(ca_pool_free(fx->pool, must_alloc(fx, 4 * KiB)));
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
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 30 * MiB)));
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
  assert_true(ca_pool_free(fx->pool, a));
  assert_true(ca_pool_free(fx->pool, b));
  assert_true(ca_pool_free(fx->pool, c));
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

/* Safe reuse: a freed block comes back only once a marker made after its
 * free has passed. A free costs no driver call; the next miss marks the
 * pending frees and, the device being past them, takes them back at once. */
static void safe_reuses_after_marker_passes(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[1]));
  assert_true(ca_pool_free(fx->pool, a[3]));
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

/* However many frees came before, one miss makes one marker for all. */
static void one_marker_per_batch(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.auto_pass = true;
  uint64_t a[64];
  for (int i = 0; i < 64; i++)
    a[i] = must_alloc(fx, 64 * KiB + (uint64_t)i * 512);
  for (int i = 0; i < 64; i++)
    assert_true(ca_pool_free(fx->pool, a[i]));
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
  assert_true(ca_pool_free(fx->pool, a[0]));
  assert_true(ca_pool_free(fx->pool, a[1]));
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
  assert_true(ca_pool_free(fx->pool, big));
  assert_true(ca_pool_free(fx->pool, a[0]));
  assert_int_equal(fx->fake.fences, 0); /* a free costs no driver call */
  assert_int_equal(must_alloc(fx, 16 * MiB), big);
  assert_int_equal(fx->fake.fences, 1);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_true(ca_pool_free(fx->pool, a[1]));
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
  assert_true(ca_pool_free(fx->pool, big));
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, p[i]));
  /* A miss fences: every block is cached, and the p blocks, exact fits,
   * come back (in some order). */
  for (int i = 0; i < 4; i++)
    assert_true(is_one_of(must_alloc(fx, 10 * MiB), p, 4));
  assert_int_equal(fx->fake.fences, 1);
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, p[i]));
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
  assert_true(ca_pool_free(fx->pool, a[0]));
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
  assert_true(ca_pool_free(fx->pool, a[0]));
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
  budget = (ca_budget){.limit = 2 * MiB};
  ca_pool_options opt = default_options();
  opt.budget = &budget;
  fixture *fx = safe_fixture(1024 * MiB, opt);
  uint64_t a[4];
  fill_small_segment(fx, a);
  for (int i = 0; i < 4; i++)
    assert_true(ca_pool_free(fx->pool, a[i]));
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
    assert_true(ca_pool_free(fx->pool, a[i]));
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
  assert_true(ca_pool_free(fx->pool, a));
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
  assert_true(ca_pool_free(fx->pool, a));
  assert_int_equal(fx->fake.syncs, 1);
  assert_int_equal(must_alloc(fx, 1 * MiB), a);
  fx->fake.refuse_sync = true;
  assert_true(ca_pool_free(fx->pool, b));
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
  assert_true(ca_pool_free(fx->pool, a));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 64 * MiB);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.forgets, 1);
  assert_int_equal(fx->fake.nsegments, 0);
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
  assert_false(ca_pool_free(fx->pool, a));
  assert_consistent(fx);
  fx->fake.nsegments = 0; /* the "driver" freed them */
  must_alloc(fx, 4 * KiB);
  assert_int_equal(fx->fake.reserves, 3);
  fixture_free(fx);
}

/* A context reset forgets pending frees too, and every marker with them. */
static void drop_all_forgets_pending_markers(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4], b[4];
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[0]));
  fill_small_segment(fx, b); /* marks a[0]'s batch, grows */
  assert_true(ca_pool_free(fx->pool, b[0])); /* a new open batch */
  ca_pool_drop_all(fx->pool);
  assert_int_equal(fx->fake.forgets, fx->fake.marks);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_consistent(fx);
  fx->fake.nsegments = 0; /* the "driver" freed them */
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
      assert_true(ca_pool_free(fx->pool, slot[i]));
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
  assert_true(ca_pool_free(fx->pool, a));
  assert_true(ca_pool_free(fx->pool, b));
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
    assert_true(ca_pool_free(fx->pool, must_alloc(fx, 4 * KiB << (i % 8))));
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
  assert_true(ca_pool_free(fx->pool, a));
  assert_false(ca_pool_free(fx->pool, a)); /* no arena holds it now */
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
  assert_true(ca_pool_free(fx->pool, a[0]));
  assert_true(ca_pool_free(fx->pool, a[2]));
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
  budget = (ca_budget){.limit = 100 * MiB};
  ca_pool_options opt = default_options();
  opt.budget = &budget;
  fixture *fx = fixture_new(1000 * MiB, opt, false);
  uint64_t a = must_alloc(fx, 60 * MiB), addr = 0;
  ca_pool_set_thread_arena(1);
  assert_int_equal(ca_pool_alloc(fx->pool, 60 * MiB, 0, &addr), CA_FAKE_OOM);
  assert_true(stats_of(fx).reserved_bytes.peak <= 100 * MiB);
  ca_pool_set_thread_arena(0);
  assert_true(ca_pool_free(fx->pool, a)); /* cached in arena 0 */
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
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 400 * MiB)));
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
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 40 * MiB)));
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
  assert_true(ca_pool_free(fx->pool, must_alloc(fx, 40 * MiB)));
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
  assert_true(ca_pool_free(fx->pool, a[2]));
  ca_pool_set_thread_arena(1);
  assert_int_equal(must_alloc(fx, 512 * KiB), a[2]);
  cudalloc_device_stats s = stats_of(fx);
  assert_int_equal(s.failed_allocs, 0);
  assert_int_equal(s.cache_hits, 3 + 1); /* the fill's splits, then a[2] */
  assert_int_equal(s.segments.current, 1);
  assert_true(ca_pool_free(fx->pool, a[2]));
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
    assert_true(ca_pool_free(fx->pool, a[i]));
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
  assert_false(ca_pool_free(fx->pool, b));
  assert_false(ca_pool_free(fx->pool, c));
  assert_false(ca_pool_holds_segment(fx->pool, c));
  assert_consistent(fx);
  fx->fake.nsegments = 0; /* the "driver" freed them */
  fixture_free(fx);
}

/* Adding up pools sums every counter of stats.h's lists and keeps the
 * largest free block: a field added to the lists is summed with no other
 * edit. */
static void statistics_add_every_field(void **state) {
  (void)state;
  cudalloc_device_stats s = {.device = 1}, sum = {.device = 1};
  uint64_t v = 7;
#define SET_TRIPLE(field, row, bytes)                                          \
  s.field = (cudalloc_stat){v, v + 1, v + 2};                                  \
  v += 10;
#define SET(field)                                                             \
  s.field = v;                                                                 \
  v += 10;
  CA_STATS_TRIPLES(SET_TRIPLE)
  CA_STATS_COUNTERS(SET)
  CA_STATS_LARGEST(SET)
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(rounds_requests_to_the_granule),
      cmocka_unit_test(sizes_segments_like_pytorch),
      cmocka_unit_test(serves_repeat_requests_from_the_cache),
      cmocka_unit_test(reuses_exact_sizes_between_class_boundaries),
      cmocka_unit_test(splits_and_merges_within_a_segment),
      cmocka_unit_test(large_blocks_split_only_for_a_worthwhile_rest),
      cmocka_unit_test(honours_max_split_size),
      cmocka_unit_test(garbage_collects_oldest_segments_first),
      cmocka_unit_test(garbage_collection_budget_is_the_limit_when_set),
      cmocka_unit_test(enforces_the_memory_limit),
      cmocka_unit_test(limit_counts_memory_outside_the_pool),
      cmocka_unit_test(pools_of_one_device_share_its_limit),
      cmocka_unit_test(retries_once_after_out_of_memory),
      cmocka_unit_test(retries_with_the_smallest_segment),
      cmocka_unit_test(empty_cache_gives_back_free_segments_only),
      cmocka_unit_test(keeps_statistics),
      cmocka_unit_test(statistics_add_every_field),
      cmocka_unit_test(refuses_pointers_it_does_not_own),
      cmocka_unit_test(lists_live_blocks),
      cmocka_unit_test(keeps_devices_apart),
      cmocka_unit_test(large_blocks_merge_at_once),
      cmocka_unit_test(trades_idle_segments_before_growing),
      cmocka_unit_test(merges_free_segments_at_a_miss),
      cmocka_unit_test(merges_below_max_split_size),
      cmocka_unit_test(safe_reuses_after_marker_passes),
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
      cmocka_unit_test(drop_all_forgets_without_releasing),
      cmocka_unit_test(drop_all_forgets_pending_markers),
      cmocka_unit_test(knows_its_segment_bases),
      cmocka_unit_test(survives_random_operations),
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
