/*
 * slot_trace: records the allocations and frees PyTorch makes through its
 * allocator slot (torch.cuda.memory.CUDAPluggableAllocator), with the stream
 * each one names, so that bench_replay can replay a multi-stream program
 * with every request and free on its own stream (`+stream`).
 *
 * On a GPU machine, from the repository root (PyTorch, torchvision, CUDA
 * toolkit, cmake and gcc installed; uthash in .deps/include):
 *
 *   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo \
 *     -DCUDALLOC_UTHASH_DIR="$PWD/.deps/include" >/dev/null &&
 *   cmake --build build-gpu --target slot_trace -j "$(nproc)" >/dev/null &&
 *   CUDALLOC_TRACE_OUT=/tmp/resnet50-sidestream.trace python3 \
 *     tests/bench/sidestream_step.py \
 *     --plug build-gpu/tests/bench/libslot_trace.so &&
 *   gzip -9c /tmp/resnet50-sidestream.trace \
 *     > "$OUT/resnet50-sidestream.trace.gz"
 *
 * A tool, not part of the library: it serves each request with the driver
 * itself (cuMemAlloc, cuMemFree), so the program runs as under
 * PYTORCH_NO_CUDA_MEMORY_CACHING=1 and the trace holds the program's own
 * requests, not a cache's. No CUDA library is linked: the driver is found
 * in the process at the first call (PyTorch has loaded it by then).
 *
 * Each line is one call that succeeded, in the order the calls returned
 * (trace_alloc.c's format with one more column, so its readers still read
 * it):
 *   a <address> <bytes> <thread> <stream>   an allocation
 *   f <address> <thread> <stream>           a free
 *   r <address> <stream>                    record_stream: the block is used
 *                                           on <stream> too
 * Addresses are hexadecimal; threads small numbers in order of first use;
 * streams small numbers too: 0 is the legacy stream (handle 0, PyTorch's
 * default stream), the others 1, 2, ... in order of first use. The device
 * is not recorded: the traces are of one device.
 *
 * The functions PyTorch calls (names given to CUDAPluggableAllocator):
 *   slot_trace_alloc, slot_trace_free; slot_trace_record through
 *   allocator().set_record_stream_fn (see sidestream_step.py); and
 *   slot_trace_flush, which writes out what is buffered.
 */
#ifndef _GNU_SOURCE /* RTLD_DEFAULT; the build defines it already */
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <driver_types.h> /* cudaStream_t, as PyTorch passes it */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h> /* ssize_t, CUDAPluggableAllocator's size type */

/* What PyTorch looks up by name: the build hides every other symbol. */
#define SLOT_TRACE_API __attribute__((visibility("default")))

/* The driver's functions, found once. Versioned names (cuda.h maps the
 * plain ones onto them as macros, which dlsym does not see). */
static struct {
  __typeof__(&cuInit) init;
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuDevicePrimaryCtxRetain) primary_retain;
  __typeof__(&cuCtxGetCurrent) ctx_get;
  __typeof__(&cuCtxPushCurrent) ctx_push;
  __typeof__(&cuCtxPopCurrent) ctx_pop;
  __typeof__(&cuMemAlloc) mem_alloc;
  __typeof__(&cuMemFree) mem_free;
} slot_trace_drv;

static pthread_once_t slot_trace_drv_once = PTHREAD_ONCE_INIT;

static void *slot_trace_sym(void *lib, const char *name) {
  /* libcuda may have been opened RTLD_LOCAL (the runtime does so), where
   * RTLD_DEFAULT cannot see it; its own handle always can. */
  void *f = lib ? dlsym(lib, name) : NULL;
  if (f == NULL)
    f = dlsym(RTLD_DEFAULT, name);
  if (f == NULL) {
    fprintf(stderr, "slot_trace: the driver's %s not found\n", name);
    abort(); /* PyTorch would use a NULL block unchecked: stop here */
  }
  return f;
}

static void slot_trace_find_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
#define SLOT_TRACE_FIND(field, name)                                           \
  slot_trace_drv.field =                                                       \
      (__typeof__(slot_trace_drv.field))slot_trace_sym(lib, name)
  SLOT_TRACE_FIND(init, "cuInit");
  SLOT_TRACE_FIND(device_get, "cuDeviceGet");
  SLOT_TRACE_FIND(primary_retain, "cuDevicePrimaryCtxRetain");
  SLOT_TRACE_FIND(ctx_get, "cuCtxGetCurrent");
  SLOT_TRACE_FIND(ctx_push, "cuCtxPushCurrent_v2");
  SLOT_TRACE_FIND(ctx_pop, "cuCtxPopCurrent_v2");
  SLOT_TRACE_FIND(mem_alloc, "cuMemAlloc_v2");
  SLOT_TRACE_FIND(mem_free, "cuMemFree_v2");
#undef SLOT_TRACE_FIND
  slot_trace_drv.init(0); /* done already by PyTorch; harmless again */
}

/* One lock for the file, the stream numbers, the contexts, and each
 * driver call with its line: held across the call, so that a free's line
 * is written before another thread can be handed the same address (the
 * replay would read an address allocated twice otherwise). Recording
 * needs the order, not the speed. */
static pthread_mutex_t slot_trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *slot_trace_file;
static int slot_trace_failed_open;

/* Opens the trace on first use; NULL (recording nothing) without a path. */
static FILE *slot_trace_out(void) {
  if (slot_trace_file == NULL && !slot_trace_failed_open) {
    const char *path = getenv("CUDALLOC_TRACE_OUT");
    if (path != NULL)
      slot_trace_file = fopen(path, "w");
    if (slot_trace_file == NULL) {
      slot_trace_failed_open = 1;
      fprintf(stderr, "slot_trace: %s: recording nothing\n",
              path ? "cannot open CUDALLOC_TRACE_OUT"
                   : "CUDALLOC_TRACE_OUT unset");
      return NULL;
    }
    setvbuf(slot_trace_file, NULL, _IOFBF, 1 << 20);
  }
  return slot_trace_file;
}

static atomic_int slot_trace_threads;
static _Thread_local int slot_trace_thread_id = -1;

static int slot_trace_thread(void) {
  if (slot_trace_thread_id < 0)
    slot_trace_thread_id = atomic_fetch_add(&slot_trace_threads, 1);
  return slot_trace_thread_id;
}

/* Stream handles in order of first use; the number of a handle is its
 * index + 1, and the legacy stream (handle 0) is 0, so that PyTorch's
 * default stream reads the same in every trace. Few streams are ever
 * used, so a list searched in order does. Under slot_trace_lock. */
static uintptr_t *slot_trace_streams;
static size_t slot_trace_nstreams, slot_trace_cap;

static unsigned long slot_trace_stream_id(cudaStream_t stream) {
  uintptr_t h = (uintptr_t)stream;
  if (h == 0)
    return 0;
  for (size_t i = 0; i < slot_trace_nstreams; i++)
    if (slot_trace_streams[i] == h)
      return (unsigned long)i + 1;
  if (slot_trace_nstreams == slot_trace_cap) {
    size_t cap = slot_trace_cap ? 2 * slot_trace_cap : 16;
    uintptr_t *grown = realloc(slot_trace_streams, cap * sizeof(*grown));
    if (grown == NULL) {
      fprintf(stderr, "slot_trace: out of host memory\n");
      abort(); /* a trace with a wrong stream would mislead the replay */
    }
    slot_trace_streams = grown;
    slot_trace_cap = cap;
  }
  slot_trace_streams[slot_trace_nstreams++] = h;
  return (unsigned long)slot_trace_nstreams;
}

/* Each device's primary context, retained once (never released: the
 * process ends first). PyTorch calls the slot from threads whose current
 * context may be none (autograd's backward thread), and the driver's
 * cuMemAlloc needs one; PyTorch's own tensors live in the primary one.
 * Under slot_trace_lock. */
#define SLOT_TRACE_DEVICES 64
static CUcontext slot_trace_primary[SLOT_TRACE_DEVICES];

/* Makes `device`'s primary context current for a driver call; *pushed
 * says whether slot_trace_leave must pop it. */
static CUresult slot_trace_enter(int device, int *pushed) {
  *pushed = 0;
  if (device < 0 || device >= SLOT_TRACE_DEVICES)
    return CUDA_ERROR_INVALID_DEVICE;
  CUresult r = CUDA_SUCCESS;
  if (slot_trace_primary[device] == NULL) {
    CUdevice dev;
    r = slot_trace_drv.device_get(&dev, device);
    if (r == CUDA_SUCCESS)
      r = slot_trace_drv.primary_retain(&slot_trace_primary[device], dev);
    if (r != CUDA_SUCCESS)
      return r;
  }
  CUcontext cur = NULL;
  r = slot_trace_drv.ctx_get(&cur);
  if (r == CUDA_SUCCESS && cur != slot_trace_primary[device]) {
    r = slot_trace_drv.ctx_push(slot_trace_primary[device]);
    *pushed = r == CUDA_SUCCESS;
  }
  return r;
}

static void slot_trace_leave(int pushed) {
  CUcontext popped;
  if (pushed)
    slot_trace_drv.ctx_pop(&popped);
}

SLOT_TRACE_API void *slot_trace_alloc(ssize_t size, int device,
                                      cudaStream_t stream) {
  /* PyTorch asks for 0 bytes at times (empty tensors); the driver refuses
   * those, and NULL is what PyTorch expects for them. */
  if (size <= 0)
    return NULL;
  pthread_once(&slot_trace_drv_once, slot_trace_find_driver);
  int tid = slot_trace_thread(), pushed;
  CUdeviceptr p = 0;
  pthread_mutex_lock(&slot_trace_lock);
  CUresult r = slot_trace_enter(device, &pushed);
  if (r == CUDA_SUCCESS) {
    r = slot_trace_drv.mem_alloc(&p, (size_t)size);
    slot_trace_leave(pushed);
  }
  FILE *f = r == CUDA_SUCCESS ? slot_trace_out() : NULL;
  if (f != NULL)
    fprintf(f, "a %llx %lld %d %lu\n", (unsigned long long)p, (long long)size,
            tid, slot_trace_stream_id(stream));
  pthread_mutex_unlock(&slot_trace_lock);
  if (r != CUDA_SUCCESS) {
    /* PyTorch hands the pointer to kernels unchecked: a NULL would fail
     * far from here. The recording is over either way. */
    fprintf(stderr, "slot_trace: cuMemAlloc of %lld bytes on device %d "
            "failed (CUresult %d)\n", (long long)size, device, (int)r);
    abort();
  }
  return (void *)(uintptr_t)p;
}

SLOT_TRACE_API void slot_trace_free(void *ptr, ssize_t size, int device,
                                    cudaStream_t stream) {
  (void)size;
  if (ptr == NULL)
    return;
  pthread_once(&slot_trace_drv_once, slot_trace_find_driver);
  int tid = slot_trace_thread(), pushed;
  pthread_mutex_lock(&slot_trace_lock);
  CUresult r = slot_trace_enter(device, &pushed);
  if (r == CUDA_SUCCESS) {
    r = slot_trace_drv.mem_free((CUdeviceptr)(uintptr_t)ptr);
    slot_trace_leave(pushed);
  }
  FILE *f = r == CUDA_SUCCESS ? slot_trace_out() : NULL;
  if (f != NULL)
    fprintf(f, "f %llx %d %lu\n", (unsigned long long)(uintptr_t)ptr, tid,
            slot_trace_stream_id(stream));
  pthread_mutex_unlock(&slot_trace_lock);
  if (r != CUDA_SUCCESS) /* a free is not worth stopping the program for */
    fprintf(stderr, "slot_trace: cuMemFree of %p failed (CUresult %d)\n", ptr,
            (int)r);
}

/* PyTorch's record_stream hook (CUDAPluggableAllocator's
 * set_record_stream_fn): `ptr` is the block's start, as the slot handed it
 * out. Nothing to do but note it: the driver's cuMemFree waits for all
 * work anyway. */
SLOT_TRACE_API void slot_trace_record(void *ptr, cudaStream_t stream) {
  pthread_mutex_lock(&slot_trace_lock);
  FILE *f = slot_trace_out();
  if (f != NULL)
    fprintf(f, "r %llx %lu\n", (unsigned long long)(uintptr_t)ptr,
            slot_trace_stream_id(stream));
  pthread_mutex_unlock(&slot_trace_lock);
}

/* Writes out what is buffered: the driver script calls it at its end, so
 * that the trace is whole even if the process then ends without running
 * the C library's exit (os._exit, a crash in teardown). */
SLOT_TRACE_API void slot_trace_flush(void) {
  pthread_mutex_lock(&slot_trace_lock);
  if (slot_trace_file != NULL)
    fflush(slot_trace_file);
  pthread_mutex_unlock(&slot_trace_lock);
}
