/*
 * The timeline's events (a layer around the pool, concern.h): with trace_path, each pooled
 * allocation and free is recorded, once the watcher has started the trace
 * (until then, and after it stops, the check is one load); also once
 * cudalloc_trace_start has started one.
 */
#include "concerns/concern.h"

#include "timeline/trace.h"

/* With trace_path, or once a trace was started at run time
 * (cudalloc_trace_start: the chains are composed again then). */
static bool ca__trace_events_wanted(const ca_layer_env *env, ca_path path) {
  (void)path;
  return env->cfg->trace_path[0] != '\0' || env->traced;
}

static int ca__trace_events_alloc(const ca_layer *self, ca_ask *ask) {
  int r = ca_layer_alloc(self->next, ask);
  if (r == 0)
    ca_trace_alloc(ca_pool_device(ask->pool), ask->addr, ask->size,
                   ask->stack);
  return r;
}

/* The event names the bytes the allocation asked for: the pool describes
 * the block while the trace records. */
static int ca__trace_events_free(const ca_layer *self, ca_give *give) {
  if (__atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE))
    give->describe = true;
  int r = ca_layer_free(self->next, give);
  if (r == 0 && give->describe)
    ca_trace_free(give->block.device, give->addr, give->block.requested);
  return r;
}

const ca_concern ca_concern_trace_events = {
    .name = "trace_events",
    .wanted = ca__trace_events_wanted,
    .alloc = ca__trace_events_alloc,
    .free = ca__trace_events_free,
};
