/*
 * e2e_loader_race: the library never deadlocks against the dynamic
 * loader. A thread inside dlopen holds the loader's lock while the new
 * object's constructors run; a constructor that calls a hooked driver
 * function (e2e_loader_plugin.c) must not wait for a lock of the library's
 * that another thread holds while it waits for the loader's lock.
 *
 * Usage: e2e_loader_race MODE, one of
 *   first-call    the program's first hooked call (cuGetProcAddress_v2,
 *                 which resolves the driver and builds the route table)
 *                 made while the plugin's constructor holds the loader's
 *                 lock and then calls cuMemAlloc_v2 (forced: the plugin
 *                 signals, then waits 100 ms);
 *   first-gpa     the same, the plugin calling cuGetProcAddress_v2;
 *   first-unwind  with backtrace_depth set, the program's first stack
 *                 capture (cuMemAlloc_v2) against the plugin's;
 *   report        the program's cuCtxDestroy of a context with a leaked
 *                 block (a report, which symbolizes the stack) against the
 *                 plugin's cuCtxDestroy of a context of its own;
 *   race          the first-call race without forcing: both at once.
 * A deadlock is a hang: CTest's timeout (or the loop's) fails it. Last
 * line: PASS or FAIL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define E2E_NAME "e2e_loader_race"
#include "e2e_check.h"

static const char *plugin_mode;

static void *load_plugin(void *arg) {
  (void)arg;
  setenv("E2E_PLUGIN_MODE", plugin_mode, 1);
  void *h = dlopen("libe2e_loader_plugin.so", RTLD_NOW | RTLD_LOCAL);
  if (!h)
    FAIL("dlopen(libe2e_loader_plugin.so): %s", dlerror());
  return NULL;
}

static void first_gpa(void) {
  void *fn = NULL;
  CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, NULL));
}

static void program_alloc(void) {
  CUdeviceptr p = 0;
  CHECK(cuMemAlloc_v2(&p, 4096));
  CHECK(cuMemFree_v2(p));
}

static CUcontext leaky_ctx;

static void program_destroy(void) { CHECK(cuCtxDestroy_v2(leaky_ctx)); }

/* Loads the plugin on a thread of its own and makes `call` on this one:
 * at once, or (forced) when the plugin's constructor says it holds the
 * loader's lock. */
static void against_plugin(const char *mode, bool forced, void (*call)(void)) {
  int go[2] = {-1, -1};
  if (forced) {
    if (pipe(go) != 0) {
      FAIL("pipe");
      return;
    }
    char fd[16];
    snprintf(fd, sizeof fd, "%d", go[1]);
    setenv("E2E_PLUGIN_GO", fd, 1);
  }
  plugin_mode = mode;
  pthread_t t;
  pthread_create(&t, NULL, load_plugin, NULL);
  char byte;
  if (forced && read(go[0], &byte, 1) != 1)
    FAIL("the plugin did not start");
  call();
  pthread_join(t, NULL);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "race";
  bool preloaded = e2e_preloaded();
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK(cuCtxSetCurrent(ctx));
  if (strcmp(mode, "first-call") == 0) {
    against_plugin("alloc", true, first_gpa);
  } else if (strcmp(mode, "first-gpa") == 0) {
    against_plugin("gpa", true, first_gpa);
  } else if (strcmp(mode, "first-unwind") == 0) {
    first_gpa(); /* the driver resolved: the race is the stack capture's */
    against_plugin("alloc", true, program_alloc);
  } else if (strcmp(mode, "report") == 0) {
    CUdeviceptr p = 0;
    CHECK(cuCtxCreate(&leaky_ctx, NULL, 0, 0));
    CHECK(cuMemAlloc_v2(&p, 4096)); /* never freed: the report lists it */
    CHECK(cuCtxSetCurrent(ctx));
    against_plugin("destroy", true, program_destroy);
  } else {
    against_plugin("alloc", false, first_gpa);
  }
  printf("%s " E2E_NAME " %s (%s, %d failure(s))\n", failures ? "FAIL" : "PASS",
         mode, preloaded ? "preloaded" : "plain", failures);
  return failures ? 1 : 0;
}
