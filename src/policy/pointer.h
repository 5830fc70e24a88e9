/*
 * The policy behind the driver calls that describe an allocation: address
 * ranges, pointer attributes, CUDA IPC and dma-buf export (the intercept
 * layer's share of them; hooks.c routes the calls here).
 *
 * A pooled block is an interior piece of a driver allocation (the pool's
 * segment), and the driver answers every such query about the segment. So
 * for a pointer inside a pooled block each handler answers about the block,
 * as the driver answers about an allocation of its own (driver_facts.txt):
 * its base and requested size, a buffer id of its own, its own
 * SYNC_MEMOPS, an IPC handle that opens exactly its bytes. A pointer in a
 * pooled segment but in no live block gets the driver's answer for a
 * pointer that is no allocation's. Pointers the pools do not hold pass
 * through untouched, as does everything with `enabled:0`.
 */
#ifndef CA_POINTER_H
#define CA_POINTER_H

#include <stdint.h>

#include <cuda.h>

CUresult ca_on_mem_get_address_range(CUdeviceptr *base, size_t *size,
                                     CUdeviceptr dptr);
CUresult ca_on_pointer_get_attribute(void *data, CUpointer_attribute attribute,
                                     CUdeviceptr ptr);
CUresult ca_on_pointer_get_attributes(unsigned int n,
                                      CUpointer_attribute *attributes,
                                      void **data, CUdeviceptr ptr);
CUresult ca_on_pointer_set_attribute(const void *value,
                                     CUpointer_attribute attribute,
                                     CUdeviceptr ptr);
CUresult ca_on_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult ca_on_mem_get_handle_for_address_range(void *handle, CUdeviceptr dptr,
                                                size_t size,
                                                CUmemRangeHandleType type,
                                                unsigned long long flags);

/* A pooled block at `addr` was freed: what was kept for it here (its
 * SYNC_MEMOPS) goes. Cheap when nothing was kept (the usual case). */
void ca_pointer_freed(uint64_t addr);

#endif /* CA_POINTER_H */
