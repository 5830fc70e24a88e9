/*
 * The fork registry (see fork.h).
 */
#include "support/fork.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

static _Atomic(const ca_fork_handlers *) ca__slots[CA_FORK_SLOTS];
/* The slots as the fork in progress found them: the thread that forks runs
 * prepare, parent and child one after another, and no other fork runs
 * meanwhile in this process (glibc serializes them). */
static const ca_fork_handlers *ca__now[CA_FORK_SLOTS];
static pthread_once_t ca__once = PTHREAD_ONCE_INIT;

static void ca__prepare(void) {
  for (int i = 0; i < CA_FORK_SLOTS; i++) {
    ca__now[i] = atomic_load(&ca__slots[i]);
    if (ca__now[i] != NULL && ca__now[i]->prepare != NULL)
      ca__now[i]->prepare();
  }
}

static void ca__parent(void) {
  for (int i = CA_FORK_SLOTS; i-- > 0;)
    if (ca__now[i] != NULL && ca__now[i]->parent != NULL)
      ca__now[i]->parent();
}

static void ca__child(void) {
  for (int i = CA_FORK_SLOTS; i-- > 0;)
    if (ca__now[i] != NULL && ca__now[i]->child != NULL)
      ca__now[i]->child();
}

static void ca__install(void) {
  pthread_atfork(ca__prepare, ca__parent, ca__child);
}

void ca_fork_register(ca_fork_slot slot, const ca_fork_handlers *h) {
  if (atomic_load_explicit(&ca__slots[slot], memory_order_acquire) != NULL)
    return;
  pthread_once(&ca__once, ca__install);
  const ca_fork_handlers *none = NULL;
  atomic_compare_exchange_strong(&ca__slots[slot], &none, h);
}
