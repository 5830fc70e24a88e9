/*
 * mockcuda: a fake libcuda.so.1 for machines without a GPU.
 *
 * It implements the subset of the driver API that cudalloc and its tests use,
 * with real semantics over simulated device memory: device addresses lie in a
 * reserved, inaccessible host address range (so a stray host dereference
 * faults, as on a GPU), each allocation is backed by a host buffer that
 * the cuMemset* / cuMemcpy* calls read and write (within the ranges the
 * measured driver allows), and capacity is enforced. Pointer queries
 * (attributes, address ranges) and CUDA IPC between processes answer as
 * the measured driver (driver_facts.txt): an exported allocation's bytes
 * move into a memfd that the importing process maps. The virtual-memory
 * API (reserve, create, map, set access, unmap) answers as measured too.
 *
 * Besides the driver's names it exports the mockcuda_ functions below, so a
 * test can see what the "driver" was asked (and make its events slow).
 * Programs find them with dlsym(RTLD_DEFAULT or the libcuda handle,
 * "mockcuda_get_counters") or link the mock directly.
 *
 * Environment: MOCKCUDA_DEVICES (default 2, 0 makes cuInit fail with
 * CUDA_ERROR_NO_DEVICE), MOCKCUDA_MEM_MB (capacity per device, default 1024),
 * MOCKCUDA_VERBOSE=1 (one line per call on stderr; silent otherwise),
 * MOCKCUDA_EVENT_DELAY (as mockcuda_set_event_delay, from cuInit on),
 * MOCKCUDA_VMM=0 (cuMemAddressReserve refuses: a driver without the
 * virtual-memory API), MOCKCUDA_SPAN_MB (the addresses reserved per device
 * to place allocations in; default 16 times the capacity, at least 64 GiB:
 * valgrind maps less, so the callgrind counts run with less),
 * MOCKCUDA_SHARED_MEM=FILE (every process naming FILE shares the devices'
 * memory, as the processes of one machine share its GPUs: mockcuda_gpu.c),
 * MOCKCUDA_JIT=0 (cuModuleLoadData refuses: a driver that cannot compile
 * PTX; the kernels the mock emulates: mockcuda_kernels.c), MOCKCUDA_PINNED=0
 * (cuMemHostAlloc refuses for memory: no page can be locked).
 */
#ifndef MOCKCUDA_H
#define MOCKCUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Calls are counted whether they succeed or not; `_ptsz` counters count the
 * per-thread-stream twin only, on top of the plain counter. */
typedef struct mockcuda_counters {
  uint64_t init;
  uint64_t get_proc_address;      /* cuGetProcAddress and _v2 */
  uint64_t mem_alloc;             /* cuMemAlloc_v2 */
  uint64_t mem_free;              /* cuMemFree_v2 */
  uint64_t mem_free_unknown;      /* ... of no live allocation's base */
  uint64_t alloc_pitch;           /* cuMemAllocPitch_v2 */
  uint64_t alloc_managed;         /* cuMemAllocManaged */
  uint64_t alloc_async;           /* cuMemAllocAsync(_ptsz) */
  uint64_t alloc_async_ptsz;
  uint64_t alloc_from_pool_async; /* cuMemAllocFromPoolAsync(_ptsz) */
  uint64_t alloc_from_pool_async_ptsz;
  uint64_t free_async;            /* cuMemFreeAsync(_ptsz) */
  uint64_t free_async_ptsz;
  uint64_t free_async_unknown;
  uint64_t mem_create;            /* cuMemCreate */
  uint64_t mem_release;           /* cuMemRelease */
  uint64_t get_info;              /* cuMemGetInfo_v2 */
  uint64_t get_address_range;     /* cuMemGetAddressRange_v2 */
  uint64_t pointer_attribute;     /* cuPointerGetAttribute(s) */
  uint64_t ipc_get;               /* cuIpcGetMemHandle */
  uint64_t ipc_open;              /* cuIpcOpenMemHandle(_v2) */
  uint64_t ipc_close;             /* cuIpcCloseMemHandle */
  uint64_t ipc_bad_range;         /* opens naming a range outside the
                                     exported mapping (the real driver maps
                                     garbage; the mock refuses) */
  uint64_t memset;                /* every cuMemset* export */
  uint64_t memcpy;                /* every cuMemcpy* export (a batch: one) */
  uint64_t module_load;           /* cuModuleLoadData */
  uint64_t launch_kernel;         /* cuLaunchKernel */
  uint64_t ctx_synchronize;
  uint64_t stream_synchronize;    /* cuStreamSynchronize(_ptsz) */
  uint64_t stream_is_capturing;   /* cuStreamIsCapturing(_ptsz) */
  uint64_t event_record;          /* cuEventRecord(_ptsz) */
  uint64_t event_query;
  uint64_t event_synchronize;
  uint64_t event_create;          /* cuEventCreate */
  uint64_t event_destroy;         /* cuEventDestroy_v2 */
  uint64_t event_not_ready;       /* queries answered CUDA_ERROR_NOT_READY */
  /* Records that succeeded, by the stream they went on: the legacy stream
   * (CU_STREAM_LEGACY, or 0 through the plain export), a per-thread default
   * stream, a created blocking or non-blocking stream. */
  uint64_t event_record_legacy;
  uint64_t event_record_per_thread;
  uint64_t event_record_blocking;
  uint64_t event_record_nonblocking;
  /* cuStreamWaitEvent calls that succeeded, by the stream made to wait. */
  uint64_t wait_event_legacy;
  uint64_t wait_event_nonblocking;
  uint64_t wait_event_other;
  uint64_t stream_create;         /* cuStreamCreate, cuStreamCreateWithPriority */
  uint64_t stream_destroy;        /* cuStreamDestroy(_v2) */
  uint64_t ptsz_calls;            /* any _ptsz / _ptds export */
  uint64_t capture_violations;    /* unsafe calls refused during a capture */
  uint64_t oom;                   /* allocations refused for capacity */
  /* State, not calls. */
  uint64_t live_allocs;           /* allocations with a device address */
  uint64_t live_bytes;            /* their sizes as requested */
  uint64_t used_bytes;            /* device memory taken, all devices (what
                                     cuMemGetInfo subtracts, rounded) */
  uint64_t peak_used_bytes;
  uint64_t live_handles;          /* cuMemCreate handles not released */
  uint64_t live_imports;          /* IPC imports not closed */
  uint64_t capacity_bytes;        /* per device */
  int devices;
} mockcuda_counters;

/* Copies the counters (zeroed before cuInit). Thread-safe. */
void mockcuda_get_counters(mockcuda_counters *out);

/* 1 when [ptr, ptr+size) lies inside one live mock allocation (size 0: ptr
 * itself does), else 0. */
int mockcuda_owns(uint64_t ptr, uint64_t size);

/* Events recorded from now on stay CUDA_ERROR_NOT_READY for `queries`
 * cuEventQuery calls each (a negative number: for every query), or until
 * cuEventSynchronize, a successful cuCtxSynchronize of their context or
 * cuStreamSynchronize of the stream they were recorded on: device work that
 * takes time, so a test can see that a block is not reused while a marker
 * recorded after its free is pending. 0 (the default): complete at once. */
void mockcuda_set_event_delay(int queries);

/* Records that succeeded on a live stream created by cuStreamCreate(WithPriority),
 * or on the legacy stream (CU_STREAM_LEGACY); 0 for any other handle. */
uint64_t mockcuda_stream_records(const void *stream);

/* A kernel's store or load of `n` bytes at device address `ptr`: no stream
 * order, no range rule of the driver's, only the one live allocation that
 * holds [ptr, ptr+n), as a kernel's access is bounded by the memory mapped
 * there. A store past a pooled block's end but inside its segment lands,
 * as on the GPU: the tests of a memory checker write into blocks with it.
 * 0, or -1 when no live allocation holds the range (a kernel would fault:
 * an illegal address) or it is empty. Thread-safe. */
int mockcuda_kernel_write(uint64_t ptr, const void *src, uint64_t n);
int mockcuda_kernel_read(uint64_t ptr, void *dst, uint64_t n);

/* The driver taking itself down, as the real one does from a handler
 * registered at cuInit, before a handler registered earlier (the library's
 * on_exit) runs: every later call fails with CUDA_ERROR_DEINITIALIZED
 * (docs: work at exit may find no driver). For a program's atexit. */
void mockcuda_shutdown(void);

typedef void (*mockcuda_get_counters_fn)(mockcuda_counters *out);
typedef int (*mockcuda_owns_fn)(uint64_t ptr, uint64_t size);
typedef int (*mockcuda_kernel_write_fn)(uint64_t ptr, const void *src, uint64_t n);
typedef int (*mockcuda_kernel_read_fn)(uint64_t ptr, void *dst, uint64_t n);
typedef void (*mockcuda_set_event_delay_fn)(int queries);
typedef uint64_t (*mockcuda_stream_records_fn)(const void *stream);

#ifdef __cplusplus
}
#endif

#endif /* MOCKCUDA_H */
