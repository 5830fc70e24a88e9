/*
 * The gather kernel (see gather.h): its PTX, loaded once per context, and
 * its launch.
 */
#include "backend/gather.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "driver/driver.h"
#include "support/config.h"
#include "support/fork.h"
#include "support/log.h"
#include "support/nvtx.h"

/* One set, as the kernel reads it: 40 bytes. */
typedef struct ca__set {
  uint64_t src, dst, pitch, copied;
  uint32_t width, rows;
} ca__set;

/* The kernel's one parameter, passed by value: 2,568 bytes, within the
 * 4 KiB every device takes. */
typedef struct ca__args {
  uint32_t expect, unused;
  ca__set set[CA_GATHER_MAX];
} ca__args;
_Static_assert(sizeof(ca__args) == 2568, "the kernel's parameter, as the PTX declares it");

/* Block b of the grid takes set b: its threads compare its `rows` rows of
 * `width` bytes, `pitch` apart from `src` on, with `expect`, a byte each
 * in turn; when any differs (bar.red.or), they copy the rows to `dst`, one
 * after another, and thread 0 sets the byte at `copied` to 1. PTX ISA 6.0
 * for sm_52 on: the driver compiles it for the device at load (any driver
 * of CUDA 9.1 on). */
static const char ca__ptx[] =
    ".version 6.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry ca_gather(.param .align 8 .b8 args[2568])\n"
    "{\n"
    "  .reg .pred %p<4>;\n"
    "  .reg .b16 %rs<3>;\n"
    "  .reg .b32 %r<10>;\n"
    "  .reg .b64 %rd<12>;\n"
    "  mov.b64 %rd1, args;\n"
    "  ld.param.u8 %rs1, [%rd1];\n" /* expect */
    "  mov.u32 %r1, %ctaid.x;\n"
    "  mul.wide.u32 %rd2, %r1, 40;\n"
    "  add.s64 %rd1, %rd1, %rd2;\n"
    "  ld.param.u64 %rd3, [%rd1+8];\n"  /* src */
    "  ld.param.u64 %rd4, [%rd1+16];\n" /* dst */
    "  ld.param.u64 %rd5, [%rd1+24];\n" /* pitch */
    "  ld.param.u64 %rd6, [%rd1+32];\n" /* copied */
    "  ld.param.v2.u32 {%r2, %r3}, [%rd1+40];\n" /* width, rows */
    "  cvt.u64.u32 %rd9, %r2;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mov.u32 %r5, %ntid.x;\n"
    "  mov.u32 %r8, 0;\n"
    "  mov.u64 %rd7, %rd3;\n"
    "  mov.u32 %r6, 0;\n"
    "SCAN_ROW:\n"
    "  setp.ge.u32 %p1, %r6, %r3;\n"
    "  @%p1 bra SCANNED;\n"
    "  mov.u32 %r7, %r4;\n"
    "SCAN_BYTE:\n"
    "  setp.ge.u32 %p1, %r7, %r2;\n"
    "  @%p1 bra SCAN_NEXT;\n"
    "  cvt.u64.u32 %rd8, %r7;\n"
    "  add.s64 %rd8, %rd7, %rd8;\n"
    "  ld.u8 %rs2, [%rd8];\n"
    "  setp.ne.s16 %p2, %rs2, %rs1;\n"
    "  selp.u32 %r9, 1, 0, %p2;\n"
    "  or.b32 %r8, %r8, %r9;\n"
    "  add.s32 %r7, %r7, %r5;\n"
    "  bra SCAN_BYTE;\n"
    "SCAN_NEXT:\n"
    "  add.s64 %rd7, %rd7, %rd5;\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  bra SCAN_ROW;\n"
    "SCANNED:\n"
    "  setp.ne.u32 %p1, %r8, 0;\n"
    "  bar.red.or.pred %p3, 0, %p1;\n"
    "  @!%p3 bra DONE;\n"
    "  mov.u32 %r6, 0;\n"
    "COPY_ROW:\n"
    "  setp.ge.u32 %p1, %r6, %r3;\n"
    "  @%p1 bra COPIED;\n"
    "  mov.u32 %r7, %r4;\n"
    "COPY_BYTE:\n"
    "  setp.ge.u32 %p1, %r7, %r2;\n"
    "  @%p1 bra COPY_NEXT;\n"
    "  cvt.u64.u32 %rd8, %r7;\n"
    "  add.s64 %rd10, %rd3, %rd8;\n"
    "  ld.u8 %rs2, [%rd10];\n"
    "  add.s64 %rd11, %rd4, %rd8;\n"
    "  st.u8 [%rd11], %rs2;\n"
    "  add.s32 %r7, %r7, %r5;\n"
    "  bra COPY_BYTE;\n"
    "COPY_NEXT:\n"
    "  add.s64 %rd3, %rd3, %rd5;\n"
    "  add.s64 %rd4, %rd4, %rd9;\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  bra COPY_ROW;\n"
    "COPIED:\n"
    "  setp.ne.u32 %p1, %r4, 0;\n"
    "  @%p1 bra DONE;\n"
    "  mov.u16 %rs2, 1;\n"
    "  st.u8 [%rd6], %rs2;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

#define CA__THREADS 256
/* Contexts with the kernel (or known not to load it), at most; past them
 * memcheck copies as without it. */
#define CA__CONTEXTS 64

typedef struct ca__loaded {
  CUcontext ctx;
  int device;
  CUfunction fn; /* NULL: the driver would not load the kernel */
} ca__loaded;

static ca__loaded ca__loaded_in[CA__CONTEXTS];
static size_t ca__nloaded;
/* Guards the table; never held across a driver call. */
static pthread_mutex_t ca__gather_lock = PTHREAD_MUTEX_INITIALIZER;

/* A fork while another thread holds the lock would leave the child's copy
 * locked forever; the child owns none of the parent's contexts. */
static void ca__gather_prepare(void) { pthread_mutex_lock(&ca__gather_lock); }
static void ca__gather_parent(void) { pthread_mutex_unlock(&ca__gather_lock); }
static void ca__gather_child(void) {
  ca__nloaded = 0;
  pthread_mutex_unlock(&ca__gather_lock);
}
static const ca_fork_handlers ca__gather_fork = {
    ca__gather_prepare, ca__gather_parent, ca__gather_child};

static void ca__gather_take_lock(void) {
  ca_fork_register(CA_FORK_GATHER, &ca__gather_fork);
  pthread_mutex_lock(&ca__gather_lock);
}

/* Under the lock: ctx's entry, or NULL. */
static ca__loaded *ca__loaded_for(CUcontext ctx) {
  for (size_t i = 0; i < ca__nloaded; i++)
    if (ca__loaded_in[i].ctx == ctx)
      return &ca__loaded_in[i];
  return NULL;
}

/* The kernel loaded in w's context (current), or NULL, said under
 * verbose:1 (memcheck is slower without it) and verbose:2. */
static CUfunction ca__load_kernel(const ca_where *w) {
  const ca_driver_api *d = ca_driver();
  CUmodule mod = NULL;
  CUfunction fn = NULL;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (d->module_load_data && d->module_get_function &&
      (r = d->module_load_data(&mod, ca__ptx)) == CUDA_SUCCESS)
    r = d->module_get_function(&fn, mod, "ca_gather");
  int verbose = ca_config_get()->verbose;
  if (r != CUDA_SUCCESS && verbose >= 1)
    ca_log("memcheck copies blocks back one by one on device %d: the driver "
           "did not load the gather kernel (%s)",
           w->device, ca_driver_error_name(r));
  else if (r == CUDA_SUCCESS && verbose >= 2)
    ca_log("memcheck's gather kernel loaded on device %d", w->device);
  return r == CUDA_SUCCESS ? fn : NULL;
}

/* The kernel in w's context (current), loaded at its first use there;
 * NULL where the driver does not load it, or the table is full. */
static CUfunction ca__kernel(const ca_where *w) {
  ca__gather_take_lock();
  ca__loaded *l = ca__loaded_for(w->ctx);
  bool known = l != NULL, room = ca__nloaded < CA__CONTEXTS;
  CUfunction fn = known ? l->fn : NULL;
  pthread_mutex_unlock(&ca__gather_lock);
  if (known || !room)
    return fn;
  fn = ca__load_kernel(w);
  ca__gather_take_lock();
  if ((l = ca__loaded_for(w->ctx)) != NULL) /* another thread loaded it meanwhile */
    fn = l->fn;
  else if (ca__nloaded < CA__CONTEXTS)
    ca__loaded_in[ca__nloaded++] =
        (ca__loaded){.ctx = w->ctx, .device = w->device, .fn = fn};
  pthread_mutex_unlock(&ca__gather_lock);
  return fn;
}

/* Whether the sets fit the kernel's parameter: the first n. */
static bool ca__pack(ca__args *a, const ca_backend_rows *sets, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const ca_backend_rows *r = &sets[i];
    if (r->width > UINT32_MAX || r->rows > UINT32_MAX)
      return false;
    a->set[i] = (ca__set){.src = r->addr,
                          .dst = (uint64_t)(uintptr_t)r->host,
                          .pitch = r->pitch,
                          .copied = (uint64_t)(uintptr_t)r->copied,
                          .width = (uint32_t)r->width,
                          .rows = (uint32_t)r->rows};
  }
  return true;
}

size_t ca_gather(const ca_where *w, const ca_backend_rows *sets, size_t n,
                 unsigned char expect, CUstream s) {
  if (n < 2 || ca_nvtx_attached() || ca_driver()->launch_kernel == NULL)
    return 0;
  if (n > CA_GATHER_MAX)
    n = CA_GATHER_MAX;
  ca__args args = {.expect = expect};
  CUfunction fn;
  if (!ca__pack(&args, sets, n) || (fn = ca__kernel(w)) == NULL)
    return 0;
  for (size_t i = 0; i < n; i++)
    *sets[i].copied = 0; /* before the launch: the device sets those it copies */
  void *params[] = {&args};
  CUresult r = ca_driver()->launch_kernel(fn, (unsigned int)n, 1, 1,
                                          CA__THREADS, 1, 1, 0, s, params,
                                          NULL);
  return r == CUDA_SUCCESS ? n : 0;
}

/* A grave naming a device takes all of its entries, whichever contexts
 * died: a primary context's handle is not known for one. */
static bool ca__survives(const ca_grave *g, const ca__loaded *l) {
  if (g->device >= 0)
    return l->device != g->device;
  return g->ctx != NULL && l->ctx != g->ctx;
}

void ca_gather_bury(const ca_grave *g) {
  ca__gather_take_lock();
  size_t j = 0;
  for (size_t i = 0; i < ca__nloaded; i++)
    if (ca__survives(g, &ca__loaded_in[i]))
      ca__loaded_in[j++] = ca__loaded_in[i];
  ca__nloaded = j;
  pthread_mutex_unlock(&ca__gather_lock);
}
