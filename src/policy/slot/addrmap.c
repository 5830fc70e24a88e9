/*
 * The address-keyed map (see addrmap.h).
 */
#include "policy/slot/addrmap.h"

#include <stdbool.h>
#include <string.h>

static uint64_t *ca__key_at(const ca_addrmap *m, unsigned i) {
  return (uint64_t *)((char *)m->entries + (size_t)i * m->size);
}

/* Blocks are at least 512 bytes apart: the bits above spread the keys. */
static unsigned ca__home_of(const ca_addrmap *m, uint64_t key) {
  return (unsigned)(((key >> 9) * 0x9E3779B97F4A7C15ull) >> 40) & (m->cap - 1);
}

/* The slot holding `key`, or the empty one it would take; cap when full. */
static unsigned ca__probe(const ca_addrmap *m, uint64_t key) {
  unsigned at = ca__home_of(m, key);
  for (unsigned n = 0; n < m->cap; n++, at = (at + 1) & (m->cap - 1)) {
    uint64_t k = *ca__key_at(m, at);
    if (k == key || k == 0)
      return at;
  }
  return m->cap;
}

void *ca_addrmap_find(ca_addrmap *m, uint64_t key) {
  unsigned at = key ? ca__probe(m, key) : m->cap;
  return at < m->cap && *ca__key_at(m, at) == key ? ca__key_at(m, at) : NULL;
}

void *ca_addrmap_put(ca_addrmap *m, uint64_t key) {
  unsigned at = key ? ca__probe(m, key) : m->cap;
  if (at == m->cap)
    return NULL;
  uint64_t *e = ca__key_at(m, at);
  if (*e == key)
    return e;
  /* One slot always stays empty, so that every probe ends. */
  if (m->used + 1 >= m->cap)
    return NULL;
  memset(e, 0, m->size);
  *e = key;
  m->used++;
  return e;
}

void ca_addrmap_remove(ca_addrmap *m, void *entry) {
  unsigned hole = (unsigned)(((char *)entry - (char *)m->entries) / m->size);
  for (unsigned next = (hole + 1) & (m->cap - 1); *ca__key_at(m, next) != 0;
       next = (next + 1) & (m->cap - 1)) {
    unsigned home = ca__home_of(m, *ca__key_at(m, next));
    /* It stays where it is when its home lies within (hole, next]. */
    bool stays = hole <= next ? (home > hole && home <= next)
                              : (home > hole || home <= next);
    if (!stays) {
      memcpy(ca__key_at(m, hole), ca__key_at(m, next), m->size);
      hole = next;
    }
  }
  *ca__key_at(m, hole) = 0;
  m->used--;
}

void ca_addrmap_clear(ca_addrmap *m) {
  for (unsigned i = 0; i < m->cap; i++)
    *ca__key_at(m, i) = 0;
  m->used = 0;
}

void *ca_addrmap_slot(ca_addrmap *m, unsigned i) { return ca__key_at(m, i); }
