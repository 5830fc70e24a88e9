/*
 * The failure reporting of the small e2e programs (e2e_limits, e2e_fork):
 * each defines E2E_NAME and an int `failures` before including this.
 * Failures print "FAIL <program>: <what>" on stderr and are counted; the
 * program ends with one PASS/FAIL line and exit status 1 on any failure.
 */
#ifndef E2E_CHECK_H
#define E2E_CHECK_H

#include <stdio.h>

#include <cuda.h>

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "FAIL " E2E_NAME ": " __VA_ARGS__);                        \
    fputc('\n', stderr);                                                       \
    failures++;                                                                \
  } while (0)

#define CHECK(call)                                                            \
  do {                                                                         \
    CUresult rc_ = (call);                                                     \
    if (rc_ != CUDA_SUCCESS)                                                   \
      FAIL("%s = %d (line %d)", #call, (int)rc_, __LINE__);                    \
  } while (0)

#endif /* E2E_CHECK_H */
