/*
 * The library's life in a process, beside the calls it intercepts: the
 * leak report and the summary at exit, the summary on SIGUSR1, and what a
 * context that dies with its memory does to the pools and the report.
 *
 * All of it is silent in a process that never touches device memory.
 */
#ifndef CA_LIFECYCLE_H
#define CA_LIFECYCLE_H

#include <stdbool.h>

#include "pool/pool.h"
#include "leaks/reach.h"
#include "report/report.h"

/* The process has started to use device memory (a pool was made, or an
 * allocation passed through was recorded). Starts the SIGUSR1 watcher when
 * stats_signal:1. Cheap after the first call. */
void ca_lifecycle_device_used(void);

/* Context `ctx` (a CUcontext) of `device` died and took its memory with it
 * (a reset, destroy or final release the driver has carried out); `pool`
 * is what ca_registry_dying returned for it (NULL if none). The blocks
 * still live in it are reported as leaked at this point, then forgotten,
 * and its pool's segments are never handed out again. */
void ca_lifecycle_context_gone(void *ctx, ca_pool *pool, int device);

/* Prints a report of every device now: the live blocks (`leaks`) and the
 * memory summary (`stats`). With `roots` (reach.h: filled at the library's
 * entry on this thread) the live blocks are classed lost or still
 * reachable. */
void ca_lifecycle_report(ca_report_event event, bool leaks, bool stats,
                         const ca_reach_roots *roots);

/* The report of a request refused for memory on `device` (oom.h), with
 * the device's live blocks unless `oom->brief`. */
void ca_lifecycle_report_oom(int device, const ca_report_oom *oom);

/* PyTorch's memory snapshot of this moment (report.h) written to `path`:
 * every pool's segments and blocks, the history (concerns/history.h), and
 * last a request of `bytes` refused on `device`, which had `device_free`
 * bytes left (0: unknown); one line says where, or why not. */
void ca_lifecycle_oom_snapshot(const char *path, int device, uint64_t bytes,
                               uint64_t device_free);

/* Starts the timeline into `path` ("%p": the pid) with every allocation,
 * as trace_path does, where none is being written yet (true then too), and
 * the watcher that writes it; false when the file cannot be made (one line
 * said why). On the program's thread. */
bool ca_lifecycle_trace_begin(const char *path);

/* Writes what the timeline recorded so far to its file, now. */
void ca_lifecycle_trace_flush(void);

#endif /* CA_LIFECYCLE_H */
