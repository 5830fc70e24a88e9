/*
 * The leak report as its readers depend on it: groups by stack (or size),
 * largest first, with the program's own frame first; suppressions counted
 * apart; max_leaks; the JSON document; the lines for "nothing leaked".
 * Blocks are made up here; stacks are real return addresses of this test, so
 * the symbolizer names this file's functions and lines.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "log_capture.h"

#include "support/config.h"
#include "support/log.h"
#include "report/report.h"
#include "leaks/stacks.h"
#include "stats_fill.h"

static int count_of(const char *text, const char *needle) {
  int n = 0;
  for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* Stacks from two call sites of this file, recorded as a capture would:
 * return addresses, innermost first. Their lines are known. */
static int line_a, line_b;

__attribute__((noinline)) static uint32_t stack_here(void) {
  uintptr_t pc = (uintptr_t)__builtin_return_address(0);
  return ca_stacks_intern(&pc, 1);
}

__attribute__((noinline)) static uint32_t site_a(void) {
  line_a = __LINE__ + 1;
  uint32_t id = stack_here();
  return id;
}

__attribute__((noinline)) static uint32_t site_b(void) {
  line_b = __LINE__ + 1;
  uint32_t id = stack_here();
  return id;
}

static ca_report_block block(uint64_t seq, uint64_t bytes, uint32_t stack) {
  return (ca_report_block){.addr = 0x7f0000000000u + seq * 0x100000u,
                           .bytes = bytes,
                           .seq = seq,
                           .device = 0,
                           .stack = stack,
                           .call = CA_REPORT_POOLED_CALL};
}

static ca_leak_totals report(const ca_config *cfg, ca_report_event event,
                             const ca_report_block *b, size_t n) {
  ca_report_input in = {.event = event,
                        .device = -1,
                        .leaks = true,
                        .blocks = b,
                        .nblocks = n,
                        .allocations = 100,
                        .config = cfg};
  return ca_report(&in);
}

/* The same stack twice is one id; different stacks differ. */
static void stacks_are_interned(void **state) {
  (void)state;
  uint32_t a1 = site_a(), a2 = site_a(), b = site_b();
  assert_int_not_equal(a1, 0);
  assert_int_equal(a1, a2);
  assert_int_not_equal(a1, b);
  const uintptr_t *pcs;
  assert_int_equal(ca_stacks_get(a1, &pcs), 1);
  assert_non_null(pcs);
  assert_int_equal(ca_stacks_get(0, &pcs), 0);
  assert_int_equal(ca_stacks_get(123456, &pcs), 0);
}

/* Two sites: two groups, largest total first, each naming its own line. */
static void groups_by_stack_largest_first(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  uint32_t a = site_a(), b = site_b();
  ca_report_block blocks[] = {block(1, 4096, b), block(2, 1 << 20, a),
                              block(3, 1 << 20, a)};
  take_log();
  ca_leak_totals t = report(&cfg, CA_EVENT_EXIT, blocks, 3);
  const char *out = take_log();
  assert_int_equal(t.bytes, 2 * (1 << 20) + 4096);
  assert_int_equal(t.count, 3);
  const char *big = strstr(out, "2097152 bytes leaked in 2 allocation(s) on "
                                "device 0, allocated from:");
  const char *small = strstr(out, "4096 bytes leaked in 1 allocation(s) on "
                                  "device 0, allocated from:");
  assert_non_null(big);
  assert_non_null(small);
  assert_true(big < small);
  char where[64];
  snprintf(where, sizeof(where), "in site_a ");
  assert_non_null(strstr(big, where));
  snprintf(where, sizeof(where), "test_report.c:%d", line_a);
  assert_non_null(strstr(big, where));
  snprintf(where, sizeof(where), "test_report.c:%d", line_b);
  assert_non_null(strstr(small, where));
  assert_non_null(
      strstr(out, "cudalloc: SUMMARY: 2101248 bytes leaked in 3 allocations\n"));
  assert_null(strstr(out, "backtrace_depth"));
}

/* Without stacks, blocks group by size and the report says how to get
 * stacks. */
static void groups_by_size_without_stacks(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  ca_report_block blocks[] = {block(1, 512, 0), block(2, 1024, 0),
                              block(3, 512, 0), block(4, 512, 0),
                              block(5, 512, 0)};
  take_log();
  report(&cfg, CA_EVENT_EXIT, blocks, 5);
  const char *out = take_log();
  assert_non_null(strstr(out, "2048 bytes leaked in 4 allocation(s) of 512 "
                              "bytes on device 0:"));
  assert_non_null(strstr(out, "allocations #1 at 0x7f0000100000, #3 at "
                              "0x7f0000300000, #4 at 0x7f0000400000, ... (1 "
                              "more)"));
  assert_non_null(strstr(out, "1024 bytes leaked in 1 allocation(s) of 1024"));
  assert_non_null(strstr(out, "backtrace_depth:16"));
}

/* A suppressed group is not printed and is counted apart. */
static void suppressions_count_apart(void **state) {
  (void)state;
  char path[] = "/tmp/test_report_supp_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *rules = "# comment\n\nleak:^site_b$\nnot a rule\n";
  assert_int_equal(write(fd, rules, strlen(rules)), (ssize_t)strlen(rules));
  close(fd);
  ca_config cfg;
  ca_config_defaults(&cfg);
  snprintf(cfg.suppressions, sizeof(cfg.suppressions), "%s", path);
  uint32_t a = site_a(), b = site_b();
  ca_report_block blocks[] = {block(1, 4096, b), block(2, 100, a)};
  take_log();
  ca_leak_totals t = report(&cfg, CA_EVENT_EXIT, blocks, 2);
  const char *out = take_log();
  unlink(path);
  assert_int_equal(t.count, 1);
  assert_int_equal(t.suppressed_count, 1);
  assert_int_equal(t.suppressed_bytes, 4096);
  assert_null(strstr(out, "in site_b"));
  assert_non_null(strstr(out, "'not a rule' ignored"));
  assert_non_null(strstr(out, "SUMMARY: 100 bytes leaked in 1 allocations "
                              "(4096 bytes in 1 allocations suppressed)"));
}

/* Anchors and wildcards: "site" matches both sites; "^ite" matches none. */
static void suppression_patterns(void **state) {
  (void)state;
  static const struct {
    const char *rule;
    uint64_t suppressed;
  } cases[] = {{"leak:site", 2}, {"leak:^ite", 0}, {"leak:s*_a$", 1},
               {"leak:test_report", 2}, {"leak:site_a$", 1}};
  uint32_t a = site_a(), b = site_b();
  ca_report_block blocks[] = {block(1, 10, a), block(2, 20, b)};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char path[] = "/tmp/test_report_supp_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_true(write(fd, cases[i].rule, strlen(cases[i].rule)) > 0);
    close(fd);
    ca_config cfg;
    ca_config_defaults(&cfg);
    snprintf(cfg.suppressions, sizeof(cfg.suppressions), "%s", path);
    ca_leak_totals t = report(&cfg, CA_EVENT_EXIT, blocks, 2);
    unlink(path);
    take_log();
    if (t.suppressed_count != cases[i].suppressed)
      fail_msg("%s suppressed %llu, want %llu", cases[i].rule,
               (unsigned long long)t.suppressed_count,
               (unsigned long long)cases[i].suppressed);
  }
}

/* max_leaks prints the largest groups and sums up the rest. */
static void max_leaks_sums_the_rest(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  cfg.max_leaks = 1;
  ca_report_block blocks[] = {block(1, 100, 0), block(2, 300, 0),
                              block(3, 200, 0)};
  take_log();
  ca_leak_totals t = report(&cfg, CA_EVENT_EXIT, blocks, 3);
  const char *out = take_log();
  assert_int_equal(t.count, 3);
  assert_non_null(strstr(out, "300 bytes leaked in 1 allocation(s)"));
  assert_null(strstr(out, "200 bytes leaked"));
  assert_non_null(strstr(out, "... 2 more group(s) (300 bytes in 2 "
                              "allocations); max_leaks:0 shows all"));
  assert_non_null(strstr(out, "SUMMARY: 600 bytes leaked in 3 allocations"));
}

/* JSON: one line, every group with its numbers, frames and the summary. */
static void json_document(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  cfg.report_format = CA_REPORT_JSON;
  uint32_t a = site_a();
  ca_report_block blocks[] = {block(7, 1 << 20, a), block(8, 1 << 20, a)};
  blocks[1].call = "cuMemAllocManaged";
  take_log();
  report(&cfg, CA_EVENT_EXIT, blocks, 2);
  const char *out = take_log();
  assert_int_equal(count_of(out, "\n"), 1);
  assert_true(strncmp(out, "{\"tool\":\"cudalloc\"", 18) == 0);
  assert_non_null(strstr(out, "\"event\":\"exit\""));
  assert_int_equal(count_of(out, "\"call\":"), 2);
  assert_non_null(strstr(out, "\"call\":\"cuMemAllocManaged\""));
  assert_non_null(strstr(out, "\"function\":\"site_a\""));
  char line[32];
  snprintf(line, sizeof(line), "\"line\":%d", line_a);
  assert_non_null(strstr(out, line));
  assert_non_null(strstr(out, "\"summary\":{\"bytes\":2097152,\"count\":2,"));
  assert_non_null(strstr(out, "\"allocations\":[{\"seq\":7,"));
  assert_int_equal(count_of(out, "{"), count_of(out, "}"));
  assert_int_equal(count_of(out, "["), count_of(out, "]"));
}

/* Nothing live: one line at exit, nothing at a reset. */
static void nothing_leaked(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  take_log();
  report(&cfg, CA_EVENT_EXIT, NULL, 0);
  assert_string_equal(take_log(), "cudalloc: no device memory leaks (100 "
                                  "allocations, all freed)\n");
  report(&cfg, CA_EVENT_CONTEXT_RESET, NULL, 0);
  assert_string_equal(take_log(), "");
  report(&cfg, CA_EVENT_API, NULL, 0);
  assert_string_equal(take_log(), "cudalloc: no live device allocations\n");
}

/* Everything suppressed: the one line for nothing leaked says how much the
 * suppressions took (a framework's handles kept to the end, say). */
static void nothing_left_after_suppressions(void **state) {
  (void)state;
  char path[] = "/tmp/test_report_supp_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_true(write(fd, "leak:site_\n", 11) == 11);
  close(fd);
  ca_config cfg;
  ca_config_defaults(&cfg);
  snprintf(cfg.suppressions, sizeof(cfg.suppressions), "%s", path);
  uint32_t a = site_a();
  ca_report_block blocks[] = {block(1, 4096, a), block(2, 4096, a)};
  take_log();
  ca_leak_totals t = report(&cfg, CA_EVENT_EXIT, blocks, 2);
  unlink(path);
  assert_int_equal(t.count, 0);
  assert_string_equal(take_log(),
                      "cudalloc: no device memory leaks (100 allocations, "
                      "8192 bytes in 2 allocations suppressed)\n");
}

/* The summary comes before the leaks, with exact counts in JSON. */
static void stats_before_leaks(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  cudalloc_device_stats s = {.device = 2, .allocs = 10, .cache_hits = 9};
  s.reserved_bytes = (cudalloc_stat){.current = 3 << 20, .peak = 5 << 20,
                                     .total = 7 << 20};
  ca_report_block blocks[] = {block(1, 100, 0)};
  ca_report_input in = {.event = CA_EVENT_EXIT, .device = -1, .leaks = true,
                        .blocks = blocks, .nblocks = 1, .stats = &s,
                        .nstats = 1, .config = &cfg};
  take_log();
  ca_report(&in);
  const char *out = take_log();
  const char *summary = strstr(out, "device 2 memory summary");
  assert_non_null(summary);
  assert_true(summary < strstr(out, "leak report"));
  assert_non_null(strstr(out, "3.0 MiB"));
  assert_non_null(strstr(out, "cache hits 90.0%"));
  cfg.report_format = CA_REPORT_JSON;
  ca_report(&in);
  assert_non_null(strstr(take_log(), "\"reserved_bytes\":{\"current\":3145728,"
                                     "\"peak\":5242880,\"total\":7340032}"));
}

/* Whether `text` holds the number v, not as part of a longer one. */
static bool has_number(const char *text, uint64_t v) {
  char want[32];
  snprintf(want, sizeof(want), "%llu", (unsigned long long)v);
  for (const char *p = text; (p = strstr(p, want)) != NULL; p++) {
    bool before = p > text && p[-1] >= '0' && p[-1] <= '9';
    char after = p[strlen(want)];
    if (!before && !(after >= '0' && after <= '9') && after != '.')
      return true;
  }
  return false;
}

/* Every field of stats.h's lists reaches both summaries: a field added to
 * the struct and the lists is printed without another edit. Each gets a
 * value of its own, under 1 KiB so that byte counts print as numbers. */
static void every_statistic_is_printed(void **state) {
  (void)state;
  ca_config cfg;
  ca_config_defaults(&cfg);
  cudalloc_device_stats s = {.device = 3};
  stats_fill_distinct(&s, 101);
  ca_report_input in = {.event = CA_EVENT_EXIT, .device = -1, .stats = &s,
                        .nstats = 1, .config = &cfg};
  take_log();
  ca_report(&in);
  char *text = strdup(take_log()); /* take_log's buffer is reused */
  assert_non_null(text);
  cfg.report_format = CA_REPORT_JSON;
  ca_report(&in);
  const char *json = take_log();
  char want[128];
#define CHECK_TRIPLE(field, row, bytes)                                        \
  for (uint64_t k = 0; k < 3; k++)                                             \
    if (!has_number(text, s.field.current + k))                                \
      fail_msg("the text summary lacks %s (%llu): %s", #field,                 \
               (unsigned long long)(s.field.current + k), text);               \
  snprintf(want, sizeof(want),                                                 \
           "\"%s\":{\"current\":%llu,\"peak\":%llu,\"total\":%llu}", #field,     \
           (unsigned long long)s.field.current,                                \
           (unsigned long long)s.field.peak,                                   \
           (unsigned long long)s.field.total);                                 \
  if (!strstr(json, want))                                                     \
    fail_msg("the JSON summary lacks %s: %s", want, json);
#define CHECK(field)                                                           \
  if (!has_number(text, s.field))                                              \
    fail_msg("the text summary lacks %s (%llu): %s", #field,                   \
             (unsigned long long)s.field, text);                               \
  snprintf(want, sizeof(want), "\"%s\":%llu,", #field,                         \
           (unsigned long long)s.field);                                       \
  if (!strstr(json, want))                                                     \
    fail_msg("the JSON summary lacks %s: %s", want, json);
  CA_STATS_TRIPLES(CHECK_TRIPLE)
  CA_STATS_COUNTERS(CHECK)
  CA_STATS_LARGEST(CHECK)
  free(text);
}

/* The statistics' JSON object (cudalloc_get_stats_json) is cut as snprintf
 * cuts, always says its whole length, and fits CA_STATS_JSON_MAX at the
 * largest figures. */
static void stats_json_is_cut_as_snprintf_cuts(void **state) {
  (void)state;
  cudalloc_device_stats s;
  memset(&s, 0xff, sizeof(s));
  s.device = -1;
  s.fragmentation = -1.0;
  char whole[CA_STATS_JSON_MAX];
  size_t n = ca_stats_json(&s, whole, sizeof(whole));
  assert_true(n < sizeof(whole));
  assert_int_equal(strlen(whole), n);
  assert_int_equal(ca_stats_json(&s, NULL, 0), n);
  size_t lens[] = {1, 2, 40, n, n + 1};
  for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
    char cut[CA_STATS_JSON_MAX];
    memset(cut, 'x', sizeof(cut));
    assert_int_equal(ca_stats_json(&s, cut, lens[i]), n);
    size_t kept = lens[i] - 1 < n ? lens[i] - 1 : n;
    assert_int_equal(strlen(cut), kept);
    assert_memory_equal(cut, whole, kept);
    assert_int_equal(cut[lens[i]], 'x'); /* nothing past len */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(stacks_are_interned),
      cmocka_unit_test(groups_by_stack_largest_first),
      cmocka_unit_test(groups_by_size_without_stacks),
      cmocka_unit_test(suppressions_count_apart),
      cmocka_unit_test(suppression_patterns),
      cmocka_unit_test(max_leaks_sums_the_rest),
      cmocka_unit_test(json_document),
      cmocka_unit_test(nothing_leaked),
      cmocka_unit_test(nothing_left_after_suppressions),
      cmocka_unit_test(stats_before_leaks),
      cmocka_unit_test(every_statistic_is_printed),
      cmocka_unit_test(stats_json_is_cut_as_snprintf_cuts),
  };
  return cmocka_run_group_tests(tests, capture_log, release_log);
}
