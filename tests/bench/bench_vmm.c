/*
 * bench_vmm: what the driver's virtual-memory calls cost, beside
 * cuMemAlloc/cuMemFree of the same bytes: the price an expandable segment
 * pays at a miss (map) and when it gives pages back (unmap). A benchmark,
 * run by hand on a GPU machine (docs/BENCHMARKS.md); prints one line per case:
 *   bench_vmm: <case> <MiB> MiB: <us> us (median of N)
 * Build: the project's CMake (target bench_vmm), or in tests/bench:
 *   cc -O2 -std=c11 -I<cuda>/include bench_vmm.c -lcuda
 */
#define _POSIX_C_SOURCE 200809L
#define BENCH_NAME "bench_vmm"
#include "bench_gpu.h"

#include <string.h>

#define PAGE (2ull << 20)
#define ROUNDS 21
#define MAX_PAGES 512

static double median(double *v) {
  qsort(v, ROUNDS, sizeof(*v), cmp_double);
  return v[ROUNDS / 2];
}

static CUmemGenericAllocationHandle handles[MAX_PAGES];

/* Maps `pages` pages at va, one handle each, and one cuMemSetAccess. */
static void map_pages(CUdeviceptr va, int pages) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  for (int i = 0; i < pages; i++) {
    DK(cuMemCreate(&handles[i], PAGE, &prop, 0));
    DK(cuMemMap(va + i * PAGE, PAGE, 0, handles[i], 0));
    DK(cuMemRelease(handles[i]));
  }
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DK(cuMemSetAccess(va, pages * PAGE, &d, 1));
}

static void unmap_pages(CUdeviceptr va, int pages) {
  for (int i = 0; i < pages; i++)
    DK(cuMemUnmap(va + i * PAGE, PAGE));
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  DK(cuInit(0));
  DK(cuDeviceGet(&dev, 0));
  DK(cuDevicePrimaryCtxRetain(&ctx, dev));
  DK(cuCtxSetCurrent(ctx));
  CUdeviceptr va;
  DK(cuMemAddressReserve(&va, MAX_PAGES * PAGE, 0, 0, 0));
  int sizes[] = {1, 10, 100, 500};
  for (unsigned k = 0; k < sizeof(sizes) / sizeof(*sizes); k++) {
    int pages = sizes[k];
    double map[ROUNDS], unmap[ROUNDS], alloc[ROUNDS], freed[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
      double t0 = now_ns() / 1e3;
      map_pages(va, pages);
      double t1 = now_ns() / 1e3;
      unmap_pages(va, pages);
      double t2 = now_ns() / 1e3;
      CUdeviceptr p;
      DK(cuMemAlloc(&p, pages * PAGE));
      double t3 = now_ns() / 1e3;
      DK(cuMemFree(p));
      double t4 = now_ns() / 1e3;
      map[r] = t1 - t0, unmap[r] = t2 - t1, alloc[r] = t3 - t2, freed[r] = t4 - t3;
    }
    int mib = pages * 2;
    printf("bench_vmm: map %d MiB: %.1f us (median of %d)\n", mib, median(map), ROUNDS);
    printf("bench_vmm: unmap %d MiB: %.1f us (median of %d)\n", mib, median(unmap), ROUNDS);
    printf("bench_vmm: cuMemAlloc %d MiB: %.1f us (median of %d)\n", mib, median(alloc), ROUNDS);
    printf("bench_vmm: cuMemFree %d MiB: %.1f us (median of %d)\n", mib, median(freed), ROUNDS);
  }
  DK(cuMemAddressFree(va, MAX_PAGES * PAGE));
  return 0;
}
