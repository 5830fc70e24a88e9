/*
 * An NVTX tool told of each block (a layer around the pool, concern.h):
 * when one is attached (compute-sanitizer --nvtx yes, say), each block is
 * a region of exactly its requested bytes from the moment it is handed out
 * to its free, told before the pool may hand the block out again, so that
 * the tool checks the program's accesses against the block as it would
 * against the driver's own allocation. With no tool attached the layer is
 * not composed: nothing is paid.
 */
#include "concerns/concern.h"

static bool ca__nvtx_regions_wanted(const ca_layer_env *env, ca_path path) {
  (void)path;
  return env->regions != NULL;
}

static int ca__nvtx_regions_alloc(const ca_layer *self, ca_ask *ask) {
  int r = ca_layer_alloc(self->next, ask);
  if (r == 0)
    self->env->regions->add(ask);
  return r;
}

static int ca__nvtx_regions_free(const ca_layer *self, ca_give *give) {
  self->env->regions->remove(give->addr);
  return ca_layer_free(self->next, give);
}

const ca_concern ca_concern_nvtx_regions = {
    .name = "nvtx_regions",
    .wanted = ca__nvtx_regions_wanted,
    .alloc = ca__nvtx_regions_alloc,
    .free = ca__nvtx_regions_free,
};
