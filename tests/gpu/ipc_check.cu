/*
 * ipc_check: a pooled block must look like its own cudaMalloc to every
 * question a CUDA C program asks about it (scripts/gpu-check.sh runs it
 * without and with LD_PRELOAD=libcudalloc.so; the same assertions hold):
 *
 *  ipc       Blocks A and B (64 KiB, in one segment under the pool, B not
 *            at its start), C (3 MiB, at a segment's start) and D (1000 B)
 *            are filled with 0xAA, 0xBB, 0xCC, 0xDD and exported with
 *            cudaIpcGetMemHandle; a second process (this program again)
 *            opens each, checks every byte and the address range, and
 *            writes its last byte (which the next importer and the
 *            exporter must see). The importer runs once without
 *            LD_PRELOAD, then once with it as inherited. While the second
 *            importer holds B open, the exporter frees B and fills 64 new
 *            64 KiB blocks with 0x11: under the library the importer must
 *            still read 0xBB (without it the driver may hand the bytes out
 *            again: measured, and undefined behaviour by its docs).
 *  pools     A stream-ordered pool (cudaMallocFromPoolAsync) exported with
 *            cudaMemPoolExportPointer opens in the importer with the
 *            right bytes: passed through, untouched.
 *  queries   cudaPointerGetAttributes, and the driver's
 *            cuMemGetAddressRange and cuPointerGetAttribute (reached
 *            through cudaGetDriverEntryPoint, as programs do) on a 1000 B
 *            block after a 4 KiB one: its own base and size from any
 *            pointer inside, none past its end, its own BUFFER_ID.
 *  free      400 x 1 MiB allocated, every other one freed: cudaMemGetInfo's
 *            free, less the margin the driver itself needs (margin_mb; 0,
 *            the default, searches for it: run so without the library,
 *            then pass what it found to the run with it), is allocated.
 *
 * Usage: ipc_check <plain|any> [margin_mb]   (the pool's share of the
 * allocations is not the point here: "any" under the library)
 * Last line: "ipc_check: PASS" or "ipc_check: FAIL: <why>".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <cuda_runtime.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_check.h"

extern char **environ;

#define KiB (1ull << 10)
#define MiB (1ull << 20)

enum { NSHARED = 4 };
static const size_t shared_size[NSHARED] = {64 * KiB, 64 * KiB, 3 * MiB, 1000};
static const unsigned char shared_byte[NSHARED] = {0xAA, 0xBB, 0xCC, 0xDD};

typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
static range_fn get_range;
static attr_fn get_attr;

/* The driver functions as a program gets them: through the runtime's
 * cudaGetDriverEntryPoint, i.e. cuGetProcAddress. */
static void find_driver_functions(void) {
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&get_range,
                                      12000, cudaEnableDefault, &q));
  CK(cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", (void **)&get_attr,
                                      12000, cudaEnableDefault, &q));
  if (!get_range || !get_attr)
    gc_fail("no driver entry points for the range queries");
}

static void expect_range(const char *what, CUdeviceptr p, CUdeviceptr base,
                         size_t size) {
  CUdeviceptr b = 0;
  size_t s = 0;
  CUresult r = get_range(&b, &s, p);
  if (r != CUDA_SUCCESS || b != base || s != size)
    gc_fail("%s: address range of %#llx is (%#llx, %zu) [%d], expected "
            "(%#llx, %zu)", what, (unsigned long long)p, (unsigned long long)b,
            s, (int)r, (unsigned long long)base, size);
}

static uint64_t attr_of(CUpointer_attribute a, CUdeviceptr p) {
  uint64_t v = 0;
  CUresult r = get_attr(&v, a, p);
  if (r != CUDA_SUCCESS)
    gc_fail("cuPointerGetAttribute(%d, %#llx) = %d", (int)a,
            (unsigned long long)p, (int)r);
  return v;
}

/* ---- The importer --------------------------------------------------------- */

typedef struct msg {
  cudaIpcMemHandle_t h[NSHARED];
  cudaMemPoolPtrExportData pool_ptr;
  size_t pool_size;
} msg;

/* Every byte of the import is `byte`. */
static void check_bytes(const char *what, const void *dev, size_t n,
                        unsigned char byte) {
  unsigned char *host = (unsigned char *)malloc(n);
  CK(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++)
    if (host[i] != byte)
      gc_fail("%s: byte %zu of %zu is %#x, expected %#x", what, i, n, host[i],
              byte);
  free(host);
}

static void import_pool_pointer(int pool_fd, const msg *m) {
  cudaMemPool_t pool;
  CK(cudaMemPoolImportFromShareableHandle(
      &pool, (void *)(uintptr_t)pool_fd, cudaMemHandleTypePosixFileDescriptor, 0));
  void *p = NULL;
  CK(cudaMemPoolImportPointer(&p, pool, (cudaMemPoolPtrExportData *)&m->pool_ptr));
  check_bytes("stream-ordered pool import", p, m->pool_size, 0x77);
  CK(cudaFree(p));
  CK(cudaMemPoolDestroy(pool));
}

/* hold: 0, open and close; 1, also hold B open while the exporter frees it;
 * 2, and its bytes must not change meanwhile (the exporter is pooled). */
static int importer(int in, int out, int hold, int pool_fd) {
  gc_name = "ipc_check importer";
  msg m;
  if (read(in, &m, sizeof m) != (ssize_t)sizeof m)
    gc_fail("no handles");
  CK(cudaSetDevice(0));
  find_driver_functions();
  void *p[NSHARED];
  for (int i = 0; i < NSHARED; i++) {
    CK(cudaIpcOpenMemHandle(&p[i], m.h[i], cudaIpcMemLazyEnablePeerAccess));
    check_bytes("import", p[i], shared_size[i] - 1, shared_byte[i]);
    /* The last byte: the first importer writes it; the second sees that. */
    check_bytes("the last byte", (char *)p[i] + shared_size[i] - 1, 1,
                hold ? 0x5A : shared_byte[i]);
    expect_range("import", (CUdeviceptr)p[i], (CUdeviceptr)p[i], shared_size[i]);
    CK(cudaMemset((char *)p[i] + shared_size[i] - 1, 0x5A, 1));
  }
  CK(cudaDeviceSynchronize());
  if (pool_fd >= 0)
    import_pool_pointer(pool_fd, &m);
  if (hold) { /* the exporter frees B and reuses memory meanwhile */
    char go = 1;
    if (write(out, &go, 1) != 1 || read(in, &go, 1) != 1)
      gc_fail("lost the exporter");
    unsigned char byte = 0;
    CK(cudaMemcpy(&byte, p[1], 1, cudaMemcpyDeviceToHost));
    printf("ipc_check importer: B, freed by the exporter, reads %#x\n", byte);
    /* Without the library the driver may hand B's bytes out again (a
     * documented undefined behaviour; seen on the H200 for a 64 KiB
     * allocation); the pool must not. */
    if (hold > 1)
      check_bytes("B after the exporter freed it", p[1], shared_size[1] - 1, 0xBB);
  }
  for (int i = 0; i < NSHARED; i++)
    CK(cudaIpcCloseMemHandle(p[i]));
  printf("ipc_check importer (%s): PASS\n", getenv("LD_PRELOAD") ? "preloaded" : "plain");
  return 0;
}

/* ---- The exporter --------------------------------------------------------- */

static char **env_without_preload(int plain) {
  size_t n = 0;
  while (environ[n])
    n++;
  char **env = (char **)calloc(n + 1, sizeof(*env));
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (!plain || strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
      env[k++] = environ[i];
  return env;
}

static pid_t start_importer(const char *self, int plain, int hold, int pool_fd,
                            int *to, int *from) {
  int a[2], b[2];
  if (pipe(a) || pipe(b))
    gc_fail("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    char in[16], out[16], fd[16], h[4];
    snprintf(in, sizeof in, "%d", a[0]);
    snprintf(out, sizeof out, "%d", b[1]);
    snprintf(fd, sizeof fd, "%d", pool_fd);
    snprintf(h, sizeof h, "%d", hold);
    char *argv[] = {(char *)self, (char *)"import", in, out, h, fd, NULL};
    execve(self, argv, env_without_preload(plain));
    _exit(127);
  }
  close(a[0]);
  close(b[1]);
  *to = a[1];
  *from = b[0];
  return pid;
}

/* A stream-ordered pool that can be shared, one allocation in it (*out),
 * exported. */
static int export_pool_pointer(msg *m, void **out) {
  cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t pool;
  CK(cudaMemPoolCreate(&pool, &props));
  int fd = -1;
  CK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  fcntl(fd, F_SETFD, 0); /* the importer inherits it across exec */
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *p = NULL;
  m->pool_size = 256 * KiB;
  CK(cudaMallocFromPoolAsync(&p, m->pool_size, pool, s));
  CK(cudaMemsetAsync(p, 0x77, m->pool_size, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemPoolExportPointer(&m->pool_ptr, p));
  *out = p;
  return fd;
}

static void *reused[64];

static void run_importers(const char *self, msg *m, void *b_block, int pool_fd) {
  for (int plain = 1; plain >= 0; plain--) { /* the second holds B */
    int to = -1, from = -1, status = 0;
    int pooled = dlsym(RTLD_DEFAULT, "cudalloc_version") != NULL;
    pid_t pid = start_importer(self, plain, plain ? 0 : 1 + pooled,
                               plain ? pool_fd : -1, &to, &from);
    if (write(to, m, sizeof *m) != (ssize_t)sizeof *m)
      gc_fail("cannot send the handles");
    if (!plain) {
      char go = 0;
      if (read(from, &go, 1) != 1)
        gc_fail("the importer did not open the handles");
      CK(cudaFree(b_block));
      for (int i = 0; i < 64; i++) {
        CK(cudaMalloc(&reused[i], 64 * KiB));
        CK(cudaMemset(reused[i], 0x11, 64 * KiB));
      }
      CK(cudaDeviceSynchronize());
      if (write(to, &go, 1) != 1)
        gc_fail("cannot wake the importer");
    }
    close(to);
    close(from);
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
      gc_fail("the %s importer failed (status %#x)", plain ? "plain" : "preloaded",
              status);
    printf("ipc_check: the %s importer read every exported byte\n",
           plain ? "plain" : "preloaded");
  }
}

static void check_ipc(const char *self) {
  msg m;
  void *p[NSHARED];
  for (int i = 0; i < NSHARED; i++) {
    CK(cudaMalloc(&p[i], shared_size[i]));
    CK(cudaMemset(p[i], shared_byte[i], shared_size[i]));
    CK(cudaIpcGetMemHandle(&m.h[i], p[i]));
  }
  CK(cudaDeviceSynchronize());
  void *pooled_async = NULL;
  int pool_fd = export_pool_pointer(&m, &pooled_async);
  run_importers(self, &m, p[1], pool_fd);
  /* The plain importer wrote the last byte of each: shared memory. */
  for (int i = 0; i < NSHARED; i++) {
    if (i == 1)
      continue; /* freed */
    unsigned char last = 0;
    CK(cudaMemcpy(&last, (char *)p[i] + shared_size[i] - 1, 1, cudaMemcpyDeviceToHost));
    if (last != 0x5A)
      gc_fail("the importer's write to block %d is not seen (%#x)", i, last);
  }
  for (int i = 0; i < 64; i++)
    CK(cudaFree(reused[i]));
  CK(cudaFree(pooled_async));
  close(pool_fd);
  for (int i = 0; i < NSHARED; i++)
    if (i != 1)
      CK(cudaFree(p[i]));
  printf("ipc_check: ipc ok (blocks at and after a segment's start, importers "
         "with and without the library, a freed block not handed out again, "
         "a stream-ordered pool pointer)\n");
}

static void check_queries(void) {
  void *first, *p, *q;
  CK(cudaMalloc(&first, 4096));
  CK(cudaMalloc(&p, 1000));
  CK(cudaMalloc(&q, 1000));
  CUdeviceptr d = (CUdeviceptr)p;
  expect_range("a 1000 B block", d + 500, d, 1000);
  CUdeviceptr b = 0;
  size_t s = 0;
  if (get_range(&b, &s, d + 1000) != CUDA_ERROR_NOT_FOUND)
    gc_fail("an address range past a block's requested end is found");
  if (attr_of(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 10) != d ||
      attr_of(CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 10) != 1000)
    gc_fail("RANGE_START_ADDR / RANGE_SIZE do not describe the block");
  uint64_t ids[3] = {attr_of(CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)first),
                     attr_of(CU_POINTER_ATTRIBUTE_BUFFER_ID, d),
                     attr_of(CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)q)};
  if (ids[0] == ids[1] || ids[1] == ids[2] || ids[0] == ids[2])
    gc_fail("three blocks share a BUFFER_ID");
  cudaPointerAttributes pa;
  CK(cudaPointerGetAttributes(&pa, (char *)p + 999));
  if (pa.type != cudaMemoryTypeDevice || pa.device != 0 ||
      pa.devicePointer != (char *)p + 999)
    gc_fail("cudaPointerGetAttributes: type %d device %d pointer %p", (int)pa.type,
            pa.device, pa.devicePointer);
  CK(cudaFree(first));
  CK(cudaFree(p));
  CK(cudaFree(q));
  printf("ipc_check: queries ok (range, attributes, buffer ids)\n");
}

/* What cudaMemGetInfo calls free, less `margin`, allocates in one piece;
 * margin 0: the smallest power-of-two margin from 2 MiB up that the driver
 * needs, found (run so without the library, to learn it). */
static void check_free_memory(size_t margin) {
  void *blocks[400];
  for (int i = 0; i < 400; i++)
    CK(cudaMalloc(&blocks[i], MiB));
  for (int i = 0; i < 400; i += 2)
    CK(cudaFree(blocks[i]));
  size_t free_b = 0, total = 0;
  CK(cudaMemGetInfo(&free_b, &total));
  void *big = NULL;
  size_t m = margin ? margin : 2 * MiB;
  cudaError_t e = cudaMalloc(&big, free_b - m);
  while (!margin && e != cudaSuccess && m < (1ull << 30)) {
    cudaGetLastError();
    m *= 2;
    e = cudaMalloc(&big, free_b - m);
  }
  if (e != cudaSuccess)
    gc_fail("cudaMemGetInfo says %zu free of %zu, but %zu (less %zu MiB) cannot "
            "be allocated: %s", free_b, total, free_b - m, m >> 20,
            cudaGetErrorString(e));
  CK(cudaFree(big));
  for (int i = 1; i < 400; i += 2)
    CK(cudaFree(blocks[i]));
  printf("ipc_check: free margin %zu MiB (%zu of %zu bytes free, %zu allocated)\n",
         m >> 20, free_b, total, free_b - m);
}

int main(int argc, char **argv) {
  if (argc == 6 && strcmp(argv[1], "import") == 0)
    return importer(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  gc_name = "ipc_check";
  setvbuf(stdout, NULL, _IOLBF, 0);
  int expect = gc_parse_expect(argc > 1 ? argv[1] : NULL);
  size_t margin = (argc > 2 ? strtoul(argv[2], NULL, 10) : 0) * MiB;
  CK(cudaSetDevice(0));
  find_driver_functions();
  check_queries();
  check_ipc(argv[0]);
  check_free_memory(margin);
  gc_check_stats(expect, 0, 0, 0);
  printf("ipc_check: PASS\n");
  return 0;
}
