/*
 * The stack depot (see stacks.h).
 *
 * A hash table of chains, whose heads are published with a release store
 * after the record is complete, so readers walk chains without a lock; the
 * records, their ids and their memory are a depot's (depot.h).
 */
#include "leaks/stacks.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "support/depot.h"
#include "support/fork.h"
#include "support/lock.h"

#define CA__BUCKETS (1u << 16)

typedef struct ca__stack {
  struct ca__stack *next; /* in its bucket; fixed before publication */
  uint64_t hash;
  uint32_t id;
  uint32_t n;
  uintptr_t pcs[];
} ca__stack;

static _Atomic(ca__stack *) ca__buckets[CA__BUCKETS];
static ca_depot ca__stack_depot = CA_DEPOT_INIT;

static void ca__stacks_child(void) { ca_depot_child(&ca__stack_depot); }

static const ca_fork_handlers ca__stacks_fork = {.child = ca__stacks_child};

static uint64_t ca__stack_hash(const uintptr_t *pcs, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15u ^ n;
  for (size_t i = 0; i < n; i++) {
    h ^= (uint64_t)pcs[i];
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 32;
  }
  return h;
}

static bool ca__same(const ca__stack *s, uint64_t hash, const uintptr_t *pcs,
                     size_t n) {
  return s->hash == hash && s->n == n &&
         memcmp(s->pcs, pcs, n * sizeof(pcs[0])) == 0;
}

static ca__stack *ca__stack_find(_Atomic(ca__stack *) *bucket,
                                 uint64_t hash, const uintptr_t *pcs,
                                 size_t n) {
  for (ca__stack *s = atomic_load_explicit(bucket, memory_order_acquire); s;
       s = s->next)
    if (ca__same(s, hash, pcs, n))
      return s;
  return NULL;
}

/* Under the depot's lock. */
static ca__stack *ca__insert(_Atomic(ca__stack *) *bucket, uint64_t hash,
                             const uintptr_t *pcs, size_t n) {
  uint32_t id;
  ca__stack *s = ca_depot_carve(&ca__stack_depot,
                                sizeof(ca__stack) + n * sizeof(uintptr_t), &id);
  if (s == NULL)
    return NULL;
  s->hash = hash;
  s->n = (uint32_t)n;
  s->id = id;
  memcpy(s->pcs, pcs, n * sizeof(pcs[0]));
  s->next = atomic_load_explicit(bucket, memory_order_relaxed);
  ca_depot_publish(&ca__stack_depot, id, s);
  atomic_store_explicit(bucket, s, memory_order_release);
  return s;
}

uint32_t ca_stacks_intern(const uintptr_t *pcs, size_t n) {
  if (n == 0)
    return 0;
  if (n > CA_STACK_MAX_FRAMES)
    n = CA_STACK_MAX_FRAMES;
  uint64_t hash = ca__stack_hash(pcs, n);
  _Atomic(ca__stack *) *bucket = &ca__buckets[hash % CA__BUCKETS];
  ca__stack *s = ca__stack_find(bucket, hash, pcs, n);
  if (s != NULL)
    return s->id;
  ca_fork_register(CA_FORK_STACKS, &ca__stacks_fork);
  ca_lock_acquire(&ca__stack_depot.lock);
  s = ca__stack_find(bucket, hash, pcs, n); /* another thread may have won */
  if (s == NULL)
    s = ca__insert(bucket, hash, pcs, n);
  ca_lock_release(&ca__stack_depot.lock);
  return s ? s->id : 0;
}

size_t ca_stacks_get(uint32_t id, const uintptr_t **pcs) {
  const ca__stack *s = ca_depot_get(&ca__stack_depot, id);
  *pcs = s ? s->pcs : NULL;
  return s ? s->n : 0;
}
