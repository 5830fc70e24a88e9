/*
 * The concerns around the pool (src/concerns/), each against a fake
 * upstream: a bottom layer that records what reaches it and answers as a
 * test scripts it. The asks name a real pool over the fake backend, for
 * the device and the statistics the layers read of it. First how the
 * configuration composes the chains, then each concern alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "concerns/concern.h"
#include "leaks/sites.h"
#include "pool_fixture.h"
#include "timeline/trace.h"

#define OOM 2     /* the status of out of memory, as the driver's */
#define REFUSED 9 /* a capture's refusal */

/* ---- The fake upstream ---------------------------------------------------------- */

static struct {
  int answers[4]; /* what the next allocations answer, then 0 */
  size_t nanswers, answered, asked, given;
  ca_ask last_ask;
  bool described; /* the last free asked for the block */
  uint64_t next_addr;
} up;

/* What reached the fake upstream and the fake NVTX tool, in order. */
static char events[512];

static void event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void event(const char *fmt, ...) {
  size_t at = strlen(events);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(events + at, sizeof(events) - at, fmt, ap);
  va_end(ap);
}

static int up_alloc(const ca_layer *self, ca_ask *ask) {
  (void)self;
  int r = up.answered < up.nanswers ? up.answers[up.answered++] : 0;
  up.asked++;
  if (r == 0)
    ask->addr = up.next_addr += 4096;
  up.last_ask = *ask;
  event("alloc %llu;", (unsigned long long)ask->size);
  return r;
}

/* Describes the block as the pool would: its tag is the stack the
 * allocation carried down, its requested bytes what it asked. */
static int up_free(const ca_layer *self, ca_give *give) {
  (void)self;
  up.given++;
  up.described = give->describe;
  event("free %llx;", (unsigned long long)give->addr);
  if (give->addr != up.last_ask.addr)
    return CA_GIVE_NOT_POOLED;
  if (give->describe)
    give->block = (ca_live_block){.addr = give->addr,
                                  .requested = up.last_ask.size,
                                  .tag = up.last_ask.stack};
  return 0;
}

/* The next allocations answer a, then b (0: served), then are served. */
static void script(int a, int b) {
  up.answers[0] = a;
  up.answers[1] = b;
  up.nanswers = 2;
  up.answered = 0;
}

static const ca_layer upstream = {
    .name = "fake", .alloc = up_alloc, .free = up_free};

/* ---- The environment, faked ---------------------------------------------------- */

static int made_room_on = -1; /* the device make_room was last asked for */
static uint64_t made_room_for; /* and the bytes */
static bool room_found;
static int no_room_on = -1; /* the device no_room was last told of */
static uint64_t no_room_for; /* and the bytes */
static int allowed_answer, allowed_asked;
static atomic_int capturing;

static bool fake_make_room(int device, uint64_t bytes) {
  made_room_on = device;
  made_room_for = bytes;
  return room_found;
}

static void fake_no_room(int device, uint64_t bytes) {
  no_room_on = device;
  no_room_for = bytes;
}

static int fake_allowed(void) {
  allowed_asked++;
  return allowed_answer;
}

static void tool_add(const ca_ask *ask) {
  event("add %llx %llu;", (unsigned long long)ask->addr,
        (unsigned long long)ask->size);
  assert_int_equal(ask->stack, up.last_ask.stack);
}

static void tool_remove(uint64_t addr) {
  event("remove %llx;", (unsigned long long)addr);
}

static const ca_region_ops tool = {.add = tool_add, .remove = tool_remove};

typedef struct world {
  ca_config cfg;
  ca_layer_env env;
  ca_chain chain;
  const ca_layer *top;
  fixture *fx;
} world;

/* A chain on `path` composed from the settings `conf`, over the fake
 * upstream, with everything the fakes remember forgotten. */
static world *world_new_tool(const char *conf, ca_path path,
                             const ca_region_ops *regions) {
  world *w = calloc(1, sizeof(*w));
  assert_non_null(w);
  ca_config_defaults(&w->cfg);
  assert_int_equal(ca_config_parse(&w->cfg, conf), 0);
  w->env = (ca_layer_env){.cfg = &w->cfg,
                          .oom = OOM,
                          .make_room = fake_make_room,
                          .no_room = fake_no_room,
                          .allowed = fake_allowed,
                          .capturing = &capturing,
                          .regions = regions};
  w->top = ca_compose(&w->chain, &w->env, path, &upstream);
  w->fx = fixture_new(64 * MiB, default_options(), false);
  memset(&up, 0, sizeof(up));
  up.next_addr = 1 << 20;
  made_room_on = -1;
  made_room_for = 0;
  room_found = false;
  no_room_on = -1;
  no_room_for = 0;
  allowed_answer = allowed_asked = 0;
  atomic_store(&capturing, 0);
  events[0] = '\0';
  return w;
}

static world *world_new(const char *conf, ca_path path) {
  return world_new_tool(conf, path, NULL);
}

static void world_free(world *w) {
  fixture_free(w->fx);
  free(w);
}

static int ask(world *w, uint64_t size, ca_ask *a) {
  *a = (ca_ask){.pool = w->fx->pool, .size = size};
  return ca_layer_alloc(w->top, a);
}

static int give(world *w, uint64_t addr) {
  ca_give g = {.addr = addr};
  return ca_layer_free(w->top, &g);
}

static const char *names(const world *w) {
  static char buf[256];
  ca_chain_describe(&w->chain, buf, sizeof(buf));
  return buf;
}

/* ---- Composition --------------------------------------------------------------- */

/* With the defaults, the driver's own calls keep only the capture rule
 * and stream-ordered requests meet the pool at once: what is off is not
 * in the chain. */
static void test_defaults_compose_nothing_but_the_capture_rule(void **state) {
  (void)state;
  world *w = world_new("", CA_PATH_SYNC);
  assert_string_equal(names(w), "capture_rule+fake");
  world_free(w);
  w = world_new("", CA_PATH_ORDERED);
  assert_string_equal(names(w), "fake");
  assert_ptr_equal(w->top, &w->chain.layers[0]);
  assert_int_equal(w->chain.n, 1);
  world_free(w);
}

/* Each setting adds its layer, in the one order of compose.c. */
static void test_settings_compose_their_layers_in_order(void **state) {
  (void)state;
  const char *every =
      "verbose:1,backtrace_depth:4,trace_path:/nonexistent/t,memory_limit_mb:64";
  world *w = world_new(every, CA_PATH_SYNC);
  assert_string_equal(
      names(w),
      "capture_rule+site_bytes+trace_events+limit_room+fake");
  world_free(w);
  w = world_new(every, CA_PATH_ORDERED);
  assert_string_equal(names(w), "site_bytes+trace_events+limit_room+fake");
  world_free(w);
  w = world_new("growth_report:1", CA_PATH_ORDERED);
  assert_string_equal(names(w), "site_bytes+fake");
  world_free(w);
}

/* A trace started at run time (cudalloc_trace_start) composes the
 * timeline's layer on both paths, without trace_path, in its place. */
static void test_a_trace_started_later_composes_its_layer(void **state) {
  (void)state;
  for (int p = CA_PATH_SYNC; p <= CA_PATH_ORDERED; p++) {
    world *w = world_new("backtrace_depth:4", (ca_path)p);
    assert_string_equal(names(w), p == CA_PATH_SYNC ? "capture_rule+site_bytes+fake"
                                                    : "site_bytes+fake");
    w->env.traced = true;
    ca_compose(&w->chain, &w->env, (ca_path)p, &upstream);
    assert_string_equal(names(w), p == CA_PATH_SYNC
                                      ? "capture_rule+site_bytes+trace_events+fake"
                                      : "site_bytes+trace_events+fake");
    world_free(w);
  }
}

static bool fake_block(uint64_t addr, ca_pool **pool, ca_live_block *out) {
  (void)addr;
  (void)pool;
  (void)out;
  return false;
}

/* memcheck sits innermost, below an NVTX tool's regions, and takes stacks
 * (site_bytes) for its findings; it needs the policy's look-up of a block. */
static void test_memcheck_composes_innermost(void **state) {
  (void)state;
  world *w = world_new_tool("memcheck:1", CA_PATH_ORDERED, &tool);
  assert_string_equal(names(w), "site_bytes+nvtx_regions+fake");
  w->env.block = fake_block;
  w->top = ca_compose(&w->chain, &w->env, CA_PATH_ORDERED, &upstream);
  assert_string_equal(names(w), "site_bytes+nvtx_regions+memcheck+fake");
  w->top = ca_compose(&w->chain, &w->env, CA_PATH_SYNC, &upstream);
  assert_string_equal(names(w),
                      "capture_rule+site_bytes+nvtx_regions+memcheck+fake");
  world_free(w);
}

/* A name cut short by a small buffer is still a string. */
static void test_describe_cuts_as_snprintf(void **state) {
  (void)state;
  world *w = world_new("memory_limit_mb:64", CA_PATH_SYNC);
  char small[8];
  ca_chain_describe(&w->chain, small, sizeof(small));
  assert_string_equal(small, "capture");
  world_free(w);
}

/* ---- capture_rule -------------------------------------------------------------- */

/* Outside a capture the driver is never asked; during one, its refusal is
 * the answer and nothing reaches the pool; when it allows, the request
 * goes on. */
static void test_capture_rule_refuses_before_anything(void **state) {
  (void)state;
  world *w = world_new("", CA_PATH_SYNC);
  ca_ask a;
  assert_int_equal(ask(w, 100, &a), 0);
  assert_int_equal(give(w, a.addr), 0);
  assert_int_equal(allowed_asked, 0);

  atomic_store(&capturing, 1);
  allowed_answer = REFUSED;
  assert_int_equal(ask(w, 100, &a), REFUSED);
  assert_int_equal(give(w, up.last_ask.addr), REFUSED);
  assert_int_equal(up.asked, 1);
  assert_int_equal(up.given, 1);
  assert_int_equal(allowed_asked, 2);

  allowed_answer = 0;
  assert_int_equal(ask(w, 100, &a), 0);
  assert_int_equal(give(w, a.addr), 0);
  assert_int_equal(up.asked, 2);
  assert_int_equal(up.given, 2);
  world_free(w);
}

/* ---- limit_room ---------------------------------------------------------------- */

/* Out of memory: the device's other pools give back their cache, and the
 * request is asked once more, with the same stack; served then, nothing
 * is said. */
static void test_limit_room_asks_again_once_room_was_made(void **state) {
  (void)state;
  world *w = world_new("memory_limit_mb:64,backtrace_depth:4", CA_PATH_ORDERED);
  script(OOM, 0);
  room_found = true;
  ca_ask a;
  assert_int_equal(ask(w, MiB, &a), 0);
  assert_int_equal(up.asked, 2);
  assert_int_equal(made_room_on, 0);
  assert_int_equal(made_room_for, MiB);
  assert_int_equal(no_room_on, -1);
  assert_int_not_equal(a.stack, 0);
  assert_int_equal(up.last_ask.stack, a.stack);
  assert_int_equal(give(w, a.addr), 0);
  world_free(w);
}

/* Nothing given back: no second ask, and the refusal is said. Another
 * refusal: no room asked, nothing said. */
static void test_limit_room_asks_no_more_without_room(void **state) {
  (void)state;
  world *w = world_new("memory_limit_mb:64", CA_PATH_ORDERED);
  script(OOM, OOM);
  ca_ask a;
  assert_int_equal(ask(w, 3 * MiB, &a), OOM);
  assert_int_equal(up.asked, 1);
  assert_int_equal(made_room_on, 0);
  assert_int_equal(no_room_on, 0);
  assert_int_equal(no_room_for, 3 * MiB);

  made_room_on = no_room_on = -1;
  up.asked = 0;
  script(REFUSED, 0);
  room_found = true;
  assert_int_equal(ask(w, MiB, &a), REFUSED);
  assert_int_equal(up.asked, 1);
  assert_int_equal(made_room_on, -1);
  assert_int_equal(no_room_on, -1);
  world_free(w);
}

/* Room made, and the second ask refused for memory too: said once. */
static void test_limit_room_says_a_refusal_after_the_second_ask(void **state) {
  (void)state;
  world *w = world_new("memory_limit_mb:64", CA_PATH_SYNC);
  script(OOM, OOM);
  room_found = true;
  ca_ask a;
  assert_int_equal(ask(w, MiB, &a), OOM);
  assert_int_equal(up.asked, 2);
  assert_int_equal(no_room_on, 0);
  assert_int_equal(no_room_for, MiB);
  world_free(w);
}

/* ---- site_bytes ---------------------------------------------------------------- */

/* The stack is taken once and carried down; the site holds the block's
 * bytes until its free, which asks the pool to describe the block. */
static void test_site_bytes_counts_a_block_until_its_free(void **state) {
  (void)state;
  world *w = world_new("backtrace_depth:8", CA_PATH_ORDERED);
  ca_ask a;
  assert_int_equal(ask(w, 3 * MiB, &a), 0);
  assert_int_not_equal(up.last_ask.stack, 0);
  ca_sites_peak p;
  ca_sites_peak_get(&p);
  assert_int_equal(p.bytes, 3 * MiB);
  assert_int_equal(p.sites[0].stack, up.last_ask.stack);

  assert_int_equal(give(w, a.addr), 0);
  assert_true(up.described);
  assert_int_equal(ask(w, 2 * MiB, &a), 0); /* 2 MiB live, not 5 */
  ca_sites_peak_get(&p);
  assert_int_equal(p.bytes, 3 * MiB);
  assert_int_equal(give(w, a.addr), 0);

  /* A refused request counts nothing (7 MiB would be the peak); a free
   * of what the pool does not hold uncounts nothing. */
  script(OOM, 0);
  assert_int_equal(ask(w, 7 * MiB, &a), OOM);
  assert_int_equal(give(w, 12345), CA_GIVE_NOT_POOLED);
  ca_sites_peak_get(&p);
  assert_int_equal(p.bytes, 3 * MiB);
  world_free(w);
}

/* Without stacks nothing asks the pool to describe a block. */
static void test_no_layer_no_description(void **state) {
  (void)state;
  world *w = world_new("", CA_PATH_ORDERED);
  ca_ask a;
  assert_int_equal(ask(w, 100, &a), 0);
  assert_int_equal(a.stack, 0);
  assert_int_equal(give(w, a.addr), 0);
  assert_false(up.described);
  world_free(w);
}

/* ---- trace_events -------------------------------------------------------------- */

static char *read_all(const char *path) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char text[64 * 1024];
  size_t n = fread(text, 1, sizeof(text) - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

/* Once the trace records, an allocation begins a slice named by its
 * address and its free ends it; before, the layer records nothing and
 * asks for no description. */
static void test_trace_events_record_each_block(void **state) {
  (void)state;
  char path[] = "/tmp/cudalloc_test_concerns_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  world *w = world_new("trace_path:/unused", CA_PATH_ORDERED);
  ca_ask a;
  assert_int_equal(ask(w, 100, &a), 0);
  assert_int_equal(give(w, a.addr), 0);
  assert_false(up.described);

  assert_true(ca_trace_start(path, true, 0));
  assert_int_equal(ask(w, 5000, &a), 0);
  assert_int_equal(give(w, a.addr), 0);
  assert_true(up.described);
  ca_trace_finish(NULL);
  char begin[96], end[96];
  snprintf(begin, sizeof(begin), "\"ph\":\"b\",\"id\":\"0x%llx\"",
           (unsigned long long)a.addr);
  snprintf(end, sizeof(end), "\"ph\":\"e\",\"id\":\"0x%llx\"",
           (unsigned long long)a.addr);
  const char *text = read_all(path);
  assert_non_null(strstr(text, begin));
  assert_non_null(strstr(text, end));
  assert_non_null(strstr(text, "\"bytes\":5000"));
  assert_null(strstr(text, "\"bytes\":100,"));
  unlink(path);
  world_free(w);
}

/* ---- nvtx_regions ------------------------------------------------------------- */

/* With a tool attached (and only then), the tool hears of a block once the
 * pool served it, with its stack, and of its free before the pool takes it
 * back; of a refused request, nothing. */
static void test_nvtx_regions_tell_the_tool_around_the_pool(void **state) {
  (void)state;
  world *w = world_new_tool("backtrace_depth:4", CA_PATH_ORDERED, &tool);
  assert_string_equal(names(w), "site_bytes+nvtx_regions+fake");
  ca_ask a;
  assert_int_equal(ask(w, 1000, &a), 0);
  assert_int_equal(give(w, a.addr), 0);
  char want[128];
  snprintf(want, sizeof(want), "alloc 1000;add %llx 1000;remove %llx;free %llx;",
           (unsigned long long)a.addr, (unsigned long long)a.addr,
           (unsigned long long)a.addr);
  assert_string_equal(events, want);

  events[0] = '\0';
  script(OOM, 0);
  assert_int_equal(ask(w, 1000, &a), OOM);
  assert_string_equal(events, "alloc 1000;");
  world_free(w);

  w = world_new_tool("", CA_PATH_SYNC, &tool);
  assert_string_equal(names(w), "capture_rule+nvtx_regions+fake");
  world_free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_compose_nothing_but_the_capture_rule),
      cmocka_unit_test(test_settings_compose_their_layers_in_order),
      cmocka_unit_test(test_a_trace_started_later_composes_its_layer),
      cmocka_unit_test(test_memcheck_composes_innermost),
      cmocka_unit_test(test_describe_cuts_as_snprintf),
      cmocka_unit_test(test_capture_rule_refuses_before_anything),
      cmocka_unit_test(test_limit_room_asks_again_once_room_was_made),
      cmocka_unit_test(test_limit_room_asks_no_more_without_room),
      cmocka_unit_test(test_limit_room_says_a_refusal_after_the_second_ask),
      cmocka_unit_test(test_site_bytes_counts_a_block_until_its_free),
      cmocka_unit_test(test_no_layer_no_description),
      cmocka_unit_test(test_trace_events_record_each_block),
      cmocka_unit_test(test_nvtx_regions_tell_the_tool_around_the_pool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
