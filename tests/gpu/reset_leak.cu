/*
 * reset_leak: cudaDeviceReset in the middle of a program, under cudalloc.
 *
 * Why: the reset frees every allocation of the device's primary context,
 * pooled segments included. The pool must forget those segments (handing
 * one out again would give the program memory that no longer exists), the
 * blocks the program had not freed must be reported as leaked at that
 * moment, and the program must go on allocating and computing correctly.
 *
 * What it does: allocates three 1 MiB buffers and fills them, frees one,
 * calls cudaDeviceReset with two still allocated (the leak), then allocates
 * 64 buffers of assorted sizes, fills each with a kernel and checks every
 * one on the host, frees them all and exits. The script (gpu-check.sh)
 * reads the report: one "(at context reset of device 0)" report of
 * 2097152 bytes in 2 allocations, and "no device memory leaks" at exit.
 * Last line: "reset_leak: PASS" or "reset_leak: FAIL: <why>".
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t rc_ = (call);                                                  \
    if (rc_ != cudaSuccess) {                                                  \
      printf("reset_leak: FAIL: %s: %s\n", #call, cudaGetErrorString(rc_));    \
      return 1;                                                                \
    }                                                                          \
  } while (0)

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = seed * 2654435761u + (unsigned)i;
}

/* Fills a buffer of `words` on the device and checks it on the host. */
static int fill_and_check(unsigned *dev, size_t words, unsigned seed,
                          unsigned *host) {
  fill<<<128, 256>>>(dev, words, seed);
  if (cudaMemcpy(host, dev, words * sizeof(unsigned),
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    return -1;
  for (size_t i = 0; i < words; i++)
    if (host[i] != seed * 2654435761u + (unsigned)i)
      return (int)i + 1;
  return 0;
}

int main(void) {
  const size_t mib_words = (1 << 20) / sizeof(unsigned);
  unsigned *host = (unsigned *)malloc(16 << 20);
  unsigned *before[3];
  for (int i = 0; i < 3; i++) {
    CHECK(cudaMalloc((void **)&before[i], 1 << 20));
    if (fill_and_check(before[i], mib_words, 7u + i, host) != 0) {
      printf("reset_leak: FAIL: buffer %d wrong before the reset\n", i);
      return 1;
    }
  }
  CHECK(cudaFree(before[1]));
  CHECK(cudaDeviceReset()); /* before[0] and before[2] die here, unfreed */
  for (int i = 0; i < 64; i++) {
    size_t bytes = (size_t)(4096 + (i * 977) % 4096) << (i % 12);
    size_t words = bytes / sizeof(unsigned);
    if (bytes > (16u << 20))
      continue;
    unsigned *buf = NULL;
    CHECK(cudaMalloc((void **)&buf, bytes));
    int bad = fill_and_check(buf, words, 100u + i, host);
    if (bad != 0) {
      printf("reset_leak: FAIL: buffer %d (%zu bytes) after the reset: %s\n",
             i, bytes, bad < 0 ? "copy failed" : "wrong contents");
      return 1;
    }
    CHECK(cudaFree(buf));
  }
  CHECK(cudaDeviceSynchronize());
  free(host);
  printf("reset_leak: PASS\n");
  return 0;
}
