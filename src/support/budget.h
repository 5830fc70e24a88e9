/*
 * A device's memory budget: memory_limit_mb as one counter that everything
 * holding device memory on the device books against before it asks the
 * driver, every pool (one per context) and every allocation passed through
 * to the driver. Booking is one compare-and-swap, so allocations racing in
 * several threads and contexts can never together pass the limit: there is
 * no window between checking the room and taking it. Under shared_limit
 * the limit is a group's (group.h): a booking is taken in its region, under
 * its lock, and counted here too as this process's part.
 *
 * Plain C, no CUDA: the pool uses it as it is, and its tests build one.
 */
#ifndef CA_BUDGET_H
#define CA_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "support/group.h"

typedef struct ca_budget {
  uint64_t limit;           /* bytes; 0: none (bookings are only counted);
                               read through ca_budget_limit */
  uint32_t group;           /* shared_limit: the device's entry in its group
                               (group.h); 0: the limit is this process's */
  _Atomic uint64_t booked;  /* bytes this process holds or is asking for */
  _Atomic uint64_t peak;    /* the most ever booked at once */
  _Atomic uint64_t peak_ns; /* CLOCK_MONOTONIC when it was reached */
} ca_budget;

/* Raises the peak to `held`, noting when: the report and the trace say
 * when the device's memory peaked. Served bookings are rare (segments,
 * passed-through allocations), so the clock is read only there. */
static inline void ca_budget_note_peak(ca_budget *b, uint64_t held) {
  uint64_t peak = atomic_load_explicit(&b->peak, memory_order_relaxed);
  while (held > peak) {
    if (atomic_compare_exchange_weak_explicit(&b->peak, &peak, held,
                                              memory_order_relaxed,
                                              memory_order_relaxed)) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      atomic_store_explicit(&b->peak_ns,
                            (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                            memory_order_relaxed);
      return;
    }
  }
}

/* Books `bytes`, or books nothing and returns false when the limit would
 * be passed: in a group, the group's cap across its processes. */
static inline bool ca_budget_book(ca_budget *b, uint64_t bytes) {
  if (b->group) {
    if (!ca_group_book(b->group, bytes))
      return false;
    atomic_fetch_add_explicit(&b->booked, bytes, memory_order_relaxed);
    return true;
  }
  uint64_t now = atomic_load_explicit(&b->booked, memory_order_relaxed);
  do {
    if (b->limit && (bytes > b->limit || now > b->limit - bytes))
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &b->booked, &now, now + bytes, memory_order_relaxed,
      memory_order_relaxed));
  return true;
}

/* Gives back `bytes` booked before. */
static inline void ca_budget_unbook(ca_budget *b, uint64_t bytes) {
  atomic_fetch_sub_explicit(&b->booked, bytes, memory_order_relaxed);
  if (b->group)
    ca_group_unbook(b->group, bytes);
}

/* The limit bookings are held to: in a group, the group's cap (which the
 * process that finds the group empty sets); 0: none. */
static inline uint64_t ca_budget_limit(const ca_budget *b) {
  return b->group ? ca_group_cap() : b->limit;
}

/* What this process has booked. */
static inline uint64_t ca_budget_booked(const ca_budget *b) {
  return atomic_load_explicit(&b->booked, memory_order_relaxed);
}

/* What counts against the limit: this process's bookings, or in a group
 * every process's. */
static inline uint64_t ca_budget_held(const ca_budget *b) {
  return b->group ? ca_group_held(b->group) : ca_budget_booked(b);
}

/* A booking was served (the driver gave the memory): the peak counts what
 * is booked now. Booking alone never raises it: a request the driver then
 * refuses held nothing (a refused 64 GiB request read as a 64 GiB peak).
 * Another thread's booking still before the driver counts here too. */
static inline void ca_budget_served(ca_budget *b) {
  ca_budget_note_peak(b, ca_budget_booked(b));
}

#endif /* CA_BUDGET_H */
