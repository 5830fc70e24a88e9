/*
 * The driver calls that describe an allocation, answered for pooled blocks
 * (see pointer.h). The driver's own answers these follow were measured on
 * an H200 (driver 580) and are diffed against the mock's in
 * tests/mockcuda/driver_facts.txt.
 */
#include "policy/pointer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "support/config.h"
#include "driver/driver.h"
#include "support/grow.h"
#include "support/log.h"
#include "registry/registry.h"

/* Where a pointer lies. */
typedef enum ca__where {
  CA__NOT_POOLED, /* the driver's business */
  CA__IN_NO_BLOCK, /* a pooled segment's free bytes: no allocation's */
  CA__IN_BLOCK,   /* a live block's requested bytes */
} ca__where;

static ca__where ca__locate(CUdeviceptr ptr, ca_registry_span *at) {
  if (!ca_config_get()->enabled || !ca_registry_find((uint64_t)ptr, at))
    return CA__NOT_POOLED;
  return at->span.live ? CA__IN_BLOCK : CA__IN_NO_BLOCK;
}

/* The driver numbers its buffers from small numbers up; a block's id keeps
 * the top bit set, so it never meets one of the driver's, and is unique
 * per block for the process's life: its pool's slot (never reused) and its
 * allocation number in that pool. */
static uint64_t ca__buffer_id(const ca_registry_span *at) {
  return (1ull << 63) | ((uint64_t)at->slot << 40) |
         (at->span.block.seq & ((1ull << 40) - 1));
}

/* ------------------------------------------------------------------------ */
/* SYNC_MEMOPS                                                               */

/* The driver keeps SYNC_MEMOPS per allocation (set on one, it stays off on
 * the allocation beside it). A block's is its own, kept here for the blocks
 * that have it on; its segment's, set through the driver, is on while any
 * block of the segment has it on, so every block that asked gets
 * synchronous memory operations (the others get them too: slower, never
 * wrong). Entries name the block's buffer id too, so one left over from a
 * context that died never matches a new block at the same address. */
typedef struct ca__sync {
  uint64_t block, segment, id;
} ca__sync;

static ca__sync *ca__syncs;
static size_t ca__nsyncs_held, ca__syncs_cap;
static atomic_size_t ca__nsyncs;
static pthread_mutex_t ca__syncs_lock = PTHREAD_MUTEX_INITIALIZER;

/* Under the lock: the entry of the block, or -1. */
static long ca__sync_find(uint64_t block, uint64_t id) {
  for (size_t i = 0; i < ca__nsyncs_held; i++)
    if (ca__syncs[i].block == block && (id == 0 || ca__syncs[i].id == id))
      return (long)i;
  return -1;
}

static bool ca__segment_syncs(uint64_t segment) {
  for (size_t i = 0; i < ca__nsyncs_held; i++)
    if (ca__syncs[i].segment == segment)
      return true;
  return false;
}

static int ca__sync_of(const ca_registry_span *at) {
  if (atomic_load_explicit(&ca__nsyncs, memory_order_relaxed) == 0)
    return 0;
  pthread_mutex_lock(&ca__syncs_lock);
  int on = ca__sync_find(at->span.block.addr, ca__buffer_id(at)) >= 0;
  pthread_mutex_unlock(&ca__syncs_lock);
  return on;
}

/* Under the lock: the driver's SYNC_MEMOPS of `segment`, after an entry
 * came or went (`was`: whether the segment had one before). */
static CUresult ca__segment_sync_update(uint64_t segment, bool was) {
  int now = ca__segment_syncs(segment);
  atomic_store_explicit(&ca__nsyncs, ca__nsyncs_held, memory_order_relaxed);
  if (now == (int)was)
    return CUDA_SUCCESS;
  return CA_REAL(pointer_set_attribute, &now, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
                 (CUdeviceptr)segment);
}

static bool ca__sync_add(const ca_registry_span *at) {
  if (ca__nsyncs_held == ca__syncs_cap) {
    ca__sync *v = ca_grow(ca__syncs, &ca__syncs_cap, sizeof(*v));
    if (!v)
      return false;
    ca__syncs = v;
  }
  ca__syncs[ca__nsyncs_held++] = (ca__sync){
      at->span.block.addr, at->span.segment, ca__buffer_id(at)};
  return true;
}

static void ca__sync_remove(long i) {
  ca__syncs[i] = ca__syncs[--ca__nsyncs_held];
}

/* Turns the block's SYNC_MEMOPS on or off. */
static CUresult ca__sync_set(const ca_registry_span *at, bool on) {
  pthread_mutex_lock(&ca__syncs_lock);
  bool was = ca__segment_syncs(at->span.segment);
  long i = ca__sync_find(at->span.block.addr, ca__buffer_id(at));
  CUresult r = CUDA_SUCCESS;
  if (on && i < 0 && !ca__sync_add(at))
    r = CUDA_ERROR_OUT_OF_MEMORY;
  else if (!on && i >= 0)
    ca__sync_remove(i);
  if (r == CUDA_SUCCESS)
    r = ca__segment_sync_update(at->span.segment, was);
  pthread_mutex_unlock(&ca__syncs_lock);
  return r;
}

void ca_pointer_freed(uint64_t addr) {
  if (atomic_load_explicit(&ca__nsyncs, memory_order_relaxed) == 0)
    return;
  pthread_mutex_lock(&ca__syncs_lock);
  long i = ca__sync_find(addr, 0);
  if (i >= 0) {
    uint64_t segment = ca__syncs[i].segment;
    ca__sync_remove(i);
    ca__segment_sync_update(segment, true);
  }
  pthread_mutex_unlock(&ca__syncs_lock);
}

/* ------------------------------------------------------------------------ */
/* CUDA IPC                                                                  */

/* The driver's IPC handle, as measured (driver_facts.txt): bytes 16..23
 * hold the size of the range the importer maps, bytes 28..31 its offset in
 * the driver's mapping, and the importing driver opens exactly that range
 * at the pointer it returns (a handle of an interior pointer is the
 * allocation's own, byte for byte). So a block's handle is its segment's
 * with the two fields naming the block: an importer with or without this
 * library gets the block's bytes, and an address range of the block. The
 * importing driver does not check the fields (a range past the mapping's
 * end opens as a pointer to nothing), so they are written only when the
 * segment's handle reads as measured. */
#define CA__IPC_SIZE_AT 16
#define CA__IPC_OFFSET_AT 28

static uint64_t ca__ipc_field(const CUipcMemHandle *h, int at, size_t n) {
  uint64_t v = 0;
  memcpy(&v, h->reserved + at, n);
  return v;
}

/* The segment's offset in the driver's mapping, or UINT64_MAX when the
 * driver cannot say. */
static uint64_t ca__mapping_offset(uint64_t segment) {
  CUdeviceptr base = 0;
  if (CA_REAL(pointer_get_attribute, &base,
              CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
              (CUdeviceptr)segment) != CUDA_SUCCESS ||
      base > segment)
    return UINT64_MAX;
  return segment - base;
}

/* Whether a block at `offset` into its segment can be named by a handle:
 * the offset field holds 32 bits. max_split_size_mb at or below 4096 keeps
 * every block within 4 GiB of its segment's start (merged segments stay
 * below it; larger requests get a segment of their own). */
static bool ca__exportable(const ca_registry_span *at) {
  return at->span.block.addr - at->span.segment < (1ull << 32);
}

static CUresult ca__refuse_export(CUdeviceptr dptr, const ca_registry_span *at,
                                  const char *why, const char *fix) {
  ca_log("cuIpcGetMemHandle(%#llx) refused: the pooled block (%llu bytes, "
         "%llu bytes into its segment %#llx) %s, so an importer could map "
         "another block's bytes; %s",
         (unsigned long long)dptr, (unsigned long long)at->span.block.requested,
         (unsigned long long)(at->span.block.addr - at->span.segment),
         (unsigned long long)at->span.segment, why, fix);
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* The handle of the block: its segment's, naming the block's range. */
static CUresult ca__block_handle(CUdeviceptr dptr, const ca_registry_span *at,
                                 CUipcMemHandle *out) {
  CUipcMemHandle h;
  CUresult r = CA_REAL(ipc_get_mem_handle, &h, (CUdeviceptr)at->span.segment);
  if (r != CUDA_SUCCESS)
    return r;
  uint64_t base = ca__mapping_offset(at->span.segment);
  if (!ca__exportable(at))
    return ca__refuse_export(dptr, at, "lies 4 GiB or more into it",
                             "set CUDALLOC_CONF=max_split_size_mb:4096 (or "
                             "less) to keep blocks within 4 GiB of their "
                             "segment's start");
  uint64_t offset = base + (at->span.block.addr - at->span.segment);
  if (base == UINT64_MAX || offset >= (1ull << 32) ||
      ca__ipc_field(&h, CA__IPC_SIZE_AT, 8) != at->span.segment_size ||
      ca__ipc_field(&h, CA__IPC_OFFSET_AT, 4) != base)
    return ca__refuse_export(dptr, at,
                             "cannot be named: this driver's IPC handle is "
                             "not laid out as measured",
                             "set CUDALLOC_CONF=enabled:0 in the exporting "
                             "process to export its allocations");
  uint32_t off32 = (uint32_t)offset;
  uint64_t size = at->span.block.requested;
  memcpy(h.reserved + CA__IPC_SIZE_AT, &size, 8);
  memcpy(h.reserved + CA__IPC_OFFSET_AT, &off32, 4);
  *out = h;
  return CUDA_SUCCESS;
}

/* Memory mapped into a reserved range has no legacy IPC handle: the driver
 * refuses it (driver_facts.txt), so a block of an expandable segment is
 * refused too, with the reason and the way out. */
static CUresult ca__refuse_mapped(CUdeviceptr dptr, const ca_registry_span *at) {
  ca_log("cuIpcGetMemHandle(%#llx) refused: the pooled block (%llu bytes) "
         "lies in an expandable segment, memory mapped with the driver's "
         "virtual-memory API, which CUDA IPC cannot export; set "
         "CUDALLOC_CONF=expandable_segments:0 in a process that shares its "
         "allocations through CUDA IPC",
         (unsigned long long)dptr, (unsigned long long)at->span.block.requested);
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult ca_on_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr) {
  ca_registry_span at;
  ca__where w = ca__locate(dptr, &at);
  if (w == CA__NOT_POOLED || handle == NULL)
    return CA_REAL(ipc_get_mem_handle, handle, dptr);
  if (w == CA__IN_NO_BLOCK)
    return CUDA_ERROR_INVALID_VALUE; /* as for a freed pointer */
  if (at.span.expandable)
    return ca__refuse_mapped(dptr, &at);
  CUipcMemHandle h;
  CUresult r = ca__block_handle(dptr, &at, &h);
  if (r != CUDA_SUCCESS)
    return r;
  /* Another process may map it from now on: its bytes never come back. */
  if (!ca_pool_share(at.pool, at.span.block.addr))
    return CUDA_ERROR_INVALID_VALUE; /* freed meanwhile */
  *handle = h;
  return CUDA_SUCCESS;
}

/* A dma-buf of a range: only of a range inside the block, as the driver
 * allows only one inside an allocation. The block's bytes never come back
 * once freed (a device or process may still map them). */
CUresult ca_on_mem_get_handle_for_address_range(void *handle, CUdeviceptr dptr,
                                                size_t size,
                                                CUmemRangeHandleType type,
                                                unsigned long long flags) {
  ca_registry_span at;
  ca__where w = ca__locate(dptr, &at);
  if (w == CA__NOT_POOLED)
    return CA_REAL(mem_get_handle_for_address_range, handle, dptr, size, type,
                   flags);
  uint64_t end = at.span.block.addr + at.span.block.requested;
  if (w == CA__IN_NO_BLOCK || size > end - (uint64_t)dptr)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = CA_REAL(mem_get_handle_for_address_range, handle, dptr, size,
                       type, flags);
  if (r == CUDA_SUCCESS)
    ca_pool_share(at.pool, at.span.block.addr);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Address ranges and attributes                                             */

/* Whether the driver still sees the segment where the pool does: when not,
 * it was freed behind the library's back, and the driver's answer about
 * what lies there now is the only true one. A page of an expandable
 * segment is its own mapping to the driver (driver_facts.txt), which no
 * cuMemFree can free: mapped is alive. */
static bool ca__segment_alive(CUdeviceptr ptr, const ca_registry_span *at) {
  CUdeviceptr base = 0;
  return CA_REAL(mem_get_address_range, &base, NULL, ptr) == CUDA_SUCCESS &&
         (base == at->span.segment || at->span.expandable);
}

CUresult ca_on_mem_get_address_range(CUdeviceptr *base, size_t *size,
                                     CUdeviceptr dptr) {
  ca_registry_span at;
  ca__where w = ca__locate(dptr, &at);
  if (w == CA__IN_NO_BLOCK)
    return CUDA_ERROR_NOT_FOUND;
  if (w == CA__NOT_POOLED || !ca__segment_alive(dptr, &at))
    return CA_REAL(mem_get_address_range, base, size, dptr);
  if (base)
    *base = (CUdeviceptr)at.span.block.addr;
  if (size)
    *size = (size_t)at.span.block.requested;
  return CUDA_SUCCESS;
}

/* Writes an attribute as the driver does: 4 bytes for the flags, 8 for
 * addresses, sizes and ids. */
static void ca__attribute_put(void *data, CUpointer_attribute a, uint64_t v) {
  if (a == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ||
      a == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) {
    uint32_t x = (uint32_t)v;
    memcpy(data, &x, 4);
  } else {
    memcpy(data, &v, 8);
  }
}

/* Rewrites the driver's answer about the segment (already in *data) where
 * the block's differs: every other attribute (context, device, memory type,
 * access, mapping) is the segment's and the block's alike. The driver's
 * documented side effect of P2P_TOKENS, SYNC_MEMOPS set, becomes the
 * block's. */
static void ca__patch(const ca_registry_span *at, CUpointer_attribute a,
                      void *data) {
  uint32_t driver = 0;
  switch (a) {
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    ca__attribute_put(data, a, at->span.block.addr);
    break;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    ca__attribute_put(data, a, at->span.block.requested);
    break;
  case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    ca__attribute_put(data, a, ca__buffer_id(at));
    break;
  case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    ca__attribute_put(data, a, (uint64_t)ca__sync_of(at));
    break;
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    memcpy(&driver, data, 4);
    ca__attribute_put(data, a, driver && ca__exportable(at));
    break;
  case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
    ca__sync_set(at, true);
    break;
  default:
    break;
  }
}

CUresult ca_on_pointer_get_attribute(void *data, CUpointer_attribute attribute,
                                     CUdeviceptr ptr) {
  ca_registry_span at;
  ca__where w = ca__locate(ptr, &at);
  if (w == CA__NOT_POOLED)
    return CA_REAL(pointer_get_attribute, data, attribute, ptr);
  if (w == CA__IN_NO_BLOCK || data == NULL)
    return CUDA_ERROR_INVALID_VALUE; /* as for any pointer no allocation's */
  CUresult r = CA_REAL(pointer_get_attribute, data, attribute, ptr);
  if (r == CUDA_SUCCESS)
    ca__patch(&at, attribute, data);
  return r;
}

/* The list one attribute at a time, stopping at the first the driver
 * refuses, as it does itself (entries before it written, none after). */
static CUresult ca__attributes_each(const ca_registry_span *at, unsigned int n,
                                    CUpointer_attribute *attributes,
                                    void **data, CUdeviceptr ptr) {
  for (unsigned int i = 0; i < n; i++) {
    CUresult r = CA_REAL(pointer_get_attributes, 1, &attributes[i], &data[i],
                         at ? ptr : 0);
    if (r != CUDA_SUCCESS)
      return r;
    if (at)
      ca__patch(at, attributes[i], data[i]);
    else if (attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER)
      memcpy(data[i], &ptr, sizeof(ptr));
  }
  return CUDA_SUCCESS;
}

/* In a pooled segment's free bytes, the driver's "not a CUDA pointer"
 * answers: those it gives for address 0, which are the same but for
 * HOST_POINTER, the pointer itself (measured) -- so `at` NULL above. */
CUresult ca_on_pointer_get_attributes(unsigned int n,
                                      CUpointer_attribute *attributes,
                                      void **data, CUdeviceptr ptr) {
  ca_registry_span at;
  ca__where w = ca__locate(ptr, &at);
  if (w == CA__NOT_POOLED || n == 0 || attributes == NULL || data == NULL)
    return CA_REAL(pointer_get_attributes, n, attributes, data, ptr);
  if (w == CA__IN_NO_BLOCK)
    return ca__attributes_each(NULL, n, attributes, data, ptr);
  CUresult r = CA_REAL(pointer_get_attributes, n, attributes, data, ptr);
  if (r != CUDA_SUCCESS) /* refused somewhere: find where, as it did */
    return ca__attributes_each(&at, n, attributes, data, ptr);
  for (unsigned int i = 0; i < n; i++)
    if (data[i] != NULL)
      ca__patch(&at, attributes[i], data[i]);
  return r;
}

/* Only SYNC_MEMOPS can be set (the driver refuses the rest, pooled or not). */
CUresult ca_on_pointer_set_attribute(const void *value,
                                     CUpointer_attribute attribute,
                                     CUdeviceptr ptr) {
  ca_registry_span at;
  ca__where w = ca__locate(ptr, &at);
  if (w == CA__NOT_POOLED || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
    return CA_REAL(pointer_set_attribute, value, attribute, ptr);
  if (w == CA__IN_NO_BLOCK || value == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  int on = 0;
  memcpy(&on, value, sizeof(on));
  return ca__sync_set(&at, on != 0);
}
