/*
 * mockcuda's pointer queries: cuPointerGetAttribute(s), cuPointerSetAttribute
 * and cuMemGetAddressRange, answering as the driver measured in
 * driver_facts.txt (NVIDIA H200, driver 580): an allocation is the range the
 * program asked for (a pointer past its requested end is no pointer of it),
 * every allocation has a buffer id of its own, SYNC_MEMOPS is kept per
 * allocation, and a pointer that is no allocation's gets
 * CUDA_ERROR_INVALID_VALUE from the singular query and the driver's "not a
 * CUDA pointer" defaults from the plural one.
 */
#include <string.h>

#include "mockcuda_internal.h"

/* The vaSpaceToken the H200 answered (one VA space per process). */
#define MOCK_VA_SPACE_TOKEN 0xfe00u

/* One attribute's value: `len` bytes of `v` (CU_POINTER_ATTRIBUTE_P2P_TOKENS
 * writes a struct of two). */
typedef struct mock_value {
  uint64_t v, v2;
  int len; /* 0: refused; -1: accepted, nothing written; -8: 8 bytes
              written, then refused */
} mock_value;

static mock_value mock_u32(uint64_t v) { return (mock_value){v, 0, 4}; }
static mock_value mock_u64(uint64_t v) { return (mock_value){v, 0, 8}; }

static int mock_device_of(const mock_alloc *a) {
  if (a->kind == MOCK_KIND_MAPPED)
    return a->range_device;
  for (int d = 0; d < g_ndev; d++)
    if (a >= g_dev[d].allocs && a < g_dev[d].allocs + g_dev[d].n)
      return d;
  return 0;
}

/* Memory of our own (not another process's) that cuMemAlloc-like calls made:
 * what IPC can export, GPUDirect RDMA register, the decompressor read. */
static int mock_plain_device(const mock_alloc *a) {
  return a->kind == MOCK_KIND_ALLOC || a->kind == MOCK_KIND_PITCH;
}

/* `attr` of the allocation `a` holding `ptr`. P2P_TOKENS sets SYNC_MEMOPS,
 * as the driver documents and does. */
static mock_value mock_attr(mock_alloc *a, CUdeviceptr ptr, int attr, int plural) {
  uint64_t base = 0, size = 0;
  switch (attr) {
  case CU_POINTER_ATTRIBUTE_CONTEXT: return mock_u64((uint64_t)(uintptr_t)a->ctx);
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: return mock_u32(CU_MEMORYTYPE_DEVICE);
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: return mock_u64(ptr);
  case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    /* Device memory has no host address: 0 in a list; alone, 0 is
     * written and the query refused, as measured. */
    if (a->kind == MOCK_KIND_MANAGED)
      return mock_u64(ptr);
    return plural ? mock_u64(0) : (mock_value){0, 0, -8};
  case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
    if (plural)
      return (mock_value){0, 0, 0};
    a->sync_memops = 1;
    return (mock_value){0, MOCK_VA_SPACE_TOKEN, 12};
  case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: return mock_u32((uint64_t)a->sync_memops);
  case CU_POINTER_ATTRIBUTE_BUFFER_ID: return mock_u64(a->id);
  case CU_POINTER_ATTRIBUTE_IS_MANAGED: return mock_u32(a->kind == MOCK_KIND_MANAGED);
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return mock_u32((uint64_t)mock_device_of(a));
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: return mock_u32(mock_plain_device(a));
  /* A mapping answers with its reservation's range (measured). */
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    return mock_u64(a->kind == MOCK_KIND_MAPPED ? a->range_addr : a->addr);
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    return mock_u64(a->kind == MOCK_KIND_MAPPED ? a->range_size : a->size);
  case CU_POINTER_ATTRIBUTE_MAPPED: return mock_u32(1);
  case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: return mock_u64(0);
  case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: return mock_u32(mock_plain_device(a));
  case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: return mock_u32(CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: return mock_u64(0);
  case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
    mock_mapping(a, &base, &size);
    return mock_u64(size);
  case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    mock_mapping(a, &base, &size);
    return mock_u64(base);
  case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: return mock_u64(a->id);
  case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: return mock_u32(mock_plain_device(a));
  default: return (mock_value){0, 0, 0};
  }
}

/* What the plural query writes for a pointer that is no allocation's:
 * measured defaults (the host pointer is the pointer itself; the two range
 * attributes are accepted and left unwritten). */
static mock_value mock_attr_unknown(CUdeviceptr ptr, int attr) {
  switch (attr) {
  case CU_POINTER_ATTRIBUTE_HOST_POINTER: return mock_u64(ptr);
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: return mock_u32(0xfffffffeu); /* -2 */
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE: return (mock_value){0, 0, -1};
  case CU_POINTER_ATTRIBUTE_CONTEXT:
  case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
  case CU_POINTER_ATTRIBUTE_BUFFER_ID:
  case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
  case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
  case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
  case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
  case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: return mock_u64(0);
  case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
  case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
  case CU_POINTER_ATTRIBUTE_IS_MANAGED:
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
  case CU_POINTER_ATTRIBUTE_MAPPED:
  case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
  case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
  case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE: return mock_u32(0);
  default: return (mock_value){0, 0, 0}; /* P2P_TOKENS too */
  }
}

static void mock_store(void *data, mock_value v) {
  if (v.len == 12) {
    memcpy(data, &v.v, 8);
    uint32_t v2 = (uint32_t)v.v2;
    memcpy((char *)data + 8, &v2, 4);
  } else if (v.len == 4) {
    uint32_t x = (uint32_t)v.v;
    memcpy(data, &x, 4);
  } else if (v.len == 8 || v.len == -8) {
    memcpy(data, &v.v, 8);
  }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  mock_lock();
  g_cnt.pointer_attribute++;
  CUresult rc = mock_need_init();
  mock_alloc *a = NULL;
  if (rc == CUDA_SUCCESS && (!data || !(a = mock_find(ptr, 0, NULL))))
    rc = CUDA_ERROR_INVALID_VALUE;
  mock_value v = {0, 0, 0};
  if (rc == CUDA_SUCCESS) {
    v = mock_attr(a, ptr, (int)attribute, 0);
    mock_store(data, v);
    if (v.len <= 0)
      rc = CUDA_ERROR_INVALID_VALUE;
  }
  mock_unlock();
  return rc;
}

/* In order, stopping at the first attribute refused (entries before it are
 * written), as measured. */
CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr) {
  mock_lock();
  g_cnt.pointer_attribute++;
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && (n == 0 || !attributes || !data))
    rc = CUDA_ERROR_INVALID_VALUE;
  mock_alloc *a = rc == CUDA_SUCCESS ? mock_find(ptr, 0, NULL) : NULL;
  for (unsigned int i = 0; rc == CUDA_SUCCESS && i < n; i++) {
    int attr = (int)attributes[i];
    mock_value v = a ? mock_attr(a, ptr, attr, 1) : mock_attr_unknown(ptr, attr);
    if (v.len == 0 || !data[i])
      rc = CUDA_ERROR_INVALID_VALUE;
    else
      mock_store(data[i], v);
  }
  mock_unlock();
  return rc;
}

/* Only SYNC_MEMOPS can be set, on any pointer inside an allocation. */
CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attribute,
                               CUdeviceptr ptr) {
  mock_lock();
  CUresult rc = mock_need_init();
  mock_alloc *a = NULL;
  if (rc == CUDA_SUCCESS && (!value || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ||
                             !(a = mock_find(ptr, 0, NULL))))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    int v = 0;
    memcpy(&v, value, sizeof v);
    a->sync_memops = v != 0;
  }
  mock_unlock();
  return rc;
}

/* Each of pbase and psize may be NULL. */
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
  mock_lock();
  g_cnt.get_address_range++;
  CUcontext c = NULL;
  mock_alloc *a = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && !(a = mock_find(dptr, 0, NULL)))
    rc = CUDA_ERROR_NOT_FOUND;
  if (rc == CUDA_SUCCESS) {
    if (pbase)
      *pbase = (CUdeviceptr)a->addr;
    if (psize)
      *psize = (size_t)a->size;
  }
  mock_unlock();
  return rc;
}
