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

/* What va_reserve and map answer when they may not now (backend.h). */
#define CA_BACKEND_BUSY (-1)

/* One copy of a block's bytes to the host (fetch): `rows` rows of `width`
 * bytes, `pitch` apart from `addr` on, to `host`, one after another, and
 * whether they were copied, in `*copied` (both memory from host_alloc; in
 * a fetch of one set alone, any host memory). */
typedef struct ca_backend_rows {
  uint64_t addr, width, rows, pitch;
  void *host;
  unsigned char *copied;
} ca_backend_rows;

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

  /* Stream-ordered reuse (reuse_policy safe). A marker stands for "all the
   * device work queued so far, on every stream of `device` the process
   * uses": blocks freed before it was made may be handed out again once it
   * has passed. The pool makes one marker for a whole batch of frees.
   *
   * mark: makes a marker and stores its handle (never 0). Returns 0, or
   * nonzero when no marker may be made now (a stream capture is active: the
   * blocks then stay pending).
   * poll: 0 when the marker has passed, 1 when not yet (or unknown); never
   * waits and never disturbs a stream capture.
   * wait: returns 0 once the marker has passed; nonzero when it must not
   * wait now (a stream capture).
   * forget: the marker will not be asked about again; its resources may be
   * reused. Called for every marker made, also after a context reset.
   * NULL mark: the backend cannot order reuse after device work; the pool
   * then reuses blocks at once. */
  int (*mark)(void *ctx, int device, uint64_t *marker);
  /* A marker for the work queued so far on `stream` alone (a CUstream as
   * a number: what a framework's allocator slot names; 0 is the legacy
   * stream): blocks freed on it before may serve any stream once it has
   * passed. Polled, waited for and forgotten as `mark`'s. Nonzero when it
   * may not be made now (the stream is capturing). NULL: the pool uses
   * `mark`, which covers every stream. */
  int (*mark_on)(void *ctx, int device, uint64_t stream, uint64_t *marker);
  int (*poll)(void *ctx, int device, uint64_t marker);
  int (*wait)(void *ctx, int device, uint64_t marker);
  void (*forget)(void *ctx, int device, uint64_t marker);

  /* Orders all device work queued from now on, on every stream of `device`
   * the process uses (streams made later included), after all the work
   * queued so far, without waiting on the host: blocks freed before it may
   * be handed out again at once. Returns 0; nonzero when it may not now (a
   * stream capture). NULL: the backend cannot; the pool uses markers. */
  int (*fence)(void *ctx, int device);

  /* Waits until every piece of device work queued on `device` so far has
   * finished (reuse_policy device_sync: cudaFree's own wait). Returns 0 when
   * it waited; nonzero when it must not wait now (a stream capture). */
  int (*synchronize)(void *ctx, int device);

  /* Expandable segments (expandable_segments:1): address ranges reserved
   * without memory behind them, then backed with memory a page at a time
   * where blocks need it, and given back a page at a time from anywhere
   * inside, while the blocks around stay where they are. `page` is the
   * mapping unit in bytes (a power of two); 0, or NULL functions: the
   * backend has no such ranges, and the pool uses plain segments.
   *
   * va_reserve: reserves `size` bytes of addresses (a multiple of page,
   * aligned to one), no memory; stores the start.
   * va_release: gives back a range reserved with exactly this size, with
   * nothing mapped in it any more. va_reserve and map answer
   * CA_BACKEND_BUSY when they may not now (a stream capture): the pool
   * then serves the request from a plain segment. Any other status but 0
   * and oom_code says the backend cannot: the pool stops using ranges.
   * map: backs [addr, addr + size), whole pages of a reserved range with
   * nothing mapped there, with device memory the device may read and
   * write; oom_code when the device has no memory left.
   * unmap: gives back the memory of [addr, addr + size), whole pages mapped
   * earlier (by one map or several). The caller has synchronized first:
   * no device work may still use them. */
  uint64_t page;
  int (*va_reserve)(void *ctx, int device, uint64_t size, uint64_t *addr);
  int (*va_release)(void *ctx, int device, uint64_t addr, uint64_t size);
  int (*map)(void *ctx, int device, uint64_t addr, uint64_t size);
  int (*unmap)(void *ctx, int device, uint64_t addr, uint64_t size);

  /* The bytes of blocks, for memcheck (concerns/memcheck.c); NULL: the
   * backend cannot, and memcheck checks nothing.
   *
   * fill: sets `rows` rows of `width` bytes, `pitch` apart from `addr` on,
   * to `byte`, as one operation. On *stream, after the work queued there,
   * when `stream` is not NULL; else after all the work queued so far on
   * every stream of `device`, and before any queued later.
   * fetch: starts the copies of sets[0..n) (ca_backend_rows) to the host,
   * on *stream (NULL: the legacy stream); a marker made after them
   * (mark_on, or mark for NULL) passes once they are done. Where the
   * device compares them first, a set whose bytes all hold `expect` is
   * not copied: once the marker passed, each set's *copied is 1 where its
   * rows were copied, 0 where they hold nothing but `expect`. Sets
   * *started to how many it started, the first ones: all n when it
   * returns 0; else it returns the code that stopped the next.
   * host_alloc: `size` bytes of host memory a copy may fill while the host
   * goes on (pinned), kept for the process's life; NULL when none. */
  int (*fill)(void *ctx, int device, uint64_t addr, uint64_t width,
              uint64_t rows, uint64_t pitch, unsigned char byte,
              const uint64_t *stream);
  int (*fetch)(void *ctx, int device, const ca_backend_rows *sets, size_t n,
               unsigned char expect, const uint64_t *stream, size_t *started);
  void *(*host_alloc)(void *ctx, int device, uint64_t size);
} ca_backend;

#endif /* CA_BACKEND_H */
