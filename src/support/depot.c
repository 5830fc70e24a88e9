/*
 * A depot of records numbered from 1 (see depot.h).
 */
#include "support/depot.h"

#include <sys/mman.h>

#define CA__DEPOT_ARENA (1u << 20)

static void *ca__depot_map(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Under the lock: the slot of the next id, its chunk mapped on need. */
static void *_Atomic *ca__depot_slot(ca_depot *d, uint32_t id) {
  uint32_t chunk = id / CA_DEPOT_IDS_PER_CHUNK;
  if (chunk >= CA_DEPOT_ID_CHUNKS)
    return NULL;
  void *_Atomic *slots = atomic_load(&d->ids[chunk]);
  if (slots == NULL) {
    if ((slots = ca__depot_map(CA_DEPOT_IDS_PER_CHUNK * sizeof(*slots))) == NULL)
      return NULL;
    atomic_store_explicit(&d->ids[chunk], slots, memory_order_release);
  }
  return &slots[id % CA_DEPOT_IDS_PER_CHUNK];
}

void *ca_depot_carve(ca_depot *d, size_t bytes, uint32_t *id) {
  bytes = (bytes + 15) & ~(size_t)15;
  if (bytes > CA__DEPOT_ARENA || ca__depot_slot(d, d->next_id) == NULL)
    return NULL;
  if (d->arena == NULL || (size_t)(d->arena_end - d->arena) < bytes) {
    char *arena = ca__depot_map(CA__DEPOT_ARENA);
    if (arena == NULL)
      return NULL;
    d->arena = arena;
    d->arena_end = arena + CA__DEPOT_ARENA;
  }
  void *record = d->arena;
  d->arena += bytes;
  *id = d->next_id++;
  return record;
}

void ca_depot_publish(ca_depot *d, uint32_t id, void *record) {
  atomic_store_explicit(ca__depot_slot(d, id), record, memory_order_release);
}

void *ca_depot_get(ca_depot *d, uint32_t id) {
  if (id == 0 || id / CA_DEPOT_IDS_PER_CHUNK >= CA_DEPOT_ID_CHUNKS)
    return NULL;
  void *_Atomic *slots =
      atomic_load_explicit(&d->ids[id / CA_DEPOT_IDS_PER_CHUNK], memory_order_acquire);
  return slots ? atomic_load_explicit(&slots[id % CA_DEPOT_IDS_PER_CHUNK], memory_order_acquire)
               : NULL;
}

void ca_depot_child(ca_depot *d) { atomic_store(&d->lock.state, 0); }
