/*
 * mockcuda_coverage: the mock driver defines every driver function the
 * library hooks or calls, as listed once in src/driver/driver_api.h, so that no
 * path of the library goes untested for want of a mock function. Two
 * names are left out on purpose (below). Preloaded (E2E_EXPECT=pooled),
 * it also checks that dlsym hands out the library's hook for every
 * handled name the mock defines: the hooks' quick name filter lets each
 * of them through.
 *
 * Prints one PASS or FAIL line; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver_api.h"

typedef struct row {
  const char *name;
  bool hooked;
} row;

#define CA__HOOKED_ROW(export, field, params, call) {#export, true},
#define CA__USED_ROW(export, field, params) {#export, false},
static const row rows[] = {CA_DRIVER_HOOKED(CA__HOOKED_ROW)
                               CA_DRIVER_USED(CA__USED_ROW)};

/* What the mock lacks by design: e2e_dlsym_missing needs a function of the
 * list that the loaded driver does not define. */
static bool left_out(const char *name) {
  return !strcmp(name, "cuStreamBeginCaptureToGraph") ||
         !strcmp(name, "cuStreamBeginCaptureToGraph_ptsz");
}

/* Whether `sym` lies in libcudalloc. */
static bool in_cudalloc(void *sym) {
  Dl_info info;
  return dladdr(sym, &info) != 0 && info.dli_fname != NULL &&
         strstr(info.dli_fname, "libcudalloc") != NULL;
}

int main(void) {
  const char *expect = getenv("E2E_EXPECT");
  bool preloaded = expect != NULL && !strcmp(expect, "pooled");
  void *mock = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (mock == NULL) {
    printf("FAIL mockcuda_coverage: cannot load libcuda.so.1: %s\n", dlerror());
    return 1;
  }
  int failures = 0, hooked = 0;
  size_t n = sizeof(rows) / sizeof(rows[0]);
  for (size_t i = 0; i < n; i++) {
    const char *name = rows[i].name;
    void *sym = dlsym(mock, name);
    if ((sym != NULL) == left_out(name)) {
      printf("FAIL mockcuda_coverage: %s is %s the mock\n", name,
             sym ? "in (listed as left out of)" : "missing from");
      failures++;
    }
    if (!preloaded || !rows[i].hooked || sym == NULL)
      continue;
    if (!in_cudalloc(dlsym(RTLD_DEFAULT, name))) {
      printf("FAIL mockcuda_coverage: dlsym(%s) is not the library's hook\n",
             name);
      failures++;
    }
    hooked++;
  }
  if (failures)
    return 1;
  printf("PASS mockcuda_coverage: the mock defines %zu of the %zu functions "
         "of driver_api.h (2 left out on purpose)%s\n", n - 2, n,
         preloaded ? "; dlsym hands out the hook for every handled one" : "");
  if (preloaded)
    printf("  %d handled names routed to the library\n", hooked);
  return 0;
}
