/*
 * The memory summary and the live-allocation list (see report.h).
 */
#include "report.h"

#include <inttypes.h>
#include <stdio.h>

#include "log.h"
#include "runtime.h"
#include "track.h"

/* How many live allocations of each device the list shows one by one. */
#define CA__LIVE_SHOWN 20

void ca_format_bytes(char *buf, size_t len, uint64_t bytes) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%" PRIu64 " B", bytes);
    return;
  }
  double v = (double)bytes / 1024.0;
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void ca__stat_row(const char *name, const cudalloc_stat *s, int bytes) {
  char cur[32], peak[32], total[32];
  if (bytes) {
    ca_format_bytes(cur, sizeof(cur), s->current);
    ca_format_bytes(peak, sizeof(peak), s->peak);
    ca_format_bytes(total, sizeof(total), s->total);
  } else {
    snprintf(cur, sizeof(cur), "%" PRIu64, s->current);
    snprintf(peak, sizeof(peak), "%" PRIu64, s->peak);
    snprintf(total, sizeof(total), "%" PRIu64, s->total);
  }
  ca_log("  %-16s %12s %12s %12s", name, cur, peak, total);
}

static void ca__stats_of(const cudalloc_device_stats *s) {
  char free_b[32], largest[32], pending[32];
  ca_format_bytes(free_b, sizeof(free_b), s->free_cached_bytes);
  ca_format_bytes(pending, sizeof(pending), s->pending_free_bytes);
  ca_format_bytes(largest, sizeof(largest), s->largest_free_block);
  double hit_rate = s->allocs ? 100.0 * (double)s->cache_hits /
                                    (double)s->allocs
                              : 0.0;
  ca_log("device %d memory summary", s->device);
  ca_log("  %-16s %12s %12s %12s", "", "current", "peak", "total");
  ca__stat_row("requested", &s->requested_bytes, 1);
  ca__stat_row("allocated", &s->allocated_bytes, 1);
  ca__stat_row("reserved", &s->reserved_bytes, 1);
  ca__stat_row("blocks", &s->blocks, 0);
  ca__stat_row("segments", &s->segments, 0);
  ca_log("  cache hits %.1f%% (%" PRIu64 " of %" PRIu64 " allocations); "
         "driver allocations %" PRIu64 ", frees %" PRIu64
         "; %" PRIu64 " driver allocations and %" PRIu64 " frees avoided",
         hit_rate, s->cache_hits, s->allocs, s->backend_allocs,
         s->backend_frees, s->allocs - s->backend_allocs,
         s->frees > s->backend_frees ? s->frees - s->backend_frees : 0);
  ca_log("  out-of-memory retries %" PRIu64 ", failed allocations %" PRIu64
         ", segments given back by the threshold %" PRIu64,
         s->oom_retries, s->failed_allocs, s->gc_segments_released);
  ca_log("  free cached %s, largest free block %s, fragmentation %.1f%%; "
         "%s freed but waiting for the device",
         free_b, largest, 100.0 * s->fragmentation, pending);
}

void ca_report_stats(void) {
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    ca_pool *pool = ca_runtime_pool_if_any(d);
    if (!pool)
      continue;
    cudalloc_device_stats s;
    ca_pool_get_stats(pool, &s);
    ca__stats_of(&s);
  }
}

typedef struct ca__live_tally {
  size_t shown;
  uint64_t count, bytes;
} ca__live_tally;

static void ca__print_pooled(const ca_live_block *b, void *arg) {
  ca__live_tally *t = arg;
  t->count++;
  t->bytes += b->requested;
  if (t->shown++ < CA__LIVE_SHOWN)
    ca_log("  %" PRIu64 " bytes at 0x%" PRIx64 " on device %d (allocation #%"
           PRIu64 ")", b->requested, b->addr, b->device, b->seq);
}

static void ca__print_tracked(const ca_tracked *t, void *arg) {
  ca__live_tally *tally = arg;
  tally->count++;
  tally->bytes += t->size;
  if (tally->shown++ < CA__LIVE_SHOWN)
    ca_log("  %" PRIu64 " bytes, %s, %s 0x%" PRIx64 " on device %d",
           t->size, ca_track_kind_name(t->kind),
           t->kind == CA_TRACK_VMM ? "handle" : "at", t->key, t->device);
}

void ca_report_live(void) {
  ca__live_tally tally = {0, 0, 0};
  ca_log("live device allocations:");
  for (int d = 0; d < CUDALLOC_MAX_DEVICES; d++) {
    ca_pool *pool = ca_runtime_pool_if_any(d);
    if (pool)
      ca_pool_foreach_live(pool, ca__print_pooled, &tally);
  }
  ca_track_foreach(ca__print_tracked, &tally);
  if (tally.shown > CA__LIVE_SHOWN)
    ca_log("  ... and %zu more", tally.shown - CA__LIVE_SHOWN);
  ca_log("%" PRIu64 " bytes live in %" PRIu64 " allocation(s)", tally.bytes,
         tally.count);
}
