/*
 * The report at exit, the summary on SIGUSR1, and context deaths (see
 * lifecycle.h).
 *
 * The exit report runs from an on_exit handler registered when the library
 * is loaded, before the program's own handlers: handlers run in reverse, so
 * ours runs after the program's (C++ static destructors included) have
 * freed what they free, and on_exit, unlike atexit, tells it the exit
 * status that leak_exitcode needs.
 */
#include "policy/lifecycle.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/budget.h"
#include "support/config.h"
#include "support/fork.h"
#include "support/lock.h"
#include "support/log.h"
#include "support/meta.h"
#include "pool/pool.h"
#include "timeline/publish.h"
#include "leaks/reach.h"
#include "registry/registry.h"
#include "leaks/sites.h"
#include "timeline/trace.h"
#include "leaks/track.h"

/* ---- Gathering the live blocks ------------------------------------------ */

/* A growing array of blocks in the library's own memory (meta.h: the scan
 * of host memory must not find the addresses listed here). Pools call back
 * under their lock; meta's lock is taken under any other. */
typedef struct ca__gather {
  ca_report_block *blocks;
  size_t n, cap;
} ca__gather;

static bool ca__gather_grow(ca__gather *g) {
  size_t cap = g->cap ? 2 * g->cap : 1024;
  void *p = ca_meta_grow(g->blocks, g->cap * sizeof(ca_report_block),
                         cap * sizeof(ca_report_block));
  if (p == NULL)
    return false;
  g->blocks = p;
  g->cap = cap;
  return true;
}

static void ca__gather_push(ca__gather *g, ca_report_block b) {
  if (g->n == g->cap && !ca__gather_grow(g))
    return; /* Out of memory: the report misses this block. */
  g->blocks[g->n++] = b;
}

/* Blocks are gathered as the scan would class them if it found no word
 * pointing into them (ca__classify): pooled ones lost, unless where the
 * driver keeps the address too (a segment's base, a mapped page's start),
 * as it keeps those of the allocations passed through to it. */
static void ca__gather_pooled(const ca_live_block *b, void *arg) {
  ca__gather_push(arg, (ca_report_block){.addr = b->addr,
                                         .bytes = b->requested,
                                         .seq = b->seq,
                                         .device = b->device,
                                         .stack = b->tag,
                                         .call = CA_REPORT_POOLED_CALL,
                                         .reach = b->at_base
                                                      ? CA_REACH_UNCLASSED
                                                      : CA_REACH_LOST,
                                         .page = b->page});
}

static void ca__gather_tracked(const ca_tracked *t, void *arg) {
  ca__gather_push(arg, (ca_report_block){.addr = t->key,
                                         .bytes = t->size,
                                         .seq = t->seq,
                                         .device = t->device,
                                         .stack = t->stack,
                                         .call = ca_track_kind_call(t->kind),
                                         .reach = CA_REACH_UNCLASSED});
}

static void ca__gather_free(ca__gather *g) {
  ca_meta_free(g->blocks, g->cap * sizeof(ca_report_block));
}

/* Lost or still reachable (reach.h): the lost ones are the blocks the scan
 * finds no host word pointing into. Without roots, or without a complete
 * scan (leak_scan:0, or out of memory), every block is a leak, unscanned. */
static void ca__classify(ca__gather *g, const ca_reach_roots *roots) {
  bool scan = roots && ca_config_get()->leak_scan && g->n;
  ca_reach_target *t = scan ? ca_meta_alloc(g->n * sizeof(*t)) : NULL;
  ca_reach_stats st = {0};
  size_t n = 0;
  if (t != NULL) {
    for (size_t i = 0; i < g->n; i++) {
      const ca_report_block *b = &g->blocks[i];
      if (b->reach == CA_REACH_LOST)
        t[n++] = (ca_reach_target){.lo = b->addr,
                                   .hi = b->addr + (b->bytes ? b->bytes : 1),
                                   .blind = b->page,
                                   .index = i};
    }
    ca_reach_scan(t, n, roots, &st);
  }
  if (!st.complete)
    for (size_t i = 0; i < g->n; i++)
      g->blocks[i].reach = CA_REACH_UNSCANNED;
  else
    for (size_t i = 0; i < n; i++)
      if (t[i].found)
        g->blocks[t[i].index].reach = CA_REACH_REACHABLE;
  if (t != NULL && ca_config_get()->verbose >= 2)
    ca_log("leak scan: %.1f MiB of host memory in %.1f ms%s",
           (double)st.scanned_bytes / (1 << 20), (double)st.ns / 1e6,
           st.complete ? "" : " (incomplete: nothing classed)");
  ca_meta_free(t, g->n * sizeof(*t));
}

/* Every pool's live blocks. */
static void ca__gather_pools(ca__gather *g) {
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(-1, pools, CA_REGISTRY_MAX_POOLS);
  for (size_t i = 0; i < n; i++)
    ca_pool_foreach_live(pools[i], ca__gather_pooled, g);
}

/* Every device's statistics into out; returns how many devices have
 * pools; adds up the allocations served into *allocs. */
static size_t ca__gather_stats(cudalloc_device_stats *out, uint64_t *allocs) {
  size_t n = 0;
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    if (ca_registry_device_stats(d, &out[n]))
      *allocs += out[n++].allocs;
  }
  return n;
}

/* One report's gathering and printing at a time: two reports' lines would
 * interleave. The slow middle (ca_report_prepare: symbol tables, which ask
 * the dynamic loader) runs with the lock free, since a thread inside
 * dlopen may need it (a constructor that destroys a context). The thread
 * counts itself as holding a library lock for the whole report, so that an
 * exit() from a signal handler that interrupts it skips its own report. A
 * forked child starts with the lock free (the watcher thread that may have
 * held it is not in the child). */
static pthread_mutex_t ca__report_lock = PTHREAD_MUTEX_INITIALIZER;

static void ca__report_lock_take(void) { pthread_mutex_lock(&ca__report_lock); }
static void ca__report_lock_give(void) {
  pthread_mutex_unlock(&ca__report_lock);
}

/* Growing sites listed at most. */
#define CA__GROWTH_SHOWN 10

/* When the library was loaded, about when the program started
 * (CLOCK_MONOTONIC): the report's times count from it. */
static uint64_t ca__start_ns;

/* Memory over time (sites.h) for a report with leaks, at exit or on
 * SIGUSR1: the peak (with leaks, or under growth_report) and the growing
 * sites (under growth_report). The report prints the peak only when stacks
 * counted anything. */
static void ca__over_time(ca_report_input *in, ca_sites_peak *peak,
                          ca_site_growth *growth, ca_report_reserved *held) {
  if (in->event == CA_EVENT_CONTEXT_RESET || (in->event == CA_EVENT_API && !in->leaks))
    return;
  bool growth_on = ca_config_get()->growth_report;
  if (in->leaks || growth_on) {
    ca_sites_peak_get(peak);
    in->peak = peak;
    in->reserved = held;
    in->start_ns = ca__start_ns;
    for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
      ca_budget *b = ca_registry_budget(d);
      uint64_t bytes = b ? atomic_load(&b->peak) : 0;
      if (bytes > 0)
        held[in->nreserved++] =
            (ca_report_reserved){d, bytes, atomic_load(&b->peak_ns)};
    }
  }
  if (growth_on) {
    in->growth = growth;
    in->growth_found = ca_sites_growth(growth, CA__GROWTH_SHOWN, &in->snapshots);
    in->ngrowth = in->growth_found < CA__GROWTH_SHOWN ? in->growth_found
                                                      : CA__GROWTH_SHOWN;
  }
}

static ca_leak_totals ca__report_all(ca_report_event event, bool leaks,
                                     bool stats, const ca_reach_roots *roots) {
  cudalloc_device_stats all[CUDALLOC_MAX_DEVICES];
  ca_sites_peak peak;
  ca_site_growth growth[CA__GROWTH_SHOWN];
  ca_report_reserved held[CUDALLOC_MAX_DEVICES];
  ca_locks_note(1);
  ca__report_lock_take();
  uint64_t allocs = ca_track_total();
  size_t nstats = ca__gather_stats(all, &allocs);
  ca__gather g = {0};
  if (leaks) {
    ca__gather_pools(&g);
    ca_track_foreach(ca__gather_tracked, &g);
  }
  ca__report_lock_give();
  if (leaks)
    ca__classify(&g, roots);
  ca_report_input in = {.event = event,
                        .device = -1,
                        .leaks = leaks,
                        .blocks = g.blocks,
                        .nblocks = g.n,
                        .allocations = allocs,
                        .stats = all,
                        .nstats = stats ? nstats : 0};
  ca__over_time(&in, &peak, growth, held);
  ca_report_job *job = ca_report_prepare(&in);
  ca__report_lock_take();
  ca_leak_totals totals = ca_report_print(job);
  ca__report_lock_give();
  ca__gather_free(&g);
  ca_locks_note(-1);
  return totals;
}

void ca_lifecycle_report(ca_report_event event, bool leaks, bool stats,
                         const ca_reach_roots *roots) {
  ca__report_all(event, leaks, stats, roots);
}

/* ---- Context deaths -------------------------------------------------------- */

/* The pool is out of service already (ca_registry_dying), so its blocks
 * stay as gathered while the report is prepared with the lock free. */
void ca_lifecycle_context_gone(void *ctx, ca_pool *pool, int device) {
  ca__gather g = {0};
  ca_locks_note(1);
  ca__report_lock_take();
  if (pool)
    ca_pool_foreach_live(pool, ca__gather_pooled, &g);
  ca_track_foreach_in(ctx, ca__gather_tracked, &g);
  ca__report_lock_give();
  ca__classify(&g, NULL); /* their memory is gone: nothing to class */
  /* The pool's blocks die here; the passed-through ones leave the live
   * bytes by site when the registry drops them. */
  for (size_t i = 0; i < g.n; i++)
    if (strcmp(g.blocks[i].call, CA_REPORT_POOLED_CALL) == 0)
      ca_sites_free(g.blocks[i].stack, g.blocks[i].bytes);
  ca_report_input in = {.event = CA_EVENT_CONTEXT_RESET,
                        .device = pool ? ca_pool_device(pool) : device,
                        .leaks = true,
                        .blocks = g.blocks,
                        .nblocks = g.n};
  ca_trace_instant(in.device, "context death (its memory gone)");
  bool report = ca_config_get()->leak_report && g.n > 0;
  ca_report_job *job = report ? ca_report_prepare(&in) : NULL;
  ca__report_lock_take();
  if (report)
    ca_report_print(job);
  ca_registry_buried(ctx, pool);
  ca__report_lock_give();
  ca__gather_free(&g);
  ca_locks_note(-1);
}

/* ---- Exit -------------------------------------------------------------------- */

/* The process that printed the exit report: once per process, and a forked
 * child (another pid) prints its own. */
static atomic_int ca__exit_reported_by;

/* The timeline's figures (below, with the watcher). */
static void ca__trace_tick(const cudalloc_device_stats *all, size_t n);

static void ca__at_exit(int status, void *arg) {
  ca_reach_roots roots;
  CA_REACH_ROOTS_HERE(&roots);
  (void)arg;
  ca_publish_close(); /* takes no lock the exiting thread could hold */
  if (ca_locks_held == 0 && __atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE)) {
    cudalloc_device_stats all[CUDALLOC_MAX_DEVICES];
    uint64_t allocs = 0;
    ca__trace_tick(all, ca__gather_stats(all, &allocs)); /* the last figures */
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
  if (!cfg->leak_report && !cfg->stats && !cfg->growth_report)
    return;
  ca_leak_totals t = ca__report_all(CA_EVENT_EXIT, cfg->leak_report,
                                    cfg->stats, &roots);
  if (cfg->leak_report && cfg->leak_exitcode != 0 && status == 0 &&
      t.count > 0) {
    /* Like LeakSanitizer's exitcode, the process ends here: only _exit can
     * change a status once exit has begun. The program's buffered output
     * is written first, since exit would have written it. */
    fflush(NULL);
    _exit(cfg->leak_exitcode);
  }
}

__attribute__((constructor)) static void ca__register_exit(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ca__start_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  on_exit(ca__at_exit, NULL);
}

/* ---- SIGUSR1 ------------------------------------------------------------------- */

/* The handler only posts a semaphore (async-signal-safe); a watcher thread
 * waits on it and prints, so no lock is ever taken inside the handler. A
 * handler the program had installed before keeps running after ours. */
static sem_t ca__signal_sem;
static struct sigaction ca__program_sigusr1;
static atomic_bool ca__sigusr1_ours;
static atomic_bool ca__used_seen;

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

/* ---- For cudalloc top ----------------------------------------------------------- */

/* The growing site's line, "+39.0 MiB keep_step (e2e_leaks.c:120)", or ""
 * (growth_report off, or no site grew). A stack is named once, when it
 * becomes the top one. */
static void ca__top_site(char *buf, size_t len) {
  static uint32_t named;
  static char name[160];
  ca_site_growth g;
  buf[0] = '\0';
  if (!ca_config_get()->growth_report || ca_sites_growth(&g, 1, NULL) == 0)
    return;
  if (g.stack != named) {
    ca_report_site_name(g.stack, name, sizeof(name));
    named = g.stack;
  }
  snprintf(buf, len, "+%.1f MiB %s",
           (double)(g.to_bytes - g.from_bytes) / (1 << 20), name);
}

/* Each device's pools, and the growing site, into this process's file. */
static void ca__publish_tick(const cudalloc_device_stats *all, size_t nall) {
  ca_published_device d[CA_PUBLISH_DEVICES];
  size_t n = 0;
  for (size_t i = 0; i < nall && n < CA_PUBLISH_DEVICES; i++) {
    const cudalloc_device_stats s = all[i];
    d[n++] = (ca_published_device){
        .device = s.device,
        .in_use = s.allocated_bytes.current,
        .cached = s.free_cached_bytes + s.pending_free_bytes,
        .reserved = s.reserved_bytes.current,
        .peak = s.reserved_bytes.peak,
        .allocs = s.allocs,
        .fragmentation = s.fragmentation};
  }
  char site[192];
  ca__top_site(site, sizeof(site));
  ca_publish_write(d, n, site);
}

/* The trace's counters every tick, and an instant event for each
 * out-of-memory retry and collection since the last one; from the watcher,
 * and once more at exit. */
static void ca__trace_tick(const cudalloc_device_stats *all, size_t n) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t retries[CUDALLOC_MAX_DEVICES], collected[CUDALLOC_MAX_DEVICES];
  static uint64_t peaks[CUDALLOC_MAX_DEVICES];
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n; i++) {
    const cudalloc_device_stats *s = &all[i];
    /* The device's peak when it came: a program that peaks between two
     * ticks (a short one, between start and exit) still shows it. */
    ca_budget *b = ca_registry_budget(s->device);
    uint64_t peak = b ? atomic_load(&b->peak) : 0;
    if (peak > peaks[s->device]) {
      ca_trace_reserved_peak(s->device, atomic_load(&b->peak_ns), peak);
      peaks[s->device] = peak;
    }
    ca_trace_counter(s->device, s->requested_bytes.current, s->allocated_bytes.current,
                     s->reserved_bytes.current);
    for (; retries[s->device] < s->oom_retries; retries[s->device]++)
      ca_trace_instant(s->device, "out-of-memory retry");
    for (; collected[s->device] < s->gc_segments_released; collected[s->device]++)
      ca_trace_instant(s->device, "segment given back (collection)");
  }
  pthread_mutex_unlock(&lock);
  ca_trace_drain(ca_report_stack_lines);
}

/* The watcher: prints the SIGUSR1 summary when the handler posts; under
 * publish_stats rewrites this process's figures once a second; under
 * trace_path writes the timeline every 100 ms. */
static void *ca__watch(void *arg) {
  (void)arg;
  bool publish = ca_config_get()->publish_stats && ca_publish_open(); /* made already */
  bool trace = __atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE);
  long tick_ms = trace ? 100 : 1000;
  for (unsigned tick = 0;; tick++) {
    cudalloc_device_stats all[CUDALLOC_MAX_DEVICES];
    uint64_t allocs = 0;
    size_t n = publish || trace ? ca__gather_stats(all, &allocs) : 0;
    if (trace)
      ca__trace_tick(all, n);
    if (publish && tick % (1000 / tick_ms) == 0)
      ca__publish_tick(all, n);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += tick_ms * 1000000;
    until.tv_sec += until.tv_nsec / 1000000000;
    until.tv_nsec %= 1000000000;
    int rc = publish || trace ? sem_timedwait(&ca__signal_sem, &until)
                              : sem_wait(&ca__signal_sem);
    if (rc == 0)
      ca__report_all(CA_EVENT_SIGNAL, false, ca_config_get()->stats_signal, NULL);
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
  if (sem_init(&ca__signal_sem, 0, 0) != 0)
    return;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = ca_meta_thread(&thread, true, ca__watch, NULL, &stack);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    ca_log("SIGUSR1 reports and cudalloc top (stats_signal, growth_report, "
           "publish_stats): cannot start the watcher thread; SIGUSR1 is left "
           "to the program");
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
  pthread_mutex_init(&ca__report_lock, NULL);
  ca_publish_forget();
  ca_trace_forget();
  if (atomic_exchange(&ca__sigusr1_ours, false))
    sigaction(SIGUSR1, &ca__program_sigusr1, NULL);
  atomic_store(&ca__used_seen, false);
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
               ca_trace_start(cfg->trace_path, cfg->trace_allocations, ca__start_ns);
  if (cfg->publish_stats)
    ca_publish_open();
  if (cfg->stats_signal || cfg->growth_report || cfg->publish_stats || trace)
    ca__start_watcher(cfg->stats_signal || cfg->growth_report);
}
