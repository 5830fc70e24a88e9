/*
 * What the pool's unit tests share: a pool over the fake backend, and the
 * checks every test makes of it (the test_pool*.c files).
 */
#ifndef CA_POOL_FIXTURE_H
#define CA_POOL_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "fake_backend.h"
#include "pool/pool.h"

#define KiB (1024ull)
#define MiB (1024ull * 1024)

typedef struct fixture {
  ca_fake_backend fake;
  ca_pool *pool;
} fixture;

static inline fixture *fixture_new(uint64_t capacity, ca_pool_options opt,
                                   bool with_sync) {
  fixture *fx = calloc(1, sizeof(*fx));
  assert_non_null(fx);
  ca_fake_init(&fx->fake, capacity, with_sync, false);
  fx->pool = ca_pool_create(&fx->fake.backend, 0, &opt);
  assert_non_null(fx->pool);
  return fx;
}

static inline ca_pool_options default_options(void) {
  return (ca_pool_options){.max_split_size = UINT64_MAX};
}

/* The defaults under a memory limit of `limit` bytes, booked in *budget
 * (which must outlive the pool: a test's static). */
static inline ca_pool_options limited_options(ca_budget *budget,
                                              uint64_t limit) {
  *budget = (ca_budget){.limit = limit};
  ca_pool_options opt = default_options();
  opt.budget = budget;
  return opt;
}

/* The pool is consistent, gives everything back when destroyed, and never
 * gave back what it did not hold. */
static inline void fixture_free(fixture *fx) {
  char why[256];
  assert_true(ca_pool_check(fx->pool, why, sizeof(why)));
  ca_pool_destroy(fx->pool);
  assert_int_equal(fx->fake.nsegments, 0); /* everything given back */
  assert_int_equal(fx->fake.bad_releases, 0);
  ca_fake_fini(&fx->fake);
  free(fx);
}

static inline uint64_t must_alloc(fixture *fx, uint64_t size) {
  uint64_t addr = 0;
  assert_int_equal(ca_pool_alloc(fx->pool, size, 0, &addr), 0);
  assert_true(ca_fake_owns(&fx->fake, 0, addr, size ? size : 1));
  return addr;
}

static inline cudalloc_device_stats stats_of(fixture *fx) {
  cudalloc_device_stats s;
  ca_pool_get_stats(fx->pool, &s);
  return s;
}

static inline void assert_consistent(fixture *fx) {
  char why[256] = "";
  if (!ca_pool_check(fx->pool, why, sizeof(why)))
    fail_msg("pool inconsistent: %s", why);
}

/* A pool with the fake's markers (reuse_policy safe), whose device is
 * busy until the test says otherwise. */
static inline fixture *safe_fixture(uint64_t capacity, ca_pool_options opt) {
  opt.reuse = CA_REUSE_SAFE;
  fixture *fx = fixture_new(capacity, opt, true);
  fx->fake.auto_pass = false;
  return fx;
}

/* Four 512 KiB blocks fill one small segment. */
static inline void fill_small_segment(fixture *fx, uint64_t a[4]) {
  for (int i = 0; i < 4; i++)
    a[i] = must_alloc(fx, 512 * KiB);
}

#endif /* CA_POOL_FIXTURE_H */
