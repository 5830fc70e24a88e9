/*
 * Live device memory by allocation site (see sites.h).
 *
 * A site is a stack id; stack ids are handed out in order from 1, so the
 * sites are a two-level table indexed by id, chunks mapped on first use,
 * the counters atomics. The allocation path adds to two counters and
 * compares with two thresholds; the rare work (reading the top sites at a
 * new peak, taking a growth snapshot) is done by the thread that finds its
 * lock free, and skipped by the others.
 */
#include "leaks/sites.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "support/fork.h"
#include "support/lock.h"

#define CA__PER_CHUNK 4096u
#define CA__CHUNKS 4096u /* as many sites as the depot has stacks */
/* Automatic snapshots: every 64 allocations at first, the interval
 * doubling every 64 snapshots, so that a long run is seen as evenly as a
 * short one, at a cost that falls as it goes. */
#define CA__FIRST_INTERVAL 64u
#define CA__DOUBLING 64u

typedef struct ca__site {
  _Atomic int64_t live, count;
  /* The current run of growth, under the snapshot lock. */
  int64_t last;      /* live at the previous snapshot */
  int64_t run_base;  /* live when the run began */
  uint64_t run_from; /* allocations counted then */
  uint32_t run, rises;
  ca_site_growth best; /* its longest qualifying run; snapshots 0: none */
} ca__site;

static _Atomic(ca__site *) ca__chunks[CA__CHUNKS];
static ca_lock ca__map_lock = CA_LOCK_INIT;
static _Atomic uint32_t ca__max_id;
static _Atomic int64_t ca__live;
static _Atomic uint64_t ca__allocs;

/* The peak: its figures are atomics; the sites shown, under the lock. */
static _Atomic int64_t ca__peak_bytes;
static _Atomic uint64_t ca__peak_ns, ca__peak_alloc;
static _Atomic int64_t ca__peak_shown;
static ca_lock ca__peak_lock = CA_LOCK_INIT;
static ca_site_bytes ca__peak_sites[CA_SITES_TOP];
static size_t ca__peak_nsites;

/* Growth snapshots. */
static atomic_bool ca__growth_on, ca__marked;
static _Atomic uint64_t ca__next_snap = CA__FIRST_INTERVAL;
static ca_lock ca__snap_lock = CA_LOCK_INIT;
static uint64_t ca__snaps;                         /* under the lock */
static uint64_t ca__interval = CA__FIRST_INTERVAL; /* under the lock */

static uint64_t ca__sites_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The site of stack `id`; its chunk is mapped on need when `make`. */
static ca__site *ca__site_of(uint32_t id, bool make) {
  uint32_t c = id / CA__PER_CHUNK;
  if (c >= CA__CHUNKS)
    return NULL;
  ca__site *chunk = atomic_load_explicit(&ca__chunks[c], memory_order_acquire);
  if (chunk == NULL && make) {
    ca_lock_acquire(&ca__map_lock);
    chunk = atomic_load_explicit(&ca__chunks[c], memory_order_acquire);
    if (chunk == NULL) {
      void *p = mmap(NULL, CA__PER_CHUNK * sizeof(ca__site),
                     PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      chunk = p == MAP_FAILED ? NULL : p;
      if (chunk)
        atomic_store_explicit(&ca__chunks[c], chunk, memory_order_release);
    }
    ca_lock_release(&ca__map_lock);
  }
  return chunk ? &chunk[id % CA__PER_CHUNK] : NULL;
}

/* ---- The peak ----------------------------------------------------------- */

/* Keeps the CA_SITES_TOP largest sites in top[0..*n), largest first. */
static void ca__top_insert(ca_site_bytes *top, size_t *n, ca_site_bytes s) {
  size_t i = *n;
  if (i == CA_SITES_TOP) {
    if (s.bytes <= top[i - 1].bytes)
      return;
    i--; /* the smallest goes */
  } else {
    (*n)++;
  }
  for (; i > 0 && top[i - 1].bytes < s.bytes; i--)
    top[i] = top[i - 1];
  top[i] = s;
}

/* Under the peak lock: the sites holding the most now. */
static void ca__read_top(void) {
  ca_site_bytes top[CA_SITES_TOP];
  size_t n = 0;
  uint32_t max = atomic_load_explicit(&ca__max_id, memory_order_acquire);
  for (uint32_t id = 1; id <= max; id++) {
    ca__site *s = ca__site_of(id, false);
    if (s == NULL) {
      id |= CA__PER_CHUNK - 1; /* the whole chunk is unmapped */
      continue;
    }
    int64_t live = atomic_load_explicit(&s->live, memory_order_relaxed);
    if (live > 0)
      ca__top_insert(top, &n, (ca_site_bytes){
          id, (uint64_t)live,
          (uint64_t)atomic_load_explicit(&s->count, memory_order_relaxed)});
  }
  memcpy(ca__peak_sites, top, n * sizeof(top[0]));
  ca__peak_nsites = n;
}

static void ca__note_peak(int64_t now, uint64_t n) {
  int64_t peak = atomic_load_explicit(&ca__peak_bytes, memory_order_relaxed);
  while (now > peak) {
    if (atomic_compare_exchange_weak_explicit(&ca__peak_bytes, &peak, now,
                                              memory_order_relaxed,
                                              memory_order_relaxed)) {
      atomic_store_explicit(&ca__peak_ns, ca__sites_now_ns(), memory_order_relaxed);
      atomic_store_explicit(&ca__peak_alloc, n, memory_order_relaxed);
      break;
    }
  }
  int64_t shown = atomic_load_explicit(&ca__peak_shown, memory_order_relaxed);
  if (now <= shown + shown / 64 || !ca_lock_try_acquire(&ca__peak_lock))
    return;
  if (now > atomic_load(&ca__peak_shown)) {
    ca__read_top();
    atomic_store(&ca__peak_shown, now);
  }
  ca_lock_release(&ca__peak_lock);
}

void ca_sites_peak_get(ca_sites_peak *out) {
  memset(out, 0, sizeof(*out));
  ca_lock_acquire(&ca__peak_lock);
  out->bytes = (uint64_t)atomic_load(&ca__peak_bytes);
  out->at_ns = atomic_load(&ca__peak_ns);
  out->allocation = atomic_load(&ca__peak_alloc);
  out->shown_bytes = (uint64_t)atomic_load(&ca__peak_shown);
  out->nsites = ca__peak_nsites;
  memcpy(out->sites, ca__peak_sites, ca__peak_nsites * sizeof(out->sites[0]));
  ca_lock_release(&ca__peak_lock);
}

/* ---- Growth ------------------------------------------------------------- */

static bool ca__qualifies(uint32_t run, uint32_t rises, int64_t grown) {
  return run >= CA_SITES_GROWTH_RUN && rises * 2 >= run - 1 && grown > 0;
}

/* Under the snapshot lock: one site's run, carried on or begun again. */
static void ca__snap_site(ca__site *s, uint32_t id, uint64_t n) {
  int64_t v = atomic_load_explicit(&s->live, memory_order_relaxed);
  if (s->run > 0 && v >= s->last) {
    s->run++;
    s->rises += v > s->last;
  } else {
    s->run = 1;
    s->rises = 0;
    s->run_base = v;
    s->run_from = n;
  }
  s->last = v;
  int64_t grown = v - s->run_base;
  bool same_run = s->best.snapshots > 0 && s->best.from_alloc == s->run_from;
  if (ca__qualifies(s->run, s->rises, grown) &&
      (same_run || s->best.snapshots == 0 ||
       (uint64_t)grown > s->best.to_bytes - s->best.from_bytes))
    s->best = (ca_site_growth){id, (uint64_t)s->run_base, (uint64_t)v,
                               s->run, s->rises, s->run_from, n};
}

/* Under the snapshot lock. */
static void ca__snapshot(uint64_t n) {
  uint32_t max = atomic_load_explicit(&ca__max_id, memory_order_acquire);
  for (uint32_t id = 1; id <= max; id++) {
    ca__site *s = ca__site_of(id, false);
    if (s == NULL)
      id |= CA__PER_CHUNK - 1;
    else
      ca__snap_site(s, id, n);
  }
  if (++ca__snaps % CA__DOUBLING == 0)
    ca__interval *= 2;
  atomic_store(&ca__next_snap, n + ca__interval);
}

static void ca__snapshot_try(uint64_t n) {
  if (!ca_lock_try_acquire(&ca__snap_lock))
    return;
  if (n >= atomic_load(&ca__next_snap) && !atomic_load(&ca__marked))
    ca__snapshot(n);
  ca_lock_release(&ca__snap_lock);
}

void ca_sites_set_growth(bool on) { atomic_store(&ca__growth_on, on); }

void ca_sites_mark(void) {
  atomic_store(&ca__marked, true);
  ca_lock_acquire(&ca__snap_lock);
  ca__snapshot(atomic_load(&ca__allocs));
  ca_lock_release(&ca__snap_lock);
}

/* Whether x grew more than y (ties: the lower stack id first). */
static bool ca__grew_more(const ca_site_growth *x, const ca_site_growth *y) {
  uint64_t gx = x->to_bytes - x->from_bytes, gy = y->to_bytes - y->from_bytes;
  return gx != gy ? gx > gy : x->stack < y->stack;
}

/* Keeps the `max` that grew most in out[0..*n), most first. */
static void ca__growth_insert(ca_site_growth *out, size_t *n, size_t max,
                              const ca_site_growth *g) {
  size_t i = *n;
  if (i == max) {
    if (max == 0 || !ca__grew_more(g, &out[i - 1]))
      return;
    i--;
  } else {
    (*n)++;
  }
  for (; i > 0 && ca__grew_more(g, &out[i - 1]); i--)
    out[i] = out[i - 1];
  out[i] = *g;
}

size_t ca_sites_growth(ca_site_growth *out, size_t max, uint64_t *snapshots) {
  size_t found = 0, kept = 0;
  ca_lock_acquire(&ca__snap_lock);
  uint32_t top = atomic_load_explicit(&ca__max_id, memory_order_acquire);
  for (uint32_t id = 1; id <= top; id++) {
    ca__site *s = ca__site_of(id, false);
    if (s == NULL) {
      id |= CA__PER_CHUNK - 1;
      continue;
    }
    if (s->best.snapshots == 0)
      continue;
    ca__growth_insert(out, &kept, max, &s->best);
    found++;
  }
  if (snapshots)
    *snapshots = ca__snaps;
  ca_lock_release(&ca__snap_lock);
  return found;
}

/* ---- Counting ------------------------------------------------------------ */

static void ca__raise_max(uint32_t id) {
  uint32_t max = atomic_load_explicit(&ca__max_id, memory_order_relaxed);
  while (id > max && !atomic_compare_exchange_weak_explicit(
                         &ca__max_id, &max, id, memory_order_release,
                         memory_order_relaxed))
    ;
}

/* A forked child's device memory is not its parent's: it starts empty,
 * every lock free (it has one thread). */
static void ca__sites_child(void) {
  for (unsigned c = 0; c < CA__CHUNKS; c++) {
    ca__site *chunk = atomic_exchange(&ca__chunks[c], NULL);
    if (chunk)
      munmap(chunk, CA__PER_CHUNK * sizeof(ca__site));
  }
  atomic_store(&ca__map_lock.state, 0);
  atomic_store(&ca__peak_lock.state, 0);
  atomic_store(&ca__snap_lock.state, 0);
  atomic_store(&ca__max_id, 0);
  atomic_store(&ca__live, 0);
  atomic_store(&ca__allocs, 0);
  atomic_store(&ca__peak_bytes, 0);
  atomic_store(&ca__peak_ns, 0);
  atomic_store(&ca__peak_alloc, 0);
  atomic_store(&ca__peak_shown, 0);
  ca__peak_nsites = 0;
  atomic_store(&ca__marked, false);
  ca__snaps = 0;
  ca__interval = CA__FIRST_INTERVAL;
  atomic_store(&ca__next_snap, CA__FIRST_INTERVAL);
}

static const ca_fork_handlers ca__sites_fork = {.child = ca__sites_child};

void ca_sites_alloc(uint32_t stack, uint64_t bytes) {
  if (stack == 0)
    return;
  ca__site *s = ca__site_of(stack, true);
  if (s == NULL)
    return;
  ca_fork_register(CA_FORK_SITES, &ca__sites_fork);
  ca__raise_max(stack);
  atomic_fetch_add_explicit(&s->live, (int64_t)bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed);
  uint64_t n = atomic_fetch_add_explicit(&ca__allocs, 1, memory_order_relaxed) + 1;
  int64_t now = atomic_fetch_add_explicit(&ca__live, (int64_t)bytes,
                                          memory_order_relaxed) + (int64_t)bytes;
  ca__note_peak(now, n);
  if (atomic_load_explicit(&ca__growth_on, memory_order_relaxed) &&
      n >= atomic_load_explicit(&ca__next_snap, memory_order_relaxed))
    ca__snapshot_try(n);
}

void ca_sites_free(uint32_t stack, uint64_t bytes) {
  ca__site *s = stack ? ca__site_of(stack, false) : NULL;
  if (s == NULL)
    return;
  atomic_fetch_sub_explicit(&s->live, (int64_t)bytes, memory_order_relaxed);
  atomic_fetch_sub_explicit(&s->count, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&ca__live, (int64_t)bytes, memory_order_relaxed);
}
