/*
 * Live device memory by allocation site: for each stack id (stacks.h), the
 * bytes and allocations live now. From it come two answers a leak report
 * at exit cannot give, since a Python program frees everything before it
 * exits:
 *   - growth: with growth_report:1, a light snapshot of every site is
 *     taken every so many allocations (or at each cudalloc_mark()), and a
 *     site whose live bytes kept growing across many consecutive snapshots
 *     is kept with that run, freed or not at the end;
 *   - the peak: when the live bytes of all sites together peaked, and
 *     which sites held the most at that moment.
 * Only allocations with a stack are counted (backtrace_depth > 0, or
 * growth_report:1), so without stacks this costs nothing.
 *
 * Every function is thread-safe, takes no lock that waits on the
 * allocation path (a snapshot is taken by the thread that finds its lock
 * free), and calls nothing above it: no CUDA, not the program's malloc
 * (memory comes from mmap). A forked child starts empty.
 */
#ifndef CA_SITES_H
#define CA_SITES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Frames kept per allocation when growth_report needs stacks and
 * backtrace_depth asks for none. */
#define CA_SITES_DEPTH 16
/* Sites listed at the peak. */
#define CA_SITES_TOP 5
/* Consecutive snapshots a growing run must span to be reported. */
#define CA_SITES_GROWTH_RUN 8

/* Counts `bytes` allocated (or, for ca_sites_free, freed) at site `stack`;
 * stack 0 (none) is not counted. */
void ca_sites_alloc(uint32_t stack, uint64_t bytes);
void ca_sites_free(uint32_t stack, uint64_t bytes);

/* Whether snapshots are taken: off until set (growth_report). */
void ca_sites_set_growth(bool on);

/* A snapshot now (cudalloc_mark: one per iteration, say). From the first
 * mark on, snapshots are taken at marks only. */
void ca_sites_mark(void);

typedef struct ca_site_bytes {
  uint32_t stack;
  uint64_t bytes, count;
} ca_site_bytes;

/* The peak of live bytes, and who held them. The sites were read when
 * the live bytes last stood within 1/64 of a new peak, at `shown_bytes`. */
typedef struct ca_sites_peak {
  uint64_t bytes;      /* the most live at once */
  uint64_t at_ns;      /* when (CLOCK_MONOTONIC) */
  uint64_t allocation; /* allocations counted when it peaked */
  uint64_t shown_bytes;
  size_t nsites;
  ca_site_bytes sites[CA_SITES_TOP]; /* largest first */
} ca_sites_peak;

/* The peak so far; bytes 0 when nothing was counted. */
void ca_sites_peak_get(ca_sites_peak *out);

/* A site's longest run of growth: consecutive snapshots over which its
 * live bytes never fell and rose at least every other time. */
typedef struct ca_site_growth {
  uint32_t stack;
  uint64_t from_bytes, to_bytes; /* live at the run's first and last snapshot */
  uint32_t snapshots, rises;     /* snapshots in the run, rises among them */
  uint64_t from_alloc, to_alloc; /* allocations counted at those snapshots */
} ca_site_growth;

/* The sites that grew over CA_SITES_GROWTH_RUN snapshots or more, most
 * bytes grown first, at most `max` into out. Returns how many grew. Also
 * says how many snapshots were taken, when `snapshots` is not NULL. */
size_t ca_sites_growth(ca_site_growth *out, size_t max, uint64_t *snapshots);

#endif /* CA_SITES_H */
