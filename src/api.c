/*
 * The public API (include/cudalloc.h): thin wrappers over the runtime's
 * pools and the report.
 */
#include <string.h>

#include "cudalloc.h"
#include "lifecycle.h"
#include "runtime.h"

#define CA__STR2(x) #x
#define CA__STR(x) CA__STR2(x)

const char *cudalloc_version(void) {
  return CA__STR(CUDALLOC_VERSION_MAJOR) "." CA__STR(
      CUDALLOC_VERSION_MINOR) "." CA__STR(CUDALLOC_VERSION_PATCH);
}

uint64_t cudalloc_empty_cache(void) {
  uint64_t released = 0;
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    ca_pool *pool = ca_runtime_pool_if_any(d);
    if (pool)
      released += ca_pool_empty_cache(pool);
  }
  return released;
}

int cudalloc_get_stats(int device, cudalloc_device_stats *out,
                       size_t out_size) {
  cudalloc_device_stats s;
  memset(&s, 0, sizeof(s));
  s.device = device;
  ca_pool *pool = ca_runtime_pool_if_any(device);
  if (pool)
    ca_pool_get_stats(pool, &s);
  if (out) {
    memset(out, 0, out_size);
    memcpy(out, &s, out_size < sizeof(s) ? out_size : sizeof(s));
  }
  return pool ? 0 : -1;
}

void cudalloc_print_stats(void) {
  ca_lifecycle_report(CA_EVENT_API, false, true);
}

void cudalloc_print_report(void) {
  ca_lifecycle_report(CA_EVENT_API, true, false);
}
