/*
 * What an attached NVTX tool (compute-sanitizer --nvtx yes, say) is told of
 * the pool's memory, through NVTX's memory API: each segment that holds a
 * live block is a heap of a sub-allocator, each live block a region of
 * exactly its requested bytes, so that the tool checks accesses against
 * the blocks as it checks them against the driver's own allocations.
 *
 * NVTX is header-only (the CUDA toolkit's nvtx3/): with no tool attached,
 * nothing here is called (ca_nvtx_attached says so once).
 */
#ifndef CA_NVTX_H
#define CA_NVTX_H

#include <stdbool.h>
#include <stdint.h>

/* Whether a tool is attached: NVTX's own injection variable
 * (NVTX_INJECTION64_PATH) names one. Read once. */
bool ca_nvtx_attached(void);

/* A region of `size` bytes at `addr`, in the segment [base, base +
 * segment_size), which becomes a heap first if it is not one yet; named
 * `name` unless NULL. */
void ca_nvtx_region_add(uint64_t base, uint64_t segment_size, uint64_t addr,
                        uint64_t size, const char *name);

/* The region at `addr` is gone (its block is being freed); the tool is
 * told only of regions it was told of. */
void ca_nvtx_region_remove(uint64_t addr);

/* The segment at `base` goes back to the driver: its heap, if it was one,
 * is unregistered (with nothing live in it, no region). */
void ca_nvtx_heap_remove(uint64_t base);

#endif /* CA_NVTX_H */
