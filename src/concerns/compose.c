/*
 * The one place the concerns are composed (see concern.h).
 */
#include "concerns/concern.h"

#include <stdio.h>

/* Every concern, outermost first: a request meets them in this order, and
 * a free too. A capture's refusal comes before anything is done; the stack
 * is taken once, before the timeline and the history record it and before a retry for room asks
 * the pool again with it; an NVTX tool hears of a block last, once served,
 * and of its free first, before the pool may hand it out again; memcheck
 * sets a block's bytes once it is served, and holds a free back from the
 * pool in its quarantine. Each is `ca_concern_NAME`, defined in NAME.c. */
#define CA_CONCERNS(X)                                                         \
  X(capture_rule)                                                              \
  X(site_bytes)                                                                \
  X(trace_events)                                                              \
  X(history)                                                                   \
  X(limit_room)                                                                \
  X(nvtx_regions)                                                              \
  X(memcheck)

#define CA__DECLARE(name) extern const ca_concern ca_concern_##name;
CA_CONCERNS(CA__DECLARE)
#undef CA__DECLARE

#define CA__ENTRY(name) &ca_concern_##name,
static const ca_concern *const ca__concerns[] = {CA_CONCERNS(CA__ENTRY)};
#undef CA__ENTRY

#define CA__NCONCERNS (sizeof(ca__concerns) / sizeof(ca__concerns[0]))
_Static_assert(CA__NCONCERNS < CA_CHAIN_MAX, "a chain holds every concern");

static int ca__pass_free(const ca_layer *self, ca_give *give) {
  return ca_layer_free(self->next, give);
}

const ca_layer *ca_compose(ca_chain *chain, const ca_layer_env *env,
                           ca_path path, const ca_layer *bottom) {
  size_t n = 0;
  for (size_t i = 0; i < CA__NCONCERNS; i++) {
    const ca_concern *c = ca__concerns[i];
    if (c->wanted(env, path))
      chain->layers[n++] = (ca_layer){.name = c->name,
                                      .alloc = c->alloc,
                                      .free = c->free ? c->free : ca__pass_free,
                                      .env = env};
  }
  chain->layers[n] = *bottom;
  chain->n = n + 1;
  for (size_t i = 0; i < n; i++)
    chain->layers[i].next = &chain->layers[i + 1];
  return &chain->layers[0];
}

void ca_chain_describe(const ca_chain *chain, char *buf, size_t len) {
  size_t at = 0;
  if (len > 0)
    buf[0] = '\0';
  for (size_t i = 0; i < chain->n && at < len; i++) {
    int w = snprintf(buf + at, len - at, "%s%s", i ? "+" : "",
                     chain->layers[i].name);
    if (w < 0)
      break;
    at += (size_t)w;
  }
}
