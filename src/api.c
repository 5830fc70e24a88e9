/*
 * The public API (include/cudalloc.h): thin wrappers over the registry's
 * pools and the report.
 */
#include <string.h>

#include "cudalloc.h"
#include "intercept.h"
#include "lifecycle.h"
#include "registry.h"
#include "sites.h"

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

void cudalloc_print_stats(void) {
  ca_lifecycle_report(CA_EVENT_API, false, true, NULL);
}

void cudalloc_print_report(void) {
  ca_reach_roots roots;
  CA_REACH_ROOTS_HERE(&roots);
  ca_lifecycle_report(CA_EVENT_API, true, false, &roots);
}

void cudalloc_mark(void) { ca_sites_mark(); }

void *cudalloc_stream_malloc(size_t size, int device, void *stream) {
  CUdeviceptr p = 0;
  if (ca_on_stream_alloc(&p, size, device, (CUstream)stream) != CUDA_SUCCESS)
    return NULL;
  return (void *)(uintptr_t)p;
}

void cudalloc_stream_free(void *ptr, size_t size, int device, void *stream) {
  (void)size;
  (void)device;
  ca_on_stream_free((CUdeviceptr)(uintptr_t)ptr, (CUstream)stream);
}
