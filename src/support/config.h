/*
 * CUDALLOC_CONF: the library's settings.
 *
 * Syntax follows PyTorch's allocator variable: comma-separated key:value
 * pairs, e.g. "garbage_collection_threshold:0.8,max_split_size_mb:128".
 * Every key lives in one table (config.c) with its default and a doc string;
 * `help:1` prints that table. A bad item prints one line naming the key, the
 * value and what is accepted, and that key keeps its default.
 *
 * Parsing never allocates and reads `environ` directly, so it is safe inside a
 * preload constructor, before the C library has finished starting up.
 */
#ifndef CA_CONFIG_H
#define CA_CONFIG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest path log_path and suppressions accept, in bytes. */
#define CA_CONFIG_PATH_MAX 512
/* The longest name shared_limit accepts, in bytes, its NUL included. */
#define CA_CONFIG_NAME_MAX 65

/* report_format's values. */
typedef enum ca_report_format {
  CA_REPORT_TEXT,
  CA_REPORT_JSON,
} ca_report_format;

/* memcheck: the bytes of each block's red zone, after its requested end,
 * and the byte free memory, red zones included, holds (NaN in every float
 * format, -1 in every signed integer). */
#define CA_MEMCHECK_RED_ZONE 512
#define CA_MEMCHECK_FILL 0xFF

/* reuse_policy's values. */
typedef enum ca_reuse_setting {
  CA_REUSE_SETTING_SAFE,
  CA_REUSE_SETTING_IMMEDIATE,
  CA_REUSE_SETTING_DEVICE_SYNC,
} ca_reuse_setting;

/* Every key, one row each, its documentation included: the struct below,
 * the parser's table, `help:1` and README.md's table of settings (checked by
 * test_config) all come from these rows. Adding a key is adding a row.
 *
 * X(field, key, kind, words, min, max, default, default's text, accepted,
 *   meaning): `kind` is the field's type and unit: FRACTION (double), MIB
 * (uint64_t, bytes, given in MiB), INT (int), BOOL (bool), TEXT (a path of
 * at most CA_CONFIG_PATH_MAX - 1 bytes, "" when unset), NAME (a name of at
 * most CA_CONFIG_NAME_MAX - 1 letters, digits, '.', '_' and '-', not
 * starting with '.', "" when unset) or CHOICE (int, the
 * index of the word given in `words`); `min` and `max` bound the number
 * given (a 0 default may lie below `min`: then it means off). The meaning
 * is Markdown (`code`, *emphasis*), printed plain by `help:1`. */
#define CA_CONFIG_KEYS(X) \
  X(gc_threshold, garbage_collection_threshold, FRACTION, NULL, 0, 0, {.fraction = 0}, "0 (off)", \
    "a fraction strictly between 0 and 1", \
    "Before a new segment would push reserved memory past threshold × " \
    "budget (`memory_limit_mb`, else the device's total memory), fully free " \
    "cached segments are given back, least recently freed first. Unlike " \
    "PyTorch's, it needs no other setting.") \
  X(max_split_size, max_split_size_mb, MIB, NULL, 20, CA__MIB_MAX, {.integer = UINT64_MAX}, "unlimited", \
    "an integer number of MiB >= 20", \
    "Cached blocks this large or larger are never split; smaller requests " \
    "never take them; a larger request takes one only if it wastes under 20 " \
    "MiB.") \
  X(memory_limit, memory_limit_mb, MIB, NULL, 2, CA__MIB_MAX, {.integer = 0}, "0 (no limit)", \
    "0 (no limit) or an integer number of MiB >= 2", \
    "Hard cap on the device memory held per device: all its contexts' " \
    "pools, cache included, and every allocation passed through to the " \
    "driver, booked before the driver is asked. Past it, after giving back " \
    "the cache, allocation fails with `CUDA_ERROR_OUT_OF_MEMORY`. Under 2 " \
    "MiB (the smallest segment) nothing could be served, so it is refused.") \
  X(shared_limit, shared_limit, NAME, NULL, 0, 0, CA__NO_TEXT, "(none)", \
    "a name: 1 to 64 letters, digits, '.', '_' or '-', not first '.'", \
    "With `memory_limit_mb`, makes it one cap per device for every process " \
    "of this user on this machine that names the same group (the processes " \
    "of a container): their memory held and cached together never passes " \
    "it. The cap is the `memory_limit_mb` of the process that finds the " \
    "group empty. A request past it gives back this process's cache, then " \
    "asks the others for theirs, then fails with `CUDA_ERROR_OUT_OF_MEMORY` " \
    "and a line saying who holds what. A process that dies, however, loses " \
    "its part within a second. `cudalloc top` shows the group " \
    "(docs/CONTAINERS.md).") \
  X(expandable_segments, expandable_segments, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "PyTorch's setting of the name: requests above 1 MiB are served from " \
    "address ranges reserved as large as the device and mapped in 2 MiB " \
    "pages where blocks are; free pages go back to the driver from anywhere " \
    "inside (collection threshold, memory limit, out-of-memory recovery, " \
    "`cudalloc_empty_cache()`), blocks never move. Such blocks cannot be " \
    "exported with CUDA IPC (`cuIpcGetMemHandle` fails, saying why). Where " \
    "the driver refuses the virtual-memory calls, plain segments, with one " \
    "line saying so.") \
  X(enabled, enabled, BOOL, NULL, 0, 1, {.integer = 1}, "1", \
    CA__BOOL_ACCEPTED, \
    "0 makes the library a pure pass-through to the driver.") \
  X(verbose, verbose, INT, NULL, 0, 2, {.integer = 0}, "0", \
    "0, 1 or 2", \
    "How much the library prints: 0 quiet, 1 events (why an allocation " \
    "failed), 2 chatty (how each driver function was reached, the layers " \
    "composed around the pool, the leak scan's time).") \
  X(help, help, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "1 prints this table, every key with its default and meaning, as the " \
    "library loads.") \
  X(leak_report, leak_report, BOOL, NULL, 0, 1, {.integer = 1}, "1", \
    CA__BOOL_ACCEPTED, \
    "1 lists, at exit, every device allocation never freed, grouped by " \
    "where it came from; 0 prints nothing at exit.") \
  X(backtrace_depth, backtrace_depth, INT, NULL, 0, 64, {.integer = 0}, "0", \
    "an integer from 0 to 64", \
    "Frames of the call stack kept at each allocation, for the leak report; " \
    "0 groups leaks by size only (fastest).") \
  X(log_path, log_path, TEXT, NULL, 0, 0, CA__NO_TEXT, "(stderr)", \
    "a file path without ',', stderr or stdout (%p: the process id)", \
    "All output to this file (or to stdout) instead of stderr; `%p` becomes " \
    "the process id. Opened as LeakSanitizer opens its log: no symbolic " \
    "link followed, created 0600, a regular file of the user's only.") \
  X(leak_exitcode, leak_exitcode, INT, NULL, 0, 255, {.integer = 0}, "0 (off)", \
    "an integer from 0 to 255", \
    "When leaks are found and the program would exit 0, exit with this code " \
    "instead (for CI); the process then ends right after the report.") \
  X(suppressions, suppressions, TEXT, NULL, 0, 0, CA__NO_TEXT, "(none)", \
    "a file path without ','", \
    "A file of `leak:<pattern>` lines; leaks whose stack has a function or " \
    "module matching a pattern are counted apart, not listed.") \
  X(report_format, report_format, CHOICE, ca__report_formats, 0, 1, {.integer = CA_REPORT_TEXT}, "text", \
    "text or json", \
    "text for people; json writes each report as one JSON document per " \
    "line, for tools.") \
  X(max_leaks, max_leaks, INT, NULL, 0, INT_MAX, {.integer = 0}, "0 (all)", \
    "an integer >= 0", \
    "Leak groups printed at most, largest first; the summary still counts " \
    "every leak.") \
  X(stats, stats, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "1 prints each device's memory summary at exit.") \
  X(stats_signal, stats_signal, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "1 prints each device's memory summary whenever the process gets " \
    "SIGUSR1.") \
  X(reuse_policy, reuse_policy, CHOICE, ca__reuse_policies, 0, 2, {.integer = CA_REUSE_SETTING_SAFE}, "safe", \
    "safe, immediate or device_sync", \
    "When a freed block is handed out again: safe, once all later device " \
    "work is ordered after the work queued before the free, on every " \
    "stream; immediate, at once (right only if all device work runs on one " \
    "stream); device_sync, after synchronizing the device at every free, as " \
    "`cudaFree` does.") \
  X(growth_report, growth_report, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "Snapshots live memory by allocation site as the program runs (every 64 " \
    "allocations at first, less often as it goes, or at each " \
    "`cudalloc_mark()`) and reports, at exit and on SIGUSR1, the sites that " \
    "kept growing, even if freed at the end. Needs stacks: with " \
    "`backtrace_depth` 0 it keeps 16 frames.") \
  X(python_frames, python_frames, BOOL, NULL, 0, 1, {.integer = 1}, "1", \
    CA__BOOL_ACCEPTED, \
    "With stacks, in a CPython 3.9–3.13 process, the allocating thread's " \
    "Python frames (`file:line in function`) are merged into its stack, " \
    "where the interpreter's native frames stand; 0 keeps native frames " \
    "only.") \
  X(leak_scan, leak_scan, BOOL, NULL, 0, 1, {.integer = 1}, "1", \
    CA__BOOL_ACCEPTED, \
    "Before each leak report, scans the program's host memory (data and " \
    "bss, heap, anonymous mappings, thread stacks) for addresses inside " \
    "each unfreed allocation: one the program still points to is *still " \
    "reachable*, not leaked. Pooled blocks then never start at a segment's " \
    "base, which costs up to 2 MiB more per segment sized for one large " \
    "block. 0: every unfreed allocation is a leak, and segments are carved " \
    "from their first byte.") \
  X(report_reachable, report_reachable, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "1 lists the still reachable allocations too, grouped like the leaks; 0 " \
    "sums them in one line.") \
  X(trace_path, trace_path, TEXT, NULL, 0, 0, CA__NO_TEXT, "(none)", \
    "a file path without ',' (%p: the process id)", \
    "Writes the allocation timeline there as a Chrome trace (Perfetto, " \
    "chrome://tracing; `cudalloc view` draws it): each device's requested, " \
    "allocated and reserved bytes every 100 ms and at each new peak, " \
    "out-of-memory retries, collections, context deaths, and each " \
    "allocation with its stack.") \
  X(oom_snapshot, oom_snapshot, TEXT, NULL, 0, 0, CA__NO_TEXT, "(none)", \
    "a file path without ',' (%p: the process id)", \
    "At the process's first out of memory, writes PyTorch's memory " \
    "snapshot of that moment there (torch.cuda._memory_viz, " \
    "pytorch.org/memory_viz): every segment of the pools with its blocks, " \
    "live and cached, and the last allocations and frees before it (frames " \
    "under `backtrace_depth`).") \
  X(trace_allocations, trace_allocations, BOOL, NULL, 0, 1, {.integer = 1}, "1", \
    CA__BOOL_ACCEPTED, \
    "With `trace_path`, 1 records every allocation and free (with stacks " \
    "under `backtrace_depth`); 0 the counters and events only.") \
  X(publish_stats, publish_stats, BOOL, NULL, 0, 1, {.integer = 1}, "1", \
    CA__BOOL_ACCEPTED, \
    "Once a second, from a thread of the library's, each device's figures " \
    "go to `/dev/shm/cudalloc.<uid>.<pid>` (0600, removed at exit) for " \
    "`cudalloc top`; 0 publishes nothing and starts no thread for it.") \
  X(memcheck, memcheck, BOOL, NULL, 0, 1, {.integer = 0}, "0", \
    CA__BOOL_ACCEPTED, \
    "1 checks pooled blocks for overflows and writes after free without a " \
    "sanitizer (docs/LEAKS.md, \"memcheck\"): blocks handed out filled with " \
    "0xFF bytes and a 512-byte red zone of them after each, freed ones " \
    "filled again and held in a quarantine, checked as they leave it and at " \
    "exit; findings reported like leaks, with both stacks (16 frames " \
    "unless `backtrace_depth` says).")

#define CA__CONFIG_FIELD_FRACTION(f) double f;
#define CA__CONFIG_FIELD_MIB(f) uint64_t f;
#define CA__CONFIG_FIELD_INT(f) int f;
#define CA__CONFIG_FIELD_BOOL(f) bool f;
#define CA__CONFIG_FIELD_TEXT(f) char f[CA_CONFIG_PATH_MAX];
#define CA__CONFIG_FIELD_NAME(f) char f[CA_CONFIG_NAME_MAX];
#define CA__CONFIG_FIELD_CHOICE(f) int f;
#define CA__CONFIG_FIELD(field, key, kind, ...) CA__CONFIG_FIELD_##kind(field)

typedef struct ca_config {
  CA_CONFIG_KEYS(CA__CONFIG_FIELD)
} ca_config;

/* Fills *c with every key's default. */
void ca_config_defaults(ca_config *c);

/* Applies a CUDALLOC_CONF string to *c, item by item. Each bad item is
 * reported with ca_log and leaves its key at the value it had. Returns the
 * number of bad items. `text` may be NULL (nothing to apply). */
int ca_config_parse(ca_config *c, const char *text);

/* The process's settings, read from CUDALLOC_CONF in environ once
 * (thread-safe): as the library loads when the variable is set, else on
 * first use. Prints the help table when help:1 is set. The hooks ask at
 * every call: once read, the answer is a load, inlined. */
extern ca_config ca_config_settings;
extern atomic_bool ca_config_ready;
const ca_config *ca_config_load(void);
static inline const ca_config *ca_config_get(void) {
  if (__builtin_expect(
          atomic_load_explicit(&ca_config_ready, memory_order_acquire), 1))
    return &ca_config_settings;
  return ca_config_load();
}

/* Prints every key, its default and its meaning, one per line. */
void ca_config_print_help(void);

/* Key i's row of README.md's table of settings ("| `key` | default |
 * accepted | meaning |") into buf; false past the last key. The test that
 * holds the README to the rows uses it. */
bool ca_config_doc_row(size_t i, char *buf, size_t size);

#endif /* CA_CONFIG_H */
