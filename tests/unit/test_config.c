/*
 * CUDALLOC_CONF parsing: good strings set exactly the expected fields and
 * print nothing; each bad item prints exactly one line naming the key and the
 * value, and leaves its key alone while the rest of the string still applies.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "log_capture.h"

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "support/config.h"
#include "support/log.h"

#define MIB(n) ((uint64_t)(n) << 20)
#define UNLIMITED UINT64_MAX
/* The largest memory_limit_mb whose byte count fits in 64 bits. */
#define MIB_MAX "17592186044415"

/* A whole expected ca_config, named by field so that the struct's order does
 * not matter. */
#define CONF(gc, split, limit, on, verb, hlp)                                  \
  {.gc_threshold = (gc), .max_split_size = (split), .memory_limit = (limit),   \
   .enabled = (on), .verbose = (verb), .help = (hlp)}
#define DEFAULTS CONF(0, UNLIMITED, 0, true, 0, false)

/* A message line is never longer than this (prefix and newline included). */
#define LINE_MAX_LEN 640

/* ---- captured log ------------------------------------------------------ */

static int count_lines(const char *text) {
  int lines = 0;
  for (const char *p = text; (p = strchr(p, '\n')) != NULL; p++)
    lines++;
  return lines;
}

/* Every line is a whole, short config message. */
static void check_lines(const char *input, const char *text) {
  for (const char *line = text; *line;) {
    const char *end = strchr(line, '\n');
    assert_non_null(end);
    if (strncmp(line, "cudalloc: CUDALLOC_CONF: ", 25) != 0)
      fail_msg("'%s': line without the prefix: %.*s", input, (int)(end - line),
               line);
    if (end - line + 1 > LINE_MAX_LEN)
      fail_msg("'%s': line of %d bytes", input, (int)(end - line + 1));
    line = end + 1;
  }
}

static void expect_config(const char *input, const ca_config *got,
                          const ca_config *want) {
  if (got->gc_threshold != want->gc_threshold)
    fail_msg("'%s': gc_threshold %.17g, want %.17g", input, got->gc_threshold,
             want->gc_threshold);
  if (got->max_split_size != want->max_split_size)
    fail_msg("'%s': max_split_size %llu, want %llu", input,
             (unsigned long long)got->max_split_size,
             (unsigned long long)want->max_split_size);
  if (got->memory_limit != want->memory_limit)
    fail_msg("'%s': memory_limit %llu, want %llu", input,
             (unsigned long long)got->memory_limit,
             (unsigned long long)want->memory_limit);
  if (got->enabled != want->enabled || got->verbose != want->verbose ||
      got->help != want->help)
    fail_msg("'%s': enabled/verbose/help %d/%d/%d, want %d/%d/%d", input,
             got->enabled, got->verbose, got->help, want->enabled,
             want->verbose, want->help);
}

/* ---- tables ------------------------------------------------------------ */

typedef struct good_case {
  const char *input;
  ca_config want;
} good_case;

static const good_case good_cases[] = {
    {"", DEFAULTS},
    {"garbage_collection_threshold:0.8,max_split_size_mb:128",
     CONF(0.8, MIB(128), 0, true, 0, false)},
    {"  garbage_collection_threshold : 0.5 ,\tmax_split_size_mb:  64  ",
     CONF(0.5, MIB(64), 0, true, 0, false)},
    {",,max_split_size_mb:20,,", CONF(0, MIB(20), 0, true, 0, false)},
    {"verbose:1,", CONF(0, UNLIMITED, 0, true, 1, false)},
    {" , ,\n", DEFAULTS},
    {"max_split_size_mb:0128", CONF(0, MIB(128), 0, true, 0, false)},
    {"memory_limit_mb:0", DEFAULTS},
    {"memory_limit_mb:1024", CONF(0, UNLIMITED, MIB(1024), true, 0, false)},
    {"memory_limit_mb:" MIB_MAX,
     CONF(0, UNLIMITED, MIB(17592186044415u), true, 0, false)},
    {"max_split_size_mb:" MIB_MAX,
     CONF(0, MIB(17592186044415u), 0, true, 0, false)},
    {"garbage_collection_threshold:0.999", CONF(0.999, UNLIMITED, 0, true, 0, false)},
    {"garbage_collection_threshold:.25", CONF(0.25, UNLIMITED, 0, true, 0, false)},
    {"garbage_collection_threshold:0.0000001",
     CONF(0.0000001, UNLIMITED, 0, true, 0, false)},
    {"garbage_collection_threshold:0.500000000000000000000000001",
     CONF(0.5, UNLIMITED, 0, true, 0, false)},
    {"max_split_size_mb:100,max_split_size_mb:200",
     CONF(0, MIB(200), 0, true, 0, false)},
    {"enabled:0", CONF(0, UNLIMITED, 0, false, 0, false)},
    {"enabled:false", CONF(0, UNLIMITED, 0, false, 0, false)},
    {"enabled:false,enabled:TRUE", DEFAULTS},
    {"enabled:False,enabled:1,enabled:0", CONF(0, UNLIMITED, 0, false, 0, false)},
    /* The words people type for booleans, in any case. */
    {"enabled:off", CONF(0, UNLIMITED, 0, false, 0, false)},
    {"enabled:OFF,enabled:On", DEFAULTS},
    {"enabled:no", CONF(0, UNLIMITED, 0, false, 0, false)},
    {"enabled:No,enabled:YES", DEFAULTS},
    {"help:yes", CONF(0, UNLIMITED, 0, true, 0, true)},
    {"memory_limit_mb:2", CONF(0, UNLIMITED, MIB(2), true, 0, false)},
    /* A fraction as written: its double may round to 1, yet it is below. */
    {"garbage_collection_threshold:0.99999999999999999999",
     CONF(1.0 - 0x1p-53, UNLIMITED, 0, true, 0, false)},
    {"verbose:2", CONF(0, UNLIMITED, 0, true, 2, false)},
    {"verbose:2,verbose:0", DEFAULTS},
    {"help:0", DEFAULTS},
    {"help:true", CONF(0, UNLIMITED, 0, true, 0, true)},
    {"memory_limit_mb:100,max_split_size_mb:20,garbage_collection_threshold:0.8,"
     "enabled:1,verbose:2,help:false",
     CONF(0.8, MIB(20), MIB(100), true, 2, false)},
};

typedef struct bad_case {
  const char *input;
  int errors;
  ca_config want;
  const char *said[3]; /* text the printed lines must contain */
} bad_case;

static const bad_case bad_cases[] = {
    {"max_split_size_mb:10,memory_limit_mb:100", 1,
     CONF(0, UNLIMITED, MIB(100), true, 0, false),
     {"max_split_size_mb:10 is out of range", ">= 20",
      "max_split_size_mb stays unlimited"}},
    {"max_split_size_mb:12abc", 1, DEFAULTS,
     {"max_split_size_mb:12abc", "not a decimal number"}},
    {"max_split_size_mb:", 1, DEFAULTS, {"max_split_size_mb: has an empty value"}},
    {"max_split_size_mb : ", 1, DEFAULTS, {"max_split_size_mb: has an empty value"}},
    {"max_split_size_mb", 1, DEFAULTS, {"max_split_size_mb has no ':value'"}},
    {"foo", 1, DEFAULTS, {"'foo'", "known keys: garbage_collection_threshold"}},
    {"max_split:100", 1, DEFAULTS,
     {"unknown key 'max_split' in 'max_split:100'", "help:1 lists them"}},
    {":5", 1, DEFAULTS, {"unknown key '' in ':5'"}},
    {"Verbose:1", 1, DEFAULTS, {"unknown key 'Verbose'"}},
    {"a,b,,c", 3, DEFAULTS, {"'a'", "'b'", "'c'"}},
    {"max_split_size_mb:1.5", 1, DEFAULTS, {"max_split_size_mb:1.5 is not an integer"}},
    {"max_split_size_mb:20.0", 1, DEFAULTS, {"max_split_size_mb:20.0"}},
    {"max_split_size_mb:-20", 1, DEFAULTS, {"max_split_size_mb:-20 is out of range"}},
    {"max_split_size_mb:+20", 1, DEFAULTS, {"max_split_size_mb:+20"}},
    {"max_split_size_mb:0x20", 1, DEFAULTS, {"max_split_size_mb:0x20"}},
    {"max_split_size_mb:1 2", 1, DEFAULTS, {"max_split_size_mb:1 2"}},
    {"max_split_size_mb:1e3", 1, DEFAULTS, {"max_split_size_mb:1e3"}},
    {"memory_limit_mb:17592186044416", 1, DEFAULTS,
     {"memory_limit_mb:17592186044416 is out of range",
      "memory_limit_mb stays 0 (no limit)"}},
    {"memory_limit_mb:99999999999999999999999", 1, DEFAULTS,
     {"memory_limit_mb:99999999999999999999999 is out of range"}},
    {"memory_limit_mb:-1", 1, DEFAULTS, {"memory_limit_mb:-1 is out of range"}},
    {"garbage_collection_threshold:0", 1, DEFAULTS,
     {"garbage_collection_threshold:0 is out of range", "strictly between 0 and 1",
      "stays 0 (off)"}},
    {"garbage_collection_threshold:1", 1, DEFAULTS, {"threshold:1 is out of range"}},
    {"garbage_collection_threshold:1.0", 1, DEFAULTS, {"threshold:1.0 is out of range"}},
    {"garbage_collection_threshold:-0.5", 1, DEFAULTS, {"threshold:-0.5 is out of range"}},
    {"garbage_collection_threshold:nan", 1, DEFAULTS, {"threshold:nan"}},
    {"garbage_collection_threshold:inf", 1, DEFAULTS, {"threshold:inf"}},
    {"garbage_collection_threshold:1e-3", 1, DEFAULTS, {"threshold:1e-3"}},
    {"garbage_collection_threshold:0.5.5", 1, DEFAULTS, {"threshold:0.5.5"}},
    {"garbage_collection_threshold:.", 1, DEFAULTS, {"threshold:."}},
    {"garbage_collection_threshold:-", 1, DEFAULTS, {"threshold:-"}},
    /* The decimal comma of some locales splits the item in two. */
    {"garbage_collection_threshold:0,5,verbose:1", 2,
     CONF(0, UNLIMITED, 0, true, 1, false),
     {"garbage_collection_threshold:0 is out of range", "'5'"}},
    {"enabled:2", 1, DEFAULTS,
     {"enabled:2 is not a boolean", "0, 1, false, true, off, on, no or yes"}},
    {"enabled:maybe", 1, DEFAULTS, {"enabled:maybe is not a boolean"}},
    {"enabled:y", 1, DEFAULTS, {"enabled:y"}},
    {"enabled:0.0", 1, DEFAULTS, {"enabled:0.0"}},
    /* Under the smallest segment (2 MiB) nothing could be served. */
    {"memory_limit_mb:1", 1, DEFAULTS,
     {"memory_limit_mb:1 is out of range",
      "0 (no limit) or an integer number of MiB >= 2",
      "memory_limit_mb stays 0 (no limit)"}},
    {"garbage_collection_threshold:0.0000000000000000000000", 1, DEFAULTS,
     {"threshold:0.0000000000000000000000 is out of range"}},
    {"garbage_collection_threshold:1.00000000000000000001", 1, DEFAULTS,
     {"threshold:1.00000000000000000001 is out of range"}},
    {"garbage_collection_threshold:00.0", 1, DEFAULTS, {"threshold:00.0 is out"}},
    {"verbose:3", 1, DEFAULTS, {"verbose:3 is out of range", "0, 1 or 2"}},
    {"verbose:-1", 1, DEFAULTS, {"verbose:-1 is out of range"}},
    {"verbose:1:2", 1, DEFAULTS, {"verbose:1:2"}},
    {"help:2", 1, DEFAULTS, {"help:2 is not a boolean"}},
    /* A bad item later in the string reports the value it leaves in place. */
    {"max_split_size_mb:128,max_split_size_mb:10", 1,
     CONF(0, MIB(128), 0, true, 0, false), {"max_split_size_mb stays 128"}},
    {"garbage_collection_threshold:0.8,garbage_collection_threshold:2", 1,
     CONF(0.8, UNLIMITED, 0, true, 0, false), {"stays 0.8"}},
    {"verbose:2,verbose:9", 1, CONF(0, UNLIMITED, 0, true, 2, false),
     {"verbose stays 2"}},
    {"enabled:0,enabled:maybe", 1, CONF(0, UNLIMITED, 0, false, 0, false),
     {"enabled stays 0"}},
    /* A control character must not break the one-line message: it is
     * escaped, as is every byte of no printable character. */
    {"verbose:1\n2", 1, DEFAULTS, {"verbose:1\\x0a2"}},
    {"verbose:\x1b[31m", 1, DEFAULTS, {"verbose:\\x1b[31m is not"}},
    {"verbose:\xff\xc3\xa9", 1, DEFAULTS, {"verbose:\\xff\xc3\xa9 is not"}},
    {"verbose:\xc2\x9b", 1, DEFAULTS, {"verbose:\\xc2\\x9b is not"}},
};

/* ---- tests ------------------------------------------------------------- */

static void test_defaults(void **state) {
  (void)state;
  ca_config c, want = DEFAULTS;
  ca_config_defaults(&c);
  expect_config("(defaults)", &c, &want);
  assert_int_equal(ca_config_parse(&c, NULL), 0);
  expect_config("(NULL)", &c, &want);
  assert_string_equal(take_log(), "");
}

static void test_good_strings(void **state) {
  (void)state;
  take_log();
  for (size_t i = 0; i < sizeof(good_cases) / sizeof(good_cases[0]); i++) {
    const good_case *t = &good_cases[i];
    ca_config c;
    ca_config_defaults(&c);
    int errors = ca_config_parse(&c, t->input);
    const char *printed = take_log();
    if (errors != 0 || printed[0] != '\0')
      fail_msg("'%s': %d errors, printed: %s", t->input, errors, printed);
    expect_config(t->input, &c, &t->want);
  }
}

static void test_bad_strings(void **state) {
  (void)state;
  take_log();
  for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
    const bad_case *t = &bad_cases[i];
    ca_config c;
    ca_config_defaults(&c);
    int errors = ca_config_parse(&c, t->input);
    const char *printed = take_log();
    if (errors != t->errors || count_lines(printed) != t->errors)
      fail_msg("'%s': %d errors, want %d; printed: %s", t->input, errors,
               t->errors, printed);
    check_lines(t->input, printed);
    for (size_t j = 0; j < 3 && t->said[j]; j++)
      if (!strstr(printed, t->said[j]))
        fail_msg("'%s': printed no '%s': %s", t->input, t->said[j], printed);
    expect_config(t->input, &c, &t->want);
  }
}

/* The wording users see, in full, for the two commonest mistakes. */
static void test_message_wording(void **state) {
  (void)state;
  ca_config c;
  ca_config_defaults(&c);
  take_log();
  ca_config_parse(&c, "max_split_size_mb:10");
  assert_string_equal(
      take_log(),
      "cudalloc: CUDALLOC_CONF: max_split_size_mb:10 is out of range "
      "(accepted: an integer number of MiB >= 20); max_split_size_mb stays "
      "unlimited\n");
  ca_config_parse(&c, "max_split:100");
  assert_string_equal(
      take_log(),
      "cudalloc: CUDALLOC_CONF: unknown key 'max_split' in 'max_split:100' "
      "(known keys: garbage_collection_threshold, max_split_size_mb, "
      "memory_limit_mb, shared_limit, expandable_segments, enabled, verbose, help, leak_report, "
      "backtrace_depth, log_path, leak_exitcode, suppressions, report_format, "
      "max_leaks, stats, stats_signal, reuse_policy, growth_report, "
      "python_frames, leak_scan, report_reachable, trace_path, oom_snapshot, trace_allocations, "
      "publish_stats, memcheck; help:1 lists them)\n");
}

/* The report's keys: every kind of value they take, and their defaults. */
static void test_report_keys(void **state) {
  (void)state;
  ca_config c;
  ca_config_defaults(&c);
  assert_true(c.leak_report);
  assert_int_equal(c.backtrace_depth, 0);
  assert_string_equal(c.log_path, "");
  assert_int_equal(c.report_format, CA_REPORT_TEXT);
  assert_int_equal(c.reuse_policy, CA_REUSE_SETTING_SAFE);
  assert_true(c.leak_scan);
  assert_false(c.report_reachable);
  take_log();
  assert_int_equal(
      ca_config_parse(&c, "leak_report:0, backtrace_depth:16,"
                          "log_path: /tmp/run:%p.log ,leak_exitcode:23,"
                          "suppressions:leaks.supp,report_format:json,"
                          "max_leaks:5,stats:1,stats_signal:true,"
                          "reuse_policy:device_sync,leak_scan:0,"
                          "report_reachable:1"),
      0);
  assert_string_equal(take_log(), "");
  assert_false(c.leak_report);
  assert_int_equal(c.backtrace_depth, 16);
  assert_string_equal(c.log_path, "/tmp/run:%p.log");
  assert_int_equal(c.leak_exitcode, 23);
  assert_string_equal(c.suppressions, "leaks.supp");
  assert_int_equal(c.report_format, CA_REPORT_JSON);
  assert_int_equal(c.max_leaks, 5);
  assert_true(c.stats);
  assert_true(c.stats_signal);
  assert_int_equal(c.reuse_policy, CA_REUSE_SETTING_DEVICE_SYNC);
  assert_false(c.leak_scan);
  assert_true(c.report_reachable);
  assert_int_equal(ca_config_parse(&c, "reuse_policy:immediate"), 0);
  assert_int_equal(c.reuse_policy, CA_REUSE_SETTING_IMMEDIATE);
  assert_int_equal(ca_config_parse(&c, "reuse_policy:sometimes"), 1);
  assert_non_null(strstr(take_log(), "reuse_policy:sometimes is not one of "
                                     "the choices (accepted: safe, immediate "
                                     "or device_sync); reuse_policy stays "
                                     "immediate"));
}

/* A bad report key keeps its value and says what is accepted. */
static void test_report_keys_refused(void **state) {
  (void)state;
  static char long_path[CA_CONFIG_PATH_MAX + 16];
  ca_config c;
  ca_config_defaults(&c);
  take_log();
  assert_int_equal(ca_config_parse(&c, "report_format:xml"), 1);
  assert_string_equal(take_log(),
                      "cudalloc: CUDALLOC_CONF: report_format:xml is not one "
                      "of the choices (accepted: text or json); "
                      "report_format stays text\n");
  assert_int_equal(ca_config_parse(&c, "backtrace_depth:65,leak_exitcode:256"),
                   2);
  assert_non_null(strstr(take_log(), "leak_exitcode:256 is out of range"));
  strcpy(long_path, "log_path:/");
  memset(long_path + strlen(long_path), 'a', CA_CONFIG_PATH_MAX);
  assert_int_equal(ca_config_parse(&c, "log_path:/first"), 0);
  assert_int_equal(ca_config_parse(&c, long_path), 1);
  char too_long[128];
  snprintf(too_long, sizeof(too_long),
           "is too long (%d bytes; at most %d)", CA_CONFIG_PATH_MAX + 1,
           CA_CONFIG_PATH_MAX - 1);
  assert_non_null(strstr(take_log(), too_long));
  assert_string_equal(c.log_path, "/first");
  /* A path holding a newline is echoed escaped when a later item about
   * the same key is refused: each message stays one line. */
  assert_int_equal(ca_config_parse(&c, "log_path:/a\nb,log_path:"), 1);
  const char *said = take_log();
  assert_non_null(strstr(said, "log_path stays /a\\x0ab\n"));
  assert_int_equal(count_lines(said), 1);
  assert_int_equal(c.backtrace_depth, 0);
  assert_int_equal(c.leak_exitcode, 0);
}

/* A flood of bad items: the first five named, the rest counted in one
 * line; the good items among them still apply. */
static void test_flood_of_bad_items(void **state) {
  (void)state;
  static char text[4096];
  size_t len = 0;
  for (int i = 0; i < 40; i++)
    len += (size_t)snprintf(text + len, sizeof(text) - len, "%sbad%d",
                            i ? "," : "", i);
  snprintf(text + len, sizeof(text) - len, ",verbose:2");
  ca_config c, want = CONF(0, UNLIMITED, 0, true, 2, false);
  ca_config_defaults(&c);
  take_log();
  assert_int_equal(ca_config_parse(&c, text), 40);
  const char *printed = take_log();
  assert_int_equal(count_lines(printed), 6);
  check_lines("flood", printed);
  assert_non_null(strstr(printed, "'bad4'"));
  assert_null(strstr(printed, "'bad5'"));
  assert_non_null(strstr(printed, "CUDALLOC_CONF: ... and 35 more bad items"));
  expect_config("flood", &c, &want);
}

/* Huge user text is cut, so that one bad item is still one short line. */
static void test_huge_text(void **state) {
  (void)state;
  static char text[100 * 1024];
  ca_config c, want = DEFAULTS;
  take_log();
  for (size_t at = 0; at < 2; at++) {
    /* First a huge value of a known key, then a huge unknown key. */
    const char *head = at == 0 ? "max_split_size_mb:" : "";
    size_t len = strlen(head);
    memcpy(text, head, len);
    memset(text + len, at == 0 ? '9' : 'k', sizeof(text) - len - 1);
    text[sizeof(text) - 1] = '\0';
    ca_config_defaults(&c);
    assert_int_equal(ca_config_parse(&c, text), 1);
    const char *printed = take_log();
    assert_int_equal(count_lines(printed), 1);
    check_lines(head, printed);
    assert_non_null(strstr(printed, "..."));
    expect_config(head, &c, &want);
  }
}

/* A program may set a locale whose decimal separator is ','; the threshold
 * is still read with '.'. Skipped where no such locale is installed. */
static void test_locale_independent(void **state) {
  (void)state;
  if (!setlocale(LC_NUMERIC, "de_DE.UTF-8") &&
      !setlocale(LC_NUMERIC, "fr_FR.UTF-8"))
    skip();
  ca_config c;
  ca_config_defaults(&c);
  take_log();
  int errors = ca_config_parse(
      &c, "garbage_collection_threshold:0.8,garbage_collection_threshold:7");
  const char *printed = take_log();
  setlocale(LC_NUMERIC, "C");
  assert_int_equal(errors, 1);
  assert_true(c.gc_threshold == 0.8);
  assert_non_null(strstr(printed, "stays 0.8"));
}

/* PyTorch's spelling works as is: users copy it from PYTORCH_CUDA_ALLOC_CONF. */
static void test_expandable_segments(void **state) {
  (void)state;
  ca_config c;
  ca_config_defaults(&c);
  assert_false(c.expandable_segments);
  take_log();
  assert_int_equal(ca_config_parse(&c, "expandable_segments:True"), 0);
  assert_string_equal(take_log(), "");
  assert_true(c.expandable_segments);
  assert_int_equal(ca_config_parse(&c, "expandable_segments:2"), 1);
  assert_non_null(strstr(take_log(), "expandable_segments:2"));
  assert_true(c.expandable_segments);
  assert_int_equal(ca_config_parse(&c, "expandable_segments:False"), 0);
  assert_false(c.expandable_segments);
}

/* shared_limit takes a name, and only beside memory_limit_mb, the cap it
 * shares; its name is the file its region lies in, so nothing but a plain
 * name is taken. */
static void test_shared_limit(void **state) {
  (void)state;
  ca_config c;
  ca_config_defaults(&c);
  assert_string_equal(c.shared_limit, "");
  take_log();
  assert_int_equal(ca_config_parse(&c, "memory_limit_mb:64,shared_limit:train-1.a_b"), 0);
  assert_string_equal(take_log(), "");
  assert_string_equal(c.shared_limit, "train-1.a_b");
  static const char *const bad[] = {"shared_limit:../x", "shared_limit:.hidden",
                                    "shared_limit:a/b", "shared_limit:a b"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ca_config_defaults(&c);
    char text[128];
    snprintf(text, sizeof(text), "memory_limit_mb:64,%s", bad[i]);
    assert_int_equal(ca_config_parse(&c, text), 1);
    const char *printed = take_log();
    check_lines(text, printed);
    if (!strstr(printed, "is not a name") || !strstr(printed, "letters, digits"))
      fail_msg("'%s': %s", text, printed);
    assert_string_equal(c.shared_limit, "");
  }
  ca_config_defaults(&c);
  assert_int_equal(ca_config_parse(&c, "shared_limit:train"), 1);
  assert_string_equal(
      take_log(),
      "cudalloc: CUDALLOC_CONF: shared_limit:train has no memory_limit_mb to "
      "share (accepted: a group name, with memory_limit_mb set: the group's "
      "cap per device); shared_limit stays (none)\n");
  assert_string_equal(c.shared_limit, "");
  /* Past five bad items, it is counted with the rest, not named. */
  ca_config_defaults(&c);
  assert_int_equal(ca_config_parse(&c, "a,b,c,d,e,shared_limit:train"), 6);
  const char *printed = take_log();
  assert_int_equal(count_lines(printed), 6);
  assert_non_null(strstr(printed, "... and 1 more bad items"));
  assert_null(strstr(printed, "shared_limit:train has no"));
}

static void test_help(void **state) {
  (void)state;
#define KEY_NAME(field, key, ...) #key,
  static const char *const keys[] = {CA_CONFIG_KEYS(KEY_NAME)};
#undef KEY_NAME
  const size_t nkeys = sizeof(keys) / sizeof(keys[0]);
  take_log();
  ca_config_print_help();
  const char *printed = take_log();
  assert_int_equal(count_lines(printed), 1 + (int)nkeys);
  assert_non_null(strstr(printed, "key:value"));
  /* Each key starts its own line, and the default column lines up. */
  long column = -1;
  for (size_t i = 0; i < nkeys; i++) {
    char start[64];
    snprintf(start, sizeof(start), "\ncudalloc:   %s ", keys[i]);
    const char *line = strstr(printed, start);
    if (!line)
      fail_msg("help has no line for %s: %s", keys[i], printed);
    const char *value = line + strlen(start);
    while (*value == ' ')
      value++;
    if (column >= 0)
      assert_int_equal(value - line, column);
    column = value - line;
  }
  /* The meanings are Markdown in the rows, plain on the terminal. */
  assert_null(strchr(printed, '`'));
}

/* README.md's table of settings is the rows of config.h, row for row, in
 * their order: a key added to the rows and not to the README (or a meaning
 * edited in one place only) fails here, printing the row to paste. */
static void test_readme_table_is_the_rows(void **state) {
  (void)state;
  FILE *f = fopen(CA_README_PATH, "r");
  assert_non_null(f);
  static char line[4096];
  char want[4096];
  size_t i = 0, rows = 0;
  bool inside = false;
  while (fgets(line, sizeof(line), f)) {
    line[strcspn(line, "\n")] = '\0';
    if (strcmp(line, "| key | default | accepted | meaning |") == 0) {
      inside = true;
      continue;
    }
    if (inside && line[0] != '|')
      break;
    if (!inside || strncmp(line, "| ---", 5) == 0)
      continue;
    rows++;
    if (!ca_config_doc_row(i, want, sizeof(want)))
      fail_msg("README.md has a settings row past the last key: %s", line);
    if (strcmp(line, want) != 0)
      fail_msg("README.md's settings row %zu differs from config.h's row;\n"
               "README: %s\nwanted: %s", i + 1, line, want);
    i++;
  }
  fclose(f);
  if (ca_config_doc_row(i, want, sizeof(want)))
    fail_msg("README.md lacks the row of a key; add:\n%s", want);
  assert_true(rows > 0);
}

/* ca_config_get reads the environment once; CUDALLOC_CONF_X is another
 * variable and must not be mistaken for it. */
static void test_get_reads_environment_once(void **state) {
  (void)state;
  assert_int_equal(setenv("CUDALLOC_CONF_X", "verbose:1", 1), 0);
  assert_int_equal(
      setenv("CUDALLOC_CONF", " verbose:2, help:1,max_split_size_mb:64", 1), 0);
  take_log();
  const ca_config *c = ca_config_get();
  ca_config want = CONF(0, MIB(64), 0, true, 2, true);
  expect_config("environment", c, &want);
  const char *printed = take_log();
  assert_non_null(strstr(printed, "max_split_size_mb"));
  assert_int_equal(count_lines(printed), 28);

  assert_int_equal(setenv("CUDALLOC_CONF", "verbose:0", 1), 0);
  assert_ptr_equal(ca_config_get(), c);
  expect_config("environment, again", c, &want);
  assert_string_equal(take_log(), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_good_strings),
      cmocka_unit_test(test_bad_strings),
      cmocka_unit_test(test_message_wording),
      cmocka_unit_test(test_report_keys),
      cmocka_unit_test(test_report_keys_refused),
      cmocka_unit_test(test_flood_of_bad_items),
      cmocka_unit_test(test_huge_text),
      cmocka_unit_test(test_locale_independent),
      cmocka_unit_test(test_expandable_segments),
      cmocka_unit_test(test_shared_limit),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_readme_table_is_the_rows),
      cmocka_unit_test(test_get_reads_environment_once),
  };
  return cmocka_run_group_tests(tests, capture_log, release_log);
}
