/*
 * Memory over time: when live device memory peaked and which sites held
 * the most then, and the sites whose live memory kept growing (sites.h),
 * as text and as the JSON document's "peak" and "growth".
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* ---- Text ----------------------------------------------------------------- */

/* "40.0 MiB (41943040 bytes)" */
static void ca__bytes_words(char *buf, size_t len, uint64_t bytes) {
  char human[32];
  ca_format_bytes(human, sizeof(human), bytes);
  snprintf(buf, len, "%s (%" PRIu64 " bytes)", human, bytes);
}

/* The frames of stack `id`, leading plumbing folded away. */
static void ca__text_stack(const ca__leaks *l, uint32_t id) {
  const uintptr_t *pcs;
  size_t n = ca_stacks_get(id, &pcs);
  size_t from = ca__first_shown(pcs, n, &l->symbols);
  for (size_t i = from; i < n; i++)
    ca__text_frame(i - from, pcs[i], ca__symbol(&l->symbols, pcs[i]));
}

/* Seconds from the run's start to `at_ns` (both CLOCK_MONOTONIC). */
static double ca__seconds_in(const ca_report_input *in, uint64_t at_ns) {
  return at_ns > in->start_ns ? (double)(at_ns - in->start_ns) / 1e9 : 0.0;
}

static void ca__peak_text(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  const ca_sites_peak *p = in->peak;
  char at[64], shown[64];
  ca__bytes_words(at, sizeof(at), p->bytes);
  ca__bytes_words(shown, sizeof(shown), p->shown_bytes);
  ca_log("%s", "");
  ca_log("peak: %s of device memory live at once, %.2f s into the run "
         "(allocation %" PRIu64 "); at %s, the sites holding the most:",
         at, ca__seconds_in(in, p->at_ns), p->allocation, shown);
  for (size_t i = 0; i < p->nsites; i++) {
    char held[64];
    ca__bytes_words(held, sizeof(held), p->sites[i].bytes);
    ca_log("%s in %" PRIu64 " allocation(s), allocated from:", held,
           p->sites[i].count);
    ca__text_stack(l, p->sites[i].stack);
  }
  for (size_t i = 0; i < in->nreserved; i++) {
    char held[64];
    ca__bytes_words(held, sizeof(held), in->reserved[i].bytes);
    ca_log("held on device %d (the pool's segments and what went to the driver "
           "directly) peaked at %s, %.2f s into the run",
           in->reserved[i].device, held, ca__seconds_in(in, in->reserved[i].at_ns));
  }
}

static void ca__growth_text(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  ca_log("%s", "");
  if (in->growth_found == 0) {
    ca_log("growth: no site kept growing over %d snapshots or more (%" PRIu64
           " snapshot(s) taken)",
           CA_SITES_GROWTH_RUN, in->snapshots);
    return;
  }
  ca_log("growth: %zu site(s) kept growing (%" PRIu64
         " snapshot(s) of live memory by site taken):",
         in->growth_found, in->snapshots);
  for (size_t i = 0; i < in->ngrowth; i++) {
    const ca_site_growth *g = &in->growth[i];
    char grown[64], from[32], to[32];
    ca__bytes_words(grown, sizeof(grown), g->to_bytes - g->from_bytes);
    ca_format_bytes(from, sizeof(from), g->from_bytes);
    ca_format_bytes(to, sizeof(to), g->to_bytes);
    ca_log("+%s, from %s to %s, over %u consecutive snapshots (rising in %u; "
           "allocations %" PRIu64 " to %" PRIu64 "), allocated from:",
           grown, from, to, g->snapshots, g->rises, g->from_alloc, g->to_alloc);
    ca__text_stack(l, g->stack);
  }
  if (in->growth_found > in->ngrowth)
    ca_log("... %zu more growing site(s)", in->growth_found - in->ngrowth);
}

static void ca__over_time_text(const ca__leaks *l) {
  if (l->in->peak && l->in->peak->bytes > 0)
    ca__peak_text(l);
  if (l->in->growth)
    ca__growth_text(l);
}

/* ---- JSON ----------------------------------------------------------------- */

static void ca__json_stack(ca__out *o, const ca__leaks *l, uint32_t id) {
  const uintptr_t *pcs;
  size_t n = ca_stacks_get(id, &pcs);
  size_t from = ca__first_shown(pcs, n, &l->symbols);
  ca__out_put(o, "\"frames\":[", 10);
  for (size_t i = from; i < n; i++) {
    if (i > from)
      ca__out_put(o, ",", 1);
    ca__json_frame(o, pcs[i], ca__symbol(&l->symbols, pcs[i]));
  }
  ca__out_put(o, "]", 1);
}

static void ca__over_time_json(ca__out *o, const ca__leaks *l) {
  const ca_report_input *in = l->in;
  const ca_sites_peak *p = in->peak;
  if (p && p->bytes > 0) {
    ca__printf(o,
               ",\"peak\":{\"bytes\":%" PRIu64 ",\"seconds\":%.3f"
               ",\"allocation\":%" PRIu64 ",\"shown_bytes\":%" PRIu64
               ",\"held\":[",
               p->bytes, ca__seconds_in(in, p->at_ns), p->allocation,
               p->shown_bytes);
    for (size_t i = 0; i < in->nreserved; i++)
      ca__printf(o, "%s{\"device\":%d,\"bytes\":%" PRIu64 ",\"seconds\":%.3f}",
                 i ? "," : "", in->reserved[i].device, in->reserved[i].bytes,
                 ca__seconds_in(in, in->reserved[i].at_ns));
    ca__out_put(o, "],\"sites\":[", 11);
    for (size_t i = 0; i < p->nsites; i++) {
      ca__printf(o, "%s{\"bytes\":%" PRIu64 ",\"count\":%" PRIu64 ",",
                 i ? "," : "", p->sites[i].bytes, p->sites[i].count);
      ca__json_stack(o, l, p->sites[i].stack);
      ca__out_put(o, "}", 1);
    }
    ca__out_put(o, "]}", 2);
  }
  if (in->growth == NULL)
    return;
  ca__printf(o, ",\"growth\":{\"snapshots\":%" PRIu64 ",\"found\":%zu,"
                "\"sites\":[",
             in->snapshots, in->growth_found);
  for (size_t i = 0; i < in->ngrowth; i++) {
    const ca_site_growth *g = &in->growth[i];
    ca__printf(o,
               "%s{\"from_bytes\":%" PRIu64 ",\"to_bytes\":%" PRIu64
               ",\"snapshots\":%u,\"rises\":%u,\"from_allocation\":%" PRIu64
               ",\"to_allocation\":%" PRIu64 ",",
               i ? "," : "", g->from_bytes, g->to_bytes, g->snapshots,
               g->rises, g->from_alloc, g->to_alloc);
    ca__json_stack(o, l, g->stack);
    ca__out_put(o, "}", 1);
  }
  ca__out_put(o, "]}", 2);
}
