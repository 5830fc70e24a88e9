/*
 * driver_probe, part 5: modules and launches, as the library uses them for
 * memcheck's gather kernel (src/backend/gather_kernel.h): loading its PTX,
 * finding its entry and one that is not there, and what one launch does
 * to two sets of rows, one holding nothing but the byte expected (left
 * alone, said not copied) and one holding another byte (copied, said so).
 */
#include <cuda.h>

#include <stdio.h>
#include <string.h>

#include "backend/gather_kernel.h"
#include "driver_probe.h"

/* The two sets' rows: set 0 is 2 rows of 100 bytes, 4096 apart, all 0xFF;
 * set 1 one row of 200 bytes, 0xFF but byte 17. */
static void probe_gather(CUfunction fn, CUdeviceptr p, unsigned char *host) {
  cuMemsetD8_v2(p, 0xFF, 16384);
  cuMemsetD8_v2(p + 8192 + 17, 0x11, 1);
  memset(host, 0, 1024);
  ca_gather_args args = {.expect = 0xFF};
  args.set[0] = (ca_gather_set){.src = p, .dst = (uint64_t)(uintptr_t)host,
                                .pitch = 4096, .copied = (uint64_t)(uintptr_t)(host + 1000),
                                .width = 100, .rows = 2};
  args.set[1] = (ca_gather_set){.src = p + 8192, .dst = (uint64_t)(uintptr_t)(host + 400),
                                .pitch = 0, .copied = (uint64_t)(uintptr_t)(host + 1001),
                                .width = 200, .rows = 1};
  void *params[] = {&args};
  Q("kernel cuLaunchKernel(ca_gather, 2 sets, the legacy stream)",
    cuLaunchKernel(fn, 2, 1, 1, 256, 1, 1, 0, CU_STREAM_LEGACY, params, NULL));
  Q("kernel cuCtxSynchronize after it", cuCtxSynchronize());
  int left = 1, same = host[400 + 17] == 0x11;
  for (int i = 0; i < 200; i++) {
    left &= host[i] == 0;
    same &= i == 17 || host[400 + i] == 0xFF;
  }
  printf("kernel gather: set 0 copied %d, its bytes left alone %d; set 1 copied %d, "
         "its bytes as on the device %d\n",
         host[1000], left, host[1001], same);
}

void probe_kernels(void) {
  CUmodule mod = NULL;
  CUfunction fn = NULL, none = NULL;
  CUdeviceptr p = 0;
  void *host = NULL;
  Q("kernel cuModuleLoadData(NULL)", cuModuleLoadData(&mod, NULL));
  Q("kernel cuModuleLoadData(gather PTX)", cuModuleLoadData(&mod, ca_gather_ptx));
  Q("kernel cuModuleGetFunction(ca_gather)", cuModuleGetFunction(&fn, mod, "ca_gather"));
  Q("kernel cuModuleGetFunction(an absent entry)",
    cuModuleGetFunction(&none, mod, "no_such_entry"));
  if (fn && cuMemAlloc_v2(&p, 16384) == CUDA_SUCCESS &&
      cuMemHostAlloc(&host, 1024, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS)
    probe_gather(fn, p, host);
  if (host)
    cuMemFreeHost(host);
  if (p)
    cuMemFree_v2(p);
}
