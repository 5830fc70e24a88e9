/*
 * The report at exit (see lifecycle.h).
 *
 * It runs from an on_exit handler registered when the library is loaded,
 * before the program's own handlers: handlers run in reverse, so ours runs
 * after the program's (C++ static destructors included) have freed what
 * they free, and on_exit, unlike atexit, tells it the exit status that
 * leak_exitcode needs.
 */
#include "policy/lifecycle_parts.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "concerns/memcheck.h"
#include "support/config.h"
#include "support/lock.h"
#include "support/log.h"
#include "timeline/publish.h"
#include "leaks/reach.h"
#include "registry/registry.h"
#include "timeline/trace.h"
#include "leaks/track.h"

uint64_t ca_lifecycle_start_ns;

/* The process that printed the exit report: once per process, and a forked
 * child (another pid) prints its own. */
static atomic_int ca__exit_reported_by;

/* memcheck at exit: the quarantine emptied and checked, then the red zone
 * of every block still live, then one line of what was found, once.
 * Returns the findings, which count as leaks do for leak_exitcode. */
static atomic_int ca__memcheck_done_by;

static uint64_t ca__memcheck_exit(void) {
  if (!ca_config_get()->memcheck)
    return 0;
  if (atomic_exchange(&ca__memcheck_done_by, (int)getpid()) == (int)getpid()) {
    ca_memcheck_totals t = ca_memcheck_totals_now();
    return t.overflows + t.after_free;
  }
  ca_memcheck_drain();
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(-1, pools, CA_REGISTRY_MAX_POOLS);
  for (size_t i = 0; i < n; i++)
    ca_memcheck_check_pool(pools[i]);
  ca_memcheck_totals t = ca_memcheck_totals_now();
  ca_report_memcheck_totals(t.checked, t.overflows, t.after_free);
  return t.overflows + t.after_free;
}

static void ca__at_exit(int status, void *arg) {
  ca_reach_roots roots;
  CA_REACH_ROOTS_HERE(&roots);
  (void)arg;
  ca_publish_close(); /* takes no lock the exiting thread could hold */
  if (ca_locks_held == 0 && __atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE)) {
    cudalloc_device_stats all[CUDALLOC_MAX_DEVICES];
    uint64_t allocs = 0;
    ca_lifecycle_trace_tick(all, ca_lifecycle_gather_stats(all, &allocs)); /* the last figures */
  }
  ca_trace_finish(ca_report_stack_lines);
  if (ca_locks_held > 0) {
    /* exit() from a signal handler that interrupted this thread inside
     * the library: anything that takes a lock (the report, even the
     * question below) could wait for one this thread holds. */
    if (ca_config_get()->leak_report)
      ca_log("exit during a device-memory call on the same thread (from a "
             "signal handler?): the leak report is skipped");
    return;
  }
  /* Settings are not even read in a process that never used device
   * memory: a bad CUDALLOC_CONF must not make it print. */
  if (!ca_registry_in_use() && ca_track_total() == 0)
    return;
  int pid = (int)getpid();
  if (atomic_exchange(&ca__exit_reported_by, pid) == pid)
    return;
  const ca_config *cfg = ca_config_get();
  uint64_t found = ca__memcheck_exit();
  if (cfg->leak_report || cfg->stats || cfg->growth_report) {
    ca_leak_totals t = ca_lifecycle_report_all(
        CA_EVENT_EXIT, cfg->leak_report, cfg->stats, &roots);
    if (cfg->leak_report)
      found += t.count;
  }
  if (cfg->leak_exitcode != 0 && status == 0 && found > 0) {
    /* Like LeakSanitizer's exitcode, the process ends here: only _exit can
     * change a status once exit has begun. The program's buffered output
     * is written first, since exit would have written it. */
    fflush(NULL);
    _exit(cfg->leak_exitcode);
  }
}

/* The checks need the driver, which the runtime and the driver take down
 * from handlers registered at their start (the static runtime releases
 * its context, the driver deinitializes): this one, registered at the
 * process's first use of device memory, after theirs, runs before them. */
static void ca__memcheck_at_exit(void) {
  if (ca_locks_held == 0)
    ca__memcheck_exit();
}

void ca_lifecycle_memcheck_at_exit(void) { atexit(ca__memcheck_at_exit); }

__attribute__((constructor)) static void ca__register_exit(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ca_lifecycle_start_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  on_exit(ca__at_exit, NULL);
}

