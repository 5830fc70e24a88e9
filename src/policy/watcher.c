/*
 * The watcher thread (see lifecycle.h): started at the process's first use
 * of device memory when a setting asks for it, it prints the summary on
 * SIGUSR1, rewrites this process's figures for `cudalloc top`, writes the
 * timeline and answers the shared_limit group; and what a forked child
 * forgets of it.
 */
#include "policy/lifecycle_parts.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "policy/intercept.h"
#include "support/config.h"
#include "support/fork.h"
#include "support/group.h"
#include "support/log.h"
#include "support/meta.h"
#include "timeline/publish.h"
#include "leaks/sites.h"
#include "timeline/trace.h"

/* ---- SIGUSR1 --------------------------------------------------------------- */

/* The handler only posts a semaphore (async-signal-safe); a watcher thread
 * waits on it and prints, so no lock is ever taken inside the handler. A
 * handler the program had installed before keeps running after ours. */
static sem_t ca__signal_sem;
static struct sigaction ca__program_sigusr1;
static atomic_bool ca__sigusr1_ours;
static atomic_bool ca__used_seen;
static atomic_bool ca__watching; /* the watcher was started (in this process) */

static void ca__on_sigusr1(int sig, siginfo_t *info, void *uctx) {
  int saved = errno;
  sem_post(&ca__signal_sem);
  errno = saved;
  const struct sigaction *prev = &ca__program_sigusr1;
  if (prev->sa_flags & SA_SIGINFO) {
    if (prev->sa_sigaction != NULL)
      prev->sa_sigaction(sig, info, uctx);
  } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
    prev->sa_handler(sig);
  }
}

/* ---- The thread ------------------------------------------------------------ */

/* The watcher: prints the SIGUSR1 summary when the handler posts; under
 * publish_stats rewrites this process's figures once a second; under
 * trace_path writes the timeline every 100 ms; under shared_limit answers
 * the group's asks for room within 20 ms, and every 100 ms takes back the
 * bookings of the group's processes that ended. */
static void *ca__watch(void *arg) {
  (void)arg;
  bool publish = ca_config_get()->publish_stats && ca_publish_open(); /* made already */
  bool group = ca_group_joined();
  for (unsigned tick = 0;; tick++) {
    /* A trace may start later (cudalloc_trace_start): read at each tick. */
    bool trace = __atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE);
    unsigned tick_ms = group ? 20 : trace ? 100 : 1000;
    bool second = tick % (1000 / tick_ms) == 0;
    bool tenth = tick_ms <= 100 && tick % (100 / tick_ms) == 0;
    bool traced = trace && tenth;
    if (group)
      ca_lifecycle_group_tick(tenth);
    if (traced || (publish && second)) {
      cudalloc_device_stats all[CUDALLOC_MAX_DEVICES];
      uint64_t allocs = 0;
      size_t n = ca_lifecycle_gather_stats(all, &allocs);
      if (traced)
        ca_lifecycle_trace_tick(all, n);
      if (publish && second)
        ca_lifecycle_publish_tick(all, n);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)tick_ms * 1000000;
    until.tv_sec += until.tv_nsec / 1000000000;
    until.tv_nsec %= 1000000000;
    int rc = sem_timedwait(&ca__signal_sem, &until); /* a trace may start meanwhile */
    if (rc == 0)
      ca_lifecycle_report_all(CA_EVENT_SIGNAL, false, ca_config_get()->stats_signal, NULL);
  }
  return NULL;
}

/* Starts the watcher with every signal blocked in it, so that the
 * program's other signals keep going to the program's threads; with
 * `sigusr1`, takes SIGUSR1 for the summary. */
static void ca__start_watcher(bool sigusr1) {
  sigset_t all, old;
  pthread_t thread;
  void *stack; /* the watcher's for good */
  if (atomic_exchange(&ca__watching, true) || sem_init(&ca__signal_sem, 0, 0) != 0)
    return;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = ca_meta_thread(&thread, true, ca__watch, NULL, &stack);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    ca_log("SIGUSR1 reports, cudalloc top and answers to the group "
           "(stats_signal, growth_report, publish_stats, shared_limit): cannot "
           "start the watcher thread; SIGUSR1 is left to the program");
    return;
  }
  if (!sigusr1)
    return;
  struct sigaction sa = {.sa_sigaction = ca__on_sigusr1,
                         .sa_flags = SA_RESTART | SA_SIGINFO};
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR1, &sa, &ca__program_sigusr1) == 0)
    atomic_store(&ca__sigusr1_ours, true);
}

/* A forked child has no watcher thread, and no report in progress: it
 * gives SIGUSR1 back to the program's own action, frees the report lock,
 * and starts its own watcher on its own first use of device memory. */
static void ca__forget_in_child(void) {
  ca_lifecycle_report_lock_reset();
  ca_publish_forget();
  ca_trace_forget();
  if (atomic_exchange(&ca__sigusr1_ours, false))
    sigaction(SIGUSR1, &ca__program_sigusr1, NULL);
  atomic_store(&ca__used_seen, false);
  atomic_store(&ca__watching, false);
}

static const ca_fork_handlers ca__lifecycle_fork = {
    .child = ca__forget_in_child};

void ca_lifecycle_device_used(void) {
  if (atomic_load_explicit(&ca__used_seen, memory_order_relaxed))
    return;
  ca_fork_register(CA_FORK_LIFECYCLE, &ca__lifecycle_fork);
  if (atomic_exchange(&ca__used_seen, true))
    return;
  const ca_config *cfg = ca_config_get();
  ca_sites_set_growth(cfg->growth_report);
  /* Files are made here, on the program's thread inside its first device
   * call, never by the watcher: a descriptor opened by another thread, even
   * for a moment, could take the number a program is about to reopen
   * stderr at (a daemon closing and reopening its standard files). */
  bool trace = cfg->trace_path[0] != '\0' &&
               ca_trace_start(cfg->trace_path, cfg->trace_allocations,
                              ca_lifecycle_start_ns);
  if (cfg->publish_stats)
    ca_publish_open();
  bool group = ca_group_joined();
  if (cfg->stats_signal || cfg->growth_report || cfg->publish_stats || trace ||
      group)
    ca__start_watcher(cfg->stats_signal || cfg->growth_report);
  if (cfg->memcheck)
    ca_lifecycle_memcheck_at_exit();
}

bool ca_lifecycle_trace_begin(const char *path) {
  if (__atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE))
    return true;
  ca_lifecycle_device_used(); /* its watcher, if it wants one, first */
  if (!ca_trace_start(path, true, ca_lifecycle_start_ns))
    return false;
  ca_intercept_trace_started();
  ca__start_watcher(false); /* none yet: one to write the trace */
  return true;
}

void ca_lifecycle_trace_flush(void) { ca_trace_drain(ca_report_stack_lines); }
