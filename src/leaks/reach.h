/*
 * Lost or still reachable: a scan of the process's host memory for words
 * that point into unfreed device allocations, the way LeakSanitizer classes
 * host leaks. An allocation some word points into (its first byte or any
 * other) is still reachable: the program can still free it. One no word
 * points into is lost. A word also counts as the low digits of a CPython
 * int, so that an address kept in a Python int is found.
 *
 * What is scanned: every mapping that is readable and writable (data and
 * bss of loaded objects, the heap, anonymous mappings, thread stacks and
 * the thread-local storage in them), only its pages in memory (mincore);
 * the calling thread's stack from the library's entry frame up, and the
 * registers the program's frames had when it called in. Left out: the
 * library's own memory (meta.h) and its own data, device files' mappings
 * (/dev/nvidia*: the driver's device memory windows), the kernel's vvar
 * and vsyscall pages. Other threads' registers are not read (no thread is
 * stopped): a pointer held only in a register of a thread that is not the
 * caller is missed, as are pages swapped out.
 *
 * Memory is read through process_vm_readv, so a mapping that another thread
 * unmaps during the scan is skipped, never faulted on. Nothing here calls
 * CUDA or the program's malloc.
 */
#ifndef CA_REACH_H
#define CA_REACH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where the program's part of the calling thread begins: its stack above
 * the library's entry point (the library's own frames hold stale copies of
 * addresses in slots they never wrote), and the registers a callee keeps
 * (callee-saved), copied as the entry began, before a frame of the library
 * could save them below that point. */
#define CA_REACH_REGS 12
typedef struct ca_reach_roots {
  uintptr_t stack_from;
  uintptr_t regs[CA_REACH_REGS];
} ca_reach_roots;

/* Fills *roots; first thing in an entry point, in its own frame. */
#if defined(__x86_64__)
#define CA__REACH_SAVE_REGS(r)                                                 \
  __asm__ volatile("mov %%rbx, 0(%0)\n\tmov %%rbp, 8(%0)\n\t"                  \
                   "mov %%r12, 16(%0)\n\tmov %%r13, 24(%0)\n\t"                \
                   "mov %%r14, 32(%0)\n\tmov %%r15, 40(%0)"                     \
                   : : "r"(r) : "memory")
#elif defined(__aarch64__)
#define CA__REACH_SAVE_REGS(r)                                                 \
  __asm__ volatile("stp x19, x20, [%0]\n\tstp x21, x22, [%0, #16]\n\t"        \
                   "stp x23, x24, [%0, #32]\n\tstp x25, x26, [%0, #48]\n\t"   \
                   "stp x27, x28, [%0, #64]\n\tstr x29, [%0, #80]"             \
                   : : "r"(r) : "memory")
#else
#define CA__REACH_SAVE_REGS(r) ((void)(r)) /* the stack only */
#endif
#define CA_REACH_ROOTS_HERE(roots)                                             \
  do {                                                                         \
    CA__REACH_SAVE_REGS((roots)->regs);                                        \
    (roots)->stack_from = (uintptr_t)__builtin_frame_address(0);               \
  } while (0)

/* One allocation to look for: [lo, hi). `found` is set by the scan;
 * `index` is the caller's, carried along. `blind`: when nonzero, a word
 * inside the allocation (not at lo) that is a multiple of it points into
 * it for no one but the driver, whose records hold the start of every
 * mapping (pages of expandable segments): it does not count. */
typedef struct ca_reach_target {
  uint64_t lo, hi;
  uint64_t blind;
  size_t index;
  bool found;
} ca_reach_target;

/* What one scan did. */
typedef struct ca_reach_stats {
  uint64_t scanned_bytes; /* host bytes read */
  uint64_t ns;            /* how long it took (CLOCK_MONOTONIC) */
  bool complete;          /* false: out of memory, or memory could not be
                             read (a sandbox refusing both ways): nothing
                             was classed */
} ca_reach_stats;

/* Sets `found` in every target that a host word points into. Targets may
 * be in any order and may not overlap; they are sorted in place. `roots`
 * was filled at the library's entry on this thread. */
void ca_reach_scan(ca_reach_target *targets, size_t n,
                   const ca_reach_roots *roots, ca_reach_stats *stats);

/* Whether the line [line, end) of /proc/self/maps is a mapping the scan
 * reads; fills its range [*lo, *hi) either way (for the tests). */
bool ca_reach_mapping_scanned(const char *line, const char *end, uintptr_t *lo,
                              uintptr_t *hi);

#endif /* CA_REACH_H */
