/*
 * e2e_dlsym_missing: the look-up paths never invent a driver function.
 * Feature probes ask dlsym or cuGetProcAddress whether a function exists;
 * the library exports the driver names it hooks, and must not make one
 * appear where the driver has none:
 *  1. no libcuda loaded: dlsym(RTLD_DEFAULT / RTLD_NEXT, "cuMemAlloc_v2")
 *     is NULL, with dlerror() naming the symbol;
 *  2. the mock driver loaded RTLD_LOCAL (as the CUDA runtime loads
 *     libcuda): RTLD_DEFAULT still does not see cuMemAlloc_v2;
 *     cuStreamBeginCaptureToGraph, which the mock lacks, is NULL with
 *     dlerror() set through RTLD_DEFAULT, RTLD_NEXT and the handle, and
 *     cuGetProcAddress(_v2) answer for it as the driver does;
 *  3. the driver made global (RTLD_GLOBAL): RTLD_DEFAULT finds
 *     cuMemAlloc_v2, still not cuStreamBeginCaptureToGraph.
 * Run plainly and preloaded, with the same answers. Last line: PASS or
 * FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failures;

#define E2E_NAME "e2e_dlsym_missing"
#include "e2e_check.h"

/* dlsym(handle, name) must be NULL with dlerror() naming the symbol. */
static void expect_missing(void *handle, const char *how, const char *name) {
  dlerror();
  void *p = dlsym(handle, name);
  const char *err = dlerror();
  if (p != NULL)
    FAIL("dlsym(%s, %s) = %p, expected NULL", how, name, p);
  else if (err == NULL || strstr(err, name) == NULL)
    FAIL("dlsym(%s, %s): dlerror() is %s", how, name, err ? err : "NULL");
}

static void expect_found(void *handle, const char *how, const char *name) {
  if (dlsym(handle, name) == NULL)
    FAIL("dlsym(%s, %s) = NULL: %s", how, name, dlerror());
}

typedef CUresult (*gpa_v2_fn)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t);

static void expect_gpa_missing(void *lib, const char *name) {
  gpa_v2_fn v2 = (gpa_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
  gpa_fn v1 = (gpa_fn)dlsym(lib, "cuGetProcAddress");
  if (!v2 || !v1) {
    FAIL("no cuGetProcAddress in the driver");
    return;
  }
  void *fn = (void *)1;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  CUresult rc = v2(name, &fn, 13000, 0, &status);
  if (rc != CUDA_SUCCESS || fn != NULL ||
      status != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
    FAIL("cuGetProcAddress_v2(%s) = %d, %p, status %d", name, (int)rc, fn,
         (int)status);
  fn = (void *)1;
  rc = v1(name, &fn, 13000, 0);
  if (rc != CUDA_ERROR_NOT_FOUND || fn != (void *)1)
    FAIL("cuGetProcAddress(%s) = %d, %p", name, (int)rc, fn);
}

int main(void) {
  bool preloaded = e2e_preloaded();
  const char *absent = "cuStreamBeginCaptureToGraph"; /* not in the mock */
  expect_missing(RTLD_DEFAULT, "RTLD_DEFAULT", "cuMemAlloc_v2");
  expect_missing(RTLD_NEXT, "RTLD_NEXT", "cuMemAlloc_v2");
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    FAIL("dlopen(libcuda.so.1): %s", dlerror());
  } else {
    expect_missing(RTLD_DEFAULT, "RTLD_DEFAULT", "cuMemAlloc_v2");
    expect_found(lib, "libcuda", "cuMemAlloc_v2");
    expect_missing(RTLD_DEFAULT, "RTLD_DEFAULT", absent);
    expect_missing(RTLD_NEXT, "RTLD_NEXT", absent);
    expect_missing(lib, "libcuda", absent);
    expect_gpa_missing(lib, absent);
    void *global = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
    expect_found(RTLD_DEFAULT, "RTLD_DEFAULT", "cuMemAlloc_v2");
    expect_missing(RTLD_DEFAULT, "RTLD_DEFAULT", absent);
    expect_missing(RTLD_NEXT, "RTLD_NEXT", absent);
    if (global)
      dlclose(global);
  }
  printf("%s " E2E_NAME " (%s, %d failure(s))\n", failures ? "FAIL" : "PASS",
         preloaded ? "preloaded" : "plain", failures);
  return failures ? 1 : 0;
}
