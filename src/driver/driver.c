/*
 * The real driver functions (see driver.h).
 */
#include "driver/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "cudalloc.h"
#include "support/dl.h"
#include "support/fork.h"
#include "support/lazy.h"

/* The driver's functions, resolved without a lock (lazy.h: a plugin's
 * constructor may make the first driver call while another thread, making
 * its own, waits for the loader's lock). */
static ca_lazy ca__api = CA_LAZY_INIT;
static ca_driver_api ca__api_fallback;

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
static void ca__driver_resolve(void *handle, void *slot, size_t slot_size,
                               const char *name) {
  void *sym = ca_dl_sym(handle, name);
  if (slot_size == sizeof(sym))
    memcpy(slot, &sym, sizeof(sym));
}

#define CA__RESOLVE_HOOKED(export, field, params, call)                        \
  ca__driver_resolve(api->handle, &api->field, sizeof(api->field), #export);
#define CA__RESOLVE_USED(export, field, params)                                \
  ca__driver_resolve(api->handle, &api->field, sizeof(api->field), #export);

static void ca__api_init(ca_driver_api *api) {
  memset(api, 0, sizeof(*api));
  api->handle = ca__open_libcuda();
  if (api->handle == NULL)
    return;
  CA_DRIVER_HOOKED(CA__RESOLVE_HOOKED)
  CA_DRIVER_USED(CA__RESOLVE_USED)
}

const ca_driver_api *ca_driver(void) {
  return CA_LAZY_ONCE(&ca__api, ca_driver_api, ca__api_init, &ca__api_fallback);
}

void *ca_driver_symbol(const char *name) {
  const ca_driver_api *d = ca_driver();
  return d->handle != NULL ? ca_dl_sym(d->handle, name) : NULL;
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

CUresult ca_driver_context_device(int *device) {
  const ca_driver_api *d = ca_driver();
  if (d->ctx_get_device == NULL)
    return CUDA_ERROR_NOT_INITIALIZED;
  CUdevice dev = 0;
  CUresult r = d->ctx_get_device(&dev);
  if (r == CUDA_SUCCESS)
    *device = (int)dev;
  return r;
}

CUresult ca_driver_device_uuid(int ordinal, uint8_t uuid[16]) {
  CUdevice dev = 0;
  CUuuid u;
  CUresult r = CA_REAL(device_get, &dev, ordinal);
  if (r == CUDA_SUCCESS)
    r = CA_REAL(device_get_uuid, &u, dev);
  if (r == CUDA_SUCCESS)
    memcpy(uuid, u.bytes, 16);
  return r;
}

CUresult ca_driver_current(int *device, CUcontext *context) {
  CUcontext ctx = NULL;
  int dev = -1;
  CUresult r = ca_driver_current_context(&ctx);
  if (r == CUDA_SUCCESS)
    r = ca_driver_context_device(&dev);
  if (r != CUDA_SUCCESS)
    return r;
  *device = dev;
  *context = ctx;
  return CUDA_SUCCESS;
}

CUresult ca_driver_enter(CUcontext ctx, bool *pushed) {
  const ca_driver_api *d = ca_driver();
  CUcontext cur = NULL;
  *pushed = false;
  if (ca_driver_current_context(&cur) == CUDA_SUCCESS && cur == ctx)
    return CUDA_SUCCESS;
  if (d->ctx_push_current == NULL || d->ctx_pop_current == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  CUresult r = d->ctx_push_current(ctx);
  *pushed = r == CUDA_SUCCESS;
  return r;
}

void ca_driver_leave(bool pushed) {
  CUcontext popped = NULL;
  if (pushed)
    ca_driver()->ctx_pop_current(&popped);
}

const char *ca_driver_error_name(CUresult r) {
  const char *name = NULL;
  const ca_driver_api *d = ca_driver();
  if (d->get_error_name == NULL || d->get_error_name(r, &name) != CUDA_SUCCESS ||
      name == NULL)
    return "CUresult";
  return name;
}

CUcontext ca_driver_primary_peek(int device) {
  const ca_driver_api *d = ca_driver();
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES || d->device_get == NULL ||
      d->device_primary_ctx_get_state == NULL ||
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

/* ------------------------------------------------------------------------ */
/* Primary contexts                                                          */

/* The primary context of each device, once retained (see
 * ca_driver_primary_retained). */
static _Atomic(CUcontext) ca__primary[CUDALLOC_MAX_DEVICES];
/* The last context asked about on each device, and whether it is the
 * primary one (finding out costs a retain and a release). */
static struct {
  CUcontext ctx;
  bool primary;
} ca__kind[CUDALLOC_MAX_DEVICES];
static pthread_mutex_t ca__kind_lock = PTHREAD_MUTEX_INITIALIZER;

/* A forked child cannot use the parent's contexts (CUDA does not survive
 * fork), so it must not believe it still holds them. */
static void ca__primary_prepare(void) { pthread_mutex_lock(&ca__kind_lock); }
static void ca__primary_parent(void) { pthread_mutex_unlock(&ca__kind_lock); }
static void ca__primary_child(void) {
  for (int i = 0; i < CUDALLOC_MAX_DEVICES; i++) {
    atomic_store(&ca__primary[i], NULL);
    ca__kind[i].ctx = NULL;
  }
  pthread_mutex_unlock(&ca__kind_lock);
}
static const ca_fork_handlers ca__primary_fork = {
    ca__primary_prepare, ca__primary_parent, ca__primary_child};

/* Creating a primary context costs hundreds of milliseconds and device
 * memory, and when it is not active none of our segments can live in it.
 * They then live in a context the program created itself (driver API); a
 * release from a thread without that context fails, the pool forgets the
 * segment, and the driver frees it when the program destroys its context.
 * Only a request that names its device (the allocator slot) activates it,
 * as the runtime's first cudaMalloc on a device does. */
CUresult ca_driver_primary_retained(int device, bool activate,
                                    CUcontext *out) {
  if (device < 0 || device >= CUDALLOC_MAX_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  CUcontext ctx = atomic_load(&ca__primary[device]);
  if (ctx != NULL) {
    *out = ctx;
    return CUDA_SUCCESS;
  }
  const ca_driver_api *d = ca_driver();
  if (d->device_get == NULL || d->device_primary_ctx_retain == NULL)
    return CUDA_ERROR_NOT_SUPPORTED;
  ca_fork_register(CA_FORK_DRIVER, &ca__primary_fork);
  CUdevice dev = 0;
  CUresult r = d->device_get(&dev, device);
  if (r != CUDA_SUCCESS)
    return r;
  if (!activate && d->device_primary_ctx_get_state != NULL) {
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

void ca_driver_primary_forget(int device) {
  if (device >= 0 && device < CUDALLOC_MAX_DEVICES)
    atomic_store(&ca__primary[device], NULL);
}

bool ca_driver_is_primary(int device, CUcontext ctx) {
  CUcontext held = atomic_load(&ca__primary[device]);
  if (held != NULL)
    return held == ctx;
  ca_fork_register(CA_FORK_DRIVER, &ca__primary_fork);
  pthread_mutex_lock(&ca__kind_lock);
  bool known = ca__kind[device].ctx == ctx;
  bool primary = ca__kind[device].primary;
  pthread_mutex_unlock(&ca__kind_lock);
  if (known)
    return primary;
  primary = ca_driver_primary_peek(device) == ctx;
  pthread_mutex_lock(&ca__kind_lock);
  ca__kind[device].ctx = ctx;
  ca__kind[device].primary = primary;
  pthread_mutex_unlock(&ca__kind_lock);
  return primary;
}

void ca_driver_kinds_forget(int device) {
  pthread_mutex_lock(&ca__kind_lock);
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++)
    if (device < 0 || d == device)
      ca__kind[d].ctx = NULL;
  pthread_mutex_unlock(&ca__kind_lock);
}
