/*
 * The live table: an arena's live blocks by their start, which a free, a
 * pointer query and a range check look up. Open addressing with linear
 * probing, at most half full: a look-up reads one slot, two at times, and
 * the slot holds the start it compares and the bytes the block was asked
 * for, so a range check reads nothing else and a free only its block.
 * (A chained table read a block record per link: among 4,096 live blocks
 * a look-up spent most of its time walking chains, docs/BENCHMARKS.md.)
 * A removal moves the entries after it back into the gap, so no slot is
 * ever a tombstone and the table never needs cleaning. A small block freed
 * keeps its slot, pending or in its quick list, its requested bytes 0
 * (entry.c's ca__stay_listed): callers that want live blocks check the state.
 *
 * Written and read under the arena's lock. Its memory is the library's own
 * (the leak scan leaves it out, meta.h).
 *
 * Part of the pool's one compilation unit (src/pool/pool.c includes the
 * files in layer order); not compiled alone.
 */

#define CA__LIVE_FIRST_BITS 6u /* 64 slots to begin with */

static inline uint64_t ca__live_home(const ca__live_table *t, uint64_t addr) {
  return (addr * 0x9E3779B97F4A7C15ull) >> (64u - t->bits);
}

static inline uint64_t ca__live_mask(const ca__live_table *t) {
  return ((uint64_t)1 << t->bits) - 1;
}

/* Empty, with 2^bits slots; false when the host is out of memory. */
static bool ca__live_init(ca__live_table *t, unsigned bits) {
  ca__live_slot *slots = ca_meta_alloc(sizeof(*slots) << bits);
  if (!slots)
    return false;
  *t = (ca__live_table){.slots = slots, .bits = bits};
  return true;
}

static void ca__live_fini(ca__live_table *t) {
  ca_meta_free(t->slots, sizeof(*t->slots) << t->bits);
  t->slots = NULL;
}

static void ca__live_clear(ca__live_table *t) {
  memset(t->slots, 0, sizeof(*t->slots) << t->bits);
  t->count = 0;
}

/* The slot of the block starting at addr, or NULL: a live one, or a
 * listed one, pending or parked, with 0 bytes requested. */
static inline ca__live_slot *ca__live_slot_of(const ca__live_table *t,
                                              uint64_t addr) {
  uint64_t mask = ca__live_mask(t);
  for (uint64_t i = ca__live_home(t, addr);; i = (i + 1) & mask) {
    ca__live_slot *s = &t->slots[i];
    if (s->addr == addr || !s->block)
      return s->block ? s : NULL;
  }
}

/* The block starting at addr, live or listed, or NULL. */
static inline ca__block *ca__live_get(const ca__live_table *t, uint64_t addr) {
  const ca__live_slot *s = ca__live_slot_of(t, addr);
  return s ? s->block : NULL;
}

/* Puts an entry in an empty slot of its probe sequence: the caller made
 * room (ca__live_room). */
static inline void ca__live_put(ca__live_table *t, ca__live_slot entry) {
  uint64_t mask = ca__live_mask(t), i = ca__live_home(t, entry.addr);
  while (t->slots[i].block)
    i = (i + 1) & mask;
  t->slots[i] = entry;
  t->count++;
}

/* Adds live block b, its requested bytes set. */
static inline void ca__live_add(ca__live_table *t, ca__block *b) {
  ca__live_put(t, (ca__live_slot){b->addr, b->requested, b});
}

/* Doubles the table, its entries moved over; false (the table untouched)
 * when the host is out of memory. */
static CA__COLD bool ca__live_grow(ca__live_table *t) {
  ca__live_table bigger;
  if (!ca__live_init(&bigger, t->bits + 1))
    return false;
  for (uint64_t i = 0; i <= ca__live_mask(t); i++)
    if (t->slots[i].block)
      ca__live_put(&bigger, t->slots[i]);
  ca__live_fini(t);
  *t = bigger;
  return true;
}

/* Whether one more block fits: growing at half full, and where the host
 * has no memory for that, while a slot stays empty after it (a look-up
 * stops at an empty slot). */
static inline bool ca__live_room(ca__live_table *t) {
  uint64_t count = t->count, slots = (uint64_t)1 << t->bits;
  return count < slots / 2 || ca__live_grow(t) || count + 2 <= slots;
}

/* Removes live block b, then moves back every entry after it that its
 * own probe sequence lets fill the gap, up to the next empty slot. */
static inline void ca__live_remove(ca__live_table *t, const ca__block *b) {
  uint64_t mask = ca__live_mask(t), gap = ca__live_home(t, b->addr);
  while (t->slots[gap].block != b)
    gap = (gap + 1) & mask;
  for (uint64_t i = (gap + 1) & mask; t->slots[i].block; i = (i + 1) & mask) {
    uint64_t home = ca__live_home(t, t->slots[i].addr);
    /* The entry may move to the gap when its home is not in (gap, i],
     * cyclically: its probe sequence passes the gap. */
    if (((i - home) & mask) >= ((i - gap) & mask)) {
      t->slots[gap] = t->slots[i];
      gap = i;
    }
  }
  t->slots[gap].block = NULL; /* empty: its other fields mean nothing */
  t->count--;
}

/* Each live block in turn, in no particular order: for (i = 0; ...
 * ca__live_next(t, &i)) until NULL. */
static inline ca__block *ca__live_next(const ca__live_table *t, uint64_t *i) {
  for (; *i <= ca__live_mask(t); (*i)++)
    if (t->slots[*i].block)
      return t->slots[(*i)++].block;
  return NULL;
}
