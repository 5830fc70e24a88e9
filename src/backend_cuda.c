/*
 * The CUDA backend (see backend_cuda.h): the real driver functions, and the
 * pool's backend on top of them.
 */
#include "backend_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cudalloc.h"
#include "dl.h"
#include "lazy.h"

/* The driver's functions, resolved without a lock (lazy.h: a plugin's
 * constructor may make the first driver call while another thread, making
 * its own, waits for the loader's lock). */
static ca_lazy ca__api = CA_LAZY_INIT;
static ca_driver_api ca__api_fallback;
static atomic_bool ca__atfork_registered;

/* The primary context of each device, retained once by us the first time a
 * segment of that device had to be released or synchronized from a thread
 * with no context of that device current, and kept for the process's life. */
static _Atomic(CUcontext) ca__primary[CUDALLOC_MAX_DEVICES];

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
static atomic_int ca__captures_live; /* ca__ncaptures + ca__captures_lost */
static int ca__captures_lost;
static pthread_mutex_t ca__captures_lock = PTHREAD_MUTEX_INITIALIZER;

/* What the markers need (see "Markers" below). */

/* A live stream the program created with CU_STREAM_NON_BLOCKING. */
typedef struct ca__stream {
  CUstream stream;
  CUcontext ctx; /* current when it was created: its context */
  int device;
  bool primary; /* ctx is the device's primary context */
  /* Recorded on the stream by every fence, for the legacy stream to wait
   * for (see "Fences"); NULL when it could not be made, and then the
   * context cannot be fenced. */
  CUevent tie;
} ca__stream;

static ca__stream *ca__streams;
static size_t ca__nstreams, ca__streams_cap;
/* A stream could not be recorded (out of host memory): a marker would not
 * cover it, so no marker is made any more. */
static bool ca__streams_lost;
/* Read-held while a marker or a fence records its events, write-held to
 * change the table and across the real cuStreamDestroy: no event is
 * recorded on a stream being destroyed. */
static pthread_rwlock_t ca__streams_lock = PTHREAD_RWLOCK_INITIALIZER;

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
/* The last context asked about on each device, and whether it is the
 * primary one (finding out costs a retain and a release). */
static struct {
  CUcontext ctx;
  bool primary;
} ca__kind[CUDALLOC_MAX_DEVICES];
/* Each context's fence event: recorded on its legacy stream at every fence,
 * only there, so that a stream made later can be made to wait for it. */
typedef struct ca__fence_rec {
  CUcontext ctx;
  int device;
  bool primary;
  CUevent event;
} ca__fence_rec;

static ca__fence_rec *ca__fences;
static size_t ca__nfences, ca__fences_cap;
/* Guards the markers, the spare events, the fence events and ca__kind.
 * Never held across a driver call; taken after ca__streams_lock when both
 * are held. */
static pthread_mutex_t ca__marks_lock = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------------ */
/* Resolving the driver                                                      */

/* libcuda.so.1 as the program already loaded it (found by soname, so a copy
 * loaded from an explicit path counts too); loading it ourselves only when
 * nothing did, which happens only when our exports are called directly by a
 * program that did not load the driver. */
static void *ca__open_libcuda(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == NULL)
    h = dlopen("libcuda.so.1", RTLD_NOW);
  return h;
}

/* Stores the export `name` into the function pointer at `slot`. Function and
 * object pointers have the same representation on every platform CUDA runs
 * on (POSIX requires it for dlsym); memcpy says so without a cast warning. */
static void ca__resolve(void *handle, void *slot, size_t slot_size,
                        const char *name) {
  void *sym = ca_dl_sym(handle, name);
  if (slot_size == sizeof(sym))
    memcpy(slot, &sym, sizeof(sym));
}

#define CA__RESOLVE(field, name)                                              \
  ca__resolve(api->handle, &api->field, sizeof(api->field), name)

static void ca__api_init(ca_driver_api *api) {
  memset(api, 0, sizeof(*api));
  api->handle = ca__open_libcuda();
  if (api->handle == NULL)
    return;
  CA__RESOLVE(get_proc_address, "cuGetProcAddress");
  CA__RESOLVE(get_proc_address_v2, "cuGetProcAddress_v2");
  CA__RESOLVE(mem_alloc, "cuMemAlloc_v2");
  CA__RESOLVE(mem_free, "cuMemFree_v2");
  CA__RESOLVE(mem_get_info, "cuMemGetInfo_v2");
  CA__RESOLVE(mem_alloc_pitch, "cuMemAllocPitch_v2");
  CA__RESOLVE(mem_alloc_managed, "cuMemAllocManaged");
  CA__RESOLVE(mem_alloc_async, "cuMemAllocAsync");
  CA__RESOLVE(mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz");
  CA__RESOLVE(mem_alloc_from_pool_async, "cuMemAllocFromPoolAsync");
  CA__RESOLVE(mem_alloc_from_pool_async_ptsz, "cuMemAllocFromPoolAsync_ptsz");
  CA__RESOLVE(mem_free_async, "cuMemFreeAsync");
  CA__RESOLVE(mem_free_async_ptsz, "cuMemFreeAsync_ptsz");
  CA__RESOLVE(mem_create, "cuMemCreate");
  CA__RESOLVE(mem_release, "cuMemRelease");
  CA__RESOLVE(device_primary_ctx_reset_v1, "cuDevicePrimaryCtxReset");
  CA__RESOLVE(device_primary_ctx_reset, "cuDevicePrimaryCtxReset_v2");
  CA__RESOLVE(device_primary_ctx_release_v1, "cuDevicePrimaryCtxRelease");
  CA__RESOLVE(ctx_destroy, "cuCtxDestroy_v2");
  CA__RESOLVE(stream_begin_capture_v1, "cuStreamBeginCapture");
  CA__RESOLVE(stream_begin_capture_v1_ptsz, "cuStreamBeginCapture_ptsz");
  CA__RESOLVE(stream_begin_capture, "cuStreamBeginCapture_v2");
  CA__RESOLVE(stream_begin_capture_ptsz, "cuStreamBeginCapture_v2_ptsz");
  CA__RESOLVE(stream_begin_capture_to_graph, "cuStreamBeginCaptureToGraph");
  CA__RESOLVE(stream_begin_capture_to_graph_ptsz,
              "cuStreamBeginCaptureToGraph_ptsz");
  CA__RESOLVE(stream_end_capture, "cuStreamEndCapture");
  CA__RESOLVE(stream_end_capture_ptsz, "cuStreamEndCapture_ptsz");
  CA__RESOLVE(stream_create, "cuStreamCreate");
  CA__RESOLVE(stream_create_with_priority, "cuStreamCreateWithPriority");
  CA__RESOLVE(stream_destroy_v1, "cuStreamDestroy");
  CA__RESOLVE(stream_destroy, "cuStreamDestroy_v2");
  CA__RESOLVE(mem_get_address_range, "cuMemGetAddressRange_v2");
  CA__RESOLVE(pointer_get_attribute, "cuPointerGetAttribute");
  CA__RESOLVE(pointer_get_attributes, "cuPointerGetAttributes");
  CA__RESOLVE(pointer_set_attribute, "cuPointerSetAttribute");
  CA__RESOLVE(ipc_get_mem_handle, "cuIpcGetMemHandle");
  CA__RESOLVE(mem_get_handle_for_address_range, "cuMemGetHandleForAddressRange");
  CA__RESOLVE(ctx_get_current, "cuCtxGetCurrent");
  CA__RESOLVE(ctx_get_device, "cuCtxGetDevice");
  CA__RESOLVE(ctx_synchronize, "cuCtxSynchronize");
  CA__RESOLVE(ctx_push_current, "cuCtxPushCurrent_v2");
  CA__RESOLVE(ctx_pop_current, "cuCtxPopCurrent_v2");
  CA__RESOLVE(device_get, "cuDeviceGet");
  CA__RESOLVE(device_primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  CA__RESOLVE(device_primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  CA__RESOLVE(device_primary_ctx_get_state, "cuDevicePrimaryCtxGetState");
  CA__RESOLVE(stream_is_capturing, "cuStreamIsCapturing");
  CA__RESOLVE(get_error_name, "cuGetErrorName");
  CA__RESOLVE(event_create, "cuEventCreate");
  CA__RESOLVE(event_record, "cuEventRecord");
  CA__RESOLVE(event_query, "cuEventQuery");
  CA__RESOLVE(event_synchronize, "cuEventSynchronize");
  CA__RESOLVE(event_destroy, "cuEventDestroy_v2");
  CA__RESOLVE(stream_wait_event, "cuStreamWaitEvent");
}

/* A forked child cannot use the parent's contexts (CUDA does not survive
 * fork), so it must not believe it still holds them. */
static void ca__forget_contexts_in_child(void) {
  for (int i = 0; i < CUDALLOC_MAX_DEVICES; i++)
    atomic_store(&ca__primary[i], NULL);
}

/* Nor its streams and events: every marker the child's pools still hold
 * counts as passed (there is no device work to wait for in the child), and
 * no event or stream of the parent is used again. Under the locks. */
static void ca__forget_markers_in_child(void) {
  ca__nstreams = 0;
  ca__streams_lost = false;
  for (int i = 0; i < CUDALLOC_MAX_DEVICES; i++) {
    ca__spare[i].n = 0;
    ca__kind[i].ctx = NULL;
  }
  for (size_t i = 0; i < ca__nmarkers; i++)
    ca__markers[i]->dead = true;
  ca__nfences = 0;
}

/* A fork while another thread holds one of our locks would leave the
 * child's copy locked forever; holding them across fork keeps both whole.
 * Captures do not survive into the child. */
static void ca__fork_prepare(void) {
  pthread_rwlock_wrlock(&ca__streams_lock);
  pthread_mutex_lock(&ca__marks_lock);
  pthread_mutex_lock(&ca__captures_lock);
}
static void ca__fork_parent(void) {
  pthread_mutex_unlock(&ca__captures_lock);
  pthread_mutex_unlock(&ca__marks_lock);
  pthread_rwlock_unlock(&ca__streams_lock);
}
static void ca__fork_child(void) {
  ca__ncaptures = 0;
  ca__captures_lost = 0;
  atomic_store(&ca__captures_live, 0);
  ca__forget_markers_in_child();
  pthread_mutex_unlock(&ca__captures_lock);
  pthread_mutex_unlock(&ca__marks_lock);
  pthread_rwlock_unlock(&ca__streams_lock);
  ca__forget_contexts_in_child();
}

const ca_driver_api *ca_driver(void) {
  const ca_driver_api *d = ca_lazy_get(&ca__api);
  if (d != NULL)
    return d;
  ca_driver_api mine;
  ca__api_init(&mine);
  if (!atomic_exchange(&ca__atfork_registered, true))
    pthread_atfork(ca__fork_prepare, ca__fork_parent, ca__fork_child);
  return ca_lazy_publish(&ca__api, &mine, sizeof(mine), &ca__api_fallback);
}

void *ca_driver_symbol(const char *name) {
  const ca_driver_api *d = ca_driver();
  return d->handle != NULL ? ca_dl_sym(d->handle, name) : NULL;
}

CUresult ca_driver_current_device(int *device) {
  CUcontext ctx;
  return ca_driver_current(device, &ctx);
}

CUresult ca_driver_current_context(CUcontext *context) {
  const ca_driver_api *d = ca_driver();
  if (d->ctx_get_current == NULL)
    return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = NULL;
  CUresult r = d->ctx_get_current(&ctx);
  if (r != CUDA_SUCCESS)
    return r;
  if (ctx == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  *context = ctx;
  return CUDA_SUCCESS;
}

CUresult ca_driver_current(int *device, CUcontext *context) {
  const ca_driver_api *d = ca_driver();
  if (d->ctx_get_device == NULL)
    return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = NULL;
  CUresult r = ca_driver_current_context(&ctx);
  if (r != CUDA_SUCCESS)
    return r;
  CUdevice dev = 0;
  r = d->ctx_get_device(&dev);
  if (r != CUDA_SUCCESS)
    return r;
  *device = (int)dev;
  *context = ctx;
  return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Running a driver call in the right context                               */

/* The primary context of `device`, retained on first need. It is never
 * created by us: creating one costs hundreds of milliseconds and device
 * memory, and when it is not active none of our segments can live in it.
 * They then live in a context the program created itself (driver API); a
 * release from a thread without that context fails, the pool forgets the
 * segment, and the driver frees it when the program destroys its context. */
static CUresult ca__primary_context(int device, CUcontext *out) {
  CUcontext ctx = atomic_load(&ca__primary[device]);
  if (ctx != NULL) {
    *out = ctx;
    return CUDA_SUCCESS;
  }
  const ca_driver_api *d = ca_driver();
  if (d->device_get == NULL || d->device_primary_ctx_retain == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUdevice dev = 0;
  CUresult r = d->device_get(&dev, device);
  if (r != CUDA_SUCCESS)
    return r;
  if (d->device_primary_ctx_get_state != NULL) {
    unsigned int flags = 0;
    int active = 0;
    r = d->device_primary_ctx_get_state(dev, &flags, &active);
    if (r != CUDA_SUCCESS)
      return r;
    if (!active)
      return CUDA_ERROR_INVALID_CONTEXT;
  }
  r = d->device_primary_ctx_retain(&ctx, dev);
  if (r != CUDA_SUCCESS)
    return r;
  /* Two threads may race here; both retained, and the primary context is
   * one object, so the loser's extra reference is harmless: it lives as
   * long as the process, like the winner's. */
  CUcontext expected = NULL;
  atomic_compare_exchange_strong(&ca__primary[device], &expected, ctx);
  *out = ctx;
  return CUDA_SUCCESS;
}

static void ca__bury_primary(int device);

void ca_backend_cuda_forget_primary(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return;
  ca__bury_primary(device);
  atomic_store(&ca__primary[device], NULL);
}

/* The primary context of `device` when it is active, without keeping a
 * reference: a retain and its release. A reference kept would keep the
 * context alive past the program's own last release. */
static CUcontext ca__primary_peek(int device) {
  const ca_driver_api *d = ca_driver();
  if (d->device_get == NULL || d->device_primary_ctx_get_state == NULL ||
      d->device_primary_ctx_retain == NULL ||
      d->device_primary_ctx_release == NULL)
    return NULL;
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  CUcontext ctx = NULL;
  if (d->device_get(&dev, device) != CUDA_SUCCESS ||
      d->device_primary_ctx_get_state(dev, &flags, &active) != CUDA_SUCCESS ||
      !active || d->device_primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS)
    return NULL;
  d->device_primary_ctx_release(dev);
  return ctx;
}

CUcontext ca_backend_cuda_primary_of(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return NULL;
  return ca__primary_peek(device);
}

/* Whether `ctx`, a live context of `device`, is its primary context: a
 * primary reset kills only what lives in it. */
static bool ca__is_primary_ctx(int device, CUcontext ctx) {
  CUcontext held = atomic_load(&ca__primary[device]);
  if (held != NULL)
    return held == ctx;
  pthread_mutex_lock(&ca__marks_lock);
  bool known = ca__kind[device].ctx == ctx;
  bool primary = ca__kind[device].primary;
  pthread_mutex_unlock(&ca__marks_lock);
  if (known)
    return primary;
  primary = ca__primary_peek(device) == ctx;
  pthread_mutex_lock(&ca__marks_lock);
  ca__kind[device].ctx = ctx;
  ca__kind[device].primary = primary;
  pthread_mutex_unlock(&ca__marks_lock);
  return primary;
}

/* One driver call of the backend, with its arguments. */
typedef struct ca__call {
  int kind;
  uint64_t size;
  uint64_t addr;
  size_t free_bytes, total_bytes;
  /* Markers: set by ca__in_device (the context the call runs in, and
   * whether we pushed the primary one), or by the caller (poll, wait). */
  int device;
  CUcontext ctx;
  bool primary;
  uint64_t marker;       /* mark: the new handle */
  const CUevent *events; /* poll, wait: the marker's events */
  size_t nevents;
  int answer; /* poll: 0 passed, 1 not yet */
} ca__call;

enum { CA__RESERVE, CA__RELEASE, CA__MEM_INFO, CA__SYNC, CA__MARK, CA__POLL,
       CA__WAIT, CA__FENCE };

static CUresult ca__do(const ca_driver_api *d, ca__call *c);

/* Runs `c` with `ctx` pushed, popping it after. */
static CUresult ca__pushed(const ca_driver_api *d, CUcontext ctx,
                           ca__call *c) {
  if (d->ctx_push_current == NULL || d->ctx_pop_current == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = d->ctx_push_current(ctx);
  if (r != CUDA_SUCCESS)
    return r;
  r = ca__do(d, c);
  CUcontext popped = NULL;
  d->ctx_pop_current(&popped);
  return r;
}

/* Runs `c` with a context of `device` current: the caller's own when it
 * already is one (the normal case: the pool reserves inside cuMemAlloc), else
 * the device's primary context, pushed for the call and popped after (from
 * cudalloc_empty_cache on any thread, or at exit). */
static CUresult ca__in_device(int device, ca__call *c) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  const ca_driver_api *d = ca_driver();
  int cur = -1;
  CUcontext ctx = NULL;
  c->device = device;
  if (ca_driver_current(&cur, &ctx) == CUDA_SUCCESS && cur == device) {
    c->ctx = ctx;
    c->primary = false; /* not known */
    return ca__do(d, c);
  }
  if (d->ctx_push_current == NULL || d->ctx_pop_current == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = ca__primary_context(device, &ctx);
  if (r != CUDA_SUCCESS)
    return r;
  c->ctx = ctx;
  c->primary = true;
  return ca__pushed(d, ctx, c);
}

/* Runs `c` in `ctx` (a marker's context, which may be a context the
 * program created): as it is when current, else pushed. */
static CUresult ca__in_context(CUcontext ctx, ca__call *c) {
  const ca_driver_api *d = ca_driver();
  CUcontext cur = NULL;
  if (d->ctx_get_current != NULL &&
      d->ctx_get_current(&cur) == CUDA_SUCCESS && cur == ctx)
    return ca__do(d, c);
  return ca__pushed(d, ctx, c);
}

/* Runs `c` for a pool: in the pool's context when the registry gave it one
 * (the backend's ctx, a CUcontext), so that segments, frees and markers
 * all belong to the context the pool serves; else in a context of
 * `device`. */
static CUresult ca__run(void *pool_ctx, int device, ca__call *c) {
  if (pool_ctx == NULL)
    return ca__in_device(device, c);
  c->device = device;
  c->ctx = (CUcontext)pool_ctx;
  c->primary = false; /* not known */
  return ca__in_context((CUcontext)pool_ctx, c);
}

/* ------------------------------------------------------------------------ */
/* Stream capture                                                            */

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

void ca_backend_cuda_capture_begun(CUstream stream, bool per_thread) {
  ca__capture key = ca__capture_key(stream, per_thread);
  pthread_mutex_lock(&ca__captures_lock);
  if (ca__capture_find(&key) < 0) {
    if (ca__ncaptures < CA__MAX_CAPTURES)
      ca__captures[ca__ncaptures++] = key;
    else
      ca__captures_lost++;
    atomic_fetch_add(&ca__captures_live, 1);
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

void ca_backend_cuda_capture_ended(CUstream stream, bool per_thread) {
  ca__capture key = ca__capture_key(stream, per_thread);
  if (ca__still_capturing(key.stream))
    return;
  pthread_mutex_lock(&ca__captures_lock);
  int i = ca__capture_find(&key);
  if (i >= 0) {
    ca__captures[i] = ca__captures[--ca__ncaptures];
    atomic_fetch_sub(&ca__captures_live, 1);
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
static int ca__capturing(const ca_driver_api *d) {
  if (atomic_load(&ca__captures_live) > 0)
    return 1;
  if (d->stream_is_capturing == NULL)
    return 0;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = d->stream_is_capturing(CU_STREAM_LEGACY, &status);
  return r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
         (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE);
}

/* ------------------------------------------------------------------------ */
/* The program's streams                                                     */

/* Grows a table to hold one more element: the new table, or NULL (the old
 * one and *cap unchanged) when the host is out of memory. */
static void *ca__grow(void *v, size_t *cap, size_t elem) {
  size_t n = *cap != 0 ? *cap * 2 : 16;
  void *p = realloc(v, n * elem);
  if (p != NULL)
    *cap = n;
  return p;
}

/* Under the write lock. */
static void ca__stream_put(const ca__stream *rec) {
  for (size_t i = 0; i < ca__nstreams; i++) {
    /* The handle of a stream that died unseen (its context destroyed
     * through a path we do not hook) is free for a new stream. */
    if (ca__streams[i].stream == rec->stream) {
      ca__streams[i] = *rec;
      return;
    }
  }
  if (ca__nstreams == ca__streams_cap) {
    ca__stream *v = ca__grow(ca__streams, &ca__streams_cap, sizeof(*v));
    if (v == NULL) {
      ca__streams_lost = true;
      return;
    }
    ca__streams = v;
  }
  ca__streams[ca__nstreams++] = *rec;
}

static void ca__fence_new_stream(const ca__stream *rec);

void ca_backend_cuda_stream_created(CUstream stream, unsigned int flags) {
  if (!(flags & CU_STREAM_NON_BLOCKING) || stream == NULL)
    return;
  ca__stream rec = {.stream = stream, .device = -1};
  /* cuStreamCreate made it in the current context, which is there. */
  if (ca_driver_current(&rec.device, &rec.ctx) != CUDA_SUCCESS ||
      rec.device < 0 || rec.device >= CUDALLOC_MAX_DEVICES)
    return;
  rec.primary = ca__is_primary_ctx(rec.device, rec.ctx);
  const ca_driver_api *d = ca_driver();
  if (d->event_create == NULL ||
      d->event_create(&rec.tie, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
    rec.tie = NULL;
  pthread_rwlock_wrlock(&ca__streams_lock);
  ca__stream_put(&rec);
  ca__fence_new_stream(&rec);
  pthread_rwlock_unlock(&ca__streams_lock);
}

CUresult ca_backend_cuda_destroy_stream(CUstream stream, bool v1) {
  const ca_driver_api *d = ca_driver();
  CUresult (*destroy)(CUstream) = v1 ? d->stream_destroy_v1 : d->stream_destroy;
  if (destroy == NULL)
    return d->handle == NULL ? CUDA_ERROR_NOT_INITIALIZED
                             : CUDA_ERROR_NOT_FOUND;
  /* cuStreamDestroy returns at once, even with work queued on the stream
   * (that work is covered by the markers made before), so holding the lock
   * across it costs a marker being made no real wait. */
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
  }
  pthread_rwlock_unlock(&ca__streams_lock);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Context deaths                                                            */

/* What died: a device's contexts (ctx NULL), or one context, or only the
 * device's primary context. */
typedef struct ca__grave {
  int device; /* -1: any */
  CUcontext ctx;
  bool primary_only;
} ca__grave;

static bool ca__buried(const ca__grave *g, int device, CUcontext ctx,
                       bool primary) {
  return (g->device < 0 || g->device == device) &&
         (g->ctx == NULL || g->ctx == ctx) && (!g->primary_only || primary);
}

/* Under ca__marks_lock. The events are dropped, not destroyed: their
 * context is gone, and a handle may already name a new context's event. */
static void ca__bury_spares(const ca__grave *g, int device) {
  ca__spares *sp = &ca__spare[device];
  size_t j = 0;
  for (size_t i = 0; i < sp->n; i++)
    if (!ca__buried(g, device, sp->v[i].ctx, sp->v[i].primary))
      sp->v[j++] = sp->v[i];
  sp->n = j;
  ca__kind[device].ctx = NULL;
}

/* Forgets the streams and spare events of what died, and makes its
 * markers pass. */
static void ca__bury(const ca__grave *g) {
  pthread_rwlock_wrlock(&ca__streams_lock);
  size_t j = 0;
  for (size_t i = 0; i < ca__nstreams; i++) {
    const ca__stream *s = &ca__streams[i];
    if (!ca__buried(g, s->device, s->ctx, s->primary))
      ca__streams[j++] = *s;
  }
  ca__nstreams = j;
  pthread_rwlock_unlock(&ca__streams_lock);

  pthread_mutex_lock(&ca__marks_lock);
  for (int dev = 0; dev < CUDALLOC_MAX_DEVICES; dev++)
    if (g->device < 0 || g->device == dev)
      ca__bury_spares(g, dev);
  size_t kept = 0;
  for (size_t i = 0; i < ca__nfences; i++)
    if (!ca__buried(g, ca__fences[i].device, ca__fences[i].ctx,
                    ca__fences[i].primary))
      ca__fences[kept++] = ca__fences[i];
  ca__nfences = kept;
  for (size_t i = 0; i < ca__nmarkers; i++) {
    ca__marker *m = ca__markers[i];
    if (m->used && ca__buried(g, m->device, m->ctx, m->primary))
      m->dead = true;
  }
  pthread_mutex_unlock(&ca__marks_lock);
}

static void ca__bury_primary(int device) {
  ca__grave g = {.device = device, .primary_only = true};
  ca__bury(&g);
}

void ca_backend_cuda_context_destroyed(CUcontext ctx) {
  if (ctx == NULL)
    return;
  ca__grave g = {.device = -1, .ctx = ctx};
  ca__bury(&g);
}

void ca_backend_cuda_context_gone(int device) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return;
  ca__grave g = {.device = device};
  ca__bury(&g);
}

/* ------------------------------------------------------------------------ */
/* Markers                                                                   */

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

/* Under ca__marks_lock: gives `n` events of `ctx` back for later markers.
 * Past what the host can hold, the rest are dropped (a few events stay
 * allocated in a live context). */
static void ca__spares_put(int device, CUcontext ctx, bool primary,
                           const CUevent *events, size_t n) {
  ca__spares *sp = &ca__spare[device];
  for (size_t i = 0; i < n; i++) {
    if (sp->n == sp->cap) {
      ca__event *v = ca__grow(sp->v, &sp->cap, sizeof(*v));
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

/* Under ca__marks_lock: a marker slot, taken, with room for `want` events
 * and as many spare ones in it as there are; NULL when out of host memory. */
static ca__marker *ca__marker_open(const ca__call *c, bool primary,
                                   size_t want) {
  ca__marker *m;
  if (ca__free_marker != SIZE_MAX) {
    m = ca__markers[ca__free_marker];
    ca__free_marker = m->next_free;
  } else {
    if (ca__nmarkers == ca__markers_cap) {
      ca__marker **v = ca__grow(ca__markers, &ca__markers_cap, sizeof(*v));
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
  *m = (ca__marker){.used = true, .primary = primary, .device = c->device,
                    .ctx = c->ctx, .events = m->events, .cap = m->cap,
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

/* Under the streams read lock: records events[0] on the legacy stream and
 * one more on each known non-blocking stream of the marker's context (the
 * marker holds exactly one event per stream). A record that fails (the
 * stream died in a way we did not see) is skipped and its event dropped:
 * it may be the event that is bad. Leaves m->n at the events recorded. */
static CUresult ca__marker_record(const ca_driver_api *d, ca__marker *m) {
  CUresult r = d->event_record(m->events[0], CU_STREAM_LEGACY);
  if (r != CUDA_SUCCESS)
    return r;
  size_t done = 1, left = m->n;
  for (size_t i = 0; i < ca__nstreams && done < left; i++) {
    if (ca__streams[i].ctx != m->ctx)
      continue;
    if (d->event_record(m->events[done], ca__streams[i].stream) ==
        CUDA_SUCCESS)
      done++;
    else
      m->events[done] = m->events[--left];
  }
  m->n = done;
  return CUDA_SUCCESS;
}

static size_t ca__streams_in(CUcontext ctx) {
  size_t n = 0;
  for (size_t i = 0; i < ca__nstreams; i++)
    n += ca__streams[i].ctx == ctx;
  return n;
}

/* Under the streams read lock, so that the streams counted are the ones
 * recorded on, and none is destroyed meanwhile. */
static CUresult ca__mark_locked(const ca_driver_api *d, ca__call *c,
                                bool primary) {
  if (ca__streams_lost)
    return CUDA_ERROR_OUT_OF_MEMORY;
  size_t want = 1 + ca__streams_in(c->ctx);
  pthread_mutex_lock(&ca__marks_lock);
  ca__marker *m = ca__marker_open(c, primary, want);
  pthread_mutex_unlock(&ca__marks_lock);
  if (m == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  size_t keep_from = 0;
  CUresult r = ca__marker_fill(d, m, want);
  if (r == CUDA_SUCCESS) {
    r = ca__marker_record(d, m);
    /* A legacy record refused by a capture leaves its event sound; any
     * other failure may be the event's own. */
    keep_from = r != CUDA_SUCCESS && !ca__capture_error(r) ? 1 : 0;
  }
  pthread_mutex_lock(&ca__marks_lock);
  if (r == CUDA_SUCCESS)
    c->marker = (uint64_t)m->index + 1;
  else
    ca__marker_close(m, keep_from);
  pthread_mutex_unlock(&ca__marks_lock);
  return r;
}

typedef CUresult (*ca__streams_fn)(const ca_driver_api *d, ca__call *c,
                                   bool primary);

/* Runs a marker's or a fence's recording, `fn`, in c's context under the
 * streams read lock. A capture is checked first: an event recorded on the
 * legacy stream while a blocking stream captures would join the legacy
 * stream to the capture, which the driver refuses by invalidating it. */
static CUresult ca__record_all(const ca_driver_api *d, ca__call *c,
                              ca__streams_fn fn) {
  if (ca__capturing(d))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  bool primary = c->primary || ca__is_primary_ctx(c->device, c->ctx);
  pthread_rwlock_rdlock(&ca__streams_lock);
  CUresult r = fn(d, c, primary);
  pthread_rwlock_unlock(&ca__streams_lock);
  return r;
}

/* In the marker's context. */
static CUresult ca__do_mark(const ca_driver_api *d, ca__call *c) {
  if (d->event_create == NULL || d->event_record == NULL ||
      d->event_query == NULL || d->event_synchronize == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  return ca__record_all(d, c, ca__mark_locked);
}

/* In the marker's context. During a capture no event is queried: a query
 * in a global-mode capture is refused and invalidates it (driver_facts.txt),
 * and the mode is not known here. An error other than "not ready" or a
 * capture's means the event can hold no work (its context died, or broke):
 * it counts as passed. */
static CUresult ca__do_poll(const ca_driver_api *d, ca__call *c) {
  c->answer = 1;
  if (d->event_query == NULL || ca__capturing(d))
    return CUDA_SUCCESS;
  for (size_t i = 0; i < c->nevents; i++) {
    CUresult r = d->event_query(c->events[i]);
    if (r == CUDA_ERROR_NOT_READY || ca__capture_error(r))
      return CUDA_SUCCESS;
  }
  c->answer = 0;
  return CUDA_SUCCESS;
}

/* In the marker's context; errors count as in ca__do_poll. */
static CUresult ca__do_wait(const ca_driver_api *d, ca__call *c) {
  if (d->event_synchronize == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (ca__capturing(d))
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  for (size_t i = 0; i < c->nevents; i++) {
    CUresult r = d->event_synchronize(c->events[i]);
    if (ca__capture_error(r))
      return r;
  }
  return CUDA_SUCCESS;
}

/* The marker `handle` names, copied under the lock; false for a handle not
 * in use. Its events stay put until forget, so they are read unlocked. */
static bool ca__marker_get(uint64_t handle, ca__marker *out) {
  bool found = false;
  pthread_mutex_lock(&ca__marks_lock);
  if (handle != 0 && handle <= ca__nmarkers &&
      ca__markers[handle - 1]->used) {
    *out = *ca__markers[handle - 1];
    found = true;
  }
  pthread_mutex_unlock(&ca__marks_lock);
  return found;
}

/* ------------------------------------------------------------------------ */
/* Fences                                                                    */

/* A fence orders the device work queued after it, on every stream of its
 * context, after all the work queued before it; it never waits on the host.
 * The legacy stream does most of it: work on the legacy stream waits for all
 * earlier work of the blocking streams (per-thread default streams
 * included), and their later work waits for it. So the fence event,
 * recorded on the legacy stream, follows everything queued on those;
 * non-blocking streams are tied in by hand, before (the legacy stream waits
 * for an event recorded on each) and after (each waits for the fence
 * event). A non-blocking stream made later waits for the fence event when
 * it is made. */

/* Under ca__marks_lock: the fence event of `ctx`, or NULL. */
static CUevent ca__fence_of(CUcontext ctx) {
  for (size_t i = 0; i < ca__nfences; i++)
    if (ca__fences[i].ctx == ctx)
      return ca__fences[i].event;
  return NULL;
}

/* The fence event of c's context, created in it (current) on first use.
 * One per context, even when two arenas fence it at once: a stream made
 * later must wait for the event every fence records. */
static CUresult ca__fence_event(const ca_driver_api *d, const ca__call *c,
                                bool primary, CUevent *out) {
  pthread_mutex_lock(&ca__marks_lock);
  *out = ca__fence_of(c->ctx);
  pthread_mutex_unlock(&ca__marks_lock);
  if (*out != NULL)
    return CUDA_SUCCESS;
  CUevent e = NULL;
  CUresult r = d->event_create(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return r;
  pthread_mutex_lock(&ca__marks_lock);
  if ((*out = ca__fence_of(c->ctx)) != NULL) { /* another thread's won */
    pthread_mutex_unlock(&ca__marks_lock);
    d->event_destroy(e);
    return CUDA_SUCCESS;
  }
  if (ca__nfences == ca__fences_cap) {
    ca__fence_rec *v = ca__grow(ca__fences, &ca__fences_cap, sizeof(*v));
    if (v == NULL) {
      pthread_mutex_unlock(&ca__marks_lock);
      d->event_destroy(e);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ca__fences = v;
  }
  ca__fences[ca__nfences++] =
      (ca__fence_rec){c->ctx, c->device, primary, e};
  pthread_mutex_unlock(&ca__marks_lock);
  *out = e;
  return CUDA_SUCCESS;
}

/* Under the streams read lock: whether every non-blocking stream of ctx
 * has its tie event. */
static bool ca__ties_ready(CUcontext ctx) {
  for (size_t i = 0; i < ca__nstreams; i++)
    if (ca__streams[i].ctx == ctx && ca__streams[i].tie == NULL)
      return false;
  return true;
}

/* Under the streams read lock, in c's context: each non-blocking stream
 * records its tie event and the legacy stream waits for it, then the fence
 * event is recorded on the legacy stream and each non-blocking stream waits
 * for it. Two threads fencing at once may record the same tie event: a
 * wait takes the event as it is when the wait is queued, so either record
 * serves. A record or wait that fails on a stream is skipped, as in
 * ca__marker_record: its stream died unseen. */
static CUresult ca__fence_locked(const ca_driver_api *d, ca__call *c,
                                 bool primary) {
  if (ca__streams_lost || !ca__ties_ready(c->ctx))
    return CUDA_ERROR_NOT_SUPPORTED;
  CUevent fence = NULL;
  CUresult r = ca__fence_event(d, c, primary, &fence);
  if (r != CUDA_SUCCESS)
    return r;
  for (size_t i = 0; i < ca__nstreams; i++) {
    const ca__stream *s = &ca__streams[i];
    if (s->ctx == c->ctx && d->event_record(s->tie, s->stream) == CUDA_SUCCESS)
      d->stream_wait_event(CU_STREAM_LEGACY, s->tie, 0);
  }
  r = d->event_record(fence, CU_STREAM_LEGACY);
  for (size_t i = 0; r == CUDA_SUCCESS && i < ca__nstreams; i++)
    if (ca__streams[i].ctx == c->ctx)
      d->stream_wait_event(ca__streams[i].stream, fence, 0);
  return r;
}

/* In the fence's context; refused during a capture, as a marker is. */
static CUresult ca__do_fence(const ca_driver_api *d, ca__call *c) {
  if (d->stream_wait_event == NULL || d->event_create == NULL ||
      d->event_record == NULL || d->event_destroy == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  return ca__record_all(d, c, ca__fence_locked);
}

/* Under the streams write lock, in the new stream's context (current: it
 * was just made there): a non-blocking stream made after a fence waits for
 * it, or its work could overtake a block's earlier users. */
static void ca__fence_new_stream(const ca__stream *rec) {
  const ca_driver_api *d = ca_driver();
  pthread_mutex_lock(&ca__marks_lock);
  CUevent fence = ca__fence_of(rec->ctx);
  pthread_mutex_unlock(&ca__marks_lock);
  if (fence != NULL && d->stream_wait_event != NULL)
    d->stream_wait_event(rec->stream, fence, 0);
}

/* ------------------------------------------------------------------------ */
/* The backend                                                               */

static CUresult ca__do(const ca_driver_api *d, ca__call *c) {
  switch (c->kind) {
  case CA__RESERVE: {
    if (d->mem_alloc == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr p = 0;
    CUresult r = d->mem_alloc(&p, (size_t)c->size);
    c->addr = (uint64_t)p;
    return r;
  }
  case CA__RELEASE:
    if (d->mem_free == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    return d->mem_free((CUdeviceptr)c->addr);
  case CA__MEM_INFO:
    if (d->mem_get_info == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    return d->mem_get_info(&c->free_bytes, &c->total_bytes);
  case CA__SYNC:
    if (d->ctx_synchronize == NULL)
      return CUDA_ERROR_NOT_INITIALIZED;
    if (ca__capturing(d))
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return d->ctx_synchronize();
  case CA__MARK:
    return ca__do_mark(d, c);
  case CA__POLL:
    return ca__do_poll(d, c);
  case CA__WAIT:
    return ca__do_wait(d, c);
  case CA__FENCE:
    return ca__do_fence(d, c);
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static int ca__reserve(void *ctx, int device, uint64_t size, uint64_t *addr) {
  if (size > (uint64_t)SIZE_MAX)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ca__call c = {.kind = CA__RESERVE, .size = size};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    *addr = c.addr;
  return (int)r;
}

static int ca__release(void *ctx, int device, uint64_t addr, uint64_t size) {
  (void)size;
  ca__call c = {.kind = CA__RELEASE, .addr = addr};
  return (int)ca__run(ctx, device, &c);
}

static int ca__mem_info(void *ctx, int device, uint64_t *free_bytes,
                        uint64_t *total_bytes) {
  ca__call c = {.kind = CA__MEM_INFO};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS) {
    *free_bytes = c.free_bytes;
    *total_bytes = c.total_bytes;
  }
  return (int)r;
}

static int ca__synchronize(void *ctx, int device) {
  ca__call c = {.kind = CA__SYNC};
  return (int)ca__run(ctx, device, &c);
}

static int ca__mark(void *ctx, int device, uint64_t *marker) {
  ca__call c = {.kind = CA__MARK};
  CUresult r = ca__run(ctx, device, &c);
  if (r == CUDA_SUCCESS)
    *marker = c.marker;
  return (int)r;
}

/* A marker whose context died has passed; while a capture we saw is under
 * way, nothing is asked of the driver (the registry says so without a
 * call). A context that cannot be made current answers "not yet". */
static int ca__poll(void *ctx, int device, uint64_t marker) {
  (void)ctx;
  (void)device;
  ca__marker m;
  if (!ca__marker_get(marker, &m))
    return 1;
  if (m.dead)
    return 0;
  if (atomic_load(&ca__captures_live) > 0)
    return 1;
  ca__call c = {.kind = CA__POLL, .events = m.events, .nevents = m.n};
  return ca__in_context(m.ctx, &c) == CUDA_SUCCESS ? c.answer : 1;
}

static int ca__wait(void *ctx, int device, uint64_t marker) {
  (void)ctx;
  (void)device;
  ca__marker m;
  if (!ca__marker_get(marker, &m))
    return CUDA_ERROR_INVALID_VALUE;
  if (m.dead)
    return 0;
  if (atomic_load(&ca__captures_live) > 0)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  ca__call c = {.kind = CA__WAIT, .events = m.events, .nevents = m.n};
  return (int)ca__in_context(m.ctx, &c);
}

static void ca__forget(void *ctx, int device, uint64_t marker) {
  (void)ctx;
  (void)device;
  pthread_mutex_lock(&ca__marks_lock);
  if (marker != 0 && marker <= ca__nmarkers &&
      ca__markers[marker - 1]->used)
    ca__marker_close(ca__markers[marker - 1], 0);
  pthread_mutex_unlock(&ca__marks_lock);
}

static int ca__fence(void *ctx, int device) {
  if (atomic_load(&ca__captures_live) > 0)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  ca__call c = {.kind = CA__FENCE};
  return (int)ca__run(ctx, device, &c);
}

static const ca_backend ca__backend = {
    .ctx = NULL,
    .oom_code = CUDA_ERROR_OUT_OF_MEMORY,
    .reserve = ca__reserve,
    .release = ca__release,
    .mem_info = ca__mem_info,
    .mark = ca__mark,
    .poll = ca__poll,
    .wait = ca__wait,
    .forget = ca__forget,
    .fence = ca__fence,
    .synchronize = ca__synchronize,
};

const ca_backend *ca_backend_cuda(void) { return &ca__backend; }

const ca_backend *ca_test_backend_cuda(void) { return &ca__backend; }
