/*
 * The library's own memory for anything that holds device addresses: the
 * pools' records and tables, the table of passed-through allocations, the
 * report's list of live blocks. It comes from mmap'd regions the library
 * knows, never from the program's malloc, so that the leak report's scan of
 * host memory (reach.h) can leave out every copy of an address that is the
 * library's and count only the program's.
 *
 * Sizes are rounded to a power of two (64 B to 64 KiB, carved from 1 MiB
 * regions; larger ones get a region of their own, unmapped when freed).
 * Memory is zeroed and aligned to its class (64 B at least). Thread-safe;
 * the allocator calls nothing but mmap, so it may be called under any lock.
 * The library's threads run on it too (ca_meta_thread).
 */
#ifndef CA_META_H
#define CA_META_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *ca_meta_alloc(size_t bytes);

/* `bytes` as given to ca_meta_alloc; NULL is ignored. */
void ca_meta_free(void *p, size_t bytes);

/* A copy of `old` bytes of p in `bytes` (at least old), p freed; NULL (p
 * untouched) when the host is out of memory. */
void *ca_meta_grow(void *p, size_t old, size_t bytes);

/* One region, [lo, hi). */
typedef struct ca_meta_range {
  uintptr_t lo, hi;
} ca_meta_range;

/* Copies up to `max` of the regions into out, in no particular order, and
 * returns how many there are in all. */
size_t ca_meta_ranges(ca_meta_range *out, size_t max);

/* The stack of every thread the library starts. */
#define CA_META_STACK ((size_t)1 << 20)

/* Starts fn(arg) on a thread whose stack is meta memory (CA_META_STACK
 * bytes, returned in *stack for ca_meta_free once the thread is joined;
 * a detached thread keeps it). The library's threads keep in their frames
 * the addresses they last worked on (a trace's events, a scan's words),
 * and the C library keeps a dead thread's stack for the next: on a stack
 * of its own, the scan would read them as the program's. Returns
 * pthread_create's answer (ENOMEM without the memory). */
int ca_meta_thread(pthread_t *thread, bool detached, void *(*fn)(void *),
                   void *arg, void **stack);

#endif /* CA_META_H */
