/*
 * e2e_memcheck: a driver-API program, linked to the mock driver, whose
 * memory errors memcheck_test.py expects memcheck:1 to find (docs/LEAKS.md,
 * "memcheck"). Its "kernels" are the mock's test hooks, which write and
 * read device memory as a kernel would, with no driver call the library
 * could see. Built with -g -O0 so that the frames name these lines.
 *
 *   e2e_memcheck over N     a 1000-byte block written N bytes past its end,
 *                           then freed
 *   e2e_memcheck slot N     the same through the allocator slot
 *                           (cudalloc_stream_malloc/free on a stream)
 *   e2e_memcheck stale      through the slot: 8 MiB blocks written whole and
 *                           freed, then blocks of other sizes over their
 *                           bytes, written whole and freed (mid_byte= a freed
 *                           block's middle, head_byte= its first byte,
 *                           zones= red zones that held 0xFF, of blocks=);
 *                           the stream destroyed last
 *   e2e_memcheck live       written 1 byte past its end, never freed
 *   e2e_memcheck uaf OFF    a 1000-byte block written at offset OFF after
 *                           its free
 *   e2e_memcheck bigfree OFF  the same for a 1 MiB block
 *   e2e_memcheck fills      what a block reads when handed out, past its
 *                           end, once freed, and whether the next block of
 *                           its size takes its place (first_byte=,
 *                           all_fill=, zone_byte=, freed_byte=, reused=)
 *   e2e_memcheck churn      4 MiB blocks allocated and freed 100 times: the
 *                           first allocation that got a place seen before
 *                           (first_again=, 0: none) and the places seen
 *                           (distinct=)
 *   e2e_memcheck double     a block freed twice (second_free=CODE)
 *   e2e_memcheck clean      blocks used within their bounds, all freed
 *   e2e_memcheck shutdown   a block written 1 byte past its end and freed; the
 *                           driver takes itself down at exit, from a handler
 *                           registered before the first device call
 *   e2e_memcheck reset      two blocks written 1 byte past their end, one
 *                           freed, one live, then the primary context reset
 *                           (as the static runtime releases it at exit)
 *   e2e_memcheck batch N    N blocks of 1000 bytes and N of 64 KiB, the
 *                           first of each written past its end (1 and 2
 *                           bytes), all freed: one batch leaves the
 *                           quarantine at exit; after the library's exit
 *                           work, what the mock was asked (launches=,
 *                           copies=, module_loads=)
 *
 * stdout: key=value lines: preloaded=0|1, alloc_line=, free_line= (the
 * lines of the cuMemAlloc and cuMemFree calls), addr=0x..., done=MODE.
 */
#include <cuda.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mockcuda.h"

#define E2E_PROG "e2e_memcheck"
#include "e2e_direct.h"

#define NOINLINE __attribute__((noinline))
#define BLOCK 1000


/* A kernel's store of n bytes of `v` at p. */
static void kernel_store(CUdeviceptr p, unsigned char v, size_t n) {
  unsigned char buf[4096];
  memset(buf, v, n);
  if (mockcuda_kernel_write((uint64_t)p, buf, n) != 0)
    fail("mockcuda_kernel_write", -1);
}

NOINLINE static CUdeviceptr make_block(size_t size) {
  CUdeviceptr p = 0;
  CUresult rc = cuMemAlloc(&p, size); printf("alloc_line=%d\n", __LINE__);
  if (rc != CUDA_SUCCESS)
    fail("cuMemAlloc", (int)rc);
  printf("addr=0x%llx\n", (unsigned long long)p);
  return p;
}

NOINLINE static void drop_block(CUdeviceptr p) {
  CUresult rc = cuMemFree(p); printf("free_line=%d\n", __LINE__);
  if (rc != CUDA_SUCCESS)
    fail("cuMemFree", (int)rc);
}

static int mode_over(size_t n) {
  CUdeviceptr p = make_block(BLOCK);
  kernel_store(p + BLOCK, 0x11, n);
  drop_block(p);
  return 0;
}

/* The allocator slot, as PyTorch calls it, from the preloaded library. */
typedef struct slot_api {
  void *(*alloc)(size_t, int, CUstream);
  void (*release)(void *, size_t, int, CUstream);
} slot_api;

static slot_api slot_open(void) {
  slot_api slot = {
      .alloc = (void *(*)(size_t, int, CUstream))dlsym(RTLD_DEFAULT,
                                                       "cudalloc_stream_malloc"),
      .release = (void (*)(void *, size_t, int, CUstream))dlsym(
          RTLD_DEFAULT, "cudalloc_stream_free")};
  if (!slot.alloc || !slot.release)
    fail("dlsym(cudalloc_stream_malloc)", -1);
  return slot;
}

/* The allocator slot on a stream of the program's. */
static int mode_slot(size_t n) {
  slot_api slot = slot_open();
  CUstream s = NULL;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  void *p = slot.alloc(BLOCK, 0, s); printf("alloc_line=%d\n", __LINE__);
  kernel_store((CUdeviceptr)(uintptr_t)p + BLOCK, 0x11, n);
  slot.release(p, BLOCK, 0, s); printf("free_line=%d\n", __LINE__);
  CHECK(cuStreamSynchronize(s));
  return 0;
}

/* A kernel's store of n bytes of `v` from p on, of any length. */
static void kernel_fill(CUdeviceptr p, unsigned char v, size_t n) {
  for (size_t at = 0; at < n; at += 4096)
    kernel_store(p + at, v, n - at < 4096 ? n - at : 4096);
}

static unsigned char read_byte(CUdeviceptr p);

/* Freed blocks set to the fill only where memcheck checks them: the blocks
 * later carved out of the bytes between still start with red zones of
 * 0xFF, and a program that writes only inside its blocks gets no finding. */
static int mode_stale(void) {
  slot_api slot = slot_open();
  CUstream s = NULL;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  enum { BIG = 8 << 20, N = 40, SMALL = 64 };
  CUdeviceptr first = 0;
  for (int i = 0; i < N; i++) { /* past the quarantine's 256 MiB */
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)slot.alloc(BIG, 0, s);
    kernel_fill(p, 0x44, BIG);
    slot.release((void *)(uintptr_t)p, BIG, 0, s);
    first = first ? first : p;
  }
  CHECK(cuStreamSynchronize(s));
  printf("mid_byte=%d\nhead_byte=%d\n", read_byte(first + BIG / 2),
         read_byte(first));
  int zones = 0;
  void *q[SMALL];
  for (int i = 0; i < SMALL; i++) {
    size_t size = (1u << 20) + 4096 * (size_t)(i + 1);
    q[i] = slot.alloc(size, 0, s);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)q[i];
    zones += read_byte(p + size) == 0xFF && read_byte(p + size + 511) == 0xFF;
    kernel_fill(p, 0x55, size);
  }
  for (int i = 0; i < SMALL; i++)
    slot.release(q[i], (1u << 20) + 4096 * (size_t)(i + 1), 0, s);
  CHECK(cuStreamSynchronize(s));
  printf("zones=%d\nblocks=%d\n", zones, SMALL);
  /* Blocks freed on it still wait in the quarantine as it goes. */
  CHECK(cuStreamDestroy(s));
  return 0;
}

static int mode_live(void) {
  CUdeviceptr p = make_block(BLOCK);
  kernel_store(p + BLOCK, 0x11, 1);
  return 0;
}

static int mode_after_free(size_t size, size_t off) {
  CUdeviceptr p = make_block(size);
  drop_block(p);
  kernel_store(p + off, 0x22, 4);
  return 0;
}

static unsigned char read_byte(CUdeviceptr p) {
  unsigned char b = 0;
  if (mockcuda_kernel_read((uint64_t)p, &b, 1) != 0)
    fail("mockcuda_kernel_read", -1);
  return b;
}

static int mode_fills(void) {
  unsigned char buf[BLOCK];
  CUdeviceptr p = make_block(BLOCK);
  if (mockcuda_kernel_read((uint64_t)p, buf, BLOCK) != 0)
    fail("mockcuda_kernel_read", -1);
  int all = 1;
  for (int i = 0; i < BLOCK; i++)
    all &= buf[i] == buf[0];
  printf("first_byte=%d\nall_fill=%d\nzone_byte=%d\n", buf[0], all,
         read_byte(p + BLOCK));
  kernel_store(p, 0x33, 16);
  drop_block(p);
  printf("freed_byte=%d\n", read_byte(p));
  CUdeviceptr q = make_block(BLOCK);
  printf("reused=%d\n", q == p);
  drop_block(q);
  return 0;
}

static int mode_churn(void) {
  CUdeviceptr seen[100];
  int distinct = 0, first_again = 0;
  for (int i = 0; i < 100; i++) {
    CUdeviceptr p = 0;
    CHECK(cuMemAlloc(&p, 4u << 20));
    int known = 0;
    for (int j = 0; j < distinct; j++)
      known |= seen[j] == p;
    if (!known)
      seen[distinct++] = p;
    else if (first_again == 0)
      first_again = i;
    CHECK(cuMemFree(p));
  }
  printf("first_again=%d\ndistinct=%d\n", first_again, distinct);
  return 0;
}

static int mode_double(void) {
  CUdeviceptr p = make_block(BLOCK);
  drop_block(p);
  printf("second_free=%d\n", (int)cuMemFree(p));
  return 0;
}

static int mode_clean(void) {
  for (int i = 0; i < 20; i++) {
    CUdeviceptr p = make_block(BLOCK + 24 * (size_t)i);
    kernel_store(p, 0x44, BLOCK);
    drop_block(p);
  }
  return 0;
}

static int mode_reset(void) {
  CUdeviceptr freed = make_block(BLOCK), live = make_block(BLOCK);
  kernel_store(freed + BLOCK, 0x11, 1);
  kernel_store(live + BLOCK, 0x11, 1);
  drop_block(freed);
  CHECK(cuDevicePrimaryCtxReset(0));
  return 0;
}

/* Registered before the library's own exit handler, so it runs after. */
static void print_driver_calls(void) {
  mockcuda_counters c;
  mockcuda_get_counters(&c);
  printf("launches=%llu\ncopies=%llu\nmodule_loads=%llu\n",
         (unsigned long long)c.launch_kernel, (unsigned long long)c.memcpy,
         (unsigned long long)c.module_load);
  fflush(stdout);
}

static int mode_batch(size_t n) {
  CUdeviceptr small[32], big[32];
  if (n == 0 || n > 32)
    fail("batch N: 1 to 32", -1);
  for (size_t i = 0; i < n; i++) {
    small[i] = make_block(BLOCK);
    big[i] = make_block(64u << 10);
  }
  kernel_store(small[0] + BLOCK, 0x11, 1);
  kernel_store(big[0] + (64u << 10), 0x11, 2);
  for (size_t i = 0; i < n; i++) {
    drop_block(small[i]);
    drop_block(big[i]);
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  size_t arg = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;
  printf("preloaded=%d\n", dlsym(RTLD_DEFAULT, "cudalloc_version") != NULL);
  if (!strcmp(mode, "shutdown"))
    atexit(mockcuda_shutdown);
  if (!strcmp(mode, "batch"))
    atexit(print_driver_calls);
  setup();
  int rc = 2;
  if (!strcmp(mode, "over") || !strcmp(mode, "shutdown"))
    rc = mode_over(arg ? arg : 1);
  else if (!strcmp(mode, "slot"))
    rc = mode_slot(arg);
  else if (!strcmp(mode, "stale"))
    rc = mode_stale();
  else if (!strcmp(mode, "live"))
    rc = mode_live();
  else if (!strcmp(mode, "uaf"))
    rc = mode_after_free(BLOCK, arg);
  else if (!strcmp(mode, "bigfree"))
    rc = mode_after_free(1u << 20, arg);
  else if (!strcmp(mode, "fills"))
    rc = mode_fills();
  else if (!strcmp(mode, "churn"))
    rc = mode_churn();
  else if (!strcmp(mode, "double"))
    rc = mode_double();
  else if (!strcmp(mode, "clean"))
    rc = mode_clean();
  else if (!strcmp(mode, "reset"))
    rc = mode_reset();
  else if (!strcmp(mode, "batch"))
    rc = mode_batch(arg);
  else
    fprintf(stderr, "usage: e2e_memcheck over N|slot N|stale|live|uaf OFF|"
                    "bigfree OFF|fills|churn|double|clean|reset|shutdown|"
                    "batch N\n");
  if (rc == 0)
    printf("done=%s\n", mode);
  return rc;
}
