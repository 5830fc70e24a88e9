/*
 * The process-wide state: settings, the backend in use and one pool per
 * device, created on first use.
 */
#ifndef CA_RUNTIME_H
#define CA_RUNTIME_H

#include <stdbool.h>

#include "config.h"
#include "pool.h"

/* The pool serving `device`, created on first use with the CUDA backend and
 * the process's settings. NULL when `device` is outside
 * [0, CUDALLOC_MAX_DEVICES) or the host is out of memory. */
ca_pool *ca_runtime_pool(int device);

/* Like ca_runtime_pool, for an allocation made in context `ctx` (a
 * CUcontext): the pool notes the context its segments live in, when it has
 * none noted yet. Two contexts on one device share one pool, noted with the
 * first. */
ca_pool *ca_runtime_pool_in(int device, void *ctx);

/* The context noted for `device`'s pool, or NULL. */
void *ca_runtime_home(int device);

/* Forgets the context noted for `device` (it died); the next allocation
 * notes its own. */
void ca_runtime_forget_home(int device);

/* The device whose pool lives in context `ctx`, or -1. */
int ca_runtime_device_of_context(void *ctx);

/* Whether this process (a forked child: since the fork) has made a pool. */
bool ca_runtime_in_use(void);

/* The pool serving `device` if one exists already; never creates one. */
ca_pool *ca_runtime_pool_if_any(int device);

/* Gives `addr` back to whichever pool handed it out. Returns false when no
 * pool owns it. Makes no driver call: asking the driver for the current
 * device would cost more than asking each pool in use. */
bool ca_runtime_free(uint64_t addr);

/* Whether any pool holds a segment based at `addr` (ca_pool_holds_segment). */
bool ca_runtime_holds_segment(uint64_t addr);

#endif /* CA_RUNTIME_H */
