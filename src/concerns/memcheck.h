/*
 * What memcheck.c, the concern of memcheck:1, shares with the policy: the
 * quarantine emptied and the live blocks' red zones checked at exit, a
 * dead context's blocks dropped, and the findings counted for the exit
 * status (docs/LEAKS.md, "memcheck").
 */
#ifndef CA_MEMCHECK_H
#define CA_MEMCHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "pool/pool.h"

/* Of a freed block larger than twice this, the first and the last this
 * many bytes are checked as it leaves the quarantine; a smaller one whole. */
#define CA_MEMCHECK_SAMPLE 4096

/* What memcheck found so far. */
typedef struct ca_memcheck_totals {
  uint64_t overflows;   /* blocks written past their end */
  uint64_t after_free;  /* blocks written after their free */
  uint64_t checked;     /* blocks checked */
} ca_memcheck_totals;

/* Every quarantined block checked (waiting for the device) and given back
 * to the pool; the findings printed. For the exit, before the leak
 * report; also when the device needs the room. */
void ca_memcheck_drain(void);

/* `stream` is about to be destroyed: when blocks freed on it are still
 * held, the quarantine is drained first, since their copies and markers
 * go on that stream, and the driver crashes on a destroyed stream's
 * handle. */
void ca_memcheck_stream_ended(uint64_t stream);

/* The red zones of `pool`'s live blocks (the program's, not the
 * quarantine's), checked, waiting for the device: at exit, and before a
 * context dies with its memory. A block found written is reported once. */
void ca_memcheck_check_pool(ca_pool *pool);

/* `pool`'s context died: its quarantined blocks are forgotten unchecked
 * (their memory went with it). */
void ca_memcheck_forget_pool(ca_pool *pool);

/* Whether the quarantine holds the block at `addr`: freed by the program,
 * live to its pool (the reports leave it out). */
bool ca_memcheck_holds(uint64_t addr);

ca_memcheck_totals ca_memcheck_totals_now(void);

#endif /* CA_MEMCHECK_H */
