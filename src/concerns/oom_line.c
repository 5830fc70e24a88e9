/*
 * The out-of-memory line (a layer around the pool, concern.h): with verbose, a cuMemAlloc the pool
 * could not serve says why, in one line, once every other layer has tried.
 * (The allocator slot says its own, with advice: policy/slot/slot.c.)
 */
#include "concerns/concern.h"

#include "support/log.h"
#include "support/stats.h"

static bool ca__oom_line_wanted(const ca_layer_env *env, ca_path path) {
  return env->cfg->verbose >= 1 && path == CA_PATH_SYNC;
}

static void ca__oom_line_say(const ca_layer *self, const ca_ask *ask) {
  cudalloc_device_stats s;
  char req[32];
  ca_held_text t;
  ca_pool_get_stats(ask->pool, &s);
  ca_format_bytes(req, sizeof(req), ask->size);
  ca_stats_held_text(&s, self->env->cfg->memory_limit, &t);
  ca_log("out of memory on device %d: requested %s; in use %s, cached %s, "
         "largest free block %s, limit %s, fragmentation %.1f%%",
         s.device, req, t.used, t.cached, t.largest, t.limit,
         100.0 * s.fragmentation);
}

static int ca__oom_line_alloc(const ca_layer *self, ca_ask *ask) {
  int r = ca_layer_alloc(self->next, ask);
  if (r == self->env->oom)
    ca__oom_line_say(self, ask);
  return r;
}

const ca_concern ca_concern_oom_line = {
    .name = "oom_line",
    .wanted = ca__oom_line_wanted,
    .alloc = ca__oom_line_alloc,
};
