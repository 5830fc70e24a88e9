/*
 * The process-wide state (see runtime.h).
 *
 * Pools are created on first use and live until the process ends: a program
 * may free device memory from exit handlers, after our destructors would have
 * run, so nothing here is torn down at exit.
 */
#include "runtime.h"

#include <pthread.h>
#include <stdatomic.h>

#include "backend_cuda.h"
#include "lifecycle.h"
#include "track.h"

static _Atomic(ca_pool *) ca__pools[CUDALLOC_MAX_DEVICES];
/* One past the highest device with a pool: frees look no further. */
static atomic_int ca__pools_end;
/* The context each pool's segments were reserved in, noted at the first
 * allocation after the pool was made or its context died: the one context
 * whose destruction takes them. */
static _Atomic(void *) ca__homes[CUDALLOC_MAX_DEVICES];
static pthread_mutex_t ca__pools_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t ca__fork_once = PTHREAD_ONCE_INIT;

/* A forked child cannot use its parent's CUDA context, and another thread
 * may have held a pool's lock at the fork: the child forgets the parent's
 * pools without touching them and starts afresh. */
static void ca__forget_pools_in_child(void) {
  pthread_mutex_init(&ca__pools_lock, NULL);
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    atomic_store(&ca__pools[d], NULL);
    atomic_store(&ca__homes[d], NULL);
  }
  atomic_store(&ca__pools_end, 0);
}

static void ca__register_fork_handler(void) {
  pthread_atfork(NULL, NULL, ca__forget_pools_in_child);
}

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

static ca_pool_options ca__pool_options(int device) {
  const ca_config *c = ca_config_get();
  return (ca_pool_options){
      .max_split_size = c->max_split_size,
      .gc_threshold = c->gc_threshold,
      .memory_limit = c->memory_limit,
      .reuse = ca__reuse(c->reuse_policy),
      .outside_bytes = ca_track_bytes_on(device),
  };
}

ca_pool *ca_runtime_pool_if_any(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return NULL;
  return atomic_load_explicit(&ca__pools[device], memory_order_acquire);
}

ca_pool *ca_runtime_pool(int device) {
  ca_pool *pool = ca_runtime_pool_if_any(device);
  if (pool || device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return pool;
  pthread_once(&ca__fork_once, ca__register_fork_handler);
  pthread_mutex_lock(&ca__pools_lock);
  pool = atomic_load(&ca__pools[device]);
  if (!pool) {
    ca_pool_options opt = ca__pool_options(device);
    pool = ca_pool_create(ca_backend_cuda(), device, &opt);
    atomic_store_explicit(&ca__pools[device], pool, memory_order_release);
    if (pool && device >= atomic_load(&ca__pools_end))
      atomic_store(&ca__pools_end, device + 1);
  }
  pthread_mutex_unlock(&ca__pools_lock);
  if (pool)
    ca_lifecycle_device_used();
  return pool;
}

ca_pool *ca_runtime_pool_in(int device, void *ctx) {
  ca_pool *pool = ca_runtime_pool(device);
  if (pool && atomic_load_explicit(&ca__homes[device], memory_order_relaxed) ==
                  NULL) {
    void *none = NULL;
    atomic_compare_exchange_strong(&ca__homes[device], &none, ctx);
  }
  return pool;
}

void *ca_runtime_home(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return NULL;
  return atomic_load(&ca__homes[device]);
}

void ca_runtime_forget_home(int device) {
  if (device >= 0 && device < CUDALLOC_MAX_DEVICES)
    atomic_store(&ca__homes[device], NULL);
}

int ca_runtime_device_of_context(void *ctx) {
  int end = atomic_load_explicit(&ca__pools_end, memory_order_acquire);
  for (int d = 0; d < end; d++)
    if (ctx != NULL && atomic_load(&ca__homes[d]) == ctx)
      return d;
  return -1;
}

bool ca_runtime_in_use(void) { return atomic_load(&ca__pools_end) > 0; }

/* Whether `ask` says yes for any pool in use. */
static bool ca__any_pool(bool (*ask)(ca_pool *, uint64_t), uint64_t addr) {
  int end = atomic_load_explicit(&ca__pools_end, memory_order_acquire);
  for (int d = 0; d < end; d++) {
    ca_pool *pool = ca_runtime_pool_if_any(d);
    if (pool && ask(pool, addr))
      return true;
  }
  return false;
}

bool ca_runtime_free(uint64_t addr) { return ca__any_pool(ca_pool_free, addr); }

bool ca_runtime_holds_segment(uint64_t addr) {
  return ca__any_pool(ca_pool_holds_segment, addr);
}
