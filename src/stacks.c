/*
 * The stack depot (see stacks.h).
 *
 * A hash table of chains, whose heads are published with a release store
 * after the record is complete, so readers walk chains without a lock; ids
 * index a two-level table of the same records. Records are carved from
 * mmap'd arenas and never freed.
 */
#include "stacks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "fork.h"
#include "lock.h"

#define CA__BUCKETS (1u << 16)
#define CA__IDS_PER_CHUNK 4096u
#define CA__ID_CHUNKS 4096u /* up to 16M distinct stacks */
#define CA__ARENA_BYTES (1u << 20)

typedef struct ca__stack {
  struct ca__stack *next; /* in its bucket; fixed before publication */
  uint64_t hash;
  uint32_t id;
  uint32_t n;
  uintptr_t pcs[];
} ca__stack;

static _Atomic(ca__stack *) ca__buckets[CA__BUCKETS];
static _Atomic(ca__stack *_Atomic *) ca__ids[CA__ID_CHUNKS];
static ca_lock ca__insert_lock = CA_LOCK_INIT;
static uint32_t ca__next_id = 1; /* under the lock */
static char *ca__arena, *ca__arena_end; /* under the lock */

/* A fork while another thread stores a stack would leave the child's lock
 * held forever. Nothing is half-published (a record becomes visible in one
 * store), so the child may simply start with the lock free. */
static void ca__stacks_child(void) {
  atomic_store(&ca__insert_lock.state, 0);
}

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

static void *ca__map(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Under the lock. */
static ca__stack *ca__carve(size_t n) {
  size_t bytes = sizeof(ca__stack) + n * sizeof(uintptr_t);
  bytes = (bytes + 15) & ~(size_t)15;
  if (ca__arena == NULL || (size_t)(ca__arena_end - ca__arena) < bytes) {
    char *arena = ca__map(CA__ARENA_BYTES);
    if (arena == NULL)
      return NULL;
    ca__arena = arena;
    ca__arena_end = arena + CA__ARENA_BYTES;
  }
  ca__stack *s = (ca__stack *)(void *)ca__arena;
  ca__arena += bytes;
  return s;
}

/* Under the lock: the id slot for a new stack, its chunk mapped on need. */
static _Atomic(ca__stack *) *ca__id_slot(uint32_t id) {
  uint32_t chunk = id / CA__IDS_PER_CHUNK;
  if (chunk >= CA__ID_CHUNKS)
    return NULL;
  ca__stack *_Atomic *slots = atomic_load(&ca__ids[chunk]);
  if (slots == NULL) {
    slots = ca__map(CA__IDS_PER_CHUNK * sizeof(*slots));
    if (slots == NULL)
      return NULL;
    atomic_store_explicit(&ca__ids[chunk], slots, memory_order_release);
  }
  return &slots[id % CA__IDS_PER_CHUNK];
}

/* Under the lock. */
static ca__stack *ca__insert(_Atomic(ca__stack *) *bucket, uint64_t hash,
                             const uintptr_t *pcs, size_t n) {
  _Atomic(ca__stack *) *slot = ca__id_slot(ca__next_id);
  ca__stack *s = slot ? ca__carve(n) : NULL;
  if (s == NULL)
    return NULL;
  s->hash = hash;
  s->n = (uint32_t)n;
  s->id = ca__next_id++;
  memcpy(s->pcs, pcs, n * sizeof(pcs[0]));
  s->next = atomic_load_explicit(bucket, memory_order_relaxed);
  atomic_store_explicit(slot, s, memory_order_release);
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
  ca_lock_acquire(&ca__insert_lock);
  s = ca__stack_find(bucket, hash, pcs, n); /* another thread may have won */
  if (s == NULL)
    s = ca__insert(bucket, hash, pcs, n);
  ca_lock_release(&ca__insert_lock);
  return s ? s->id : 0;
}

size_t ca_stacks_get(uint32_t id, const uintptr_t **pcs) {
  *pcs = NULL;
  if (id == 0 || id / CA__IDS_PER_CHUNK >= CA__ID_CHUNKS)
    return 0;
  ca__stack *_Atomic *slots = atomic_load_explicit(
      &ca__ids[id / CA__IDS_PER_CHUNK], memory_order_acquire);
  ca__stack *s = slots ? atomic_load_explicit(&slots[id % CA__IDS_PER_CHUNK],
                                              memory_order_acquire)
                       : NULL;
  if (s == NULL)
    return 0;
  *pcs = s->pcs;
  return s->n;
}
