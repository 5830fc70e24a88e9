/*
 * The Python frames seen, each distinct (file, function, line) stored once
 * with an id (a depot's record, depot.h), and a cache from (code object,
 * instruction) to that id, so that a frame seen before costs a few loads
 * rather than a string copy and a line-table walk.
 *
 * Part of pyframes' one compilation unit (src/pyframes/pyframes.c includes
 * the files in order); not compiled alone.
 */
/* ---- Records ----------------------------------------------------------------- */

#define CA__PY_BUCKETS 4096u
/* The longest file name or function name kept, in bytes. */
#define CA__PY_NAME_MAX 255u

typedef struct ca__pyrec {
  struct ca__pyrec *next; /* in its bucket; fixed before publication */
  uint64_t hash;
  uint32_t id, line;
  uint16_t file_len, function_len;
  char text[]; /* file, NUL, function, NUL */
} ca__pyrec;

static _Atomic(ca__pyrec *) ca__py_buckets[CA__PY_BUCKETS];
static ca_depot ca__py_depot = CA_DEPOT_INIT;

static uint64_t ca__py_hash(const char *s, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++)
    h = (h ^ (uint8_t)s[i]) * 0x100000001b3u;
  return h;
}

/* A frame's name as read: file and function, with their lengths. */
typedef struct ca__pyname {
  char file[CA__PY_NAME_MAX + 1], function[CA__PY_NAME_MAX + 1];
  size_t file_len, function_len;
  unsigned line;
} ca__pyname;

static bool ca__py_same(const ca__pyrec *r, uint64_t hash, const ca__pyname *n) {
  return r->hash == hash && r->line == n->line && r->file_len == n->file_len &&
         r->function_len == n->function_len &&
         memcmp(r->text, n->file, n->file_len) == 0 &&
         memcmp(r->text + n->file_len + 1, n->function, n->function_len) == 0;
}

static ca__pyrec *ca__py_find(_Atomic(ca__pyrec *) *bucket, uint64_t hash,
                              const ca__pyname *n) {
  for (ca__pyrec *r = atomic_load_explicit(bucket, memory_order_acquire); r; r = r->next)
    if (ca__py_same(r, hash, n))
      return r;
  return NULL;
}

static void ca__py_child(void) { ca_depot_child(&ca__py_depot); }

static const ca_fork_handlers ca__py_fork = {.child = ca__py_child};

/* The id of the frame `n`, stored on first sight; 0 when memory ran out. */
static uint32_t ca__py_intern(const ca__pyname *n) {
  uint64_t hash = ca__py_hash(n->file, n->file_len, 0xcbf29ce484222325u ^ n->line);
  hash = ca__py_hash(n->function, n->function_len, hash);
  _Atomic(ca__pyrec *) *bucket = &ca__py_buckets[hash % CA__PY_BUCKETS];
  ca__pyrec *r = ca__py_find(bucket, hash, n);
  if (r != NULL)
    return r->id;
  ca_fork_register(CA_FORK_PYFRAMES, &ca__py_fork);
  ca_lock_acquire(&ca__py_depot.lock);
  uint32_t id = 0;
  if ((r = ca__py_find(bucket, hash, n)) == NULL &&
      (r = ca_depot_carve(&ca__py_depot, sizeof(ca__pyrec) + n->file_len +
                                             n->function_len + 2, &id)) != NULL) {
    r->hash = hash;
    r->id = id;
    r->line = n->line;
    r->file_len = (uint16_t)n->file_len;
    r->function_len = (uint16_t)n->function_len;
    memcpy(r->text, n->file, n->file_len);
    r->text[n->file_len] = '\0';
    memcpy(r->text + n->file_len + 1, n->function, n->function_len);
    r->text[n->file_len + 1 + n->function_len] = '\0';
    r->next = atomic_load_explicit(bucket, memory_order_relaxed);
    ca_depot_publish(&ca__py_depot, id, r);
    atomic_store_explicit(bucket, r, memory_order_release);
  }
  ca_lock_release(&ca__py_depot.lock);
  return r ? r->id : 0;
}

bool ca_pyframes_describe(uintptr_t pc, ca_pyframe *out) {
  uint64_t id = pc & ~CA_PY_TAG;
  const ca__pyrec *r = ca_pyframes_is(pc) && id <= UINT32_MAX
                           ? ca_depot_get(&ca__py_depot, (uint32_t)id)
                           : NULL;
  if (r == NULL)
    return false;
  *out = (ca_pyframe){r->text, r->text + r->file_len + 1, r->line};
  return true;
}

/* ---- The cache --------------------------------------------------------------- */

/* One entry per (code object, instruction) slot, direct-mapped, read and
 * written without a lock: a writer takes the entry by making its sequence
 * odd, a reader trusts what it read only if the sequence was even and did
 * not change. The code object's file and line-table pointers are kept too,
 * so that a code object freed and another made at its address is a miss. */
#define CA__PY_CACHE 4096u

typedef struct ca__pycache {
  _Atomic uint32_t seq;
  _Atomic uint32_t id;
  _Atomic(uintptr_t) code, file, table;
  _Atomic long at;
} ca__pycache;

static ca__pycache ca__py_cache[CA__PY_CACHE];

/* Both halves of the key reach the top bits, which pick the entry: two
 * calls in one function must not share it. */
static ca__pycache *ca__py_slot(uintptr_t code, long at) {
  uint64_t h = (((uint64_t)code >> 4) ^ ((uint64_t)at << 40)) * 0x9e3779b97f4a7c15u;
  return &ca__py_cache[(h >> 52) % CA__PY_CACHE];
}

static uint32_t ca__py_cached(uintptr_t code, uintptr_t file, uintptr_t table, long at) {
  ca__pycache *c = ca__py_slot(code, at);
  uint32_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
  if (seq & 1)
    return 0;
  /* Acquire loads: the second look at the sequence cannot come first. */
  uint32_t id = atomic_load_explicit(&c->id, memory_order_acquire);
  bool hit = atomic_load_explicit(&c->code, memory_order_acquire) == code &&
             atomic_load_explicit(&c->at, memory_order_acquire) == at &&
             atomic_load_explicit(&c->file, memory_order_acquire) == file &&
             atomic_load_explicit(&c->table, memory_order_acquire) == table;
  return hit && atomic_load_explicit(&c->seq, memory_order_relaxed) == seq ? id : 0;
}

static void ca__py_cache_put(uintptr_t code, uintptr_t file, uintptr_t table, long at,
                             uint32_t id) {
  ca__pycache *c = ca__py_slot(code, at);
  uint32_t seq = atomic_load_explicit(&c->seq, memory_order_relaxed);
  if ((seq & 1) || !atomic_compare_exchange_strong(&c->seq, &seq, seq + 1))
    return; /* another thread is writing it: leave it */
  /* Release stores: a reader that sees any of them sees the odd sequence
   * too, when it looks again, and takes the entry for a miss. */
  atomic_store_explicit(&c->code, code, memory_order_release);
  atomic_store_explicit(&c->file, file, memory_order_release);
  atomic_store_explicit(&c->table, table, memory_order_release);
  atomic_store_explicit(&c->at, at, memory_order_release);
  atomic_store_explicit(&c->id, id, memory_order_release);
  atomic_store_explicit(&c->seq, seq + 2, memory_order_release);
}
