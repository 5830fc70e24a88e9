/*
 * Stream captures in progress, as the policy sees them begin and end.
 *
 * Synchronizing a device invalidates every capture on it (measured on the
 * H200, driver 580: any capture mode, blocking or non-blocking stream,
 * from any thread), a marker or fence recorded during one joins the legacy
 * stream to it, and no driver query finds a capture on a non-blocking
 * stream: so the backend asks here before any of them.
 */
#ifndef CA_CAPTURE_H
#define CA_CAPTURE_H

#include <stdbool.h>

#include <stdatomic.h>
#include <stdbool.h>

#include <cuda.h>

/* A capture began on `stream`, the handle the program passed; `per_thread`:
 * called through a _ptsz entry point (where stream 0 means the calling
 * thread's default stream). */
void ca_capture_begun(CUstream stream, bool per_thread);

/* After an end-capture call, whatever it returned: forgets the capture if
 * the stream no longer captures. */
void ca_capture_ended(CUstream stream, bool per_thread);

/* How many captures the policy saw begin may still run. */
extern atomic_int ca_captures_live;

/* Whether a capture the policy saw begin may still run: no driver call. */
static inline bool ca_capture_seen(void) {
  return atomic_load_explicit(&ca_captures_live, memory_order_acquire) > 0;
}

/* Whether any capture is active that a context-wide synchronization, or an
 * event on the legacy stream, would break: ca_capture_seen, then the
 * driver's own answer for captures begun by a path we do not see (one
 * query, of the calling thread's current context). */
bool ca_capture_active(void);

#endif /* CA_CAPTURE_H */
