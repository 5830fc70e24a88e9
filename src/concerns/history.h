/*
 * The recent history of pooled allocations and frees (history.c, the
 * concern of oom_snapshot): what PyTorch's snapshot calls its trace, kept
 * for the snapshot written at the first out of memory.
 */
#ifndef CA_HISTORY_H
#define CA_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#include "report/report.h"

/* Entries kept: the latest, the oldest overwritten. */
#define CA_HISTORY_ENTRIES 16384

/* The entries kept, oldest first, at most `max` of the latest, into out
 * (report.h's steps, as PyTorch's snapshot writes them). Returns how many. */
size_t ca_history_copy(ca_report_step *out, size_t max);

#endif /* CA_HISTORY_H */
