/*
 * The report for people.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* ---- Text ---------------------------------------------------------------- */

/* " on device 3", or " on an unknown device". */
static void ca__device_words(char *buf, size_t len, int device) {
  if (device >= 0)
    snprintf(buf, len, " on device %d", device);
  else
    snprintf(buf, len, " on an unknown device");
}

/* " (cuMemAllocManaged)" for passed-through calls, "" for the pool's. */
static void ca__call_words(char *buf, size_t len, const char *call) {
  if (strcmp(call, CA_REPORT_POOLED_CALL) == 0)
    buf[0] = '\0';
  else
    snprintf(buf, len, " (%s)", call);
}

static void ca__text_frame(size_t index, uintptr_t pc, const ca_symbol *sym) {
  char words[1024];
  ca__frame_words(words, sizeof(words), sym);
  if (sym != NULL && ca__is_python(sym))
    ca_log("    #%zu in %s", index, words);
  else
    ca_log("    #%zu 0x%" PRIxPTR " in %s", index, pc, words);
}

/* "allocations #1 at 0x..., #2 at 0x..., ... (97 more)" */
static void ca__text_samples(const ca_report_block *b, const ca__group *g) {
  char line[512];
  size_t len = (size_t)snprintf(line, sizeof(line), "    allocation%s",
                                g->count > 1 ? "s" : "");
  size_t shown = g->count < CA__TEXT_SAMPLES ? g->count : CA__TEXT_SAMPLES;
  for (size_t i = 0; i < shown && len < sizeof(line); i++) {
    const ca_report_block *x = &b[g->first + i];
    len += (size_t)snprintf(line + len, sizeof(line) - len,
                            "%s #%" PRIu64 " at 0x%" PRIx64, i ? "," : "",
                            x->seq, x->addr);
  }
  if (g->count > shown && len < sizeof(line))
    snprintf(line + len, sizeof(line) - len, ", ... (%zu more)",
             g->count - shown);
  ca_log("%s", line);
}

static const char *ca__verb(ca_report_event event) {
  return event == CA_EVENT_API ? "live" : "leaked";
}

/* A group's verb: a leak's, still reachable, or (on request, where every
 * live block is listed) lost when the scan found no pointer to it. */
static const char *ca__group_verb(const ca_report_input *in,
                                  const ca_report_block *first,
                                  const ca__group *g) {
  if (g->reachable)
    return "still reachable";
  if (in->event == CA_EVENT_API && first->reach == CA_REACH_LOST)
    return "lost";
  return ca__verb(in->event);
}

/* The summary's verb for the leaks' total. */
static const char *ca__summary_verb(const ca_report_input *in, bool scanned) {
  return in->event == CA_EVENT_API && scanned ? "lost" : ca__verb(in->event);
}

/* A group's line, "AMOUNT in 3 allocation(s) on device 0, allocated
 * from:", and its frames; without a stack, the blocks' size and a few of
 * them. `amount` says its bytes and their verb, `on` its device ("" for
 * none). */
static void ca__text_group_as(const char *amount, const char *on,
                              const ca_report_block *b, const ca__group *g,
                              const ca__symbols *s) {
  char call[64];
  const ca_report_block *first = &b[g->first];
  ca__call_words(call, sizeof(call), first->call);
  ca_log("%s", "");
  const uintptr_t *pcs;
  size_t n = ca__stack_of(first, &pcs);
  if (n == 0) {
    ca_log("%s in %zu allocation(s) of %" PRIu64 " bytes%s%s:", amount,
           g->count, first->bytes, on, call);
    ca__text_samples(b, g);
    return;
  }
  ca_log("%s in %zu allocation(s)%s%s, allocated from:", amount, g->count, on,
         call);
  for (size_t i = g->shown_from; i < n; i++)
    ca__text_frame(i - g->shown_from, pcs[i], ca__symbol(s, pcs[i]));
}

static void ca__text_group(const ca_report_input *in,
                           const ca_report_block *b, const ca__group *g,
                           const ca__symbols *s) {
  char amount[64], on[48];
  ca__device_words(on, sizeof(on), b[g->first].device);
  snprintf(amount, sizeof(amount), "%" PRIu64 " bytes %s", g->bytes,
           ca__group_verb(in, &b[g->first], g));
  ca__text_group_as(amount, on, b, g, s);
}

static void ca__text_header(const ca_report_input *in) {
  int pid = (int)getpid();
  if (in->event == CA_EVENT_API)
    ca_log("==%d== live device allocations (on request)", pid);
  else if (in->event == CA_EVENT_CONTEXT_RESET)
    ca_log("==%d== device memory leak report (at context reset of device %d)",
           pid, in->device);
  else
    ca_log("==%d== device memory leak report (at exit)", pid);
}

/* ---- Leak report ---------------------------------------------------------- */

/* Everything the printers need about one report. */
typedef struct ca__leaks {
  const ca_report_input *in;
  const ca_report_block *blocks; /* sorted into groups */
  ca__group *groups;             /* ordered for printing */
  size_t ngroups;
  ca__symbols symbols;
  ca_leak_totals totals;
  size_t max_groups; /* printed at most; SIZE_MAX for all */
  bool list_reachable; /* report_reachable */
  bool scanned;        /* the blocks were classed (leak_scan) */
} ca__leaks;

/* "; 4096 bytes in 2 allocations still reachable (...)" or "". */
static void ca__reachable_words(char *buf, size_t len, const ca__leaks *l) {
  const ca_leak_totals *t = &l->totals;
  buf[0] = '\0';
  if (t->reachable_count > 0)
    snprintf(buf, len,
             "; %" PRIu64 " bytes in %" PRIu64 " allocations still reachable%s",
             t->reachable_bytes, t->reachable_count,
             l->list_reachable ? "" : " (report_reachable:1 lists them)");
}

/* The one line for a report with nothing to list. */
static void ca__text_nothing(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  const ca_leak_totals *t = &l->totals;
  char how[128];
  if (t->suppressed_count == 0)
    snprintf(how, sizeof(how), "%s", t->reachable_count ? "none lost" : "all freed");
  else
    snprintf(how, sizeof(how),
             "%" PRIu64 " bytes in %" PRIu64 " allocations suppressed",
             t->suppressed_bytes, t->suppressed_count);
  char reachable[160];
  ca__reachable_words(reachable, sizeof(reachable), l);
  if (in->event == CA_EVENT_API) /* reachable ones are listed, not here */
    ca_log("no live device allocations%s%s%s", t->suppressed_count ? " (" : "",
           t->suppressed_count ? how : "", t->suppressed_count ? ")" : "");
  else if (in->event == CA_EVENT_EXIT)
    ca_log("no device memory leaks (%" PRIu64 " allocations, %s%s)",
           in->allocations, how, reachable);
}

static void ca__leaks_text(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  bool list_reachable = l->list_reachable && l->totals.reachable_count > 0;
  if (l->totals.count == 0 && !list_reachable) {
    ca__text_nothing(l);
    return;
  }
  ca__text_header(in);
  size_t printed = 0;
  uint64_t rest_bytes = 0, rest_count = 0, rest_groups = 0;
  bool stackless = false;
  for (size_t i = 0; i < l->ngroups; i++) {
    const ca__group *g = &l->groups[i];
    if (g->suppressed || (g->reachable && !list_reachable))
      continue;
    if (printed == l->max_groups) {
      rest_groups++;
      rest_bytes += g->bytes;
      rest_count += g->count;
      continue;
    }
    ca__text_group(in, l->blocks, g, &l->symbols);
    stackless |= l->blocks[g->first].stack == 0;
    printed++;
  }
  if (rest_groups > 0)
    ca_log("... %" PRIu64 " more group(s) (%" PRIu64
           " bytes in %" PRIu64 " allocations); max_leaks:0 shows all",
           rest_groups, rest_bytes, rest_count);
  ca_log("%s", "");
  const ca_leak_totals *t = &l->totals;
  char apart[128] = "";
  if (t->suppressed_count > 0)
    snprintf(apart, sizeof(apart),
             " (%" PRIu64 " bytes in %" PRIu64 " allocations suppressed)",
             t->suppressed_bytes, t->suppressed_count);
  char reachable[160];
  ca__reachable_words(reachable, sizeof(reachable), l);
  if (t->count == 0) /* only the reachable ones were listed */
    ca_log("SUMMARY: nothing %s%s%s", ca__summary_verb(in, l->scanned), apart,
           reachable);
  else
    ca_log("SUMMARY: %" PRIu64 " bytes %s in %" PRIu64 " allocations%s%s",
           t->bytes, ca__summary_verb(in, l->scanned), t->count, apart,
           reachable);
  if (t->unclassed_count > 0)
    ca_log("%" PRIu64 " bytes in %" PRIu64 " of them could not be classed: "
           "the driver keeps their addresses too (passed through to it, or "
           "at the start of one of its allocations)",
           t->unclassed_bytes, t->unclassed_count);
  if (stackless)
    ca_log("set CUDALLOC_CONF=backtrace_depth:16 to see where %s memory was "
           "allocated",
           in->event == CA_EVENT_API ? "live" : "leaked");
}
