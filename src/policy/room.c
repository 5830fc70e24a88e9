/*
 * Room for a request refused for memory (see room.h).
 */
#include "policy/room.h"

#include "pool/pool.h"
#include "registry/registry.h"
#include "support/budget.h"
#include "support/config.h"
#include "support/group.h"

/* How long a process waits for the rest of its group to give back their
 * cache: each answers from its watcher within a tick (20 ms), after its
 * pools have waited for their pending frees. */
#define CA__GROUP_WAIT_MS 1000
#define CA__GRANULE ((uint64_t)2 << 20)

bool ca_room_give_back(int device) {
  if (device < 0)
    return false;
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(device, pools, CA_REGISTRY_MAX_POOLS);
  uint64_t given_back = 0;
  for (size_t i = 0; i < n; i++)
    given_back += ca_pool_empty_cache(pools[i]);
  return given_back > 0;
}

/* What a request of `bytes` books when memory is short: a segment of its
 * own in whole 2 MiB granules, with leak_scan's head before the block. */
static uint64_t ca__need(uint64_t bytes) {
  uint64_t head = ca_config_get()->leak_scan ? CA__GRANULE : 0;
  return (bytes + head + CA__GRANULE - 1) & ~(CA__GRANULE - 1);
}

bool ca_room_capped(int device, uint64_t bytes) {
  const ca_budget *b = ca_registry_budget(device);
  return b != NULL && b->group &&
         ca_budget_held(b) + ca__need(bytes) > ca_budget_limit(b);
}

bool ca_room_make(int device, uint64_t bytes) {
  bool given = ca_room_give_back(device);
  if (!ca_room_capped(device, bytes))
    return given;
  const ca_budget *b = ca_registry_budget(device);
  return ca_group_ask(b->group, ca__need(bytes), CA__GROUP_WAIT_MS) || given;
}

void ca_room_refused(int device, uint64_t bytes) {
  const ca_budget *b = ca_registry_budget(device);
  if (b != NULL && b->group)
    ca_group_say_refused(b->group, device, bytes, ca__need(bytes));
}
