/*
 * The allocation timeline (trace_path): a Chrome trace (the Trace Event
 * Format's JSON array form, which Perfetto and chrome://tracing open, and
 * which stays readable if the process dies mid-run, since its closing
 * bracket is optional) of
 *   - one counter per device, requested, allocated and reserved bytes,
 *     every 100 ms and at exit; and at each new peak of the requested bytes
 *     (from the allocations' own events) or of the reserved ones, that
 *     figure alone, stamped when it came;
 *   - instant events: the program's start, out-of-memory retries, segments
 *     given back by the collection threshold, context deaths;
 *   - with trace_allocations:1, each pooled or passed-through allocation as
 *     an async slice from its allocation to its free, with its bytes and
 *     stack id, and each stack's frames once, as a metadata event; and the
 *     pool's own memory as the backend gets and gives it: each segment as
 *     an async slice ("segment") from its reservation to its release, and
 *     each mapping and unmapping of an expandable segment's pages as an
 *     instant event ("segment map", "segment unmap") with its address and
 *     bytes, so that a reader sees the cache, not only the blocks.
 * The first events name the format: metadata "cudalloc_trace", args
 * {"version": CA_TRACE_VERSION}; a reader refuses versions it does not know.
 *
 * An allocation or a free costs one slot of a ring (a compare-and-swap and
 * a few stores, no lock, no system call); the watcher thread drains the
 * ring and writes the JSON. A full ring drops events and says how many in
 * the trace. Off (no trace_path), each call is one branch. Records live in
 * the library's own memory (meta.h): they hold device addresses.
 */
#ifndef CA_TRACE_H
#define CA_TRACE_H

#include <stdbool.h>
#include <stdint.h>

extern bool ca_trace_recording; /* set once, before the first event */

/* 2: segments, maps and unmaps recorded; 1 (no "cudalloc_trace" event):
 * allocations alone. */
#define CA_TRACE_VERSION 2

/* What an event records. */
typedef enum ca_trace_kind {
  CA_TRACE_ALLOC,
  CA_TRACE_FREE,
  CA_TRACE_SEGMENT, /* a segment reserved */
  CA_TRACE_RELEASE, /* a segment given back */
  CA_TRACE_MAP,     /* pages of an expandable segment mapped */
  CA_TRACE_UNMAP,   /* ... and unmapped */
} ca_trace_kind;

/* Starts the trace into `path_template` ("%p": the pid): false (one line
 * said why) when the file cannot be made. `allocations`: the async slices.
 * `start_ns` (CLOCK_MONOTONIC): when the program started, written as the
 * instant "program start", so that a viewer can count time from the first
 * allocation and still say how long start-up took. */
bool ca_trace_start(const char *path_template, bool allocations, uint64_t start_ns);

/* One event of `kind` into the ring (the inline callers below check first
 * that a trace is being written). */
void ca_trace_slow(int device, uint64_t addr, uint64_t bytes, uint32_t stack,
                   ca_trace_kind kind);

static inline void ca_trace_alloc(int device, uint64_t addr, uint64_t bytes,
                                  uint32_t stack) {
  if (__builtin_expect(__atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE), 0))
    ca_trace_slow(device, addr, bytes, stack, CA_TRACE_ALLOC);
}

/* `bytes`: as the allocation asked for them (its ca_trace_alloc's). */
static inline void ca_trace_free(int device, uint64_t addr, uint64_t bytes) {
  if (__builtin_expect(__atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE), 0))
    ca_trace_slow(device, addr, bytes, 0, CA_TRACE_FREE);
}

/* The backend: the pool's memory as the driver gave or took it (a
 * segment's reservation or release, pages mapped or unmapped). */
static inline void ca_trace_memory(int device, uint64_t addr, uint64_t bytes,
                                   ca_trace_kind kind) {
  if (__builtin_expect(__atomic_load_n(&ca_trace_recording, __ATOMIC_ACQUIRE), 0))
    ca_trace_slow(device, addr, bytes, 0, kind);
}

/* From the watcher: a device's counters now, and instant events. */
void ca_trace_counter(int device, uint64_t requested, uint64_t allocated,
                      uint64_t reserved);
/* A device's reserved bytes reached a new peak, `reserved`, at `at_ns`
 * (CLOCK_MONOTONIC; earlier than the events around it: viewers order by
 * time): the reserved counter alone. */
void ca_trace_reserved_peak(int device, uint64_t at_ns, uint64_t reserved);
void ca_trace_instant(int device, const char *what);

/* From the watcher (and at exit): writes what the ring holds. `name` names
 * a stack's frames, one line each (report.h's ca_report_stack_lines). */
typedef void (*ca_trace_namer)(uint32_t stack,
                               void (*line)(const char *text, void *arg),
                               void *arg);
void ca_trace_drain(ca_trace_namer name);

/* At exit: drains, closes the array, stops. */
void ca_trace_finish(ca_trace_namer name);

/* In a forked child: stops without writing (the parent's file). */
void ca_trace_forget(void);

/* The file being written ("%p" expanded), or NULL when none is. */
const char *ca_trace_file(void);

#endif /* CA_TRACE_H */
