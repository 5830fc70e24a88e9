/*
 * Statistics with a value of their own in every field of stats.h's lists,
 * for the tests that check each field is summed and printed.
 */
#ifndef CA_STATS_FILL_H
#define CA_STATS_FILL_H

#include <stdint.h>

#include "support/stats.h"

/* Gives the fields values from `first` up, 10 apart (a triple's current,
 * peak and total: v, v + 1, v + 2), in the lists' order. */
static inline void stats_fill_distinct(cudalloc_device_stats *s,
                                       uint64_t first) {
  uint64_t v = first;
#define CA__FILL_TRIPLE(field, row, bytes)                                     \
  s->field = (cudalloc_stat){v, v + 1, v + 2};                                 \
  v += 10;
#define CA__FILL(field)                                                        \
  s->field = v;                                                                \
  v += 10;
  CA_STATS_TRIPLES(CA__FILL_TRIPLE)
  CA_STATS_COUNTERS(CA__FILL)
  CA_STATS_LARGEST(CA__FILL)
#undef CA__FILL_TRIPLE
#undef CA__FILL
}

#endif /* CA_STATS_FILL_H */
