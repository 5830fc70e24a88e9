/*
 * alloc_fill: the CUDA runtime's allocations, filled and checked on the GPU.
 *
 * Why: the CUDA runtime (static, nvcc's default, or -cudart=shared) reaches
 * the driver only through dlsym(cuGetProcAddress_v2) and cuGetProcAddress,
 * so this is the program that proves those two ways in on real hardware.
 * A pool that hands out one block twice, hands out a block the device still
 * uses, or returns a wrong address shows up here as a wrong value, not as a
 * crash somewhere else.
 *
 * What it does and checks:
 *  - a loop (3000 iterations by default) of mixed sizes, 256 B to 64 MiB
 *    (log-uniform, deterministic PRNG), up to 32 buffers live: each
 *    cudaMalloc'd buffer is checked to be 256-byte aligned and not to
 *    overlap any live buffer, is filled by a kernel with a pattern unique to
 *    (buffer, element), and verified at once and again just before its
 *    cudaFree (a verification kernel counts mismatching elements into a
 *    device counter; the first and last 4 KiB are also copied back and
 *    compared on the host); every 750 iterations all live buffers are
 *    verified and freed;
 *  - halfway: cudaMallocAsync/cudaFreeAsync on a non-blocking stream (one
 *    buffer freed by plain cudaFree, which must pass through the library),
 *    cudaMallocPitch with a 2D fill and cudaMemcpy2D check, cudaMallocManaged
 *    written on the host, updated by a kernel and checked on the host, and
 *    cudaMemGetInfo sanity;
 *  - at the end, the library's statistics, held to the expectation given
 *    as the first argument (see gpu_check.h): under "pooled" the pool served
 *    every cudaMalloc with backend_allocs < 10% of allocs.
 * Every CUDA return code is checked. Last line: "alloc_fill: PASS" or
 * "alloc_fill: FAIL: <why>".
 *
 * Usage: alloc_fill <plain|pooled|passthrough|any> [iterations] [max_log2]
 * (max_log2 26: sizes below 64 MiB; smaller for slow tools such as
 * compute-sanitizer).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpu_check.h"


#define MAX_LIVE 32u
#define WINDOW_BYTES 4096u
#define THREADS 256u

/* Row r of a pitched 2D buffer of `cols` words per row: element r*cols+c. */
__global__ void fill2d_kernel(char *base, size_t pitch, size_t cols,
                              size_t rows, uint32_t serial) {
  size_t n = cols * rows;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    size_t r = i / cols, c = i % cols;
    ((uint32_t *)(base + r * pitch))[c] = gc_pattern(serial, i);
  }
}

__global__ void managed_kernel(uint32_t *p, size_t n) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    p[i] = p[i] * 3u + 1u;
}

static unsigned grid_for(size_t n) {
  size_t blocks = (n + THREADS - 1) / THREADS;
  if (blocks > 2048)
    blocks = 2048;
  return blocks == 0 ? 1u : (unsigned)blocks;
}

typedef struct buffer {
  uint32_t *p;
  size_t bytes;
  uint32_t serial;
} buffer;

static unsigned long long *d_mismatches; /* one counter, reused */
static uint32_t host_window[WINDOW_BYTES / 4];
static uint64_t my_allocs, my_frees; /* cudaMalloc / cudaFree of those */
static unsigned long long verified_bytes;

/* Fills b on `stream` with its pattern. */
static void fill(const buffer *b, cudaStream_t stream) {
  size_t n = b->bytes / 4;
  gc_fill_kernel<<<grid_for(n), THREADS, 0, stream>>>(b->p, n, b->serial);
  CK_LAUNCH();
}

/* Checks every element of b on the device, and the first and last window on
 * the host, after the work queued on `stream`. */
static void verify(const buffer *b, cudaStream_t stream, long iteration,
                   const char *when) {
  size_t n = b->bytes / 4;
  unsigned long long bad = ~0ull;
  CK(cudaMemsetAsync(d_mismatches, 0, sizeof(*d_mismatches), stream));
  gc_verify_kernel<<<grid_for(n), THREADS, 0, stream>>>(b->p, n, b->serial,
                                                     d_mismatches);
  CK_LAUNCH();
  CK(cudaMemcpyAsync(&bad, d_mismatches, sizeof(bad), cudaMemcpyDeviceToHost,
                     stream));
  CK(cudaStreamSynchronize(stream));
  if (bad != 0)
    gc_fail("iteration %ld, %s: %llu of %zu elements wrong in buffer #%u "
            "(%zu bytes at %p)",
            iteration, when, bad, n, b->serial, b->bytes, (void *)b->p);
  size_t window = n < WINDOW_BYTES / 4 ? n : WINDOW_BYTES / 4;
  size_t starts[2] = {0, n - window};
  for (int k = 0; k < 2; k++) {
    CK(cudaMemcpyAsync(host_window, b->p + starts[k], window * 4,
                       cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < window; i++) {
      uint32_t want = gc_pattern(b->serial, starts[k] + i);
      if (host_window[i] != want)
        gc_fail("iteration %ld, %s: buffer #%u element %zu is 0x%08x, "
                "expected 0x%08x (host copy)",
                iteration, when, b->serial, starts[k] + i, host_window[i],
                want);
    }
  }
  verified_bytes += b->bytes;
}

/* A new buffer must be aligned as cudaMalloc promises and must not overlap
 * any live one. */
static void check_placement(const buffer *b, const buffer *live,
                            unsigned nlive, long iteration) {
  uintptr_t a = (uintptr_t)b->p;
  if (b->p == NULL || a % 256 != 0)
    gc_fail("iteration %ld: cudaMalloc(%zu) gave %p, not 256-byte aligned",
            iteration, b->bytes, (void *)b->p);
  for (unsigned j = 0; j < nlive; j++) {
    uintptr_t o = (uintptr_t)live[j].p;
    if (a < o + live[j].bytes && o < a + b->bytes)
      gc_fail("iteration %ld: new buffer [%p, +%zu) overlaps live buffer #%u "
              "[%p, +%zu)",
              iteration, (void *)b->p, b->bytes, live[j].serial,
              (void *)live[j].p, live[j].bytes);
  }
}

/* The calls that pass through the library (tracked, not pooled). */
static void other_allocators(uint32_t *serial) {
  /* Stream-ordered allocations on a non-blocking stream. */
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int k = 0; k < 6; k++) {
    buffer b;
    b.bytes = ((size_t)(k + 1) << 20) + 4u * (size_t)k;
    b.serial = (*serial)++;
    CK(cudaMallocAsync((void **)&b.p, b.bytes, st));
    fill(&b, st);
    verify(&b, st, -1, "cudaMallocAsync buffer");
    if (k < 5) {
      CK(cudaFreeAsync(b.p, st));
    } else {
      /* cudaFree of a stream-ordered allocation: not the pool's, so the
       * library must hand it to the driver. */
      CK(cudaStreamSynchronize(st));
      CK(cudaFree(b.p));
    }
  }
  CK(cudaStreamSynchronize(st));
  CK(cudaStreamDestroy(st));

  /* Pitched 2D allocation. */
  const size_t width = 4012, rows = 37, cols = width / 4;
  char *pitched = NULL;
  size_t pitch = 0;
  uint32_t s2d = (*serial)++;
  CK(cudaMallocPitch((void **)&pitched, &pitch, width, rows));
  if (pitched == NULL || pitch < width || pitch % 4 != 0)
    gc_fail("cudaMallocPitch(%zu, %zu) gave %p with pitch %zu", width, rows,
            (void *)pitched, pitch);
  fill2d_kernel<<<grid_for(cols * rows), THREADS>>>(pitched, pitch, cols,
                                                     rows, s2d);
  CK_LAUNCH();
  uint32_t *dense = (uint32_t *)malloc(width * rows);
  if (dense == NULL)
    gc_fail("host malloc failed");
  CK(cudaMemcpy2D(dense, width, pitched, pitch, width, rows,
                  cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < cols * rows; i++)
    if (dense[i] != gc_pattern(s2d, i))
      gc_fail("cudaMallocPitch buffer: element %zu (row %zu) is 0x%08x, "
              "expected 0x%08x",
              i, i / cols, dense[i], gc_pattern(s2d, i));
  free(dense);
  CK(cudaFree(pitched));

  /* Managed memory: written by the host, updated by the device. */
  const size_t mn = (1u << 20) / 4;
  uint32_t *m = NULL;
  CK(cudaMallocManaged((void **)&m, mn * 4, cudaMemAttachGlobal));
  for (size_t i = 0; i < mn; i++)
    m[i] = (uint32_t)i;
  managed_kernel<<<grid_for(mn), THREADS>>>(m, mn);
  CK_LAUNCH();
  CK(cudaDeviceSynchronize());
  for (size_t i = 0; i < mn; i++)
    if (m[i] != (uint32_t)i * 3u + 1u)
      gc_fail("managed buffer: element %zu is %u, expected %u", i, m[i],
              (uint32_t)i * 3u + 1u);
  CK(cudaFree(m));

  /* Memory info: the library adds its cached bytes to free, never past
   * total. */
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  gc_check_mem_info("cudaMemGetInfo", free_b, total_b);
}

int main(int argc, char **argv) {
  gc_args args = gc_start("alloc_fill", argc, argv, 3000, 26u);
  int expect = args.expect;
  long iterations = args.iterations;
  unsigned max_log2 = args.max_log2;

  int runtime_version = 0, driver_version = 0, device = -1;
  CK(cudaRuntimeGetVersion(&runtime_version));
  CK(cudaDriverGetVersion(&driver_version));
  CK(cudaSetDevice(0));
  CK(cudaGetDevice(&device));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  printf("alloc_fill: device %d %s (sm_%d%d), runtime %d, driver %d, "
         "%ld iterations, sizes 256 B .. 2^%u B, up to %u live\n",
         device, prop.name, prop.major, prop.minor, runtime_version,
         driver_version, iterations, max_log2, MAX_LIVE);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);

  CK(cudaMalloc((void **)&d_mismatches, sizeof(*d_mismatches)));
  my_allocs++;

  uint64_t rng = 0xC0DA110CULL;
  buffer live[MAX_LIVE];
  unsigned nlive = 0;
  uint32_t serial = 1;
  for (long it = 0; it < iterations; it++) {
    if (it == iterations / 2)
      other_allocators(&serial);
    if (it % 750 == 749) {
      for (unsigned j = 0; j < nlive; j++) {
        verify(&live[j], 0, it, "before freeing all");
        CK(cudaFree(live[j].p));
        my_frees++;
      }
      nlive = 0;
      continue;
    }
    gc_step s = gc_plan_step(&rng, nlive, MAX_LIVE, max_log2);
    if (s.free_index >= 0) {
      verify(&live[s.free_index], 0, it, "before cudaFree");
      CK(cudaFree(live[s.free_index].p));
      my_frees++;
      live[s.free_index] = live[--nlive];
    }
    if (s.alloc_bytes > 0) {
      buffer b;
      b.bytes = s.alloc_bytes;
      b.serial = serial++;
      b.p = NULL;
      CK(cudaMalloc((void **)&b.p, b.bytes));
      my_allocs++;
      check_placement(&b, live, nlive, it);
      fill(&b, 0);
      verify(&b, 0, it, "after fill");
      live[nlive++] = b;
    }
  }
  for (unsigned j = 0; j < nlive; j++) {
    verify(&live[j], 0, iterations, "at the end");
    CK(cudaFree(live[j].p));
    my_frees++;
  }
  CK(cudaFree(d_mismatches));
  my_frees++;
  CK(cudaDeviceSynchronize());

  double secs = gc_elapsed(&t0);
  printf("alloc_fill: %llu cudaMalloc, %llu cudaFree, %.1f GiB verified, "
         "%.2f s\n",
         (unsigned long long)my_allocs, (unsigned long long)my_frees,
         (double)verified_bytes / (1024.0 * 1024.0 * 1024.0), secs);
  gc_check_stats(expect, device, my_allocs, my_frees);
  printf("alloc_fill: PASS\n");
  return 0;
}
