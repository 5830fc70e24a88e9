/*
 * slot_floor: the least an allocator in PyTorch's slot can cost, a floor to
 * set cudalloc's slot beside (scripts/bench-gpu.sh, part slot, setting
 * "floor"). Any allocator plugged in with
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "slot_floor_alloc",
 *                                            "slot_floor_free")
 * pays PyTorch's own bookkeeping around the pluggable interface (a mutex and
 * a hash-map insert and erase per block, a std::function call each way);
 * this one adds next to nothing to that, so a training step under it is as
 * fast as a step through the slot can be, and what cudalloc's step takes
 * beyond it is cudalloc's own. tests/bench/resnet_step.py, gpt2_step.py and
 * slot_steps.py plug it in with --plug PATH.
 *
 * How: one region, taken from the driver with cuMemAlloc at the first
 * request (SLOT_FLOOR_GIB GiB, 60 by default), handed out by bumping a
 * pointer; a freed block goes on a LIFO list of the blocks of exactly its
 * size (rounded up to 512 bytes, PyTorch's own granule), and the next
 * request of that size pops it. A training loop asks for the same sizes step
 * after step, so after its first step nearly every request is a pop: a table
 * probe and an array access under a spin lock, a few dozen instructions.
 * Nothing is split or merged and nothing goes back to the region: what it
 * holds is, for each size, the most blocks of that size ever live at once.
 * The lists' table is fixed (SLOT_FLOOR_SIZES sizes); a block of a size
 * that finds no room in it is dropped at its free (the region keeps it).
 *
 * NOT AN ALLOCATOR TO USE. It ignores streams: a block freed while kernels
 * queued on a stream may still use it is handed out again at once, to any
 * stream. That is right only when every kernel runs on one stream (the
 * benchmark's training steps), where the stream's own order puts the next
 * user's kernels after the old ones. It serves one device (the first
 * request's; a request for another gets NULL), never gives memory back, and
 * has no answer for CUDA graphs or record_stream.
 *
 * Out of region: NULL, after one line on stderr. PyTorch uses the pointer
 * unchecked, so the run then fails; raise SLOT_FLOOR_GIB.
 *
 * It includes cuda.h for its types only and links no CUDA library: the
 * driver's functions are looked up in libcuda.so.1, which PyTorch has
 * loaded before it asks for memory. Thread-safe (one spin lock: autograd
 * frees from its own thread), C11.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The library is built with hidden visibility: only these two are seen. */
#define SLOT_FLOOR_EXPORT __attribute__((visibility("default")))

#define SLOT_FLOOR_GRANULE ((size_t)512)
/* Distinct sizes a list can be kept for: a training step asks for some
 * hundreds (ResNet-152: ~300); open addressing wants room to spare. */
#define SLOT_FLOOR_SIZES 4096u
#define SLOT_FLOOR_DEFAULT_GIB 60

/* The freed blocks of one size, last freed on top. */
typedef struct {
  size_t size; /* rounded bytes; 0: the table's slot is empty */
  CUdeviceptr *blocks;
  uint32_t count, cap;
} slot_floor_list;

typedef CUresult (*slot_floor_init_fn)(unsigned int);
typedef CUresult (*slot_floor_device_get_fn)(CUdevice *, int);
typedef CUresult (*slot_floor_retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*slot_floor_push_fn)(CUcontext);
typedef CUresult (*slot_floor_pop_fn)(CUcontext *);
typedef CUresult (*slot_floor_mem_alloc_fn)(CUdeviceptr *, size_t);

static atomic_flag slot_floor_busy = ATOMIC_FLAG_INIT;
/* All below under slot_floor_busy. */
static slot_floor_list slot_floor_lists[SLOT_FLOOR_SIZES];
static bool slot_floor_tried;  /* the region was asked for (once) */
static int slot_floor_device;  /* its device, once tried */
static CUdeviceptr slot_floor_base, slot_floor_next, slot_floor_end; /* 0: none */
static bool slot_floor_said_full, slot_floor_said_device;

/* A spin lock, the cheapest there is (an exchange to take, a store to give
 * back): it is held for a few dozen instructions and almost never contended
 * (autograd's thread and the Python thread take turns). Yielding keeps a
 * waiter from burning its core while the first request maps the region. */
static void slot_floor_lock(void) {
  while (atomic_flag_test_and_set_explicit(&slot_floor_busy,
                                           memory_order_acquire))
    sched_yield();
}

static void slot_floor_unlock(void) {
  atomic_flag_clear_explicit(&slot_floor_busy, memory_order_release);
}

/* Fibonacci hashing of the size in granules: sizes are multiples of 512
 * and often of powers of two, which a plain modulus would pile up. */
static size_t slot_floor_slot(size_t size) {
  return (size_t)(((uint64_t)(size / SLOT_FLOOR_GRANULE) *
                   UINT64_C(0x9E3779B97F4A7C15)) >>
                  52) &
         (SLOT_FLOOR_SIZES - 1);
}

/* The list of blocks of `size` bytes; made when `add` (NULL when the table
 * is full), else NULL when there is none. */
static slot_floor_list *slot_floor_find(size_t size, bool add) {
  size_t i = slot_floor_slot(size);
  for (unsigned n = 0; n < SLOT_FLOOR_SIZES; n++) {
    slot_floor_list *l = &slot_floor_lists[i];
    if (l->size == size)
      return l;
    if (l->size == 0) {
      if (!add)
        return NULL;
      l->size = size;
      return l;
    }
    i = (i + 1) & (SLOT_FLOOR_SIZES - 1);
  }
  return NULL;
}

/* The driver function `name` into *fn (of size `bytes`): dlsym gives an
 * object pointer, which C converts to a function pointer only by copying. */
static bool slot_floor_sym(void *lib, const char *name, void *fn,
                           size_t bytes) {
  void *sym = dlsym(lib, name);
  if (sym == NULL) {
    fprintf(stderr, "slot_floor: %s not found in libcuda.so.1\n", name);
    return false;
  }
  memcpy(fn, &sym, bytes);
  return true;
}

/* The region's bytes: SLOT_FLOOR_GIB, else the default. */
static size_t slot_floor_region_bytes(void) {
  const char *env = getenv("SLOT_FLOOR_GIB");
  char *end = NULL;
  unsigned long gib = SLOT_FLOOR_DEFAULT_GIB;
  if (env != NULL && *env != '\0') {
    gib = strtoul(env, &end, 10);
    if (*end != '\0' || gib == 0 || gib > 4096) {
      fprintf(stderr, "slot_floor: SLOT_FLOOR_GIB=%s is not a number of GiB "
                      "from 1 to 4096; taking %d\n",
              env, SLOT_FLOOR_DEFAULT_GIB);
      gib = SLOT_FLOOR_DEFAULT_GIB;
    }
  }
  return (size_t)gib << 30;
}

/* Takes the region on `device` from the driver, once. The calling thread
 * may have no context current (autograd's thread, or a runtime that has not
 * made one current yet): the device's primary context, PyTorch's too, is
 * retained and pushed for the one cuMemAlloc, so the thread's context is as
 * it was after. The reference is kept: the region lives as long as the
 * process. */
static void slot_floor_take_region(int device) {
  slot_floor_init_fn init;
  slot_floor_device_get_fn device_get;
  slot_floor_retain_fn retain;
  slot_floor_push_fn push;
  slot_floor_pop_fn pop;
  slot_floor_mem_alloc_fn mem_alloc;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "slot_floor: %s\n", dlerror());
    return;
  }
  if (!slot_floor_sym(lib, "cuInit", &init, sizeof(init)) ||
      !slot_floor_sym(lib, "cuDeviceGet", &device_get, sizeof(device_get)) ||
      !slot_floor_sym(lib, "cuDevicePrimaryCtxRetain", &retain,
                      sizeof(retain)) ||
      !slot_floor_sym(lib, "cuCtxPushCurrent_v2", &push, sizeof(push)) ||
      !slot_floor_sym(lib, "cuCtxPopCurrent_v2", &pop, sizeof(pop)) ||
      !slot_floor_sym(lib, "cuMemAlloc_v2", &mem_alloc, sizeof(mem_alloc)))
    return;
  size_t bytes = slot_floor_region_bytes();
  CUdevice dev;
  CUcontext ctx = NULL, popped = NULL;
  CUdeviceptr base = 0;
  CUresult r = init(0);
  if (r == CUDA_SUCCESS)
    r = device_get(&dev, device);
  if (r == CUDA_SUCCESS)
    r = retain(&ctx, dev);
  if (r == CUDA_SUCCESS && (r = push(ctx)) == CUDA_SUCCESS) {
    r = mem_alloc(&base, bytes);
    pop(&popped);
  }
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "slot_floor: no region of %zu GiB on device %d "
                    "(CUresult %d): lower SLOT_FLOOR_GIB\n",
            bytes >> 30, device, (int)r);
    return;
  }
  slot_floor_base = slot_floor_next = base;
  slot_floor_end = base + bytes;
}

/* `size` bytes from the region; 0 when it has no room (or is missing), or
 * when `device` is not its device; each of those said once. */
static CUdeviceptr slot_floor_bump(size_t size, int device) {
  if (!slot_floor_tried) {
    slot_floor_tried = true;
    slot_floor_device = device;
    slot_floor_take_region(device);
  }
  if (device != slot_floor_device) {
    if (!slot_floor_said_device) {
      slot_floor_said_device = true;
      fprintf(stderr, "slot_floor: serves device %d only; a request for "
                      "device %d gets NULL\n",
              slot_floor_device, device);
    }
    return 0;
  }
  if (slot_floor_end - slot_floor_next < size) {
    if (!slot_floor_said_full && slot_floor_end != 0) {
      slot_floor_said_full = true;
      fprintf(stderr, "slot_floor: no room for %zu bytes (%llu of the "
                      "region's %llu used): raise SLOT_FLOOR_GIB\n",
              size, (unsigned long long)(slot_floor_next - slot_floor_base),
              (unsigned long long)(slot_floor_end - slot_floor_base));
    }
    return 0;
  }
  CUdeviceptr p = slot_floor_next;
  slot_floor_next += size;
  return p;
}

/* `size` rounded up to the granule (0 asks for one granule: PyTorch may ask
 * for 0 bytes and frees what it got); 0 when it does not fit a size_t. */
static size_t slot_floor_round(size_t size) {
  if (size > SIZE_MAX - SLOT_FLOOR_GRANULE)
    return 0;
  return size == 0 ? SLOT_FLOOR_GRANULE
                   : (size + SLOT_FLOOR_GRANULE - 1) & ~(SLOT_FLOOR_GRANULE - 1);
}

/* PyTorch's alloc_fn: void *(size_t size, int device, cudaStream_t stream).
 * The stream is ignored (see the top of this file). */
SLOT_FLOOR_EXPORT void *slot_floor_alloc(size_t size, int device,
                                         void *stream) {
  (void)stream;
  size_t rounded = slot_floor_round(size);
  if (rounded == 0)
    return NULL;
  CUdeviceptr p;
  slot_floor_lock();
  slot_floor_list *l = slot_floor_find(rounded, false);
  if (l != NULL && l->count > 0)
    p = l->blocks[--l->count];
  else
    p = slot_floor_bump(rounded, device);
  slot_floor_unlock();
  return (void *)(uintptr_t)p;
}

/* PyTorch's free_fn: void (void *ptr, size_t size, int device,
 * cudaStream_t stream), `size` being what alloc was asked. Onto its size's
 * list, for the next request of that size, at once: no stream ordering. */
SLOT_FLOOR_EXPORT void slot_floor_free(void *ptr, size_t size, int device,
                                       void *stream) {
  (void)device;
  (void)stream;
  size_t rounded = slot_floor_round(size);
  if (ptr == NULL || rounded == 0)
    return;
  slot_floor_lock();
  slot_floor_list *l = slot_floor_find(rounded, true);
  if (l != NULL && l->count == l->cap) {
    /* Grows while the first steps find each size's most live blocks; then
     * never again. The host allocator under the spin lock is rare enough. */
    uint32_t cap = l->cap ? l->cap * 2 : 16;
    CUdeviceptr *grown = realloc(l->blocks, cap * sizeof(*grown));
    if (grown != NULL) {
      l->blocks = grown;
      l->cap = cap;
    }
  }
  if (l != NULL && l->count < l->cap)
    l->blocks[l->count++] = (CUdeviceptr)(uintptr_t)ptr;
  slot_floor_unlock();
}
