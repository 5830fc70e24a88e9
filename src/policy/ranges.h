/*
 * The policy behind memsets and copies: a device range that starts in a
 * pooled block must stay inside the bytes the program asked for, as the
 * driver requires of a range in an allocation of its own (driver_facts.txt:
 * one byte past the requested end, a start past it, a freed block, all
 * CUDA_ERROR_INVALID_VALUE; a range of 0 bytes always passes). Without the
 * check the driver sees only the pool's segment, and a memset one byte too
 * long writes into the neighbouring block.
 *
 * Each function says whether the call may go to the driver; the hooks
 * (driver_api.h's CA_CHECKED rows) answer CUDA_ERROR_INVALID_VALUE when
 * not. Pointers no pool holds (host memory, passed-through allocations,
 * other allocators') pass untouched, as does everything with `enabled:0`.
 * A check is one look-up in the pools' address index (ca_pool_bounds).
 */
#ifndef CA_RANGES_H
#define CA_RANGES_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

/* [start, start + bytes): a 1D memset or one side of a copy. */
bool ca_range_ok(CUdeviceptr start, size_t bytes);

/* Both sides of a copy of `bytes`. */
bool ca_range_ok_copy(CUdeviceptr dst, CUdeviceptr src, size_t bytes);

/* A 2D memset: `height` rows of `width` bytes, `pitch` apart. */
bool ca_range_ok_pitched(CUdeviceptr start, size_t pitch, size_t width,
                         size_t height);

bool ca_range_ok_2d(const CUDA_MEMCPY2D *copy);
bool ca_range_ok_3d(const CUDA_MEMCPY3D *copy);
bool ca_range_ok_3d_peer(const CUDA_MEMCPY3D_PEER *copy);

/* Every copy of a batch; the first refused one's index in *fail_idx (when
 * not NULL), as the driver reports it. */
bool ca_range_ok_batch(const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                       const size_t *sizes, size_t count, size_t *fail_idx);
bool ca_range_ok_3d_batch(size_t count, const CUDA_MEMCPY3D_BATCH_OP *ops,
                          size_t *fail_idx);

#endif /* CA_RANGES_H */
