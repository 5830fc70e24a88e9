/*
 * The pool registry: one pool per CUDA context, created on first use, and
 * one memory budget per device. A pool's segments, frees and markers all
 * belong to its context, so when a context dies (destroyed, reset,
 * released for good) exactly its pool dies with it.
 */
#ifndef CA_REGISTRY_H
#define CA_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

#include "support/config.h"
#include "pool/pool.h"

/* How many contexts get a pool over the process's life (a slot is never
 * reused: see registry.c); allocations in later contexts go to the driver
 * unpooled. */
#define CA_REGISTRY_MAX_POOLS 256

/* The pool serving the calling thread's current context: the hot path's
 * look-up, one driver call (the current context) when the pool exists; a
 * new pool is made, with the CUDA backend and the process's settings, on
 * the context's first request (one driver call more, for its device; *made
 * says so). NULL when no context is current (the driver knows the right
 * error), its device is outside [0, CUDALLOC_MAX_DEVICES), it is dying,
 * every slot is taken, or the host is out of memory. */
ca_pool *ca_registry_current_pool(bool *made);

/* The pool serving `device`'s primary context (the one the runtime and the
 * frameworks use), whatever context the calling thread has current, none
 * included: the allocator slot's look-up, with no driver call once the
 * pool exists. The primary context is retained for the process's life and
 * made active if need be; the pool is made on its first request (*made
 * says so). NULL, with the driver's answer in *why, when the device has no
 * primary context to serve from (CUDA_ERROR_INVALID_DEVICE, ...); NULL
 * with CUDA_ERROR_NOT_READY when it has one but no pool can serve it (the
 * context is being reset, every slot is taken, the host is out of memory),
 * so that the driver serves the request instead. */
ca_pool *ca_registry_primary_pool(int device, bool *made, CUresult *why);

/* The memory budget of `device` (memory_limit_mb, budget.h), which its
 * pools and the allocations passed through to the driver there book
 * against; NULL for a device outside [0, CUDALLOC_MAX_DEVICES). */
ca_budget *ca_registry_budget(int device);

/* The same budget, in its group: under shared_limit the device joins the
 * group the first time (one driver call, for the device's UUID, once per
 * device). What books in the budget, or answers for its group, asks this. */
ca_budget *ca_registry_budget_joined(int device);

/* shared_limit: `device`'s entry in the group (budget.h's `group`), 0 when
 * it has none or has not booked yet. No driver call. */
uint32_t ca_registry_group(int device);

/* Gives back `bytes` booked in `device`'s budget (nothing for a device
 * outside the range, which has none). */
void ca_registry_unbook(int device, uint64_t bytes);

/* The pools of `device` (every device for -1), at most `max` into out;
 * returns how many there are. */
size_t ca_registry_pools(int device, ca_pool **out, size_t max);

/* The statistics of `device`: its pools' added up. Returns false, zeroing
 * *out but for the device, when it has no pool. */
bool ca_registry_device_stats(int device, cudalloc_device_stats *out);

/* Starts the reported peaks of `device`'s pools (every device's for -1)
 * again from their current figures (ca_pool_reset_peaks). */
void ca_registry_reset_peaks(int device);

/* Context `ctx` may be about to die (called before the driver call that
 * may kill it): its pool, if it has one, is taken out of service, so that
 * no allocation finds it while the driver may already hand the same
 * handle to a new context; allocations in `ctx` meanwhile go to the driver.
 * Returns the pool, or NULL when the context had none. Then exactly one
 * of: ca_registry_survived (the context lives on; the pool serves it again)
 * or, after the caller has reported its blocks, ca_registry_buried. */
ca_pool *ca_registry_dying(void *ctx);
void ca_registry_survived(ca_pool *pool);

/* Context `ctx` died with its memory, and its blocks have been reported:
 * its pool's blocks and segments, the allocations passed through in it,
 * and their bookings in the device's budget are forgotten, and the pool's
 * slot is never used again (the pool object stays valid for threads still
 * holding it). `pool` is what ca_registry_dying returned (may be NULL). */
void ca_registry_buried(void *ctx, ca_pool *pool);

/* Gives `addr` back to whichever pool handed it out, describing the block
 * in *freed (ca_pool_free); freed on *stream when `stream` is not NULL
 * (ca_pool_free_on). Returns false when no pool owns it. Makes no driver
 * call: asking the driver for the current context would cost more than
 * asking each pool in use. */
bool ca_registry_free(uint64_t addr, const uint64_t *stream,
                      ca_live_block *freed);

/* Whether any pool holds a segment based at `addr` (ca_pool_holds_segment). */
bool ca_registry_holds_segment(uint64_t addr);

/* Where `addr` lies in the pools: the pool whose segment holds it, that
 * pool's slot (its number in the process, never reused) and the span. */
typedef struct ca_registry_span {
  ca_pool *pool;
  int slot;
  ca_pool_span span;
} ca_registry_span;

/* Whether a segment of any pool holds `addr`; *out says where. */
bool ca_registry_find(uint64_t addr, ca_registry_span *out);

/* Whether a segment of any pool holds `addr`; if so, [*start, *end) the
 * requested bytes of the live block holding it ({0, 0}: none does). */
bool ca_registry_bounds(uint64_t addr, uint64_t *start, uint64_t *end);

/* The segment of a pool that holds `addr` was freed behind the library's
 * back (ca_pool_segment_lost). Returns false when no pool holds `addr`. */
bool ca_registry_lost(uint64_t addr);

/* Bytes `device`'s pools would give back to the driver for a request that
 * the driver cannot serve (ca_pool_releasable, added up). */
uint64_t ca_registry_releasable(int device);

/* Whether this process (a forked child: since the fork) has made a pool. */
bool ca_registry_in_use(void);

#endif /* CA_REGISTRY_H */
