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

#include <stdbool.h>
#include <stdint.h>

typedef struct ca_config {
  double gc_threshold;     /* garbage_collection_threshold; 0 = off */
  uint64_t max_split_size; /* max_split_size_mb in bytes; UINT64_MAX = off */
  uint64_t memory_limit;   /* memory_limit_mb in bytes; 0 = no limit */
  bool enabled;            /* enabled; false = pure pass-through */
  int verbose;             /* verbose; 0 = quiet, 1 = events, 2 = chatty */
  bool help;               /* help; print the key table at start */
} ca_config;

/* Fills *c with every key's default. */
void ca_config_defaults(ca_config *c);

/* Applies a CUDALLOC_CONF string to *c, item by item. Each bad item is
 * reported with ca_log and leaves its key at the value it had. Returns the
 * number of bad items. `text` may be NULL (nothing to apply). */
int ca_config_parse(ca_config *c, const char *text);

/* The process's settings, read from CUDALLOC_CONF in environ on first use
 * (thread-safe, once). Prints the help table when help:1 is set. */
const ca_config *ca_config_get(void);

/* Prints every key, its default and its meaning, one per line. */
void ca_config_print_help(void);

#endif /* CA_CONFIG_H */
