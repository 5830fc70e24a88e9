/*
 * Stream captures in progress (see capture.h).
 */
#include "backend/capture.h"

#include <pthread.h>
#include <stdatomic.h>

#include "driver/driver.h"
#include "support/fork.h"

/* The captures in progress that the policy saw begin: the stream, and for
 * a thread's own default stream the thread (each thread has its own). A
 * fixed table, since captures in flight at once are few; past its size,
 * `ca__captures_lost` counts captures we could not record, and as long as
 * one may still run no synchronization is allowed. */
#define CA__MAX_CAPTURES 64

typedef struct ca__capture {
  CUstream stream;
  pthread_t thread; /* meaningful only when stream is CU_STREAM_PER_THREAD */
} ca__capture;

static ca__capture ca__captures[CA__MAX_CAPTURES];
static int ca__ncaptures;
atomic_int ca_captures_live; /* ca__ncaptures + ca__captures_lost */
static int ca__captures_lost;
static pthread_mutex_t ca__captures_lock = PTHREAD_MUTEX_INITIALIZER;

/* Captures do not survive into a forked child. */
static void ca__captures_prepare(void) {
  pthread_mutex_lock(&ca__captures_lock);
}
static void ca__captures_parent(void) {
  pthread_mutex_unlock(&ca__captures_lock);
}
static void ca__captures_child(void) {
  ca__ncaptures = 0;
  ca__captures_lost = 0;
  atomic_store(&ca_captures_live, 0);
  pthread_mutex_unlock(&ca__captures_lock);
}
static const ca_fork_handlers ca__captures_fork = {
    ca__captures_prepare, ca__captures_parent, ca__captures_child};

/* The capture key of a stream as the program named it: the calling
 * thread's default stream is one per thread. */
static ca__capture ca__capture_key(CUstream stream, bool per_thread) {
  ca__capture key = {.stream = stream};
  if (stream == CU_STREAM_PER_THREAD || (per_thread && stream == NULL)) {
    key.stream = CU_STREAM_PER_THREAD;
    key.thread = pthread_self();
  }
  return key;
}

/* Under the lock. */
static int ca__capture_find(const ca__capture *key) {
  for (int i = 0; i < ca__ncaptures; i++) {
    const ca__capture *c = &ca__captures[i];
    if (c->stream == key->stream &&
        (c->stream != CU_STREAM_PER_THREAD ||
         pthread_equal(c->thread, key->thread)))
      return i;
  }
  return -1;
}

void ca_capture_begun(CUstream stream, bool per_thread) {
  ca__capture key = ca__capture_key(stream, per_thread);
  ca_fork_register(CA_FORK_CAPTURES, &ca__captures_fork);
  pthread_mutex_lock(&ca__captures_lock);
  if (ca__capture_find(&key) < 0) {
    if (ca__ncaptures < CA__MAX_CAPTURES)
      ca__captures[ca__ncaptures++] = key;
    else
      ca__captures_lost++;
    atomic_fetch_add(&ca_captures_live, 1);
  }
  pthread_mutex_unlock(&ca__captures_lock);
}

/* Whether `stream` is still capturing, asked of the driver. Only a clear
 * "capturing" keeps the record: a record kept by mistake would forbid every
 * later synchronization, so freed blocks would never be reused again. */
static bool ca__still_capturing(CUstream stream) {
  const ca_driver_api *d = ca_driver();
  if (d->stream_is_capturing == NULL)
    return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = d->stream_is_capturing(stream, &status);
  return r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void ca_capture_ended(CUstream stream, bool per_thread) {
  ca__capture key = ca__capture_key(stream, per_thread);
  if (ca__still_capturing(key.stream))
    return;
  ca_fork_register(CA_FORK_CAPTURES, &ca__captures_fork);
  pthread_mutex_lock(&ca__captures_lock);
  int i = ca__capture_find(&key);
  if (i >= 0) {
    ca__captures[i] = ca__captures[--ca__ncaptures];
    atomic_fetch_sub(&ca_captures_live, 1);
  }
  pthread_mutex_unlock(&ca__captures_lock);
}

/* Whether a stream capture is active that a context-wide synchronization
 * would invalidate. The check must come before the call: cuCtxSynchronize
 * reports a capture only by breaking it (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 * and the capture ends invalidated).
 *
 * First the captures the policy saw begin (every capture made through the
 * runtime or our exports). Then, for captures begun by a path we do not see,
 * the driver's own answer: asked about the legacy stream,
 * cuStreamIsCapturing answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while any
 * blocking stream of the context captures, a thread's per-thread default
 * stream included (measured, any capture mode; see
 * tests/mockcuda/driver_facts.txt), without invalidating it. One query, as
 * every fence pays for it. A capture on a non-blocking stream is invisible
 * to it, hence the registry. */
bool ca_capture_active(void) {
  if (ca_capture_seen())
    return true;
  const ca_driver_api *d = ca_driver();
  if (d->stream_is_capturing == NULL)
    return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = d->stream_is_capturing(CU_STREAM_LEGACY, &status);
  return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
         (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE);
}
