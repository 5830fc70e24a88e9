/*
 * mockcuda's virtual-memory API: cuMemCreate/cuMemRelease (memory without
 * an address), cuMemAddressReserve/cuMemAddressFree (addresses without
 * memory), cuMemMap/cuMemUnmap/cuMemSetAccess, answering as the driver
 * measured in driver_facts.txt (NVIDIA H200, driver 580):
 *  - granularity 2 MiB; a reservation must be whole granules; one as large
 *    as the device's memory is granted, and one past the card's limit is
 *    refused (4x the memory was on the H200, not on the H100; 1 PiB on
 *    both): the mock refuses more than twice its memory;
 *  - a handle's memory is taken at cuMemCreate and lives while the handle
 *    or a mapping of it does (cuMemRelease of a mapped handle succeeds and
 *    the mapping keeps working);
 *  - cuMemMap maps a whole handle at granule-aligned, unmapped addresses;
 *    cuMemSetAccess needs its range wholly mapped and may span mappings;
 *  - cuMemUnmap takes any range made of whole mappings (its unmapped pages
 *    are no error) and refuses one that cuts a mapping;
 *  - cuMemAddressFree needs the exact range with nothing mapped in it;
 *  - a mapped address is an allocation of the mapping's range for
 *    cuMemGetAddressRange, of the reservation's for RANGE_START_ADDR and
 *    RANGE_SIZE, not IPC-capable, and no address cuMemFree frees; an
 *    unmapped one is no allocation's;
 *  - none of these calls is refused during a stream capture.
 * Bytes are kept in host memory reserved per range and committed as pages
 * are mapped; an unmapped page's bytes are gone. MOCKCUDA_VMM=0 plays a
 * driver that refuses the API: cuMemAddressReserve answers
 * CUDA_ERROR_NOT_SUPPORTED.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mockcuda_internal.h"

#define MOCK_MAX_RANGES 256

typedef struct mock_handle {
  struct mock_handle *next;
  CUmemGenericAllocationHandle id;
  int device;
  uint64_t size;
  int released; /* cuMemRelease called: the memory goes with its mappings */
  unsigned mappings;
} mock_handle;

/* A reservation: `pages` holds one record per granule, the mapping that
 * covers it (kind MAPPED) or kind 0 and size 0 when none does. */
typedef struct mock_range {
  uint64_t addr, size;
  int device;
  unsigned char *host;  /* size bytes, committed page by page */
  unsigned char *open;  /* per granule: cuMemSetAccess gave access */
  mock_alloc *pages;
  mock_handle **handle; /* per granule: the handle mapped there */
} mock_range;

static mock_handle *g_handles;
static CUmemGenericAllocationHandle g_next_handle = 0x100000;
static mock_range g_ranges[MOCK_MAX_RANGES];
static int g_nranges;
static uint64_t g_next_mapping_id = 1ull << 32;

static uint64_t mock_granule_of(const mock_range *r, uint64_t p) {
  return (p - r->addr) / MOCK_LARGE;
}

static mock_range *mock_range_at(uint64_t p, uint64_t n) {
  for (int i = 0; i < g_nranges; i++) {
    mock_range *r = &g_ranges[i];
    if (p >= r->addr && p - r->addr < r->size && n <= r->size - (p - r->addr))
      return r;
  }
  return NULL;
}

mock_alloc *mock_vmm_find(uint64_t p, uint64_t n, mock_device **dev_out) {
  mock_range *r = mock_range_at(p, n ? n : 1);
  if (!r)
    return NULL;
  uint64_t last = p + (n ? n : 1) - 1;
  for (uint64_t g = mock_granule_of(r, p); g <= mock_granule_of(r, last); g++)
    if (r->pages[g].kind != MOCK_KIND_MAPPED || !r->open[g])
      return NULL;
  if (dev_out)
    *dev_out = &g_dev[r->device];
  return &r->pages[mock_granule_of(r, p)];
}

int mock_vmm_reserved(uint64_t p) { return mock_range_at(p, 1) != NULL; }

static mock_handle **mock_handle_slot(CUmemGenericAllocationHandle id) {
  mock_handle **pp = &g_handles;
  while (*pp && (*pp)->id != id)
    pp = &(*pp)->next;
  return pp;
}

/* The handle's memory goes once it is released and mapped nowhere. */
static void mock_handle_drop_if_done(mock_handle *h) {
  if (!h->released || h->mappings)
    return;
  mock_handle **pp = mock_handle_slot(h->id);
  *pp = h->next;
  g_dev[h->device].used -= h->size;
  mock_device_changed(h->device);
  g_cnt.used_bytes -= h->size;
  g_cnt.live_handles--;
  free(h);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags) {
  mock_lock();
  g_cnt.mem_create++;
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS &&
      (!handle || !prop || flags || size == 0 || size % MOCK_LARGE ||
       prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
       prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
       prop->location.id >= g_ndev))
    rc = CUDA_ERROR_INVALID_VALUE;
  mock_device *dv = rc == CUDA_SUCCESS ? &g_dev[prop->location.id] : NULL;
  if (rc == CUDA_SUCCESS && (size > g_capacity || mock_device_used(prop->location.id) + size > g_capacity)) {
    g_cnt.oom++;
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  mock_handle *h = NULL;
  if (rc == CUDA_SUCCESS && !(h = calloc(1, sizeof *h)))
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    *h = (mock_handle){g_handles, g_next_handle++, prop->location.id, size, 0, 0};
    g_handles = h;
    dv->used += size;
    mock_device_changed(prop->location.id);
    g_cnt.used_bytes += size;
    if (g_cnt.used_bytes > g_cnt.peak_used_bytes)
      g_cnt.peak_used_bytes = g_cnt.used_bytes;
    g_cnt.live_handles++;
    *handle = h->id;
  }
  mock_unlock();
  mock_trace("cuMemCreate(%zu) = %d", size, rc);
  return rc;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  mock_lock();
  g_cnt.mem_release++;
  CUresult rc = mock_need_init();
  mock_handle *h = *mock_handle_slot(handle);
  if (rc == CUDA_SUCCESS && (!h || h->released))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    h->released = 1;
    mock_handle_drop_if_done(h);
  }
  mock_unlock();
  mock_trace("cuMemRelease(0x%llx) = %d", (unsigned long long)handle, rc);
  return rc;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
  (void)option;
  mock_lock();
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && (!granularity || !prop))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    *granularity = (size_t)MOCK_LARGE;
  mock_unlock();
  return rc;
}

static void mock_range_free(mock_range *r) {
  munmap((void *)(uintptr_t)r->addr, r->size);
  munmap(r->host, r->size);
  free(r->open);
  free(r->pages);
  free(r->handle);
}

/* Addresses come from a PROT_NONE host reservation of their own, so they
 * never meet an allocation's or the program's. */
static CUresult mock_range_new(uint64_t size, mock_range *r) {
  uint64_t n = size / MOCK_LARGE;
  void *va = mmap(NULL, size + MOCK_LARGE, PROT_NONE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void *host = mmap(NULL, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  *r = (mock_range){.size = size, .open = calloc(n, 1),
                    .pages = calloc(n, sizeof(mock_alloc)),
                    .handle = calloc(n, sizeof(mock_handle *))};
  if (va == MAP_FAILED || host == MAP_FAILED || !r->open || !r->pages || !r->handle) {
    if (va != MAP_FAILED)
      munmap(va, size + MOCK_LARGE);
    if (host != MAP_FAILED)
      munmap(host, size);
    free(r->open);
    free(r->pages);
    free(r->handle);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* Aligned to a granule; the slack before and after goes back. */
  uint64_t start = mock_round_up((uint64_t)(uintptr_t)va, MOCK_LARGE);
  uint64_t lead = start - (uint64_t)(uintptr_t)va;
  if (lead)
    munmap(va, lead);
  if (MOCK_LARGE - lead)
    munmap((void *)(uintptr_t)(start + size), MOCK_LARGE - lead);
  r->addr = start;
  r->host = host;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  mock_lock();
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  const char *vmm = getenv("MOCKCUDA_VMM");
  if (rc == CUDA_SUCCESS && vmm && strcmp(vmm, "0") == 0)
    rc = CUDA_ERROR_NOT_SUPPORTED;
  if (rc == CUDA_SUCCESS &&
      (!ptr || size == 0 || size % MOCK_LARGE || flags || addr ||
       (alignment && (alignment & (alignment - 1))) || alignment > MOCK_LARGE ||
       size > 2 * g_capacity || g_nranges == MOCK_MAX_RANGES))
    rc = CUDA_ERROR_INVALID_VALUE;
  mock_range r;
  if (rc == CUDA_SUCCESS)
    rc = mock_range_new(size, &r);
  if (rc == CUDA_SUCCESS) {
    r.device = c->device;
    g_ranges[g_nranges++] = r;
    *ptr = (CUdeviceptr)r.addr;
  }
  mock_unlock();
  mock_trace("cuMemAddressReserve(%zu) = %d", size, rc);
  return rc;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  mock_lock();
  CUresult rc = mock_need_init();
  int found = -1;
  for (int i = 0; i < g_nranges && rc == CUDA_SUCCESS; i++)
    if (g_ranges[i].addr == ptr && g_ranges[i].size == size)
      found = i;
  if (rc == CUDA_SUCCESS && found < 0)
    rc = CUDA_ERROR_INVALID_VALUE;
  for (uint64_t g = 0; rc == CUDA_SUCCESS && g < size / MOCK_LARGE; g++)
    if (g_ranges[found].pages[g].kind == MOCK_KIND_MAPPED)
      rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    mock_range_free(&g_ranges[found]);
    g_ranges[found] = g_ranges[--g_nranges];
  }
  mock_unlock();
  mock_trace("cuMemAddressFree(0x%llx) = %d", (unsigned long long)ptr, rc);
  return rc;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags) {
  mock_lock();
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  mock_range *r = mock_range_at(ptr, size);
  mock_handle *h = *mock_handle_slot(handle);
  if (rc == CUDA_SUCCESS && (!r || !h || h->released || offset || flags ||
                             size != h->size || ptr % MOCK_LARGE))
    rc = CUDA_ERROR_INVALID_VALUE;
  uint64_t g0 = r ? mock_granule_of(r, ptr) : 0, n = size / MOCK_LARGE;
  for (uint64_t g = g0; rc == CUDA_SUCCESS && g < g0 + n; g++)
    if (r->pages[g].kind == MOCK_KIND_MAPPED)
      rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    mock_alloc m = {.addr = ptr, .size = size, .span = size,
                    .host = r->host + (ptr - r->addr), .range_device = r->device,
                    .ctx = c, .kind = MOCK_KIND_MAPPED, .id = ++g_next_mapping_id,
                    .range_addr = r->addr, .range_size = r->size};
    for (uint64_t g = g0; g < g0 + n; g++) {
      r->pages[g] = m;
      r->handle[g] = h;
    }
    h->mappings++;
  }
  mock_unlock();
  mock_trace("cuMemMap(0x%llx, %zu) = %d", (unsigned long long)ptr, size, rc);
  return rc;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  mock_lock();
  CUresult rc = mock_need_init();
  mock_range *r = mock_range_at(ptr, size);
  if (rc == CUDA_SUCCESS && (!r || size == 0 || ptr % MOCK_LARGE || size % MOCK_LARGE))
    rc = CUDA_ERROR_INVALID_VALUE;
  uint64_t g0 = r ? mock_granule_of(r, ptr) : 0, n = size / MOCK_LARGE;
  for (uint64_t g = g0; rc == CUDA_SUCCESS && g < g0 + n; g++) {
    const mock_alloc *m = &r->pages[g];
    if (m->kind == MOCK_KIND_MAPPED && (m->addr < ptr || m->addr + m->size > ptr + size))
      rc = CUDA_ERROR_INVALID_VALUE; /* it would cut a mapping */
  }
  for (uint64_t g = g0; rc == CUDA_SUCCESS && g < g0 + n; g++) {
    if (r->pages[g].kind != MOCK_KIND_MAPPED)
      continue;
    mock_handle *h = r->handle[g];
    if (r->pages[g].addr == r->addr + g * MOCK_LARGE) { /* a mapping's start */
      h->mappings--;
      mock_handle_drop_if_done(h);
    }
    memset(&r->pages[g], 0, sizeof(r->pages[g]));
    r->handle[g] = NULL;
    r->open[g] = 0;
    madvise(r->host + g * MOCK_LARGE, MOCK_LARGE, MADV_DONTNEED);
  }
  mock_unlock();
  mock_trace("cuMemUnmap(0x%llx, %zu) = %d", (unsigned long long)ptr, size, rc);
  return rc;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                        size_t count) {
  mock_lock();
  CUresult rc = mock_need_init();
  mock_range *r = mock_range_at(ptr, size);
  if (rc == CUDA_SUCCESS &&
      (!r || !desc || count == 0 || size == 0 || ptr % MOCK_LARGE || size % MOCK_LARGE))
    rc = CUDA_ERROR_INVALID_VALUE;
  uint64_t g0 = r ? mock_granule_of(r, ptr) : 0, n = size / MOCK_LARGE;
  for (uint64_t g = g0; rc == CUDA_SUCCESS && g < g0 + n; g++)
    if (r->pages[g].kind != MOCK_KIND_MAPPED)
      rc = CUDA_ERROR_INVALID_VALUE;
  for (uint64_t g = g0; rc == CUDA_SUCCESS && g < g0 + n; g++)
    r->open[g] = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  mock_unlock();
  mock_trace("cuMemSetAccess(0x%llx, %zu) = %d", (unsigned long long)ptr, size, rc);
  return rc;
}
