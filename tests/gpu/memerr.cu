// memerr: one memory error a kernel makes in a 1000-byte cudaMalloc block,
// for compute-sanitizer to find (tests/gpu/gpu_general.py, the nvtx_* rows):
//
//   memerr overflow   writes the byte just past the block's end
//   memerr freed      frees the block, then writes its first byte
//   memerr leak       never frees the block
//   memerr clean      writes the block's last byte, frees it
//
// Prints the library's "pooled:" line (gpu_check.h), then "memerr: MODE
// <the device's answer to the synchronize>".
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

#include "gpu_check.h"

__global__ void put(char *p, size_t at) { p[at] = 1; }

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "clean";
  gc_name = "memerr";
  char *other = nullptr, *block = nullptr;
  // A neighbour first, so that the block is not the first in its segment.
  if (cudaMalloc(&other, 4096) != cudaSuccess || cudaMalloc(&block, 1000) != cudaSuccess) {
    printf("memerr: %s cudaMalloc failed\n", mode);
    return 1;
  }
  bool freed = false;
  if (!strcmp(mode, "overflow")) {
    put<<<1, 1>>>(block, 1000);
  } else if (!strcmp(mode, "freed")) {
    cudaFree(block);
    freed = true;
    put<<<1, 1>>>(block, 0);
  } else if (!strcmp(mode, "clean")) {
    put<<<1, 1>>>(block, 999);
  }
  cudaError_t e = cudaDeviceSynchronize();
  gc_check_stats(GC_EXPECT_ANY, 0, 2, freed ? 1 : 0);
  printf("memerr: %s %s\n", mode, cudaGetErrorName(e));
  if (!freed && strcmp(mode, "leak"))
    cudaFree(block);
  cudaFree(other);
  return 0;
}
