/*
 * The CUDA backend: the pool's backend contract (backend.h) implemented
 * over the real driver (driver.h), with the backend's view of the
 * program's contexts, streams and captures (streams.h, marks.h,
 * capture.h).
 */
#ifndef CA_BACKEND_CUDA_H
#define CA_BACKEND_CUDA_H

#include <cuda.h>

#include "backend/backend.h"

/* After a reset of `device`'s primary context: the handle the backend kept
 * for it is asked for again when next needed, and what the markers kept of
 * that context (its non-blocking streams, its spare events) is forgotten;
 * markers made in it count as passed (a reset context holds no work). */
void ca_backend_cuda_forget_primary(int device);

/* After a successful cuCtxDestroy of `ctx` (never a primary context): its
 * non-blocking streams and spare events are forgotten, and markers made in
 * it count as passed. Events of a dead context are never destroyed (the
 * handle may already name another context's event) nor reused. */
void ca_backend_cuda_context_destroyed(CUcontext ctx);

/* The backend over the real driver; the pool's production backend. Status
 * codes are CUresult; oom_code is CUDA_ERROR_OUT_OF_MEMORY. Its ctx is NULL:
 * calls then run in a context of the device they name. A copy whose ctx is
 * a CUcontext runs every call in that context (one per pool). */
const ca_backend *ca_backend_cuda(void);

#endif /* CA_BACKEND_CUDA_H */
