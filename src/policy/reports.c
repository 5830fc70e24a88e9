/*
 * Reports, now: the live blocks gathered from every pool and the
 * passed-through table, classed lost or still reachable, and printed with
 * the memory summary; and the report of a context that died with its
 * memory (see lifecycle.h).
 */
#include "policy/lifecycle_parts.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "concerns/history.h"
#include "concerns/memcheck.h"
#include "support/budget.h"
#include "support/config.h"
#include "support/lock.h"
#include "support/log.h"
#include "support/meta.h"
#include "pool/pool.h"
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

/* The pooled blocks memcheck holds in its quarantine, live to their pool,
 * were freed by the program: they leave the list. Asked outside the
 * pools' locks, which memcheck takes under its own. */
static void ca__gather_unheld(ca__gather *g) {
  if (!ca_config_get()->memcheck)
    return;
  size_t kept = 0;
  for (size_t i = 0; i < g->n; i++)
    if (strcmp(g->blocks[i].call, CA_REPORT_POOLED_CALL) != 0 ||
        !ca_memcheck_holds(g->blocks[i].addr))
      g->blocks[kept++] = g->blocks[i];
  g->n = kept;
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

size_t ca_lifecycle_gather_stats(cudalloc_device_stats *out, uint64_t *allocs) {
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

void ca_lifecycle_report_lock_reset(void) {
  pthread_mutex_init(&ca__report_lock, NULL);
}

/* Growing sites listed at most. */
#define CA__GROWTH_SHOWN 10

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
    in->start_ns = ca_lifecycle_start_ns;
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

ca_leak_totals ca_lifecycle_report_all(ca_report_event event, bool leaks,
                                       bool stats,
                                       const ca_reach_roots *roots) {
  cudalloc_device_stats all[CUDALLOC_MAX_DEVICES];
  ca_sites_peak peak;
  ca_site_growth growth[CA__GROWTH_SHOWN];
  ca_report_reserved held[CUDALLOC_MAX_DEVICES];
  ca_locks_note(1);
  ca__report_lock_take();
  uint64_t allocs = ca_track_total();
  size_t nstats = ca_lifecycle_gather_stats(all, &allocs);
  ca__gather g = {0};
  if (leaks) {
    ca__gather_pools(&g);
    ca_track_foreach(ca__gather_tracked, &g);
  }
  ca__report_lock_give();
  ca__gather_unheld(&g);
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
  ca_lifecycle_report_all(event, leaks, stats, roots);
}

/* ---- Out of memory ------------------------------------------------------ */

typedef struct ca__on_device {
  ca__gather *g;
  int device;
} ca__on_device;

static void ca__gather_tracked_on(const ca_tracked *t, void *arg) {
  ca__on_device *on = arg;
  if (t->device == on->device)
    ca__gather_tracked(t, on->g);
}

/* The device's live blocks, all of them (live memory, not leaks: none is
 * classed), grouped by site. */
void ca_lifecycle_report_oom(int device, const ca_report_oom *oom) {
  ca__gather g = {0};
  ca_locks_note(1);
  ca__report_lock_take();
  if (!oom->brief && device >= 0) {
    ca_pool *pools[CA_REGISTRY_MAX_POOLS];
    size_t n = ca_registry_pools(device, pools, CA_REGISTRY_MAX_POOLS);
    for (size_t i = 0; i < n; i++)
      ca_pool_foreach_live(pools[i], ca__gather_pooled, &g);
    ca__on_device on = {&g, device};
    ca_track_foreach(ca__gather_tracked_on, &on);
  }
  ca__report_lock_give();
  ca__gather_unheld(&g);
  for (size_t i = 0; i < g.n; i++)
    g.blocks[i].reach = CA_REACH_UNSCANNED;
  ca_report_input in = {.event = CA_EVENT_OOM,
                        .device = device,
                        .leaks = true,
                        .blocks = g.blocks,
                        .nblocks = g.n,
                        .oom = oom};
  ca_report_job *job = ca_report_prepare(&in);
  ca__report_lock_take();
  ca_report_print(job);
  ca__report_lock_give();
  ca__gather_free(&g);
  ca_locks_note(-1);
}

/* ---- PyTorch's snapshot at an out of memory ------------------------------ */

typedef struct ca__seg_blocks {
  ca_report_seg_block *v;
  size_t n, cap;
} ca__seg_blocks;

static ca_report_block_state ca__block_state(ca_pool_block_state state) {
  switch (state) {
  case CA_POOL_BLOCK_LIVE:
    return CA_SNAP_LIVE;
  case CA_POOL_BLOCK_PENDING:
    return CA_SNAP_PENDING;
  case CA_POOL_BLOCK_UNMAPPED:
    return CA_SNAP_UNMAPPED;
  case CA_POOL_BLOCK_FREE:
    break;
  }
  return CA_SNAP_FREE;
}

/* Under the arena's lock: meta's lock is taken under any other. */
static void ca__gather_block(const ca_pool_block_view *b, void *arg) {
  ca__seg_blocks *g = arg;
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 1024;
    void *p = ca_meta_grow(g->v, g->cap * sizeof(*g->v), cap * sizeof(*g->v));
    if (p == NULL)
      return; /* host memory out: the snapshot misses this block */
    g->v = p;
    g->cap = cap;
  }
  g->v[g->n++] = (ca_report_seg_block){
      .device = b->device, .seg_addr = b->seg_addr, .seg_size = b->seg_size,
      .expandable = b->expandable, .addr = b->addr, .size = b->size,
      .requested = b->requested, .stack = b->tag, .state = ca__block_state(b->state)};
}

void ca_lifecycle_oom_snapshot(const char *path, int device, uint64_t bytes,
                               uint64_t device_free) {
  ca__seg_blocks g = {0};
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  ca_locks_note(1);
  size_t npools = ca_registry_pools(-1, pools, CA_REGISTRY_MAX_POOLS);
  for (size_t i = 0; i < npools; i++)
    ca_pool_foreach_block(pools[i], ca__gather_block, &g);
  for (size_t i = 0; i < g.n && ca_config_get()->memcheck; i++)
    if (g.v[i].state == CA_SNAP_LIVE && ca_memcheck_holds(g.v[i].addr))
      g.v[i].state = CA_SNAP_PENDING; /* freed by the program, checked first */
  size_t steps_bytes = CA_HISTORY_ENTRIES * sizeof(ca_report_step);
  ca_report_step *steps = ca_meta_alloc(steps_bytes);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ca_report_snapshot snap = {
      .blocks = g.v, .nblocks = g.n, .steps = steps,
      .nsteps = steps ? ca_history_copy(steps, CA_HISTORY_ENTRIES) : 0,
      .oom_device = device < 0 ? 0 : device, .oom_bytes = bytes,
      .oom_free = device_free,
      .oom_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u};
  char why[256];
  if (ca_report_torch_snapshot(path, &snap, why, sizeof(why)))
    ca_log("oom_snapshot: PyTorch's memory snapshot of this moment is in %s "
           "(%zu blocks, %zu allocations and frees before it): "
           "python -m torch.cuda._memory_viz trace_plot %s -o oom.html, or "
           "pytorch.org/memory_viz",
           path, g.n, snap.nsteps, path);
  else
    ca_log("oom_snapshot:%s: cannot write the snapshot there (%s)", path, why);
  ca_meta_free(steps, steps_bytes);
  ca_meta_free(g.v, g.cap * sizeof(*g.v));
  ca_locks_note(-1);
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
  ca__gather_unheld(&g);
  if (pool)
    ca_memcheck_forget_pool(pool);
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

