/*
 * mockcuda's memsets and copies: every cuMemset*, the cuMemcpy* of linear
 * memory (1D, 2D, 3D, peer, batched) and cuMemcpyDtoA/AtoD, synchronous
 * and stream-ordered, each with its per-thread twin, over the host buffers
 * behind the simulated device memory. Stream-ordered ones act at once, as
 * the mock's other stream-ordered calls do. Each first checks every device
 * range it touches by the driver's rule, as measured (driver_facts.txt,
 * the "range:" lines):
 *  - a range of 0 bytes always passes;
 *  - any other must start in a live allocation's requested bytes (not its
 *    rounded span, not a freed one) and end by their end; else
 *    CUDA_ERROR_INVALID_VALUE;
 *  - a 2D or 3D range runs from its first byte (X, Y and Z applied) to the
 *    end of its last row: (Depth-1)*pitch*height + (Height-1)*pitch +
 *    WidthInBytes bytes;
 *  - cuMemcpy(Async), unified descriptor sides and batched pointers: a side
 *    outside device memory is host memory, and not checked;
 *  - a batch is checked whole before any of it is done: the first copy the
 *    rule refuses refuses the call (failIdx: its index).
 * What the probe did not measure is not checked: element alignment of the
 * 16- and 32-bit memsets, pitches narrower than a row, batch attributes and
 * flags, peer contexts (the mock has one address space). The mock has no
 * CUDA arrays: an array side (cuMemcpyDtoA/AtoD, a descriptor's, a batch
 * operand's) is refused with CUDA_ERROR_INVALID_VALUE, as an invalid array
 * handle is (a source is checked before its destination: DtoA checks its
 * device range first, AtoD refuses at once).
 */
#include <string.h>

#include "mockcuda_internal.h"

enum { MOCK_PT = 1, MOCK_ASYNC = 2 }; /* an export: per-thread twin, stream-ordered */
enum { MOCK_H = CU_MEMORYTYPE_HOST, MOCK_D = CU_MEMORYTYPE_DEVICE, MOCK_A = CU_MEMORYTYPE_ARRAY,
       MOCK_U = CU_MEMORYTYPE_UNIFIED };

#define MOCK_U64(x) ((uint64_t)(uintptr_t)(x))
#define MOCK_UNUSED __attribute__((unused))

/* One side of a copy, or a memset's destination. */
typedef struct mock_side {
  int type;        /* a CUmemorytype; no type at all (0) is refused */
  uint64_t ptr;    /* its first byte: X, Y and Z applied */
  uint64_t pitch;  /* bytes from a row to the next */
  uint64_t height; /* rows from a layer to the next */
} mock_side;

typedef struct mock_op {
  mock_side dst, src;            /* a memset has no src */
  uint64_t width, height, depth; /* bytes per row, rows, layers */
} mock_op;

/* Whether p is simulated device memory: in a device's address range or a
 * reservation, allocated or not (a freed pointer is no host memory). */
static int mock_is_device(uint64_t p) {
  for (int d = 0; d < g_ndev; d++)
    if (p >= g_dev[d].va_base && p < g_dev[d].va_end)
      return 1;
  return mock_vmm_reserved(p);
}

/* The bytes from a side's first to its last: 0 for an empty operation,
 * UINT64_MAX when they do not fit in 64 bits (no allocation holds them). */
static uint64_t mock_extent(const mock_side *s, const mock_op *op) {
  uint64_t layers, rows, n;
  if (!op->width || !op->height || !op->depth)
    return 0;
  if (__builtin_mul_overflow(op->depth - 1, s->pitch, &layers) ||
      __builtin_mul_overflow(layers, s->height, &layers) ||
      __builtin_mul_overflow(op->height - 1, s->pitch, &rows) ||
      __builtin_add_overflow(layers, rows, &n) || __builtin_add_overflow(n, op->width, &n))
    return UINT64_MAX;
  return n;
}

/* The host bytes behind a side, after the driver's range rule for device
 * memory: NULL for an empty device range. */
static CUresult mock_side_bytes(const mock_side *s, const mock_op *op, unsigned char **out) {
  uint64_t n = mock_extent(s, op);
  int type = s->type == MOCK_U ? (mock_is_device(s->ptr) ? MOCK_D : MOCK_H) : s->type;
  mock_alloc *a = NULL;
  *out = NULL;
  if (type == MOCK_H && (s->ptr || !n)) {
    *out = (unsigned char *)(uintptr_t)s->ptr;
    return CUDA_SUCCESS;
  }
  if (type != MOCK_D || (n && !(a = mock_find(s->ptr, n, NULL))))
    return CUDA_ERROR_INVALID_VALUE; /* also a NULL host pointer, an array */
  if (a)
    *out = a->host + (s->ptr - a->addr);
  return CUDA_SUCCESS;
}

/* What every memset and copy starts with, under the lock: a current
 * context and, for a stream-ordered one, a valid stream. */
static CUresult mock_begin(CUstream hs, int kind) {
  CUcontext c = NULL;
  CUstream s = NULL;
  g_cnt.ptsz_calls += (uint64_t)(kind & MOCK_PT);
  if (kind & MOCK_ASYNC)
    return mock_need_ctx_stream(hs, kind & MOCK_PT, CUDA_SUCCESS, &c, &s);
  return mock_need_ctx(&c);
}

static void mock_fill(unsigned char *p, uint64_t n, uint32_t v, size_t esz) {
  uint16_t h = (uint16_t)v;
  if (esz == 1)
    memset(p, (int)(v & 0xff), n);
  for (uint64_t i = 0; esz > 1 && i < n; i += esz)
    memcpy(p + i, esz == 2 ? (const void *)&h : (const void *)&v, esz);
}

/* Sets op's rows of op->width bytes to v, an element of esz bytes. */
static CUresult mock_memset(const char *what, mock_op op, uint32_t v, size_t esz, CUstream hs,
                            int kind) {
  mock_lock();
  g_cnt.memset++;
  unsigned char *d = NULL;
  CUresult rc = mock_begin(hs, kind);
  if (rc == CUDA_SUCCESS)
    rc = mock_side_bytes(&op.dst, &op, &d);
  for (uint64_t y = 0; rc == CUDA_SUCCESS && d && y < op.height; y++)
    mock_fill(d + y * op.dst.pitch, op.width, v, esz);
  mock_unlock();
  if (rc != CUDA_SUCCESS)
    mock_trace("%s(0x%llx, %llu B x %llu) = %d", what, (unsigned long long)op.dst.ptr,
               (unsigned long long)op.width, (unsigned long long)op.height, rc);
  return rc;
}

/* Checks both sides of a copy and, if `run`, does it. */
static CUresult mock_copy_locked(const mock_op *op, int run) {
  unsigned char *d = NULL, *s = NULL;
  CUresult rc = mock_side_bytes(&op->src, op, &s);
  if (rc == CUDA_SUCCESS)
    rc = mock_side_bytes(&op->dst, op, &d);
  if (rc != CUDA_SUCCESS || !run || !op->width)
    return rc;
  for (uint64_t z = 0; z < op->depth; z++)
    for (uint64_t y = 0; y < op->height; y++)
      memmove(d + (z * op->dst.height + y) * op->dst.pitch,
              s + (z * op->src.height + y) * op->src.pitch, op->width);
  return CUDA_SUCCESS;
}

static CUresult mock_copy(const char *what, mock_op op, CUstream hs, int kind) {
  mock_lock();
  g_cnt.memcpy++;
  CUresult rc = mock_begin(hs, kind);
  if (rc == CUDA_SUCCESS)
    rc = mock_copy_locked(&op, 1);
  mock_unlock();
  if (rc != CUDA_SUCCESS)
    mock_trace("%s(0x%llx <- 0x%llx, %llu B x %llu x %llu) = %d", what,
               (unsigned long long)op.dst.ptr, (unsigned long long)op.src.ptr,
               (unsigned long long)op.width, (unsigned long long)op.height,
               (unsigned long long)op.depth, rc);
  return rc;
}

/* The first copy the rule refuses refuses the whole batch, before any of
 * it is done; *fail says which (SIZE_MAX: no copy, the call itself). */
static CUresult mock_batch(const char *what, mock_op (*op_at)(const void *, size_t),
                           const void *list, size_t n, size_t *fail, CUstream hs, int kind) {
  mock_lock();
  g_cnt.memcpy++;
  size_t at = SIZE_MAX;
  CUresult rc = mock_begin(hs, kind);
  if (rc == CUDA_SUCCESS && n && !list)
    rc = CUDA_ERROR_INVALID_VALUE;
  for (int run = 0; run < 2 && rc == CUDA_SUCCESS; run++)
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
      mock_op op = op_at(list, i);
      rc = mock_copy_locked(&op, run);
      at = i;
    }
  if (rc != CUDA_SUCCESS && fail)
    *fail = at;
  mock_unlock();
  if (rc != CUDA_SUCCESS)
    mock_trace("%s(%zu copies) = %d at %zu", what, n, rc, at);
  return rc;
}

/* ---- what the exports describe ---------------------------------------- */

/* n bytes, from src to dst, of the given memory types. */
#define MOCK_LINE(dt, d, st, s, n)                                              \
  ((mock_op){{(dt), MOCK_U64(d), 0, 0}, {(st), MOCK_U64(s), 0, 0}, (n), 1, 1})

/* h rows of w elements of esz bytes, pitch apart. */
#define MOCK_RECT(d, pitch, w, h, esz)                                          \
  ((mock_op){.dst = {MOCK_D, (d), (pitch), 0}, .width = (uint64_t)(w) * (esz), .height = (h), \
             .depth = 1})

/* A descriptor's side s: its pointer by memory type, X, Y and layer z of
 * `rows` rows applied. */
#define MOCK_SIDE(c, s, z, rows)                                                \
  ((mock_side){(c)->s##MemoryType,                                             \
               ((c)->s##MemoryType == CU_MEMORYTYPE_HOST ? MOCK_U64((c)->s##Host) \
                                                         : (c)->s##Device) +   \
                   (c)->s##XInBytes + ((c)->s##Y + (uint64_t)(z) * (rows)) * (c)->s##Pitch, \
               (c)->s##Pitch, (rows)})

/* CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER name their fields alike. */
#define MOCK_BOX(c)                                                             \
  ((mock_op){MOCK_SIDE(c, dst, (c)->dstZ, (c)->dstHeight),                      \
             MOCK_SIDE(c, src, (c)->srcZ, (c)->srcHeight), (c)->WidthInBytes, (c)->Height, \
             (c)->Depth})

/* A NULL descriptor describes sides of no memory type: refused. */
static mock_op mock_op_2d(const CUDA_MEMCPY2D *c) {
  if (!c)
    return (mock_op){.depth = 0};
  return (mock_op){MOCK_SIDE(c, dst, 0, 0), MOCK_SIDE(c, src, 0, 0), c->WidthInBytes, c->Height,
                   1};
}
static mock_op mock_op_3d(const CUDA_MEMCPY3D *c) {
  return c ? MOCK_BOX(c) : (mock_op){.depth = 0};
}
static mock_op mock_op_3d_peer(const CUDA_MEMCPY3D_PEER *c) {
  return c ? MOCK_BOX(c) : (mock_op){.depth = 0};
}

typedef struct mock_ptr_list {
  const CUdeviceptr *dsts, *srcs;
  const size_t *sizes;
} mock_ptr_list;

static mock_op mock_ptr_op(const void *list, size_t i) {
  const mock_ptr_list *l = list;
  return MOCK_LINE(MOCK_U, l->dsts[i], MOCK_U, l->srcs[i], l->sizes[i]);
}

/* A 3D batch operand: a pointer, host or device as cuMemcpy's, of 1-byte
 * elements, its rows and layers packed where their lengths are 0; or an
 * array. */
static mock_side mock_operand(const CUmemcpy3DOperand *o, const CUextent3D *e) {
  if (o->type != CU_MEMCPY_OPERAND_TYPE_POINTER)
    return (mock_side){.type = MOCK_A};
  return (mock_side){MOCK_U, o->op.ptr.ptr, o->op.ptr.rowLength ? o->op.ptr.rowLength : e->width,
                     o->op.ptr.layerHeight ? o->op.ptr.layerHeight : e->height};
}

static mock_op mock_3d_op(const void *list, size_t i) {
  const CUDA_MEMCPY3D_BATCH_OP *o = (const CUDA_MEMCPY3D_BATCH_OP *)list + i;
  return (mock_op){mock_operand(&o->dst, &o->extent), mock_operand(&o->src, &o->extent),
                   o->extent.width, o->extent.height, o->extent.depth};
}

/* ---- the exports ------------------------------------------------------ */

/* An export and its per-thread twin (name##twin): `call`, which reads the
 * export's kind as k_, the twin's with MOCK_PT added. */
#define MOCK_PAIR(name, twin, params, kind, call)                              \
  CUresult name params {                                                        \
    int k_ = (kind);                                                            \
    return call;                                                                \
  }                                                                             \
  CUresult name##twin params {                                                  \
    int k_ = (kind) | MOCK_PT;                                                  \
    return call;                                                                \
  }

#define MOCK_COPY(name, params, op)                                             \
  MOCK_PAIR(name, _ptds, params, 0, mock_copy(__func__, op, NULL, k_))
#define MOCK_COPY_ASYNC(name, params, op)                                       \
  MOCK_PAIR(name, _ptsz, params, MOCK_ASYNC, mock_copy(__func__, op, hs, k_))

/* Memsets of h rows of w elements v, pitch apart; sizeof v: the element's. */
#define MOCK_SET(name, params, pitch, w, h)                                     \
  MOCK_PAIR(name, _ptds, params, 0,                                             \
            mock_memset(__func__, MOCK_RECT(d, pitch, w, h, sizeof v), v, sizeof v, NULL, k_))
#define MOCK_SET_ASYNC(name, params, pitch, w, h)                               \
  MOCK_PAIR(name, _ptsz, params, MOCK_ASYNC,                                    \
            mock_memset(__func__, MOCK_RECT(d, pitch, w, h, sizeof v), v, sizeof v, hs, k_))
#define MOCK_1D(T) CUdeviceptr d, T v, size_t n
#define MOCK_2D(T) CUdeviceptr d, size_t pitch, T v, size_t w, size_t h
#define MOCK_MEMSETS(bits, T)                                                   \
  MOCK_SET(cuMemsetD##bits##_v2, (MOCK_1D(T)), 0, n, 1)                         \
  MOCK_SET_ASYNC(cuMemsetD##bits##Async, (MOCK_1D(T), CUstream hs), 0, n, 1)    \
  MOCK_SET(cuMemsetD2D##bits##_v2, (MOCK_2D(T)), pitch, w, h)                   \
  MOCK_SET_ASYNC(cuMemsetD2D##bits##Async, (MOCK_2D(T), CUstream hs), pitch, w, h)

MOCK_MEMSETS(8, unsigned char)
MOCK_MEMSETS(16, unsigned short)
MOCK_MEMSETS(32, unsigned int)

MOCK_COPY(cuMemcpy, (CUdeviceptr d, CUdeviceptr s, size_t n), MOCK_LINE(MOCK_U, d, MOCK_U, s, n))
MOCK_COPY_ASYNC(cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream hs),
                MOCK_LINE(MOCK_U, d, MOCK_U, s, n))
MOCK_COPY(cuMemcpyHtoD_v2, (CUdeviceptr d, const void *s, size_t n),
          MOCK_LINE(MOCK_D, d, MOCK_H, s, n))
MOCK_COPY_ASYNC(cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *s, size_t n, CUstream hs),
                MOCK_LINE(MOCK_D, d, MOCK_H, s, n))
MOCK_COPY(cuMemcpyDtoH_v2, (void *d, CUdeviceptr s, size_t n),
          MOCK_LINE(MOCK_H, d, MOCK_D, s, n))
MOCK_COPY_ASYNC(cuMemcpyDtoHAsync_v2, (void *d, CUdeviceptr s, size_t n, CUstream hs),
                MOCK_LINE(MOCK_H, d, MOCK_D, s, n))
MOCK_COPY(cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr s, size_t n),
          MOCK_LINE(MOCK_D, d, MOCK_D, s, n))
MOCK_COPY_ASYNC(cuMemcpyDtoDAsync_v2, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream hs),
                MOCK_LINE(MOCK_D, d, MOCK_D, s, n))
MOCK_COPY(cuMemcpyDtoA_v2, (CUarray d, size_t off MOCK_UNUSED, CUdeviceptr s, size_t n),
          MOCK_LINE(MOCK_A, d, MOCK_D, s, n))
MOCK_COPY(cuMemcpyAtoD_v2, (CUdeviceptr d, CUarray s, size_t off MOCK_UNUSED, size_t n),
          MOCK_LINE(MOCK_D, d, MOCK_A, s, n))
#define MOCK_PEER CUdeviceptr d, CUcontext dc MOCK_UNUSED, CUdeviceptr s, CUcontext sc MOCK_UNUSED
MOCK_COPY(cuMemcpyPeer, (MOCK_PEER, size_t n), MOCK_LINE(MOCK_D, d, MOCK_D, s, n))
MOCK_COPY_ASYNC(cuMemcpyPeerAsync, (MOCK_PEER, size_t n, CUstream hs),
                MOCK_LINE(MOCK_D, d, MOCK_D, s, n))

MOCK_COPY(cuMemcpy2D_v2, (const CUDA_MEMCPY2D *c), mock_op_2d(c))
MOCK_COPY(cuMemcpy2DUnaligned_v2, (const CUDA_MEMCPY2D *c), mock_op_2d(c))
MOCK_COPY_ASYNC(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D *c, CUstream hs), mock_op_2d(c))
MOCK_COPY(cuMemcpy3D_v2, (const CUDA_MEMCPY3D *c), mock_op_3d(c))
MOCK_COPY_ASYNC(cuMemcpy3DAsync_v2, (const CUDA_MEMCPY3D *c, CUstream hs), mock_op_3d(c))
MOCK_COPY(cuMemcpy3DPeer, (const CUDA_MEMCPY3D_PEER *c), mock_op_3d_peer(c))
MOCK_COPY_ASYNC(cuMemcpy3DPeerAsync, (const CUDA_MEMCPY3D_PEER *c, CUstream hs),
                mock_op_3d_peer(c))

/* Batches: CUDA 12.8's with failIdx, CUDA 13's (_v2) without. */
#define MOCK_PTR_PARAMS                                                         \
  CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t n,                \
      CUmemcpyAttributes *attrs MOCK_UNUSED, size_t *attr_idx MOCK_UNUSED,      \
      size_t nattrs MOCK_UNUSED
#define MOCK_PTR_LIST (dsts && srcs && sizes ? &(mock_ptr_list){dsts, srcs, sizes} : NULL)

MOCK_PAIR(cuMemcpyBatchAsync, _ptsz, (MOCK_PTR_PARAMS, size_t *fail, CUstream hs), MOCK_ASYNC,
          mock_batch(__func__, mock_ptr_op, MOCK_PTR_LIST, n, fail, hs, k_))
MOCK_PAIR(cuMemcpyBatchAsync_v2, _ptsz, (MOCK_PTR_PARAMS, CUstream hs), MOCK_ASYNC,
          mock_batch(__func__, mock_ptr_op, MOCK_PTR_LIST, n, NULL, hs, k_))
MOCK_PAIR(cuMemcpy3DBatchAsync, _ptsz,
          (size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, size_t *fail,
           unsigned long long flags MOCK_UNUSED, CUstream hs),
          MOCK_ASYNC, mock_batch(__func__, mock_3d_op, ops, n, fail, hs, k_))
MOCK_PAIR(cuMemcpy3DBatchAsync_v2, _ptsz,
          (size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, unsigned long long flags MOCK_UNUSED,
           CUstream hs),
          MOCK_ASYNC, mock_batch(__func__, mock_3d_op, ops, n, NULL, hs, k_))
