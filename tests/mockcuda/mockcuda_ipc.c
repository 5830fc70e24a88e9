/*
 * mockcuda's CUDA IPC: cuIpcGetMemHandle, cuIpcOpenMemHandle(_v2),
 * cuIpcCloseMemHandle, and cuMemGetHandleForAddressRange.
 *
 * Device memory is simulated in host memory, so an exported allocation moves
 * into a memfd, which the importing process maps through
 * /proc/<exporter>/fd/<n>: both then read and write the same bytes, as two
 * processes do with a real handle. The handle is laid out as the H200's
 * driver lays out its own (driver_facts.txt; the library relies on the two
 * fields marked):
 *
 *   [0..7]   the exporter's context        [32..39] 0x0000ff0000000006
 *   [8..15]  the exporter's process id     [40..47] the mapping's block id
 *   [16..23] size of the range  (relied on) [48..51] mock: the memfd's number
 *   [24..27] 0x200, or 0x300 from 2 MiB    [52..63] 0
 *   [28..31] offset of the range in its mapping (relied on)
 *
 * The real importer opens whatever range the two fields name, even one past
 * the mapping's end (a pointer to nothing, or a sticky fault); the mock
 * refuses such a range with CUDA_ERROR_INVALID_VALUE and counts it
 * (ipc_bad_range), so that a library writing a wrong handle fails here.
 * Ranges of one mapping opened in one process must not overlap, else
 * CUDA_ERROR_ALREADY_MAPPED; the same range opened again through _v2 is the
 * same pointer, counted (through the v1 entry point, ALREADY_MAPPED), as
 * measured.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mockcuda_internal.h"

#define MOCK_HANDLE_CONST 0x0000ff0000000006ull

typedef struct mock_ipc_fields {
  uint64_t ctx, pid, size, offset, block;
  int fd;
} mock_ipc_fields;

static void mock_put(CUipcMemHandle *h, int at, const void *v, size_t n) {
  memcpy(h->reserved + at, v, n);
}
static uint64_t mock_get(const CUipcMemHandle *h, int at, size_t n) {
  uint64_t v = 0;
  memcpy(&v, h->reserved + at, n);
  return v;
}

static CUipcMemHandle mock_handle_of(const mock_alloc *a) {
  CUipcMemHandle h;
  memset(&h, 0, sizeof h);
  uint64_t ctx = (uint64_t)(uintptr_t)a->ctx, pid = (uint64_t)getpid();
  uint64_t size = a->size, k = MOCK_HANDLE_CONST, block = a->id;
  uint32_t kind = a->size >= MOCK_LARGE ? 0x300 : 0x200, offset = 0;
  uint32_t fd = (uint32_t)a->shared->fd;
  mock_put(&h, 0, &ctx, 8);
  mock_put(&h, 8, &pid, 8);
  mock_put(&h, 16, &size, 8);
  mock_put(&h, 24, &kind, 4);
  mock_put(&h, 28, &offset, 4);
  mock_put(&h, 32, &k, 8);
  mock_put(&h, 40, &block, 8);
  mock_put(&h, 48, &fd, 4);
  return h;
}

static mock_ipc_fields mock_fields(const CUipcMemHandle *h) {
  return (mock_ipc_fields){mock_get(h, 0, 8),  mock_get(h, 8, 8),
                           mock_get(h, 16, 8), mock_get(h, 28, 4),
                           mock_get(h, 40, 8), (int)mock_get(h, 48, 4)};
}

/* Moves an allocation's bytes into a memfd another process can map. */
static CUresult mock_share(mock_alloc *a) {
  if (a->shared)
    return CUDA_SUCCESS;
  mock_shared *sh = calloc(1, sizeof *sh);
  int fd = sh ? memfd_create("mockcuda-ipc", MFD_CLOEXEC) : -1;
  void *map = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, (off_t)a->span) == 0)
    map = mmap(NULL, a->span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    if (fd >= 0)
      close(fd);
    free(sh);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memcpy(map, a->host, a->size);
  free(a->host);
  *sh = (mock_shared){.fd = fd, .map = map, .map_len = a->span};
  a->host = map;
  a->shared = sh;
  return CUDA_SUCCESS;
}

void mock_shared_release(mock_alloc *a) {
  munmap(a->shared->map, a->shared->map_len);
  if (a->shared->fd >= 0)
    close(a->shared->fd);
  free(a->shared);
  a->shared = NULL;
}

void mock_mapping(const mock_alloc *a, uint64_t *base, uint64_t *size) {
  if (a->kind == MOCK_KIND_IMPORTED) {
    *base = a->addr - a->shared->offset;
    *size = mock_round_up(a->shared->map_len, MOCK_LARGE);
  } else {
    *base = a->addr;
    *size = a->span;
  }
}

/* The handle of the allocation holding dptr (an interior pointer names the
 * whole allocation, as measured). */
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr) {
  mock_lock();
  g_cnt.ipc_get++;
  CUcontext c = NULL;
  mock_alloc *a = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS &&
      (!handle || !(a = mock_find(dptr, 0, NULL)) ||
       (a->kind != MOCK_KIND_ALLOC && a->kind != MOCK_KIND_PITCH)))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    rc = mock_share(a);
  if (rc == CUDA_SUCCESS)
    *handle = mock_handle_of(a);
  mock_unlock();
  mock_trace("cuIpcGetMemHandle(0x%llx) = %d", (unsigned long long)dptr, rc);
  return rc;
}

/* An import of the same mapping already open here: the same range (counted
 * again), or one it overlaps. */
static mock_alloc *mock_import_of(int dev, const mock_ipc_fields *f, int *overlap) {
  mock_device *dv = &g_dev[dev];
  *overlap = 0;
  for (size_t i = 0; i < dv->n; i++) {
    mock_alloc *a = &dv->allocs[i];
    if (a->kind != MOCK_KIND_IMPORTED || a->shared->pid != f->pid ||
        a->shared->block != f->block)
      continue;
    if (a->shared->offset == f->offset && a->shared->size == f->size)
      return a;
    if (f->offset < a->shared->offset + a->shared->size &&
        a->shared->offset < f->offset + f->size)
      *overlap = 1;
  }
  return NULL;
}

/* Maps the exporter's memfd and places the range in this process's
 * address space. */
static CUresult mock_import(CUcontext c, const mock_ipc_fields *f, CUdeviceptr *out) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%llu/fd/%d", (unsigned long long)f->pid, f->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_INVALID_VALUE; /* the exporter freed it, or is gone */
  }
  uint64_t len = (uint64_t)st.st_size;
  if (f->size == 0 || f->offset >= len || f->size > len - f->offset) {
    close(fd);
    g_cnt.ipc_bad_range++;
    mock_trace("cuIpcOpenMemHandle: range %llu+%llu outside the %llu-byte mapping",
               (unsigned long long)f->offset, (unsigned long long)f->size,
               (unsigned long long)len);
    return CUDA_ERROR_INVALID_VALUE;
  }
  void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  mock_shared *sh = map != MAP_FAILED ? calloc(1, sizeof *sh) : NULL;
  mock_alloc *a = sh ? mock_place(c->device, mock_round_up(len, MOCK_LARGE), MOCK_LARGE) : NULL;
  if (!a) {
    if (map != MAP_FAILED)
      munmap(map, len);
    free(sh);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *sh = (mock_shared){-1, map, len, f->pid, f->block, f->offset, f->size, 1};
  a->addr += f->offset;
  a->span -= f->offset;
  a->size = f->size;
  a->host = (unsigned char *)map + f->offset;
  a->ctx = c;
  a->kind = MOCK_KIND_IMPORTED;
  a->shared = sh;
  g_cnt.live_imports++;
  *out = (CUdeviceptr)a->addr;
  return CUDA_SUCCESS;
}

/* `v1`: the CUDA 4.1 entry point, which refuses a range already open here
 * (CUDA_ERROR_ALREADY_MAPPED) where _v2 counts it, as measured. */
static CUresult mock_ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags,
                              int v1, const char *what) {
  mock_lock();
  g_cnt.ipc_open++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  mock_ipc_fields f = mock_fields(&handle);
  if (rc == CUDA_SUCCESS && (!pdptr || flags > CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    rc = CUDA_ERROR_INVALID_VALUE;
  else if (rc == CUDA_SUCCESS && f.pid == (uint64_t)getpid())
    rc = CUDA_ERROR_INVALID_CONTEXT; /* one's own handle, as measured */
  int overlap = 0;
  mock_alloc *open = rc == CUDA_SUCCESS ? mock_import_of(c->device, &f, &overlap) : NULL;
  if (open && v1) {
    rc = CUDA_ERROR_ALREADY_MAPPED;
  } else if (open) {
    open->shared->refcount++;
    *pdptr = (CUdeviceptr)open->addr;
  } else if (rc == CUDA_SUCCESS && overlap) {
    rc = CUDA_ERROR_ALREADY_MAPPED;
  } else if (rc == CUDA_SUCCESS) {
    rc = mock_import(c, &f, pdptr);
  }
  mock_unlock();
  mock_trace("%s(pid %llu, offset %llu, size %llu) = %d", what, (unsigned long long)f.pid,
             (unsigned long long)f.offset, (unsigned long long)f.size, rc);
  return rc;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  return mock_ipc_open(pdptr, handle, flags, 0, "cuIpcOpenMemHandle_v2");
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags) {
  return mock_ipc_open(pdptr, handle, flags, 1, "cuIpcOpenMemHandle");
}

/* Only the pointer the open returned closes (not one inside it). */
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  mock_lock();
  g_cnt.ipc_close++;
  CUcontext c = NULL;
  mock_device *dv = NULL;
  mock_alloc *a = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && (!(a = mock_find(dptr, 0, &dv)) || a->addr != dptr ||
                             a->kind != MOCK_KIND_IMPORTED))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && --a->shared->refcount == 0)
    mock_remove(dv, a);
  mock_unlock();
  return rc;
}

/* A dma-buf of a page-aligned range inside one allocation: a descriptor of
 * the memfd that holds it. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                       CUmemRangeHandleType type, unsigned long long flags) {
  mock_lock();
  CUcontext c = NULL;
  mock_alloc *a = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS &&
      (!handle || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags || !size ||
       dptr % 4096 || size % 4096 || !(a = mock_find(dptr, size, NULL)) ||
       a->kind == MOCK_KIND_IMPORTED))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    rc = mock_share(a);
  int fd = rc == CUDA_SUCCESS ? fcntl(a->shared->fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (rc == CUDA_SUCCESS && fd < 0)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS)
    memcpy(handle, &fd, sizeof fd);
  mock_unlock();
  return rc;
}
