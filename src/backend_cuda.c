/*
 * The CUDA backend (see backend_cuda.h): the real driver functions, and the
 * pool's backend on top of them.
 */
#include "backend_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "cudalloc.h"
#include "hooks.h"

static ca_driver_api ca__api;
static pthread_once_t ca__api_once = PTHREAD_ONCE_INIT;

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
static void ca__resolve(void *slot, size_t slot_size, const char *name) {
  void *sym = ca_real_dlsym(ca__api.handle, name);
  if (slot_size == sizeof(sym))
    memcpy(slot, &sym, sizeof(sym));
}

#define CA__RESOLVE(field, name) ca__resolve(&ca__api.field, sizeof(ca__api.field), name)

static void ca__api_init(void) {
  ca__api.handle = ca__open_libcuda();
  if (ca__api.handle == NULL)
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
  CA__RESOLVE(ctx_get_current, "cuCtxGetCurrent");
  CA__RESOLVE(ctx_get_device, "cuCtxGetDevice");
  CA__RESOLVE(ctx_synchronize, "cuCtxSynchronize");
  CA__RESOLVE(ctx_push_current, "cuCtxPushCurrent_v2");
  CA__RESOLVE(ctx_pop_current, "cuCtxPopCurrent_v2");
  CA__RESOLVE(device_get, "cuDeviceGet");
  CA__RESOLVE(device_primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  CA__RESOLVE(device_primary_ctx_get_state, "cuDevicePrimaryCtxGetState");
  CA__RESOLVE(stream_is_capturing, "cuStreamIsCapturing");
  CA__RESOLVE(get_error_name, "cuGetErrorName");
}

/* A forked child cannot use the parent's contexts (CUDA does not survive
 * fork), so it must not believe it still holds them. */
static void ca__forget_contexts_in_child(void) {
  for (int i = 0; i < CUDALLOC_MAX_DEVICES; i++)
    atomic_store(&ca__primary[i], NULL);
}

/* A fork while another thread holds one of our locks would leave the
 * child's copy locked forever; holding them across fork keeps both whole.
 * Captures do not survive into the child. */
static void ca__fork_prepare(void) { pthread_mutex_lock(&ca__captures_lock); }
static void ca__fork_parent(void) { pthread_mutex_unlock(&ca__captures_lock); }
static void ca__fork_child(void) {
  ca__ncaptures = 0;
  ca__captures_lost = 0;
  atomic_store(&ca__captures_live, 0);
  pthread_mutex_unlock(&ca__captures_lock);
  ca__forget_contexts_in_child();
}

static void ca__init_once(void) {
  ca__api_init();
  pthread_atfork(ca__fork_prepare, ca__fork_parent, ca__fork_child);
}

const ca_driver_api *ca_driver(void) {
  pthread_once(&ca__api_once, ca__init_once);
  return &ca__api;
}

void *ca_driver_symbol(const char *name) {
  const ca_driver_api *d = ca_driver();
  return d->handle != NULL ? ca_real_dlsym(d->handle, name) : NULL;
}

CUresult ca_driver_current_device(int *device) {
  CUcontext ctx;
  return ca_driver_current(device, &ctx);
}

CUresult ca_driver_current(int *device, CUcontext *context) {
  const ca_driver_api *d = ca_driver();
  if (d->ctx_get_current == NULL || d->ctx_get_device == NULL)
    return CUDA_ERROR_NOT_INITIALIZED;
  CUcontext ctx = NULL;
  CUresult r = d->ctx_get_current(&ctx);
  if (r != CUDA_SUCCESS)
    return r;
  if (ctx == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
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

bool ca_backend_cuda_is_primary(int device, CUcontext ctx) {
  CUcontext primary = NULL;
  return device >= 0 && device < CUDALLOC_MAX_DEVICES &&
         ca__primary_context(device, &primary) == CUDA_SUCCESS &&
         primary == ctx;
}

void ca_backend_cuda_forget_primary(int device) {
  if (device >= 0 && device < CUDALLOC_MAX_DEVICES)
    atomic_store(&ca__primary[device], NULL);
}

/* Whether the calling thread's current context belongs to `device`. */
static int ca__current_is(int device) {
  int cur = -1;
  return ca_driver_current_device(&cur) == CUDA_SUCCESS && cur == device;
}

/* One driver call of the backend, with its arguments. */
typedef struct ca__call {
  int kind;
  uint64_t size;
  uint64_t addr;
  size_t free_bytes, total_bytes;
} ca__call;

enum { CA__RESERVE, CA__RELEASE, CA__MEM_INFO, CA__SYNC };

static CUresult ca__do(const ca_driver_api *d, ca__call *c);

/* Runs `c` with a context of `device` current: the caller's own when it
 * already is one (the normal case: the pool reserves inside cuMemAlloc), else
 * the device's primary context, pushed for the call and popped after (from
 * cudalloc_empty_cache on any thread, or at exit). */
static CUresult ca__in_device(int device, ca__call *c) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  const ca_driver_api *d = ca_driver();
  if (ca__current_is(device))
    return ca__do(d, c);
  if (d->ctx_push_current == NULL || d->ctx_pop_current == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUcontext ctx = NULL;
  CUresult r = ca__primary_context(device, &ctx);
  if (r != CUDA_SUCCESS)
    return r;
  r = d->ctx_push_current(ctx);
  if (r != CUDA_SUCCESS)
    return r;
  r = ca__do(d, c);
  CUcontext popped = NULL;
  d->ctx_pop_current(&popped);
  return r;
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
 * the driver's own answers: asked about the legacy stream,
 * cuStreamIsCapturing answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while any
 * blocking stream of the context captures (measured, any capture mode),
 * without invalidating it; asked about the per-thread default stream, it
 * answers for that stream. A capture on a non-blocking stream is invisible
 * to both queries, hence the registry. */
static int ca__capturing(const ca_driver_api *d) {
  if (atomic_load(&ca__captures_live) > 0)
    return 1;
  if (d->stream_is_capturing == NULL)
    return 0;
  CUstream streams[2] = {CU_STREAM_LEGACY, CU_STREAM_PER_THREAD};
  for (int i = 0; i < 2; i++) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = d->stream_is_capturing(streams[i], &status);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
      return 1;
    if (r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)
      return 1;
  }
  return 0;
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
  }
  return CUDA_ERROR_INVALID_VALUE;
}

static int ca__reserve(void *ctx, int device, uint64_t size, uint64_t *addr) {
  (void)ctx;
  if (size > (uint64_t)SIZE_MAX)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ca__call c = {.kind = CA__RESERVE, .size = size};
  CUresult r = ca__in_device(device, &c);
  if (r == CUDA_SUCCESS)
    *addr = c.addr;
  return (int)r;
}

static int ca__release(void *ctx, int device, uint64_t addr, uint64_t size) {
  (void)ctx;
  (void)size;
  ca__call c = {.kind = CA__RELEASE, .addr = addr};
  return (int)ca__in_device(device, &c);
}

static int ca__mem_info(void *ctx, int device, uint64_t *free_bytes,
                        uint64_t *total_bytes) {
  (void)ctx;
  ca__call c = {.kind = CA__MEM_INFO};
  CUresult r = ca__in_device(device, &c);
  if (r == CUDA_SUCCESS) {
    *free_bytes = c.free_bytes;
    *total_bytes = c.total_bytes;
  }
  return (int)r;
}

static int ca__synchronize(void *ctx, int device) {
  (void)ctx;
  ca__call c = {.kind = CA__SYNC};
  return (int)ca__in_device(device, &c);
}

static const ca_backend ca__backend = {
    .ctx = NULL,
    .oom_code = CUDA_ERROR_OUT_OF_MEMORY,
    .reserve = ca__reserve,
    .release = ca__release,
    .mem_info = ca__mem_info,
    .synchronize = ca__synchronize,
};

const ca_backend *ca_backend_cuda(void) { return &ca__backend; }
