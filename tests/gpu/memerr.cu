// memerr: one memory error a kernel makes in a 1000-byte cudaMalloc block,
// for compute-sanitizer or memcheck:1 to find (tests/gpu/gpu_general.py,
// the nvtx_* and memcheck_* rows):
//
//   memerr overflow   writes the byte just past the block's end
//   memerr over511    writes the 511 bytes past its end (memcheck's red zone
//                     less one byte)
//   memerr freed      frees the block, then writes its first byte
//   memerr unwritten  reads the block's first 4 bytes, never written
//   memerr leak       never frees the block
//   memerr clean      writes the block's last byte, frees it
//
// Prints the library's "pooled:" line (gpu_check.h), then "memerr: MODE
// <the device's answer to the synchronize>", and for unwritten "memerr:
// read 0x<the 4 bytes as a little-endian word>".
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

#include "gpu_check.h"

__global__ void put(char *p, size_t at) { p[at] = 1; }
__global__ void put_run(char *p, size_t at, size_t n) {
  for (size_t i = threadIdx.x; i < n; i += blockDim.x)
    p[at + i] = 1;
}
__global__ void get(const unsigned *p, unsigned *out) { *out = *p; }

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
  } else if (!strcmp(mode, "over511")) {
    put_run<<<1, 128>>>(block, 1000, 511);
  } else if (!strcmp(mode, "clean")) {
    put<<<1, 1>>>(block, 999);
  }
  unsigned word = 0, *seen = nullptr;
  if (!strcmp(mode, "unwritten") && cudaMalloc(&seen, sizeof(word)) == cudaSuccess) {
    get<<<1, 1>>>(reinterpret_cast<unsigned *>(block), seen);
    cudaMemcpy(&word, seen, sizeof(word), cudaMemcpyDeviceToHost);
    cudaFree(seen);
    printf("memerr: read 0x%08x\n", word);
  }
  cudaError_t e = cudaDeviceSynchronize();
  gc_check_stats(GC_EXPECT_ANY, 0, seen ? 3 : 2, seen ? 1 : freed ? 1 : 0);
  printf("memerr: %s %s\n", mode, cudaGetErrorName(e));
  if (!freed && strcmp(mode, "leak"))
    cudaFree(block);
  cudaFree(other);
  return 0;
}
