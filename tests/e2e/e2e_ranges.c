/*
 * e2e_ranges: a memset or copy that runs past a block's end is refused and
 * writes nothing, and cuMemAlloc during a global capture is refused and
 * invalidates it, against the mock driver (whose answers are the H200's,
 * tests/mockcuda/driver_facts.txt). Run plainly and with libcudalloc.so
 * preloaded; the same assertions hold both ways:
 *
 *  1. Two 1000-byte blocks A and B, allocated one after the other (under
 *     the pool, neighbours in one segment), B filled with 0xBB: a memset
 *     of A 16 bytes too long, or past its 1024 rounded bytes into B (1D
 *     sync and async, 32-bit, 2D), a copy of
 *     1001 bytes into A (from the host, from another block), all answer
 *     CUDA_ERROR_INVALID_VALUE, and B still holds 0xBB in every byte,
 *     A's own bytes untouched by the refused calls.
 *  2. A capture of a non-blocking stream in global mode: cuMemAlloc is
 *     refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture is
 *     invalidated and ends so; cuMemAlloc works again after it.
 * Last line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <stdio.h>
#include <string.h>

static int failures;

#define E2E_NAME "e2e_ranges"
#include "e2e_check.h"

#define SIZE 1000

/* `call` must be refused with `want`. */
#define REFUSED(want, call)                                                    \
  do {                                                                         \
    CUresult rc_ = (call);                                                     \
    if (rc_ != (want))                                                         \
      FAIL("%s = %d, expected %d (line %d)", #call, (int)rc_, (int)(want),    \
           __LINE__);                                                          \
  } while (0)

/* Every byte of `p` reads `value`. */
static void expect_bytes(const char *what, CUdeviceptr p, unsigned char value) {
  unsigned char host[SIZE];
  CHECK(cuMemcpyDtoH(host, p, SIZE));
  for (int i = 0; i < SIZE; i++)
    if (host[i] != value) {
      FAIL("%s: byte %d is %#x, expected %#x", what, i, host[i], value);
      return;
    }
}

static void overruns(void) {
  CUdeviceptr a = 0, b = 0, other = 0;
  unsigned char host[SIZE + 16];
  memset(host, 0xEE, sizeof host);
  CHECK(cuMemAlloc(&a, SIZE));
  CHECK(cuMemAlloc(&b, SIZE));
  CHECK(cuMemAlloc(&other, 64 << 10));
  CHECK(cuMemsetD8(a, 0xAA, SIZE));
  CHECK(cuMemsetD8(b, 0xBB, SIZE));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(a, 0x11, SIZE + 16));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(a, 0x11, 1024 + 16)); /* into B */
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemsetD8Async(a, 0x11, SIZE + 16, NULL));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemsetD32(a, 0x11111111, SIZE / 4 + 4));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemsetD2D8(a, 512, 0x11, 500, 2));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(a, host, SIZE + 1));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoD(a, other, SIZE + 1));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemsetD8(a + SIZE, 0x11, 16));
  CHECK(cuCtxSynchronize());
  expect_bytes("the neighbouring block", b, 0xBB);
  expect_bytes("the block itself", a, 0xAA);
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  CHECK(cuMemFree(other));
}

static void alloc_in_capture(void) {
  CUstream s = NULL;
  CUdeviceptr p = 0;
  CUgraph g = NULL;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  REFUSED(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuMemAlloc(&p, SIZE));
  CHECK(cuStreamIsCapturing(s, &status));
  if (status != CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    FAIL("the capture is %d after the refused cuMemAlloc, not invalidated",
         (int)status);
  REFUSED(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
  CHECK(cuMemAlloc(&p, SIZE));
  CHECK(cuMemFree(p));
  CHECK(cuStreamDestroy(s));
}

int main(void) {
  bool pooled = e2e_preloaded();
  if (!e2e_primary(0))
    return 1;
  CHECK(cuCtxSetCurrent(e2e_primary(0)));
  overruns();
  alloc_in_capture();
  CHECK(cuDevicePrimaryCtxRelease(0));
  CHECK(cuDevicePrimaryCtxRelease(0));
  printf("%s " E2E_NAME " (%s)%s\n", failures ? "FAIL" : "PASS",
         pooled ? "pooled" : "plain", failures ? " failures above" : "");
  return failures ? 1 : 0;
}
