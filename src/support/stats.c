/*
 * A device's statistics as one JSON object (stats.h), generated from the
 * lists of stats.h: the report's JSON summary and cudalloc_get_stats_json
 * write the same object.
 */
#include "support/stats.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

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
