/*
 * The fields of cudalloc_device_stats, as three lists drawn from the one
 * list of include/cudalloc.h (CUDALLOC_DEVICE_STATS): adding up the pools
 * of a device (pool/entry.c), the JSON object of the summary and of
 * cudalloc_get_stats_json (stats.c) and the rows of the text summary
 * (report/summary.c) are generated from these.
 *
 * CA_STATS_TRIPLES(X): cudalloc_stat fields, X(field, row, bytes).
 * CA_STATS_COUNTERS(X): uint64_t fields the pools' figures add up to, X(field).
 * CA_STATS_LARGEST(X): uint64_t fields whose device figure is the pools'
 *   largest, X(field).
 * `device` and `fragmentation` (derived from the others) are not summed.
 */
#ifndef CA_STATS_H
#define CA_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "cudalloc.h"

#define CA__STATS_NONE1(field)
#define CA__STATS_NONE3(field, row, bytes)
#define CA_STATS_TRIPLES(X)                                                    \
  CUDALLOC_DEVICE_STATS(X, CA__STATS_NONE1, CA__STATS_NONE1)
#define CA_STATS_COUNTERS(X)                                                   \
  CUDALLOC_DEVICE_STATS(CA__STATS_NONE3, X, CA__STATS_NONE1)
#define CA_STATS_LARGEST(X)                                                    \
  CUDALLOC_DEVICE_STATS(CA__STATS_NONE3, CA__STATS_NONE1, X)

/* Writes `s` as one JSON object, every field by its name in the struct, in
 * the struct's order (byte and block counts as {"current","peak","total"}),
 * into buf: at most len bytes, NUL included, as snprintf. Returns the
 * object's whole length, NUL excluded: all of it is in buf when below len.
 * An object never takes more than CA_STATS_JSON_MAX bytes. */
#define CA_STATS_JSON_MAX 2048
size_t ca_stats_json(const cudalloc_device_stats *s, char *buf, size_t len);

/* What an out-of-memory line says of the memory held, formatted: in use,
 * cached (free and pending), the largest free block, and `limit` ("none"
 * when 0). */
typedef struct ca_held_text {
  char used[32], cached[32], largest[32], limit[32];
} ca_held_text;
void ca_stats_held_text(const cudalloc_device_stats *s, uint64_t limit,
                        ca_held_text *t);

#endif /* CA_STATS_H */
