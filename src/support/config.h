/*
 * CUDALLOC_CONF: the library's settings.
 *
 * Syntax follows PyTorch's allocator variable: comma-separated key:value
 * pairs, e.g. "garbage_collection_threshold:0.8,max_split_size_mb:128".
 * Every key lives in one table (config.c) with its default and a doc string;
 * `help:1` prints that table. A bad item prints one line naming the key, the
 * value and what is accepted, and that key keeps its default.
 *
 * Parsing never allocates and reads `environ` directly, so it is safe inside a
 * preload constructor, before the C library has finished starting up.
 */
#ifndef CA_CONFIG_H
#define CA_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* The longest path log_path and suppressions accept, in bytes. */
#define CA_CONFIG_PATH_MAX 512

/* report_format's values. */
typedef enum ca_report_format {
  CA_REPORT_TEXT,
  CA_REPORT_JSON,
} ca_report_format;

/* reuse_policy's values. */
typedef enum ca_reuse_setting {
  CA_REUSE_SETTING_SAFE,
  CA_REUSE_SETTING_IMMEDIATE,
  CA_REUSE_SETTING_DEVICE_SYNC,
} ca_reuse_setting;

typedef struct ca_config {
  double gc_threshold;     /* garbage_collection_threshold; 0 = off */
  uint64_t max_split_size; /* max_split_size_mb in bytes; UINT64_MAX = off */
  uint64_t memory_limit;   /* memory_limit_mb in bytes; 0 = no limit */
  bool enabled;            /* enabled; false = pure pass-through */
  int verbose;             /* verbose; 0 = quiet, 1 = events, 2 = chatty */
  bool help;               /* help; print the key table at start */
  bool leak_report;        /* leak_report; the report at exit */
  int backtrace_depth;     /* backtrace_depth; frames kept per allocation */
  char log_path[CA_CONFIG_PATH_MAX];     /* log_path; "" = stderr */
  int leak_exitcode;                     /* leak_exitcode; 0 = off */
  char suppressions[CA_CONFIG_PATH_MAX]; /* suppressions; "" = none */
  int report_format;       /* report_format; a ca_report_format */
  int max_leaks;           /* max_leaks; groups printed, 0 = all */
  bool stats;              /* stats; the memory summary at exit */
  bool stats_signal;       /* stats_signal; the summary on SIGUSR1 */
  int reuse_policy;        /* reuse_policy; a ca_reuse_setting */
  bool growth_report;      /* growth_report; sites that kept growing */
  bool python_frames;      /* python_frames; Python lines in stacks */
  bool leak_scan;          /* leak_scan; lost vs still reachable */
  bool expandable_segments; /* expandable_segments */
  bool report_reachable;   /* report_reachable; list reachable ones */
  char trace_path[CA_CONFIG_PATH_MAX];   /* trace_path; "" = none */
  bool trace_allocations;  /* trace_allocations; slices per allocation */
  bool publish_stats;      /* publish_stats; figures for cudalloc top */
} ca_config;

/* Fills *c with every key's default. */
void ca_config_defaults(ca_config *c);

/* Applies a CUDALLOC_CONF string to *c, item by item. Each bad item is
 * reported with ca_log and leaves its key at the value it had. Returns the
 * number of bad items. `text` may be NULL (nothing to apply). */
int ca_config_parse(ca_config *c, const char *text);

/* The process's settings, read from CUDALLOC_CONF in environ once
 * (thread-safe): as the library loads when the variable is set, else on
 * first use. Prints the help table when help:1 is set. The hooks ask at
 * every call: once read, the answer is a load, inlined. */
extern ca_config ca_config_settings;
extern atomic_bool ca_config_ready;
const ca_config *ca_config_load(void);
static inline const ca_config *ca_config_get(void) {
  if (__builtin_expect(
          atomic_load_explicit(&ca_config_ready, memory_order_acquire), 1))
    return &ca_config_settings;
  return ca_config_load();
}

/* Prints every key, its default and its meaning, one per line. */
void ca_config_print_help(void);

#endif /* CA_CONFIG_H */
