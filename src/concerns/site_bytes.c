/*
 * The allocation's stack and its site's bytes (a layer around the pool, concern.h): with
 * backtrace_depth (or growth_report or memcheck, which keep CA_SITES_DEPTH
 * frames),
 * each request's stack is taken once, kept with the block (the pool's
 * tag), and the block's bytes counted to it until the free.
 */
#include "concerns/site_bytes.h"

#include "concerns/concern.h"
#include "leaks/sites.h"
#include "leaks/stacks.h"
#include "pyframes/pyframes.h"
#include "unwind/unwind.h"

static int ca__site_depth(const ca_config *cfg) {
  return cfg->backtrace_depth > 0                  ? cfg->backtrace_depth
         : cfg->growth_report || cfg->memcheck ? CA_SITES_DEPTH
                                                : 0;
}

uint32_t ca_site_stack(const ca_config *cfg) {
  int depth = ca__site_depth(cfg);
  if (depth == 0)
    return 0;
  uintptr_t pcs[CA_STACK_MAX_FRAMES];
  size_t n = ca_unwind_outside_self(pcs, (size_t)depth);
  if (cfg->python_frames)
    n = ca_pyframes_merge(pcs, n, CA_STACK_MAX_FRAMES, (size_t)depth);
  return ca_stacks_intern(pcs, n);
}

static bool ca__site_bytes_wanted(const ca_layer_env *env, ca_path path) {
  (void)path;
  return ca__site_depth(env->cfg) > 0;
}

static int ca__site_bytes_alloc(const ca_layer *self, ca_ask *ask) {
  ask->stack = ca_site_stack(self->env->cfg);
  int r = ca_layer_alloc(self->next, ask);
  if (r == 0)
    ca_sites_alloc(ask->stack, ask->size);
  return r;
}

static int ca__site_bytes_free(const ca_layer *self, ca_give *give) {
  give->describe = true;
  int r = ca_layer_free(self->next, give);
  if (r == 0)
    ca_sites_free(give->block.tag, give->block.requested);
  return r;
}

const ca_concern ca_concern_site_bytes = {
    .name = "site_bytes",
    .wanted = ca__site_bytes_wanted,
    .alloc = ca__site_bytes_alloc,
    .free = ca__site_bytes_free,
};
