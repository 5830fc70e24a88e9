/*
 * The recent history (a layer around the pool, concern.h; history.h):
 * with oom_snapshot, each pooled allocation and free is kept in a ring of
 * the latest CA_HISTORY_ENTRIES, for the snapshot of the first out of
 * memory. Off, it is not in the chains and costs nothing.
 */
#include "concerns/history.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include "concerns/concern.h"
#include "support/meta.h"

/* The ring, in the library's own memory (meta.h: it holds device
 * addresses, which the scan of host memory must not find), made at the
 * first entry. */
static pthread_mutex_t ca__lock = PTHREAD_MUTEX_INITIALIZER;
static ca_report_step *ca__ring;
static uint64_t ca__count; /* entries ever kept */

static void ca__keep(bool alloc, int device, uint64_t addr, uint64_t bytes,
                     const uint64_t *stream, uint32_t stack) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ca_report_step e = {.us = (uint64_t)ts.tv_sec * 1000000u +
                            (uint64_t)ts.tv_nsec / 1000u,
                      .alloc = alloc, .device = device, .addr = addr,
                      .bytes = bytes, .stream = stream ? *stream : 0,
                      .stack = stack};
  pthread_mutex_lock(&ca__lock);
  if (ca__ring == NULL)
    ca__ring = ca_meta_alloc(CA_HISTORY_ENTRIES * sizeof(*ca__ring));
  if (ca__ring != NULL) /* else host memory is out: nothing kept */
    ca__ring[ca__count++ % CA_HISTORY_ENTRIES] = e;
  pthread_mutex_unlock(&ca__lock);
}

size_t ca_history_copy(ca_report_step *out, size_t max) {
  pthread_mutex_lock(&ca__lock);
  uint64_t kept = ca__count < CA_HISTORY_ENTRIES ? ca__count : CA_HISTORY_ENTRIES;
  size_t n = kept < max ? (size_t)kept : max;
  for (size_t i = 0; i < n; i++)
    out[i] = ca__ring[(ca__count - n + i) % CA_HISTORY_ENTRIES];
  pthread_mutex_unlock(&ca__lock);
  return n;
}

static bool ca__history_wanted(const ca_layer_env *env, ca_path path) {
  (void)path;
  return env->cfg->oom_snapshot[0] != '\0';
}

static int ca__history_alloc(const ca_layer *self, ca_ask *ask) {
  int r = ca_layer_alloc(self->next, ask);
  if (r == 0)
    ca__keep(true, ca_pool_device(ask->pool), ask->addr, ask->size,
             ask->stream, ask->stack);
  return r;
}

/* The entry names the bytes the allocation asked for: the pool describes
 * the block. */
static int ca__history_free(const ca_layer *self, ca_give *give) {
  give->describe = true;
  int r = ca_layer_free(self->next, give);
  if (r == 0)
    ca__keep(false, give->block.device, give->addr,
             give->block.requested, give->stream, give->block.tag);
  return r;
}

const ca_concern ca_concern_history = {
    .name = "history",
    .wanted = ca__history_wanted,
    .alloc = ca__history_alloc,
    .free = ca__history_free,
};
