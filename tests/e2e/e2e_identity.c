/*
 * e2e_identity: a pooled block must look like its own driver allocation to
 * every query a program can make, against the mock driver (whose answers
 * are the H200's, tests/mockcuda/driver_facts.txt). Run plainly and with
 * libcudalloc.so preloaded; the same assertions hold both ways:
 *
 *  1. Ranges and attributes: a 1000 B allocation made after another small
 *     one (so that under the pool it lies inside a segment) has the address
 *     range (itself, 1000) from any pointer inside it, none past its
 *     requested end, a BUFFER_ID of its own that a new allocation at its
 *     address does not inherit, its own SYNC_MEMOPS, and the plural query's
 *     "no allocation" answers once freed.
 *  2. Free memory: with 400 x 1 MiB allocated and every other one freed,
 *     what cuMemGetInfo calls free, less 2 MiB, can be allocated; asked
 *     with one of its two pointers NULL, it says the same.
 *  3. CUDA IPC: two 64 KiB allocations A and B (one segment under the pool)
 *     and a 3 MiB one, filled with 0xAA, 0xBB, 0xCC and exported; a second
 *     process opens each handle and finds exactly its bytes and its range,
 *     once with LD_PRELOAD inherited and once without it (an importer not
 *     under the library). While the importer holds B open, B is freed and
 *     64 new 64 KiB allocations are filled with 0x11: the importer still
 *     reads 0xBB (the pool must not hand B's bytes out again).
 * Last line: PASS or FAIL; exit status 1 on failure.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

#define KiB (1ull << 10)
#define MiB (1ull << 20)

#define E2E_NAME "e2e_identity"
#include "e2e_check.h"

extern char **environ;

static uint64_t attr(CUpointer_attribute a, CUdeviceptr p) {
  uint64_t v = 0;
  CHECK(cuPointerGetAttribute(&v, a, p));
  return v;
}

static void expect_range(CUdeviceptr p, CUdeviceptr base, size_t size) {
  CUdeviceptr b = 0;
  size_t s = 0;
  CHECK(cuMemGetAddressRange_v2(&b, &s, p));
  if (b != base || s != size)
    FAIL("address range of %#llx is (%#llx, %zu), expected (%#llx, %zu)",
         (unsigned long long)p, (unsigned long long)b, s,
         (unsigned long long)base, size);
}

static void expect_rc(const char *what, CUresult got, CUresult want) {
  if (got != want)
    FAIL("%s = %d, expected %d", what, (int)got, (int)want);
}

static void check_attributes(void) {
  CUdeviceptr first = 0, p = 0, q = 0, q2 = 0;
  CHECK(cuMemAlloc_v2(&first, 4096));
  CHECK(cuMemAlloc_v2(&p, 1000));
  CHECK(cuMemAlloc_v2(&q, 1000));
  expect_range(p, p, 1000);
  expect_range(p + 999, p, 1000);
  CUdeviceptr b = 0;
  size_t s = 0;
  expect_rc("address range past the requested end",
            cuMemGetAddressRange_v2(&b, &s, p + 1000), CUDA_ERROR_NOT_FOUND);
  if (attr(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 10) != p ||
      attr(CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 10) != 1000)
    FAIL("RANGE_START_ADDR/RANGE_SIZE of p+10 do not describe p");
  uint64_t id_first = attr(CU_POINTER_ATTRIBUTE_BUFFER_ID, first);
  uint64_t id_p = attr(CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
  uint64_t id_q = attr(CU_POINTER_ATTRIBUTE_BUFFER_ID, q);
  if (id_p == id_first || id_p == id_q || id_q == id_first)
    FAIL("BUFFER_IDs %#llx %#llx %#llx are not distinct",
         (unsigned long long)id_first, (unsigned long long)id_p,
         (unsigned long long)id_q);
  if (attr(CU_POINTER_ATTRIBUTE_BUFFER_ID, p + 999) != id_p)
    FAIL("BUFFER_ID differs inside one allocation");
  if (attr(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) != 1)
    FAIL("IS_LEGACY_CUDA_IPC_CAPABLE of a cuMemAlloc block is not 1");
  int one = 1, zero = 0;
  CHECK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  if (attr(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) != 1 ||
      attr(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, q) != 0)
    FAIL("SYNC_MEMOPS set on p is not p's alone");
  CHECK(cuPointerSetAttribute(&zero, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  if (attr(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p) != 0)
    FAIL("SYNC_MEMOPS of p stays set");
  CHECK(cuMemFree_v2(q));
  /* A freed pointer: the plural query's "not a CUDA pointer" answers. */
  CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_CONTEXT,
                               CU_POINTER_ATTRIBUTE_HOST_POINTER,
                               CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  uint64_t ctx = 1, host = 0;
  int ordinal = 0;
  void *data[3] = {&ctx, &host, &ordinal};
  CHECK(cuPointerGetAttributes(3, at, data, q));
  if (ctx != 0 || host != q || ordinal != -2)
    FAIL("attributes of a freed pointer: context %#llx, host %#llx, device %d",
         (unsigned long long)ctx, (unsigned long long)host, ordinal);
  uint64_t v = 0;
  expect_rc("BUFFER_ID of a freed pointer",
            cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_BUFFER_ID, q),
            CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemAlloc_v2(&q2, 1000));
  if (attr(CU_POINTER_ATTRIBUTE_BUFFER_ID, q2) == id_q)
    FAIL("a new allocation at %#llx inherits the freed one's BUFFER_ID",
         (unsigned long long)q2);
  CHECK(cuMemFree_v2(first));
  CHECK(cuMemFree_v2(p));
  CHECK(cuMemFree_v2(q2));
}

static void check_free_memory(void) {
  CUdeviceptr blocks[400];
  for (int i = 0; i < 400; i++)
    CHECK(cuMemAlloc_v2(&blocks[i], MiB));
  for (int i = 0; i < 400; i += 2)
    CHECK(cuMemFree_v2(blocks[i]));
  size_t free_bytes = 0, total = 0, only_free = 0, only_total = 0;
  CHECK(cuMemGetInfo_v2(&free_bytes, &total));
  CHECK(cuMemGetInfo_v2(&only_free, NULL)); /* either may be NULL */
  CHECK(cuMemGetInfo_v2(NULL, &only_total));
  if (only_free != free_bytes || only_total != total)
    FAIL("cuMemGetInfo with one NULL argument says %zu / %zu, with both %zu / %zu",
         only_free, only_total, free_bytes, total);
  CUdeviceptr big = 0;
  CUresult rc = cuMemAlloc_v2(&big, free_bytes - 2 * MiB);
  if (rc != CUDA_SUCCESS)
    FAIL("cuMemGetInfo says %zu bytes free of %zu, but %zu cannot be "
         "allocated (%d)", free_bytes, total, free_bytes - (size_t)(2 * MiB),
         (int)rc);
  else
    CHECK(cuMemFree_v2(big));
  for (int i = 1; i < 400; i += 2)
    CHECK(cuMemFree_v2(blocks[i]));
}

/* ---- IPC ---------------------------------------------------------------- */

enum { NSHARED = 3 };
static const size_t shared_size[NSHARED] = {64 * KiB, 64 * KiB, 3 * MiB};
static const unsigned char shared_byte[NSHARED] = {0xAA, 0xBB, 0xCC};

/* In the importer: the handle opens to exactly its allocation's bytes. */
static void import_one(int i, CUipcMemHandle h, CUdeviceptr *out) {
  CUdeviceptr p = 0, again = 0;
  CHECK(cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  unsigned char first = 0, last = 0;
  CHECK(cuMemcpyDtoH_v2(&first, p, 1));
  CHECK(cuMemcpyDtoH_v2(&last, p + shared_size[i] - 1, 1));
  if (first != shared_byte[i] || last != shared_byte[i])
    FAIL("import %d reads %#x..%#x, expected %#x", i, first, last,
         shared_byte[i]);
  expect_range(p, p, shared_size[i]);
  CHECK(cuIpcOpenMemHandle_v2(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  if (again != p)
    FAIL("import %d opened twice gives two pointers", i);
  CHECK(cuIpcCloseMemHandle(again));
  *out = p;
}

static int importer(int in, int out, int hold) {
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK(cuCtxSetCurrent(ctx));
  CUipcMemHandle h[NSHARED];
  if (read(in, h, sizeof h) != (ssize_t)sizeof h)
    return 2;
  CUdeviceptr p[NSHARED];
  for (int i = 0; i < NSHARED; i++)
    import_one(i, h[i], &p[i]);
  if (hold) { /* the exporter frees B and reuses its memory meanwhile */
    char go = 1;
    if (write(out, &go, 1) != 1 || read(in, &go, 1) != 1)
      return 2;
    unsigned char byte = 0;
    CHECK(cuMemcpyDtoH_v2(&byte, p[1] + 100, 1));
    if (byte != 0xBB)
      FAIL("after the exporter freed B, the importer reads %#x: its bytes "
           "were handed out again", byte);
  }
  for (int i = 0; i < NSHARED; i++)
    CHECK(cuIpcCloseMemHandle(p[i]));
  printf("%s " E2E_NAME " importer (%s)\n", failures ? "FAIL" : "PASS",
         getenv("LD_PRELOAD") ? "preloaded" : "plain");
  return failures ? 1 : 0;
}

/* The importer's environment: ours, without LD_PRELOAD when `plain`. */
static char **importer_env(int plain) {
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = calloc(n + 1, sizeof(*env));
  size_t k = 0;
  for (size_t i = 0; env && i < n; i++)
    if (!plain || strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
      env[k++] = environ[i];
  return env;
}

static pid_t start_importer(const char *self, int plain, int hold, int *to,
                            int *from) {
  int a[2], b[2];
  if (pipe(a) || pipe(b))
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    char in[16], out[16];
    snprintf(in, sizeof in, "%d", a[0]);
    snprintf(out, sizeof out, "%d", b[1]);
    char *argv[] = {(char *)self, "import", in, out, hold ? "hold" : "",
                    NULL};
    execve(self, argv, importer_env(plain));
    _exit(127);
  }
  close(a[0]);
  close(b[1]);
  *to = a[1];
  *from = b[0];
  return pid;
}

static void wait_importer(pid_t pid, const char *how) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    FAIL("the %s importer failed (status %#x)", how, status);
}

/* Frees B and makes its memory likely to be reused: 64 blocks of its size
 * filled with another byte. */
static void free_b_and_reuse(CUdeviceptr b, CUdeviceptr reuse[64]) {
  CHECK(cuMemFree_v2(b));
  for (int i = 0; i < 64; i++) {
    CHECK(cuMemAlloc_v2(&reuse[i], 64 * KiB));
    CHECK(cuMemsetD8_v2(reuse[i], 0x11, 64 * KiB));
  }
}

static void check_ipc(const char *self) {
  CUdeviceptr p[NSHARED], reuse[64];
  CUipcMemHandle h[NSHARED];
  for (int i = 0; i < NSHARED; i++) {
    CHECK(cuMemAlloc_v2(&p[i], shared_size[i]));
    CHECK(cuMemsetD8_v2(p[i], shared_byte[i], shared_size[i]));
    CHECK(cuIpcGetMemHandle(&h[i], p[i]));
  }
  /* The plain importer first: B is freed while the second holds it. */
  for (int plain = 1; plain >= 0; plain--) {
    int to = -1, from = -1;
    pid_t pid = start_importer(self, plain, !plain, &to, &from);
    if (write(to, h, sizeof h) != (ssize_t)sizeof h)
      FAIL("cannot send the handles");
    if (!plain) {
      char go = 0;
      if (read(from, &go, 1) != 1)
        FAIL("the importer did not open the handles");
      free_b_and_reuse(p[1], reuse);
      if (write(to, &go, 1) != 1)
        FAIL("cannot wake the importer");
    }
    close(to);
    close(from);
    wait_importer(pid, plain ? "plain" : "preloaded");
  }
  for (int i = 0; i < 64; i++)
    CHECK(cuMemFree_v2(reuse[i]));
  CHECK(cuMemFree_v2(p[0]));
  CHECK(cuMemFree_v2(p[2]));
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "import") == 0)
    return importer(atoi(argv[2]), atoi(argv[3]), argv[4][0] != '\0');
  bool preloaded = e2e_preloaded();
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK(cuCtxSetCurrent(ctx));
  check_attributes();
  check_free_memory();
  check_ipc(argv[0]);
  printf("%s " E2E_NAME " (%s, %d failure(s))\n", failures ? "FAIL" : "PASS",
         preloaded ? "preloaded" : "plain", failures);
  return failures ? 1 : 0;
}
