/*
 * A fixed-size open-addressed map keyed by device address, over a table the
 * caller owns (static data of the library's, which the leak scan skips).
 * Each entry starts with its uint64_t key (0: empty); linear probing, and
 * deletion that moves back the entries a hole would hide. No lock: the
 * caller holds its own.
 */
#ifndef CA_ADDRMAP_H
#define CA_ADDRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ca_addrmap {
  void *entries; /* cap entries of `size` bytes */
  size_t size;
  unsigned cap; /* a power of two */
  unsigned used;
} ca_addrmap;

#define CA_ADDRMAP_INIT(table)                                                 \
  {(table), sizeof((table)[0]), sizeof(table) / sizeof((table)[0]), 0}

/* The entry of `key`, or NULL. */
void *ca_addrmap_find(ca_addrmap *m, uint64_t key);

/* The entry of `key`, made (zeroed, its key set) if it had none; NULL
 * when the table is full. */
void *ca_addrmap_put(ca_addrmap *m, uint64_t key);

/* Removes `entry` (one ca_addrmap_find or _put returned). */
void ca_addrmap_remove(ca_addrmap *m, void *entry);

/* Empties the map (a forked child's fresh start). */
void ca_addrmap_clear(ca_addrmap *m);

/* The i-th slot of the table, for a walk over every entry (key 0: empty);
 * removing during a walk moves later entries back, so walk backwards. */
void *ca_addrmap_slot(ca_addrmap *m, unsigned i);

#endif /* CA_ADDRMAP_H */
