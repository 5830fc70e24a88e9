/*
 * mockcuda's insides, shared by its files: the simulated device memory and
 * the helpers every call starts with. mockcuda.c holds the core (devices,
 * contexts, streams, events, allocations, cuGetProcAddress);
 * mockcuda_copy.c the memsets and copies; mockcuda_pointer.c the pointer
 * queries (attributes, address ranges); mockcuda_ipc.c CUDA IPC;
 * mockcuda_vmm.c the virtual-memory API; mockcuda_gpu.c devices shared by
 * processes; mockcuda_kernels.c modules and launches. Nothing here is
 * exported from the library.
 */
#ifndef MOCKCUDA_INTERNAL_H
#define MOCKCUDA_INTERNAL_H

/* Declares every variant the driver exports (_v2, _ptsz, _ptds and the
 * legacy names), as the driver's own build does. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <stdint.h>

#include "mockcuda.h"

#define MOCK_HIDDEN __attribute__((visibility("hidden")))

#define MOCK_MAX_DEVICES 16
#define MOCK_SMALL_ALIGN 512ull
#define MOCK_LARGE (2ull << 20)      /* granularity; alignment above: */
#define MOCK_PACKED_MAX (1ull << 20) /* cuMemAlloc packs sizes up to this at 512 B */

enum { MOCK_KIND_ALLOC, MOCK_KIND_PITCH, MOCK_KIND_MANAGED, MOCK_KIND_ASYNC,
       MOCK_KIND_POOL_ASYNC, MOCK_KIND_IMPORTED, MOCK_KIND_MAPPED };

/* Handles the program sees are pointers to these: validity is checked by
 * looking the pointer up in the object list, never by reading through it. */
typedef struct mock_obj {
  struct mock_obj *next;
  int type;
} mock_obj;

struct CUctx_st {
  mock_obj hdr;
  int device;
  int primary;
  int alive; /* a primary context is alive while retained */
  unsigned refcount;
};

/* What an allocation holds when its bytes are shared with other processes:
 * exported allocations live in a memfd (another process maps it through
 * /proc/<pid>/fd), imported ones are a mapping of the exporter's. */
typedef struct mock_shared {
  int fd;            /* exported: the memfd; -1 for an import */
  unsigned char *map; /* the whole mapping */
  uint64_t map_len;
  /* Imports: who exported it, which of its allocations, which range. */
  uint64_t pid, block, offset, size;
  unsigned refcount;
} mock_shared;

typedef struct mock_alloc {
  uint64_t addr;
  uint64_t size;  /* as requested: copies and memsets must stay inside */
  uint64_t span;  /* rounded: what capacity and address space are charged */
  unsigned char *host;
  CUcontext ctx;  /* freed with it */
  int kind;
  uint64_t id;      /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused */
  int sync_memops;  /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS */
  mock_shared *shared; /* exported or imported; NULL otherwise */
  /* MAPPED (mockcuda_vmm.c): a cuMemMap of a reserved range; addr and size
   * are the mapping's, these the range's. */
  uint64_t range_addr, range_size;
  int range_device;
} mock_alloc;

typedef struct mock_device {
  uint64_t va_base, va_end; /* reserved PROT_NONE range addresses come from */
  uint64_t used;
  mock_alloc *allocs; /* sorted by addr, never overlapping */
  size_t n, cap;
  struct CUctx_st primary;
} mock_device;

/* Everything runs under one mutex (mockcuda.c says why). */
MOCK_HIDDEN void mock_lock(void);
MOCK_HIDDEN void mock_unlock(void);
MOCK_HIDDEN void mock_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
MOCK_HIDDEN uint64_t mock_round_up(uint64_t x, uint64_t a);

/* Under the lock. */
MOCK_HIDDEN extern mock_device g_dev[MOCK_MAX_DEVICES];
MOCK_HIDDEN extern int g_ndev;
MOCK_HIDDEN extern uint64_t g_capacity; /* bytes per device */
MOCK_HIDDEN extern mockcuda_counters g_cnt;
MOCK_HIDDEN CUresult mock_need_init(void);
MOCK_HIDDEN CUresult mock_need_ctx(CUcontext *out);
/* How most stream-ordered calls begin, in this order: a current context,
 * then `arg_rc` (the call's own argument check), then the stream. */
MOCK_HIDDEN CUresult mock_need_ctx_stream(CUstream hs, int ptsz, CUresult arg_rc, CUcontext *c,
                                          CUstream *s);
/* The allocation of any device holding [p, p+n) (n == 0: holding p). */
MOCK_HIDDEN mock_alloc *mock_find(uint64_t p, uint64_t n, mock_device **dev_out);
/* A free range of `span` bytes, aligned to `align`, in device `dev`'s
 * address space, recorded as an allocation (capacity not charged: the
 * caller does that where the memory is its own). NULL when none is left. */
MOCK_HIDDEN mock_alloc *mock_place(int dev, uint64_t span, uint64_t align);
/* Forgets an allocation and gives its memory back. */
MOCK_HIDDEN void mock_remove(mock_device *dv, mock_alloc *a);
/* The mapping of a reserved range holding [p, p+n), mapped and open to
 * the device throughout (mockcuda_vmm.c); NULL if none. */
MOCK_HIDDEN mock_alloc *mock_vmm_find(uint64_t p, uint64_t n, mock_device **dev_out);
/* Whether p lies in a reserved range, mapped or not (mockcuda_vmm.c). */
MOCK_HIDDEN int mock_vmm_reserved(uint64_t p);
/* Releases what an exported or imported allocation holds (mockcuda_ipc.c). */
MOCK_HIDDEN void mock_shared_release(mock_alloc *a);
/* Bytes in use on device `dev`: this process's, and with
 * MOCKCUDA_SHARED_MEM every living process's (mockcuda_gpu.c). */
MOCK_HIDDEN uint64_t mock_device_used(int dev);
/* This process's use of `dev` changed: the other processes see it. */
MOCK_HIDDEN void mock_device_changed(int dev);
/* The MEMORY_BLOCK_ID and mapping of an allocation: an exported one keeps
 * the id its handle names; an import reports its exporter's mapping. */
MOCK_HIDDEN void mock_mapping(const mock_alloc *a, uint64_t *base, uint64_t *size);

#endif /* MOCKCUDA_INTERNAL_H */
