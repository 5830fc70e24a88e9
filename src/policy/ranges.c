/*
 * The policy behind memsets and copies (see ranges.h).
 */
#include "policy/ranges.h"

#include <stdint.h>

#include "registry/registry.h"

/* Bytes a pitched region spans: `rows` rows of `width` bytes, `pitch`
 * apart, in `layers` layers of `layer` bytes; 0 when it spans nothing or
 * cannot be counted (an overflow: the driver judges that call alone). */
static uint64_t ca__extent(uint64_t width, uint64_t rows, uint64_t pitch,
                           uint64_t layers, uint64_t layer) {
  uint64_t row_part, layer_part, total;
  if (width == 0 || rows == 0 || layers == 0 ||
      __builtin_mul_overflow(rows - 1, pitch, &row_part) ||
      __builtin_mul_overflow(layers - 1, layer, &layer_part) ||
      __builtin_add_overflow(row_part, layer_part, &total) ||
      __builtin_add_overflow(total, width, &total))
    return 0;
  return total;
}

bool ca_range_ok(CUdeviceptr start, size_t bytes) {
  if (bytes == 0 || !ca_registry_in_use())
    return true;
  uint64_t lo, hi;
  if (!ca_registry_bounds((uint64_t)start, &lo, &hi))
    return true; /* no pool holds it: the driver's to judge */
  /* In a pool's segment but in no live block's bytes (lo == hi) the driver
   * refuses any range, as for a freed allocation of its own. */
  return lo != hi && bytes <= hi - (uint64_t)start;
}

bool ca_range_ok_copy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  return ca_range_ok(dst, bytes) && ca_range_ok(src, bytes);
}

bool ca_range_ok_pitched(CUdeviceptr start, size_t pitch, size_t width,
                         size_t height) {
  return ca_range_ok(start, ca__extent(width, height, pitch, 1, 0));
}

/* One side of a 2D or 3D copy: a device pointer (or a unified one, which
 * may be a device's), `x`, `y` and `z` in, over the copy's extent. */
static bool ca__side_ok(CUmemorytype type, CUdeviceptr base, uint64_t x,
                        uint64_t y, uint64_t z, uint64_t pitch, uint64_t height,
                        uint64_t width, uint64_t rows, uint64_t depth) {
  if (type != CU_MEMORYTYPE_DEVICE && type != CU_MEMORYTYPE_UNIFIED)
    return true;
  uint64_t layer, offset, deep;
  if (__builtin_mul_overflow(pitch, height, &layer) ||
      __builtin_mul_overflow(y, pitch, &offset) ||
      __builtin_mul_overflow(z, layer, &deep) ||
      __builtin_add_overflow(offset, deep, &offset) ||
      __builtin_add_overflow(offset, x, &offset))
    return true; /* the driver's to judge */
  uint64_t bytes = ca__extent(width, rows, pitch, depth, layer);
  return bytes == 0 || ca_range_ok(base + offset, bytes);
}

bool ca_range_ok_2d(const CUDA_MEMCPY2D *c) {
  return c == NULL ||
         (ca__side_ok(c->srcMemoryType, c->srcDevice, c->srcXInBytes, c->srcY, 0,
                      c->srcPitch, 0, c->WidthInBytes, c->Height, 1) &&
          ca__side_ok(c->dstMemoryType, c->dstDevice, c->dstXInBytes, c->dstY, 0,
                      c->dstPitch, 0, c->WidthInBytes, c->Height, 1));
}

/* Both sides of a 3D copy: CUDA_MEMCPY3D and CUDA_MEMCPY3D_PEER name
 * their fields alike. */
#define CA__3D_OK(c)                                                           \
  ((c) == NULL ||                                                              \
   (ca__side_ok((c)->srcMemoryType, (c)->srcDevice, (c)->srcXInBytes,          \
                (c)->srcY, (c)->srcZ, (c)->srcPitch, (c)->srcHeight,           \
                (c)->WidthInBytes, (c)->Height, (c)->Depth) &&                 \
    ca__side_ok((c)->dstMemoryType, (c)->dstDevice, (c)->dstXInBytes,          \
                (c)->dstY, (c)->dstZ, (c)->dstPitch, (c)->dstHeight,           \
                (c)->WidthInBytes, (c)->Height, (c)->Depth)))

bool ca_range_ok_3d(const CUDA_MEMCPY3D *c) { return CA__3D_OK(c); }

bool ca_range_ok_3d_peer(const CUDA_MEMCPY3D_PEER *c) { return CA__3D_OK(c); }

/* The batch's verdict: copy `i` was refused (or none was: i == count). */
static bool ca__batch_verdict(size_t i, size_t count, size_t *fail_idx) {
  if (i < count && fail_idx != NULL)
    *fail_idx = i;
  return i == count;
}

bool ca_range_ok_batch(const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                       const size_t *sizes, size_t count, size_t *fail_idx) {
  if (dsts == NULL || srcs == NULL || sizes == NULL)
    return true;
  size_t i = 0;
  while (i < count && ca_range_ok_copy(dsts[i], srcs[i], sizes[i]))
    i++;
  return ca__batch_verdict(i, count, fail_idx);
}

/* One operand of a batched 3D copy. Array operands hold no device
 * pointer; elements are counted as bytes, which for a copy between
 * pointers they are (with an array on the other side they may be larger:
 * the check then asks less, never more, than the driver). */
static bool ca__operand_ok(const CUmemcpy3DOperand *o, const CUextent3D *e) {
  if (o->type != CU_MEMCPY_OPERAND_TYPE_POINTER)
    return true;
  uint64_t row = o->op.ptr.rowLength ? o->op.ptr.rowLength : e->width;
  uint64_t rows = o->op.ptr.layerHeight ? o->op.ptr.layerHeight : e->height;
  return ca__side_ok(CU_MEMORYTYPE_UNIFIED, o->op.ptr.ptr, 0, 0, 0, row, rows,
                     e->width, e->height, e->depth);
}

bool ca_range_ok_3d_batch(size_t count, const CUDA_MEMCPY3D_BATCH_OP *ops,
                          size_t *fail_idx) {
  if (ops == NULL)
    return true;
  size_t i = 0;
  while (i < count && ca__operand_ok(&ops[i].src, &ops[i].extent) &&
         ca__operand_ok(&ops[i].dst, &ops[i].extent))
    i++;
  return ca__batch_verdict(i, count, fail_idx);
}
