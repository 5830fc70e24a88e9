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

/* The pool serving `device` if one exists already; never creates one. */
ca_pool *ca_runtime_pool_if_any(int device);

/* Gives `addr` back to whichever pool handed it out. Returns false when no
 * pool owns it. Makes no driver call: asking the driver for the current
 * device would cost more than asking each pool in use. */
bool ca_runtime_free(uint64_t addr);

/* Whether any pool holds a segment based at `addr` (ca_pool_holds_segment). */
bool ca_runtime_holds_segment(uint64_t addr);

#endif /* CA_RUNTIME_H */
