/*
 * The pool's memory told to an attached NVTX tool (see nvtx.h).
 *
 * Measured with compute-sanitizer 2025.3 on the H200: a segment registered
 * as a sub-allocator heap is no longer an allocation of its own to the
 * tool (never reported leaked), a region registered in it is checked as
 * an allocation of its size (a write one byte past it: "1 bytes after the
 * nearest allocation ... of size 1,000 bytes"; into it once unregistered:
 * out of bounds), a region still registered at exit is reported leaked
 * under its name, and unregistering an address that is no region is an
 * error of the tool's ("Call to nvtxMemRegionsUnregister failed"). Hence
 * the two tables: the heaps by segment base, and the regions registered.
 *
 * Both tables hold device addresses, so their memory is the library's own
 * (meta.h), never the program's malloc.
 */
#include "support/nvtx.h"

#include <pthread.h>
#include <stdlib.h>

#include <nvtx3/nvToolsExtMem.h>

#include "support/fork.h"
#include "support/meta.h"

#include "support/meta_hash.h"

typedef struct ca__nvtx_heap {
  uint64_t base;
  nvtxMemHeapHandle_t handle;
  UT_hash_handle hh;
} ca__nvtx_heap;

typedef struct ca__nvtx_region {
  uint64_t addr;
  UT_hash_handle hh;
} ca__nvtx_region;

static pthread_mutex_t ca__nvtx_lock = PTHREAD_MUTEX_INITIALIZER;
static ca__nvtx_heap *ca__heaps;
static ca__nvtx_region *ca__regions;
static nvtxDomainHandle_t ca__domain;

static nvtxDomainHandle_t ca__dom(void) {
  return __atomic_load_n(&ca__domain, __ATOMIC_ACQUIRE);
}

static void ca__nvtx_prepare(void) { pthread_mutex_lock(&ca__nvtx_lock); }
static void ca__nvtx_parent(void) { pthread_mutex_unlock(&ca__nvtx_lock); }

/* The child's tool, if any, was told nothing: it forgets the parent's
 * heaps and regions (their records stay in the child's copy of the
 * library's memory, unused). */
static void ca__nvtx_child(void) {
  ca__heaps = NULL;
  ca__regions = NULL;
  pthread_mutex_unlock(&ca__nvtx_lock);
}

static const ca_fork_handlers ca__nvtx_fork = {
    ca__nvtx_prepare, ca__nvtx_parent, ca__nvtx_child};

bool ca_nvtx_attached(void) {
  static int attached = -1;
  int a = __atomic_load_n(&attached, __ATOMIC_ACQUIRE);
  if (a < 0) {
    const char *path = getenv("NVTX_INJECTION64_PATH");
    a = path != NULL && path[0] != '\0';
    __atomic_store_n(&attached, a, __ATOMIC_RELEASE);
  }
  return a;
}

/* Under the lock: the heap of the segment at `base`, registered first when
 * it is not one yet; NULL when the tool refused it. */
static ca__nvtx_heap *ca__heap_of(uint64_t base, uint64_t size) {
  ca__nvtx_heap *h = NULL;
  HASH_FIND(hh, ca__heaps, &base, sizeof(base), h);
  if (h != NULL)
    return h;
  nvtxMemVirtualRangeDesc_t range = {.size = (size_t)size,
                                     .ptr = (void *)(uintptr_t)base};
  nvtxMemHeapDesc_t desc = {.extCompatID = NVTX_EXT_COMPATID_MEM,
                            .structSize = sizeof(desc),
                            .usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR,
                            .type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS,
                            .typeSpecificDescSize = sizeof(range),
                            .typeSpecificDesc = &range};
  /* Recorded before the tool hears of it: a heap the table could not
   * hold is never registered, nor then registered twice. */
  h = ca_meta_alloc(sizeof(*h));
  if (h == NULL)
    return NULL;
  h->base = base;
  HASH_ADD(hh, ca__heaps, base, sizeof(h->base), h);
  if (!CA_HASH_ADDED(h)) {
    ca_meta_free(h, sizeof(*h));
    return NULL;
  }
  h->handle = nvtxMemHeapRegister(ca__dom(), &desc);
  if (h->handle == NULL) {
    HASH_DEL(ca__heaps, h);
    ca_meta_free(h, sizeof(*h));
    return NULL;
  }
  return h;
}

/* Under the lock. */
static void ca__name(uint64_t addr, const char *name) {
  nvtxMemRegionNameDesc_t desc = {
      .regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER,
      .nameType = NVTX_MESSAGE_TYPE_ASCII,
      .region.pointer = (const void *)(uintptr_t)addr,
      .name.ascii = name};
  nvtxMemRegionsNameBatch_t batch = {.extCompatID = NVTX_EXT_COMPATID_MEM,
                                     .structSize = sizeof(batch),
                                     .regionCount = 1,
                                     .regionElementSize = sizeof(desc),
                                     .regionElements = &desc};
  nvtxMemRegionsName(ca__dom(), &batch);
}

/* The library's domain, made by the first region outside the lock: NVTX
 * loads the tool's library then, and no library lock may be held across
 * the dynamic loader (lazy.h). The same name gives the same domain. */
static void ca__domain_made(void) {
  if (__atomic_load_n(&ca__domain, __ATOMIC_ACQUIRE) == NULL)
    __atomic_store_n(&ca__domain, nvtxDomainCreateA("cudalloc"),
                     __ATOMIC_RELEASE);
}

void ca_nvtx_region_add(uint64_t base, uint64_t segment_size, uint64_t addr,
                        uint64_t size, const char *name) {
  ca_fork_register(CA_FORK_NVTX, &ca__nvtx_fork);
  ca__domain_made();
  pthread_mutex_lock(&ca__nvtx_lock);
  ca__nvtx_heap *h = ca__heap_of(base, segment_size);
  ca__nvtx_region *r = h != NULL ? ca_meta_alloc(sizeof(*r)) : NULL;
  if (r != NULL) {
    /* Recorded first: a region the table could not hold is never told to
     * the tool, which would otherwise report it leaked. */
    r->addr = addr;
    HASH_ADD(hh, ca__regions, addr, sizeof(r->addr), r);
    if (!CA_HASH_ADDED(r)) {
      ca_meta_free(r, sizeof(*r));
      r = NULL;
    }
  }
  if (r != NULL) {
    nvtxMemVirtualRangeDesc_t range = {.size = (size_t)size,
                                       .ptr = (void *)(uintptr_t)addr};
    nvtxMemRegionHandle_t handle = {0};
    nvtxMemRegionsRegisterBatch_t batch = {
        .extCompatID = NVTX_EXT_COMPATID_MEM,
        .structSize = sizeof(batch),
        .regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS,
        .heap = h->handle,
        .regionCount = 1,
        .regionDescElementSize = sizeof(range),
        .regionDescElements = &range,
        .regionHandleElementsOut = &handle};
    nvtxMemRegionsRegister(ca__dom(), &batch);
    if (name != NULL)
      ca__name(addr, name);
  }
  pthread_mutex_unlock(&ca__nvtx_lock);
}

void ca_nvtx_region_remove(uint64_t addr) {
  pthread_mutex_lock(&ca__nvtx_lock);
  ca__nvtx_region *r = NULL;
  HASH_FIND(hh, ca__regions, &addr, sizeof(addr), r);
  if (r != NULL) {
    nvtxMemRegionRef_t ref = {.pointer = (const void *)(uintptr_t)addr};
    nvtxMemRegionsUnregisterBatch_t batch = {
        .extCompatID = NVTX_EXT_COMPATID_MEM,
        .structSize = sizeof(batch),
        .refType = NVTX_MEM_REGION_REF_TYPE_POINTER,
        .refCount = 1,
        .refElementSize = sizeof(ref),
        .refElements = &ref};
    nvtxMemRegionsUnregister(ca__dom(), &batch);
    HASH_DEL(ca__regions, r);
    ca_meta_free(r, sizeof(*r));
  }
  pthread_mutex_unlock(&ca__nvtx_lock);
}

void ca_nvtx_heap_remove(uint64_t base) {
  if (!ca_nvtx_attached())
    return;
  pthread_mutex_lock(&ca__nvtx_lock);
  ca__nvtx_heap *h = NULL;
  HASH_FIND(hh, ca__heaps, &base, sizeof(base), h);
  if (h != NULL) {
    nvtxMemHeapUnregister(ca__dom(), h->handle);
    HASH_DEL(ca__heaps, h);
    ca_meta_free(h, sizeof(*h));
  }
  pthread_mutex_unlock(&ca__nvtx_lock);
}
