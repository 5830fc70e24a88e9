/*
 * The failure reporting of the small e2e programs (e2e_limits, e2e_fork,
 * e2e_contexts, e2e_identity, ...), and their capture of stderr: each
 * defines E2E_NAME and an int `failures` (an atomic_int where threads
 * fail) before including this. Failures print
 * "FAIL <program>: <what>" on stderr, one whole line even when threads fail
 * at once, and are counted; the program ends with one PASS/FAIL line and
 * exit status 1 on any failure.
 * Define _GNU_SOURCE before any include: e2e_preloaded needs RTLD_DEFAULT.
 */
#ifndef E2E_CHECK_H
#define E2E_CHECK_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda.h>

#ifndef RTLD_DEFAULT
#error "define _GNU_SOURCE before any include: RTLD_DEFAULT is needed"
#endif

#define FAIL(...)                                                              \
  do {                                                                         \
    flockfile(stderr);                                                         \
    fprintf(stderr, "FAIL " E2E_NAME ": " __VA_ARGS__);                        \
    fputc('\n', stderr);                                                       \
    funlockfile(stderr);                                                       \
    failures++;                                                                \
  } while (0)

#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult rc_ = (call);                                                     \
    if (rc_ != CUDA_SUCCESS)                                                   \
      FAIL("%s = %d (line %d)", #call, (int)rc_, __LINE__);                    \
  } while (0)

/* Whether libcudalloc.so is loaded (cudalloc_version is found). E2E_EXPECT
 * (plain|pooled, set by CTest) must agree, else the program ends at once
 * with its FAIL line: ld.so ignores a bad LD_PRELOAD with a warning, which
 * would otherwise pass as a plain run. */
static inline bool e2e_preloaded(void) {
  bool preloaded = dlsym(RTLD_DEFAULT, "cudalloc_version") != NULL;
  const char *expect = getenv("E2E_EXPECT");
  if (expect && strcmp(expect, preloaded ? "pooled" : "plain") != 0) {
    FAIL("E2E_EXPECT=%s but cudalloc is %s", expect,
         preloaded ? "loaded" : "not loaded");
    printf("FAIL " E2E_NAME " (%d failure(s))\n", failures);
    exit(1);
  }
  return preloaded;
}

/* `device`'s primary context, retained (the driver initialized first):
 * what the runtime and the frameworks use. NULL, after a FAIL line, when
 * the driver refuses. */
static inline CUcontext e2e_primary(int device) {
  CUdevice dev;
  CUcontext ctx = NULL;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS)
    FAIL("device %d's primary context could not be retained", device);
  return ctx;
}

/* The library named on the command line (`argv[1]`), loaded as a
 * framework's allocator slot loads it (dlopen, RTLD_LOCAL), after checking
 * E2E_EXPECT=pooled against the preload. Ends the program (status 2 for a
 * usage error, 1 when it cannot be loaded) rather than return NULL. */
static inline void *e2e_slot_library(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: " E2E_NAME " LIBCUDALLOC\n");
    exit(2);
  }
  const char *expect = getenv("E2E_EXPECT");
  if (expect && strcmp(expect, "pooled") == 0)
    e2e_preloaded();
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("FAIL " E2E_NAME ": dlopen: %s\n", dlerror());
    exit(1);
  }
  return lib;
}

/* Capturing fd 2 into a memfd for the duration of a few calls, to read
 * what the library said. */
typedef struct capture {
  int saved, mem;
} capture;

/* fd 2 becomes a write-only, appending description of the memfd: a log
 * the program redirects its stderr to, which the library writes to (not a
 * data file of the program's, which it would leave alone: log.h). */
static inline void capture_begin(capture *c) {
  char path[64];
  fflush(stderr);
  c->mem = memfd_create(E2E_NAME "_stderr", 0);
  snprintf(path, sizeof path, "/proc/self/fd/%d", c->mem);
  int w = c->mem >= 0 ? open(path, O_WRONLY | O_APPEND) : -1;
  c->saved = dup(2);
  if (w < 0 || c->saved < 0 || dup2(w, 2) < 0) {
    perror(E2E_NAME ": capturing stderr");
    exit(2);
  }
  close(w);
}

/* Restores fd 2 and returns what was written (NUL-terminated, malloc'd). */
static inline char *capture_end(capture *c) {
  fflush(stderr);
  dup2(c->saved, 2);
  close(c->saved);
  off_t n = lseek(c->mem, 0, SEEK_END);
  char *text = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
  if (text && n > 0 && pread(c->mem, text, (size_t)n, 0) != n)
    text[0] = '\0';
  close(c->mem);
  return text;
}

#endif /* E2E_CHECK_H */
