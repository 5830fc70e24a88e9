/*
 * Blocks used on streams other than their own (PyTorch's
 * tensor.record_stream(s), through the allocator slot): for each block,
 * the streams its free must wait for. A side module: it only keeps the
 * list; the policy (slot.c) orders the free behind those streams.
 */
#ifndef CA_RECORDED_H
#define CA_RECORDED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Streams kept per block; a block used on more wants a device-wide wait
 * at its free (*overflow in ca_recorded_take). */
#define CA_RECORDED_STREAMS 8

/* Notes that the block at `addr` is used on `stream` (a handle as a
 * number). Returns false when the table is full: the caller must then
 * keep the block safe another way. */
bool ca_recorded_add(uint64_t addr, uint64_t stream);

/* Takes the streams noted for `addr` (at most CA_RECORDED_STREAMS into
 * out) and forgets them; returns how many, 0 when none was noted (the
 * common case costs one atomic load). *overflow: more were noted than
 * fit. */
size_t ca_recorded_take(uint64_t addr, uint64_t *out, bool *overflow);

#endif /* CA_RECORDED_H */
