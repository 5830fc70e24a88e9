/*
 * The bottom layer: the real driver functions.
 *
 * The only part of the library that owns pointers to CUDA driver functions.
 * They are resolved once, lazily (never in a constructor, so a process that
 * never uses CUDA never loads libcuda because of us), from libcuda.so.1,
 * with the C library's dlsym (dl.h), so that our own look-ups never meet
 * our dlsym replacement. Everything above calls them through ca_driver()
 * or CA_REAL. Which functions, and their prototypes: driver_api.h.
 */
#ifndef CA_DRIVER_H
#define CA_DRIVER_H

#include <stdbool.h>

#include <cuda.h>

#include "driver/driver_api.h"

/* The real driver functions, one field per row of driver_api.h. A field is
 * NULL when the loaded libcuda does not export that function (an old
 * driver, or a test's mock); every caller checks before calling. `handle`
 * is NULL when libcuda could not be loaded at all. */
#define CA__DRIVER_HOOKED_FIELD(export, field, params, call)                  \
  CUresult (*field) params;
#define CA__DRIVER_USED_FIELD(export, field, params) CUresult (*field) params;
typedef struct ca_driver_api {
  void *handle;
  CA_DRIVER_HOOKED(CA__DRIVER_HOOKED_FIELD)
  CA_DRIVER_USED(CA__DRIVER_USED_FIELD)
} ca_driver_api;
#undef CA__DRIVER_HOOKED_FIELD
#undef CA__DRIVER_USED_FIELD

/* The real driver functions, resolved on the first call (thread-safe, and
 * with no lock held across the loader calls: see lazy.h). Never NULL; see
 * ca_driver_api for missing functions. */
const ca_driver_api *ca_driver(void);

/* What a call of a driver function the loaded driver lacks returns: only
 * reachable through our exports, by a program that never loaded a driver,
 * or one too old for the function. */
static inline CUresult ca_driver_missing(void) {
  return ca_driver()->handle == NULL ? CUDA_ERROR_NOT_INITIALIZED
                                     : CUDA_ERROR_NOT_FOUND;
}

/* Calls the real driver function `field` with the given arguments. */
#define CA_REAL(field, ...)                                                   \
  (ca_driver()->field != NULL ? ca_driver()->field(__VA_ARGS__)               \
                              : ca_driver_missing())

/* The real address of libcuda's export `name` (looked up in libcuda itself,
 * never through our dlsym), or NULL. */
void *ca_driver_symbol(const char *name);

/* The calling thread's current context alone (one driver call):
 * CUDA_SUCCESS and the context, or the driver's error, or
 * CUDA_ERROR_INVALID_CONTEXT when none is current. */
CUresult ca_driver_current_context(CUcontext *context);

/* The device of the current context (one driver call: call it once the
 * context is known to be current). Never touches *device on failure. */
CUresult ca_driver_context_device(int *device);

/* The UUID of device `ordinal` (the same GPU whatever numbering
 * CUDA_VISIBLE_DEVICES gives it). */
CUresult ca_driver_device_uuid(int ordinal, uint8_t uuid[16]);

/* Both: the current context and its device, or the driver's error (no
 * context current, not initialized). Never touches them on failure. */
CUresult ca_driver_current(int *device, CUcontext *context);

/* `ctx` made the calling thread's current context for a few calls (pushed
 * unless it already is current; *pushed says which), then, with
 * ca_driver_leave, what was current before is again. */
CUresult ca_driver_enter(CUcontext ctx, bool *pushed);
void ca_driver_leave(bool pushed);

/* The driver's name of `r` ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult" when
 * the driver has none. */
const char *ca_driver_error_name(CUresult r);

/* The primary context of `device` when it is active (ask before a reset or
 * a release, not after), else NULL. Keeps no reference: a retain and its
 * release, since a reference kept would keep the context alive past the
 * program's own last release. */
CUcontext ca_driver_primary_peek(int device);

/* The primary context of `device`, retained by us on first need and kept
 * for the process's life (a reference taken once, so that calls made for a
 * pool from a thread with no context of the device can run in it). Made
 * active by us only with `activate` (the driver's cost of a first cudaMalloc
 * on the device); else CUDA_ERROR_INVALID_CONTEXT when it is not active.
 * CUDA_ERROR_INVALID_DEVICE for a device outside [0, CUDALLOC_MAX_DEVICES),
 * else the driver's answer. */
CUresult ca_driver_primary_retained(int device, bool activate,
                                    CUcontext *out);

/* After `device`'s primary context was reset: the handle kept for it is
 * asked for again when next needed. */
void ca_driver_primary_forget(int device);

/* Whether `ctx`, a live context of `device`, is its primary context (a
 * primary reset kills only what lives in it). The last answer for each
 * device is kept; ca_driver_kinds_forget drops those of `device` (every
 * device for -1) when a context dies, since its handle may come back
 * naming another. */
bool ca_driver_is_primary(int device, CUcontext ctx);
void ca_driver_kinds_forget(int device);

#endif /* CA_DRIVER_H */
