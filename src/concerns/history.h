/*
 * The recent history of pooled allocations and frees (history.c, the
 * concern of oom_snapshot): what PyTorch's snapshot calls its trace, kept
 * for the snapshot written at the first out of memory.
 */
#ifndef CA_HISTORY_H
#define CA_HISTORY_H

#include <stddef.h>
#include <stdint.h>

/* Entries kept: the latest, the oldest overwritten. */
#define CA_HISTORY_ENTRIES 16384

typedef enum ca_history_kind { CA_HISTORY_ALLOC, CA_HISTORY_FREE } ca_history_kind;

typedef struct ca_history_entry {
  uint64_t us;     /* CLOCK_REALTIME, microseconds */
  uint64_t addr, bytes, stream;
  uint32_t stack;  /* the allocation's stack id (0: none) */
  int32_t device;
  uint32_t kind;   /* ca_history_kind */
} ca_history_entry;

/* The entries kept, oldest first, at most `max` of the latest, into out.
 * Returns how many. */
size_t ca_history_copy(ca_history_entry *out, size_t max);

#endif /* CA_HISTORY_H */
