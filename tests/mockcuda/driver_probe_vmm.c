/*
 * driver_probe's questions about the virtual-memory API (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap): what the pool's
 * expandable segments rely on, and what a pointer in such a mapping answers
 * to the queries a program can make. Addresses are printed as offsets from
 * the reserved range's start.
 */
#include <stdint.h>
#include <string.h>

#include "driver_probe.h"

static CUmemAllocationProp vmm_prop(void) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

static CUresult vmm_access(CUdeviceptr at, size_t size) {
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(at, size, &d, 1);
}

/* One 2 MiB page created and mapped at `at`; its handle in *h. */
static CUresult vmm_page(CUdeviceptr at, size_t size,
                         CUmemGenericAllocationHandle *h) {
  CUmemAllocationProp prop = vmm_prop();
  CUresult r = cuMemCreate(h, size, &prop, 0);
  if (r != CUDA_SUCCESS)
    return r;
  return cuMemMap(at, size, 0, *h, 0);
}

static void vmm_attributes(const char *what, CUdeviceptr va, CUdeviceptr p) {
  unsigned int type = 0, legacy = 7, mapped = 7;
  CUdeviceptr start = 0, mbase = 0;
  size_t size = 0, msize = 0;
  unsigned long long id = 0, handles = 0;
  int ordinal = -1;
  CUresult r;
  r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  printf("vmm %s: MEMORY_TYPE: %s %u\n", what, rc_name(r), type);
  r = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
  printf("vmm %s: RANGE_START_ADDR: %s +%lld\n", what, rc_name(r),
         r == CUDA_SUCCESS ? (long long)(start - va) : 0ll);
  r = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
  printf("vmm %s: RANGE_SIZE: %s %zu\n", what, rc_name(r), size);
  r = cuPointerGetAttribute(&mbase, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p);
  printf("vmm %s: MAPPING_BASE_ADDR: %s +%lld\n", what, rc_name(r),
         r == CUDA_SUCCESS ? (long long)(mbase - va) : 0ll);
  r = cuPointerGetAttribute(&msize, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p);
  printf("vmm %s: MAPPING_SIZE: %s %zu\n", what, rc_name(r), msize);
  r = cuPointerGetAttribute(&legacy,
                            CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p);
  printf("vmm %s: IS_LEGACY_CUDA_IPC_CAPABLE: %s %u\n", what, rc_name(r),
         legacy);
  r = cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, p);
  printf("vmm %s: MAPPED: %s %u\n", what, rc_name(r), mapped);
  r = cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
  printf("vmm %s: BUFFER_ID: %s %s\n", what, rc_name(r), id ? "nonzero" : "0");
  r = cuPointerGetAttribute(&handles,
                            CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p);
  printf("vmm %s: ALLOWED_HANDLE_TYPES: %s %llu\n", what, rc_name(r), handles);
  r = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
  printf("vmm %s: DEVICE_ORDINAL: %s %d\n", what, rc_name(r), ordinal);
}

static void vmm_range(const char *what, CUdeviceptr va, CUdeviceptr p) {
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = cuMemGetAddressRange_v2(&base, &size, p);
  printf("vmm %s: cuMemGetAddressRange: %s +%lld %zu\n", what, rc_name(r),
         r == CUDA_SUCCESS ? (long long)(base - va) : 0ll, size);
}

static long long free_mib(void) {
  size_t fr = 0, tot = 0;
  cuMemGetInfo_v2(&fr, &tot);
  return (long long)(fr >> 20);
}

void probe_vmm(void) {
  const size_t MiB = 1u << 20, page = 2 * MiB;
  CUmemAllocationProp prop = vmm_prop();
  size_t gran = 0, rec = 0;
  Q("vmm granularity minimum",
    cuMemGetAllocationGranularity(&gran, &prop,
                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  cuMemGetAllocationGranularity(&rec, &prop,
                                CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  printf("vmm granularity: minimum %zu recommended %zu\n", gran, rec);
  size_t tot = 0, fr = 0;
  cuMemGetInfo_v2(&fr, &tot);
  /* The library reserves as much as the device's memory for an expandable
   * segment. How much more the driver grants depends on the card (4x was
   * refused on the H200, granted on the H100), so past that only what no
   * card can grant is asked: more than a GPU's 49-bit address space. */
  CUdeviceptr big = 0;
  size_t whole = (tot + page - 1) / page * page; /* as the library rounds */
  Q("vmm reserve the device's memory",
    cuMemAddressReserve(&big, whole, 0, 0, 0));
  printf("vmm reserve the device's memory: aligned to 2 MiB: %d\n",
         big % page == 0);
  Q("vmm free it", cuMemAddressFree(big, whole));
  CUdeviceptr huge = 0;
  const size_t PiB = (size_t)1 << 50;
  CUresult granted = cuMemAddressReserve(&huge, PiB, 0, 0, 0);
  printf("vmm reserve 1 PiB: refused: %d\n", granted != CUDA_SUCCESS);
  if (granted == CUDA_SUCCESS)
    cuMemAddressFree(huge, PiB);
  CUdeviceptr va = 0;
  Q("vmm reserve 64 MiB", cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0));
  Q("vmm reserve 1 MiB (not a granule)", cuMemAddressReserve(&big, MiB, 0, 0, 0));
  CUmemGenericAllocationHandle h[4] = {0};
  long long before = free_mib();
  Q("vmm cuMemCreate 2 MiB", cuMemCreate(&h[0], page, &prop, 0));
  printf("vmm free MiB after cuMemCreate: -%lld\n", before - free_mib());
  Q("vmm cuMemMap page 0", cuMemMap(va, page, 0, h[0], 0));
  Q("vmm cuMemMap page 0 again", cuMemMap(va, page, 0, h[0], 0));
  Q("vmm cuMemMap unaligned", cuMemMap(va + MiB, page, 0, h[0], 0));
  Q("vmm page 1", vmm_page(va + page, page, &h[1]));
  Q("vmm page 2", vmm_page(va + 2 * page, page, &h[2]));
  Q("vmm cuMemSetAccess pages 0-2 at once", vmm_access(va, 3 * page));
  Q("vmm cuMemSetAccess page 3 (unmapped)", vmm_access(va + 3 * page, page));
  Q("vmm cuMemsetD8 across pages 0-2", cuMemsetD8_v2(va, 0x5a, 3 * page));
  unsigned char probe[2] = {0};
  Q("vmm cuMemcpyDtoH last byte",
    cuMemcpyDtoH_v2(probe, va + 3 * page - 1, 1));
  printf("vmm last byte: %#x\n", probe[0]);
  vmm_range("page 1 + 1 MiB", va, va + page + MiB);
  vmm_range("page 3 (unmapped)", va, va + 3 * page);
  vmm_attributes("page 1 + 1 MiB", va, va + page + MiB);
  {
    unsigned int type = 0;
    CUresult r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       va + 3 * page);
    printf("vmm page 3 (unmapped): MEMORY_TYPE: %s\n", rc_name(r));
  }
  {
    CUipcMemHandle ih;
    Q("vmm cuIpcGetMemHandle(page 1)", cuIpcGetMemHandle(&ih, va + page));
  }
  Q("vmm cuMemFree(page 1)", cuMemFree_v2(va + page));
  Q("vmm cuMemRelease(page 0 handle) while mapped", cuMemRelease(h[0]));
  Q("vmm cuMemsetD8 page 0 after its handle's release",
    cuMemsetD8_v2(va, 1, page));
  before = free_mib();
  Q("vmm cuMemUnmap pages 1-2 at once", cuMemUnmap(va + page, 2 * page));
  Q("vmm cuMemUnmap page 1", cuMemUnmap(va + page, page));
  Q("vmm cuMemUnmap page 2", cuMemUnmap(va + 2 * page, page));
  Q("vmm cuMemUnmap page 2 again", cuMemUnmap(va + 2 * page, page));
  Q("vmm cuMemRelease page 1", cuMemRelease(h[1]));
  Q("vmm cuMemRelease page 2", cuMemRelease(h[2]));
  printf("vmm free MiB given back by pages 1-2: %lld\n", free_mib() - before);
  Q("vmm 4 MiB mapping", vmm_page(va + 8 * page, 2 * page, &h[3]));
  Q("vmm cuMemUnmap half of it", cuMemUnmap(va + 8 * page, page));
  Q("vmm cuMemUnmap all of it", cuMemUnmap(va + 8 * page, 2 * page));
  cuMemRelease(h[3]);
  Q("vmm cuMemAddressFree while page 0 mapped", cuMemAddressFree(va, 64 * MiB));
  before = free_mib();
  Q("vmm cuMemUnmap page 0", cuMemUnmap(va, page));
  printf("vmm free MiB given back by unmapping a released handle's page: "
         "%lld\n", free_mib() - before);
  Q("vmm cuMemAddressFree part", cuMemAddressFree(va, 32 * MiB));
  Q("vmm cuMemAddressFree", cuMemAddressFree(va, 64 * MiB));
  Q("vmm cuMemAddressFree again", cuMemAddressFree(va, 64 * MiB));
}
