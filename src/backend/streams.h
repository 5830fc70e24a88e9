/*
 * The program's non-blocking streams, and fences across them.
 *
 * An event recorded on CU_STREAM_LEGACY is ordered after all prior work of
 * every blocking stream of its context (per-thread default streams
 * included), so a marker needs one more event, and a fence one more
 * tie-in, only for each live non-blocking stream: only streams created
 * with CU_STREAM_NON_BLOCKING are recorded, with the context current at
 * creation, as the hooks see them made and destroyed.
 *
 * A fence orders the device work queued after it, on every stream of its
 * context, after all the work queued before it; it never waits on the host
 * (see streams.c).
 */
#ifndef CA_STREAMS_H
#define CA_STREAMS_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

/* Where a marker or a fence is made: a context, current for the call, its
 * device, and whether it is known to be the device's primary context. */
typedef struct ca_where {
  int device;
  CUcontext ctx;
  bool primary;
} ca_where;

/* What died: a device's contexts (ctx NULL), or one context, or only the
 * device's primary context (device -1: any device). */
typedef struct ca_grave {
  int device;
  CUcontext ctx;
  bool primary_only;
} ca_grave;

static inline bool ca_grave_holds(const ca_grave *g, int device,
                                  CUcontext ctx, bool primary) {
  return (g->device < 0 || g->device == device) &&
         (g->ctx == NULL || g->ctx == ctx) && (!g->primary_only || primary);
}

/* A live stream the program created with CU_STREAM_NON_BLOCKING. */
typedef struct ca_stream {
  CUstream stream;
  CUcontext ctx; /* current when it was created: its context */
  int device;
  bool primary; /* ctx is the device's primary context */
  /* Recorded on the stream by every fence, for the legacy stream to wait
   * for; NULL when it could not be made, and then the context cannot be
   * fenced. */
  CUevent tie;
} ca_stream;

/* After a successful create. */
void ca_streams_created(CUstream stream, unsigned int flags);

/* Runs fn(stream, arg) while `stream` is known to live: the legacy and
 * per-thread default streams, or one the program created, as the hooks
 * saw, and has not destroyed (held from being destroyed meanwhile).
 * CUDA_ERROR_INVALID_HANDLE, calling nothing, for any other: the driver
 * crashes on a destroyed stream's handle. */
CUresult ca_streams_on(CUstream stream, CUresult (*fn)(CUstream, void *),
                       void *arg);

/* Destroys `stream` with the real cuStreamDestroy_v2 (`v1`: the plain
 * cuStreamDestroy export) and, when that succeeds, forgets it. A marker
 * or fence being recorded holds the destroy back until its events are
 * recorded, so no event is ever recorded on a destroyed stream we know of.
 * Returns the driver's result. */
CUresult ca_streams_destroy(CUstream stream, bool v1);

/* Forgets the streams and fence events of what died. Events of a dead
 * context are never destroyed (the handle may already name another
 * context's event) nor reused. */
void ca_streams_bury(const ca_grave *g);

/* The streams as ca_streams_record shows them: valid only inside it. */
typedef struct ca_streams_view {
  const ca_stream *v;
  size_t n;
  bool lost; /* one could not be recorded (host out of memory) */
} ca_streams_view;

typedef CUresult (*ca_streams_fn)(const ca_where *w,
                                  const ca_streams_view *streams, void *arg);

/* Runs `fn`, which records events in w's context (current), with the
 * streams held: none is destroyed meanwhile. Refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while a capture may run (an event
 * recorded on the legacy stream while a blocking stream captures would
 * join the legacy stream to the capture, which the driver refuses by
 * invalidating it). Settles w->primary first. */
CUresult ca_streams_record(ca_where *w, ca_streams_fn fn, void *arg);

/* A fence in w's context (current); refused during a capture, as a marker
 * is, and where a stream of the context has no tie event. */
CUresult ca_streams_fence(ca_where *w);

#endif /* CA_STREAMS_H */
