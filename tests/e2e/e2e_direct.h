/*
 * What the e2e programs linked straight to the (mock) driver share: a
 * failed call ends the program with one "FAIL <program>: ..." line, and
 * the set-up the runtime makes on a program's first call. Define E2E_PROG
 * (the program's name, a string) before including it.
 */
#ifndef E2E_DIRECT_H
#define E2E_DIRECT_H

#include <cuda.h>

#include <stdio.h>
#include <unistd.h>

static void fail(const char *what, int rc) {
  fprintf(stderr, "FAIL " E2E_PROG ": %s returned %d\n", what, rc);
  fflush(stdout);
  _exit(1);
}

#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult rc_ = (call);                                                     \
    if (rc_ != CUDA_SUCCESS)                                                   \
      fail(#call, (int)rc_);                                                   \
  } while (0)

/* cuInit, device 0, its primary context made current: what the runtime does
 * on a program's first call. */
static void setup(void) {
  CUdevice dev;
  CUcontext ctx = NULL;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
}

#endif /* E2E_DIRECT_H */
