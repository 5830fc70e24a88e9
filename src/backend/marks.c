/*
 * Markers (see marks.h).
 */
#include "backend/marks.h"

#include <pthread.h>
#include <stdlib.h>

#include "backend/capture.h"
#include "cudalloc.h"
#include "driver/driver.h"
#include "support/fork.h"
#include "support/grow.h"

/* An event no marker uses, kept for the next marker of its context. */
typedef struct ca__event {
  CUevent event;
  CUcontext ctx;
  bool primary;
} ca__event;

typedef struct ca__spares {
  ca__event *v;
  size_t n, cap;
} ca__spares;

/* Events recorded together: [0] on the legacy stream, one on each live
 * non-blocking stream of `ctx`. */
typedef struct ca__marker {
  bool used;
  bool dead; /* its context died: it has passed; its events are dropped */
  bool primary;
  int device;
  CUcontext ctx;
  CUevent *events;
  size_t n, cap;
  size_t index;     /* in ca__markers: the handle is index + 1 */
  size_t next_free; /* while unused: the next free slot, or SIZE_MAX */
} ca__marker;

/* Each marker is allocated once and never moves, so poll and wait read
 * its events outside the lock while the table grows. */
static ca__marker **ca__markers;
static size_t ca__nmarkers, ca__markers_cap;
static size_t ca__free_marker = SIZE_MAX;
static ca__spares ca__spare[CUDALLOC_MAX_DEVICES];
/* Guards the markers and the spare events. Never held across a driver
 * call; taken after the streams' lock when both are held. */
static pthread_mutex_t ca__marks_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread holds the lock would leave the child's copy
 * locked forever. Every marker the child's pools still hold counts as
 * passed (there is no device work to wait for in the child), and no event
 * of the parent is used again. */
static void ca__marks_prepare(void) { pthread_mutex_lock(&ca__marks_lock); }
static void ca__marks_parent(void) { pthread_mutex_unlock(&ca__marks_lock); }
static void ca__marks_child(void) {
  for (int i = 0; i < CUDALLOC_MAX_DEVICES; i++)
    ca__spare[i].n = 0;
  for (size_t i = 0; i < ca__nmarkers; i++)
    ca__markers[i]->dead = true;
  pthread_mutex_unlock(&ca__marks_lock);
}
static const ca_fork_handlers ca__marks_fork = {
    ca__marks_prepare, ca__marks_parent, ca__marks_child};

static void ca__marks_take_lock(void) {
  ca_fork_register(CA_FORK_MARKS, &ca__marks_fork);
  pthread_mutex_lock(&ca__marks_lock);
}

/* Errors that say "a stream capture is in the way", not "this event can
 * hold no work": the marker's state is then unknown. */
static bool ca__capture_error(CUresult r) {
  switch (r) {
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
  case CUDA_ERROR_STREAM_CAPTURE_MERGE:
  case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
  case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
  case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
  case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
  case CUDA_ERROR_CAPTURED_EVENT:
    return true;
  default:
    return false;
  }
}

/* ------------------------------------------------------------------------ */
/* Spare events                                                              */

/* Under ca__marks_lock: gives `n` events of `ctx` back for later markers.
 * Past what the host can hold, the rest are dropped (a few events stay
 * allocated in a live context). */
static void ca__spares_put(int device, CUcontext ctx, bool primary,
                           const CUevent *events, size_t n) {
  ca__spares *sp = &ca__spare[device];
  for (size_t i = 0; i < n; i++) {
    if (sp->n == sp->cap) {
      ca__event *v = ca_grow(sp->v, &sp->cap, sizeof(*v));
      if (v == NULL)
        return;
      sp->v = v;
    }
    sp->v[sp->n++] = (ca__event){events[i], ctx, primary};
  }
}

/* Under ca__marks_lock: moves spare events of the marker's context into it,
 * up to `want`. */
static void ca__spares_take(ca__marker *m, size_t want) {
  ca__spares *sp = &ca__spare[m->device];
  for (size_t i = sp->n; i-- > 0 && m->n < want;) {
    if (sp->v[i].ctx != m->ctx)
      continue;
    m->events[m->n++] = sp->v[i].event;
    sp->v[i] = sp->v[--sp->n];
  }
}

/* ------------------------------------------------------------------------ */
/* Making a marker                                                           */

/* Under ca__marks_lock: a marker slot, taken, with room for `want` events
 * and as many spare ones in it as there are; NULL when out of host memory. */
static ca__marker *ca__marker_open(const ca_where *w, size_t want) {
  ca__marker *m;
  if (ca__free_marker != SIZE_MAX) {
    m = ca__markers[ca__free_marker];
    ca__free_marker = m->next_free;
  } else {
    if (ca__nmarkers == ca__markers_cap) {
      ca__marker **v = ca_grow(ca__markers, &ca__markers_cap, sizeof(*v));
      if (v == NULL)
        return NULL;
      ca__markers = v;
    }
    m = calloc(1, sizeof(*m));
    if (m == NULL)
      return NULL;
    m->index = ca__nmarkers;
    ca__markers[ca__nmarkers++] = m;
  }
  if (m->cap < want) {
    CUevent *ev = realloc(m->events, want * sizeof(*ev));
    if (ev == NULL) {
      m->next_free = ca__free_marker;
      ca__free_marker = m->index;
      return NULL;
    }
    m->events = ev;
    m->cap = want;
  }
  *m = (ca__marker){.used = true, .primary = w->primary, .device = w->device,
                    .ctx = w->ctx, .events = m->events, .cap = m->cap,
                    .index = m->index};
  ca__spares_take(m, want);
  return m;
}

/* Under ca__marks_lock: the slot is free again; its events go back to the
 * spares from `from` on, unless their context died. */
static void ca__marker_close(ca__marker *m, size_t from) {
  if (!m->dead && from < m->n)
    ca__spares_put(m->device, m->ctx, m->primary, m->events + from,
                   m->n - from);
  m->used = false;
  m->n = 0;
  m->next_free = ca__free_marker;
  ca__free_marker = m->index;
}

/* Creates the events the spares could not give, in the current context. */
static CUresult ca__marker_fill(const ca_driver_api *d, ca__marker *m,
                                size_t want) {
  while (m->n < want) {
    CUevent e = NULL;
    CUresult r = d->event_create(&e, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS)
      return r;
    m->events[m->n++] = e;
  }
  return CUDA_SUCCESS;
}

/* Records events[0] on the legacy stream and one more on each known
 * non-blocking stream of the marker's context (the marker holds exactly
 * one event per stream). A record that fails (the stream died in a way we
 * did not see) is skipped and its event dropped: it may be the event that
 * is bad. Leaves m->n at the events recorded. */
static CUresult ca__marker_record(const ca_driver_api *d,
                                  const ca_streams_view *s, ca__marker *m) {
  CUresult r = d->event_record(m->events[0], CU_STREAM_LEGACY);
  if (r != CUDA_SUCCESS)
    return r;
  size_t done = 1, left = m->n;
  for (size_t i = 0; i < s->n && done < left; i++) {
    if (s->v[i].ctx != m->ctx)
      continue;
    if (d->event_record(m->events[done], s->v[i].stream) == CUDA_SUCCESS)
      done++;
    else
      m->events[done] = m->events[--left];
  }
  m->n = done;
  return CUDA_SUCCESS;
}

static size_t ca__streams_in(const ca_streams_view *s, CUcontext ctx) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++)
    n += s->v[i].ctx == ctx;
  return n;
}

/* With the streams held (ca_streams_record), so that the streams counted
 * are the ones recorded on, and none is destroyed meanwhile. */
static CUresult ca__mark_recorded(const ca_where *w, const ca_streams_view *s,
                                  void *marker) {
  const ca_driver_api *d = ca_driver();
  if (s->lost)
    return CUDA_ERROR_OUT_OF_MEMORY;
  size_t want = 1 + ca__streams_in(s, w->ctx);
  ca__marks_take_lock();
  ca__marker *m = ca__marker_open(w, want);
  pthread_mutex_unlock(&ca__marks_lock);
  if (m == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  size_t keep_from = 0;
  CUresult r = ca__marker_fill(d, m, want);
  if (r == CUDA_SUCCESS) {
    r = ca__marker_record(d, s, m);
    /* A legacy record refused by a capture leaves its event sound; any
     * other failure may be the event's own. */
    keep_from = r != CUDA_SUCCESS && !ca__capture_error(r) ? 1 : 0;
  }
  ca__marks_take_lock();
  if (r == CUDA_SUCCESS)
    *(uint64_t *)marker = (uint64_t)m->index + 1;
  else
    ca__marker_close(m, keep_from);
  pthread_mutex_unlock(&ca__marks_lock);
  return r;
}

/* Whether the driver has every event call a marker needs. */
static bool ca__has_events(const ca_driver_api *d) {
  return d->event_create != NULL && d->event_record != NULL &&
         d->event_query != NULL && d->event_synchronize != NULL;
}

CUresult ca_marks_make(ca_where *w, uint64_t *marker) {
  const ca_driver_api *d = ca_driver();
  if (!ca__has_events(d))
    return CUDA_ERROR_NOT_SUPPORTED;
  return ca_streams_record(w, ca__mark_recorded, marker);
}

typedef struct ca__mark_on_arg {
  ca_where *w;
  uint64_t *marker;
} ca__mark_on_arg;

/* ca_marks_make_on's work, on a stream known to live. */
static CUresult ca__mark_on_live(CUstream stream, void *arg) {
  const ca_driver_api *d = ca_driver();
  ca_where *w = ((ca__mark_on_arg *)arg)->w;
  uint64_t *marker = ((ca__mark_on_arg *)arg)->marker;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (ca_capture_active() ||
      (d->stream_is_capturing != NULL &&
       (d->stream_is_capturing(stream, &st) != CUDA_SUCCESS ||
        st != CU_STREAM_CAPTURE_STATUS_NONE)))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  w->primary = w->primary || ca_driver_is_primary(w->device, w->ctx);
  ca__marks_take_lock();
  ca__marker *m = ca__marker_open(w, 1);
  pthread_mutex_unlock(&ca__marks_lock);
  if (m == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r = ca__marker_fill(d, m, 1);
  if (r == CUDA_SUCCESS)
    r = d->event_record(m->events[0], stream);
  ca__marks_take_lock();
  if (r == CUDA_SUCCESS)
    *marker = (uint64_t)m->index + 1;
  else
    ca__marker_close(m, 1); /* the event may be what failed */
  pthread_mutex_unlock(&ca__marks_lock);
  return r;
}

/* A marker of one event, recorded on `stream` alone: what a block freed on
 * that stream waits for before another stream may have it. Never on a
 * capturing stream (the record would join the graph), nor while any
 * capture the library saw is under way, nor on a stream not known to live
 * (ca_streams_on). */
CUresult ca_marks_make_on(ca_where *w, CUstream stream, uint64_t *marker) {
  if (!ca__has_events(ca_driver()))
    return CUDA_ERROR_NOT_SUPPORTED;
  ca__mark_on_arg arg = {w, marker};
  return ca_streams_on(stream, ca__mark_on_live, &arg);
}

/* ------------------------------------------------------------------------ */
/* Asking about a marker                                                     */

bool ca_marks_find(uint64_t marker, ca_mark *out) {
  bool found = false;
  ca__marks_take_lock();
  if (marker != 0 && marker <= ca__nmarkers &&
      ca__markers[marker - 1]->used) {
    const ca__marker *m = ca__markers[marker - 1];
    *out = (ca_mark){m->dead, m->ctx, m->events, m->n};
    found = true;
  }
  pthread_mutex_unlock(&ca__marks_lock);
  return found;
}

CUresult ca_marks_query(const ca_mark *m, bool *passed) {
  const ca_driver_api *d = ca_driver();
  *passed = false;
  if (d->event_query == NULL || ca_capture_active())
    return CUDA_SUCCESS;
  for (size_t i = 0; i < m->n; i++) {
    CUresult r = d->event_query(m->events[i]);
    if (r == CUDA_ERROR_NOT_READY || ca__capture_error(r))
      return CUDA_SUCCESS;
  }
  *passed = true;
  return CUDA_SUCCESS;
}

CUresult ca_marks_sync(const ca_mark *m) {
  const ca_driver_api *d = ca_driver();
  if (d->event_synchronize == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (ca_capture_active())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  for (size_t i = 0; i < m->n; i++) {
    CUresult r = d->event_synchronize(m->events[i]);
    if (ca__capture_error(r))
      return r;
  }
  return CUDA_SUCCESS;
}

void ca_marks_forget(uint64_t marker) {
  ca__marks_take_lock();
  if (marker != 0 && marker <= ca__nmarkers &&
      ca__markers[marker - 1]->used)
    ca__marker_close(ca__markers[marker - 1], 0);
  pthread_mutex_unlock(&ca__marks_lock);
}

/* ------------------------------------------------------------------------ */
/* Context deaths                                                            */

void ca_marks_bury(const ca_grave *g) {
  ca__marks_take_lock();
  for (int dev = 0; dev < CUDALLOC_MAX_DEVICES; dev++) {
    if (g->device >= 0 && g->device != dev)
      continue;
    ca__spares *sp = &ca__spare[dev];
    size_t j = 0;
    for (size_t i = 0; i < sp->n; i++)
      if (!ca_grave_holds(g, dev, sp->v[i].ctx, sp->v[i].primary))
        sp->v[j++] = sp->v[i];
    sp->n = j;
  }
  for (size_t i = 0; i < ca__nmarkers; i++) {
    ca__marker *m = ca__markers[i];
    if (m->used && ca_grave_holds(g, m->device, m->ctx, m->primary))
      m->dead = true;
  }
  pthread_mutex_unlock(&ca__marks_lock);
}
