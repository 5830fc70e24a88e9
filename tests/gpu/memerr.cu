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
//   memerr stale      through the allocator slot on a stream: 40 blocks of
//                     8 MiB written whole and freed, then 64 blocks of other
//                     sizes over their bytes, each written whole once its red
//                     zone's first and last bytes were read; prints "memerr:
//                     stale zones Z/64 mid 0xMM head 0xHH" (red zones that
//                     read 0xFF; a freed block's middle and first byte)
//   memerr batch      32 blocks of 1000 bytes and 32 of 64 KiB, all freed,
//                     which memcheck checks as one batch at exit (one
//                     launch of its gather kernel): the byte past the sixth
//                     small block's end written before the frees, the tenth
//                     large block's first byte after them
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
__global__ void get_byte(const unsigned char *p, unsigned char *out) { *out = *p; }

typedef void *(*slot_malloc_fn)(size_t, int, cudaStream_t);
typedef void (*slot_free_fn)(void *, size_t, int, cudaStream_t);

// A byte of device memory as a kernel reads it (a copy from a freed pooled
// block would be refused, as the driver refuses one from freed memory).
static unsigned char byte_at(const void *p, unsigned char *dev, cudaStream_t s) {
  unsigned char b = 0;
  get_byte<<<1, 1, 0, s>>>(static_cast<const unsigned char *>(p), dev);
  cudaMemcpyAsync(&b, dev, 1, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  return b;
}

static int stale(void) {
  slot_malloc_fn slot_malloc = (slot_malloc_fn)dlsym(RTLD_DEFAULT, "cudalloc_stream_malloc");
  slot_free_fn slot_free = (slot_free_fn)dlsym(RTLD_DEFAULT, "cudalloc_stream_free");
  cudaStream_t s = nullptr;
  unsigned char *dev = nullptr;
  if (!slot_malloc || !slot_free || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
      cudaMalloc(&dev, 1)) {
    printf("memerr: stale set-up failed\n");
    return 1;
  }
  const size_t big = 8u << 20;
  void *first = nullptr;
  for (int i = 0; i < 40; i++) {  // past the quarantine's 256 MiB
    void *p = slot_malloc(big, 0, s);
    cudaMemsetAsync(p, 0x44, big, s);
    slot_free(p, big, 0, s);
    first = first ? first : p;
  }
  unsigned mid = byte_at(static_cast<char *>(first) + big / 2, dev, s);
  unsigned head = byte_at(first, dev, s);
  void *q[64];
  int zones = 0;
  for (int i = 0; i < 64; i++) {
    size_t size = (1u << 20) + 4096 * (size_t)(i + 1);
    q[i] = slot_malloc(size, 0, s);
    char *end = static_cast<char *>(q[i]) + size;
    zones += byte_at(end, dev, s) == 0xFF && byte_at(end + 511, dev, s) == 0xFF;
    cudaMemsetAsync(q[i], 0x55, size, s);
  }
  for (int i = 0; i < 64; i++)
    slot_free(q[i], (1u << 20) + 4096 * (size_t)(i + 1), 0, s);
  cudaError_t e = cudaStreamSynchronize(s);
  printf("memerr: stale zones %d/64 mid 0x%02x head 0x%02x\n", zones, mid, head);
  gc_check_stats(GC_EXPECT_ANY, 0, 105, 104);
  printf("memerr: stale %s\n", cudaGetErrorName(e));
  cudaFree(dev);
  cudaStreamDestroy(s);
  return 0;
}

static int batch(void) {
  char *small[32], *big[32];
  for (int i = 0; i < 32; i++)
    if (cudaMalloc(&small[i], 1000) != cudaSuccess || cudaMalloc(&big[i], 64u << 10) != cudaSuccess) {
      printf("memerr: batch cudaMalloc failed\n");
      return 1;
    }
  put<<<1, 1>>>(small[5], 1000);
  for (int i = 0; i < 32; i++) {
    cudaFree(small[i]);
    cudaFree(big[i]);
  }
  put<<<1, 1>>>(big[9], 0);
  cudaError_t e = cudaDeviceSynchronize();
  gc_check_stats(GC_EXPECT_ANY, 0, 64, 64);
  printf("memerr: batch %s\n", cudaGetErrorName(e));
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "clean";
  gc_name = "memerr";
  if (!strcmp(mode, "stale"))
    return stale();
  if (!strcmp(mode, "batch"))
    return batch();
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
