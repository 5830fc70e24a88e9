/*
 * Markers: what the pool's stream-ordered reuse waits for.
 *
 * A marker is events recorded together in one context: one on the legacy
 * stream (ordered after every blocking stream) and one on each live
 * non-blocking stream of the context (streams.h). It has passed once all
 * of them have. Events are kept for the next marker of their context, and
 * a marker whose context died counts as passed (a dead context holds no
 * work), its events dropped, never destroyed (the handle may already name
 * another context's event).
 */
#ifndef CA_MARKS_H
#define CA_MARKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "backend/streams.h"

/* Makes a marker in w's context (current) and stores its handle (never 0).
 * Refused during a capture (ca_streams_record). */
CUresult ca_marks_make(ca_where *w, uint64_t *marker);

/* Makes a marker of one event recorded on `stream` (in w's context,
 * current) and stores its handle: it passes once the work queued on that
 * stream so far has. Refused while the stream, or a capture the library
 * saw, is capturing. */
CUresult ca_marks_make_on(ca_where *w, CUstream stream, uint64_t *marker);

/* A marker as poll and wait read it: its events stay put until it is
 * forgotten. */
typedef struct ca_mark {
  bool dead;
  CUcontext ctx;
  const CUevent *events;
  size_t n;
} ca_mark;

/* The marker a handle names; false for a handle not in use. */
bool ca_marks_find(uint64_t marker, ca_mark *out);

/* In the marker's context (current). *passed: whether every event has
 * passed. During a capture no event is queried (a query in a global-mode
 * capture is refused and invalidates it, driver_facts.txt), and the answer
 * is "not yet". An event that can hold no work (its context died, or
 * broke) counts as passed. */
CUresult ca_marks_query(const ca_mark *m, bool *passed);

/* In the marker's context: waits for every event; refused during a
 * capture. */
CUresult ca_marks_sync(const ca_mark *m);

/* The handle is free again; the events go back to the spares. */
void ca_marks_forget(uint64_t marker);

/* What died: its spare events are dropped and its markers count as
 * passed. */
void ca_marks_bury(const ca_grave *g);

#endif /* CA_MARKS_H */
