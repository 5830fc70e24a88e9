/*
 * Stream-ordered reuse (src/pool/stream_free.c): a block freed on a stream
 * is free at once among that stream's blocks, split and merged as any, and
 * serves other streams only after a marker recorded on its stream alone
 * has passed (or a fence a plain request made); the stream path never
 * fences.
 */
#include "pool_fixture.h"

#define S1 0x5101u
#define S2 0x5202u

/* A pool whose device is busy until the test moves the fake's clock, with
 * fences installed: the stream path must never use them. */
static fixture *streams_fixture(void) {
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  fx->fake.backend.fence = ca_fake_fence;
  return fx;
}

static uint64_t alloc_on(fixture *fx, uint64_t size, uint64_t stream) {
  uint64_t addr = 0;
  assert_int_equal(ca_pool_alloc_on(fx->pool, size, 0, stream, &addr), 0);
  assert_true(ca_fake_owns(&fx->fake, 0, addr, size));
  return addr;
}

/* The stream's own order protects the block: no marker, no fence, no
 * wait, and the same block; free at once, not pending. */
static void reuses_on_the_same_stream_at_once(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t sizes[] = {4 * KiB, 1 * MiB, 16 * MiB};
  for (int i = 0; i < 3; i++) {
    uint64_t a = alloc_on(fx, sizes[i], S1);
    assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
    assert_int_equal(stats_of(fx).pending_free_bytes, 0);
    assert_int_equal(alloc_on(fx, sizes[i], S1), a);
  }
  assert_int_equal(fx->fake.marks, 0);
  assert_int_equal(fx->fake.fences, 0);
  assert_int_equal(fx->fake.waits, 0);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A stream's freed blocks merge at once with each other and with the rest
 * of their segment, and split for its next requests, whatever their
 * sizes: two 6 MiB blocks freed on S1 serve its 12 MiB request in the same
 * segment, and what is left serves S1's small requests too. */
static void splits_and_merges_on_its_stream(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 6 * MiB, S1), b = alloc_on(fx, 6 * MiB, S1);
  uint64_t c = alloc_on(fx, 6 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_true(ca_pool_free_on(fx->pool, b, S1, NULL));
  assert_consistent(fx);
  uint64_t d = alloc_on(fx, 12 * MiB, S1);
  assert_int_equal(d, a);
  assert_int_equal(fx->fake.reserves, 1);
  assert_true(ca_pool_free_on(fx->pool, d, S1, NULL));
  assert_true(ca_pool_free_on(fx->pool, c, S1, NULL));
  assert_int_equal(stats_of(fx).largest_free_block,
                   stats_of(fx).reserved_bytes.current);
  assert_int_equal(fx->fake.marks, 0);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A shared block between two of a stream's free blocks keeps them apart
 * until the stream frees next to it: then the stream's block takes in the
 * shared one and the stream's block behind it, all three one block. */
static void takes_in_a_shared_block_and_what_lies_behind_it(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.reuse = CA_REUSE_IMMEDIATE;
  fixture *fx = fixture_new(1024 * MiB, opt, true);
  uint64_t a = alloc_on(fx, 4 * MiB, S1), b = alloc_on(fx, 4 * MiB, S1);
  uint64_t c = alloc_on(fx, 4 * MiB, S1), d = alloc_on(fx, 4 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, c, S1, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL)); /* shared, beside c */
  assert_consistent(fx);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_consistent(fx);
  assert_int_equal(alloc_on(fx, 12 * MiB, S1), a);
  assert_int_equal(fx->fake.reserves, 1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_true(ca_pool_free_on(fx->pool, d, S1, NULL));
  assert_consistent(fx);
  fixture_free(fx);
}

/* Another stream gets the block only once a marker recorded on the
 * freeing stream has passed: a request that finds nothing else shares
 * that stream's blocks under such a marker and, as any miss does before
 * the pool grows, waits for it; one that finds other memory takes that. */
static void another_stream_waits_for_a_marker_on_the_first(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 1 * MiB, S1);
  uint64_t spare = alloc_on(fx, 1 * MiB, S2);
  assert_true(ca_pool_free_on(fx->pool, spare, S2, NULL));
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  /* S2 has a block of its own: it takes that, not S1's. */
  assert_int_equal(alloc_on(fx, 1 * MiB, S2), spare);
  assert_int_equal(fx->fake.marks_on, 0);
  /* Nothing else: S1's blocks are shared under a marker on S1, waited for. */
  uint64_t b = alloc_on(fx, 1 * MiB, S2);
  assert_int_equal(b, a);
  assert_int_equal(fx->fake.marks_on, 1);
  assert_int_equal(fx->fake.last_mark_stream, S1);
  assert_true(fx->fake.passed >= (uint64_t)fx->fake.marks);
  assert_int_equal(fx->fake.fences, 0);
  assert_int_equal(fx->fake.reserves, 1);
  assert_true(ca_pool_free_on(fx->pool, b, S2, NULL));
  assert_true(ca_pool_free_on(fx->pool, spare, S2, NULL));
  assert_consistent(fx);
  fixture_free(fx);
}

/* A miss waits for another stream's work only where that could serve it:
 * S1's freed 12 MiB block, shared under a marker on S1, makes 14 MiB with
 * the free rest of its segment, so a 32 MiB request on S2 grows the pool
 * at once instead of stopping the host for S1's work; a 12 MiB request
 * then waits for the block rather than grow. */
static void a_miss_waits_only_for_what_could_serve_it(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 12 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  uint64_t big = alloc_on(fx, 32 * MiB, S2);
  assert_int_equal(fx->fake.waits, 0);
  assert_int_equal(fx->fake.reserves, 2);
  assert_int_equal(alloc_on(fx, 12 * MiB, S2), a);
  assert_int_equal(fx->fake.waits, 1);
  assert_int_equal(fx->fake.reserves, 2);
  assert_true(ca_pool_free_on(fx->pool, a, S2, NULL));
  assert_true(ca_pool_free_on(fx->pool, big, S2, NULL));
  assert_consistent(fx);
  fixture_free(fx);
}

/* While the freeing stream may take no marker (it is capturing), its
 * blocks stay its own: another stream never gets them. */
static void a_stream_without_markers_keeps_its_blocks(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 64 * KiB, S1);
  uint64_t keep = alloc_on(fx, 1 * MiB, S1); /* the segment stays in use */
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  fx->fake.refuse_sync = true;
  assert_true(alloc_on(fx, 64 * KiB, S2) != a);
  assert_int_equal(alloc_on(fx, 64 * KiB, S1), a);
  fx->fake.refuse_sync = false;
  assert_true(ca_pool_free_on(fx->pool, keep, S1, NULL));
  assert_consistent(fx);
  fixture_free(fx);
}

/* More streams than the arena keeps indexes for: the stream that freed
 * longest ago is shared for the newcomer, and every block comes back
 * once the device has passed the markers. */
static void more_streams_than_indexes(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a[20];
  for (int i = 0; i < 20; i++)
    a[i] = alloc_on(fx, 256 * KiB, 0x9000u + (uint64_t)i);
  for (int i = 0; i < 20; i++)
    assert_true(ca_pool_free_on(fx->pool, a[i], 0x9000u + (uint64_t)i, NULL));
  assert_true(fx->fake.marks_on >= 4);
  assert_consistent(fx);
  fx->fake.passed = (uint64_t)fx->fake.marks;
  assert_true(ca_pool_empty_cache(fx->pool) > 0);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 0);
  fixture_free(fx);
}

/* A block freed on a stream and never asked for again goes back with the
 * cache: its segment is fully free, and giving it back waits for the
 * device as cuMemFree does. */
static void empty_cache_takes_stream_blocks_too(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 8 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_int_equal(ca_pool_empty_cache(fx->pool), 20 * MiB);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 0);
  fixture_free(fx);
}

/* A stream about to be destroyed: its blocks are shared under a marker
 * recorded on it now, and serve another stream once it passes; a later
 * stream with the same handle finds none of them its own. */
static void a_stream_that_ends_shares_its_blocks(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 8 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  ca_pool_stream_ended(fx->pool, S1);
  assert_int_equal(fx->fake.marks_on, 1);
  assert_int_equal(fx->fake.last_mark_stream, S1);
  assert_int_equal(stats_of(fx).pending_free_bytes, 20 * MiB);
  assert_int_equal(alloc_on(fx, 8 * MiB, S2), a);
  assert_int_equal(fx->fake.reserves, 1);
  assert_int_equal(fx->fake.fences, 0);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A stream that ends while it may take no marker (capturing): its blocks
 * wait among the ordinary pending frees, for a marker over every stream,
 * and no later stream given its handle finds them its own. */
static void a_stream_that_ends_without_a_marker_holds_its_blocks(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 8 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  fx->fake.refuse_sync = true;
  ca_pool_stream_ended(fx->pool, S1);
  fx->fake.refuse_sync = false;
  assert_int_equal(fx->fake.marks_on, 0);
  assert_int_equal(stats_of(fx).pending_free_bytes, 20 * MiB);
  assert_true(alloc_on(fx, 8 * MiB, S1) != a || fx->fake.marks > 0);
  assert_consistent(fx);
  fixture_free(fx);
}

/* A fence (a plain request's miss) orders every stream's work: the
 * streams' blocks are shared at once, with no marker of theirs. */
static void a_fence_shares_every_stream(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 8 * MiB, S1);
  uint64_t b = must_alloc(fx, 8 * MiB);
  uint64_t big = alloc_on(fx, 3 * MiB, S1); /* the rest of a's segment */
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_int_equal(must_alloc(fx, 8 * MiB), a);
  assert_int_equal(fx->fake.marks_on, 0);
  assert_true(fx->fake.fences >= 1);
  assert_true(ca_pool_free_on(fx->pool, big, S1, NULL));
  assert_consistent(fx);
  fixture_free(fx);
}

/* Expandable segments: pages mapped for a request take in the free block
 * before them only when the request may use it (its stream's, or shared),
 * never another stream's. */
static void mapped_pages_join_only_usable_blocks(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.expandable = true;
  fixture *fx = fixture_new(1024 * MiB, opt, true);
  ca_fake_enable_ranges(&fx->fake);
  fx->fake.auto_pass = false;
  fx->fake.backend.fence = ca_fake_fence;
  uint64_t a = alloc_on(fx, 6 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  fx->fake.refuse_sync = true; /* S1 may take no marker: its block is its own */
  uint64_t b = alloc_on(fx, 8 * MiB, S2);
  assert_true(b >= a + 6 * MiB);
  fx->fake.refuse_sync = false;
  assert_true(ca_pool_free_on(fx->pool, b, S2, NULL));
  assert_consistent(fx);
  fixture_free(fx);
}

/* Frees through the plain path and the stream path mix in one pool; a
 * context reset forgets the streams' blocks with the segments. */
static void mixes_with_plain_frees_and_survives_a_reset(void **state) {
  (void)state;
  fixture *fx = streams_fixture();
  uint64_t a = alloc_on(fx, 1 * MiB, S1);
  uint64_t b = must_alloc(fx, 1 * MiB);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_consistent(fx);
  ca_pool_drop_all(fx->pool);
  assert_consistent(fx);
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  uint64_t c = alloc_on(fx, 1 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, c, S1, NULL));
  ca_pool_destroy(fx->pool);
  ca_fake_fini(&fx->fake);
  free(fx);
}

/* A backend without markers could never share a stream's blocks: the
 * stream path then frees as the plain one does, and the cache still goes
 * back. */
static void without_markers_no_stream_holds_a_block(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.reuse = CA_REUSE_IMMEDIATE;
  fixture *fx = fixture_new(1024 * MiB, opt, false);
  uint64_t a = alloc_on(fx, 8 * MiB, S1);
  assert_true(ca_pool_free_on(fx->pool, a, S1, NULL));
  assert_int_equal(stats_of(fx).pending_free_bytes, 0);
  assert_int_equal(ca_pool_empty_cache(fx->pool), 20 * MiB);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 0);
  fixture_free(fx);
}

/* A random walk of requests and frees on five streams and the plain path,
 * with the device catching up now and then, streams that capture for a
 * while or end, and the cache given back: the pool's invariants hold after
 * every step, and every live block lies in memory the fake handed out. */
static uint64_t walk_random(uint64_t *rng) {
  *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
  return *rng >> 33;
}

static void random_walk(bool expandable, bool fences) {
  ca_pool_options opt = default_options();
  opt.reuse = CA_REUSE_SAFE;
  opt.expandable = expandable;
  opt.max_split_size = expandable ? UINT64_MAX : 64 * MiB;
  opt.segment_head = CA_GRANULE;
  fixture *fx = calloc(1, sizeof(*fx));
  assert_non_null(fx);
  ca_fake_init(&fx->fake, 1024 * MiB, true, false);
  if (expandable)
    ca_fake_enable_ranges(&fx->fake);
  fx->fake.auto_pass = false;
  if (fences)
    fx->fake.backend.fence = ca_fake_fence;
  fx->pool = ca_pool_create(&fx->fake.backend, 0, &opt);
  assert_non_null(fx->pool);
  struct {
    uint64_t addr, size, stream;
  } live[64] = {{0}};
  uint64_t rng = expandable ? 42 : 7;
  for (int step = 0; step < 20000; step++) {
    int i = (int)(walk_random(&rng) % 64);
    unsigned what = (unsigned)(walk_random(&rng) % 100);
    if (what < 2) {
      fx->fake.passed = (uint64_t)fx->fake.marks;
    } else if (what < 3) {
      fx->fake.refuse_sync = !fx->fake.refuse_sync;
    } else if (what < 4) {
      ca_pool_stream_ended(fx->pool, 0x7000u + walk_random(&rng) % 5);
    } else if (what < 5 && !fx->fake.refuse_sync) {
      fx->fake.passed = (uint64_t)fx->fake.marks;
      ca_pool_empty_cache(fx->pool);
    } else if (live[i].addr) {
      bool ok = live[i].stream
                    ? ca_pool_free_on(fx->pool, live[i].addr, live[i].stream,
                                      NULL)
                    : ca_pool_free(fx->pool, live[i].addr, NULL);
      assert_true(ok);
      live[i].addr = 0;
    } else {
      uint64_t size = 256ull << (walk_random(&rng) % 18) |
                      (walk_random(&rng) % 4096);
      unsigned pick = (unsigned)(walk_random(&rng) % 6);
      uint64_t stream = pick ? 0x7000u + pick - 1 : 0;
      uint64_t addr = 0;
      int rc = stream ? ca_pool_alloc_on(fx->pool, size, 0, stream, &addr)
                      : ca_pool_alloc(fx->pool, size, 0, &addr);
      if (rc == 0) {
        assert_true(ca_fake_owns(&fx->fake, 0, addr, size));
        live[i].addr = addr;
        live[i].size = size;
        live[i].stream = stream;
      }
    }
    char why[256] = "";
    if (!ca_pool_check(fx->pool, why, sizeof(why)))
      fail_msg("step %d: pool inconsistent: %s", step, why);
  }
  fx->fake.refuse_sync = false;
  for (int i = 0; i < 64; i++)
    if (live[i].addr)
      assert_true(live[i].stream ? ca_pool_free_on(fx->pool, live[i].addr,
                                                   live[i].stream, NULL)
                                 : ca_pool_free(fx->pool, live[i].addr, NULL));
  fx->fake.passed = (uint64_t)fx->fake.marks;
  ca_pool_empty_cache(fx->pool);
  assert_int_equal(stats_of(fx).reserved_bytes.current, 0);
  fixture_free(fx);
}

static void a_random_walk_keeps_the_pool_consistent(void **state) {
  (void)state;
  for (int expandable = 0; expandable < 2; expandable++) {
    random_walk(expandable, true);
    random_walk(expandable, false); /* streams shared by markers alone */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reuses_on_the_same_stream_at_once),
      cmocka_unit_test(splits_and_merges_on_its_stream),
      cmocka_unit_test(takes_in_a_shared_block_and_what_lies_behind_it),
      cmocka_unit_test(another_stream_waits_for_a_marker_on_the_first),
      cmocka_unit_test(a_miss_waits_only_for_what_could_serve_it),
      cmocka_unit_test(a_stream_without_markers_keeps_its_blocks),
      cmocka_unit_test(more_streams_than_indexes),
      cmocka_unit_test(empty_cache_takes_stream_blocks_too),
      cmocka_unit_test(a_stream_that_ends_shares_its_blocks),
      cmocka_unit_test(a_stream_that_ends_without_a_marker_holds_its_blocks),
      cmocka_unit_test(a_fence_shares_every_stream),
      cmocka_unit_test(mapped_pages_join_only_usable_blocks),
      cmocka_unit_test(mixes_with_plain_frees_and_survives_a_reset),
      cmocka_unit_test(without_markers_no_stream_holds_a_block),
      cmocka_unit_test(a_random_walk_keeps_the_pool_consistent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
