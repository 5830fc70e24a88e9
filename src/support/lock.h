/*
 * A small mutex for the pool's hot path: one atomic instruction to take and
 * one to give back when uncontended (glibc's pthread mutex costs about ten
 * times that in instructions), and a futex wait, not a spin, when contended,
 * since a holder may be inside a slow driver call.
 *
 * States: 0 free, 1 held, 2 held with (possible) waiters. Built on C11
 * atomics, so ThreadSanitizer sees its ordering.
 */
#ifndef CA_LOCK_H
#define CA_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>

typedef struct ca_lock {
  atomic_int state;
} ca_lock;

#define CA_LOCK_INIT {0}

/* How many of the library's locks the calling thread holds. A thread that
 * calls exit() from a signal handler which interrupted it inside the
 * library must not run the exit report: the report would wait for a lock
 * the thread itself holds. ca_lock counts itself; the library's few other
 * locks count with ca_locks_note. */
extern __thread int ca_locks_held __attribute__((tls_model("initial-exec")));

static inline void ca_locks_note(int delta) { ca_locks_held += delta; }

void ca_lock_wait(ca_lock *l);
void ca_lock_wake(ca_lock *l);

static inline void ca_lock_acquire(ca_lock *l) {
  int expected = 0;
  ca_locks_note(1);
  if (!atomic_compare_exchange_strong_explicit(&l->state, &expected, 1,
                                               memory_order_acquire,
                                               memory_order_relaxed))
    ca_lock_wait(l);
}

/* Takes the lock only if it is free, never waiting: a caller that finds it
 * held learns that another thread is using it now. Counts itself before the
 * attempt, as ca_lock_acquire does, so that a signal handler never finds the
 * lock held but uncounted. */
static inline bool ca_lock_try_acquire(ca_lock *l) {
  int expected = 0;
  ca_locks_note(1);
  if (atomic_compare_exchange_strong_explicit(&l->state, &expected, 1,
                                              memory_order_acquire,
                                              memory_order_relaxed))
    return true;
  ca_locks_note(-1);
  return false;
}

static inline void ca_lock_release(ca_lock *l) {
  if (atomic_exchange_explicit(&l->state, 0, memory_order_release) == 2)
    ca_lock_wake(l);
  ca_locks_note(-1);
}

#endif /* CA_LOCK_H */
