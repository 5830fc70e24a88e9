/*
 * The pool's records and the state of an arena and a pool, shared by the
 * files of src/pool/ (the design: docs/POOL.md). Only those files include
 * it.
 */
#ifndef CA_POOL_INTERNAL_H
#define CA_POOL_INTERNAL_H

#include "pool/pool.h"

#include "support/fork.h"
#include "support/grow.h"
#include "support/lock.h"
#include "support/meta.h"
#include "support/stats.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Addresses are granule-aligned, so their low bits carry nothing: mix with a
 * multiplicative hash and keep the high half. */
static inline unsigned ca__hash_addr(uint64_t addr) {
  return (unsigned)((addr * 0x9E3779B97F4A7C15ull) >> 32);
}
#define HASH_FUNCTION(keyptr, keylen, hashv)                                   \
  ((hashv) = ca__hash_addr(*(const uint64_t *)(keyptr)))
#define HASH_KEYCMP(a, b, len)                                                 \
  (*(const uint64_t *)(a) != *(const uint64_t *)(b))
#include "support/meta_hash.h"

/* Size classes: CA__SL_COUNT per power of two of granules. */
#define CA__SL_BITS 4
#define CA__SL_COUNT (1u << CA__SL_BITS)
#define CA__FL_COUNT 40
/* Requests above this (64 TiB) cannot be real; refuse before any arithmetic
 * on them can overflow. */
#define CA__MAX_REQUEST (1ull << 46)
/* How many blocks of the request's own size class are looked at for a
 * tighter fit before falling back to the next class up. */
#define CA__CLASS_SCAN 8
/* A large request fences first only when the pending blocks are at least
 * 1/2^CA__FENCE_SHARE of the pool and the cache's best block wastes more
 * than 1/2^CA__FENCE_WASTE of the request (see ca__fence_first): on
 * recorded ResNet traces, a seventh of the fences of fencing before every
 * large request, for 0-3% more memory. */
#define CA__FENCE_SHARE 5
#define CA__FENCE_WASTE 2
/* ... and at most once per this many large requests: on the same traces,
 * 25-45% fewer fences than fencing whenever the rule above says so, a
 * quarter of them on a random mix of sizes (tests/bench/bench_pool), for
 * memory within 1%. */
#define CA__FENCE_EVERY 16
/* The library is preloaded, so its thread-locals sit in the static TLS
 * block and are reached without a call. */
#define CA__TLS __attribute__((tls_model("initial-exec")))
/* Off the hot path: a thread on its own arena, uncontended, never calls
 * these, and the compiler lays out the hot path around them. */
#define CA__COLD __attribute__((cold, noinline))
/* Records allocated at once when a slab runs dry. */
/* A slab grows by chunks of this many bytes, carved into records. */
#define CA__SLAB_CHUNK (16u << 10)

/* A block's state. GONE: freed, but its bytes are never handed out again
 * while its segment lives (they were shared with another process, or the
 * segment was freed behind the pool's back); it never merges. UNMAPPED:
 * addresses of an expandable segment with no memory behind them, whole
 * pages; two never lie side by side, and none is in any index. A FREE
 * block freed on a named stream belongs to that stream's free blocks
 * (stream_free.c) until they are shared. */
enum { CA__FREE = 1, CA__LIVE, CA__HELD, CA__QUICK, CA__GONE, CA__UNMAPPED };

typedef struct ca__segment ca__segment;
typedef struct ca__heap ca__heap;
typedef struct ca__arena ca__arena;
typedef struct ca__chunk ca__chunk;
typedef struct ca__batch ca__batch;
typedef struct ca__sfree ca__sfree;

/* Bytes [lo, hi). */
typedef struct ca__range {
  uint64_t lo, hi;
} ca__range;

/* The stale ranges a block keeps, at most (stale.c). */
#define CA__STALE_MAX 4

typedef struct ca__block {
  uint64_t addr;
  uint64_t size;
  uint64_t requested;
  uint64_t seq;
  uint64_t freed_at; /* the arena's free_tick when it last became FREE */
  struct ca__block *prev, *next;           /* neighbours in the segment */
  struct ca__block *link_prev, *link_next; /* bin, oversize, held or quick */
  ca__segment *seg;
  /* While FREE: the stream whose requests alone may take it at once (its
   * free blocks, stream_free.c), or NULL: any request may. */
  ca__sfree *owner;
  int state;
  /* GONE when freed: shared with another process, or pending in a lost
   * segment (one flag, so a free checks one byte it already has). */
  bool keep_out;
  /* While QUICK or HELD: kept as it was freed (entry.c's ca__stay_listed),
   * so still in the live table, with no bytes to answer for, and in the
   * address index: a request of its size takes it back with neither
   * changed. False in every other state. */
  bool listed;
  /* While LIVE: its red zone could not be set to fresh_byte as it was
   * handed out (ca_pool_stale). */
  bool red_zone_unset;
  uint8_t nstale; /* next to red_zone_unset: the hand-out reads both at once */
  unsigned fl, sl; /* size class, while in the bins */
  uint32_t tag;    /* the caller's, while CA__LIVE */
  /* Where it may not hold fresh_byte (nstale ranges): memcheck set only
   * part of a freed block back (ca_pool_stale, stale.c); none in every
   * block without memcheck. */
  ca__range stale[CA__STALE_MAX];
} ca__block;

/* The arena's live blocks by start (live.c). */
typedef struct ca__live_slot {
  uint64_t addr, requested; /* the block's, so a range check reads no more */
  ca__block *block;         /* NULL: the slot is empty */
} ca__live_slot;

typedef struct ca__live_table {
  ca__live_slot *slots; /* 2^bits */
  unsigned bits;
  uint64_t count;
} ca__live_table;

struct ca__segment {
  uint64_t addr;
  uint64_t size;
  uint64_t head; /* bytes before its first block (ca_pool_options) */
  ca__heap *heap;
  ca__block *first;
  ca__segment *prev, *next;         /* all segments of the arena */
  ca__segment *lru_prev, *lru_next; /* fully free segments, oldest first */
  uint64_t last_free; /* free_tick of the latest free inside it */
  int in_lru;
  /* A reserved range with pages mapped where blocks are (expandable.c):
   * `mapped` bytes of its `size` are memory, its first page always. */
  bool expandable;
  uint64_t mapped;
  bool lost;     /* freed behind the pool's back: never used or released
                    again; its records go when its last block does */
  /* The arena that owns it, and its records in the process-wide address
   * index (where.c; NULL when it could not be indexed). */
  _Atomic(ca__arena *) arena;
  ca__chunk *chunks;
  UT_hash_handle hh; /* in the arena's segment table, keyed by base */
};

/* Blocks freed before one backend marker, waiting for it to pass. */
struct ca__batch {
  uint64_t marker;
  ca__block *head, *tail;
  uint64_t bytes;
  ca__batch *next;
};

/* One index of free blocks: size classes with a bitmap per level, and the
 * blocks at or above max_split_size apart (bins.c). */
typedef struct ca__bins {
  uint64_t fl_bitmap;
  uint32_t sl_bitmap[CA__FL_COUNT];
  ca__block *bins[CA__FL_COUNT][CA__SL_COUNT];
  ca__block *oversize; /* ascending by size */
} ca__bins;

struct ca__heap {
  ca__bins free; /* the shared free blocks: any request may take them */
  ca__block *quick[CA__FL_COUNT][CA__SL_COUNT]; /* freed, not yet merged */
  uint64_t quick_fl_bitmap;
  uint32_t quick_sl_bitmap[CA__FL_COUNT];
  uint64_t oversize_from; /* blocks this large are oversize */
  int large;
  bool expandable; /* grows by mapping pages (expandable.c) */
};

/* The free blocks of one named stream (stream_free.c): a request on that
 * stream takes them at once, others only once they are shared. */
#define CA__STREAMS 16u
struct ca__sfree {
  uint64_t stream;
  ca__bins bins[2]; /* the small heap's, the large heap's */
  uint64_t bytes;   /* indexed here */
  uint64_t used;    /* the arena's free_tick at its latest free */
};

typedef struct ca__slab {
  void *free;
  void *chunks;
  size_t obj_size;
} ca__slab;

/* A cache line. Arenas start on one and the pool's counters that arenas
 * write sit on their own: a line that threads on different arenas write
 * would pass from core to core at every call. */
#define CA__LINE 64

/* One lock's share of a pool. The functions below that serve requests work
 * within one arena, named `p` as they would name a pool of one arena. */
struct ca__arena {
  _Alignas(CA__LINE) ca_lock lock;
  ca_pool *pool;
  unsigned index; /* in pool->arenas */
  /* The pool's, copied when the arena is made (they never change), so that
   * the arena's code reads them in one step. */
  const ca_backend *backend;
  int device;
  ca_pool_options opt;
  ca__heap small, large;
  ca__segment *segments;
  ca__segment *segment_table; /* the same segments, by base address */
  /* The same segments sorted by address, for "which holds this address"
   * (pointer queries); lost ones leave it. */
  ca__segment **by_addr;
  size_t nsegs, segs_cap;
  ca__segment *lru_head, *lru_tail;
  ca__block *held_head, *held_tail; /* the open batch: no marker yet */
  uint64_t open_bytes;
  ca__batch *batch_head, *batch_tail; /* closed batches, oldest first */
  uint64_t held_bytes; /* in the open batch and the closed ones */
  /* Named streams' free blocks, made when a stream first frees; the one
   * the request being served names (NULL: none), which ca__find serves
   * from first. */
  ca__sfree *streams[CA__STREAMS];
  unsigned nstreams;
  ca__sfree *want;
  bool want_named;
  uint64_t want_stream;
  unsigned large_since_fence; /* large requests since the last fence */
  uint64_t quick_bytes;
  uint64_t gone_bytes; /* in GONE blocks */
  uint64_t generation; /* bumped by drop_all: lets a waiter see it */
  /* Live blocks taken out of use, ever: a block a thread remembers from a
   * look-up (where.c) is still live while this has not moved. */
  _Atomic uint64_t removals;
  uint64_t gc_budget;  /* bytes; 0 until known */
  uint64_t va_size;    /* an expandable segment's range; 0 until known */
  unsigned nexpandable; /* expandable segments held */
  uint64_t next_seq, seq_end; /* the allocation numbers the arena holds */
  uint64_t free_tick; /* counts frees: orders the LRU list */
  ca__live_table live;
  ca__slab block_slab, segment_slab, batch_slab;
  /* The arena's own figures. Its reserved_bytes count its own segments; the
   * pool's count is pool->reserved. */
  cudalloc_device_stats stats;
};

struct ca_pool {
  /* Arena 0 is made with the pool, the others when a thread first needs
   * them; each is published once and lives as long as the pool. */
  _Atomic(ca__arena *) arenas[CA_POOL_ARENAS];
  const ca_backend *backend;
  int device;
  ca_pool_options opt;
  /* Bytes of the segments the arenas hold, and their peak: exact for the
   * pool, whichever arenas reserve and release. */
  _Alignas(CA__LINE) _Atomic uint64_t reserved;
  _Atomic uint64_t reserved_peak;
  /* The peak the statistics report: reserved_peak until a reset
   * (ca_pool_reset_peaks) starts it again from the current figure, while
   * reserved_peak, which steers trading at a miss, keeps the pool's
   * history. */
  _Atomic uint64_t reported_peak;
  /* reserved, plus the segments being asked of the backend right now: what
   * the collection threshold weighs; booked in the device's budget too. */
  _Atomic uint64_t committed;
  ca_budget *budget; /* the device's (options), or `unlimited` */
  ca_budget unlimited;
  _Atomic uint64_t seq; /* allocation numbers handed to the arenas so far */
  /* The backend refused address ranges (expandable.c): no arena, made now
   * or later, tries them again, and the refusal is said once. */
  atomic_bool ranges_off;
};

/* Arena `index` of the pool, or NULL when not made yet. */
static inline ca__arena *ca__arena_at(ca_pool *pool, unsigned index) {
  return atomic_load_explicit(&pool->arenas[index], memory_order_acquire);
}

/* The arenas made so far, in index order, into `out`; returns how many. */
static unsigned ca__arenas(ca_pool *pool, ca__arena *out[CA_POOL_ARENAS]) {
  unsigned n = 0;
  for (unsigned i = 0; i < CA_POOL_ARENAS; i++)
    if ((out[n] = ca__arena_at(pool, i)) != NULL)
      n++;
  return n;
}

#endif /* CA_POOL_INTERNAL_H */
