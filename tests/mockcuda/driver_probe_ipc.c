/*
 * driver_probe's questions about what describes an allocation: pointer
 * attributes, address ranges, CUDA IPC handles, free memory. Like the rest of
 * driver_probe, only answers that do not differ between machines are printed
 * (no addresses, ids or sizes of the device), so the output can be diffed
 * with the mock's.
 *
 * The IPC questions need a second process: probe_ipc runs this program
 * again with "ipc-import" as its first argument (probe_ipc_import), which
 * opens the handles the first one sends it through a pipe.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver_probe.h"

static const char *const attr_names[] = {
    "?",          "CONTEXT",       "MEMORY_TYPE",  "DEVICE_POINTER",   "HOST_POINTER",
    "P2P_TOKENS", "SYNC_MEMOPS",   "BUFFER_ID",    "IS_MANAGED",       "DEVICE_ORDINAL",
    "IS_LEGACY_CUDA_IPC_CAPABLE",  "RANGE_START_ADDR", "RANGE_SIZE", "MAPPED",
    "ALLOWED_HANDLE_TYPES", "IS_GPU_DIRECT_RDMA_CAPABLE", "ACCESS_FLAGS", "MEMPOOL_HANDLE",
    "MAPPING_SIZE", "MAPPING_BASE_ADDR", "MEMORY_BLOCK_ID", "IS_HW_DECOMPRESS_CAPABLE"};
#define NATTRS 21

/* A value written into a buffer filled with 0xA5 first: how many bytes were
 * written, and the first eight. */
typedef struct answer {
  CUresult rc;
  int written;
  uint64_t v;
} answer;

static answer read_back(CUresult rc, const unsigned char *buf) {
  answer a = {rc, 0, 0};
  for (int i = 0; i < 32; i++)
    if (buf[i] != 0xA5)
      a.written = i + 1;
  memcpy(&a.v, buf, a.written < 8 ? (size_t)a.written : 8);
  return a;
}

static answer ask(int attr, CUdeviceptr ptr, int plural) {
  unsigned char buf[32];
  memset(buf, 0xA5, sizeof buf);
  CUpointer_attribute at = (CUpointer_attribute)attr;
  void *data = buf;
  CUresult rc = plural ? cuPointerGetAttributes(1, &at, &data, ptr)
                       : cuPointerGetAttribute(buf, at, ptr);
  return read_back(rc, buf);
}

/* An answer in words true on any machine: addresses and ids by what they
 * are, not their value. */
static void describe(char *out, size_t n, int attr, answer a, CUdeviceptr ptr,
                     CUdeviceptr base, uint64_t size, CUcontext ctx) {
  if (a.rc != CUDA_SUCCESS || a.written == 0) {
    snprintf(out, n, "%s, %d bytes written", rc_name(a.rc), a.written);
    return;
  }
  const char *what = NULL;
  char num[32];
  switch (attr) {
  case CU_POINTER_ATTRIBUTE_CONTEXT:
    what = a.v == (uint64_t)(uintptr_t)ctx ? "the current context" : a.v ? "another" : "NULL";
    break;
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
  case CU_POINTER_ATTRIBUTE_HOST_POINTER:
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    what = a.v == ptr ? "the pointer" : a.v == base ? "the base" : a.v ? "another" : "0";
    break;
  case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
    what = a.v == 0 ? "p2pToken 0" : "p2pToken set";
    break;
  case CU_POINTER_ATTRIBUTE_BUFFER_ID:
  case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    what = a.v ? "nonzero" : "0";
    break;
  case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    what = a.v && a.v <= base ? "at or below the base" : a.v ? "above the base" : "0";
    break;
  case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    what = a.v == 0 ? "0" : a.v >= size ? "at least the size" : "below the size";
    break;
  default:
    snprintf(num, sizeof num, "%lld", (long long)(a.written == 4 ? (int32_t)a.v : (int64_t)a.v));
    what = num;
  }
  snprintf(out, n, "%s, %d bytes: %s", rc_name(a.rc), a.written, what);
}

static void each_attribute(const char *label, CUdeviceptr ptr, CUdeviceptr base,
                           uint64_t size, CUcontext ctx, int plural) {
  for (int attr = 1; attr <= NATTRS; attr++) {
    char d[96];
    describe(d, sizeof d, attr, ask(attr, ptr, plural), ptr, base, size, ctx);
    printf("%s %s %s: %s\n", plural ? "attributes" : "attribute", attr_names[attr], label, d);
  }
}

/* Whether every singular answer at `p` but DEVICE_POINTER is the same as at
 * `base`, the allocation's start. */
static int same_answers(CUdeviceptr p, CUdeviceptr base) {
  for (int attr = 1; attr <= NATTRS; attr++) {
    if (attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER)
      continue;
    answer x = ask(attr, p, 0), y = ask(attr, base, 0);
    if (x.rc != y.rc || x.written != y.written || x.v != y.v)
      return 0;
  }
  return 1;
}

static int all_refused(CUdeviceptr p) {
  for (int attr = 1; attr <= NATTRS; attr++)
    if (ask(attr, p, 0).rc != CUDA_ERROR_INVALID_VALUE)
      return 0;
  return 1;
}

/* How many of the refused singular queries at `p` wrote into their data
 * anyway. */
static int refused_writes(CUdeviceptr p) {
  int n = 0;
  for (int attr = 1; attr <= NATTRS; attr++) {
    answer a = ask(attr, p, 0);
    n += a.rc != CUDA_SUCCESS && a.written > 0;
  }
  return n;
}

static uint64_t attr_u64(int attr, CUdeviceptr p) {
  uint64_t v = 0;
  cuPointerGetAttribute(&v, (CUpointer_attribute)attr, p);
  return v;
}

static int sync_memops(CUdeviceptr p) {
  int v = -1;
  cuPointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p);
  return v;
}

static void probe_sync_memops(CUdeviceptr c, CUdeviceptr a, CUdeviceptr freed) {
  int one = 1, zero = 0;
  printf("SYNC_MEMOPS of a fresh allocation: %d\n", sync_memops(c));
  Q("set SYNC_MEMOPS 1", cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, c));
  printf("SYNC_MEMOPS after: %d; of the allocation beside it: %d\n", sync_memops(c),
         sync_memops(a));
  Q("set SYNC_MEMOPS on an interior pointer",
    cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, c + 100));
  Q("set SYNC_MEMOPS on a freed pointer",
    cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, freed));
  Q("set BUFFER_ID", cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_BUFFER_ID, c));
  Q("set SYNC_MEMOPS 0", cuPointerSetAttribute(&zero, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, c));
  printf("SYNC_MEMOPS after: %d\n", sync_memops(c));
  CUDA_POINTER_ATTRIBUTE_P2P_TOKENS tokens;
  Q("P2P_TOKENS", cuPointerGetAttribute(&tokens, CU_POINTER_ATTRIBUTE_P2P_TOKENS, a));
  printf("SYNC_MEMOPS after a P2P_TOKENS query: %d\n", sync_memops(a));
}

static void probe_plural_rules(CUdeviceptr c) {
  CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_P2P_TOKENS,
                               CU_POINTER_ATTRIBUTE_BUFFER_ID};
  unsigned char b[3][32];
  void *d[3] = {b[0], b[1], b[2]};
  memset(b, 0xA5, sizeof b);
  CUresult rc = cuPointerGetAttributes(3, at, d, c);
  printf("attributes RANGE_SIZE, P2P_TOKENS, BUFFER_ID: %s, written %d %d %d\n", rc_name(rc),
         b[0][0] != 0xA5, b[1][0] != 0xA5, b[2][0] != 0xA5);
  Q("attributes of none", cuPointerGetAttributes(0, at, d, c));
  uint64_t v;
  Q("attribute 99", cuPointerGetAttribute(&v, (CUpointer_attribute)99, c));
  Q("attribute into NULL", cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_BUFFER_ID, c));
  CUdeviceptr base = 0;
  size_t size = 0;
  Q("address range, NULL base", cuMemGetAddressRange_v2(NULL, &size, c + 10));
  Q("address range, NULL size", cuMemGetAddressRange_v2(&base, NULL, c + 10));
  printf("address range, NULL size: base ok %d\n", base == c);
}

void probe_pointers(CUcontext ctx) {
  CUdeviceptr c = 0, a = 0, freed = 0, two = 0, x = 0;
  Q("pointers: cuMemAlloc(1000)", cuMemAlloc_v2(&c, 1000));
  Q("pointers: cuMemAlloc(64 KiB)", cuMemAlloc_v2(&a, 65536));
  Q("pointers: cuMemAlloc(64 KiB) to free", cuMemAlloc_v2(&freed, 65536));
  uint64_t old_id = attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, freed);
  cuMemFree_v2(freed);
  probe_sync_memops(c, a, freed); /* first: P2P_TOKENS sets SYNC_MEMOPS */
  each_attribute("of a 1000 B allocation", c, c, 1000, ctx, 0);
  printf("attributes at 999 bytes in equal the base's but DEVICE_POINTER: %d\n",
         same_answers(c + 999, c));
  printf("attributes at the requested end, 1000 bytes in, all CUDA_ERROR_INVALID_VALUE: %d\n",
         all_refused(c + 1000));
  printf("attributes of a freed pointer all CUDA_ERROR_INVALID_VALUE: %d\n", all_refused(freed));
  printf("refused attributes of a freed pointer that wrote anyway: %d\n", refused_writes(freed));
  each_attribute("of a 1000 B allocation, alone in a list", c, c, 1000, ctx, 1);
  each_attribute("of a freed pointer, alone in a list", freed, freed, 0, ctx, 1);
  printf("BUFFER_ID of two allocations differ: %d\n",
         attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, c) != attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, a));
  Q("pointers: cuMemAlloc(64 KiB) again", cuMemAlloc_v2(&x, 65536));
  printf("a new allocation at a freed one's address: %d\n", x == freed);
  printf("BUFFER_ID of a new allocation is new: %d\n",
         attr_u64(CU_POINTER_ATTRIBUTE_BUFFER_ID, x) != old_id);
  Q("pointers: cuMemAlloc(2 MiB)", cuMemAlloc_v2(&two, 2u << 20));
  printf("mapping of a 2 MiB allocation is itself: %d\n",
         attr_u64(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, two) == two &&
             attr_u64(CU_POINTER_ATTRIBUTE_MAPPING_SIZE, two) == (2u << 20));
  probe_plural_rules(c);
  cuMemFree_v2(c);
  cuMemFree_v2(a);
  cuMemFree_v2(x);
  cuMemFree_v2(two);
}

/* Nearly all the free memory in one allocation. Not all of it: the
 * driver's own margin depends on what was allocated before (on the H200,
 * plain, after a 1000 B and a 3 MiB allocation were freed, free - 4 MiB and
 * free - 5 MiB were refused and free - 6 MiB served; fresh, free - 4 MiB
 * was served), and a question must have one answer. */
void probe_free_memory(void) {
  size_t fr = 0, tot = 0;
  cuMemGetInfo_v2(&fr, &tot);
  CUdeviceptr big = 0;
  CUresult rc = cuMemAlloc_v2(&big, fr - (64u << 20));
  printf("cuMemAlloc(free - 64 MiB): %s\n", rc_name(rc));
  if (rc == CUDA_SUCCESS)
    cuMemFree_v2(big);
}

/* ---- IPC ---------------------------------------------------------------- */

#define SEG (2u << 20)

static uint64_t field(const CUipcMemHandle *h, int at, size_t n) {
  uint64_t v = 0;
  memcpy(&v, h->reserved + at, n);
  return v;
}

/* The handle of the range [offset, offset + size) of the allocation whose
 * handle is `h`: the two fields the driver reads, rewritten. */
static CUipcMemHandle sub_range(CUipcMemHandle h, uint32_t offset, uint64_t size) {
  uint32_t at = (uint32_t)field(&h, 28, 4) + offset;
  memcpy(h.reserved + 16, &size, 8);
  memcpy(h.reserved + 28, &at, 4);
  return h;
}

typedef struct ipc_msg {
  CUipcMemHandle small, seg;
} ipc_msg;

/* Whether the 4-byte words at p are their own indexes in the segment,
 * from `offset` on, for `size` bytes (the exporter wrote word i = i). */
static int words_ok(CUdeviceptr p, uint32_t offset, uint64_t size) {
  uint32_t first = 1, last = 1;
  if (cuMemcpyDtoH_v2(&first, p, 4) != CUDA_SUCCESS ||
      cuMemcpyDtoH_v2(&last, p + size - 4, 4) != CUDA_SUCCESS)
    return 0;
  return first == offset / 4 && last == (offset + size - 4) / 4;
}

static void open_range(const char *label, CUipcMemHandle h, uint32_t offset, uint64_t size,
                       CUdeviceptr *out) {
  CUdeviceptr p = 0, base = 0;
  size_t got = 0;
  CUresult rc = cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  printf("import: open %s: %s", label, rc_name(rc));
  if (rc == CUDA_SUCCESS) {
    cuMemGetAddressRange_v2(&base, &got, p);
    printf(", bytes ok %d, address range is the range %d", words_ok(p, offset, size),
           base == p && got == size);
  }
  printf("\n");
  *out = p;
}

static void import_small(CUipcMemHandle h) {
  CUdeviceptr p = 0, again = 0, v1 = 0;
  CUresult rc = cuIpcOpenMemHandle_v2(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  unsigned char first = 0;
  size_t size = 0;
  CUdeviceptr base = 0;
  if (rc == CUDA_SUCCESS) {
    cuMemcpyDtoH_v2(&first, p + 999, 1);
    cuMemGetAddressRange_v2(&base, &size, p + 10);
  }
  printf("import: open a 1000 B allocation: %s, last byte ok %d, range %zu from the pointer %d\n",
         rc_name(rc), first == 0xCC, size, base == p);
  rc = cuIpcOpenMemHandle_v2(&again, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  printf("import: open it again: %s, the same pointer %d\n", rc_name(rc), again == p);
  rc = cuIpcOpenMemHandle(&v1, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  printf("import: open it through the v1 entry point: %s, the same pointer %d\n", rc_name(rc),
         v1 == p);
  printf("import: attribute IS_LEGACY_CUDA_IPC_CAPABLE of the import: %d\n",
         (int)attr_u64(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p));
  Q("import: close an interior pointer", cuIpcCloseMemHandle(p + 512));
  for (int i = 0; i < 4; i++)
    printf("import: close #%d: %s\n", i + 1, rc_name(cuIpcCloseMemHandle(p)));
}

static void import_ranges(CUipcMemHandle seg, int in, int out) {
  CUdeviceptr a = 0, b = 0, c = 0, raw = 0;
  open_range("a 64 KiB range 64 KiB in", sub_range(seg, 0x10000, 65536), 0x10000, 65536, &a);
  open_range("a 1000 B range 0x20200 in", sub_range(seg, 0x20200, 1000), 0x20200, 1000, &b);
  open_range("a range overlapping the first", sub_range(seg, 0x18000, 65536), 0x18000, 65536, &c);
  open_range("the whole allocation", seg, 0, SEG, &raw);
  char go = 1;
  if (write(out, &go, 1) != 1 || read(in, &go, 1) != 1)
    exit(3);
  printf("import: after the exporter freed the allocation and wrote over its address, "
         "the import still reads its bytes: %d\n", words_ok(a, 0x10000, 65536));
  Q("import: close the first range", cuIpcCloseMemHandle(a));
  Q("import: close the second range", cuIpcCloseMemHandle(b));
}

int probe_ipc_import(int in, int out) {
  CUcontext ctx;
  cuInit(0);
  cuDevicePrimaryCtxRetain(&ctx, 0);
  cuCtxSetCurrent(ctx);
  ipc_msg m;
  if (read(in, &m, sizeof m) != (ssize_t)sizeof m)
    return 2;
  import_small(m.small);
  import_ranges(m.seg, in, out);
  fflush(stdout);
  return 0;
}

static void handle_facts(CUdeviceptr small, CUdeviceptr seg, ipc_msg *m) {
  CUipcMemHandle interior, freed_h;
  Q("ipc: handle of a 1000 B allocation", cuIpcGetMemHandle(&m->small, small));
  Q("ipc: handle of a 2 MiB allocation", cuIpcGetMemHandle(&m->seg, seg));
  Q("ipc: handle of an interior pointer", cuIpcGetMemHandle(&interior, seg + 0x10000));
  printf("ipc: the interior pointer's handle is the allocation's: %d\n",
         !memcmp(&interior, &m->seg, sizeof interior));
  printf("ipc: bytes 16..23 hold the size: %d %d\n", field(&m->small, 16, 8) == 1000,
         field(&m->seg, 16, 8) == SEG);
  printf("ipc: bytes 28..31 hold the offset in the mapping: %d %d\n",
         field(&m->small, 28, 4) ==
             small - attr_u64(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, small),
         field(&m->seg, 28, 4) ==
             seg - attr_u64(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, seg));
  CUdeviceptr g = 0, managed = 0, own = 0;
  cuMemAlloc_v2(&g, 4096);
  cuMemFree_v2(g);
  Q("ipc: handle of a freed pointer", cuIpcGetMemHandle(&freed_h, g));
  cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL);
  Q("ipc: handle of managed memory", cuIpcGetMemHandle(&freed_h, managed));
  cuMemFree_v2(managed);
  Q("ipc: open one's own handle", cuIpcOpenMemHandle_v2(&own, m->small, 1));
}

void probe_ipc(const char *self) {
  CUdeviceptr small = 0, seg = 0;
  cuMemAlloc_v2(&small, 1000);
  cuMemsetD8_v2(small, 0xCC, 1000);
  cuMemAlloc_v2(&seg, SEG);
  uint32_t *words = malloc(SEG);
  for (uint32_t i = 0; i < SEG / 4; i++)
    words[i] = i;
  cuMemcpyHtoD_v2(seg, words, SEG);
  free(words);
  cuCtxSynchronize();
  ipc_msg m;
  handle_facts(small, seg, &m);
  int to[2], from[2];
  if (pipe(to) || pipe(from))
    exit(2);
  pid_t pid = fork();
  if (pid == 0) {
    char a[16], b[16];
    snprintf(a, sizeof a, "%d", to[0]);
    snprintf(b, sizeof b, "%d", from[1]);
    execl(self, self, "ipc-import", a, b, (char *)NULL);
    _exit(127);
  }
  char go = 1;
  if (write(to[1], &m, sizeof m) != (ssize_t)sizeof m || read(from[0], &go, 1) != 1)
    exit(2);
  cuMemFree_v2(seg);
  CUdeviceptr over = 0;
  cuMemAlloc_v2(&over, SEG);
  cuMemsetD8_v2(over, 0x11, SEG);
  cuCtxSynchronize();
  if (write(to[1], &go, 1) != 1)
    exit(2);
  int status = 0;
  waitpid(pid, &status, 0);
  printf("ipc: the importer exited %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  cuMemFree_v2(over);
  cuMemFree_v2(small);
}
