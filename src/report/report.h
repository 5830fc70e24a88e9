/*
 * What the library prints about memory: the leak report (live device
 * allocations grouped by where they came from) and the per-device memory
 * summary, as text for people or JSON for tools (docs/LEAKS.md). It is
 * given the blocks and statistics to print, so it knows no pool and no
 * driver, and the unit tests drive it directly.
 *
 * Nothing here calls CUDA: the report runs at exit, when the runtime and the
 * context may be gone. Scratch memory comes from mmap, not the program's
 * malloc; symbolizing stacks opens and maps the program's object files.
 */
#ifndef CA_REPORT_H
#define CA_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudalloc.h"
#include "leaks/sites.h"


/* Why a report is printed. */
typedef enum ca_report_event {
  CA_EVENT_EXIT,          /* the process is exiting */
  CA_EVENT_CONTEXT_RESET, /* a context died, taking its memory with it */
  CA_EVENT_SIGNAL,        /* SIGUSR1 with stats_signal:1 (stats only) */
  CA_EVENT_API,           /* cudalloc_print_report / cudalloc_print_stats */
  CA_EVENT_OOM,           /* a request refused for memory */
} ca_report_event;

/* A request refused for memory, as its report says it: the request, what
 * the device holds now, and what would help. */
typedef struct ca_report_oom {
  const char *call;    /* what asked: "cuMemAlloc", "the allocator slot" */
  uint64_t requested;  /* bytes */
  cudalloc_device_stats stats; /* the device's, now */
  uint64_t limit;      /* memory_limit_mb's bytes, or 0 */
  const char *advice;  /* what would have made room */
  const char *then;    /* what the caller does next, or NULL */
  bool brief;          /* the first line alone: no sites, no advice */
} ca_report_oom;

/* The sites an out-of-memory report lists at most, largest first. */
#define CA_REPORT_OOM_SITES 5

/* What a leak report found. */
typedef struct ca_leak_totals {
  uint64_t bytes, count;                        /* reported */
  uint64_t suppressed_bytes, suppressed_count;  /* matched a suppression */
  uint64_t reachable_bytes, reachable_count;    /* still reachable */
  uint64_t unclassed_bytes, unclassed_count;    /* of the reported */
} ca_leak_totals;

/* What the scan of host memory (reach.h) found of one live block. */
typedef enum ca_report_reach {
  CA_REACH_UNSCANNED, /* no scan (leak_scan:0, or it failed): a leak */
  CA_REACH_LOST,      /* no host word points into it: a leak */
  CA_REACH_UNCLASSED, /* the driver keeps its address too: a leak, said so */
  CA_REACH_REACHABLE, /* the program still points into it: not a leak */
} ca_report_reach;

/* The `call` of blocks the pool served (cuMemAlloc_v2, cudaMalloc). */
#define CA_REPORT_POOLED_CALL "cuMemAlloc"

/* One live allocation as the report sees it. */
typedef struct ca_report_block {
  uint64_t addr;  /* device address, or the handle for cuMemCreate */
  uint64_t bytes; /* as the program asked for them */
  uint64_t seq;   /* allocation number (per pool, or among passed-through) */
  int device;     /* -1 when unknown */
  uint32_t stack; /* stack id (stacks.h); 0 for none */
  const char *call; /* the driver function that allocated it */
  ca_report_reach reach;
  uint64_t page; /* a pooled block's expandable page size, else 0 (reach.h) */
} ca_report_block;

/* A device's held memory at its highest, and when (CLOCK_MONOTONIC). */
typedef struct ca_report_reserved {
  int device;
  uint64_t bytes, at_ns;
} ca_report_reserved;

/* Everything one report prints. */
typedef struct ca_report_input {
  ca_report_event event;
  int device; /* the device a context reset concerns; -1 otherwise */
  /* The leak part, when `leaks` is set: the live blocks, and how many
   * allocations the process made in all (for the line that says nothing
   * leaked). */
  bool leaks;
  const ca_report_block *blocks;
  size_t nblocks;
  uint64_t allocations;
  /* The memory summary, printed before the leaks; nstats 0 for none. */
  const cudalloc_device_stats *stats;
  size_t nstats;
  /* Memory over time (sites.h), printed after the leaks: the peak, when
   * `peak` is set and counted anything; the sites that kept growing, when
   * `growth` is set: the largest ngrowth of growth_found, out of
   * `snapshots` snapshots. */
  const ca_sites_peak *peak;
  const ca_site_growth *growth;
  size_t ngrowth, growth_found;
  uint64_t snapshots;
  /* With the peak: each device's held memory at its highest (its budget's
   * peak: the pools' segments and what went to the driver directly), and
   * when the run began (CLOCK_MONOTONIC), which the times count from. */
  const ca_report_reserved *reserved;
  size_t nreserved;
  uint64_t start_ns;
  /* CA_EVENT_OOM: the request; `blocks` are the device's live ones. */
  const ca_report_oom *oom;
  /* The settings (format, max_leaks, suppressions); NULL for the
   * process's own. */
  const struct ca_config *config;
} ca_report_input;

/* Prints one report in the configured format (report_format), honouring
 * max_leaks and suppressions. Returns what the leak part found. */
ca_leak_totals ca_report(const ca_report_input *in);

/* The same in two steps, for a caller that serializes reports with a lock:
 * ca_report_prepare does everything slow (sorting, grouping, and reading
 * symbol tables, which asks the dynamic loader where objects are: hold no
 * lock of the library's across it, since a thread inside dlopen may need
 * that lock), ca_report_print prints and frees. `in` must outlive both.
 * A NULL job (out of memory) prints one line saying so. */
typedef struct ca_report_job ca_report_job;
ca_report_job *ca_report_prepare(const ca_report_input *in);
ca_leak_totals ca_report_print(ca_report_job *job);

/* The first frame of a stack that is the program's own (as a report group
 * shows it first), in one line, from what is in memory only (dynamic
 * symbols, Python frames), so that a background thread may ask without
 * opening a file, whose descriptor the program might have counted on:
 * "train (torch_leak.py:88)", "my_exported_fn", or "prog+0x1234"; "?" for
 * none. Asks the dynamic loader: hold no library lock. */
void ca_report_site_name(uint32_t stack, char *buf, size_t len);

/* Each frame a report shows of a stack, one line each, to `line`, named as
 * the text report names it after "in ": "keep_step /src/e2e_leaks.c:120
 * (e2e_leaks+0x1234)", "train torch_leak.py:88 (Python)". Symbolizes: hold
 * no library lock. */
void ca_report_stack_lines(uint32_t stack, void (*line)(const char *text, void *arg),
                           void *arg);

/* What memcheck found wrong with one block (docs/LEAKS.md, "memcheck"). */
typedef enum ca_report_finding_kind {
  CA_FINDING_PAST_END,      /* its red zone written, found as it left the quarantine */
  CA_FINDING_AFTER_FREE,    /* its bytes written while in the quarantine */
  CA_FINDING_PAST_END_LIVE, /* its red zone written, the block still live */
} ca_report_finding_kind;

typedef struct ca_report_finding {
  ca_report_finding_kind kind;
  uint64_t addr, requested; /* the block, and the bytes the program asked */
  int device;
  /* The first byte found changed, as an offset past the block's end (past
   * it) or from its start (after free), and how many were. */
  uint64_t first, count;
  uint32_t alloc_stack, free_stack; /* stack ids; 0 for none */
} ca_report_finding;

/* Prints memcheck's findings f[0..n) in the configured format: a line and
 * the two stacks each, or one JSON document each (event "memcheck"); and,
 * when `unprinted` findings did not fit, how many. Symbolizes: hold no
 * library lock. */
void ca_report_findings(const ca_report_finding *f, size_t n, size_t unprinted);

/* memcheck's totals at exit, in the configured format: one line, or one
 * JSON document (event "memcheck_summary"). */
void ca_report_memcheck_totals(uint64_t checked, uint64_t past_end,
                               uint64_t after_free);

/* ---- PyTorch's memory snapshot (oom_snapshot) -------------------------- */

/* One block of one of the pools' segments, by device and address. */
typedef enum ca_report_block_state {
  CA_SNAP_LIVE,
  CA_SNAP_FREE,
  CA_SNAP_PENDING,  /* freed, waiting for the device */
  CA_SNAP_UNMAPPED, /* an expandable segment's range with no memory */
} ca_report_block_state;

typedef struct ca_report_seg_block {
  int device;
  uint64_t seg_addr, seg_size;
  bool expandable;
  uint64_t addr, size, requested;
  uint32_t stack;
  ca_report_block_state state;
} ca_report_seg_block;

/* One allocation or free of the history, oldest first. */
typedef struct ca_report_step {
  uint64_t us; /* CLOCK_REALTIME */
  bool alloc;  /* else a free */
  int device;
  uint64_t addr, bytes, stream;
  uint32_t stack;
} ca_report_step;

typedef struct ca_report_snapshot {
  const ca_report_seg_block *blocks; /* grouped by segment, in address order */
  size_t nblocks;
  const ca_report_step *steps;
  size_t nsteps;
  /* The request refused, last in its device's trace ("oom"). */
  int oom_device;
  uint64_t oom_bytes, oom_free, oom_us;
} ca_report_snapshot;

/* Writes the snapshot to `path` as PyTorch's torch.cuda.memory._snapshot()
 * pickles it (segments with their blocks, each device's trace, frames
 * innermost first), so that torch.cuda._memory_viz reads it. False, with
 * why, when the file cannot be written. Symbolizes: hold no library lock. */
bool ca_report_torch_snapshot(const char *path, const ca_report_snapshot *s,
                              char *why, size_t len);

#endif /* CA_REPORT_H */
