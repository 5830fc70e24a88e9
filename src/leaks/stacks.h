/*
 * The stack depot: every call stack captured at an allocation is stored
 * once, and allocations keep only its 32-bit id. A training loop allocates
 * from a handful of places millions of times; storing each stack once keeps
 * a live block's record small and makes grouping leaks by stack a compare
 * of two integers.
 *
 * Stacks are never freed. Looking up a known stack takes no lock; storing a
 * new one takes a short one. Nothing here calls CUDA or the program's malloc
 * (memory comes from mmap), so it is safe inside a hook at any time.
 */
#ifndef CA_STACKS_H
#define CA_STACKS_H

#include <stddef.h>
#include <stdint.h>

/* The most frames one stack keeps; longer ones are cut. */
#define CA_STACK_MAX_FRAMES 64

/* The id of the stack `pcs[0..n)`, the same for equal stacks: stored on
 * first sight. Returns 0 (no stack) when n is 0 or memory ran out. */
uint32_t ca_stacks_intern(const uintptr_t *pcs, size_t n);

/* The frames of stack `id` into *pcs, and their count; 0 (and *pcs NULL)
 * for id 0 or an id never handed out. The frames stay valid for the
 * process's life. */
size_t ca_stacks_get(uint32_t id, const uintptr_t **pcs);

#endif /* CA_STACKS_H */
