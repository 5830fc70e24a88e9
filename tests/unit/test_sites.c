/*
 * Live memory by allocation site (src/leaks/sites.c): the peak and who held it,
 * and the growth report, which must name a site that grows every
 * iteration even when everything is freed at the end, and must stay quiet
 * about a loop whose memory is steady.
 *
 * The module keeps process-wide state, so each test uses its own stack ids,
 * and the peak test runs first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "leaks/sites.h"

#define MiB (1024u * 1024u)

/* The growth entry of `stack`, or NULL when it is not reported. */
static const ca_site_growth *growth_of(uint32_t stack, ca_site_growth *all,
                                       size_t n) {
  for (size_t i = 0; i < n; i++)
    if (all[i].stack == stack)
      return &all[i];
  return NULL;
}

/* 2 MiB live at site 1, 3 MiB at site 2, then a burst of 8 MiB at site 3
 * that is freed: the peak is 13 MiB, site 3 held the most then, and the
 * peak stays when the memory is gone. */
static void test_peak_names_the_sites_that_held_it(void **state) {
  (void)state;
  ca_sites_alloc(1, 2 * MiB);
  ca_sites_alloc(2, 3 * MiB);
  for (int i = 0; i < 8; i++)
    ca_sites_alloc(3, MiB);
  for (int i = 0; i < 8; i++)
    ca_sites_free(3, MiB);
  ca_sites_alloc(0, 100 * MiB); /* no stack: not counted */
  ca_sites_peak p;
  ca_sites_peak_get(&p);
  assert_int_equal(p.bytes, 13 * MiB);
  assert_int_equal(p.allocation, 10);
  assert_true(p.shown_bytes <= p.bytes && p.shown_bytes >= p.bytes - p.bytes / 64);
  assert_int_equal(p.nsites, 3);
  assert_int_equal(p.sites[0].stack, 3);
  assert_int_equal(p.sites[0].bytes, 8 * MiB);
  assert_int_equal(p.sites[0].count, 8);
  assert_int_equal(p.sites[1].stack, 2);
  assert_int_equal(p.sites[2].stack, 1);
  ca_sites_free(1, 2 * MiB);
  ca_sites_free(2, 3 * MiB);
  ca_sites_peak_get(&p);
  assert_int_equal(p.bytes, 13 * MiB);
}

/* More sites than the peak lists: the largest CA_SITES_TOP, largest first. */
static void test_peak_lists_the_largest_sites(void **state) {
  (void)state;
  for (uint32_t s = 10; s < 10 + 2 * CA_SITES_TOP; s++)
    ca_sites_alloc(s, (s - 9) * 4 * MiB);
  ca_sites_peak p;
  ca_sites_peak_get(&p);
  assert_int_equal(p.nsites, CA_SITES_TOP);
  for (size_t i = 0; i < CA_SITES_TOP; i++)
    assert_int_equal(p.sites[i].stack, 9 + 2 * CA_SITES_TOP - i);
  for (uint32_t s = 10; s < 10 + 2 * CA_SITES_TOP; s++)
    ca_sites_free(s, (s - 9) * 4 * MiB);
}

/* One training step: `steady` allocates and frees 40 temporaries, `leaky`
 * keeps one block per step (when `keep`). */
static void step(uint32_t steady, uint32_t leaky, bool keep) {
  for (int i = 0; i < 40; i++) {
    ca_sites_alloc(steady, 4096);
    ca_sites_free(steady, 4096);
  }
  ca_sites_alloc(steady, 1000); /* one of them lives across the step */
  if (keep)
    ca_sites_alloc(leaky, MiB);
  ca_sites_free(steady, 1000);
}

/* Automatic snapshots (every 64 allocations at first): the leaky site is
 * reported with its run, even after everything was freed; the steady one
 * is not. */
static void test_growth_names_a_site_that_keeps_growing(void **state) {
  (void)state;
  ca_sites_set_growth(true);
  for (int s = 0; s < 60; s++)
    step(20, 21, true);
  for (int s = 0; s < 60; s++)
    ca_sites_free(21, MiB);
  ca_site_growth g[8];
  uint64_t snaps = 0;
  size_t n = ca_sites_growth(g, 8, &snaps);
  assert_true(snaps >= 30); /* 60 steps x 42 allocations / 64 */
  const ca_site_growth *leak = growth_of(21, g, n < 8 ? n : 8);
  assert_non_null(leak);
  assert_null(growth_of(20, g, n < 8 ? n : 8));
  assert_true(leak->snapshots >= CA_SITES_GROWTH_RUN);
  assert_true(leak->rises * 2 >= leak->snapshots - 1);
  assert_true(leak->to_bytes - leak->from_bytes >= 20 * MiB);
  assert_true(leak->to_alloc > leak->from_alloc);
}

/* Marks: a snapshot per step, and only at marks. A site that grew for a
 * few steps then held steady is not reported; one that grows at every
 * mark is, over exactly the marked steps. */
static void test_growth_at_marks(void **state) {
  (void)state;
  ca_site_growth before[8];
  uint64_t snaps_before = 0;
  ca_sites_mark(); /* the start of the first step */
  ca_sites_growth(before, 8, &snaps_before);
  for (int s = 0; s < 20; s++) {
    step(30, 31, true);          /* grows every step */
    step(32, 33, s < 3);         /* grows three steps, then not */
    ca_sites_mark();
  }
  ca_site_growth g[8];
  uint64_t snaps = 0;
  size_t n = ca_sites_growth(g, 8, &snaps);
  assert_int_equal(snaps, snaps_before + 20);
  const ca_site_growth *leak = growth_of(31, g, n < 8 ? n : 8);
  assert_non_null(leak);
  /* Its run begins at the first mark that saw it, after the first step. */
  assert_int_equal(leak->snapshots, 20);
  assert_int_equal(leak->rises, 19);
  assert_int_equal(leak->to_bytes - leak->from_bytes, 19 * MiB);
  assert_null(growth_of(33, g, n < 8 ? n : 8));
  assert_null(growth_of(32, g, n < 8 ? n : 8));
  /* After the first mark, allocations alone take no snapshot. */
  for (int s = 0; s < 200; s++)
    step(30, 31, false);
  ca_sites_growth(g, 8, &snaps);
  assert_int_equal(snaps, snaps_before + 20);
}

/* Asked for fewer than grew: the largest growth first, and the count of
 * all that grew. */
static void test_growth_keeps_the_largest(void **state) {
  (void)state;
  for (int s = 0; s < 12; s++) {
    for (uint32_t site = 40; site < 46; site++)
      ca_sites_alloc(site, (site - 39) * 16 * MiB);
    ca_sites_mark();
  }
  ca_site_growth g[2];
  size_t n = ca_sites_growth(g, 2, NULL);
  assert_true(n >= 6);
  assert_int_equal(g[0].stack, 45);
  assert_int_equal(g[1].stack, 44);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_peak_names_the_sites_that_held_it),
      cmocka_unit_test(test_peak_lists_the_largest_sites),
      cmocka_unit_test(test_growth_names_a_site_that_keeps_growing),
      cmocka_unit_test(test_growth_at_marks),
      cmocka_unit_test(test_growth_keeps_the_largest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
