/*
 * The rule of stream captures (a layer around the pool, concern.h): the driver refuses cuMemAlloc
 * and cuMemFree from a thread whose capture mode forbids them, and
 * invalidates the capture (driver_facts.txt); a pooled request or free
 * gets the same answer, before anything is done. Stream-ordered requests
 * are allowed in a capture, so only the driver's own calls have this
 * layer.
 */
#include "concerns/concern.h"

static bool ca__capture_rule_wanted(const ca_layer_env *env, ca_path path) {
  (void)env;
  return path == CA_PATH_SYNC;
}

/* During a capture the policy saw begin, the driver is asked; outside
 * one, the check is one load (the asking kept out of line, so that the
 * common case saves no registers). */
static __attribute__((noinline)) int
ca__capture_rule_alloc_asked(const ca_layer *self, ca_ask *ask) {
  int refused = self->env->allowed();
  return refused ? refused : ca_layer_alloc(self->next, ask);
}

static __attribute__((noinline)) int
ca__capture_rule_free_asked(const ca_layer *self, ca_give *give) {
  int refused = self->env->allowed();
  return refused ? refused : ca_layer_free(self->next, give);
}

static int ca__capture_rule_alloc(const ca_layer *self, ca_ask *ask) {
  if (__builtin_expect(ca_layer_capturing(self->env), 0))
    return ca__capture_rule_alloc_asked(self, ask);
  return ca_layer_alloc(self->next, ask);
}

static int ca__capture_rule_free(const ca_layer *self, ca_give *give) {
  if (__builtin_expect(ca_layer_capturing(self->env), 0))
    return ca__capture_rule_free_asked(self, give);
  return ca_layer_free(self->next, give);
}

const ca_concern ca_concern_capture_rule = {
    .name = "capture_rule",
    .wanted = ca__capture_rule_wanted,
    .alloc = ca__capture_rule_alloc,
    .free = ca__capture_rule_free,
};
