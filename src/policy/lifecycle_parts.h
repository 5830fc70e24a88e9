/*
 * What the files of the library's life in a process (lifecycle.h) share:
 * reports.c gathers and prints a report, exit.c prints it at exit,
 * watcher.c runs the watcher thread, ticks.c writes what the watcher
 * writes at each tick. Only those files include it.
 */
#ifndef CA_LIFECYCLE_PARTS_H
#define CA_LIFECYCLE_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "cudalloc.h"
#include "policy/lifecycle.h"

/* When the library was loaded, about when the program started
 * (CLOCK_MONOTONIC): reports and the timeline count time from it. */
extern uint64_t ca_lifecycle_start_ns;

/* With memcheck, the checks at exit are run by a handler registered now
 * (the process's first use of device memory), before the runtime and the
 * driver take themselves down (exit.c). */
void ca_lifecycle_memcheck_at_exit(void);

/* Every device's statistics into out; returns how many devices have pools;
 * adds up the allocations served into *allocs. */
size_t ca_lifecycle_gather_stats(cudalloc_device_stats *out, uint64_t *allocs);

/* A report of every device now (ca_lifecycle_report); returns what it
 * counted as leaked, for leak_exitcode. */
ca_leak_totals ca_lifecycle_report_all(ca_report_event event, bool leaks,
                                       bool stats,
                                       const ca_reach_roots *roots);

/* A forked child frees the report lock (the thread that held it is not in
 * the child). */
void ca_lifecycle_report_lock_reset(void);

/* This process's figures, and the growing site, into its file for
 * `cudalloc top`. */
void ca_lifecycle_publish_tick(const cudalloc_device_stats *all, size_t n);

/* The timeline's counters, and an instant for each out-of-memory retry and
 * collection since the last tick. */
void ca_lifecycle_trace_tick(const cudalloc_device_stats *all, size_t n);

/* shared_limit: answers the group's asks for room; with `look` (every
 * 100 ms), also takes back dead processes' bookings and says what this one
 * caches. */
void ca_lifecycle_group_tick(bool look);

#endif /* CA_LIFECYCLE_PARTS_H */
