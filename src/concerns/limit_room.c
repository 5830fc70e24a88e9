/*
 * Room under a memory limit (a layer around the pool, concern.h): the pool gives back its own
 * cache before it refuses a request for memory, but under memory_limit_mb
 * the device's other pools (one per context) may hold the room, and under
 * shared_limit the group's other processes. They give back theirs, and the
 * request is asked once more, with the same stack; refused even so, it
 * says why.
 */
#include "concerns/concern.h"

static bool ca__limit_room_wanted(const ca_layer_env *env, ca_path path) {
  (void)path;
  return env->cfg->memory_limit > 0;
}

static int ca__limit_room_alloc(const ca_layer *self, ca_ask *ask) {
  int r = ca_layer_alloc(self->next, ask);
  if (r != self->env->oom)
    return r;
  int device = ca_pool_device(ask->pool);
  if (self->env->make_room(device, ask->size))
    r = ca_layer_alloc(self->next, ask);
  if (r == self->env->oom)
    self->env->no_room(device, ask->size);
  return r;
}

const ca_concern ca_concern_limit_room = {
    .name = "limit_room",
    .wanted = ca__limit_room_wanted,
    .alloc = ca__limit_room_alloc,
};
