/*
 * The backend contract: the only way the pool reaches device memory.
 *
 * The pool is pure C and knows nothing of CUDA; it asks a backend for whole
 * segments and gives them back. Production uses the CUDA backend
 * (backend_cuda.c); unit tests use a fake one that simulates device memory.
 *
 * Status codes are the backend's own (CUresult for CUDA): 0 is success,
 * `oom_code` means out of memory, anything else is passed to the caller
 * unchanged, so a program sees exactly the error the driver gave.
 */
#ifndef CA_BACKEND_H
#define CA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

typedef struct ca_backend {
  void *ctx;    /* handed back to every call */
  int oom_code; /* the status meaning "out of device memory" */

  /* Reserves `size` bytes on `device`; on success stores the base address. */
  int (*reserve)(void *ctx, int device, uint64_t size, uint64_t *addr);

  /* Gives back a segment previously reserved with exactly this size. */
  int (*release)(void *ctx, int device, uint64_t addr, uint64_t size);

  /* Reports the device's free and total memory, as the driver sees it. */
  int (*mem_info)(void *ctx, int device, uint64_t *free_bytes,
                  uint64_t *total_bytes);

  /* Waits until every piece of device work queued on `device` so far has
   * finished, so that blocks freed before the call can be handed out again.
   * Returns 0 when it waited; anything else when it must not wait now (a
   * stream capture is active) and the blocks must stay held. NULL: the
   * backend needs no wait (tests, or a program that opted out). */
  int (*synchronize)(void *ctx, int device);
} ca_backend;

#endif /* CA_BACKEND_H */
