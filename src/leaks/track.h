/*
 * Device memory the pool does not serve but the program holds: allocations
 * passed through to the driver (pitched, managed, stream-ordered, virtual
 * memory handles), kept in a live table so that the leak report and the
 * statistics see all of the program's device memory, not only the pool's.
 *
 * Addresses and cuMemCreate handles are kept apart: they are different
 * namespaces and may hold equal numbers. Every function is thread-safe; none
 * calls into CUDA or into the program. A forked child starts with an empty
 * table: its parent's allocations are not its own.
 */
#ifndef CA_TRACK_H
#define CA_TRACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum ca_track_kind {
  CA_TRACK_PITCH,      /* cuMemAllocPitch_v2 */
  CA_TRACK_MANAGED,    /* cuMemAllocManaged */
  CA_TRACK_ASYNC,      /* cuMemAllocAsync(_ptsz) */
  CA_TRACK_POOL_ASYNC, /* cuMemAllocFromPoolAsync(_ptsz) */
  CA_TRACK_VMM,        /* cuMemCreate: key is the handle, not an address */
} ca_track_kind;

typedef struct ca_tracked {
  uint64_t key;     /* the device address, or the handle for CA_TRACK_VMM */
  uint64_t size;    /* bytes the driver was asked for (pitch * height) */
  uint64_t seq;     /* allocation number among tracked ones, from 1 */
  int device;       /* -1 when unknown */
  void *ctx;        /* the CUcontext current at allocation; NULL unknown */
  uint32_t stack;   /* the allocation's stack id (stacks.h); 0 for none */
  ca_track_kind kind;
} ca_tracked;

/* The driver function that allocates this kind ("cuMemAllocManaged", ...). */
const char *ca_track_kind_call(ca_track_kind kind);

/* Records a live allocation. A key already live in the same namespace is
 * replaced (its free went by a path we do not see): then returns true with
 * the entry replaced in *replaced. Host out of memory: the allocation goes
 * unrecorded, which only costs the report a line. */
bool ca_track_add(ca_track_kind kind, uint64_t key, uint64_t size, int device,
                  void *ctx, uint32_t stack, ca_tracked *replaced);

/* Puts back an entry that ca_track_forget_* took out (its free failed),
 * as it was. */
void ca_track_restore(const ca_tracked *t);

/* Forgets the live allocation at a device address (any kind but VMM), or
 * the cuMemCreate handle. Returns whether one was live; fills *out if so and
 * out is not NULL. A caller forgets before the driver frees: once freed,
 * the address (or handle) may be handed out again, to another thread, at
 * once. */
bool ca_track_forget_addr(uint64_t addr, ca_tracked *out);
bool ca_track_forget_handle(uint64_t handle, ca_tracked *out);

/* Calls fn once per live entry, in no particular order, under the
 * table's lock: fn must not call back into the table. Returns the count. */
size_t ca_track_foreach(void (*fn)(const ca_tracked *t, void *arg), void *arg);

/* The number of allocations recorded since the process (or, in a forked
 * child, the child) started. */
uint64_t ca_track_total(void);

/* Calls fn on every live entry allocated in context `ctx`, whose memory
 * dies with it (every kind but VMM handles, which outlive contexts), under
 * the table's lock: fn must not call back into the table. Returns the
 * count. */
size_t ca_track_foreach_in(void *ctx,
                           void (*fn)(const ca_tracked *t, void *arg),
                           void *arg);

/* The same, then forgets each (fn may be NULL). */
size_t ca_track_drop_context(void *ctx,
                             void (*fn)(const ca_tracked *t, void *arg),
                             void *arg);

#endif /* CA_TRACK_H */
