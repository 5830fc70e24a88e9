/*
 * The pool (see pool.h; its design: docs/POOL.md), compiled as one unit.
 *
 * Each file below holds one concern and is included here, lowest layer
 * first, so that every helper stays file-static and the hot path's
 * helpers inline across files: a pooled allocate and free cost the same
 * instructions as when the pool was one file (scripts/bench-cpu.sh).
 */
#include "pool/pool_internal.h"

#include "pool/records.c"
#include "pool/live.c"
#include "pool/where.c"
#include "pool/bins.c"
#include "pool/segments.c"
#include "pool/stale.c"
#include "pool/blocks.c"
#include "pool/stream_free.c"
#include "pool/pending.c"
#include "pool/grow.c"
#include "pool/expandable.c"
#include "pool/arenas.c"
#include "pool/entry.c"
#include "pool/views.c"
#include "pool/check.c"
#include "pool/bytes.c"
