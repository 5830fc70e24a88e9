/*
 * e2e_reach: the patterns the leak report must class as lost or still
 * reachable (reach_test.py reads the report at exit; docs/LEAKS.md). Each
 * mode makes 100 pooled 1 MiB allocations in alloc_loop() and keeps their
 * addresses, or not, as its name says:
 *
 *   lost       in one local, overwritten each iteration: all 100 lost
 *   checked    as lost, the last block set with cuMemsetD8 first (a
 *              memset the library checks against the block): all 100 lost
 *   global     in a global array: all 100 still reachable
 *   heap       in a malloc'd array: all still reachable
 *   interior   only an address 4 KiB into each block: still reachable
 *   thread     in an array on the stack of a thread that waits on a
 *              condition when main exits: still reachable
 *   half       in a global array whose odd entries are then cleared: 50
 *              lost, 50 still reachable
 *   managed    a lost managed allocation (passed through to the driver):
 *              a leak the scan cannot class
 *   hold N S   N blocks of 1 MiB kept in the global array (N <= 100), then
 *              a sleep of S seconds before exiting (for cudalloc top)
 *   grow S     keeps one more 1 MiB block from grow_step() every 20 ms, 100
 *              in all, calling cudalloc_mark() after each, then sleeps S s
 *   huge       asks for 64 GiB once (refused by the mock: an out-of-memory
 *              retry in the pool) and exits
 *   bigheap N  lost, as "lost", after N MiB of heap are malloc'd and
 *              written, then read once, timed (read_ms=: what the scan's
 *              cost on a large heap is weighed against)
 *
 * Built with -O0: no address survives in a register the scan cannot read.
 * Prints preloaded=0|1 and, for bigheap, heap_mib=N.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUNT 100
#define MIB (1u << 20)

static CUdeviceptr kept[COUNT];

static void check(CUresult rc, const char *what) {
  if (rc != CUDA_SUCCESS) {
    fprintf(stderr, "e2e_reach: %s failed: %d\n", what, (int)rc);
    exit(2);
  }
}

/* Allocates COUNT blocks; each address goes to out[i * stride] (stride 0:
 * the same slot every time) plus `offset`. */
static __attribute__((noinline)) void alloc_loop(CUdeviceptr *out, size_t stride,
                                                 CUdeviceptr offset) {
  for (size_t i = 0; i < COUNT; i++) {
    CUdeviceptr p = 0;
    check(cuMemAlloc_v2(&p, MIB), "cuMemAlloc_v2");
    out[i * stride] = p + offset;
  }
}

/* The volatile slot is overwritten each time and cleared at the end. */
static __attribute__((noinline)) void lose_all(void) {
  CUdeviceptr slot[1];
  alloc_loop(slot, 0, 0);
  memset((void *)slot, 0, sizeof(slot));
}

/* As lose_all, the last block written by a memset before its address goes:
 * what the library keeps of the check must not read as a pointer to it. */
static __attribute__((noinline)) void lose_all_checked(void) {
  CUdeviceptr slot[1];
  alloc_loop(slot, 0, 0);
  check(cuMemsetD8_v2(slot[0], 0x5a, MIB), "cuMemsetD8_v2");
  check(cuCtxSynchronize(), "cuCtxSynchronize");
  memset((void *)slot, 0, sizeof(slot));
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ready;

static void *hold_on_stack(void *arg) {
  CUdeviceptr mine[COUNT];
  check(cuCtxSetCurrent(*(CUcontext *)arg), "cuCtxSetCurrent");
  alloc_loop(mine, 1, 0);
  pthread_mutex_lock(&lock);
  ready = 1;
  pthread_cond_broadcast(&cond);
  for (;;) /* until the process exits */
    pthread_cond_wait(&cond, &lock);
  return NULL;
}

static CUcontext ctx;

/* Exported (the program links with -rdynamic): cudalloc top names a growing
 * site from the dynamic symbols, without opening a file. */
__attribute__((noinline, visibility("default"))) void grow_step(size_t i);
void grow_step(size_t i) {
  check(cuMemAlloc_v2(&kept[i], MIB), "cuMemAlloc_v2");
}

static void grow(unsigned seconds) {
  void (*mark)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "cudalloc_mark");
  for (size_t i = 0; i < COUNT; i++) {
    grow_step(i);
    if (mark)
      mark();
    usleep(20000);
  }
  printf("grown=%d\n", COUNT);
  fflush(stdout);
  sleep(seconds);
}

static void setup(void) {
  check(cuInit(0), "cuInit");
  check(cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "lost";
  printf("preloaded=%d\n", dlsym(RTLD_DEFAULT, "cudalloc_version") != NULL);
  setup();
  if (!strcmp(mode, "lost")) {
    lose_all();
  } else if (!strcmp(mode, "checked")) {
    lose_all_checked();
  } else if (!strcmp(mode, "global")) {
    alloc_loop(kept, 1, 0);
  } else if (!strcmp(mode, "heap")) {
    CUdeviceptr *v = malloc(COUNT * sizeof(*v));
    alloc_loop(v, 1, 0);
    printf("heap_array=%p\n", (void *)v);
  } else if (!strcmp(mode, "interior")) {
    alloc_loop(kept, 1, 4096);
  } else if (!strcmp(mode, "thread")) {
    pthread_t t;
    pthread_create(&t, NULL, hold_on_stack, &ctx);
    pthread_mutex_lock(&lock);
    while (!ready)
      pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(mode, "half")) {
    alloc_loop(kept, 1, 0);
    for (int i = 1; i < COUNT; i += 2)
      kept[i] = 0;
  } else if (!strcmp(mode, "managed")) {
    CUdeviceptr m = 0;
    check(cuMemAllocManaged(&m, MIB, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
    m = 0;
  } else if (!strcmp(mode, "hold") && argc > 3) {
    size_t n = strtoul(argv[2], NULL, 10);
    for (size_t i = 0; i < n && i < COUNT; i++)
      check(cuMemAlloc_v2(&kept[i], MIB), "cuMemAlloc_v2");
    printf("held=%zu\n", n);
    fflush(stdout);
    sleep((unsigned)strtoul(argv[3], NULL, 10));
  } else if (!strcmp(mode, "huge")) {
    CUdeviceptr p = 0;
    printf("huge=%d\n", (int)cuMemAlloc_v2(&p, 64ull << 30));
  } else if (!strcmp(mode, "grow") && argc > 2) {
    grow((unsigned)strtoul(argv[2], NULL, 10));
  } else if (!strcmp(mode, "bigheap") && argc > 2) {
    size_t mib = strtoul(argv[2], NULL, 10);
    char *heap = malloc(mib * MIB);
    if (heap == NULL)
      return 2;
    for (size_t i = 0; i < mib * MIB; i += 4096)
      heap[i] = (char)i; /* every page resident */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t sum = 0;
    for (size_t i = 0; i < mib * MIB / 8; i++)
      sum += ((volatile uint64_t *)(void *)heap)[i];
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("heap_mib=%zu\nread_ms=%.1f\nsum=%llu\n", mib,
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6,
           (unsigned long long)sum);
    lose_all();
  } else {
    fprintf(stderr, "e2e_reach: unknown mode %s\n", mode);
    return 2;
  }
  fflush(stdout);
  return 0;
}
