/*
 * Blocks used on other streams (see recorded.h): an open-addressed table
 * in the library's own data, under one lock, since record_stream is rare
 * and a free looks only when the table holds anything.
 */
#include "recorded.h"

#include <pthread.h>
#include <stdatomic.h>

#include "fork.h"

#define CA__SLOTS 4096u /* a power of two */

typedef struct ca__entry {
  uint64_t addr; /* 0: empty */
  uint32_t n;    /* streams noted, past CA_RECORDED_STREAMS included */
  uint64_t streams[CA_RECORDED_STREAMS];
} ca__entry;

static ca__entry ca__table[CA__SLOTS];
static atomic_uint ca__used;
static pthread_mutex_t ca__lock = PTHREAD_MUTEX_INITIALIZER;

static void ca__recorded_child(void) {
  pthread_mutex_init(&ca__lock, NULL);
  for (unsigned i = 0; i < CA__SLOTS; i++)
    ca__table[i].addr = 0;
  atomic_store(&ca__used, 0);
}

static const ca_fork_handlers ca__recorded_fork = {.child = ca__recorded_child};

static unsigned ca__home(uint64_t addr) {
  return (unsigned)((addr >> 9) * 0x9E3779B97F4A7C15ull >> 52) & (CA__SLOTS - 1);
}

/* Under the lock: the entry of `addr`, or the empty slot it would take
 * (NULL when the table is full). */
static ca__entry *ca__entry_of(uint64_t addr) {
  for (unsigned i = 0, at = ca__home(addr); i < CA__SLOTS;
       i++, at = (at + 1) & (CA__SLOTS - 1))
    if (ca__table[at].addr == addr || ca__table[at].addr == 0)
      return &ca__table[at];
  return NULL;
}

bool ca_recorded_add(uint64_t addr, uint64_t stream) {
  ca_fork_register(CA_FORK_RECORDED, &ca__recorded_fork);
  pthread_mutex_lock(&ca__lock);
  ca__entry *e = ca__entry_of(addr);
  bool room = e != NULL && (e->addr != 0 || atomic_load(&ca__used) < CA__SLOTS - 1);
  if (room && e->addr == 0) {
    *e = (ca__entry){.addr = addr};
    atomic_fetch_add(&ca__used, 1);
  }
  bool known = false;
  for (uint32_t i = 0; room && i < e->n && i < CA_RECORDED_STREAMS; i++)
    known = known || e->streams[i] == stream;
  if (room && !known) {
    if (e->n < CA_RECORDED_STREAMS)
      e->streams[e->n] = stream;
    e->n++;
  }
  pthread_mutex_unlock(&ca__lock);
  return room;
}

/* Under the lock: empties slot `at`, moving back the entries after it that
 * would no longer be found across the hole (linear probing's deletion). */
static void ca__remove(unsigned at) {
  unsigned hole = at;
  for (unsigned next = (at + 1) & (CA__SLOTS - 1); ca__table[next].addr != 0;
       next = (next + 1) & (CA__SLOTS - 1)) {
    unsigned home = ca__home(ca__table[next].addr);
    /* Movable when its home is not within (hole, next]. */
    bool between = hole <= next ? (home > hole && home <= next)
                                : (home > hole || home <= next);
    if (!between) {
      ca__table[hole] = ca__table[next];
      hole = next;
    }
  }
  ca__table[hole].addr = 0;
  atomic_fetch_sub(&ca__used, 1);
}

size_t ca_recorded_take(uint64_t addr, uint64_t *out, bool *overflow) {
  *overflow = false;
  if (atomic_load_explicit(&ca__used, memory_order_relaxed) == 0)
    return 0;
  pthread_mutex_lock(&ca__lock);
  ca__entry *e = ca__entry_of(addr);
  size_t n = 0;
  if (e != NULL && e->addr == addr) {
    n = e->n < CA_RECORDED_STREAMS ? e->n : CA_RECORDED_STREAMS;
    for (size_t i = 0; i < n; i++)
      out[i] = e->streams[i];
    *overflow = e->n > CA_RECORDED_STREAMS;
    ca__remove((unsigned)(e - ca__table));
  }
  pthread_mutex_unlock(&ca__lock);
  return n;
}
