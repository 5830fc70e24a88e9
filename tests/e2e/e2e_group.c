/*
 * e2e_group: a process of a shared_limit group (group_test.py runs several
 * at once, with the library preloaded, against the mock driver with
 * MOCKCUDA_SHARED_MEM, so that they share one device as on a GPU):
 *
 *   churn SEED OPS  OPS random allocations and frees, 256 B to 8 MiB, up to
 *                   32 live; one in eight passed through to the driver
 *                   (managed memory, in whole 2 MiB pages). Each block's
 *                   bytes are set at its allocation and checked at its free.
 *                   A refusal for memory frees the oldest live block and goes
 *                   on. All freed at the end. Prints "ops=N refused=M".
 *   hold MIB        MIB in blocks of 16 MiB, allocated and freed (the pool
 *                   caches them); prints "ready", waits for a line on stdin,
 *                   prints "reserved=B cached=B" and exits
 *   keep MIB        MIB in blocks of 16 MiB, kept; prints "ready", waits for
 *                   a line on stdin, frees them and exits
 *   need MIB        prints "free=F total=T" (cuMemGetInfo), then one block of
 *                   MIB, its bytes set and checked; prints "rc=R ms=T" (R 0
 *                   or the driver's code) and exits 0
 *   slot MIB        the same through the allocator slot
 *                   (cudalloc_stream_try_malloc on device 0, stream 0):
 *                   R is 0, or 2 (out of memory) for NULL
 *   cycle           until killed: blocks of 2 to 8 MiB, each freed and the
 *                   cache given back at once (cudalloc_empty_cache), so that
 *                   every step books and gives back; prints "cycling" first
 *   fork MIB        MIB kept; a child that never touches CUDA exits through
 *                   exit(); then a child that keeps MIB too. Both print
 *                   "ready pid=P" and wait for a line on stdin, then free
 *                   and exit; the parent prints "child status=S"
 *
 * A failed call that is no refusal for memory ends the program: "FAIL
 * e2e_group: ...", exit 1.
 */
#define E2E_PROG "e2e_group"
#include "e2e_direct.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "cudalloc.h"

#define MIB (1ull << 20)
#define LIVE 32
#define EDGE 4096 /* bytes checked at each end of a block */

typedef struct block {
  CUdeviceptr addr;
  size_t size;
  unsigned char byte;
  int managed;
} block;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A block's first and last EDGE bytes hold its byte. */
static void check_bytes(const block *b) {
  static unsigned char host[EDGE];
  size_t n = b->size < EDGE ? b->size : EDGE;
  for (int end = 0; end < 2; end++) {
    CUdeviceptr at = end ? b->addr + b->size - n : b->addr;
    CHECK(cuMemcpyDtoH(host, at, n));
    for (size_t i = 0; i < n; i++)
      if (host[i] != b->byte) {
        fprintf(stderr, "FAIL " E2E_PROG ": byte %zu of a %zu-byte block is %u, "
                "want %u\n", (size_t)(at - b->addr) + i, b->size, host[i], b->byte);
        _exit(1);
      }
  }
}

/* A new block of `size`, its bytes set; CUDA_ERROR_OUT_OF_MEMORY passes
 * through, any other failure ends the program. */
static CUresult take(block *b, size_t size, int managed, unsigned char byte) {
  *b = (block){0, size, byte, managed};
  CUresult rc = managed ? cuMemAllocManaged(&b->addr, size, CU_MEM_ATTACH_GLOBAL)
                        : cuMemAlloc(&b->addr, size);
  if (rc == CUDA_ERROR_OUT_OF_MEMORY)
    return rc;
  if (rc != CUDA_SUCCESS)
    fail(managed ? "cuMemAllocManaged" : "cuMemAlloc", (int)rc);
  CHECK(cuMemsetD8(b->addr, byte, size));
  return rc;
}

static void drop(block *b) {
  check_bytes(b);
  CHECK(cuMemFree(b->addr));
  b->addr = 0;
}

static size_t random_size(unsigned *seed, int *managed) {
  *managed = rand_r(seed) % 8 == 0;
  if (*managed)
    return (size_t)(1 + rand_r(seed) % 3) * 2 * MIB;
  /* As many in each octave from 256 B to 8 MiB. */
  size_t base = (size_t)256 << (rand_r(seed) % 15);
  return base + (size_t)rand_r(seed) % base;
}

static int churn(unsigned seed, int ops) {
  block live[LIVE] = {{0}};
  int n = 0, refused = 0;
  for (int op = 0; op < ops; op++) {
    if (n == LIVE || (n > 0 && rand_r(&seed) % 2)) {
      int i = rand_r(&seed) % n;
      drop(&live[i]);
      live[i] = live[--n];
      continue;
    }
    int managed;
    size_t size = random_size(&seed, &managed);
    if (take(&live[n], size, managed, (unsigned char)(1 + op % 250)) == CUDA_SUCCESS) {
      n++;
      continue;
    }
    refused++;
    if (n > 0) { /* the oldest goes, as a program under pressure would */
      drop(&live[0]);
      live[0] = live[--n];
    }
  }
  while (n > 0)
    drop(&live[--n]);
  printf("ops=%d refused=%d\n", ops, refused);
  return 0;
}

static void wait_for_line(void) {
  char line[64];
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin))
    return;
}

/* `mib` in blocks of 16 MiB (their own segments), into b[]; returns how
 * many. */
static int take_blocks(block *b, int mib) {
  int n = mib / 16;
  for (int i = 0; i < n; i++)
    if (take(&b[i], 16 * MIB, 0, (unsigned char)(0x40 + i)) != CUDA_SUCCESS)
      fail("cuMemAlloc (16 MiB)", CUDA_ERROR_OUT_OF_MEMORY);
  return n;
}

static int hold(int mib, int keep) {
  block b[256];
  if (mib / 16 > 256)
    fail("hold: at most 4096 MiB", 0);
  int n = take_blocks(b, mib);
  if (!keep)
    for (int i = 0; i < n; i++)
      drop(&b[i]);
  printf("ready\n");
  wait_for_line();
  if (keep)
    for (int i = 0; i < n; i++)
      drop(&b[i]);
  int (*stats)(int, cudalloc_device_stats *, size_t) =
      (int (*)(int, cudalloc_device_stats *, size_t))dlsym(RTLD_DEFAULT, "cudalloc_get_stats");
  cudalloc_device_stats s = {0};
  if (stats)
    stats(0, &s, sizeof(s));
  printf("reserved=%llu cached=%llu\n", (unsigned long long)s.reserved_bytes.current,
         (unsigned long long)s.free_cached_bytes);
  return 0;
}

static int need(int mib) {
  block b;
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  printf("free=%zu total=%zu\n", free_bytes, total);
  uint64_t start = now_ms();
  CUresult rc = take(&b, (size_t)mib * MIB, 0, 0x5a);
  uint64_t ms = now_ms() - start;
  if (rc == CUDA_SUCCESS)
    drop(&b);
  printf("rc=%d ms=%llu\n", (int)rc, (unsigned long long)ms);
  return 0;
}

static int slot(int mib) {
  void *(*try_malloc)(size_t, int, void *) =
      (void *(*)(size_t, int, void *))dlsym(RTLD_DEFAULT, "cudalloc_stream_try_malloc");
  void (*slot_free)(void *, size_t, int, void *) =
      (void (*)(void *, size_t, int, void *))dlsym(RTLD_DEFAULT, "cudalloc_stream_free");
  if (!try_malloc || !slot_free)
    fail("the allocator slot (cudalloc_stream_try_malloc) is not loaded", 0);
  size_t size = (size_t)mib * MIB;
  uint64_t start = now_ms();
  void *p = try_malloc(size, 0, NULL);
  uint64_t ms = now_ms() - start;
  if (p) {
    block b = {(CUdeviceptr)(uintptr_t)p, size, 0x6b, 0};
    CHECK(cuMemsetD8(b.addr, b.byte, size));
    check_bytes(&b);
    slot_free(p, size, 0, NULL);
  }
  printf("rc=%d ms=%llu\n", p ? 0 : (int)CUDA_ERROR_OUT_OF_MEMORY, (unsigned long long)ms);
  return 0;
}

static _Noreturn void cycle(void) {
  uint64_t (*empty)(void) = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "cudalloc_empty_cache");
  unsigned seed = (unsigned)getpid();
  printf("cycling\n");
  fflush(stdout);
  for (;;) {
    block b;
    if (take(&b, (size_t)(2 + rand_r(&seed) % 4) * 2 * MIB, 0, 0x33) == CUDA_SUCCESS)
      drop(&b);
    if (empty)
      empty();
  }
}

static int forked(int mib) {
  block b[64];
  int n = take_blocks(b, mib);
  /* A child that never touches CUDA, ending through exit() as a worker
   * of a data loader may: the parent's part stays the parent's. */
  pid_t quiet = fork();
  if (quiet == 0)
    exit(0);
  int status = -1;
  if (quiet < 0 || waitpid(quiet, &status, 0) != quiet || status != 0)
    fail("fork (a child without CUDA)", status);
  pid_t child = fork();
  if (child < 0)
    fail("fork", 0);
  if (child == 0) {
    block c[64];
    int k = take_blocks(c, mib);
    printf("ready pid=%d\n", (int)getpid());
    wait_for_line();
    while (k > 0)
      drop(&c[--k]);
    exit(0);
  }
  printf("ready pid=%d\n", (int)getpid());
  wait_for_line();
  while (n > 0)
    drop(&b[--n]);
  waitpid(child, &status, 0);
  printf("child status=%d\n", status);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) {
    fprintf(stderr, "usage: e2e_group churn SEED OPS | hold MIB | keep MIB | "
                    "need MIB | slot MIB | cycle | fork MIB\n");
    return 2;
  }
  setup();
  const char *mode = argv[1];
  int a = argc > 2 ? atoi(argv[2]) : 0;
  if (!strcmp(mode, "churn") && argc > 3)
    return churn((unsigned)a, atoi(argv[3]));
  if (!strcmp(mode, "hold") || !strcmp(mode, "keep"))
    return hold(a, !strcmp(mode, "keep"));
  if (!strcmp(mode, "need"))
    return need(a);
  if (!strcmp(mode, "slot"))
    return slot(a);
  if (!strcmp(mode, "cycle"))
    cycle();
  if (!strcmp(mode, "fork"))
    return forked(a);
  fprintf(stderr, "e2e_group: unknown mode %s\n", mode);
  return 2;
}
