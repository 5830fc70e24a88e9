/*
 * A depot of records, each stored once and numbered from 1, never freed:
 * what the stack depot (stacks.c) and the Python frame store
 * (pyframes/store.c) are built on. Records are carved from mmap'd arenas
 * (no malloc: safe inside a hook at any time); an id's record is published
 * with one release store, so readers need no lock; carving takes the
 * depot's short lock. Each user keeps its own hash buckets and record
 * layout.
 */
#ifndef CA_DEPOT_H
#define CA_DEPOT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "support/lock.h"

#define CA_DEPOT_IDS_PER_CHUNK 4096u
#define CA_DEPOT_ID_CHUNKS 4096u /* up to 16M records */

typedef struct ca_depot {
  ca_lock lock;
  uint32_t next_id;         /* under the lock */
  char *arena, *arena_end;  /* under the lock */
  _Atomic(void *_Atomic *) ids[CA_DEPOT_ID_CHUNKS];
} ca_depot;

#define CA_DEPOT_INIT {CA_LOCK_INIT, 1, NULL, NULL, {NULL}}

/* Under d->lock: room for a record of `bytes` (16-byte aligned) and the
 * id it will have, in *id; NULL when the ids or the memory ran out. Fill
 * the record, then ca_depot_publish it. */
void *ca_depot_carve(ca_depot *d, size_t bytes, uint32_t *id);

/* Under d->lock: makes the record carved for `id` readable by id. */
void ca_depot_publish(ca_depot *d, uint32_t id, void *record);

/* The record published for `id`, or NULL (0, or an id never handed out). */
void *ca_depot_get(ca_depot *d, uint32_t id);

/* In a forked child: the lock free. Nothing is half-published (a record
 * becomes visible in one store), so the child may simply go on. */
void ca_depot_child(ca_depot *d);

#endif /* CA_DEPOT_H */
