/*
 * memcheck:1, the library's own check of pooled blocks (a layer around the
 * pool, concern.h), for runs where compute-sanitizer is too slow.
 *
 * Free memory holds CA_MEMCHECK_FILL: the pool sets every segment and page
 * to it as the driver gives them (its fill_fresh option), and a freed
 * block is set to it again before anything else may have it. So a block
 * is handed out holding the fill, with no work at the allocation, and so
 * are the CA_MEMCHECK_RED_ZONE bytes past its request, which the pool
 * keeps with it (its red_zone option): a read of memory never written
 * shows, and any other byte in the red zone was written past the end.
 *
 * A freed block is set to the fill on the stream it is freed on (after the
 * work on every stream, for the driver's own cuMemFree) and held in a
 * quarantine, live to the pool, while younger frees pass it. As it leaves,
 * its red zone and its bytes (all of a small block, the first and last
 * CA_MEMCHECK_SAMPLE of a large one) are copied back on the same stream,
 * in batches with one marker each (a batch as one launch of the backend's
 * gather kernel where it can, which copies back only the blocks that
 * differ from the fill: backend/gather.h), and compared once the marker
 * has passed: the host never waits for a copy. Only then does the block go
 * back to the pool.
 *
 * A large block freed on a stream is set to the fill only where it is
 * checked, its two rows, as one operation: filling all of it made the
 * device write a training step's every freed byte again (69 GiB a step on
 * GPT-2 small). The bytes between are stale to the pool
 * (ca_pool_stale), which sets a red zone that lands on them to the fill
 * as it hands the block out, so every red zone still starts out holding
 * it; so are a block found written and one given back unfilled.
 *
 * A block freed while a stream capture runs is given back unchecked (the
 * work would enter the graph), and not refilled: stale.
 */
#include "concerns/memcheck.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "concerns/concern.h"
#include "concerns/site_bytes.h"
#include "report/report.h"
#include "support/fork.h"
#include "support/grow.h"
#include "support/meta.h"
#include "support/meta_hash.h"

/* What a block's copy holds: a block whose bytes and red zone fit is
 * copied whole; a larger one as two rows, its first CA_MEMCHECK_SAMPLE
 * bytes (and what follows up to a row's width) and its last ones with the
 * red zone. */
#define CA__ROW (CA_MEMCHECK_SAMPLE + CA_MEMCHECK_RED_ZONE)
#define CA__SLOT_BYTES (2 * CA__ROW)
/* Copies in flight at once, each into a slot of pinned memory, with a byte
 * that says whether it was copied (backend.h: fetch): a batch that finds
 * them all taken waits for the oldest. */
#define CA__SLOTS 512
#define CA__SLOTS_BYTES ((size_t)CA__SLOTS * (CA__SLOT_BYTES + 1))
/* Blocks whose copies share one marker, at most. */
#define CA__BATCH 64
/* The quarantine's bound: once more bytes or blocks than these wait, the
 * oldest leave, a batch at a time; all of it before an allocation fails
 * for memory. Blocks whose copies are in flight no longer count: counted,
 * they kept the quarantine over its bound until their marker passed, so
 * every free sent its block off alone, with a marker of its own. */
#define CA__HELD_BYTES (256ull << 20)
#define CA__HELD_MAX 4096
/* The bytes of blocks in flight past which a new batch first waits for
 * the oldest one: what the device's lag may keep from the pool. */
#define CA__COPYING_BYTES (256ull << 20)

/* A block freed by the program and not yet given back to the pool. */
typedef struct ca__held {
  uint64_t addr, requested, size;
  ca_pool *pool;
  const ca_layer *layer; /* its chain's memcheck layer */
  uint64_t stream;
  bool ordered; /* freed on `stream` */
  bool red_zone_unset; /* the pool could not set it: not judged */
  int device;
  uint32_t alloc_stack, free_stack;
  /* Once its copy started: its slot, the marker of its batch (kept by the
   * batch's last block: `last`). */
  int slot;
  uint64_t marker;
  struct ca__held *last;
  UT_hash_handle hh;
  struct ca__held *next;
} ca__held;

#define CA__PENDING 64
/* Live blocks found written past their end when their context died: not
 * reported again at exit, should the context have lived on. */
#define CA__LIVE_FOUND 64

static pthread_mutex_t ca__lock = PTHREAD_MUTEX_INITIALIZER;
static ca__held *ca__by_addr;                    /* every held block */
static ca__held *ca__waiting, *ca__waiting_tail; /* quarantined, oldest first */
static ca__held *ca__copying, *ca__copying_tail; /* copies in flight */
static ca__held *ca__spare;
static uint64_t ca__held_bytes;                       /* all of them */
static uint64_t ca__waiting_bytes, ca__waiting_count; /* those waiting */
/* The table's size, read without the lock: a free asks nothing of an
 * empty table. */
static _Atomic uint64_t ca__nheld;
static unsigned char *ca__slots;
static bool ca__slots_pinned; /* from the backend's host_alloc */
static int ca__free_slots[CA__SLOTS], ca__nfree_slots = -1;
static ca_report_finding ca__pending[CA__PENDING];
static size_t ca__npending, ca__unprinted;
static uint64_t ca__live_found[CA__LIVE_FOUND];
static size_t ca__nlive_found;
static ca_memcheck_totals ca__totals;

static void ca__mc_prepare(void) { pthread_mutex_lock(&ca__lock); }
static void ca__mc_parent(void) { pthread_mutex_unlock(&ca__lock); }
static const ca_fork_handlers ca__mc_fork = {ca__mc_prepare, ca__mc_parent,
                                             ca__mc_parent};

/* ---- Findings ----------------------------------------------------------- */

/* Under the lock. */
static void ca__found(const ca_report_finding *f) {
  if (f->kind == CA_FINDING_AFTER_FREE)
    ca__totals.after_free++;
  else
    ca__totals.overflows++;
  if (ca__npending < CA__PENDING)
    ca__pending[ca__npending++] = *f;
  else
    ca__unprinted++;
}

/* Prints what was found, outside the lock: symbolizing opens files and
 * asks the dynamic loader. */
static void ca__print_pending(void) {
  ca_report_finding local[CA__PENDING];
  pthread_mutex_lock(&ca__lock);
  size_t n = ca__npending, lost = ca__unprinted;
  memcpy(local, ca__pending, n * sizeof(local[0]));
  ca__npending = 0;
  ca__unprinted = 0;
  pthread_mutex_unlock(&ca__lock);
  ca_report_findings(local, n, lost);
}

/* Bytes of got[0..n) that are not the fill, and the first one's index.
 * Whole words of the fill are passed over first: almost every copy holds
 * nothing else, and a byte at a time cost 4 us a block of 9 KiB (two
 * rows), more than the copy's driver call. */
static uint64_t ca__differ(const unsigned char *got, uint64_t n,
                           uint64_t *first) {
  const uint64_t fill = CA_MEMCHECK_FILL * 0x0101010101010101ull;
  uint64_t i = 0, count = 0;
  for (uint64_t word; i + sizeof(word) <= n; i += sizeof(word)) {
    memcpy(&word, got + i, sizeof(word));
    if (word != fill)
      break;
  }
  for (; i < n; i++)
    if (got[i] != CA_MEMCHECK_FILL && count++ == 0)
      *first = i;
  return count;
}

/* Whether h is copied whole, or as two rows (ca__rows_of). */
static bool ca__whole(const ca__held *h) {
  return h->requested + CA_MEMCHECK_RED_ZONE <= CA__SLOT_BYTES;
}

/* Under the lock: compares what the copy of h brought back (NULL: the
 * device found its bytes all holding the fill, and copied nothing);
 * whether it found anything. */
static bool ca__judge(const ca__held *h, const unsigned char *copy) {
  ca__totals.checked++;
  if (copy == NULL)
    return false;
  ca_report_finding f = {.addr = h->addr, .requested = h->requested,
                   .device = h->device, .alloc_stack = h->alloc_stack,
                   .free_stack = h->free_stack};
  /* The block's bytes: [0, head) at copy, [tail_at, requested) at tail;
   * its red zone right after the last of them. */
  bool whole = ca__whole(h);
  uint64_t head = whole ? h->requested : CA__ROW;
  uint64_t tail_at = whole ? h->requested : h->requested - CA_MEMCHECK_SAMPLE;
  const unsigned char *tail = whole ? copy + head : copy + CA__ROW;
  uint64_t own_tail = h->requested - tail_at, first = 0;
  bool any = false;
  f.kind = CA_FINDING_PAST_END;
  f.count = h->red_zone_unset
                ? 0
                : ca__differ(tail + own_tail, CA_MEMCHECK_RED_ZONE, &first);
  if (f.count > 0) {
    f.first = first;
    ca__found(&f);
    any = true;
  }
  f.kind = CA_FINDING_AFTER_FREE;
  f.count = ca__differ(copy, head, &first);
  f.first = first;
  uint64_t in_tail = ca__differ(tail, own_tail, &first);
  if (f.count == 0 && in_tail > 0)
    f.first = tail_at + first;
  f.count += in_tail;
  if (f.count > 0) {
    ca__found(&f);
    any = true;
  }
  return any;
}

/* ---- The quarantine ------------------------------------------------------ */

static void ca__list_push(ca__held **head, ca__held **tail, ca__held *h) {
  h->next = NULL;
  if (*tail)
    (*tail)->next = h;
  else
    *head = h;
  *tail = h;
}

static ca__held *ca__list_pop(ca__held **head, ca__held **tail) {
  ca__held *h = *head;
  if (h && !(*head = h->next))
    *tail = NULL;
  return h;
}

static void ca__wait_push(ca__held *h) {
  ca__list_push(&ca__waiting, &ca__waiting_tail, h);
  ca__waiting_bytes += h->size;
  ca__waiting_count++;
}

static ca__held *ca__wait_pop(void) {
  ca__held *h = ca__list_pop(&ca__waiting, &ca__waiting_tail);
  if (h) {
    ca__waiting_bytes -= h->size;
    ca__waiting_count--;
  }
  return h;
}

/* Under the lock: the pinned slots, made on first need from `pool`'s
 * backend (pageable memory if it has none: the copies then finish before
 * they return). */
static bool ca__slots_ready(ca_pool *pool) {
  if (ca__nfree_slots >= 0)
    return ca__slots != NULL;
  ca__slots = ca_pool_host_alloc(pool, CA__SLOTS_BYTES);
  ca__slots_pinned = ca__slots != NULL;
  if (ca__slots == NULL)
    ca__slots = ca_meta_alloc(CA__SLOTS_BYTES);
  ca__nfree_slots = 0;
  for (int i = CA__SLOTS - 1; ca__slots && i >= 0; i--)
    ca__free_slots[ca__nfree_slots++] = i;
  return ca__slots != NULL;
}

static unsigned char *ca__slot(int slot) {
  return ca__slots + (size_t)slot * CA__SLOT_BYTES;
}

/* Whether the slot's copy was made: the byte after every slot's bytes. */
static unsigned char *ca__copied(int slot) {
  return ca__slots + (size_t)CA__SLOTS * CA__SLOT_BYTES + slot;
}

/* The slot's copy, or NULL where the device copied nothing: its bytes all
 * held the fill. */
static const unsigned char *ca__copy_in(int slot) {
  return *ca__copied(slot) ? ca__slot(slot) : NULL;
}

/* Under the lock: h leaves the quarantine; its record is spare again (its
 * fields stay readable until the next record is taken). */
static void ca__drop(ca__held *h) {
  HASH_DEL(ca__by_addr, h);
  ca__held_bytes -= h->size;
  atomic_fetch_sub(&ca__nheld, 1);
  h->next = ca__spare;
  ca__spare = h;
}

static const uint64_t *ca__stream_of(const ca__held *h) {
  return h->ordered ? &h->stream : NULL;
}

/* Under the lock: h goes back to the pool through its chain, on its
 * stream; a block found written goes back stale, red zone included: the
 * pool sets a red zone there as it hands it out again. */
static void ca__release(ca__held *h, bool written) {
  ca_give g = {.addr = h->addr, .stream = ca__stream_of(h)};
  if (written)
    ca_pool_stale(h->pool, h->addr, h->addr, h->addr + h->size);
  ca_layer_free(h->layer->next, &g);
  ca__drop(h);
}

/* Under the lock: the oldest batch in flight, judged once its marker has
 * passed (or waited for): its blocks go back to the pool, their slots
 * free. Returns false when it has not passed yet. */
static bool ca__finish_batch(bool wait) {
  ca__held *last = ca__copying->last;
  int r = ca_pool_fetched(last->pool, last->marker, wait);
  if (r != 0 && !wait)
    return false;
  ca__held *h;
  do {
    h = ca__list_pop(&ca__copying, &ca__copying_tail);
    bool written = r == 0 && ca__judge(h, ca__copy_in(h->slot));
    ca__free_slots[ca__nfree_slots++] = h->slot;
    ca__release(h, written);
  } while (h != last);
  return true;
}

/* Under the lock: the copy of h's block and red zone into its slot. */
static ca_backend_rows ca__rows_of(const ca__held *h) {
  ca_backend_rows r = {.addr = h->addr, .host = ca__slot(h->slot),
                       .copied = ca__copied(h->slot)};
  bool whole = ca__whole(h);
  r.width = whole ? h->requested + CA_MEMCHECK_RED_ZONE : CA__ROW;
  r.rows = whole ? 1 : 2;
  r.pitch = whole ? 0 : h->requested - CA_MEMCHECK_SAMPLE;
  return r;
}

/* Under the lock: the copies of sets[0..n) on *stream, asked of the
 * backend at once; one at a time into pageable slots, which only a copy
 * may fill (the backend's kernel writes only memory from host_alloc).
 * Returns how many started. */
static size_t ca__fetch_sets(ca_pool *pool, const ca_backend_rows *sets,
                             size_t n, const uint64_t *stream) {
  size_t started = 0, step = ca__slots_pinned ? n : 1;
  for (int r = 0; r == 0 && started < n;) {
    size_t got = 0;
    r = ca_pool_fetch(pool, sets + started, step, CA_MEMCHECK_FILL, stream,
                      &got);
    started += got;
  }
  return started;
}

/* Under the lock: whether h may join a batch of `first`'s (a copy of its
 * record): the same pool and stream, so that one marker covers both. */
static bool ca__same_batch(const ca__held *h, const ca__held *first) {
  return h->pool == first->pool && h->ordered == first->ordered &&
         h->stream == first->stream;
}

/* Under the lock: the oldest quarantined blocks start leaving, as many as
 * share the oldest's pool and stream (up to a batch): their copies, asked
 * of the backend at once (one operation in the stream where it can), then
 * one marker. A block the device will not copy now goes back unchecked. */
static void ca__start_batch(void) {
  const ca__held first = *ca__waiting; /* the record may leave before the end */
  if (!ca__slots_ready(first.pool)) {
    ca__release(ca__wait_pop(), false);
    return;
  }
  ca__held *batch[CA__BATCH];
  ca_backend_rows sets[CA__BATCH];
  size_t n = 0;
  while (ca__waiting && n < CA__BATCH && ca__same_batch(ca__waiting, &first)) {
    while (ca__nfree_slots == 0 && ca__copying)
      ca__finish_batch(true);
    ca__held *h = ca__wait_pop();
    if (ca__nfree_slots == 0) { /* every slot lost to copies without a marker */
      ca__release(h, false);
      continue;
    }
    h->slot = ca__free_slots[--ca__nfree_slots];
    sets[n] = ca__rows_of(h);
    batch[n++] = h;
  }
  size_t started =
      n > 0 ? ca__fetch_sets(first.pool, sets, n, ca__stream_of(&first)) : 0;
  for (size_t i = started; i < n; i++) {
    ca__free_slots[ca__nfree_slots++] = batch[i]->slot;
    ca__release(batch[i], false);
  }
  if ((n = started) == 0)
    return;
  ca__held *last = batch[n - 1];
  if (ca_pool_mark_after(first.pool, ca__stream_of(&first), &last->marker) !=
      0) {
    /* No marker (a capture began): the copies may land any time, so their
     * slots stay taken for good, and the blocks go back unchecked. */
    for (size_t i = 0; i < n; i++)
      ca__release(batch[i], false);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    batch[i]->last = last;
    ca__list_push(&ca__copying, &ca__copying_tail, batch[i]);
  }
}

/* Under the lock: the batches already copied are judged (one poll while
 * none has passed); then, while more waits than the bound, the oldest in
 * flight are waited for while too many bytes are, and the oldest waiting
 * blocks start leaving, a batch at a time. */
static void ca__move_on(void) {
  while (ca__copying && ca__finish_batch(false))
    ;
  while (ca__waiting && (ca__waiting_bytes > CA__HELD_BYTES ||
                         ca__waiting_count > CA__HELD_MAX)) {
    while (ca__copying &&
           ca__held_bytes - ca__waiting_bytes > CA__COPYING_BYTES)
      ca__finish_batch(true);
    ca__start_batch();
  }
}

static void ca__drain_locked(void) {
  while (ca__waiting)
    ca__start_batch();
  while (ca__copying)
    ca__finish_batch(true);
}

void ca_memcheck_drain(void) {
  pthread_mutex_lock(&ca__lock);
  bool any = ca__by_addr != NULL || ca__npending > 0;
  ca__drain_locked();
  pthread_mutex_unlock(&ca__lock);
  if (any)
    ca__print_pending();
}

/* Under the lock: whether a block of `list` was freed on `stream`. */
static bool ca__on_stream(const ca__held *list, uint64_t stream) {
  for (const ca__held *h = list; h; h = h->next)
    if (h->ordered && h->stream == stream)
      return true;
  return false;
}

void ca_memcheck_stream_ended(uint64_t stream) {
  if (atomic_load_explicit(&ca__nheld, memory_order_relaxed) == 0)
    return;
  pthread_mutex_lock(&ca__lock);
  bool held = ca__on_stream(ca__waiting, stream) ||
              ca__on_stream(ca__copying, stream);
  pthread_mutex_unlock(&ca__lock);
  if (held)
    ca_memcheck_drain();
}

/* ---- The layer ----------------------------------------------------------- */

static bool ca__memcheck_wanted(const ca_layer_env *env, ca_path path) {
  (void)path;
  return env->cfg->memcheck && env->block != NULL;
}

/* A block is handed out as the pool has it: holding the fill. */
static int ca__memcheck_alloc(const ca_layer *self, ca_ask *ask) {
  int r = ca_layer_alloc(self->next, ask);
  if (r == self->env->oom &&
      atomic_load_explicit(&ca__nheld, memory_order_relaxed) > 0) {
    ca_memcheck_drain(); /* the quarantine's room first */
    r = ca_layer_alloc(self->next, ask);
  }
  return r;
}

/* Under the lock: a record, or NULL (host memory out). */
static ca__held *ca__held_new(void) {
  ca__held *h = ca__spare;
  if (h)
    ca__spare = h->next;
  else
    h = ca_meta_alloc(sizeof(*h));
  return h;
}

/* A block goes back to the pool unchecked and unfilled: all its bytes are
 * stale, its red zone too, which nothing checked. */
static void ca__give_back_stale(ca_pool *pool, const ca_live_block *b) {
  ca_pool_stale(pool, b->addr, b->addr, b->addr + b->size);
}

/* Sets a freed block to the fill where its check will read it, and tells
 * the pool which bytes it left: on a stream, a block copied as two rows
 * gets just those, as one 2D fill, the bytes between left stale; else (and
 * where the rows would overlap) all its bytes, rounded up to whole words
 * (the red zone holds the fill too, so the device sets words, not bytes).
 * Past them, the red zone and the block's rounding hold the fill as the
 * pool handed the block out, unless it could not set them. */
static int ca__fill_freed(ca_pool *pool, const ca_live_block *b,
                          const uint64_t *stream) {
  uint64_t end = (b->requested + 3) & ~(uint64_t)3, lo = 0, hi = 0;
  bool rows = stream != NULL &&
              b->requested + CA_MEMCHECK_RED_ZONE > CA__SLOT_BYTES &&
              end >= 2 * CA__ROW;
  int r;
  if (rows) {
    /* The first row from the start; the last ends with the bytes, so it
     * covers the last CA_MEMCHECK_SAMPLE of them. */
    uint64_t pitch = end - CA__ROW;
    r = ca_pool_fill(pool, b->addr, CA__ROW, 2, pitch, CA_MEMCHECK_FILL,
                     stream);
    lo = b->addr + CA__ROW;
    hi = b->addr + pitch;
  } else {
    r = ca_pool_fill(pool, b->addr, end, 1, 0, CA_MEMCHECK_FILL, stream);
  }
  if (r == 0 && b->red_zone_unset) {
    lo = lo ? lo : b->addr + b->requested;
    hi = b->addr + b->size;
  }
  if (r == 0)
    ca_pool_stale(pool, b->addr, lo, hi);
  return r;
}

/* Holds the block the program freed, set to the fill on its stream. */
static int ca__quarantine(const ca_layer *self, ca_give *give, ca_pool *pool,
                          const ca_live_block *b) {
  uint32_t free_stack = ca_site_stack(self->env->cfg);
  pthread_mutex_lock(&ca__lock);
  /* Another thread's free of the block got here first (a racing double
   * free): this one finds no live block, as the pool would answer it. The
   * record is made before the fill, so that the second never fills it. */
  ca__held *h = NULL;
  HASH_FIND(hh, ca__by_addr, &b->addr, sizeof(b->addr), h);
  if (h != NULL) {
    pthread_mutex_unlock(&ca__lock);
    return CA_GIVE_NOT_POOLED;
  }
  h = ca__held_new();
  if (h == NULL) {
    pthread_mutex_unlock(&ca__lock);
    return ca_layer_free(self->next, give);
  }
  ca_fork_register(CA_FORK_MEMCHECK, &ca__mc_fork);
  *h = (ca__held){.addr = b->addr, .requested = b->requested,
                  .size = b->size, .pool = pool, .layer = self,
                  .stream = give->stream ? *give->stream : 0,
                  .ordered = give->stream != NULL, .device = b->device,
                  .red_zone_unset = b->red_zone_unset,
                  .alloc_stack = b->tag, .free_stack = free_stack};
  HASH_ADD(hh, ca__by_addr, addr, sizeof(h->addr), h);
  if (!CA_HASH_ADDED(h)) {
    h->next = ca__spare;
    ca__spare = h;
    pthread_mutex_unlock(&ca__lock);
    return ca_layer_free(self->next, give);
  }
  ca__held_bytes += h->size;
  atomic_fetch_add(&ca__nheld, 1);
  pthread_mutex_unlock(&ca__lock);
  /* Set to the fill outside the lock (driver calls), the record holding
   * the block meanwhile; it waits among the quarantined only once set. */
  int filled = ca__fill_freed(pool, b, give->stream);
  pthread_mutex_lock(&ca__lock);
  if (filled != 0) {
    ca__drop(h);
    pthread_mutex_unlock(&ca__lock);
    ca__give_back_stale(pool, b);
    return ca_layer_free(self->next, give);
  }
  ca__wait_push(h);
  ca__move_on();
  bool found = ca__npending > 0;
  pthread_mutex_unlock(&ca__lock);
  give->block = *b;
  if (found)
    ca__print_pending();
  return 0;
}

bool ca_memcheck_holds(uint64_t addr) {
  ca__held *h = NULL;
  if (atomic_load_explicit(&ca__nheld, memory_order_relaxed) == 0)
    return false;
  pthread_mutex_lock(&ca__lock);
  HASH_FIND(hh, ca__by_addr, &addr, sizeof(addr), h);
  pthread_mutex_unlock(&ca__lock);
  return h != NULL;
}

static int ca__memcheck_free(const ca_layer *self, ca_give *give) {
  /* A block held already, freed again: the driver's answer to a double
   * free comes from the caller, as for any address no pool answers for. */
  if (ca_memcheck_holds(give->addr))
    return CA_GIVE_NOT_POOLED;
  ca_pool *pool = NULL;
  ca_live_block b;
  if (!self->env->block(give->addr, &pool, &b) || !ca_pool_touches_bytes(pool))
    return ca_layer_free(self->next, give);
  if (ca_layer_capturing(self->env)) {
    ca__give_back_stale(pool, &b);
    return ca_layer_free(self->next, give);
  }
  return ca__quarantine(self, give, pool, &b);
}

const ca_concern ca_concern_memcheck = {
    .name = "memcheck",
    .wanted = ca__memcheck_wanted,
    .alloc = ca__memcheck_alloc,
    .free = ca__memcheck_free,
};

/* ---- Live blocks, at exit and when a context dies ----------------------- */

/* Under the lock: whether the live block at `addr` was found written past
 * its end already. */
static bool ca__live_known(uint64_t addr) {
  for (size_t i = 0; i < ca__nlive_found; i++)
    if (ca__live_found[i] == addr)
      return true;
  return false;
}

/* Under the lock: the red zones of live blocks v[0..n), n at most the free
 * slots and a batch, copied together, waited for, compared. */
static void ca__check_live(ca_pool *pool, const ca_live_block *v, size_t n) {
  const int *slots = &ca__free_slots[ca__nfree_slots - (int)n];
  ca_backend_rows sets[CA__BATCH];
  for (size_t i = 0; i < n; i++)
    sets[i] = (ca_backend_rows){.addr = v[i].addr + v[i].requested,
                                .width = CA_MEMCHECK_RED_ZONE,
                                .rows = 1,
                                .host = ca__slot(slots[i]),
                                .copied = ca__copied(slots[i])};
  size_t started = ca__fetch_sets(pool, sets, n, NULL);
  uint64_t marker = 0;
  if (started == 0 || ca_pool_mark_after(pool, NULL, &marker) != 0 ||
      ca_pool_fetched(pool, marker, true) != 0)
    return;
  for (size_t i = 0; i < started; i++) {
    ca_report_finding f = {.kind = CA_FINDING_PAST_END_LIVE, .addr = v[i].addr,
                     .requested = v[i].requested, .device = v[i].device,
                     .alloc_stack = v[i].tag};
    const unsigned char *zone = ca__copy_in(slots[i]);
    f.count = v[i].red_zone_unset || zone == NULL
                  ? 0
                  : ca__differ(zone, CA_MEMCHECK_RED_ZONE, &f.first);
    if (f.count > 0 && !ca__live_known(v[i].addr)) {
      ca__found(&f);
      if (ca__nlive_found < CA__LIVE_FOUND)
        ca__live_found[ca__nlive_found++] = v[i].addr;
    }
    ca__totals.checked++;
  }
}

/* A growing list of live blocks, in the library's own memory. */
typedef struct ca__live_list {
  ca_live_block *v;
  size_t n, cap;
} ca__live_list;

static void ca__live_push(const ca_live_block *b, void *arg) {
  ca__live_list *l = arg;
  if (l->n == l->cap) {
    ca_live_block *v = ca_grow(l->v, &l->cap, sizeof(*v));
    if (v == NULL)
      return; /* out of memory: this block goes unchecked */
    l->v = v;
  }
  l->v[l->n++] = *b;
}

void ca_memcheck_check_pool(ca_pool *pool) {
  if (!ca_pool_touches_bytes(pool))
    return;
  ca__live_list l = {0};
  /* Gathered first: the pool calls back under its locks, which memcheck
   * takes under its own. */
  ca_pool_foreach_live(pool, ca__live_push, &l);
  pthread_mutex_lock(&ca__lock);
  size_t kept = 0;
  for (size_t i = 0; i < l.n; i++) {
    ca__held *h = NULL;
    HASH_FIND(hh, ca__by_addr, &l.v[i].addr, sizeof(l.v[i].addr), h);
    if (h == NULL) /* freed blocks are the quarantine's */
      l.v[kept++] = l.v[i];
  }
  for (size_t at = 0; at < kept && ca__slots_ready(pool);) {
    while (ca__copying && ca__nfree_slots == 0)
      ca__finish_batch(true);
    size_t n = kept - at < (size_t)ca__nfree_slots ? kept - at
                                                   : (size_t)ca__nfree_slots;
    n = n < CA__BATCH ? n : CA__BATCH;
    if (n == 0)
      break; /* every slot lost to copies without a marker */
    ca__check_live(pool, l.v + at, n);
    at += n;
  }
  pthread_mutex_unlock(&ca__lock);
  ca_meta_free(l.v, l.cap * sizeof(*l.v));
  ca__print_pending();
}

/* Keeps the blocks of a list not of `pool`, in order; drops the others. */
static void ca__drop_pool(ca__held **head, ca__held **tail, ca_pool *pool,
                          bool copying) {
  ca__held *keep = NULL, *keep_tail = NULL, *h;
  while ((h = ca__list_pop(head, tail)) != NULL) {
    if (h->pool != pool) {
      ca__list_push(&keep, &keep_tail, h);
      continue;
    }
    if (copying && h->last == h)
      ca_pool_fetched(pool, h->marker, false); /* passed: its context died */
    if (copying) {
      ca__free_slots[ca__nfree_slots++] = h->slot;
    } else {
      ca__waiting_bytes -= h->size;
      ca__waiting_count--;
    }
    ca__drop(h);
  }
  *head = keep;
  *tail = keep_tail;
}

void ca_memcheck_forget_pool(ca_pool *pool) {
  pthread_mutex_lock(&ca__lock);
  ca__drop_pool(&ca__waiting, &ca__waiting_tail, pool, false);
  ca__drop_pool(&ca__copying, &ca__copying_tail, pool, true);
  pthread_mutex_unlock(&ca__lock);
}

ca_memcheck_totals ca_memcheck_totals_now(void) {
  pthread_mutex_lock(&ca__lock);
  ca_memcheck_totals t = ca__totals;
  pthread_mutex_unlock(&ca__lock);
  return t;
}
