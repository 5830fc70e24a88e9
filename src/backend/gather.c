/*
 * The gather kernel (see gather.h): its PTX (gather_kernel.h), loaded once
 * per context, and its launch.
 */
#include "backend/gather.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/gather_kernel.h"
#include "driver/driver.h"
#include "support/config.h"
#include "support/fork.h"
#include "support/log.h"
#include "support/nvtx.h"

#define CA__THREADS 256
/* Contexts with the kernel (or known not to load it), at most; past them
 * memcheck copies as without it. */
#define CA__CONTEXTS 64

typedef struct ca__loaded {
  CUcontext ctx;
  int device;
  CUfunction fn; /* NULL: the driver would not load the kernel */
} ca__loaded;

static ca__loaded ca__loaded_in[CA__CONTEXTS];
static size_t ca__nloaded;
/* Guards the table; never held across a driver call. */
static pthread_mutex_t ca__gather_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread holds the lock would leave the child's copy
 * locked forever; the child owns none of the parent's contexts. */
static void ca__gather_prepare(void) { pthread_mutex_lock(&ca__gather_lock); }
static void ca__gather_parent(void) { pthread_mutex_unlock(&ca__gather_lock); }
static void ca__gather_child(void) {
  ca__nloaded = 0;
  pthread_mutex_unlock(&ca__gather_lock);
}
static const ca_fork_handlers ca__gather_fork = {
    ca__gather_prepare, ca__gather_parent, ca__gather_child};

static void ca__gather_take_lock(void) {
  ca_fork_register(CA_FORK_GATHER, &ca__gather_fork);
  pthread_mutex_lock(&ca__gather_lock);
}

/* Under the lock: ctx's entry, or NULL. */
static ca__loaded *ca__loaded_for(CUcontext ctx) {
  for (size_t i = 0; i < ca__nloaded; i++)
    if (ca__loaded_in[i].ctx == ctx)
      return &ca__loaded_in[i];
  return NULL;
}

/* The kernel loaded in w's context (current), or NULL, said under
 * verbose:1 (memcheck is slower without it) and verbose:2. */
static CUfunction ca__load_kernel(const ca_where *w) {
  const ca_driver_api *d = ca_driver();
  CUmodule mod = NULL;
  CUfunction fn = NULL;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (d->module_load_data && d->module_get_function &&
      (r = d->module_load_data(&mod, ca_gather_ptx)) == CUDA_SUCCESS)
    r = d->module_get_function(&fn, mod, "ca_gather");
  int verbose = ca_config_get()->verbose;
  if (r != CUDA_SUCCESS && verbose >= 1)
    ca_log("memcheck copies blocks back one by one on device %d: the driver "
           "did not load the gather kernel (%s)",
           w->device, ca_driver_error_name(r));
  else if (r == CUDA_SUCCESS && verbose >= 2)
    ca_log("memcheck's gather kernel loaded on device %d", w->device);
  return r == CUDA_SUCCESS ? fn : NULL;
}

/* The kernel in w's context (current), loaded at its first use there;
 * NULL where the driver does not load it, or the table is full. Two
 * threads loading it at once would each keep an entry, the first found
 * serving both: memcheck asks under its own lock, so they do not. */
static CUfunction ca__kernel(const ca_where *w) {
  ca__gather_take_lock();
  ca__loaded *l = ca__loaded_for(w->ctx);
  bool known = l != NULL, room = ca__nloaded < CA__CONTEXTS;
  CUfunction fn = known ? l->fn : NULL;
  pthread_mutex_unlock(&ca__gather_lock);
  if (known || !room)
    return fn;
  fn = ca__load_kernel(w);
  ca__gather_take_lock();
  if (ca__nloaded < CA__CONTEXTS)
    ca__loaded_in[ca__nloaded++] =
        (ca__loaded){.ctx = w->ctx, .device = w->device, .fn = fn};
  pthread_mutex_unlock(&ca__gather_lock);
  return fn;
}

/* Whether the sets fit the kernel's parameter: the first n. */
static bool ca__pack(ca_gather_args *a, const ca_backend_rows *sets, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const ca_backend_rows *r = &sets[i];
    if (r->width > UINT32_MAX || r->rows > UINT32_MAX)
      return false;
    a->set[i] = (ca_gather_set){.src = r->addr,
                                .dst = (uint64_t)(uintptr_t)r->host,
                                .pitch = r->pitch,
                                .copied = (uint64_t)(uintptr_t)r->copied,
                                .width = (uint32_t)r->width,
                                .rows = (uint32_t)r->rows};
  }
  return true;
}

size_t ca_gather(const ca_where *w, const ca_backend_rows *sets, size_t n,
                 unsigned char expect, CUstream s) {
  if (n < 2 || ca_nvtx_attached() || ca_driver()->launch_kernel == NULL)
    return 0;
  if (n > CA_GATHER_MAX)
    n = CA_GATHER_MAX;
  ca_gather_args args = {.expect = expect};
  CUfunction fn;
  if (!ca__pack(&args, sets, n) || (fn = ca__kernel(w)) == NULL)
    return 0;
  for (size_t i = 0; i < n; i++) /* the device sets those it copies */
    *sets[i].copied = 0;
  void *params[] = {&args};
  CUresult r = ca_driver()->launch_kernel(fn, (unsigned int)n, 1, 1,
                                          CA__THREADS, 1, 1, 0, s, params,
                                          NULL);
  return r == CUDA_SUCCESS ? n : 0;
}

/* A grave naming a device takes all of its entries, whichever contexts
 * died: which handle its primary context had is not known. */
static bool ca__survives(const ca_grave *g, const ca__loaded *l) {
  if (g->device >= 0)
    return l->device != g->device;
  return g->ctx != NULL && l->ctx != g->ctx;
}

void ca_gather_bury(const ca_grave *g) {
  ca__gather_take_lock();
  size_t j = 0;
  for (size_t i = 0; i < ca__nloaded; i++)
    if (ca__survives(g, &ca__loaded_in[i]))
      ca__loaded_in[j++] = ca__loaded_in[i];
  ca__nloaded = j;
  pthread_mutex_unlock(&ca__gather_lock);
}
