/*
 * The pool (see pool.h): segments from the backend, carved into blocks.
 *
 * Layout of the state:
 * - Every segment keeps its blocks in address order (prev/next), so a freed
 *   block finds its neighbours in O(1) and merges with the free ones.
 * - Free blocks below max_split_size sit in a two-level segregated fit index
 *   (TLSF): 16 size classes per power of two, with a bitmap per level, so the
 *   first class holding a block large enough is found with two bit scans.
 * - Free blocks at or above max_split_size sit apart, in a list sorted by
 *   size: they are few, never split, and serve only large requests.
 * - Live blocks sit in a hash table keyed by address (uthash): it answers
 *   "is this pointer ours?" on free and is what the leak report reads.
 * - Segments whose every byte is free also sit in a least-recently-freed
 *   list: the garbage collector and the memory limit give those back first.
 * - Under CA_REUSE_SAFE, freed blocks wait until device work queued before
 *   their free has finished. They gather in an open batch; when the pool
 *   next misses, the backend makes one marker for the whole batch, which
 *   joins a FIFO of closed batches; a batch whose marker has passed (polled
 *   without waiting) goes back to the cache. Before growing, the pool waits
 *   for the markers older than the newest (the device is busy with the work
 *   after them anyway), and for all of them only when memory is short. So a
 *   free costs a list append, the driver is asked once per batch, not once
 *   per free, and what waits stays about one batch.
 * - Freed blocks are not merged at once: they wait, whole, in a LIFO "quick"
 *   list per size class (deferred coalescing, as dlmalloc's fast bins), so
 *   the steady state of a training loop, which frees and asks again for the
 *   same sizes, costs a list push and a pop. Any request the quick lists and
 *   the bins cannot serve first merges every quick block into the bins; so
 *   does every operation that needs the merged picture (growing, giving
 *   memory back, statistics).
 *
 * One mutex guards a pool. Block and segment records come from the pool's
 * own slabs, so serving a request never calls malloc.
 */
#include "pool.h"

#include "lock.h"

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
/* A failed bucket expansion only makes chains longer; never abort. */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

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
/* Records allocated at once when a slab runs dry. */
#define CA__SLAB_BATCH 128

enum { CA__FREE = 1, CA__LIVE, CA__HELD, CA__QUICK };

typedef struct ca__segment ca__segment;
typedef struct ca__heap ca__heap;
typedef struct ca__batch ca__batch;

typedef struct ca__block {
  uint64_t addr;
  uint64_t size;
  uint64_t requested;
  uint64_t seq;
  uint64_t time_ns;
  struct ca__block *prev, *next;           /* neighbours in the segment */
  struct ca__block *link_prev, *link_next; /* bin, oversize, held or quick */
  ca__segment *seg;
  int state;
  unsigned fl, sl; /* size class, while in the bins */
  uint32_t tag;    /* the caller's, while CA__LIVE */
  UT_hash_handle hh; /* in the live table while CA__LIVE */
} ca__block;

struct ca__segment {
  uint64_t addr;
  uint64_t size;
  ca__heap *heap;
  ca__block *first;
  ca__segment *prev, *next;         /* all segments of the pool */
  ca__segment *lru_prev, *lru_next; /* fully free segments, oldest first */
  uint64_t last_free; /* free_tick of the latest free inside it */
  int in_lru;
  UT_hash_handle hh; /* in the pool's segment table, keyed by base */
};

/* Blocks freed before one backend marker, waiting for it to pass. */
struct ca__batch {
  uint64_t marker;
  ca__block *head, *tail;
  uint64_t bytes;
  ca__batch *next;
};

struct ca__heap {
  uint64_t fl_bitmap;
  uint32_t sl_bitmap[CA__FL_COUNT];
  ca__block *bins[CA__FL_COUNT][CA__SL_COUNT];
  ca__block *oversize;    /* ascending by size */
  ca__block *quick[CA__FL_COUNT][CA__SL_COUNT]; /* freed, not yet merged */
  uint64_t quick_fl_bitmap;
  uint32_t quick_sl_bitmap[CA__FL_COUNT];
  uint64_t oversize_from; /* blocks this large are oversize */
  int large;
};

typedef struct ca__slab {
  void *free;
  void *chunks;
  size_t obj_size;
} ca__slab;

struct ca_pool {
  ca_lock lock;
  const ca_backend *backend;
  int device;
  ca_pool_options opt;
  ca__heap small, large;
  ca__segment *segments;
  ca__segment *segment_table; /* the same segments, by base address */
  ca__segment *lru_head, *lru_tail;
  ca__block *held_head, *held_tail; /* the open batch: no marker yet */
  uint64_t open_bytes;
  ca__batch *batch_head, *batch_tail; /* closed batches, oldest first */
  uint64_t held_bytes; /* in the open batch and the closed ones */
  uint64_t quick_bytes;
  uint64_t generation; /* bumped by drop_all: lets a waiter see it */
  uint64_t gc_budget;  /* bytes; 0 until known */
  uint64_t next_seq;
  uint64_t free_tick; /* counts frees: orders the LRU list */
  ca__block *live;     /* the live table */
  ca__block sentinel;  /* keeps the table allocated while it is empty */
  ca__slab block_slab, segment_slab, batch_slab;
  cudalloc_device_stats stats;
};

/* ---- Small helpers ------------------------------------------------------ */

static inline uint64_t ca__round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

static uint64_t ca__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void ca__stat_add(cudalloc_stat *s, uint64_t v) {
  s->current += v;
  s->total += v;
  if (s->current > s->peak)
    s->peak = s->current;
}

static void ca__stat_sub(cudalloc_stat *s, uint64_t v) { s->current -= v; }

static void *ca__slab_get(ca__slab *s) {
  if (!s->free) {
    char *chunk = malloc(sizeof(void *) + s->obj_size * CA__SLAB_BATCH);
    if (!chunk)
      return NULL;
    *(void **)chunk = s->chunks;
    s->chunks = chunk;
    char *objs = chunk + sizeof(void *);
    for (size_t i = 0; i < CA__SLAB_BATCH; i++) {
      *(void **)(objs + i * s->obj_size) = s->free;
      s->free = objs + i * s->obj_size;
    }
  }
  void *obj = s->free;
  s->free = *(void **)obj;
  return obj;
}

static void ca__slab_put(ca__slab *s, void *obj) {
  *(void **)obj = s->free;
  s->free = obj;
}

static void ca__slab_destroy(ca__slab *s) {
  while (s->chunks) {
    void *next = *(void **)s->chunks;
    free(s->chunks);
    s->chunks = next;
  }
  s->free = NULL;
}

/* ---- Size classes --------------------------------------------------------- */

static inline void ca__class_of(uint64_t size, unsigned *fl, unsigned *sl) {
  uint64_t n = size / CA_GRANULE;
  if (n < CA__SL_COUNT) {
    *fl = 0;
    *sl = (unsigned)n;
    return;
  }
  unsigned msb = 63u - (unsigned)__builtin_clzll(n);
  *fl = msb - CA__SL_BITS + 1;
  *sl = (unsigned)(n >> (msb - CA__SL_BITS)) & (CA__SL_COUNT - 1);
}

/* The smallest class boundary at or above `size`: every block of that class
 * or above fits a request of `size`. */
static inline uint64_t ca__class_ceiling(uint64_t size) {
  uint64_t n = size / CA_GRANULE;
  if (n < CA__SL_COUNT)
    return size;
  unsigned msb = 63u - (unsigned)__builtin_clzll(n);
  uint64_t step = (1ull << (msb - CA__SL_BITS)) - 1;
  return ((n + step) & ~step) * CA_GRANULE;
}

/* ---- Free-block index ----------------------------------------------------- */

static inline int ca__is_oversize(const ca__heap *h, uint64_t size) {
  return size >= h->oversize_from;
}

static void ca__link_remove(ca__block **head, ca__block *b) {
  if (b->link_prev)
    b->link_prev->link_next = b->link_next;
  else
    *head = b->link_next;
  if (b->link_next)
    b->link_next->link_prev = b->link_prev;
  b->link_prev = b->link_next = NULL;
}

static void ca__index_insert(ca__block *b) {
  ca__heap *h = b->seg->heap;
  if (ca__is_oversize(h, b->size)) {
    ca__block **at = &h->oversize, *prev = NULL;
    while (*at && (*at)->size < b->size) {
      prev = *at;
      at = &(*at)->link_next;
    }
    b->link_prev = prev;
    b->link_next = *at;
    if (*at)
      (*at)->link_prev = b;
    *at = b;
    return;
  }
  unsigned fl, sl;
  ca__class_of(b->size, &fl, &sl);
  b->fl = fl;
  b->sl = sl;
  ca__block **head = &h->bins[fl][sl];
  b->link_prev = NULL;
  b->link_next = *head;
  if (*head)
    (*head)->link_prev = b;
  *head = b;
  h->sl_bitmap[fl] |= 1u << sl;
  h->fl_bitmap |= 1ull << fl;
}

static void ca__index_remove(ca__block *b) {
  ca__heap *h = b->seg->heap;
  if (ca__is_oversize(h, b->size)) {
    ca__link_remove(&h->oversize, b);
    return;
  }
  unsigned fl = b->fl, sl = b->sl;
  ca__link_remove(&h->bins[fl][sl], b);
  if (!h->bins[fl][sl]) {
    h->sl_bitmap[fl] &= ~(1u << sl);
    if (!h->sl_bitmap[fl])
      h->fl_bitmap &= ~(1ull << fl);
  }
}

/* The first block of the first non-empty class at or above (fl, sl). */
static ca__block *ca__first_from(ca__heap *h, unsigned fl, unsigned sl) {
  uint32_t slmap = h->sl_bitmap[fl] & (~0u << sl);
  if (!slmap) {
    uint64_t flmap = fl + 1 < 64 ? h->fl_bitmap & (~0ull << (fl + 1)) : 0;
    if (!flmap)
      return NULL;
    fl = (unsigned)__builtin_ctzll(flmap);
    slmap = h->sl_bitmap[fl];
  }
  return h->bins[fl][__builtin_ctz(slmap)];
}

/* A good fit among blocks below max_split_size: the tightest of the first few
 * blocks in the request's own class, else any block of the next class that
 * is guaranteed to fit. */
static ca__block *ca__find_binned(ca__heap *h, uint64_t size) {
  unsigned fl, sl;
  uint64_t ceiling = ca__class_ceiling(size);
  if (ceiling != size) {
    ca__class_of(size, &fl, &sl);
    ca__block *best = NULL;
    ca__block *b = h->bins[fl][sl];
    for (int i = 0; b && i < CA__CLASS_SCAN; b = b->link_next, i++) {
      if (b->size >= size && (!best || b->size < best->size)) {
        best = b;
        if (b->size == size)
          break;
      }
    }
    if (best)
      return best;
  }
  ca__class_of(ceiling, &fl, &sl);
  if (fl >= CA__FL_COUNT)
    return NULL;
  return ca__first_from(h, fl, sl);
}

/* Oversize blocks serve only requests at or above max_split_size, and only
 * when they waste less than CA_OVERSIZE_MAX_WASTE. */
static ca__block *ca__find_oversize(ca__heap *h, uint64_t size) {
  for (ca__block *b = h->oversize; b; b = b->link_next) {
    if (b->size >= size)
      return b->size - size < CA_OVERSIZE_MAX_WASTE ? b : NULL;
  }
  return NULL;
}

static ca__heap *ca__heap_for(ca_pool *p, uint64_t size) {
  return size <= CA_SMALL_REQUEST ? &p->small : &p->large;
}

static ca__block *ca__find(ca_pool *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  if (ca__is_oversize(h, size))
    return ca__find_oversize(h, size);
  return ca__find_binned(h, size);
}

/* ---- Quick lists ---------------------------------------------------------- */

/* Parks a freed block, unmerged, where a request of its exact size finds it
 * first. */
static void ca__quick_push(ca_pool *p, ca__block *b) {
  ca__heap *h = b->seg->heap;
  unsigned fl, sl;
  ca__class_of(b->size, &fl, &sl);
  b->state = CA__QUICK;
  b->fl = fl;
  b->sl = sl;
  b->link_next = h->quick[fl][sl];
  h->quick[fl][sl] = b;
  h->quick_sl_bitmap[fl] |= 1u << sl;
  h->quick_fl_bitmap |= 1ull << fl;
  p->quick_bytes += b->size;
}

static ca__block *ca__quick_pop(ca_pool *p, ca__heap *h, unsigned fl,
                                unsigned sl) {
  ca__block *b = h->quick[fl][sl];
  h->quick[fl][sl] = b->link_next;
  b->link_next = NULL;
  if (!h->quick[fl][sl]) {
    h->quick_sl_bitmap[fl] &= ~(1u << sl);
    if (!h->quick_sl_bitmap[fl])
      h->quick_fl_bitmap &= ~(1ull << fl);
  }
  p->quick_bytes -= b->size;
  return b;
}

/* The most recently freed block of exactly `size` bytes, if it heads its
 * class's quick list. Oversize requests never get here. */
static ca__block *ca__quick_take(ca_pool *p, uint64_t size) {
  ca__heap *h = ca__heap_for(p, size);
  unsigned fl, sl;
  ca__class_of(size, &fl, &sl);
  ca__block *b = h->quick[fl][sl];
  if (!b || b->size != size)
    return NULL;
  return ca__quick_pop(p, h, fl, sl);
}

static void ca__block_make_free(ca_pool *p, ca__block *b);

/* Merges every parked block into the bins. */
static void ca__quick_flush(ca_pool *p) {
  ca__heap *heaps[2] = {&p->small, &p->large};
  for (int i = 0; i < 2; i++) {
    ca__heap *h = heaps[i];
    while (h->quick_fl_bitmap) {
      unsigned fl = (unsigned)__builtin_ctzll(h->quick_fl_bitmap);
      unsigned sl = (unsigned)__builtin_ctz(h->quick_sl_bitmap[fl]);
      ca__block_make_free(p, ca__quick_pop(p, h, fl, sl));
    }
  }
}

/* ---- Segments ------------------------------------------------------------- */

static int ca__segment_is_free(const ca__segment *s) {
  return s->first->state == CA__FREE && !s->first->next;
}

static void ca__lru_remove(ca_pool *p, ca__segment *s) {
  if (!s->in_lru)
    return;
  if (s->lru_prev)
    s->lru_prev->lru_next = s->lru_next;
  else
    p->lru_head = s->lru_next;
  if (s->lru_next)
    s->lru_next->lru_prev = s->lru_prev;
  else
    p->lru_tail = s->lru_prev;
  s->lru_prev = s->lru_next = NULL;
  s->in_lru = 0;
}

/* Files a segment that just became fully free by the time of its last free:
 * parked frees merge late, so the latest-freed segment does not always come
 * last. The search starts from the newest end, where it nearly always
 * stops. */
static void ca__lru_push(ca_pool *p, ca__segment *s) {
  ca__segment *after = p->lru_tail;
  while (after && after->last_free > s->last_free)
    after = after->lru_prev;
  s->lru_prev = after;
  s->lru_next = after ? after->lru_next : p->lru_head;
  if (s->lru_next)
    s->lru_next->lru_prev = s;
  else
    p->lru_tail = s;
  if (after)
    after->lru_next = s;
  else
    p->lru_head = s;
  s->in_lru = 1;
}

static void ca__segment_unlink(ca_pool *p, ca__segment *s) {
  HASH_DELETE(hh, p->segment_table, s);
  if (s->prev)
    s->prev->next = s->next;
  else
    p->segments = s->next;
  if (s->next)
    s->next->prev = s->prev;
}

/* Gives a fully free segment back to the backend. Whatever the backend says,
 * the pool forgets the segment: keeping a segment the driver may have freed
 * would be worse than leaking one it did not. */
static void ca__segment_release(ca_pool *p, ca__segment *s) {
  ca__index_remove(s->first);
  ca__lru_remove(p, s);
  ca__segment_unlink(p, s);
  p->backend->release(p->backend->ctx, p->device, s->addr, s->size);
  p->stats.backend_frees++;
  ca__stat_sub(&p->stats.reserved_bytes, s->size);
  ca__stat_sub(&p->stats.segments, 1);
  ca__slab_put(&p->block_slab, s->first);
  ca__slab_put(&p->segment_slab, s);
}

/* Gives back fully free segments, oldest first, until reserved memory is at
 * most `reserved_target`. Returns the bytes given back. */
static uint64_t ca__release_lru(ca_pool *p, uint64_t reserved_target) {
  uint64_t released = 0;
  while (p->lru_head && p->stats.reserved_bytes.current > reserved_target) {
    released += p->lru_head->size;
    ca__segment_release(p, p->lru_head);
  }
  return released;
}

static ca__block *ca__segment_new(ca_pool *p, ca__heap *h, uint64_t addr,
                                  uint64_t size) {
  ca__segment *s = ca__slab_get(&p->segment_slab);
  ca__block *b = s ? ca__slab_get(&p->block_slab) : NULL;
  if (!b) {
    if (s)
      ca__slab_put(&p->segment_slab, s);
    return NULL;
  }
  memset(s, 0, sizeof(*s));
  memset(b, 0, sizeof(*b));
  s->addr = addr;
  s->size = size;
  s->heap = h;
  s->first = b;
  s->last_free = p->free_tick; /* files it at the newest end of the LRU */
  s->next = p->segments;
  if (p->segments)
    p->segments->prev = s;
  p->segments = s;
  HASH_ADD(hh, p->segment_table, addr, sizeof(uint64_t), s);
  b->addr = addr;
  b->size = size;
  b->seg = s;
  b->state = CA__FREE;
  ca__index_insert(b);
  ca__lru_push(p, s);
  p->stats.backend_allocs++;
  ca__stat_add(&p->stats.reserved_bytes, size);
  ca__stat_add(&p->stats.segments, 1);
  return b;
}

/* ---- Blocks --------------------------------------------------------------- */

static void ca__block_merge_next(ca_pool *p, ca__block *b) {
  ca__block *n = b->next;
  b->size += n->size;
  b->next = n->next;
  if (n->next)
    n->next->prev = b;
  ca__slab_put(&p->block_slab, n);
}

/* Returns a block to the free index, merged with its free neighbours. */
static void ca__block_make_free(ca_pool *p, ca__block *b) {
  if (b->next && b->next->state == CA__FREE) {
    ca__index_remove(b->next);
    ca__block_merge_next(p, b);
  }
  if (b->prev && b->prev->state == CA__FREE) {
    ca__block *prev = b->prev;
    ca__index_remove(prev);
    ca__block_merge_next(p, prev);
    b = prev;
  }
  b->state = CA__FREE;
  ca__index_insert(b);
  if (ca__segment_is_free(b->seg))
    ca__lru_push(p, b->seg);
}

static int ca__worth_splitting(const ca__heap *h, uint64_t rest) {
  return h->large ? rest > CA_LARGE_MIN_REMAINDER : rest >= CA_GRANULE;
}

/* Takes a free block out of the index for a request of `size`, splitting off
 * the rest when it is worth keeping. Oversize blocks are never split. */
static void ca__block_take(ca_pool *p, ca__block *b, uint64_t size) {
  ca__heap *h = b->seg->heap;
  int oversize = ca__is_oversize(h, b->size);
  ca__index_remove(b);
  ca__lru_remove(p, b->seg);
  uint64_t rest = b->size - size;
  ca__block *r = NULL;
  if (!oversize && ca__worth_splitting(h, rest))
    r = ca__slab_get(&p->block_slab);
  if (r) {
    r->addr = b->addr + size;
    r->size = rest;
    r->seg = b->seg;
    r->state = CA__FREE;
    r->prev = b;
    r->next = b->next;
    if (b->next)
      b->next->prev = r;
    b->next = r;
    b->size = size;
    ca__index_insert(r);
  }
  b->state = CA__LIVE;
}

/* ---- Frees waiting for the device ---------------------------------------- */

/* Puts a freed block in the open batch (CA__HELD until its marker passes). */
static void ca__hold(ca_pool *p, ca__block *b) {
  b->state = CA__HELD;
  b->link_next = NULL;
  b->link_prev = p->held_tail;
  if (p->held_tail)
    p->held_tail->link_next = b;
  else
    p->held_head = b;
  p->held_tail = b;
  p->open_bytes += b->size;
  p->held_bytes += b->size;
}

/* Hands the blocks of a passed batch back to the cache. */
static void ca__release_batch(ca_pool *p, ca__batch *batch) {
  for (ca__block *b = batch->head, *next; b; b = next) {
    next = b->link_next;
    b->link_prev = NULL;
    ca__quick_push(p, b);
  }
  p->held_bytes -= batch->bytes;
  p->backend->forget(p->backend->ctx, p->device, batch->marker);
  ca__slab_put(&p->batch_slab, batch);
}

/* Closes the open batch under a new marker. Returns false, leaving the
 * batch open, when there is nothing to close or no marker may be made now
 * (a stream capture): the blocks then simply wait longer. */
static bool ca__close_batch(ca_pool *p) {
  if (!p->held_head || !p->backend->mark)
    return false;
  ca__batch *batch = ca__slab_get(&p->batch_slab);
  uint64_t marker = 0;
  if (!batch)
    return false;
  if (p->backend->mark(p->backend->ctx, p->device, &marker) != 0) {
    ca__slab_put(&p->batch_slab, batch);
    return false;
  }
  *batch = (ca__batch){.marker = marker,
                       .head = p->held_head,
                       .tail = p->held_tail,
                       .bytes = p->open_bytes};
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  if (p->batch_tail)
    p->batch_tail->next = batch;
  else
    p->batch_head = batch;
  p->batch_tail = batch;
  return true;
}

static void ca__pop_batch(ca_pool *p) {
  p->batch_head = p->batch_head->next;
  if (!p->batch_head)
    p->batch_tail = NULL;
}

/* Releases the closed batches whose markers have passed, oldest first,
 * without waiting. Returns true when blocks came back. */
static bool ca__reap(ca_pool *p) {
  bool any = false;
  while (p->batch_head &&
         p->backend->poll(p->backend->ctx, p->device,
                          p->batch_head->marker) == 0) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    ca__release_batch(p, batch);
    any = true;
  }
  return any;
}

/* On a miss: what has passed comes back; what was freed since the last
 * marker gets one, which has often passed already (the program synchronized
 * since). Returns true when blocks came back. */
static bool ca__recover_pending(ca_pool *p) {
  bool any = ca__reap(p);
  if (ca__close_batch(p))
    any |= ca__reap(p);
  return any;
}

/* Waits for the oldest batch, the lock released meanwhile so that other
 * threads keep allocating. Returns true when blocks came back; false when
 * there was nothing to wait for, the wait was refused (a stream capture),
 * or drop_all forgot the batch while we waited. */
static bool ca__wait_oldest(ca_pool *p) {
  if (!p->batch_head && !ca__close_batch(p))
    return false;
  ca__batch *batch = p->batch_head;
  uint64_t generation = p->generation;
  ca__pop_batch(p);
  ca_lock_release(&p->lock);
  int rc = p->backend->wait(p->backend->ctx, p->device, batch->marker);
  ca_lock_acquire(&p->lock);
  if (generation != p->generation) {
    p->backend->forget(p->backend->ctx, p->device, batch->marker);
    ca__slab_put(&p->batch_slab, batch);
    return false;
  }
  if (rc != 0) { /* not now: back at the head, still the oldest */
    batch->next = p->batch_head;
    p->batch_head = batch;
    if (!p->batch_tail)
      p->batch_tail = batch;
    return false;
  }
  ca__release_batch(p, batch);
  return true;
}

/* ---- Growing -------------------------------------------------------------- */

/* The segment a request of `size` would like: PyTorch's proven scheme. */
static uint64_t ca__segment_size(uint64_t size) {
  if (size <= CA_SMALL_REQUEST)
    return CA_SMALL_SEGMENT;
  if (size < CA_MEDIUM_REQUEST)
    return CA_MEDIUM_SEGMENT;
  return ca__round_up(size, CA_LARGE_ROUND);
}

/* The smallest segment that can serve `size`, used when memory is short. */
static uint64_t ca__segment_size_min(uint64_t size) {
  return ca__round_up(size, CA_LARGE_ROUND);
}

static uint64_t ca__gc_budget(ca_pool *p) {
  if (!p->gc_budget) {
    uint64_t free_bytes = 0, total = 0;
    if (p->opt.memory_limit)
      p->gc_budget = p->opt.memory_limit;
    else if (p->backend->mem_info(p->backend->ctx, p->device, &free_bytes,
                                  &total) == 0)
      p->gc_budget = total;
  }
  return p->gc_budget;
}

/* Before growing by `seg`, give back the oldest free segments that would
 * push reserved memory past the garbage collection threshold. */
static void ca__collect_garbage(ca_pool *p, uint64_t seg) {
  if (p->opt.gc_threshold <= 0)
    return;
  uint64_t budget = ca__gc_budget(p);
  if (!budget)
    return;
  uint64_t allowed = (uint64_t)(p->opt.gc_threshold * (double)budget);
  uint64_t target = allowed > seg ? allowed - seg : 0;
  uint64_t before = p->stats.segments.current;
  ca__release_lru(p, target);
  p->stats.gc_segments_released += before - p->stats.segments.current;
}

/* What the memory limit leaves the pool: the limit less the device memory
 * used beside it. UINT64_MAX when there is no limit. */
static uint64_t ca__limit_room(const ca_pool *p) {
  if (!p->opt.memory_limit)
    return UINT64_MAX;
  uint64_t outside =
      p->opt.outside_bytes ? atomic_load(p->opt.outside_bytes) : 0;
  return p->opt.memory_limit > outside ? p->opt.memory_limit - outside : 0;
}

static int ca__fits_limit(const ca_pool *p, uint64_t seg) {
  return p->stats.reserved_bytes.current + seg <= ca__limit_room(p);
}

/* Picks a segment size within the memory limit, giving back cached
 * segments first if need be. Returns 0 when nothing fits. */
static uint64_t ca__segment_within_limit(ca_pool *p, uint64_t size) {
  uint64_t seg = ca__segment_size(size);
  if (ca__fits_limit(p, seg))
    return seg;
  uint64_t min = ca__segment_size_min(size), room = ca__limit_room(p);
  if (room >= min)
    ca__release_lru(p, room - min);
  if (ca__fits_limit(p, seg))
    return seg;
  return ca__fits_limit(p, min) ? min : 0;
}

static int ca__reserve(ca_pool *p, ca__heap *h, uint64_t seg,
                       ca__block **out) {
  uint64_t addr = 0;
  int rc = p->backend->reserve(p->backend->ctx, p->device, seg, &addr);
  if (rc != 0)
    return rc;
  *out = ca__segment_new(p, h, addr, seg);
  if (!*out) {
    p->backend->release(p->backend->ctx, p->device, addr, seg);
    return p->backend->oom_code;
  }
  return 0;
}

/* Whether a new segment of `seg` bytes would pass the memory limit or the
 * garbage collection threshold: then freed blocks are worth waiting for. */
static bool ca__short_of_memory(ca_pool *p, uint64_t seg) {
  uint64_t after = p->stats.reserved_bytes.current + seg;
  if (after > ca__limit_room(p))
    return true;
  if (p->opt.gc_threshold <= 0)
    return false;
  uint64_t budget = ca__gc_budget(p);
  return budget && (double)after > p->opt.gc_threshold * (double)budget;
}

/* Waits for pending batches, oldest first, until one of their blocks serves
 * `size`. Returns true with *out set when one does. */
static bool ca__wait_for_fit(ca_pool *p, uint64_t size, ca__block **out) {
  while (ca__wait_oldest(p)) {
    ca__quick_flush(p);
    if ((*out = ca__find(p, size)))
      return true;
  }
  return false;
}

/* Waits for the batches older than the newest one while none of them has
 * served `size`. The host runs ahead of the device: without this the pool
 * grows by everything freed in the work queued ahead, steps of a training
 * loop deep. Waiting for an older marker keeps the device busy (the work
 * queued after it is still ahead of it) and bounds what waits to about one
 * batch; the newest is never waited for here, which would drain the queue.
 * Returns true with *out set when a block came back that serves `size`. */
static bool ca__wait_for_older(ca_pool *p, uint64_t size, ca__block **out) {
  while (p->batch_head && p->batch_head != p->batch_tail) {
    if (!ca__wait_oldest(p))
      return false;
    ca__quick_flush(p);
    if ((*out = ca__find(p, size)))
      return true;
  }
  return false;
}

/* Serves a cache miss with a new segment. Blocks freed before older
 * markers are waited for first, and, when memory is short, all of them. When the backend or the
 * memory limit refuses the segment: wait for every pending block, give
 * back every cached segment, and retry once with the smallest segment that
 * serves the request. */
static int ca__grow(ca_pool *p, uint64_t size, ca__block **out) {
  ca__heap *h = ca__heap_for(p, size);
  int oom = p->backend->oom_code;
  if (ca__wait_for_older(p, size, out))
    return 0;
  if (ca__short_of_memory(p, ca__segment_size(size)) &&
      ca__wait_for_fit(p, size, out))
    return 0;
  ca__collect_garbage(p, ca__segment_size(size));
  uint64_t seg = ca__segment_within_limit(p, size);
  if (seg) {
    int rc = ca__reserve(p, h, seg, out);
    if (rc != oom)
      return rc;
    p->stats.oom_retries++;
  }
  if (ca__wait_for_fit(p, size, out))
    return 0;
  ca__release_lru(p, 0);
  seg = ca__segment_size_min(size);
  if (!ca__fits_limit(p, seg))
    return oom;
  return ca__reserve(p, h, seg, out);
}

/* ---- Public entry points -------------------------------------------------- */

static void ca__heap_init(ca__heap *h, int large, uint64_t max_split_size) {
  memset(h, 0, sizeof(*h));
  h->large = large;
  /* Small blocks are never large enough to be kept whole. */
  h->oversize_from = large ? max_split_size : UINT64_MAX;
}

static int ca__live_init(ca_pool *p) {
  p->live = NULL;
  memset(&p->sentinel, 0, sizeof(p->sentinel));
  HASH_ADD(hh, p->live, addr, sizeof(uint64_t), &p->sentinel);
  return p->live != NULL;
}

ca_pool *ca_pool_create(const ca_backend *backend, int device,
                        const ca_pool_options *options) {
  ca_pool *p = calloc(1, sizeof(*p));
  if (!p)
    return NULL;
  p->backend = backend;
  p->device = device;
  p->opt = *options;
  /* Without markers a pool cannot order reuse after device work: it falls
   * back to synchronizing at each free, or to reusing at once. */
  if (p->opt.reuse == CA_REUSE_SAFE && !backend->mark)
    p->opt.reuse = backend->synchronize ? CA_REUSE_DEVICE_SYNC
                                        : CA_REUSE_IMMEDIATE;
  if (p->opt.reuse == CA_REUSE_DEVICE_SYNC && !backend->synchronize)
    p->opt.reuse = CA_REUSE_IMMEDIATE;
  ca__heap_init(&p->small, 0, p->opt.max_split_size);
  ca__heap_init(&p->large, 1, p->opt.max_split_size);
  p->block_slab.obj_size = sizeof(ca__block);
  p->segment_slab.obj_size = sizeof(ca__segment);
  p->batch_slab.obj_size = sizeof(ca__batch);
  p->stats.device = device;
  if (!ca__live_init(p)) {
    free(p);
    return NULL;
  }
  return p;
}

/* Frees every record and forgets every segment, leaving an empty pool. */
static void ca__forget_all(ca_pool *p, int release) {
  HASH_CLEAR(hh, p->segment_table);
  while (p->segments) {
    ca__segment *s = p->segments;
    p->segments = s->next;
    if (release)
      p->backend->release(p->backend->ctx, p->device, s->addr, s->size);
    for (ca__block *b = s->first, *n; b; b = n) {
      n = b->next;
      ca__slab_put(&p->block_slab, b);
    }
    ca__slab_put(&p->segment_slab, s);
  }
  HASH_CLEAR(hh, p->live);
  ca__heap_init(&p->small, 0, p->opt.max_split_size);
  ca__heap_init(&p->large, 1, p->opt.max_split_size);
  p->lru_head = p->lru_tail = NULL;
  while (p->batch_head) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    p->backend->forget(p->backend->ctx, p->device, batch->marker);
    ca__slab_put(&p->batch_slab, batch);
  }
  p->held_head = p->held_tail = NULL;
  p->open_bytes = 0;
  p->held_bytes = 0;
  p->quick_bytes = 0;
  p->generation++;
}

void ca_pool_destroy(ca_pool *p) {
  if (!p)
    return;
  ca__forget_all(p, 1);
  ca__slab_destroy(&p->block_slab);
  ca__slab_destroy(&p->segment_slab);
  ca__slab_destroy(&p->batch_slab);
  free(p);
}

void ca_pool_drop_all(ca_pool *p) {
  ca_lock_acquire(&p->lock);
  ca__forget_all(p, 0);
  ca__live_init(p);
  p->stats.requested_bytes.current = 0;
  p->stats.allocated_bytes.current = 0;
  p->stats.reserved_bytes.current = 0;
  p->stats.blocks.current = 0;
  p->stats.segments.current = 0;
  ca_lock_release(&p->lock);
}

/* Finds a free block of at least `size` bytes in the cache: the quick lists
 * first, then the bins, then both again after merging parked blocks and,
 * last, after taking back the pending blocks whose device work has passed
 * (never waiting for any). */
static ca__block *ca__find_cached(ca_pool *p, uint64_t size) {
  ca__block *b = ca__find(p, size);
  if (!b && p->quick_bytes) {
    ca__quick_flush(p);
    b = ca__find(p, size);
  }
  if (!b && (p->held_head || p->batch_head) && ca__recover_pending(p)) {
    ca__quick_flush(p);
    b = ca__find(p, size);
  }
  return b;
}

/* Finds or makes a free block of at least `size` bytes, out of every index. */
static int ca__obtain(ca_pool *p, uint64_t size, ca__block **out) {
  ca__block *b = ca__find_cached(p, size);
  if (b) {
    p->stats.cache_hits++;
    ca__block_take(p, b, size);
    *out = b;
    return 0;
  }
  int rc = ca__grow(p, size, &b);
  if (rc == 0) {
    ca__block_take(p, b, size);
    *out = b;
  }
  return rc;
}

int ca_pool_alloc(ca_pool *p, uint64_t size, uint32_t tag, uint64_t *addr) {
  if (size > CA__MAX_REQUEST)
    return p->backend->oom_code;
  uint64_t rounded = ca__round_up(size ? size : 1, CA_GRANULE);
  ca_lock_acquire(&p->lock);
  ca__block *b = ca__quick_take(p, rounded);
  if (b) {
    p->stats.cache_hits++;
    b->state = CA__LIVE;
  } else {
    int rc = ca__obtain(p, rounded, &b);
    if (rc != 0) {
      p->stats.failed_allocs++;
      ca_lock_release(&p->lock);
      return rc;
    }
  }
  b->requested = size;
  b->tag = tag;
  b->seq = ++p->next_seq;
  b->time_ns = ca__now_ns();
  HASH_ADD(hh, p->live, addr, sizeof(uint64_t), b);
  p->stats.allocs++;
  ca__stat_add(&p->stats.requested_bytes, size);
  ca__stat_add(&p->stats.allocated_bytes, b->size);
  ca__stat_add(&p->stats.blocks, 1);
  *addr = b->addr;
  ca_lock_release(&p->lock);
  return 0;
}

static ca__block *ca__live_find(ca_pool *p, uint64_t addr) {
  ca__block *b = NULL;
  if (addr != 0)
    HASH_FIND(hh, p->live, &addr, sizeof(uint64_t), b);
  return b;
}

/* A freed block's way back to the cache, by policy. device_sync waits
 * under the lock: it is a debugging policy, and cudaFree itself stalls
 * the whole device. */
static void ca__retire(ca_pool *p, ca__block *b) {
  if (p->opt.reuse == CA_REUSE_IMMEDIATE ||
      (p->opt.reuse == CA_REUSE_DEVICE_SYNC &&
       p->backend->synchronize(p->backend->ctx, p->device) == 0))
    ca__quick_push(p, b);
  else
    ca__hold(p, b);
}

bool ca_pool_free(ca_pool *p, uint64_t addr) {
  ca_lock_acquire(&p->lock);
  ca__block *b = ca__live_find(p, addr);
  if (!b) {
    ca_lock_release(&p->lock);
    return false;
  }
  HASH_DELETE(hh, p->live, b);
  b->seg->last_free = ++p->free_tick;
  p->stats.frees++;
  ca__stat_sub(&p->stats.requested_bytes, b->requested);
  ca__stat_sub(&p->stats.allocated_bytes, b->size);
  ca__stat_sub(&p->stats.blocks, 1);
  ca__retire(p, b);
  ca_lock_release(&p->lock);
  return true;
}

static void ca__describe(const ca_pool *p, const ca__block *b,
                         ca_live_block *out) {
  out->addr = b->addr;
  out->requested = b->requested;
  out->size = b->size;
  out->seq = b->seq;
  out->time_ns = b->time_ns;
  out->device = p->device;
  out->tag = b->tag;
}

int ca_pool_device(const ca_pool *p) { return p->device; }

bool ca_pool_lookup(ca_pool *p, uint64_t addr, ca_live_block *out) {
  ca_lock_acquire(&p->lock);
  ca__block *b = ca__live_find(p, addr);
  if (b && out)
    ca__describe(p, b, out);
  ca_lock_release(&p->lock);
  return b != NULL;
}

bool ca_pool_holds_segment(ca_pool *p, uint64_t addr) {
  ca__segment *s = NULL;
  ca_lock_acquire(&p->lock);
  HASH_FIND(hh, p->segment_table, &addr, sizeof(uint64_t), s);
  ca_lock_release(&p->lock);
  return s != NULL;
}

uint64_t ca_pool_empty_cache(ca_pool *p) {
  ca_lock_acquire(&p->lock);
  while (ca__wait_oldest(p))
    ;
  ca__quick_flush(p);
  uint64_t released = ca__release_lru(p, 0);
  ca_lock_release(&p->lock);
  return released;
}

static uint64_t ca__largest_free(const ca_pool *p) {
  uint64_t largest = 0;
  const ca__heap *heaps[2] = {&p->small, &p->large};
  for (int i = 0; i < 2; i++) {
    const ca__heap *h = heaps[i];
    for (const ca__block *b = h->oversize; b; b = b->link_next)
      largest = b->size > largest ? b->size : largest;
    if (!h->fl_bitmap)
      continue;
    unsigned fl = 63u - (unsigned)__builtin_clzll(h->fl_bitmap);
    unsigned sl = 31u - (unsigned)__builtin_clz(h->sl_bitmap[fl]);
    for (const ca__block *b = h->bins[fl][sl]; b; b = b->link_next)
      largest = b->size > largest ? b->size : largest;
  }
  return largest;
}

void ca_pool_get_stats(ca_pool *p, cudalloc_device_stats *out) {
  ca_lock_acquire(&p->lock);
  ca__quick_flush(p);
  *out = p->stats;
  out->pending_free_bytes = p->held_bytes;
  out->free_cached_bytes = p->stats.reserved_bytes.current -
                           p->stats.allocated_bytes.current - p->held_bytes;
  out->largest_free_block = ca__largest_free(p);
  ca_lock_release(&p->lock);
  out->fragmentation =
      out->free_cached_bytes
          ? 1.0 - (double)out->largest_free_block /
                      (double)out->free_cached_bytes
          : 0.0;
}

size_t ca_pool_foreach_live(ca_pool *p,
                            void (*fn)(const ca_live_block *b, void *arg),
                            void *arg) {
  size_t n = 0;
  ca_lock_acquire(&p->lock);
  for (ca__block *b = p->live; b; b = b->hh.next) {
    if (b == &p->sentinel)
      continue;
    ca_live_block info;
    ca__describe(p, b, &info);
    fn(&info, arg);
    n++;
  }
  ca_lock_release(&p->lock);
  return n;
}

/* ---- Consistency check (tests) -------------------------------------------- */

#define CA__CHECK(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (why)                                                                 \
        snprintf(why, why_len, __VA_ARGS__);                                   \
      return false;                                                            \
    }                                                                          \
  } while (0)

static bool ca__in_index(const ca__block *b) {
  const ca__heap *h = b->seg->heap;
  const ca__block *it;
  if (ca__is_oversize(h, b->size)) {
    it = h->oversize;
  } else {
    unsigned fl, sl;
    ca__class_of(b->size, &fl, &sl);
    it = h->bins[fl][sl];
  }
  for (; it; it = it->link_next)
    if (it == b)
      return true;
  return false;
}

static size_t ca__count_index(const ca__heap *h) {
  size_t n = 0;
  for (const ca__block *b = h->oversize; b; b = b->link_next)
    n++;
  for (unsigned fl = 0; fl < CA__FL_COUNT; fl++)
    for (unsigned sl = 0; sl < CA__SL_COUNT; sl++)
      for (const ca__block *b = h->bins[fl][sl]; b; b = b->link_next)
        n++;
  return n;
}

static bool ca__check_locked(ca_pool *p, char *why, size_t why_len) {
  uint64_t reserved = 0, live = 0, free_bytes = 0, held = 0, quick = 0;
  size_t nfree = 0, nlive = 0, nseg = 0;
  for (ca__segment *s = p->segments; s; s = s->next, nseg++) {
    uint64_t at = s->addr;
    CA__CHECK(s->first && !s->first->prev, "segment %#llx: bad first block",
              (unsigned long long)s->addr);
    for (ca__block *b = s->first; b; b = b->next) {
      CA__CHECK(b->addr == at && b->seg == s && b->size > 0,
                "block %#llx does not follow its neighbour",
                (unsigned long long)b->addr);
      CA__CHECK(!b->next || b->next->prev == b, "broken neighbour links");
      CA__CHECK(b->state != CA__FREE || !b->next ||
                    b->next->state != CA__FREE,
                "two free neighbours at %#llx were not merged",
                (unsigned long long)b->addr);
      if (b->state == CA__FREE) {
        CA__CHECK(ca__in_index(b), "free block %#llx not indexed",
                  (unsigned long long)b->addr);
        free_bytes += b->size;
        nfree++;
      } else if (b->state == CA__LIVE) {
        CA__CHECK(ca__live_find(p, b->addr) == b, "live block %#llx unknown",
                  (unsigned long long)b->addr);
        live += b->size;
        nlive++;
      } else if (b->state == CA__QUICK) {
        quick += b->size;
      } else {
        held += b->size;
      }
      at += b->size;
    }
    CA__CHECK(at == s->addr + s->size, "segment %#llx not tiled",
              (unsigned long long)s->addr);
    CA__CHECK(s->in_lru == ca__segment_is_free(s),
              "segment %#llx: LRU membership wrong",
              (unsigned long long)s->addr);
    reserved += s->size;
  }
  CA__CHECK(nfree == ca__count_index(&p->small) + ca__count_index(&p->large),
            "index holds blocks that are not free");
  CA__CHECK(nlive + 1 == HASH_COUNT(p->live), "live table size %u != %zu",
            HASH_COUNT(p->live) - 1, nlive);
  CA__CHECK(held == p->held_bytes, "held bytes disagree");
  CA__CHECK(quick == p->quick_bytes, "parked bytes disagree");
  CA__CHECK(reserved == p->stats.reserved_bytes.current,
            "reserved %llu != stats %llu", (unsigned long long)reserved,
            (unsigned long long)p->stats.reserved_bytes.current);
  CA__CHECK(live == p->stats.allocated_bytes.current,
            "allocated %llu != stats %llu", (unsigned long long)live,
            (unsigned long long)p->stats.allocated_bytes.current);
  CA__CHECK(reserved == live + free_bytes + held + quick,
            "reserved != live + cached + held");
  CA__CHECK(nlive == p->stats.blocks.current, "block count disagrees");
  CA__CHECK(nseg == p->stats.segments.current, "segment count disagrees");
  return true;
}

bool ca_pool_check(ca_pool *p, char *why, size_t why_len) {
  ca_lock_acquire(&p->lock);
  bool ok = ca__check_locked(p, why, why_len);
  ca_lock_release(&p->lock);
  return ok;
}
