/*
 * The public API (include/cudalloc.h): thin wrappers over the registry's
 * pools and the report.
 */
#include <stdlib.h>
#include <string.h>

#include "cudalloc.h"
#include "policy/slot/slot.h"
#include "policy/lifecycle.h"
#include "registry/registry.h"
#include "leaks/sites.h"
#include "support/stats.h"
#include "timeline/trace.h"

#define CA__STR2(x) #x
#define CA__STR(x) CA__STR2(x)

const char *cudalloc_version(void) {
  return CA__STR(CUDALLOC_VERSION_MAJOR) "." CA__STR(
      CUDALLOC_VERSION_MINOR) "." CA__STR(CUDALLOC_VERSION_PATCH);
}

uint64_t cudalloc_empty_cache(void) {
  ca_pool *pools[CA_REGISTRY_MAX_POOLS];
  size_t n = ca_registry_pools(-1, pools, CA_REGISTRY_MAX_POOLS);
  uint64_t released = 0;
  for (size_t i = 0; i < n; i++)
    released += ca_pool_empty_cache(pools[i]);
  return released;
}

int cudalloc_get_stats(int device, cudalloc_device_stats *out,
                       size_t out_size) {
  cudalloc_device_stats s;
  bool known = ca_registry_device_stats(device, &s);
  if (out) {
    memset(out, 0, out_size);
    memcpy(out, &s, out_size < sizeof(s) ? out_size : sizeof(s));
  }
  return known ? 0 : -1;
}

int cudalloc_get_stats_json(int device, char *buf, size_t len,
                            size_t *needed) {
  cudalloc_device_stats s;
  int rc = cudalloc_get_stats(device, &s, sizeof(s));
  size_t n = ca_stats_json(&s, buf, buf ? len : 0);
  if (needed)
    *needed = n + 1;
  return rc;
}

void cudalloc_reset_peak_stats(int device) { ca_registry_reset_peaks(device); }

void cudalloc_print_stats(void) {
  ca_lifecycle_report(CA_EVENT_API, false, true, NULL);
}

void cudalloc_print_report(void) {
  ca_reach_roots roots;
  CA_REACH_ROOTS_HERE(&roots);
  ca_lifecycle_report(CA_EVENT_API, true, false, &roots);
}

void cudalloc_mark(void) { ca_sites_mark(); }

int cudalloc_trace_start(const char *path) {
  return path && *path && ca_lifecycle_trace_begin(path) ? 0 : -1;
}

const char *cudalloc_trace_file(void) { return ca_trace_file(); }

void cudalloc_trace_flush(void) {
  if (ca_trace_file())
    ca_lifecycle_trace_flush();
}

/* One request of the slot; NULL when it failed, after one line ending
 * with `then`. */
static void *ca__slot_malloc(size_t size, int device, void *stream,
                             const char *then) {
  CUdeviceptr p = 0;
  if (ca_slot_alloc(&p, size, device, (CUstream)stream, then) != CUDA_SUCCESS)
    return NULL;
  return (void *)(uintptr_t)p;
}

void *cudalloc_stream_try_malloc(size_t size, int device, void *stream) {
  return ca__slot_malloc(size, device, stream, NULL);
}

/* PyTorch hands the pointer to the tensor unchecked: a NULL would surface
 * later as a kernel faulting at NULL + offset, far from its cause, with the
 * context lost. Ending here, after the line that says why, is the clearer
 * of the two. */
void *cudalloc_stream_malloc(size_t size, int device, void *stream) {
  void *p = ca__slot_malloc(size, device, stream,
                            "stopping the process: PyTorch would use the "
                            "missing memory unchecked");
  if (p == NULL && size > 0)
    abort();
  return p;
}

void cudalloc_stream_free(void *ptr, size_t size, int device, void *stream) {
  (void)size;
  ca_slot_free((CUdeviceptr)(uintptr_t)ptr, device, (CUstream)stream);
}

void cudalloc_record_stream(void *ptr, int device, void *stream) {
  (void)device;
  ca_slot_record((CUdeviceptr)(uintptr_t)ptr, (CUstream)stream);
}

int cudalloc_graph_begin(int device, void *stream) {
  return ca_slot_graph_begin(device, (CUstream)stream);
}

void cudalloc_graph_end(int graph) { ca_slot_graph_end(graph); }

void cudalloc_graph_release(int graph) { ca_slot_graph_release(graph); }
