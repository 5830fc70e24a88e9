/*
 * The pool registry (see registry.h).
 *
 * Pools live in a fixed table of slots, one per context, found on the hot
 * path by comparing the current context with each slot's (a program has
 * one or a few). Pools are never freed, and a slot is never given to
 * another context: a program may free device memory from exit handlers,
 * after our destructors would have run, and a thread may still hold a pool
 * whose context just died, mid-call. A context dies in two steps: its slot
 * is marked dying before the driver call that may kill it (so that no
 * allocation finds the pool while the driver may already reuse the
 * handle), then retired or, if the context survived, restored.
 */
#include "registry/registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/backend_cuda.h"
#include "driver/driver.h"
#include "support/fork.h"
#include "support/group.h"
#include "support/log.h"
#include "leaks/track.h"

typedef struct ca__slot {
  _Atomic(void *) ctx;     /* the context served; NULL once retired */
  _Atomic(void *) dying;   /* the context, while its death is decided */
  _Atomic(ca_pool *) pool; /* set once per slot, never freed */
  int device;
  ca_backend backend; /* the CUDA backend, bound to ctx */
} ca__slot;

static ca__slot ca__slots[CA_REGISTRY_MAX_POOLS];
/* Slots ever used: the hot path looks no further. */
static atomic_int ca__nslots;
static pthread_mutex_t ca__slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* Each device's memory budget: its pools and what is passed through to the
 * driver book against the same one. */
static ca_budget ca__budgets[CUDALLOC_MAX_DEVICES];
static pthread_once_t ca__budgets_once = PTHREAD_ONCE_INIT;

static void ca__budgets_init(void) {
  uint64_t limit = ca_config_get()->memory_limit;
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++)
    ca__budgets[d].limit = limit;
}

/* Under shared_limit, each device's budget takes its entry in the group
 * before its first booking, once: a device the group cannot take keeps
 * memory_limit_mb as this process's own. */
static atomic_bool ca__grouped[CUDALLOC_MAX_DEVICES];
static pthread_mutex_t ca__group_lock = PTHREAD_MUTEX_INITIALIZER;

static void ca__join_group(int device) {
  pthread_mutex_lock(&ca__group_lock);
  if (!atomic_load(&ca__grouped[device]) && ca_group_join()) {
    uint8_t uuid[16];
    if (ca_driver_device_uuid(device, uuid) != CUDA_SUCCESS)
      ca_log("shared_limit: device %d has no UUID to name it by in the "
             "group; memory_limit_mb caps it in this process alone", device);
    else
      ca__budgets[device].group = ca_group_device(uuid);
  }
  atomic_store_explicit(&ca__grouped[device], true, memory_order_release);
  pthread_mutex_unlock(&ca__group_lock);
}

uint32_t ca_registry_group(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES ||
      !atomic_load_explicit(&ca__grouped[device], memory_order_acquire))
    return 0;
  return ca__budgets[device].group;
}

ca_budget *ca_registry_budget(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return NULL;
  pthread_once(&ca__budgets_once, ca__budgets_init);
  return &ca__budgets[device];
}

ca_budget *ca_registry_budget_joined(int device) {
  ca_budget *b = ca_registry_budget(device);
  if (b != NULL &&
      !atomic_load_explicit(&ca__grouped[device], memory_order_acquire))
    ca__join_group(device);
  return b;
}

/* A forked child cannot use its parent's CUDA contexts, and another thread
 * may have held a pool's lock at the fork: the child forgets the parent's
 * pools without touching them and starts afresh. */
static void ca__forget_pools_in_child(void) {
  pthread_mutex_init(&ca__slots_lock, NULL);
  for (int i = 0; i < CA_REGISTRY_MAX_POOLS; i++) {
    atomic_store(&ca__slots[i].ctx, NULL);
    atomic_store(&ca__slots[i].dying, NULL);
    atomic_store(&ca__slots[i].pool, NULL);
  }
  atomic_store(&ca__nslots, 0);
  /* Nor is the memory it booked: the child holds none yet. */
  pthread_mutex_init(&ca__group_lock, NULL);
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    atomic_store(&ca__budgets[d].booked, 0);
    atomic_store(&ca__budgets[d].peak, 0);
    atomic_store(&ca__budgets[d].peak_ns, 0);
  }
}

static const ca_fork_handlers ca__registry_fork = {
    .child = ca__forget_pools_in_child};

static ca_reuse ca__reuse(int setting) {
  switch (setting) {
  case CA_REUSE_SETTING_IMMEDIATE:
    return CA_REUSE_IMMEDIATE;
  case CA_REUSE_SETTING_DEVICE_SYNC:
    return CA_REUSE_DEVICE_SYNC;
  default:
    return CA_REUSE_SAFE;
  }
}

static void ca__pool_warn(const char *line) { ca_log("%s", line); }

static ca_pool_options ca__pool_options(int device) {
  const ca_config *c = ca_config_get();
  return (ca_pool_options){
      .max_split_size = c->max_split_size,
      .gc_threshold = c->gc_threshold,
      .reuse = ca__reuse(c->reuse_policy),
      .segment_head = c->leak_scan ? CA_GRANULE : 0,
      .expandable = c->expandable_segments,
      .red_zone = c->memcheck ? CA_MEMCHECK_RED_ZONE : 0,
      .fill_fresh = c->memcheck,
      .fresh_byte = CA_MEMCHECK_FILL,
      .budget = ca_registry_budget(device),
      .warn = ca__pool_warn,
  };
}

/* The slot of `ctx` among the first n, or NULL. */
static inline ca__slot *ca__slot_find(void *ctx, int n) {
  for (int i = 0; i < n; i++)
    if (atomic_load_explicit(&ca__slots[i].ctx, memory_order_acquire) == ctx)
      return &ca__slots[i];
  return NULL;
}

/* Whether `ctx` is dying: allocations in it go to the driver meanwhile. */
static bool ca__is_dying(void *ctx, int n) {
  for (int i = 0; i < n; i++)
    if (atomic_load(&ca__slots[i].dying) == ctx)
      return true;
  return false;
}

/* Under the lock: a fresh slot, with a new pool, for a new context of
 * `device`. NULL when none can be had. */
static ca__slot *ca__claim(int device, void *ctx) {
  int n = atomic_load(&ca__nslots);
  if (n == CA_REGISTRY_MAX_POOLS || ca__is_dying(ctx, n))
    return NULL;
  ca__slot *s = &ca__slots[n];
  s->device = device;
  s->backend = *ca_backend_cuda();
  s->backend.ctx = ctx;
  ca_pool_options opt = ca__pool_options(device);
  ca_pool *pool = ca_pool_create(&s->backend, device, &opt);
  if (pool == NULL)
    return NULL;
  atomic_store(&s->pool, pool);
  atomic_store_explicit(&s->ctx, ctx, memory_order_release);
  atomic_store_explicit(&ca__nslots, n + 1, memory_order_release);
  return s;
}

/* The pool already serving `ctx`, or NULL: no lock, no device number. */
static inline ca_pool *ca__pool_of(void *ctx) {
  int n = atomic_load_explicit(&ca__nslots, memory_order_acquire);
  ca__slot *s = ca__slot_find(ctx, n);
  return s ? atomic_load_explicit(&s->pool, memory_order_acquire) : NULL;
}

/* The pool of `ctx`, of `device`, made if need be (takes the lock). */
static ca_pool *ca__pool_in(int device, void *ctx) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES || ctx == NULL)
    return NULL;
  ca_fork_register(CA_FORK_REGISTRY, &ca__registry_fork);
  /* A group is joined outside the slots' lock: it opens a file and asks
   * the driver for the device's UUID. */
  ca_registry_budget_joined(device);
  pthread_mutex_lock(&ca__slots_lock);
  ca__slot *s = ca__slot_find(ctx, atomic_load(&ca__nslots));
  if (s == NULL)
    s = ca__claim(device, ctx);
  pthread_mutex_unlock(&ca__slots_lock);
  return s != NULL ? atomic_load(&s->pool) : NULL;
}

/* The current context's pool, made if need be: out of line, so that the
 * common case (found) saves no registers. */
static __attribute__((noinline)) ca_pool *ca__current_pool_made(void *ctx,
                                                                bool *made) {
  int device = -1;
  if (ca_driver_context_device(&device) != CUDA_SUCCESS)
    return NULL;
  ca_pool *pool = ca__pool_in(device, ctx);
  *made = pool != NULL;
  return pool;
}

ca_pool *ca_registry_current_pool(bool *made) {
  CUcontext ctx = NULL;
  *made = false;
  if (ca_driver_current_context(&ctx) != CUDA_SUCCESS)
    return NULL;
  ca_pool *pool = ca__pool_of(ctx);
  return pool != NULL ? pool : ca__current_pool_made(ctx, made);
}

ca_pool *ca_registry_primary_pool(int device, bool *made, CUresult *why) {
  CUcontext ctx = NULL;
  *made = false;
  *why = ca_driver_primary_retained(device, true, &ctx);
  if (*why != CUDA_SUCCESS)
    return NULL;
  ca_pool *pool = ca__pool_of(ctx);
  if (pool != NULL)
    return pool;
  pool = ca__pool_in(device, ctx);
  *made = pool != NULL;
  /* A context being reset, every slot taken, or no host memory: the
   * driver serves the request instead. */
  if (pool == NULL)
    *why = CUDA_ERROR_NOT_READY;
  return pool;
}

size_t ca_registry_pools(int device, ca_pool **out, size_t max) {
  size_t found = 0;
  int n = atomic_load_explicit(&ca__nslots, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    ca_pool *pool = atomic_load_explicit(&ca__slots[i].pool,
                                         memory_order_acquire);
    if (pool == NULL || (device >= 0 && ca__slots[i].device != device))
      continue;
    if (found < max)
      out[found] = pool;
    found++;
  }
  return found;
}

bool ca_registry_device_stats(int device, cudalloc_device_stats *out) {
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(device, pools, CA_REGISTRY_MAX_POOLS);
  memset(out, 0, sizeof(*out));
  for (size_t i = 0; i < n; i++) {
    cudalloc_device_stats s;
    ca_pool_get_stats(pools[i], &s);
    ca_pool_stats_add(out, &s);
  }
  out->device = device;
  out->fragmentation = ca_pool_fragmentation(out);
  return n > 0;
}

void ca_registry_reset_peaks(int device) {
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(device, pools, CA_REGISTRY_MAX_POOLS);
  for (size_t i = 0; i < n && i < CA_REGISTRY_MAX_POOLS; i++)
    ca_pool_reset_peaks(pools[i]);
}

ca_pool *ca_registry_dying(void *ctx) {
  if (ctx == NULL)
    return NULL;
  pthread_mutex_lock(&ca__slots_lock);
  ca__slot *s = ca__slot_find(ctx, atomic_load(&ca__nslots));
  if (s != NULL) {
    atomic_store(&s->dying, ctx);
    atomic_store(&s->ctx, NULL);
  }
  pthread_mutex_unlock(&ca__slots_lock);
  return s ? atomic_load(&s->pool) : NULL;
}

/* The slot of `pool`, or NULL. */
static ca__slot *ca__slot_of(ca_pool *pool) {
  int n = atomic_load(&ca__nslots);
  for (int i = 0; i < n; i++)
    if (atomic_load(&ca__slots[i].pool) == pool)
      return &ca__slots[i];
  return NULL;
}

void ca_registry_survived(ca_pool *pool) {
  pthread_mutex_lock(&ca__slots_lock);
  ca__slot *s = pool ? ca__slot_of(pool) : NULL;
  if (s != NULL) {
    atomic_store_explicit(&s->ctx, atomic_load(&s->dying),
                          memory_order_release);
    atomic_store(&s->dying, NULL);
  }
  pthread_mutex_unlock(&ca__slots_lock);
}

void ca_registry_unbook(int device, uint64_t bytes) {
  ca_budget *b = ca_registry_budget(device);
  if (b != NULL)
    ca_budget_unbook(b, bytes);
}

/* A passed-through allocation died with its context: its booking ends. */
static void ca__unbook_dead(const ca_tracked *t, void *arg) {
  (void)arg;
  ca_registry_unbook(t->device, t->size);
}

void ca_registry_buried(void *ctx, ca_pool *pool) {
  ca_track_drop_context(ctx, ca__unbook_dead, NULL);
  if (pool == NULL)
    return;
  ca_pool_drop_all(pool);
  pthread_mutex_lock(&ca__slots_lock);
  ca__slot *s = ca__slot_of(pool);
  if (s != NULL)
    atomic_store(&s->dying, NULL);
  pthread_mutex_unlock(&ca__slots_lock);
}

/* Whether `ask` says yes for any pool in use. */
static bool ca__any_pool(bool (*ask)(ca_pool *, uint64_t), uint64_t addr) {
  int n = atomic_load_explicit(&ca__nslots, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    ca_pool *pool = atomic_load_explicit(&ca__slots[i].pool,
                                         memory_order_acquire);
    if (pool && ask(pool, addr))
      return true;
  }
  return false;
}

bool ca_registry_free(uint64_t addr, const uint64_t *stream,
                      ca_live_block *freed) {
  int n = atomic_load_explicit(&ca__nslots, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    ca_pool *pool = atomic_load_explicit(&ca__slots[i].pool,
                                         memory_order_acquire);
    if (pool && (stream ? ca_pool_free_on(pool, addr, *stream, freed)
                        : ca_pool_free(pool, addr, freed)))
      return true;
  }
  return false;
}

bool ca_registry_holds_segment(uint64_t addr) {
  return ca__any_pool(ca_pool_holds_segment, addr);
}

bool ca_registry_find(uint64_t addr, ca_registry_span *out) {
  ca_pool *found = NULL;
  ca_pool_where where = ca_pool_locate(addr, &found, &out->span);
  if (where != CA_POOL_ASK) {
    ca__slot *slot = where == CA_POOL_FOUND ? ca__slot_of(found) : NULL;
    out->pool = found;
    out->slot = slot ? (int)(slot - ca__slots) : -1;
    return slot != NULL;
  }
  int n = atomic_load_explicit(&ca__nslots, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    ca_pool *pool = atomic_load_explicit(&ca__slots[i].pool,
                                         memory_order_acquire);
    if (pool && ca_pool_find(pool, addr, &out->span)) {
      out->pool = pool;
      out->slot = i;
      return true;
    }
  }
  return false;
}

bool ca_registry_bounds(uint64_t addr, uint64_t *start, uint64_t *end) {
  ca_pool_where where = ca_pool_bounds(addr, start, end);
  if (where != CA_POOL_ASK)
    return where == CA_POOL_FOUND;
  ca_registry_span at;
  if (!ca_registry_find(addr, &at))
    return false;
  *start = at.span.live ? at.span.block.addr : 0;
  *end = at.span.live ? at.span.block.addr + at.span.block.requested : 0;
  return true;
}

bool ca_registry_lost(uint64_t addr) {
  return ca__any_pool(ca_pool_segment_lost, addr);
}

uint64_t ca_registry_releasable(int device) {
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(device, pools, CA_REGISTRY_MAX_POOLS);
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; i++)
    bytes += ca_pool_releasable(pools[i]);
  return bytes;
}

bool ca_registry_in_use(void) { return atomic_load(&ca__nslots) > 0; }
