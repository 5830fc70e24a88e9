/*
 * What only tests may call, exported by libcudalloc_testing.so (the
 * library's own objects plus this file), never by the shipped
 * libcudalloc.so.
 */
#include "backend/backend_cuda.h"

/* The CUDA backend, for tests/e2e/e2e_streams.c (found with dlsym in a
 * preloaded process): it makes markers on request and counts the mock's
 * events, whatever the pool does. */
__attribute__((visibility("default"))) const ca_backend *
ca_test_backend_cuda(void);

const ca_backend *ca_test_backend_cuda(void) { return ca_backend_cuda(); }
