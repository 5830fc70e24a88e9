/*
 * The fields of cudalloc_device_stats (include/cudalloc.h), listed once:
 * adding up the pools of a device (pool/entry.c), the JSON object of the
 * summary and of cudalloc_get_stats_json (stats.c) and the rows of the text
 * summary (report/summary.c) are generated from these lists, and a compile-time check below fails when the struct gains a
 * field the lists lack.
 *
 * CA_STATS_TRIPLES(X): cudalloc_stat fields, X(field, row, bytes): `row` is
 *   the text summary's row name; `bytes` whether it counts bytes.
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

#define CA_STATS_TRIPLES(X)                                                    \
  X(requested_bytes, "requested", 1)                                           \
  X(allocated_bytes, "allocated", 1)                                           \
  X(reserved_bytes, "reserved", 1)                                             \
  X(blocks, "blocks", 0)                                                       \
  X(segments, "segments", 0)

#define CA_STATS_COUNTERS(X)                                                   \
  X(allocs)                                                                    \
  X(frees)                                                                     \
  X(cache_hits)                                                                \
  X(backend_allocs)                                                            \
  X(backend_frees)                                                             \
  X(oom_retries)                                                               \
  X(gc_segments_released)                                                      \
  X(failed_allocs)                                                             \
  X(free_cached_bytes)                                                         \
  X(pending_free_bytes)

#define CA_STATS_LARGEST(X) X(largest_free_block)

/* The struct is exactly `device`, the lists in order, and fragmentation:
 * a field added to it and not to a list breaks the build here. */
#define CA__STATS_SIZE_T(field, row, bytes) +sizeof(cudalloc_stat)
#define CA__STATS_SIZE_U(field) +sizeof(uint64_t)
_Static_assert(offsetof(cudalloc_device_stats, requested_bytes) ==
                       sizeof(uint64_t) &&
                   offsetof(cudalloc_device_stats, fragmentation) ==
                       sizeof(uint64_t) CA_STATS_TRIPLES(CA__STATS_SIZE_T)
                           CA_STATS_COUNTERS(CA__STATS_SIZE_U)
                               CA_STATS_LARGEST(CA__STATS_SIZE_U) &&
                   sizeof(cudalloc_device_stats) ==
                       offsetof(cudalloc_device_stats, fragmentation) +
                           sizeof(double),
               "cudalloc_device_stats and the lists of stats.h disagree");
#undef CA__STATS_SIZE_T
#undef CA__STATS_SIZE_U

/* Writes `s` as one JSON object, every field by its name in the struct, in
 * the struct's order (byte and block counts as {"current","peak","total"}),
 * into buf: at most len bytes, NUL included, as snprintf. Returns the
 * object's whole length, NUL excluded: all of it is in buf when below len.
 * An object never takes more than CA_STATS_JSON_MAX bytes. */
#define CA_STATS_JSON_MAX 2048
size_t ca_stats_json(const cudalloc_device_stats *s, char *buf, size_t len);

#endif /* CA_STATS_H */
