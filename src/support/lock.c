/*
 * The contended half of ca_lock (see lock.h).
 */
#include "support/lock.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

__thread int ca_locks_held __attribute__((tls_model("initial-exec")));

/* Spins this many times before sleeping: a pool's critical sections are
 * short unless they call the driver. */
#define CA__LOCK_SPINS 100

void ca_lock_wait(ca_lock *l) {
  for (int i = 0; i < CA__LOCK_SPINS; i++) {
    int expected = 0;
    if (atomic_load_explicit(&l->state, memory_order_relaxed) == 0 &&
        atomic_compare_exchange_weak_explicit(&l->state, &expected, 1,
                                              memory_order_acquire,
                                              memory_order_relaxed))
      return;
    __builtin_ia32_pause();
  }
  /* Announce a waiter by moving to 2; whoever releases then wakes one. */
  while (atomic_exchange_explicit(&l->state, 2, memory_order_acquire) != 0)
    syscall(SYS_futex, &l->state, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void ca_lock_wake(ca_lock *l) {
  syscall(SYS_futex, &l->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
