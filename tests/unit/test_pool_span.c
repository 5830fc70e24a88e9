/*
 * Where an address lies in the pool, and blocks whose bytes must never come
 * back: what the library needs to answer the driver's pointer queries about
 * a pooled block as the driver would about an allocation of its own, to
 * export a block through CUDA IPC, and to say how much free memory a
 * request can really get.
 */
#include <stdio.h>
#include <string.h>

#include "pool_fixture.h"

static int warnings;
static char last_warning[512];

static void record_warning(const char *line) {
  warnings++;
  snprintf(last_warning, sizeof(last_warning), "%s", line);
}

static ca_pool_options warning_options(ca_reuse reuse) {
  ca_pool_options o = default_options();
  o.reuse = reuse;
  o.warn = record_warning;
  return o;
}

static ca_pool_span span_of(fixture *fx, uint64_t addr) {
  ca_pool_span sp;
  assert_true(ca_pool_find(fx->pool, addr, &sp));
  return sp;
}

static void assert_in_block(fixture *fx, uint64_t addr, uint64_t block,
                            uint64_t requested) {
  ca_pool_span sp = span_of(fx, addr);
  assert_true(sp.live);
  assert_int_equal(sp.block.addr, block);
  assert_int_equal(sp.block.requested, requested);
  assert_true(sp.segment <= block &&
              block + requested <= sp.segment + sp.segment_size);
}

static void assert_in_no_block(fixture *fx, uint64_t addr) {
  assert_false(span_of(fx, addr).live);
}

/* A pointer anywhere in a block's requested bytes names the block; past
 * them (the rounded tail), in free bytes, or in a freed block, none does,
 * as the driver answers for an allocation of 1000 bytes; an address no
 * segment holds is not the pool's at all. */
static void finds_the_block_holding_an_address(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 1000), b = must_alloc(fx, 64 * KiB);
  uint64_t c = must_alloc(fx, 3 * MiB);
  assert_in_block(fx, a, a, 1000);
  assert_in_block(fx, a + 999, a, 1000);
  assert_in_block(fx, b + 4096, b, 64 * KiB);
  assert_in_block(fx, c + 2 * MiB, c, 3 * MiB);
  assert_in_no_block(fx, a + 1000);
  assert_in_no_block(fx, a + 1023);
  assert_in_no_block(fx, c + 3 * MiB);
  ca_pool_span sa = span_of(fx, a), sb = span_of(fx, b), sc = span_of(fx, c);
  assert_int_equal(sa.segment, sb.segment); /* small blocks share 2 MiB */
  assert_int_equal(sa.segment_size, 2 * MiB);
  assert_int_equal(sc.segment_size, 20 * MiB);
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_in_no_block(fx, b);
  assert_in_no_block(fx, b + 100);
  ca_pool_span outside;
  assert_false(ca_pool_find(fx->pool, sa.segment + sa.segment_size, &outside));
  assert_false(ca_pool_find(fx->pool, 0x1000, &outside));
  fixture_free(fx);
}

/* What the process-wide address index says of addr, asked without naming a
 * pool: the block holding it when live (its start, 0 otherwise). */
static ca_pool_where locate(uint64_t addr, ca_pool **pool, uint64_t *block) {
  ca_pool_span sp;
  ca_pool_where w = ca_pool_locate(addr, pool, &sp);
  *block = w == CA_POOL_FOUND && sp.live ? sp.block.addr : 0;
  return w;
}

/* The index finds the live block holding any address in constant time:
 * thousands of small blocks in one 2 MiB chunk (the nearest live start
 * below the address), and a block spanning many chunks (the chunk's
 * covering block), up to its last requested byte and not past it; freed
 * blocks and their bytes are in none. */
static void locates_blocks_in_every_chunk(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  enum { N = 3000 };
  static uint64_t small[N];
  for (int i = 0; i < N; i++)
    small[i] = must_alloc(fx, 600);
  uint64_t big = must_alloc(fx, 50 * MiB + 100);
  ca_pool *pool = NULL;
  uint64_t block = 0;
  for (int i = 0; i < N; i += 7) {
    assert_int_equal(locate(small[i] + 599, &pool, &block), CA_POOL_FOUND);
    assert_ptr_equal(pool, fx->pool);
    assert_int_equal(block, small[i]);
    locate(small[i] + 600, &pool, &block);
    assert_int_equal(block, 0); /* the rounded tail: no live bytes */
  }
  for (uint64_t off = 0; off < 50 * MiB; off += 2 * MiB + 4096) {
    assert_int_equal(locate(big + off, &pool, &block), CA_POOL_FOUND);
    assert_int_equal(block, big);
  }
  locate(big + 50 * MiB + 99, &pool, &block);
  assert_int_equal(block, big);
  locate(big + 50 * MiB + 100, &pool, &block);
  assert_int_equal(block, 0);
  for (int i = 0; i < N; i += 2)
    assert_true(ca_pool_free(fx->pool, small[i], NULL));
  assert_true(ca_pool_free(fx->pool, big, NULL));
  for (int i = 0; i < N; i++) {
    locate(small[i] + 300, &pool, &block);
    assert_int_equal(block, i % 2 ? small[i] : 0);
  }
  locate(big + 30 * MiB, &pool, &block);
  assert_int_equal(block, 0);
  assert_int_equal(locate(0x1000, &pool, &block), CA_POOL_NOWHERE);
  fixture_free(fx);
  assert_int_equal(locate(small[1], &pool, &block), CA_POOL_NOWHERE);
}

static void count_live(const ca_live_block *b, void *arg) {
  (void)b;
  (*(size_t *)arg)++;
}

/* The bytes of [start, end) that the range checks' look-up gives addr. */
static void bounds_of(uint64_t addr, uint64_t *start, uint64_t *end) {
  *start = *end = 1;
  assert_int_equal(ca_pool_bounds(addr, start, end), CA_POOL_FOUND);
}

/* addr lies in the live block of `requested` bytes at `block`, to the
 * pointer queries and to the range checks alike. */
static void assert_live_at(fixture *fx, uint64_t addr, uint64_t block,
                           uint64_t requested) {
  uint64_t start, end;
  assert_in_block(fx, addr, block, requested);
  bounds_of(addr, &start, &end);
  assert_int_equal(start, block);
  assert_int_equal(end, block + requested);
}

/* Under immediate reuse a freed small block parks in its quick list still
 * in the live table and the address index (entry.c's ca__park), so that
 * the next request of its size takes it back with neither changed. Parked,
 * it answers as freed to every look-up: no live block starts or lies
 * there, a second free is refused, a walk of the live blocks skips it;
 * handed out again, it answers as live. Merged with a parked neighbour, it
 * leaves both: the merged block, handed out, is found from every byte,
 * the parked block's old start included. */
static void a_parked_block_answers_as_freed(void **state) {
  (void)state;
  ca_pool_options opt = default_options();
  opt.reuse = CA_REUSE_IMMEDIATE;
  fixture *fx = fixture_new(1024 * MiB, opt, false);
  uint64_t x = must_alloc(fx, 4096), a = must_alloc(fx, 4096);
  uint64_t y = must_alloc(fx, 4096), start, end;
  assert_int_equal(a, x + 4096);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_consistent(fx);
  assert_false(ca_pool_lookup(fx->pool, a, NULL));
  assert_false(ca_pool_free(fx->pool, a, NULL));
  assert_in_no_block(fx, a);
  assert_in_no_block(fx, a + 10);
  bounds_of(a + 10, &start, &end);
  assert_int_equal(end - start, 0);
  size_t live = 0;
  assert_int_equal(ca_pool_foreach_live(fx->pool, count_live, &live), 2);
  assert_int_equal(live, 2);
  assert_int_equal(stats_of(fx).allocated_bytes.current, 8192);

  assert_int_equal(must_alloc(fx, 4096), a); /* the parked block, again */
  assert_consistent(fx);
  assert_true(ca_pool_lookup(fx->pool, a, NULL));
  assert_live_at(fx, a + 10, a, 4096);

  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, x, NULL));
  /* Merges the parked blocks (y keeps the segment from going back). */
  ca_pool_empty_cache(fx->pool);
  assert_consistent(fx);
  assert_in_no_block(fx, a + 10);
  uint64_t z = must_alloc(fx, 8192);
  assert_consistent(fx);
  assert_int_equal(z, x);
  assert_live_at(fx, a + 10, z, 8192);
  assert_true(ca_pool_free(fx->pool, z, NULL));
  assert_true(ca_pool_free(fx->pool, y, NULL));
  fixture_free(fx);
}

/* Under safe reuse a freed small block waits for the device listed too,
 * asking for no bytes: until it comes back it answers as freed to every
 * look-up; taken again, as live. One whose segment is lost meanwhile
 * leaves the live table and the address index at once: the driver may
 * hand its address out again, to a block of a new segment. */
static void a_pending_block_answers_as_freed(void **state) {
  (void)state;
  fixture *fx = safe_fixture(1024 * MiB, default_options());
  uint64_t a[4], start, end;
  fill_small_segment(fx, a);
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  assert_consistent(fx);
  assert_int_equal(stats_of(fx).pending_free_bytes, 512 * KiB);
  assert_false(ca_pool_lookup(fx->pool, a[1], NULL));
  assert_false(ca_pool_free(fx->pool, a[1], NULL));
  assert_in_no_block(fx, a[1] + 10);
  bounds_of(a[1] + 10, &start, &end);
  assert_int_equal(end - start, 0);
  size_t live = 0;
  assert_int_equal(ca_pool_foreach_live(fx->pool, count_live, &live), 3);

  fx->fake.auto_pass = true; /* a miss: its marker passes, it comes back */
  assert_int_equal(must_alloc(fx, 512 * KiB), a[1]);
  assert_consistent(fx);
  assert_true(ca_pool_lookup(fx->pool, a[1], NULL));
  assert_live_at(fx, a[1] + 10, a[1], 512 * KiB);

  fx->fake.auto_pass = false;
  assert_true(ca_pool_free(fx->pool, a[1], NULL));
  uint64_t seg = span_of(fx, a[0]).segment;
  assert_true(ca_pool_segment_lost(fx->pool, a[0]));
  assert_consistent(fx);
  ca_fake_free_behind(&fx->fake, 0, seg); /* the driver's now, */
  fx->fake.next_reserve_at = seg;         /* and given out again */
  fx->fake.refuse_sync = true;            /* while a[1] stays pending */
  assert_int_equal(must_alloc(fx, 512 * KiB), a[0]);
  assert_int_equal(must_alloc(fx, 512 * KiB), a[1]);
  assert_consistent(fx);
  assert_live_at(fx, a[1] + 10, a[1], 512 * KiB);
  fx->fake.refuse_sync = false;
  fx->fake.auto_pass = true;
  must_alloc(fx, 1 * MiB); /* a miss: the old a[1] comes back, buried */
  assert_consistent(fx);
  assert_live_at(fx, a[1] + 10, a[1], 512 * KiB);
  fixture_free(fx);
}

/* The live table (open addressing, pool/live.c) holds every live block
 * through its growth from 64 slots and through removals in any order,
 * which move later entries back into the gap: each live block is found by
 * its start and its last byte, no freed one is, and a walk counts them. */
static void live_table_keeps_every_block_through_growth_and_removal(void **state) {
  (void)state;
  ca_pool_options o = default_options();
  o.reuse = CA_REUSE_IMMEDIATE;
  fixture *fx = fixture_new(1024 * MiB, o, false);
  enum { N = 20000 };
  static uint64_t block[N];
  static bool live[N];
  uint64_t rng = 7;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++)
      if (!live[i]) {
        block[i] = must_alloc(fx, 512 * (1 + i % 5));
        live[i] = true;
      }
    size_t n = 0;
    ca_pool_foreach_live(fx->pool, count_live, &n);
    assert_int_equal(n, N);
    for (int k = 0; k < 2 * N / 3; k++) { /* frees in random order */
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      int i = (int)((rng >> 33) % N);
      if (live[i]) {
        assert_true(ca_pool_free(fx->pool, block[i], NULL));
        live[i] = false;
      }
    }
    assert_consistent(fx);
    n = 0;
    for (int i = 0; i < N; i++) {
      ca_pool_span sp;
      bool held = ca_pool_find(fx->pool, block[i], &sp) && sp.live &&
                  sp.block.addr == block[i];
      if (held != live[i])
        fail_msg("round %d: block %d at %#llx: found %d, live %d", round, i,
                 (unsigned long long)block[i], held, live[i]);
      if (live[i]) {
        assert_in_block(fx, block[i] + 512 * (1 + i % 5) - 1, block[i], 512 * (1 + i % 5));
        n++;
      }
    }
    size_t walked = 0;
    ca_pool_foreach_live(fx->pool, count_live, &walked);
    assert_int_equal(walked, n);
  }
  fixture_free(fx);
}

/* The block a thread found last answers its next look-up without a lock,
 * but only while it is live: freed, or its address handed out again at
 * another size, it says so at once. */
static void remembered_block_goes_when_freed(void **state) {
  (void)state;
  ca_pool_options o = default_options();
  o.reuse = CA_REUSE_IMMEDIATE;
  fixture *fx = fixture_new(1024 * MiB, o, false);
  uint64_t a = must_alloc(fx, 8 * KiB), lo = 0, hi = 0;
  assert_int_equal(ca_pool_bounds(a + 100, &lo, &hi), CA_POOL_FOUND);
  assert_int_equal(lo, a);
  assert_int_equal(hi, a + 8 * KiB);
  assert_int_equal(ca_pool_bounds(a + 8191, &lo, &hi), CA_POOL_FOUND);
  assert_int_equal(hi, a + 8 * KiB);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_int_equal(ca_pool_bounds(a + 100, &lo, &hi), CA_POOL_FOUND);
  assert_int_equal(hi - lo, 0);
  uint64_t b = must_alloc(fx, 8 * KiB);
  assert_int_equal(b, a); /* immediate reuse: the same block */
  assert_true(ca_pool_free(fx->pool, b, NULL));
  uint64_t c = must_alloc(fx, 1000); /* a smaller block, maybe there too */
  assert_int_equal(ca_pool_bounds(c + 999, &lo, &hi), CA_POOL_FOUND);
  assert_int_equal(hi, c + 1000);
  assert_int_equal(ca_pool_bounds(c + 1000, &lo, &hi), CA_POOL_FOUND);
  assert_int_equal(hi - lo, 0);
  assert_true(ca_pool_free(fx->pool, c, NULL));
  fixture_free(fx);
}

/* Two pools whose backends hand out the same addresses (only fakes do, or
 * the driver, once one pool's segment is gone behind its back): the index
 * names the newest segment; each pool, asked itself, still finds its own
 * blocks, the old way. */
static void pools_sharing_addresses_are_asked_one_by_one(void **state) {
  (void)state;
  fixture *one = fixture_new(1024 * MiB, default_options(), false);
  fixture *two = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(one, 1000), b = must_alloc(two, 3000);
  assert_int_equal(a, b);
  ca_pool *pool = NULL;
  uint64_t block = 0;
  assert_int_equal(locate(a, &pool, &block), CA_POOL_FOUND);
  assert_ptr_equal(pool, two->pool);
  assert_int_equal(block, b);
  assert_in_block(one, a + 999, a, 1000);
  assert_in_block(two, b + 2999, b, 3000);
  assert_true(ca_pool_free(two->pool, b, NULL));
  fixture_free(two); /* the index cannot tell while `one` is over it */
  assert_int_equal(locate(a, &pool, &block), CA_POOL_ASK);
  assert_in_block(one, a + 999, a, 1000);
  assert_true(ca_pool_free(one->pool, a, NULL));
  fixture_free(one);
  assert_int_equal(locate(a, &pool, &block), CA_POOL_NOWHERE);
}

/* Allocates `n` blocks of `size` and checks that none overlaps
 * [gone, gone + gone_size); returns them through `out`. */
static void alloc_around(fixture *fx, uint64_t size, int n, uint64_t gone,
                         uint64_t gone_size, uint64_t *out) {
  for (int i = 0; i < n; i++) {
    out[i] = must_alloc(fx, size);
    assert_true(out[i] + size <= gone || out[i] >= gone + gone_size);
  }
}

/* A block exported to another process, once freed, is never handed out
 * again, whichever way frees come back (at once, or behind a marker), and
 * its free neighbours never merge over it; the segment still goes back to
 * the backend once the rest of it is free. */
static void shared_block_never_comes_back(void **state) {
  (void)state;
  for (int safe = 0; safe < 2; safe++) {
    fixture *fx = fixture_new(
        1024 * MiB, warning_options(safe ? CA_REUSE_SAFE : CA_REUSE_IMMEDIATE),
        safe);
    uint64_t a = must_alloc(fx, 64 * KiB), b = must_alloc(fx, 64 * KiB);
    uint64_t seg = span_of(fx, b).segment, more[64];
    assert_true(ca_pool_share(fx->pool, b));
    assert_false(ca_pool_share(fx->pool, b + 512)); /* not a block's start */
    assert_true(ca_pool_free(fx->pool, b, NULL));
    assert_in_no_block(fx, b);
    alloc_around(fx, 64 * KiB, 64, b, 64 * KiB, more);
    assert_consistent(fx);
    cudalloc_device_stats s = stats_of(fx);
    assert_int_equal(s.reserved_bytes.current,
                     s.allocated_bytes.current + s.free_cached_bytes +
                         s.pending_free_bytes + 64 * KiB);
    for (int i = 0; i < 64; i++)
      assert_true(ca_pool_free(fx->pool, more[i], NULL));
    assert_true(ca_pool_free(fx->pool, a, NULL));
    assert_true(ca_pool_empty_cache(fx->pool) >= 2 * MiB);
    assert_false(ca_pool_holds_segment(fx->pool, seg));
    assert_int_equal(warnings, 0);
    fixture_free(fx);
  }
}

/* In a 20 MiB segment: the blocks beside a freed shared block merge with
 * everything but it, and a request as large as all of them together is
 * not served across it. */
static void free_neighbours_do_not_merge_over_a_shared_block(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t x = must_alloc(fx, 3 * MiB), y = must_alloc(fx, 3 * MiB);
  uint64_t z = must_alloc(fx, 3 * MiB);
  assert_true(ca_pool_share(fx->pool, y));
  assert_true(ca_pool_free(fx->pool, x, NULL));
  assert_true(ca_pool_free(fx->pool, y, NULL));
  assert_true(ca_pool_free(fx->pool, z, NULL));
  uint64_t big[1];
  alloc_around(fx, 9 * MiB, 1, y, 3 * MiB, big);
  assert_consistent(fx);
  assert_true(ca_pool_free(fx->pool, big[0], NULL));
  fixture_free(fx);
}

/* What a request can get beside the backend's free memory: the segments
 * with no live block, pending frees included; holes in used segments are
 * not (a request larger than the holes cannot use them). */
static void counts_releasable_segments(void **state) {
  (void)state;
  for (int safe = 0; safe < 2; safe++) {
    ca_pool_options opt = default_options();
    opt.reuse = safe ? CA_REUSE_SAFE : CA_REUSE_IMMEDIATE;
    fixture *fx = fixture_new(1024 * MiB, opt, safe);
    fx->fake.auto_pass = false; /* frees stay pending under safe */
    uint64_t blocks[400];
    for (int i = 0; i < 400; i++)
      blocks[i] = must_alloc(fx, 1 * MiB); /* two per 2 MiB segment */
    assert_int_equal(ca_pool_releasable(fx->pool), 0);
    for (int i = 0; i < 400; i += 2)
      assert_true(ca_pool_free(fx->pool, blocks[i], NULL));
    assert_int_equal(ca_pool_releasable(fx->pool), 0);
    for (int i = 1; i < 20; i += 2)
      assert_true(ca_pool_free(fx->pool, blocks[i], NULL));
    uint64_t releasable = ca_pool_releasable(fx->pool);
    assert_int_equal(releasable, 20 * MiB);
    uint64_t free_bytes = fx->fake.capacity[0] - fx->fake.used[0];
    must_alloc(fx, free_bytes + releasable - 2 * MiB);
    assert_consistent(fx);
    fixture_free(fx);
  }
}

/* The backend hands out a range again that a segment of the pool holds:
 * the segment was freed behind the pool's back (a library calling the
 * driver's own cuMemFree). One line says so; none of its bytes is served
 * or given back again, and its live block is forgotten. */
static void segment_handed_out_again_is_lost(void **state) {
  (void)state;
  warnings = 0;
  fixture *fx = fixture_new(1024 * MiB, warning_options(CA_REUSE_IMMEDIATE),
                            false);
  uint64_t a = must_alloc(fx, 4 * KiB), b = must_alloc(fx, 4 * KiB);
  assert_true(ca_pool_free(fx->pool, b, NULL));
  uint64_t seg = span_of(fx, a).segment, small[600];
  assert_int_equal(ca_fake_free_behind(&fx->fake, 0, seg), 2 * MiB);
  fx->fake.next_reserve_at = seg;
  uint64_t big = must_alloc(fx, 30 * MiB);
  assert_int_equal(big, seg);
  fx->fake.next_addr[0] += 64 * MiB; /* fresh ranges beyond `big` */
  assert_int_equal(warnings, 1);
  assert_non_null(strstr(last_warning, "freed behind the pool's back"));
  alloc_around(fx, 4 * KiB, 600, seg, 30 * MiB, small);
  ca_pool_span sp = span_of(fx, a + 100); /* the new segment holds it */
  assert_int_equal(sp.segment, big);
  assert_int_equal(sp.segment_size, 30 * MiB);
  assert_int_equal(sp.block.addr, big);
  assert_int_equal(stats_of(fx).blocks.current, 601);
  assert_consistent(fx);
  fixture_free(fx); /* never gave the lost segment back */
}

/* The same, found by the caller (the driver says the address is no
 * allocation): the segment leaves the pool at once. */
static void segment_reported_lost_leaves_the_pool(void **state) {
  (void)state;
  warnings = 0;
  fixture *fx = fixture_new(1024 * MiB, warning_options(CA_REUSE_IMMEDIATE),
                            false);
  uint64_t a = must_alloc(fx, 4 * KiB);
  uint64_t seg = span_of(fx, a).segment;
  ca_pool_span sp;
  assert_false(ca_pool_segment_lost(fx->pool, 0x1000));
  assert_true(ca_pool_segment_lost(fx->pool, a + 10));
  assert_int_equal(warnings, 1);
  assert_non_null(strstr(last_warning, "1 live block"));
  assert_false(ca_pool_find(fx->pool, a, &sp));
  assert_false(ca_pool_holds_segment(fx->pool, seg));
  ca_fake_free_behind(&fx->fake, 0, seg);
  uint64_t fresh[8];
  alloc_around(fx, 4 * KiB, 8, seg, 2 * MiB, fresh);
  assert_false(ca_pool_free(fx->pool, a, NULL));
  cudalloc_device_stats st = stats_of(fx);
  assert_int_equal(st.reserved_bytes.current, 2 * MiB); /* the fresh one */
  assert_int_equal(st.blocks.current, 8);
  assert_consistent(fx);
  fixture_free(fx);
}

typedef struct seen_blocks {
  uint64_t seg, next, segments, segment_bytes, live, live_requested, other;
  bool tiled; /* each segment's blocks follow one another */
} seen_blocks;

static void note_block(const ca_pool_block_view *v, void *arg) {
  seen_blocks *s = arg;
  if (v->seg_addr != s->seg) {
    s->seg = v->seg_addr;
    s->segments++;
    s->segment_bytes += v->seg_size;
    s->tiled &= v->addr >= v->seg_addr;
  } else {
    s->tiled &= v->addr == s->next;
  }
  s->next = v->addr + v->size;
  s->tiled &= s->next <= v->seg_addr + v->seg_size;
  if (v->state == CA_POOL_BLOCK_LIVE) {
    s->live++;
    s->live_requested += v->requested;
  } else {
    s->other++;
    assert_int_equal(v->requested, 0);
  }
}

/* Every block of every segment, a segment's in address order: its live
 * blocks with their requested bytes, the cache beside them, the segments
 * summing to what the pool reserves (PyTorch's snapshot is made of them). */
static void lists_every_block_of_every_segment(void **state) {
  (void)state;
  fixture *fx = fixture_new(1024 * MiB, default_options(), false);
  uint64_t a = must_alloc(fx, 1000), b = must_alloc(fx, 64 * KiB);
  uint64_t c = must_alloc(fx, 3 * MiB), d = must_alloc(fx, 5 * MiB);
  assert_true(ca_pool_free(fx->pool, b, NULL));
  assert_true(ca_pool_free(fx->pool, d, NULL));
  seen_blocks s = {.tiled = true};
  size_t n = ca_pool_foreach_block(fx->pool, note_block, &s);
  assert_true(s.tiled);
  assert_int_equal(n, s.live + s.other);
  assert_int_equal(s.live, 2);
  assert_int_equal(s.live_requested, 1000 + 3 * MiB);
  assert_true(s.other >= 2); /* b's and d's places, at least */
  assert_int_equal(s.segment_bytes, stats_of(fx).reserved_bytes.current);
  assert_true(ca_pool_free(fx->pool, a, NULL));
  assert_true(ca_pool_free(fx->pool, c, NULL));
  fixture_free(fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(finds_the_block_holding_an_address),
      cmocka_unit_test(locates_blocks_in_every_chunk),
      cmocka_unit_test(live_table_keeps_every_block_through_growth_and_removal),
      cmocka_unit_test(a_parked_block_answers_as_freed),
      cmocka_unit_test(a_pending_block_answers_as_freed),
      cmocka_unit_test(pools_sharing_addresses_are_asked_one_by_one),
      cmocka_unit_test(remembered_block_goes_when_freed),
      cmocka_unit_test(shared_block_never_comes_back),
      cmocka_unit_test(free_neighbours_do_not_merge_over_a_shared_block),
      cmocka_unit_test(counts_releasable_segments),
      cmocka_unit_test(segment_handed_out_again_is_lost),
      cmocka_unit_test(segment_reported_lost_leaves_the_pool),
      cmocka_unit_test(lists_every_block_of_every_segment),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
