/*
 * The program's non-blocking streams, and fences (see streams.h).
 */
#include "backend/streams.h"

#include <pthread.h>

#include "backend/capture.h"
#include "cudalloc.h"
#include "driver/driver.h"
#include "support/fork.h"
#include "support/grow.h"

static ca_stream *ca__streams;
static size_t ca__nstreams, ca__streams_cap;
/* A stream could not be recorded (out of host memory): a marker would not
 * cover it, so no marker is made any more, nor a fence. */
static bool ca__streams_lost;
/* Read-held while a marker or a fence records its events, write-held to
 * change the table and across the real cuStreamDestroy: no event is
 * recorded on a stream being destroyed. Taken before any other lock of the
 * backend's. */
static pthread_rwlock_t ca__streams_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Each context's fence event: recorded on its legacy stream at every fence,
 * only there, so that a stream made later can be made to wait for it. */
typedef struct ca__fence_rec {
  CUcontext ctx;
  int device;
  bool primary;
  CUevent event;
} ca__fence_rec;

/* Every stream the program created that has not been destroyed, blocking
 * or not, with its context: the streams a marker may be recorded on
 * alone (ca_streams_on). The driver crashes on a destroyed stream's handle
 * (cuStreamIsCapturing: driver_facts.txt), so a stream made or destroyed
 * where the hooks cannot see (the library loaded as a plug-in only) is
 * never touched. Under ca__streams_lock. */
typedef struct ca__alive_rec {
  CUstream stream;
  CUcontext ctx;
  int device;
  bool primary;
} ca__alive_rec;

static ca__alive_rec *ca__alive;
static size_t ca__nalive, ca__alive_cap;

static ca__fence_rec *ca__fences;
static size_t ca__nfences, ca__fences_cap;
/* Guards the fence events; taken after ca__streams_lock, never held across
 * a driver call. */
static pthread_mutex_t ca__fences_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread holds one of the locks would leave the
 * child's copy locked forever: both are held across fork. The child uses
 * none of the parent's streams or events. */
static void ca__streams_prepare(void) {
  pthread_rwlock_wrlock(&ca__streams_lock);
  pthread_mutex_lock(&ca__fences_lock);
}
static void ca__streams_parent(void) {
  pthread_mutex_unlock(&ca__fences_lock);
  pthread_rwlock_unlock(&ca__streams_lock);
}
static void ca__streams_child(void) {
  ca__nstreams = 0;
  ca__nalive = 0;
  ca__streams_lost = false;
  ca__nfences = 0;
  pthread_mutex_unlock(&ca__fences_lock);
  pthread_rwlock_unlock(&ca__streams_lock);
}
static const ca_fork_handlers ca__streams_fork = {
    ca__streams_prepare, ca__streams_parent, ca__streams_child};

/* Before any use of the locks: cheap after the first. */
static void ca__streams_register(void) {
  ca_fork_register(CA_FORK_STREAMS, &ca__streams_fork);
}

/* ------------------------------------------------------------------------ */
/* The table                                                                 */

/* Under the write lock. */
static void ca__stream_put(const ca_stream *rec) {
  for (size_t i = 0; i < ca__nstreams; i++) {
    /* The handle of a stream that died unseen (its context destroyed
     * through a path we do not hook) is free for a new stream. */
    if (ca__streams[i].stream == rec->stream) {
      ca__streams[i] = *rec;
      return;
    }
  }
  if (ca__nstreams == ca__streams_cap) {
    ca_stream *v = ca_grow(ca__streams, &ca__streams_cap, sizeof(*v));
    if (v == NULL) {
      ca__streams_lost = true;
      return;
    }
    ca__streams = v;
  }
  ca__streams[ca__nstreams++] = *rec;
}

static void ca__fence_new_stream(const ca_stream *rec);

/* Under the write lock. A handle met again is a stream that died unseen
 * (its context destroyed through a path we do not hook): the new one
 * takes its place. */
static void ca__alive_put(const ca_stream *rec) {
  ca__alive_rec a = {rec->stream, rec->ctx, rec->device, rec->primary};
  for (size_t i = 0; i < ca__nalive; i++)
    if (ca__alive[i].stream == rec->stream) {
      ca__alive[i] = a;
      return;
    }
  if (ca__nalive == ca__alive_cap) {
    ca__alive_rec *v = ca_grow(ca__alive, &ca__alive_cap, sizeof(*v));
    if (v == NULL)
      return; /* not known: never marked alone */
    ca__alive = v;
  }
  ca__alive[ca__nalive++] = a;
}

void ca_streams_created(CUstream stream, unsigned int flags) {
  if (stream == NULL)
    return;
  ca_stream rec = {.stream = stream, .device = -1};
  /* cuStreamCreate made it in the current context, which is there. */
  if (ca_driver_current(&rec.device, &rec.ctx) != CUDA_SUCCESS ||
      rec.device < 0 || rec.device >= CUDALLOC_MAX_DEVICES)
    return;
  ca__streams_register();
  rec.primary = ca_driver_is_primary(rec.device, rec.ctx);
  if (!(flags & CU_STREAM_NON_BLOCKING)) {
    pthread_rwlock_wrlock(&ca__streams_lock);
    ca__alive_put(&rec);
    pthread_rwlock_unlock(&ca__streams_lock);
    return;
  }
  const ca_driver_api *d = ca_driver();
  if (d->event_create == NULL ||
      d->event_create(&rec.tie, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
    rec.tie = NULL;
  pthread_rwlock_wrlock(&ca__streams_lock);
  ca__alive_put(&rec);
  ca__stream_put(&rec);
  ca__fence_new_stream(&rec);
  pthread_rwlock_unlock(&ca__streams_lock);
}

CUresult ca_streams_destroy(CUstream stream, bool v1) {
  const ca_driver_api *d = ca_driver();
  CUresult (*destroy)(CUstream) = v1 ? d->stream_destroy_v1 : d->stream_destroy;
  if (destroy == NULL)
    return ca_driver_missing();
  /* cuStreamDestroy returns at once, even with work queued on the stream
   * (that work is covered by the markers made before), so holding the lock
   * across it costs a marker being made no real wait. */
  ca__streams_register();
  pthread_rwlock_wrlock(&ca__streams_lock);
  CUresult r = destroy(stream);
  if (r == CUDA_SUCCESS) {
    size_t j = 0;
    for (size_t i = 0; i < ca__nstreams; i++) {
      if (ca__streams[i].stream != stream)
        ca__streams[j++] = ca__streams[i];
      else if (ca__streams[i].tie != NULL && d->event_destroy != NULL)
        d->event_destroy(ca__streams[i].tie);
    }
    ca__nstreams = j;
    for (size_t i = 0; i < ca__nalive; i++)
      if (ca__alive[i].stream == stream)
        ca__alive[i] = ca__alive[--ca__nalive];
  }
  pthread_rwlock_unlock(&ca__streams_lock);
  return r;
}

CUresult ca_streams_on(CUstream stream, CUresult (*fn)(CUstream, void *),
                       void *arg) {
  if (stream == NULL || stream == CU_STREAM_LEGACY ||
      stream == CU_STREAM_PER_THREAD)
    return fn(stream, arg);
  ca__streams_register();
  pthread_rwlock_rdlock(&ca__streams_lock);
  CUresult r = CUDA_ERROR_INVALID_HANDLE;
  for (size_t i = 0; i < ca__nalive; i++)
    if (ca__alive[i].stream == stream) {
      r = fn(stream, arg);
      break;
    }
  pthread_rwlock_unlock(&ca__streams_lock);
  return r;
}

void ca_streams_bury(const ca_grave *g) {
  ca__streams_register();
  pthread_rwlock_wrlock(&ca__streams_lock);
  size_t j = 0;
  for (size_t i = 0; i < ca__nstreams; i++) {
    const ca_stream *s = &ca__streams[i];
    if (!ca_grave_holds(g, s->device, s->ctx, s->primary))
      ca__streams[j++] = *s;
  }
  ca__nstreams = j;
  j = 0;
  for (size_t i = 0; i < ca__nalive; i++)
    if (!ca_grave_holds(g, ca__alive[i].device, ca__alive[i].ctx,
                        ca__alive[i].primary))
      ca__alive[j++] = ca__alive[i];
  ca__nalive = j;
  pthread_mutex_lock(&ca__fences_lock);
  size_t kept = 0;
  for (size_t i = 0; i < ca__nfences; i++)
    if (!ca_grave_holds(g, ca__fences[i].device, ca__fences[i].ctx,
                        ca__fences[i].primary))
      ca__fences[kept++] = ca__fences[i];
  ca__nfences = kept;
  pthread_mutex_unlock(&ca__fences_lock);
  pthread_rwlock_unlock(&ca__streams_lock);
}

CUresult ca_streams_record(ca_where *w, ca_streams_fn fn, void *arg) {
  if (ca_capture_active())
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  w->primary = w->primary || ca_driver_is_primary(w->device, w->ctx);
  ca__streams_register();
  pthread_rwlock_rdlock(&ca__streams_lock);
  ca_streams_view view = {ca__streams, ca__nstreams, ca__streams_lost};
  CUresult r = fn(w, &view, arg);
  pthread_rwlock_unlock(&ca__streams_lock);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Fences                                                                    */

/* The legacy stream does most of a fence: work on the legacy stream waits
 * for all earlier work of the blocking streams (per-thread default streams
 * included), and their later work waits for it. So the fence event,
 * recorded on the legacy stream, follows everything queued on those;
 * non-blocking streams are tied in by hand, before (the legacy stream waits
 * for an event recorded on each) and after (each waits for the fence
 * event). A non-blocking stream made later waits for the fence event when
 * it is made. */

/* Under ca__fences_lock: the fence event of `ctx`, or NULL. */
static CUevent ca__fence_of(CUcontext ctx) {
  for (size_t i = 0; i < ca__nfences; i++)
    if (ca__fences[i].ctx == ctx)
      return ca__fences[i].event;
  return NULL;
}

/* The fence event of w's context, created in it (current) on first use.
 * One per context, even when two arenas fence it at once: a stream made
 * later must wait for the event every fence records. */
static CUresult ca__fence_event(const ca_driver_api *d, const ca_where *w,
                                CUevent *out) {
  pthread_mutex_lock(&ca__fences_lock);
  *out = ca__fence_of(w->ctx);
  pthread_mutex_unlock(&ca__fences_lock);
  if (*out != NULL)
    return CUDA_SUCCESS;
  CUevent e = NULL;
  CUresult r = d->event_create(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return r;
  pthread_mutex_lock(&ca__fences_lock);
  if ((*out = ca__fence_of(w->ctx)) != NULL) { /* another thread's won */
    pthread_mutex_unlock(&ca__fences_lock);
    d->event_destroy(e);
    return CUDA_SUCCESS;
  }
  if (ca__nfences == ca__fences_cap) {
    ca__fence_rec *v = ca_grow(ca__fences, &ca__fences_cap, sizeof(*v));
    if (v == NULL) {
      pthread_mutex_unlock(&ca__fences_lock);
      d->event_destroy(e);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ca__fences = v;
  }
  ca__fences[ca__nfences++] =
      (ca__fence_rec){w->ctx, w->device, w->primary, e};
  pthread_mutex_unlock(&ca__fences_lock);
  *out = e;
  return CUDA_SUCCESS;
}

/* Whether every non-blocking stream of ctx has its tie event. */
static bool ca__ties_ready(const ca_streams_view *s, CUcontext ctx) {
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].ctx == ctx && s->v[i].tie == NULL)
      return false;
  return true;
}

/* In w's context, the streams held: each non-blocking stream records its
 * tie event and the legacy stream waits for it, then the fence event is
 * recorded on the legacy stream and each non-blocking stream waits for it.
 * Two threads fencing at once may record the same tie event: a wait takes
 * the event as it is when the wait is queued, so either record serves. A
 * record or wait that fails on a stream is skipped, as a marker's is: its
 * stream died unseen. */
static CUresult ca__fence_recorded(const ca_where *w,
                                   const ca_streams_view *s, void *arg) {
  (void)arg;
  const ca_driver_api *d = ca_driver();
  if (s->lost || !ca__ties_ready(s, w->ctx))
    return CUDA_ERROR_NOT_SUPPORTED;
  CUevent fence = NULL;
  CUresult r = ca__fence_event(d, w, &fence);
  if (r != CUDA_SUCCESS)
    return r;
  for (size_t i = 0; i < s->n; i++) {
    const ca_stream *st = &s->v[i];
    if (st->ctx == w->ctx &&
        d->event_record(st->tie, st->stream) == CUDA_SUCCESS)
      d->stream_wait_event(CU_STREAM_LEGACY, st->tie, 0);
  }
  r = d->event_record(fence, CU_STREAM_LEGACY);
  for (size_t i = 0; r == CUDA_SUCCESS && i < s->n; i++)
    if (s->v[i].ctx == w->ctx)
      d->stream_wait_event(s->v[i].stream, fence, 0);
  return r;
}

CUresult ca_streams_fence(ca_where *w) {
  const ca_driver_api *d = ca_driver();
  if (d->stream_wait_event == NULL || d->event_create == NULL ||
      d->event_record == NULL || d->event_destroy == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  return ca_streams_record(w, ca__fence_recorded, NULL);
}

/* Under the streams write lock, in the new stream's context (current: it
 * was just made there): a non-blocking stream made after a fence waits for
 * it, or its work could overtake a block's earlier users. */
static void ca__fence_new_stream(const ca_stream *rec) {
  const ca_driver_api *d = ca_driver();
  pthread_mutex_lock(&ca__fences_lock);
  CUevent fence = ca__fence_of(rec->ctx);
  pthread_mutex_unlock(&ca__fences_lock);
  if (fence != NULL && d->stream_wait_event != NULL)
    d->stream_wait_event(rec->stream, fence, 0);
}
