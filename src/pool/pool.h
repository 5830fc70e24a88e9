/*
 * The pool: a caching, size-binned allocator of device address space
 * (docs/POOL.md). One pool serves one device, through a backend bound to
 * one context; it carves the backend's segments into blocks, caches and
 * merges freed ones, and gives whole free segments back only on demand.
 *
 * The pool holds no CUDA type and makes no CUDA call; addresses are plain
 * 64-bit integers. Every function is thread-safe. The collection threshold
 * and reserved memory are the whole pool's; the memory limit is the
 * device's (budget.h).
 */
#ifndef CA_POOL_H
#define CA_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "support/budget.h"
#include "cudalloc.h"

/* Requests are rounded up to this many bytes. */
#define CA_GRANULE 512u
/* Requests up to this size are served from the small pool. */
#define CA_SMALL_REQUEST (1u << 20)
/* Segment size for the small pool. */
#define CA_SMALL_SEGMENT (2u << 20)
/* Requests below this size get segments of CA_MEDIUM_SEGMENT. */
#define CA_MEDIUM_REQUEST (10u << 20)
#define CA_MEDIUM_SEGMENT (20u << 20)
/* Larger requests get a segment of their own, rounded up to CA_LARGE_ROUND,
 * and no more: a coarser rounding left an unused tail in every segment (a
 * 49 MiB activation in a 52 MiB segment). A request just larger than a
 * freed segment (a layer's 147, then 155 MiB) is served by merging free
 * segments at the miss (see the top of this file), not by spare room kept
 * in every segment. */
#define CA_LARGE_ROUND (2u << 20)
/* Before the pool grows past the most it ever reserved, it gives back fully
 * free segments that no free has touched in this many frees: an idle
 * segment is traded for the one needed now, instead of holding both. The
 * idle age keeps a steady loop from trading the same segments every step. */
#define CA_TRADE_IDLE_FREES 1000
/* A large-pool block splits only if more than this would remain. */
#define CA_LARGE_MIN_REMAINDER (1u << 20)
/* A request at or above max_split_size takes a cached oversize block only if
 * it wastes less than this. */
#define CA_OVERSIZE_MAX_WASTE (20u << 20)
/* Arenas per pool at most: threads that contend spread over this many
 * locks. */
#define CA_POOL_ARENAS 8u

/* When a freed block may be handed out again (reuse_policy). */
typedef enum ca_reuse {
  /* After the device work queued before its free has finished, on every
   * stream: frees wait in batches, one backend marker per batch. */
  CA_REUSE_SAFE,
  /* At once: right for programs that run all device work on one stream. */
  CA_REUSE_IMMEDIATE,
  /* At once, after the backend synchronizes the device at every free (what
   * cudaFree does); a free during a stream capture waits like under SAFE. */
  CA_REUSE_DEVICE_SYNC,
} ca_reuse;

typedef struct ca_pool_options {
  uint64_t max_split_size; /* UINT64_MAX: every block may be split */
  double gc_threshold;     /* 0: off; else a fraction in (0,1) of budget */
  ca_reuse reuse;          /* SAFE needs the backend's markers */
  /* Bytes at the start of every segment that belong to no block (0 or
   * CA_GRANULE): then no block starts at a segment's base, the address the
   * backend handed out and that the driver keeps copies of in its own host
   * records (about 20 of each, measured on the H200), so a block the
   * program still points to can be told from a lost one by the program's
   * words alone (the leak report's scan, reach.h). A segment sized for one
   * request grows by it, to the next CA_LARGE_ROUND when the request fills
   * its rounding. */
  uint64_t segment_head;
  /* expandable_segments: the large heap grows inside address ranges
   * reserved without memory, mapping pages where a block needs them, and
   * gives free pages back from anywhere inside them; blocks never move.
   * Every block of that heap may be split (max_split_size does not apply
   * to it). Needs the backend's ranges (backend.h); without them, plain
   * segments, and options.warn says so once. */
  bool expandable;
  /* Bytes every block holds past its request (memcheck's red zone): a
   * block spans the request and these, rounded; its requested bytes, what
   * queries and statistics say, stay the request. */
  uint64_t red_zone;
  /* With fill_fresh, every segment and page is set to fresh_byte as the
   * backend gives it (memcheck's fill, so that memory never written reads
   * it); else it is left as it comes. */
  bool fill_fresh;
  unsigned char fresh_byte;
  /* The device's memory budget (memory_limit_mb), which the pool books
   * every segment against before asking the backend for it, shared with
   * the device's other pools and the allocations passed through to the
   * driver; NULL: no limit. It must outlive the pool. */
  ca_budget *budget;
  /* Says one line about something that went wrong outside the pool (a
   * segment freed behind its back); NULL for silence. Called with an
   * arena's lock held: it must not call into the pool. */
  void (*warn)(const char *line);
} ca_pool_options;

/* A live block as the leak report and the tests see it. */
typedef struct ca_live_block {
  uint64_t addr;
  uint64_t requested; /* bytes the program asked for */
  uint64_t size;      /* bytes the block spans (rounded) */
  uint64_t seq;       /* allocation number, unique in this pool, from 1:
                         in allocation order within an arena, and near it
                         across arenas (each draws numbers in runs of 64) */
  int device;
  uint32_t tag;       /* what the caller attached at allocation */
  /* It starts where the driver keeps a copy of the address: its segment's
   * base (no head), or a page of an expandable segment, each of which the
   * backend maps on its own. The leak report cannot class it. */
  bool at_base;
  /* In an expandable segment: its page size (the driver keeps every
   * page's start, which the leak report's scan must not take for a
   * pointer into the block); 0 in a plain segment. */
  uint64_t page;
  /* Its red zone could not be set to fresh_byte as it was handed out over
   * stale bytes (ca_pool_stale; a capture refused the fill): what the red
   * zone holds says nothing. */
  bool red_zone_unset;
} ca_live_block;

typedef struct ca_pool ca_pool;

/* Creates an empty pool for `device`; reserves nothing yet. The backend must
 * outlive the pool. Returns NULL only when the host is out of memory. */
ca_pool *ca_pool_create(const ca_backend *backend, int device,
                        const ca_pool_options *options);

/* Gives every segment back to the backend and frees the pool. Live blocks
 * die with it. */
void ca_pool_destroy(ca_pool *pool);

/* Forgets every segment without giving any back: the device already freed
 * them (a context reset). The pool stays usable and starts empty. */
void ca_pool_drop_all(ca_pool *pool);

/* Serves `size` bytes (0 is served as one granule). Returns 0 and the block's
 * address, or the backend's status: its oom_code when neither the cache nor
 * the backend (after giving back every free segment, once) can serve it.
 * `tag` is the caller's, kept with the live block and reported back (the
 * library stores the allocation's stack id there). */
int ca_pool_alloc(ca_pool *pool, uint64_t size, uint32_t tag, uint64_t *addr);

/* Takes back the live block starting at `addr`, describing it in *freed
 * (when not NULL) as it was. Returns false, changing nothing, when no live
 * block of this pool starts there. */
bool ca_pool_free(ca_pool *pool, uint64_t addr, ca_live_block *freed);

/* Stream-ordered reuse, for callers that know the stream (a framework's
 * allocator slot: docs/POOL.md). A block freed on `stream` is free at once
 * among that stream's blocks, split and merged as any: it serves the next
 * requests on the same stream with no marker (the stream's own order puts
 * the new work after the old), and requests on other streams only once a
 * marker recorded on `stream` alone has passed; the pool never fences for
 * them, whatever options.reuse says. `stream` is the caller's handle as a
 * number (0: the legacy stream). */
int ca_pool_alloc_on(ca_pool *pool, uint64_t size, uint32_t tag,
                     uint64_t stream, uint64_t *addr);
bool ca_pool_free_on(ca_pool *pool, uint64_t addr, uint64_t stream,
                     ca_live_block *freed);

/* `stream` is about to be destroyed (call it while the handle is valid):
 * its free blocks are shared behind a marker recorded on it now, so that
 * they serve every stream once its last work has passed, and no later
 * stream given the same handle finds them its own. Where no marker can be
 * made, they wait among the ordinary pending frees. */
void ca_pool_stream_ended(ca_pool *pool, uint64_t stream);

/* The bytes of blocks, for memcheck, through the pool's backend
 * (backend.h): whether it can touch them at all; a fill of `rows` rows of
 * `width` bytes, `pitch` apart, with `byte` on *stream, as one operation
 * (NULL: after the work on every stream, before any queued later); the
 * copies of n sets of rows to the host (from ca_pool_host_alloc) on
 * *stream (NULL: the legacy stream), those whose bytes all hold `expect`
 * perhaps left out, *started of them started (the backend's fetch); a
 * marker after the work queued so far on *stream
 * (NULL: on every stream); whether it has passed (0; 1 not yet), waiting
 * for it with `wait`, the marker forgotten once passed or waited for. */
bool ca_pool_touches_bytes(const ca_pool *pool);
int ca_pool_fill(ca_pool *pool, uint64_t addr, uint64_t width, uint64_t rows,
                 uint64_t pitch, unsigned char byte, const uint64_t *stream);
int ca_pool_fetch(ca_pool *pool, const ca_backend_rows *sets, size_t n,
                  unsigned char expect, const uint64_t *stream,
                  size_t *started);
int ca_pool_mark_after(ca_pool *pool, const uint64_t *stream,
                       uint64_t *marker);
int ca_pool_fetched(ca_pool *pool, uint64_t marker, bool wait);
void *ca_pool_host_alloc(ca_pool *pool, uint64_t size);

/* With fill_fresh: once freed, the live block at `addr` holds fresh_byte
 * everywhere but in bytes [lo, hi) (none when lo >= hi), which may hold
 * the program's: memcheck sets a large freed block back only where it
 * checks it, and says so at each free it makes. The pool remembers the
 * range through merges and splits, and sets a red zone (with the block's
 * rounding past it) that lies on it to fresh_byte as it hands the block
 * out again, on the request's stream, so that every red zone starts out
 * holding it. Returns false when no live block starts at `addr`. */
bool ca_pool_stale(ca_pool *pool, uint64_t addr, uint64_t lo, uint64_t hi);

/* The device the pool serves. */
int ca_pool_device(const ca_pool *pool);

/* Whether a live block of this pool starts at `addr`; its details if so. */
bool ca_pool_lookup(ca_pool *pool, uint64_t addr, ca_live_block *out);

/* Whether `addr` is the base of a segment the pool holds: an address the
 * driver would free whole, under the pool, if asked (a program freeing a
 * pooled pointer twice). */
bool ca_pool_holds_segment(ca_pool *pool, uint64_t addr);

/* Where an address lies in the pool: the segment holding it and, when it
 * lies in a live block's requested bytes, that block. */
typedef struct ca_pool_span {
  uint64_t segment, segment_size;
  bool expandable; /* the segment is a reserved range with pages mapped */
  bool live;
  ca_live_block block; /* when live */
} ca_pool_span;

/* Whether a segment of this pool holds `addr`; *out says where (a pointer
 * past a block's requested end, or in a free block, is in no live block:
 * the driver, asked about a block of its own, says the same). */
bool ca_pool_find(ca_pool *pool, uint64_t addr, ca_pool_span *out);

/* Where `addr` lies among all the pools of the process, by one process-wide
 * address index (no search through pools or arenas; docs/POOL.md). */
typedef enum ca_pool_where {
  CA_POOL_NOWHERE, /* no pool holds it */
  CA_POOL_FOUND,   /* *pool holds it; *out says where, as ca_pool_find */
  CA_POOL_ASK,     /* the index cannot say: ask each pool (ca_pool_find) */
} ca_pool_where;
ca_pool_where ca_pool_locate(uint64_t addr, ca_pool **pool,
                             ca_pool_span *out);

/* The same look-up when only the live block's bytes matter (the library's
 * range checks): FOUND with [*start, *end) its requested bytes, or {0, 0}
 * when addr lies in a pool's segment but in no live block's bytes. The
 * calling thread's last live block answers without a lock while its arena
 * has taken no block out of use since. */
ca_pool_where ca_pool_bounds(uint64_t addr, uint64_t *start, uint64_t *end);

/* Marks the live block starting at `addr` as shared with another process
 * (exported through CUDA IPC): once freed, its bytes are never handed out
 * again while its segment lives, since the other process may still use
 * them; the segment goes back to the backend, as any fully free one, when
 * the rest of it is free. Returns false when no live block starts there. */
bool ca_pool_share(ca_pool *pool, uint64_t addr);

/* Bytes in segments that hold no live block, and the free pages of
 * expandable ones: what the pool gives back to the backend, after waiting
 * for its pending frees, when the backend runs out (free memory a request
 * can get, beside the backend's own). */
uint64_t ca_pool_releasable(ca_pool *pool);

/* The segment holding `addr` was freed behind the pool's back (the backend
 * answers that it is no allocation): it is never used or given back again,
 * its live blocks are forgotten (their memory is gone), and options.warn
 * says so. Returns false when no segment holds `addr`. The pool finds this
 * itself when the backend hands out a segment that overlaps one it holds. */
bool ca_pool_segment_lost(ca_pool *pool, uint64_t addr);

/* Gives every fully free segment back, and every free page of expandable
 * ones. Returns the bytes given back. */
uint64_t ca_pool_empty_cache(ca_pool *pool);

/* Fills *out (zeroing what it does not set). Reserved bytes and their peak
 * are exact for the pool; other peaks add up its arenas' peaks. */
void ca_pool_get_stats(ca_pool *pool, cudalloc_device_stats *out);

/* Starts every peak of the statistics again from its current figure
 * (PyTorch's reset_peak_memory_stats). Only what is reported: the pool's
 * own steering (trading idle segments at its highest reservation) keeps
 * its history. */
void ca_pool_reset_peaks(ca_pool *pool);

/* Adds one pool's statistics into a sum (a device's): counts, totals and
 * current figures add up; peaks add up too, to at least the true peak,
 * since the parts peak at different times; the largest free block is the
 * largest. The caller sets device and fragmentation. */
void ca_pool_stats_add(cudalloc_device_stats *sum,
                       const cudalloc_device_stats *s);

/* The share of the cached free bytes outside the largest free block (0
 * when nothing is cached): a pool's, or a sum's once added up. */
double ca_pool_fragmentation(const cudalloc_device_stats *s);

/* One block of a segment, as ca_pool_foreach_block gives it: the
 * segment's range, and the block's bytes and state. */
typedef enum ca_pool_block_state {
  CA_POOL_BLOCK_LIVE,     /* the program's (tag its caller's) */
  CA_POOL_BLOCK_FREE,     /* cached, free to serve */
  CA_POOL_BLOCK_PENDING,  /* freed, waiting for the device (a marker) */
  CA_POOL_BLOCK_UNMAPPED, /* an expandable segment's bytes with no memory */
} ca_pool_block_state;

typedef struct ca_pool_block_view {
  uint64_t seg_addr, seg_size; /* the segment (its whole reserved range) */
  bool expandable;
  int device;
  uint64_t addr, size, requested; /* requested: a live block's, else 0 */
  uint32_t tag;
  ca_pool_block_state state;
} ca_pool_block_view;

/* Calls fn for every block of every segment, a segment's blocks in address
 * order, under the arena's lock (fn must not call the pool). Returns how
 * many. */
size_t ca_pool_foreach_block(ca_pool *pool,
                             void (*fn)(const ca_pool_block_view *v, void *arg),
                             void *arg);

/* Calls fn once per live block, under the lock of the block's arena: fn
 * must not call back into the pool. Returns the number of live blocks. */
size_t ca_pool_foreach_live(ca_pool *pool,
                            void (*fn)(const ca_live_block *b, void *arg),
                            void *arg);

/* Checks every invariant the pool relies on (blocks tile each segment, no
 * two live blocks overlap, bins hold exactly the free blocks, counters add
 * up). Returns true when consistent; otherwise writes the first broken rule
 * into why (if not NULL). For tests. */
bool ca_pool_check(ca_pool *pool, char *why, size_t why_len);

/* For tests and benchmarks: puts the calling thread on arena `index`
 * (modulo CA_POOL_ARENAS) of every pool, as if contention had moved it
 * there; contention moves it on as any thread. */
void ca_pool_set_thread_arena(unsigned index);

/* The calling thread's arena index, for tests and benchmarks. */
unsigned ca_pool_thread_arena(void);

/* How many live threads that met contention use arena `index` (modulo
 * CA_POOL_ARENAS), the count that steers moving threads: for tests. */
unsigned ca_pool_arena_threads(unsigned index);

#endif /* CA_POOL_H */
