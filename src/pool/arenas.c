/*
 * Arenas: making them, and which one a thread uses.
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */
/* ---- Arenas --------------------------------------------------------------- */

/* Whether the pool's large heap should grow by mapping pages. */
static bool ca__wants_ranges(ca_pool *pool) {
  const ca_backend *be = pool->backend;
  return pool->opt.expandable && be->page && be->va_reserve &&
         be->va_release && be->map && be->unmap && be->synchronize &&
         !atomic_load_explicit(&pool->ranges_off, memory_order_relaxed);
}

static void ca__heap_init(ca__heap *h, int large, ca_pool *pool) {
  memset(h, 0, sizeof(*h));
  h->large = large;
  h->expandable = large && ca__wants_ranges(pool);
  /* Small blocks are never large enough to be kept whole; an expandable
   * heap splits any block and gives its free pages back instead. */
  h->oversize_from =
      large && !h->expandable ? pool->opt.max_split_size : UINT64_MAX;
}

/* An empty arena for `pool`; NULL when the host is out of memory. */
static ca__arena *ca__arena_new(ca_pool *pool, unsigned index) {
  /* Zeroed, on whole cache lines of its own: meta.h aligns an object to
   * its power-of-two class, and the arena's size is a multiple of CA__LINE. */
  ca__arena *p = ca_meta_alloc(sizeof(*p));
  if (!p)
    return NULL;
  p->pool = pool;
  p->index = index;
  p->backend = pool->backend;
  p->device = pool->device;
  p->opt = pool->opt;
  ca__heap_init(&p->small, 0, pool);
  ca__heap_init(&p->large, 1, pool);
  p->block_slab.obj_size = sizeof(ca__block);
  p->segment_slab.obj_size = sizeof(ca__segment);
  p->batch_slab.obj_size = sizeof(ca__batch);
  p->stats.device = pool->device;
  if (!ca__live_init(&p->live, CA__LIVE_FIRST_BITS)) {
    ca_meta_free(p, sizeof(*p));
    return NULL;
  }
  return p;
}

/* Frees every record and forgets every segment, leaving an empty arena;
 * with `release`, gives the segments back first (after the device's work,
 * which expandable segments wait for, as cuMemFree does for plain ones). */
static void ca__forget_all(ca__arena *p, int release) {
  HASH_CLEAR(hh, p->segment_table);
  if (release && p->nexpandable)
    p->backend->synchronize(p->backend->ctx, p->device);
  while (p->segments) {
    ca__segment *s = p->segments;
    p->segments = s->next;
    if (!s->lost)
      ca__where_drop(s);
    if (release && s->expandable)
      ca__expandable_free(p, s);
    else if (release && !s->lost)
      p->backend->release(p->backend->ctx, p->device, s->addr, s->size);
    ca__segment_put(p, s);
  }
  ca__live_clear(&p->live);
  ca__where_removed(p);
  ca__heap_init(&p->small, 0, p->pool);
  ca__heap_init(&p->large, 1, p->pool);
  p->nexpandable = 0;
  p->lru_head = p->lru_tail = NULL;
  while (p->batch_head) {
    ca__batch *batch = p->batch_head;
    ca__pop_batch(p);
    p->backend->forget(p->backend->ctx, p->device, batch->marker);
    ca__slab_put(&p->batch_slab, batch);
  }
  p->held_head = p->held_tail = NULL;
  for (unsigned i = 0; i < p->nstreams; i++) { /* their blocks went too */
    memset(p->streams[i]->bins, 0, sizeof(p->streams[i]->bins));
    p->streams[i]->bytes = 0;
  }
  p->open_bytes = 0;
  p->held_bytes = 0;
  p->quick_bytes = 0;
  p->gone_bytes = 0;
  p->nsegs = 0;
  p->generation++;
}

/* Gives every segment of the arena back and frees it. */
static void ca__arena_free(ca__arena *p) {
  ca__forget_all(p, 1);
  atomic_fetch_add_explicit(&ca__arenas_freed, 1, memory_order_release);
  ca__live_fini(&p->live);
  ca_meta_free(p->by_addr, p->segs_cap * sizeof(*p->by_addr));
  ca__slab_destroy(&p->block_slab);
  ca__slab_destroy(&p->segment_slab);
  ca__slab_destroy(&p->batch_slab);
  for (unsigned i = 0; i < p->nstreams; i++)
    ca_meta_free(p->streams[i], sizeof(*p->streams[i]));
  ca_meta_free(p, sizeof(*p));
}

/* A thread moves to a less used arena after CA__MOVE_AFTER contended takes
 * of its arena's lock within CA__MOVE_WINDOW_NS. Threads that allocate in a
 * tight loop together find the lock held every few microseconds and spread
 * out within their first calls. Threads that overlap only now and then
 * stay together and keep sharing one cache: PyTorch's main and autograd
 * threads are such a pair (its own caching allocator calls cudaMalloc
 * rarely, mostly from one of them at a time), and never meet four
 * contended takes in one millisecond. One contended take alone proves
 * nothing: two threads that happen to free at the same moment meet a few
 * in a row. */
#define CA__MOVE_AFTER 4
#define CA__MOVE_WINDOW_NS 1000000ull

/* The calling thread's arena index, the same in every pool: 0 until
 * contention moves the thread. */
static __thread unsigned ca__thread_arena CA__TLS;
/* The thread's contended takes of its arena in the current window, and
 * when that window began. */
static __thread unsigned ca__contended CA__TLS;
static __thread uint64_t ca__contended_since CA__TLS;

/* Threads that have met contention, by arena index, process-wide. A
 * thread moves only to an arena fewer of them use: moving blindly, eight
 * busy threads on eight arenas would each land on a taken arena and move
 * on for ever, dragging their blocks' frees along. Threads that never met
 * contention are not counted; they leave no mark on where others go. */
static atomic_uint ca__arena_threads[CA_POOL_ARENAS];
static __thread bool ca__counted CA__TLS;
static pthread_key_t ca__count_key;
/* Whether ca__count_key was made: out of keys, it names no key of ours (an
 * unset key is 0, which is another component's), so it is never set. */
static bool ca__count_key_made;
static pthread_once_t ca__count_once = PTHREAD_ONCE_INIT;
/* Where the search for the least used arena starts: ties spread. */
static atomic_uint ca__arena_turn;

/* A counted thread that exits stops counting. It may still use a pool in
 * a thread-exit destructor that runs after this one: no longer counted,
 * a move then leaves the counts alone instead of dropping this one twice,
 * and new contention counts it afresh (its key set again, this destructor
 * runs again). */
static void ca__uncount(void *unused) {
  (void)unused;
  atomic_fetch_sub_explicit(&ca__arena_threads[ca__thread_arena], 1,
                            memory_order_relaxed);
  ca__counted = false;
}

/* A forked child runs one thread of its parent's: only that one counts. */
static void ca__recount_in_child(void) {
  for (unsigned i = 0; i < CA_POOL_ARENAS; i++)
    atomic_store_explicit(&ca__arena_threads[i], 0, memory_order_relaxed);
  if (ca__counted)
    atomic_store_explicit(&ca__arena_threads[ca__thread_arena], 1,
                          memory_order_relaxed);
}

static const ca_fork_handlers ca__pool_fork = {.child = ca__recount_in_child};

static void ca__count_setup(void) {
  ca__count_key_made = pthread_key_create(&ca__count_key, ca__uncount) == 0;
  ca_fork_register(CA_FORK_POOL, &ca__pool_fork);
}

/* Starts counting the calling thread. Its key's value only makes the key's
 * destructor run at the thread's exit. Should the process be out of keys,
 * a thread that exits goes on counting: others avoid its arena, no more. */
static void ca__count_thread(void) {
  pthread_once(&ca__count_once, ca__count_setup);
  ca__counted = true;
  atomic_fetch_add_explicit(&ca__arena_threads[ca__thread_arena], 1,
                            memory_order_relaxed);
  if (ca__count_key_made)
    pthread_setspecific(ca__count_key, &ca__counted);
}

/* Puts the calling thread on arena `to`, its count with it. */
static void ca__move_to(unsigned to) {
  if (ca__counted) {
    atomic_fetch_sub_explicit(&ca__arena_threads[ca__thread_arena], 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&ca__arena_threads[to], 1,
                              memory_order_relaxed);
  }
  ca__thread_arena = to;
}

/* The arena fewest counted threads use, if moving there spreads threads
 * out: the calling thread's arena, where it just met contention, has two
 * threads at least, counted or not. */
static bool ca__least_used(unsigned *to) {
  unsigned here = atomic_load_explicit(&ca__arena_threads[ca__thread_arena],
                                       memory_order_relaxed);
  unsigned start = atomic_fetch_add_explicit(&ca__arena_turn, 1,
                                             memory_order_relaxed);
  unsigned fewest = UINT_MAX;
  for (unsigned k = 0; k < CA_POOL_ARENAS; k++) {
    unsigned i = (start + k) % CA_POOL_ARENAS;
    unsigned n = atomic_load_explicit(&ca__arena_threads[i],
                                      memory_order_relaxed);
    if (i != ca__thread_arena && n < fewest) {
      fewest = n;
      *to = i;
    }
  }
  return fewest + 1 < (here > 2 ? here : 2);
}

/* Counts a contended take of the calling thread's arena. Returns true when
 * this one moved the thread to another arena. */
static CA__COLD bool ca__contention(void) {
  /* The coarse clock ticks in milliseconds: too slowly for the window. */
  uint64_t now = ca__clock_ns(CLOCK_MONOTONIC);
  if (now - ca__contended_since > CA__MOVE_WINDOW_NS) {
    ca__contended_since = now;
    ca__contended = 0;
  }
  if (++ca__contended < CA__MOVE_AFTER)
    return false;
  ca__contended = 0;
  if (!ca__counted)
    ca__count_thread();
  unsigned to = ca__thread_arena;
  if (!ca__least_used(&to))
    return false;
  ca__move_to(to);
  return true;
}

/* Makes arena `index` of `pool` and publishes it, or takes the one another
 * thread published first. Out of host memory, the thread goes back to
 * arena 0, which every pool has. */
static ca__arena *ca__arena_make(ca_pool *pool, unsigned index) {
  ca__arena *made = ca__arena_new(pool, index), *found = NULL;
  if (!made) {
    ca__move_to(0);
    return ca__arena_at(pool, 0);
  }
  if (atomic_compare_exchange_strong_explicit(&pool->arenas[index], &found,
                                              made, memory_order_acq_rel,
                                              memory_order_acquire))
    return made;
  ca__arena_free(made);
  return found;
}

/* The calling thread's arena of `pool`, made on first use. */
static ca__arena *ca__arena_of(ca_pool *pool) {
  ca__arena *p = ca__arena_at(pool, ca__thread_arena);
  return p ? p : ca__arena_make(pool, ca__thread_arena);
}

/* The slow half of ca__enter: the thread's arena is not made yet, or its
 * lock is held. When the contention met moves the thread, the arena it
 * moved to is taken instead. */
static CA__COLD ca__arena *ca__enter_slow(ca_pool *pool) {
  ca__arena *p = ca__arena_of(pool);
  if (ca_lock_try_acquire(&p->lock))
    return p;
  if (ca__contention())
    p = ca__arena_of(pool);
  ca_lock_acquire(&p->lock);
  return p;
}

/* The calling thread's arena, locked. */
static inline ca__arena *ca__enter(ca_pool *pool) {
  ca__arena *p = ca__arena_at(pool, ca__thread_arena);
  if (p && ca_lock_try_acquire(&p->lock))
    return p;
  return ca__enter_slow(pool);
}

/* Takes the lock of p, the calling thread's own arena, noting contention
 * (which moves only the thread's later calls). */
static void ca__enter_own(ca__arena *p) {
  if (!ca_lock_try_acquire(&p->lock)) {
    ca__contention();
    ca_lock_acquire(&p->lock);
  }
}

void ca_pool_set_thread_arena(unsigned index) {
  ca__move_to(index % CA_POOL_ARENAS);
  ca__contended = 0;
}

unsigned ca_pool_thread_arena(void) { return ca__thread_arena; }

unsigned ca_pool_arena_threads(unsigned index) {
  return atomic_load_explicit(&ca__arena_threads[index % CA_POOL_ARENAS],
                              memory_order_relaxed);
}
