/*
 * Expandable segments (expandable_segments:1, src/pool/expandable.c): the
 * large heap maps pages into reserved ranges where blocks need them and
 * gives free pages back from anywhere inside, blocks never moving.
 */
#include <string.h>

#include "pool_fixture.h"

static int warnings;
static void count_warning(const char *line) {
  (void)line;
  warnings++;
}

static ca_pool_options expandable_options(void) {
  ca_pool_options opt = default_options();
  opt.expandable = true;
  opt.reuse = CA_REUSE_IMMEDIATE;
  opt.warn = count_warning;
  return opt;
}

/* A pool over a host-backed fake with ranges: blocks can be written. */
static fixture *ranges_fixture(uint64_t capacity, ca_pool_options opt) {
  fixture *fx = calloc(1, sizeof(*fx));
  assert_non_null(fx);
  ca_fake_init(&fx->fake, capacity, true, true);
  ca_fake_enable_ranges(&fx->fake);
  fx->pool = ca_pool_create(&fx->fake.backend, 0, &opt);
  assert_non_null(fx->pool);
  warnings = 0;
  return fx;
}

/* Reserved memory is the pages mapped (and plain segments), exactly. */
static void assert_reserved_is_mapped(fixture *fx) {
  assert_consistent(fx);
  assert_int_equal(stats_of(fx).reserved_bytes.current,
                   fx->fake.used[0]);
}

static void ranges_free(fixture *fx) {
  assert_reserved_is_mapped(fx);
  assert_int_equal(fx->fake.bad_maps, 0);
  ca_pool_destroy(fx->pool);
  assert_int_equal(fx->fake.nranges, 0); /* every range given back */
  assert_int_equal(fx->fake.mapped_now, 0);
  assert_int_equal(fx->fake.nsegments, 0);
  assert_int_equal(fx->fake.bad_releases, 0);
  assert_int_equal(fx->fake.bad_maps, 0);
  ca_fake_fini(&fx->fake);
  free(fx);
}

static void fill(uint64_t addr, uint64_t size, int byte) {
  memset((void *)(uintptr_t)addr, byte, size);
}

static void assert_filled(uint64_t addr, uint64_t size, int byte) {
  const unsigned char *m = (const unsigned char *)(uintptr_t)addr;
  for (uint64_t i = 0; i < size; i += 4093)
    assert_int_equal(m[i], byte);
  assert_int_equal(m[size - 1], byte);
}

/* A large request maps only the pages it needs, next to the segment's
 * first page, which it takes in: no segment rounding, no spare tail. */
static void maps_the_pages_a_request_needs(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  uint64_t a = must_alloc(fx, 10 * MiB);
  assert_int_equal(fx->fake.va_reserves, 1);
  assert_int_equal(fx->fake.maps, 2); /* the first page, then 8 MiB */
  assert_int_equal(stats_of(fx).reserved_bytes.current, 10 * MiB);
  uint64_t b = must_alloc(fx, 5 * MiB + 4 * KiB);
  assert_int_equal(b, a + 10 * MiB); /* right after, in the same range */
  assert_int_equal(stats_of(fx).reserved_bytes.current, 16 * MiB);
  fill(a, 10 * MiB, 1);
  fill(b, 5 * MiB + 4 * KiB, 2);
  /* The leak report cannot class a block starting where a page does (the
   * driver keeps every page's start), and its scan must know the page. */
  uint64_t c = must_alloc(fx, 5 * MiB / 2); /* at a page; 1.5 MiB left */
  uint64_t d = must_alloc(fx, 6 * MiB / 5);  /* right after c: no page */
  assert_int_equal(d, c + 5 * MiB / 2);
  ca_live_block lb;
  assert_true(ca_pool_lookup(fx->pool, c, &lb));
  assert_true(lb.at_base);
  assert_int_equal(lb.page, 2 * MiB);
  assert_true(ca_pool_lookup(fx->pool, d, &lb));
  assert_false(lb.at_base);
  assert_int_equal(lb.page, 2 * MiB);
  assert_reserved_is_mapped(fx);
  ranges_free(fx);
}

/* Under leak_scan:1 (heads of 512 B) a 1 MiB request is a large one; the
 * rest of its page serves the next one instead of staying in the block:
 * 100 such requests took 200 MiB on the H200 before. */
static void packs_two_1_mib_blocks_in_a_page(void **state) {
  (void)state;
  ca_pool_options opt = expandable_options();
  opt.segment_head = 512;
  fixture *fx = ranges_fixture(1024 * MiB, opt);
  for (int i = 0; i < 10; i++)
    must_alloc(fx, 1 * MiB);
  assert_true(stats_of(fx).reserved_bytes.current <= 12 * MiB);
  ranges_free(fx);
}

/* The fragmentation a plain segment cannot undo: a long-lived block keeps
 * its neighbours' free pages mapped. Here they go back, and the blocks
 * around them stay where they were, their bytes intact. */
static void gives_back_free_pages_between_live_blocks(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  uint64_t a = must_alloc(fx, 10 * MiB);
  uint64_t b = must_alloc(fx, 40 * MiB);
  uint64_t c = must_alloc(fx, 10 * MiB);
  fill(a, 10 * MiB, 0xa);
  fill(c, 10 * MiB, 0xc);
  assert_true(ca_pool_free(fx->pool, b, NULL));
  /* What cuMemGetInfo counts as free beside the driver's. */
  assert_int_equal(ca_pool_releasable(fx->pool), 40 * MiB);
  assert_int_equal(ca_pool_empty_cache(fx->pool), 40 * MiB);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 20 * MiB);
  assert_int_equal(fx->fake.syncs, 1); /* once, before unmapping */
  assert_filled(a, 10 * MiB, 0xa);
  assert_filled(c, 10 * MiB, 0xc);
  assert_reserved_is_mapped(fx);
  /* The hole is mapped again for the next request that fits it best. */
  uint64_t d = must_alloc(fx, 30 * MiB);
  assert_int_equal(d, b);
  assert_int_equal(fx->fake.va_reserves, 1);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 50 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, c, NULL));
  assert_true(ca_pool_free(fx->pool, d, NULL));
  assert_int_equal(ca_pool_releasable(fx->pool), 50 * MiB);
  /* All free: the range goes back whole. */
  assert_int_equal(ca_pool_empty_cache(fx->pool), 50 * MiB);
  assert_int_equal(fx->fake.nranges, 0);
  assert_int_equal(stats_of(fx).segments.current, 0);
  ranges_free(fx);
}

/* Under a memory limit, a program whose live bytes fit is served even
 * when its free bytes lie in pieces: the pages go back before the new
 * ones are mapped. Plain segments fail the same sequence. */
static void serves_what_fits_the_limit_despite_fragments(void **state) {
  (void)state;
  static ca_budget budget, plain_budget;
  ca_pool_options opt = expandable_options();
  opt.budget = &budget;
  budget = (ca_budget){.limit = 64 * MiB};
  fixture *fx = ranges_fixture(1024 * MiB, opt);
  uint64_t x = must_alloc(fx, 30 * MiB);
  must_alloc(fx, 4 * MiB); /* long-lived, right after x */
  assert_true(ca_pool_free(fx->pool, x, NULL));
  must_alloc(fx, 50 * MiB); /* 54 MiB live, within 64 */
  assert_true(stats_of(fx).reserved_bytes.peak <= 64 * MiB);
  ranges_free(fx);

  ca_pool_options plain = limited_options(&plain_budget, 64 * MiB);
  plain.reuse = CA_REUSE_IMMEDIATE;
  fixture *px = fixture_new(1024 * MiB, plain, true);
  x = must_alloc(px, 30 * MiB);
  must_alloc(px, 4 * MiB);
  assert_true(ca_pool_free(px->pool, x, NULL));
  uint64_t z = 0;
  assert_int_equal(ca_pool_alloc(px->pool, 50 * MiB, 0, &z), CA_FAKE_OOM);
  fixture_free(px);
}

/* Ages the pool's free blocks by `frees` frees of small blocks. */
static void age(fixture *fx, int frees) {
  for (int i = 0; i < frees; i++)
    assert_true(ca_pool_free(fx->pool, must_alloc(fx, 4 * KiB), NULL));
}

/* Sets up the miss the trading rules weigh: a 320 MiB block and a 4 MiB
 * one live, the 8 MiB between them free (*hole). */
static fixture *peak_fixture(uint64_t *hole) {
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  must_alloc(fx, 320 * MiB);
  *hole = must_alloc(fx, 8 * MiB);
  must_alloc(fx, 4 * MiB);
  assert_true(ca_pool_free(fx->pool, *hole, NULL));
  return fx;
}

/* At the peak, a miss trades free pages idle for a while for the ones it
 * maps: reserved memory grows by what the program holds more, not by the
 * free bytes between its blocks. */
static void trades_idle_free_pages_at_the_peak(void **state) {
  (void)state;
  uint64_t hole;
  fixture *fx = peak_fixture(&hole);
  age(fx, 4000);
  uint64_t before = stats_of(fx).reserved_bytes.current;
  must_alloc(fx, 10 * MiB); /* the hole is too small */
  assert_true(fx->fake.unmaps > 0);
  assert_int_equal(stats_of(fx).reserved_bytes.current, before + 2 * MiB);
  ranges_free(fx);
}

/* Freed just now, the hole's pages are kept: a steady loop would map and
 * unmap them every step. A request small beside the pool maps new pages. */
static void keeps_fresh_free_pages_for_a_small_request(void **state) {
  (void)state;
  uint64_t hole;
  fixture *fx = peak_fixture(&hole);
  uint64_t before = stats_of(fx).reserved_bytes.current;
  must_alloc(fx, 10 * MiB);
  assert_int_equal(fx->fake.unmaps, 0);
  assert_int_equal(stats_of(fx).reserved_bytes.current, before + 10 * MiB);
  ranges_free(fx);
}

/* What is left of a fresh hole after a request took part of it is as
 * fresh as the hole: still kept, however old the pool. */
static void a_split_keeps_its_free_age(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  must_alloc(fx, 320 * MiB);
  uint64_t hole = must_alloc(fx, 8 * MiB);
  must_alloc(fx, 4 * MiB);
  age(fx, 4000);
  assert_true(ca_pool_free(fx->pool, hole, NULL)); /* fresh */
  assert_int_equal(must_alloc(fx, 3 * MiB), hole); /* split: 5 MiB left */
  must_alloc(fx, 10 * MiB);
  assert_int_equal(fx->fake.unmaps, 0);
  ranges_free(fx);
}

/* A request of a thirty-second of the pool or more trades even fresh free
 * pages: such requests are what scatter free memory most. */
static void trades_fresh_pages_for_a_large_request(void **state) {
  (void)state;
  uint64_t hole;
  fixture *fx = peak_fixture(&hole);
  uint64_t before = stats_of(fx).reserved_bytes.current;
  must_alloc(fx, 12 * MiB); /* 12 MiB >= 334 MiB / 32 */
  assert_true(fx->fake.unmaps > 0);
  assert_int_equal(stats_of(fx).reserved_bytes.current, before + 4 * MiB);
  ranges_free(fx);
}

/* The device running out is met the same way: free pages go back and the
 * map is tried again. */
static void recovers_from_out_of_memory_by_unmapping(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(64 * MiB, expandable_options());
  uint64_t x = must_alloc(fx, 30 * MiB);
  must_alloc(fx, 4 * MiB);
  assert_true(ca_pool_free(fx->pool, x, NULL));
  must_alloc(fx, 50 * MiB);
  assert_int_equal(stats_of(fx).oom_retries, 1);
  ranges_free(fx);
}

/* The collection threshold gives back free pages, not only free
 * segments, before the pool grows past it. */
static void garbage_collection_unmaps_free_pages(void **state) {
  (void)state;
  ca_pool_options opt = expandable_options();
  opt.gc_threshold = 0.5;
  fixture *fx = ranges_fixture(200 * MiB, opt); /* budget: 100 MiB */
  uint64_t a = must_alloc(fx, 60 * MiB);
  must_alloc(fx, 4 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  must_alloc(fx, 70 * MiB);
  assert_true(fx->fake.peak_used[0] <= 100 * MiB);
  assert_true(stats_of(fx).reserved_bytes.current <= 100 * MiB);
  ranges_free(fx);
}

/* While mapping may not happen (a stream capture), a plain segment serves
 * the request; ranges serve the next one again. */
static void uses_a_plain_segment_while_mapping_is_refused(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  fx->fake.busy_maps = true;
  uint64_t a = must_alloc(fx, 10 * MiB);
  assert_int_equal(fx->fake.reserves, 1);
  assert_int_equal(fx->fake.nranges, 0);
  fx->fake.busy_maps = false;
  must_alloc(fx, 10 * MiB);
  assert_int_equal(fx->fake.nranges, 1);
  assert_int_equal(warnings, 0);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  ranges_free(fx);
}

/* A backend that cannot reserve ranges at all turns them off, saying so
 * once; the program is served from plain segments as before. */
static void falls_back_to_plain_segments_saying_so_once(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  fx->fake.fail_maps = 2; /* the device-sized range, then the least one */
  fx->fake.fail_code = 801; /* CUDA_ERROR_NOT_SUPPORTED */
  must_alloc(fx, 10 * MiB);
  must_alloc(fx, 30 * MiB);
  assert_int_equal(fx->fake.va_reserves, 2);
  assert_int_equal(fx->fake.reserves, 2);
  assert_int_equal(warnings, 1);
  ranges_free(fx);
}

/* The driver bounds the addresses a process may reserve (four times the
 * device's memory was refused on the H200): a range as large as the device
 * refused, one just large enough for the request serves it. */
static void reserves_a_smaller_range_when_refused(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  fx->fake.fail_maps = 1;
  fx->fake.fail_code = 1; /* CUDA_ERROR_INVALID_VALUE */
  must_alloc(fx, 10 * MiB);
  assert_int_equal(fx->fake.va_reserves, 2);
  assert_int_equal(fx->fake.nranges, 1);
  assert_int_equal(fx->fake.ranges[0].size, 12 * MiB);
  assert_int_equal(fx->fake.reserves, 0);
  assert_int_equal(warnings, 0);
  must_alloc(fx, 30 * MiB); /* another range, as large as the device */
  assert_int_equal(fx->fake.nranges, 2);
  ranges_free(fx);
}

/* Said once per pool, not once per arena: an arena made after the
 * refusal does not try ranges again. */
static void a_refusal_holds_for_every_arena(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  fx->fake.fail_maps = 2;
  fx->fake.fail_code = 801; /* CUDA_ERROR_NOT_SUPPORTED */
  ca_pool_set_thread_arena(0);
  must_alloc(fx, 10 * MiB);
  ca_pool_set_thread_arena(1);
  fx->fake.fail_maps = 2;
  must_alloc(fx, 10 * MiB);
  ca_pool_set_thread_arena(0);
  assert_int_equal(warnings, 1);
  assert_int_equal(fx->fake.va_reserves, 2);
  ranges_free(fx);
}

/* No unmapping while the device may not be waited for (a capture): the
 * pages stay, nothing breaks. */
static void keeps_pages_while_the_device_may_not_be_waited_for(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  uint64_t a = must_alloc(fx, 10 * MiB);
  must_alloc(fx, 4 * MiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  fx->fake.refuse_sync = true;
  assert_int_equal(ca_pool_empty_cache(fx->pool), 0);
  assert_int_equal(fx->fake.unmaps, 0);
  fx->fake.refuse_sync = false;
  assert_int_equal(ca_pool_empty_cache(fx->pool), 8 * MiB);
  ranges_free(fx);
}

/* A context reset forgets the ranges: the driver freed them. */
static void a_reset_forgets_every_range(void **state) {
  (void)state;
  fixture *fx = ranges_fixture(1024 * MiB, expandable_options());
  must_alloc(fx, 10 * MiB);
  ca_pool_drop_all(fx->pool);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 0);
  assert_consistent(fx);
  must_alloc(fx, 10 * MiB); /* a new range */
  assert_int_equal(fx->fake.va_reserves, 2);
  ca_pool_destroy(fx->pool);
  assert_int_equal(fx->fake.nranges, 1); /* the dropped one: the driver's */
  ca_fake_fini(&fx->fake);
  free(fx);
}

/* Random allocations, frees and collections: after each, the pool is
 * consistent, reserved bytes are the pages mapped, and every live block
 * still holds what was written into it. */
static void random_work_keeps_every_block_intact(void **state) {
  (void)state;
  static ca_budget budget;
  ca_pool_options opt = expandable_options();
  opt.budget = &budget;
  budget = (ca_budget){.limit = 768 * MiB};
  opt.gc_threshold = 0.6;
  fixture *fx = ranges_fixture(1024 * MiB, opt);
  enum { SLOTS = 24 };
  uint64_t addr[SLOTS] = {0}, size[SLOTS] = {0};
  unsigned seed = 12345;
  for (int op = 0; op < 3000; op++) {
    seed = seed * 1103515245u + 12345u;
    int i = (int)((seed >> 8) % SLOTS);
    if (addr[i]) {
      assert_filled(addr[i], size[i], i + 1);
      assert_true(ca_pool_free(fx->pool, addr[i], NULL));
      addr[i] = 0;
    } else {
      size[i] = (1 + (seed >> 16) % 4000) * 16 * KiB; /* 16 KiB..62 MiB */
      if (ca_pool_alloc(fx->pool, size[i], 0, &addr[i]) != 0) {
        addr[i] = 0;
        continue;
      }
      fill(addr[i], size[i], i + 1);
    }
    if (op % 97 == 0)
      ca_pool_empty_cache(fx->pool);
    if (op % 10 == 0)
      assert_reserved_is_mapped(fx);
  }
  for (int i = 0; i < SLOTS; i++)
    if (addr[i]) {
      assert_filled(addr[i], size[i], i + 1);
      assert_true(ca_pool_free(fx->pool, addr[i], NULL));
    }
  /* The run mapped and unmapped pages many times over, in one range. */
  assert_true(fx->fake.unmaps > 100 && fx->fake.maps > 100);
  assert_int_equal(fx->fake.va_reserves, fx->fake.va_releases + fx->fake.nranges);
  ranges_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(maps_the_pages_a_request_needs),
      cmocka_unit_test(packs_two_1_mib_blocks_in_a_page),
      cmocka_unit_test(gives_back_free_pages_between_live_blocks),
      cmocka_unit_test(serves_what_fits_the_limit_despite_fragments),
      cmocka_unit_test(trades_idle_free_pages_at_the_peak),
      cmocka_unit_test(keeps_fresh_free_pages_for_a_small_request),
      cmocka_unit_test(trades_fresh_pages_for_a_large_request),
      cmocka_unit_test(a_split_keeps_its_free_age),
      cmocka_unit_test(recovers_from_out_of_memory_by_unmapping),
      cmocka_unit_test(garbage_collection_unmaps_free_pages),
      cmocka_unit_test(uses_a_plain_segment_while_mapping_is_refused),
      cmocka_unit_test(falls_back_to_plain_segments_saying_so_once),
      cmocka_unit_test(reserves_a_smaller_range_when_refused),
      cmocka_unit_test(a_refusal_holds_for_every_arena),
      cmocka_unit_test(keeps_pages_while_the_device_may_not_be_waited_for),
      cmocka_unit_test(a_reset_forgets_every_range),
      cmocka_unit_test(random_work_keeps_every_block_intact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
