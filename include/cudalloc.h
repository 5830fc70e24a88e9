/*
 * cudalloc: a caching, size-binned device-memory pool for any CUDA program.
 *
 * Most programs never include this header: preloading libcudalloc.so is
 * enough. A program that wants to steer the pool (empty the cache, read
 * statistics, print the report) may link against the library, or, when it is
 * only preloaded, look the functions up with dlsym(RTLD_DEFAULT, "cudalloc_...")
 * and do nothing when they are absent.
 *
 * Every function here is thread-safe and never calls into CUDA from a thread
 * that does not already use it (the allocator slot's pair is called to use
 * it).
 */
#ifndef CUDALLOC_H
#define CUDALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDALLOC_VERSION_MAJOR 0
#define CUDALLOC_VERSION_MINOR 1
#define CUDALLOC_VERSION_PATCH 0

#if defined(__GNUC__)
#define CUDALLOC_API __attribute__((visibility("default")))
#else
#define CUDALLOC_API
#endif

/* The highest device number (exclusive) the library keeps a pool for. */
#define CUDALLOC_MAX_DEVICES 64

/* One quantity seen three ways: now, at its highest, and summed over all
 * increments since the process started. */
typedef struct cudalloc_stat {
  uint64_t current;
  uint64_t peak;
  uint64_t total;
} cudalloc_stat;

/* The statistics of a device, one row each: the struct below is made from
 * this list, and so are the library's text and JSON summaries and
 * cudalloc_get_stats_json (whose names are the fields'). A row is
 *   STAT(field, row, bytes)  a cudalloc_stat; `row` names it in the text
 *                            summary, `bytes` says whether it counts bytes;
 *   COUNT(field)             a uint64_t the pools' figures add up to;
 *   MOST(field)              a uint64_t, the largest of the pools' figures.
 * reserved_bytes.current = allocated_bytes.current + free_cached_bytes
 *                          + pending_free_bytes */
#define CUDALLOC_DEVICE_STATS(STAT, COUNT, MOST)                               \
  STAT(requested_bytes, "requested", 1) /* as the program asked for them */    \
  STAT(allocated_bytes, "allocated", 1) /* as the pool rounded them */         \
  STAT(reserved_bytes, "reserved", 1)   /* held from the driver */             \
  STAT(blocks, "blocks", 0)             /* live blocks handed out */           \
  STAT(segments, "segments", 0)         /* driver allocations held */          \
  COUNT(allocs)               /* allocation requests served */                 \
  COUNT(frees)                /* blocks given back by the program */           \
  COUNT(cache_hits)           /* requests served without the driver */         \
  COUNT(backend_allocs)       /* segments asked of the driver */               \
  COUNT(backend_frees)        /* segments given back to the driver */          \
  COUNT(oom_retries)          /* driver out-of-memory answers retried */       \
  COUNT(gc_segments_released) /* segments given back by the threshold */       \
  COUNT(failed_allocs)        /* requests that ended in out of memory */       \
  COUNT(free_cached_bytes)    /* cached and reusable now */                    \
  COUNT(pending_free_bytes)   /* freed, waiting for device work to end */      \
  MOST(largest_free_block)    /* biggest single reusable cached block */

#define CUDALLOC__STAT_FIELD(field, row, bytes) cudalloc_stat field;
#define CUDALLOC__U64_FIELD(field) uint64_t field;

/* Statistics of one device: the sum of its pools (one per CUDA context;
 * most programs have one). Byte counts are exact; a peak is the sum of the
 * pools' peaks. */
typedef struct cudalloc_device_stats {
  int device;
  CUDALLOC_DEVICE_STATS(CUDALLOC__STAT_FIELD, CUDALLOC__U64_FIELD,
                        CUDALLOC__U64_FIELD)
  double fragmentation; /* 1 - largest_free_block / free_cached_bytes */
} cudalloc_device_stats;

/* The library's version as "MAJOR.MINOR.PATCH". */
CUDALLOC_API const char *cudalloc_version(void);

/* Gives every fully free cached segment back to the driver, on every device.
 * Returns the number of bytes given back. */
CUDALLOC_API uint64_t cudalloc_empty_cache(void);

/* Fills *out with the statistics of `device`'s pools. `out_size` is
 * sizeof(cudalloc_device_stats) as the caller knows it, so that older callers
 * keep working when the struct grows. Returns 0 on success, -1 when `device`
 * is out of range or has no pool yet (then *out is zeroed, device set). */
CUDALLOC_API int cudalloc_get_stats(int device, cudalloc_device_stats *out,
                                    size_t out_size);

/* The same figures as one JSON object, for callers that cannot use the
 * struct (Python, scripts): every field by its name, byte and block counts
 * as {"current":..,"peak":..,"total":..}, the object the summary's JSON
 * holds. Writes at most `len` bytes of `buf`, NUL included, as snprintf
 * does, and sets *needed (when not NULL) to the whole object's length plus
 * its NUL: a caller whose buffer was short calls again with that many.
 * Returns what cudalloc_get_stats returns (-1: the object holds zeros). */
CUDALLOC_API int cudalloc_get_stats_json(int device, char *buf, size_t len,
                                         size_t *needed);

/* Starts every peak of `device`'s statistics (every device's for -1) again
 * from its current figure, as PyTorch's reset_peak_memory_stats does. */
CUDALLOC_API void cudalloc_reset_peak_stats(int device);

/* Writes the per-device memory summary to the library's log (stderr unless
 * configured otherwise). */
CUDALLOC_API void cudalloc_print_stats(void);

/* Writes the report of live device allocations (the leak report at exit
 * prints the same) to the library's log. */
CUDALLOC_API void cudalloc_print_report(void);

/* Marks a point in the program's run (the end of a training step, say):
 * with growth_report:1, live memory by allocation site is snapshotted
 * here, and from the first mark on only at marks, so that growth is
 * measured per iteration. Costs one pass over the allocation sites. */
CUDALLOC_API void cudalloc_mark(void);

/* The allocation timeline on demand (what trace_path writes from the
 * start, with trace_allocations:1; docs/LEAKS.md): starts writing it into
 * `path` ("%p": the process id; created 0600, never through a link) unless
 * one is being written already, and returns 0 either way, -1 when the file
 * cannot be made (one line says why). cudalloc_trace_file() names the file
 * being written (NULL when none is); cudalloc_trace_flush() writes what was
 * recorded so far into it now (the library's watcher otherwise does every
 * 100 ms). Started so, it holds what happens from then on: blocks and
 * segments made before are not in it. The Python helper answers PyTorch's
 * memory history and snapshot calls through the slot with these. */
CUDALLOC_API int cudalloc_trace_start(const char *path);
CUDALLOC_API const char *cudalloc_trace_file(void);
CUDALLOC_API void cudalloc_trace_flush(void);

/* A framework's allocator slot: PyTorch's pluggable allocator
 * (torch.cuda.memory.CUDAPluggableAllocator(path, "cudalloc_stream_malloc",
 * "cudalloc_stream_free"), or cudalloc.torch.use() from the Python helper)
 * calls these with each allocation's device and stream (a cudaStream_t,
 * NULL for the legacy stream), from any thread: the request is served in
 * `device`'s primary context (the one the CUDA runtime and the frameworks
 * use), whatever context the calling thread has current, none included,
 * and that stays current. Knowing the stream, the pool reuses a freed block
 * at once for the next request on the same stream and for another stream
 * only after an event recorded on the first has passed: no fence. The
 * memory limit, statistics and leak report count these blocks like any
 * other. They work with the library preloaded or only loaded (dlopen).
 *
 * Out of memory, the device's cache is given back and the request tried
 * once more, as PyTorch's own allocator does. When a request (size > 0)
 * still cannot be served, one line says why (size, device, memory in use
 * and cached, the setting that would help), and then:
 * cudalloc_stream_malloc ends the process (abort), since PyTorch uses the
 * pointer unchecked and a NULL would fault later, far from its cause;
 * cudalloc_stream_try_malloc returns NULL, for callers that check (the
 * CuPy helper raises CuPy's OutOfMemoryError). A size of 0 returns NULL
 * with no word: no memory is needed. */
CUDALLOC_API void *cudalloc_stream_malloc(size_t size, int device,
                                          void *stream);
CUDALLOC_API void *cudalloc_stream_try_malloc(size_t size, int device,
                                              void *stream);
/* Gives back a block of either, from any thread: `stream` is the one it was
 * allocated on (PyTorch passes it back); `size` is unused. A pointer the
 * pool does not own is freed by the driver in `device`'s primary context;
 * a free that fails is said in one line. */
CUDALLOC_API void cudalloc_stream_free(void *ptr, size_t size, int device,
                                       void *stream);
/* A block of the pair is used on `stream` too, besides its own (PyTorch's
 * tensor.record_stream(stream); cudalloc.torch.use() routes it here): its
 * free waits for the work queued on `stream` before the free, so that no
 * one reuses the block under it. The block's own stream is made to wait
 * for that work (an event), and the block then goes back as usual. */
CUDALLOC_API void cudalloc_record_stream(void *ptr, int device, void *stream);

/* A CUDA graph captured through the slot (PyTorch's torch.cuda.graph;
 * cudalloc.torch.use() makes these calls): call cudalloc_graph_begin just
 * after the capture began on `stream` of `device`, cudalloc_graph_end just
 * after it ended, cudalloc_graph_release when the graph is destroyed. Every
 * block served for the capture stays the graph's, as in PyTorch's private
 * graph pools: freed by the program, it serves only the same graph's
 * capture again (a request of its exact size), and goes back to the pool
 * when the graph is released, once the device has finished its work. A
 * new segment asked during the capture is taken with this thread's capture
 * mode relaxed, as PyTorch does. cudalloc_graph_begin returns the graph's
 * number for the other two, 0 (with one line) when no more graphs can be
 * held, or -1 under enabled:0 (no pool: nothing to hold). */
CUDALLOC_API int cudalloc_graph_begin(int device, void *stream);
CUDALLOC_API void cudalloc_graph_end(int graph);
CUDALLOC_API void cudalloc_graph_release(int graph);

#ifdef __cplusplus
}
#endif

#endif /* CUDALLOC_H */
