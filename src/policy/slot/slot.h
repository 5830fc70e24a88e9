/*
 * The policy of a framework's allocator slot (api.c's cudalloc_stream_*,
 * cudalloc_record_stream, cudalloc_graph_*): PyTorch's pluggable allocator
 * and CuPy's allocator call it with each request's device and stream, from
 * any thread. Served in the device's primary context (the runtime's and
 * the frameworks'), whatever context the calling thread has current, none
 * included, and that stays current; reuse is stream-ordered
 * (ca_pool_alloc_on). Any failure of a request (size > 0) or a free is said
 * in one line.
 */
#ifndef CA_SLOT_H
#define CA_SLOT_H

#include <cuda.h>

/* Out of memory after the device's cache was given back and the request
 * tried again. The line that says why a request failed ends with `then`
 * (what the caller does next), when not NULL. */
CUresult ca_slot_alloc(CUdeviceptr *dptr, size_t size, int device,
                       CUstream stream, const char *then);
CUresult ca_slot_free(CUdeviceptr dptr, int device, CUstream stream);

/* The pooled block at `dptr` is used on `stream` too (record_stream): its
 * free through the slot waits for the work queued on `stream` before it.
 * Memory the pool does not own is left alone (its free waits anyway). */
void ca_slot_record(CUdeviceptr dptr, CUstream stream);

/* A CUDA graph's capture began on `stream` of `device` (the framework
 * began it): every block served for it stays the graph's until
 * ca_slot_graph_release (graphs.h). Returns the graph's number, 0 when no
 * more graphs can be held, -1 when the library is off (nothing to hold).
 * The capture is told to the backend, so that no synchronization breaks
 * it. */
int ca_slot_graph_begin(int device, CUstream stream);
/* Its capture ended (after the framework ended it). */
void ca_slot_graph_end(int graph);
/* The graph is gone: the blocks it held that the program freed go back to
 * the pool, once the device has finished its work. */
void ca_slot_graph_release(int graph);

#endif /* CA_SLOT_H */
