/*
 * The live table of passed-through allocations (see track.h).
 */
#include "leaks/track.h"

#include <pthread.h>
#include <stdlib.h>

#include "support/fork.h"
#include "support/lock.h"
#include "support/meta.h"
#include "leaks/sites.h"

#include "support/meta_hash.h"

typedef struct ca__entry {
  ca_tracked t;
  UT_hash_handle hh;
  struct ca__entry *next_free;
} ca__entry;

/* Entries come from chunks of this many and go back to a free list, so a
 * program that allocates and frees in a loop costs no malloc per call. */
#define CA__CHUNK 128

static pthread_mutex_t ca__lock = PTHREAD_MUTEX_INITIALIZER;
static ca__entry *ca__by_addr;   /* uthash head: device addresses */
static ca__entry *ca__by_handle; /* uthash head: cuMemCreate handles */
static ca__entry *ca__free_list;
static uint64_t ca__seq;

static void ca__give_entry(ca__entry *e);

/* Under the lock: forgets every entry of one table. */
static void ca__clear(ca__entry **head) {
  ca__entry *e, *tmp;
  HASH_ITER(hh, *head, e, tmp) {
    HASH_DEL(*head, e);
    ca__give_entry(e);
  }
}

/* A fork while another thread holds the lock would leave the child's copy
 * locked forever; taking it around fork keeps the table whole in both. The
 * child then forgets its parent's allocations: they are not its own to free
 * or to report. */
static void ca__track_prepare(void) { pthread_mutex_lock(&ca__lock); }
static void ca__track_parent(void) { pthread_mutex_unlock(&ca__lock); }
static void ca__track_child(void) {
  ca__clear(&ca__by_addr);
  ca__clear(&ca__by_handle);
  ca__seq = 0;
  pthread_mutex_unlock(&ca__lock);
}
static const ca_fork_handlers ca__track_fork = {
    ca__track_prepare, ca__track_parent, ca__track_child};

static void ca__lock_table(void) {
  ca_fork_register(CA_FORK_TRACK, &ca__track_fork);
  ca_locks_note(1);
  pthread_mutex_lock(&ca__lock);
}

static void ca__unlock_table(void) {
  pthread_mutex_unlock(&ca__lock);
  ca_locks_note(-1);
}

/* Under the lock. */
static ca__entry *ca__take_entry(void) {
  if (ca__free_list == NULL) {
    ca__entry *chunk = ca_meta_alloc(CA__CHUNK * sizeof(*chunk));
    if (chunk == NULL)
      return NULL;
    for (int i = 0; i < CA__CHUNK; i++) {
      chunk[i].next_free = ca__free_list;
      ca__free_list = &chunk[i];
    }
  }
  ca__entry *e = ca__free_list;
  ca__free_list = e->next_free;
  return e;
}

/* Under the lock. */
static void ca__give_entry(ca__entry *e) {
  e->next_free = ca__free_list;
  ca__free_list = e;
}

const char *ca_track_kind_call(ca_track_kind kind) {
  switch (kind) {
  case CA_TRACK_PITCH:
    return "cuMemAllocPitch";
  case CA_TRACK_MANAGED:
    return "cuMemAllocManaged";
  case CA_TRACK_ASYNC:
    return "cuMemAllocAsync";
  case CA_TRACK_POOL_ASYNC:
    return "cuMemAllocFromPoolAsync";
  case CA_TRACK_VMM:
    return "cuMemCreate";
  }
  return "?";
}

/* Under the lock: stores *t at its key, replacing an entry live there
 * (copied into *replaced). Returns whether one was. Host out of memory:
 * nothing is stored. The live bytes by site follow the table. */
static bool ca__track_put(const ca_tracked *t, ca_tracked *replaced) {
  ca__entry **head = t->kind == CA_TRACK_VMM ? &ca__by_handle : &ca__by_addr;
  ca__entry *e = NULL;
  HASH_FIND(hh, *head, &t->key, sizeof(t->key), e);
  bool was_live = e != NULL;
  if (was_live) {
    *replaced = e->t;
    ca_sites_free(e->t.stack, e->t.size);
    e->t = *t;
  } else if ((e = ca__take_entry()) != NULL) {
    e->t = *t;
    HASH_ADD(hh, *head, t.key, sizeof(e->t.key), e);
    if (!CA_HASH_ADDED(e)) {
      ca__give_entry(e);
      e = NULL;
    }
  }
  if (e != NULL)
    ca_sites_alloc(t->stack, t->size);
  return was_live;
}

bool ca_track_add(ca_track_kind kind, uint64_t key, uint64_t size, int device,
                  void *ctx, uint32_t stack, ca_tracked *replaced) {
  ca_tracked t = {.key = key,
                  .size = size,
                  .device = device,
                  .ctx = ctx,
                  .stack = stack,
                  .kind = kind};
  ca__lock_table();
  t.seq = ++ca__seq;
  bool was_live = ca__track_put(&t, replaced);
  ca__unlock_table();
  return was_live;
}

void ca_track_restore(const ca_tracked *t) {
  ca_tracked replaced;
  ca__lock_table();
  ca__track_put(t, &replaced);
  ca__unlock_table();
}

static bool ca__forget(ca__entry **head, uint64_t key, ca_tracked *out) {
  ca__lock_table();
  ca__entry *e = NULL;
  HASH_FIND(hh, *head, &key, sizeof(key), e);
  if (e != NULL) {
    if (out != NULL)
      *out = e->t;
    ca_sites_free(e->t.stack, e->t.size);
    HASH_DEL(*head, e);
    ca__give_entry(e);
  }
  ca__unlock_table();
  return e != NULL;
}

bool ca_track_forget_addr(uint64_t addr, ca_tracked *out) {
  return ca__forget(&ca__by_addr, addr, out);
}

bool ca_track_forget_handle(uint64_t handle, ca_tracked *out) {
  return ca__forget(&ca__by_handle, handle, out);
}

size_t ca_track_foreach(void (*fn)(const ca_tracked *t, void *arg),
                        void *arg) {
  size_t n = 0;
  ca__lock_table();
  ca__entry *heads[2] = {ca__by_addr, ca__by_handle};
  for (int i = 0; i < 2; i++) {
    for (ca__entry *e = heads[i]; e != NULL; e = e->hh.next, n++)
      fn(&e->t, arg);
  }
  ca__unlock_table();
  return n;
}

uint64_t ca_track_total(void) {
  ca__lock_table();
  uint64_t n = ca__seq;
  ca__unlock_table();
  return n;
}

/* Calls fn (if not NULL) on each live entry allocated in `ctx` (every
 * kind but VMM handles, which outlive contexts), under the lock; with
 * `drop`, forgets each after. Returns the count. */
static size_t ca__each_in(void *ctx, void (*fn)(const ca_tracked *t, void *arg),
                          void *arg, bool drop) {
  size_t n = 0;
  ca__lock_table();
  ca__entry *e, *tmp;
  HASH_ITER(hh, ca__by_addr, e, tmp) {
    if (ctx == NULL || e->t.ctx != ctx)
      continue;
    if (fn != NULL)
      fn(&e->t, arg);
    if (drop) {
      ca_sites_free(e->t.stack, e->t.size);
      HASH_DEL(ca__by_addr, e);
      ca__give_entry(e);
    }
    n++;
  }
  ca__unlock_table();
  return n;
}

size_t ca_track_foreach_in(void *ctx,
                           void (*fn)(const ca_tracked *t, void *arg),
                           void *arg) {
  return ca__each_in(ctx, fn, arg, false);
}

size_t ca_track_drop_context(void *ctx,
                             void (*fn)(const ca_tracked *t, void *arg),
                             void *arg) {
  return ca__each_in(ctx, fn, arg, true);
}
