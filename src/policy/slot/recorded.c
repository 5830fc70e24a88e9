/*
 * Blocks used on other streams (see recorded.h): an address map in the
 * library's own data, under one lock, since record_stream is rare and a
 * free looks only when the map holds anything.
 */
#include "policy/slot/recorded.h"

#include <pthread.h>
#include <stdatomic.h>

#include "policy/slot/addrmap.h"
#include "support/fork.h"

typedef struct ca__entry {
  uint64_t addr;
  uint32_t n; /* streams noted, past CA_RECORDED_STREAMS included */
  uint64_t streams[CA_RECORDED_STREAMS];
} ca__entry;

static ca__entry ca__table[4096];
static ca_addrmap ca__map = CA_ADDRMAP_INIT(ca__table);
static atomic_uint ca__used;
static pthread_mutex_t ca__lock = PTHREAD_MUTEX_INITIALIZER;

static void ca__recorded_child(void) {
  pthread_mutex_init(&ca__lock, NULL);
  ca_addrmap_clear(&ca__map);
  atomic_store(&ca__used, 0);
}

static const ca_fork_handlers ca__recorded_fork = {.child = ca__recorded_child};

bool ca_recorded_add(uint64_t addr, uint64_t stream) {
  ca_fork_register(CA_FORK_RECORDED, &ca__recorded_fork);
  pthread_mutex_lock(&ca__lock);
  ca__entry *e = ca_addrmap_put(&ca__map, addr);
  bool known = false;
  for (uint32_t i = 0; e && i < e->n && i < CA_RECORDED_STREAMS; i++)
    known = known || e->streams[i] == stream;
  if (e && !known) {
    if (e->n < CA_RECORDED_STREAMS)
      e->streams[e->n] = stream;
    e->n++;
  }
  atomic_store(&ca__used, ca__map.used);
  pthread_mutex_unlock(&ca__lock);
  return e != NULL;
}

size_t ca_recorded_take(uint64_t addr, uint64_t *out, bool *overflow) {
  *overflow = false;
  if (atomic_load_explicit(&ca__used, memory_order_relaxed) == 0)
    return 0;
  pthread_mutex_lock(&ca__lock);
  ca__entry *e = ca_addrmap_find(&ca__map, addr);
  size_t n = 0;
  if (e != NULL) {
    n = e->n < CA_RECORDED_STREAMS ? e->n : CA_RECORDED_STREAMS;
    for (size_t i = 0; i < n; i++)
      out[i] = e->streams[i];
    *overflow = e->n > CA_RECORDED_STREAMS;
    ca_addrmap_remove(&ca__map, e);
  }
  atomic_store(&ca__used, ca__map.used);
  pthread_mutex_unlock(&ca__lock);
  return n;
}
