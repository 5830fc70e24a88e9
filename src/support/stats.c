/*
 * A device's statistics as one JSON object (stats.h), generated from the
 * lists of stats.h: the report's JSON summary and cudalloc_get_stats_json
 * write the same object; and the figures an out-of-memory line gives.
 */
#include "support/stats.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "support/log.h"

/* Appends to buf as snprintf would at offset *at, counting what did not
 * fit too, so the caller learns the whole length. */
static void ca__json_append(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void ca__json_append(char *buf, size_t len, size_t *at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = *at < len ? buf + *at : NULL;
  int n = vsnprintf(dst, dst ? len - *at : 0, fmt, ap);
  va_end(ap);
  if (n > 0)
    *at += (size_t)n;
}

size_t ca_stats_json(const cudalloc_device_stats *s, char *buf, size_t len) {
  size_t at = 0;
  if (len > 0)
    buf[0] = '\0';
  ca__json_append(buf, len, &at, "{\"device\":%d,", s->device);
#define CA__TRIPLE(field, row, bytes)                                          \
  ca__json_append(buf, len, &at,                                                    \
             "\"" #field "\":{\"current\":%" PRIu64 ",\"peak\":%" PRIu64        \
             ",\"total\":%" PRIu64 "},",                                       \
             s->field.current, s->field.peak, s->field.total);
#define CA__COUNT(field)                                                       \
  ca__json_append(buf, len, &at, "\"" #field "\":%" PRIu64 ",", s->field);
  CA_STATS_TRIPLES(CA__TRIPLE)
  CA_STATS_COUNTERS(CA__COUNT)
  CA_STATS_LARGEST(CA__COUNT)
#undef CA__TRIPLE
#undef CA__COUNT
  ca__json_append(buf, len, &at, "\"fragmentation\":%.6f}", s->fragmentation);
  return at;
}

void ca_stats_held_text(const cudalloc_device_stats *s, uint64_t limit,
                        ca_held_text *t) {
  ca_format_bytes(t->used, sizeof(t->used), s->allocated_bytes.current);
  ca_format_bytes(t->cached, sizeof(t->cached),
                  s->free_cached_bytes + s->pending_free_bytes);
  ca_format_bytes(t->largest, sizeof(t->largest), s->largest_free_block);
  if (limit)
    ca_format_bytes(t->limit, sizeof(t->limit), limit);
  else
    snprintf(t->limit, sizeof(t->limit), "none");
}
