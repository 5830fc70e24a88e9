/*
 * The memory summary, text and JSON, expanded from stats.h.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* ---- The memory summary -------------------------------------------------- */

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

static void ca__stats_text(const cudalloc_device_stats *s) {
  char free_b[32], largest[32], pending[32];
  ca_format_bytes(free_b, sizeof(free_b), s->free_cached_bytes);
  ca_format_bytes(pending, sizeof(pending), s->pending_free_bytes);
  ca_format_bytes(largest, sizeof(largest), s->largest_free_block);
  double hit_rate = s->allocs ? 100.0 * (double)s->cache_hits /
                                    (double)s->allocs
                              : 0.0;
  ca_log("device %d memory summary", s->device);
  ca_log("  %-16s %12s %12s %12s", "", "current", "peak", "total");
#define CA__ROW(field, row, bytes) ca__stat_row(row, &s->field, bytes);
  CA_STATS_TRIPLES(CA__ROW)
#undef CA__ROW
  ca_log("  cache hits %.1f%% (%" PRIu64 " of %" PRIu64 " allocations, %" PRIu64
         " frees); driver allocations %" PRIu64 ", frees %" PRIu64
         "; %" PRIu64 " driver allocations and %" PRIu64 " frees avoided",
         hit_rate, s->cache_hits, s->allocs, s->frees, s->backend_allocs,
         s->backend_frees,
         s->allocs > s->backend_allocs ? s->allocs - s->backend_allocs : 0,
         s->frees > s->backend_frees ? s->frees - s->backend_frees : 0);
  ca_log("  out-of-memory retries %" PRIu64 ", failed allocations %" PRIu64
         ", segments given back by the threshold %" PRIu64,
         s->oom_retries, s->failed_allocs, s->gc_segments_released);
  ca_log("  free cached %s, largest free block %s, fragmentation %.1f%%; "
         "%s freed but waiting for the device",
         free_b, largest, 100.0 * s->fragmentation, pending);
}

/* Every field, by its name in the struct, in the struct's order. */
static void ca__stats_json(ca__out *o, const cudalloc_device_stats *s) {
  char json[CA_STATS_JSON_MAX];
  size_t n = ca_stats_json(s, json, sizeof(json));
  ca__out_put(o, json, n < sizeof(json) ? n : sizeof(json) - 1);
}
