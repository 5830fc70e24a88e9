/*
 * The report for tools: one JSON document a line.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
static void ca__json_frame(ca__out *o, uintptr_t pc, const ca_symbol *sym) {
  if (sym != NULL && ca__is_python(sym)) {
    ca__out_put(o, "{\"python\":true,\"function\":", 26);
    ca__put_json_string(o, sym->function);
    ca__out_put(o, ",\"file\":", 8);
    ca__put_json_string(o, sym->file);
    ca__printf(o, ",\"line\":%u}", sym->line);
    return;
  }
  ca__printf(o, "{\"pc\":\"0x%" PRIxPTR "\",\"function\":", pc);
  ca__put_json_string(o, sym ? sym->function : NULL);
  ca__printf(o, ",\"offset\":%" PRIu64 ",\"file\":",
             sym ? sym->function_offset : 0);
  ca__put_json_string(o, sym ? sym->file : NULL);
  ca__printf(o, ",\"line\":%u,\"module\":", sym ? sym->line : 0);
  ca__put_json_string(o, sym ? sym->module : NULL);
  ca__printf(o, ",\"module_offset\":\"0x%" PRIx64 "\"}",
             sym ? sym->module_offset : 0);
}

/* What the scan found of a group (all its blocks alike but for lost and
 * unclassed ones, which group together: the first block's is given). */
static const char *ca__reach_name(ca_report_reach reach) {
  switch (reach) {
  case CA_REACH_LOST:
    return "lost";
  case CA_REACH_UNCLASSED:
    return "unclassed";
  case CA_REACH_REACHABLE:
    return "reachable";
  case CA_REACH_UNSCANNED:
    break;
  }
  return "unscanned";
}

static void ca__json_group(ca__out *o, const ca__leaks *l, const ca__group *g) {
  const ca_report_block *first = &l->blocks[g->first];
  ca__printf(o, "{\"device\":%d,\"call\":", first->device);
  ca__put_json_string(o, first->call);
  ca__printf(o,
             ",\"bytes\":%" PRIu64 ",\"count\":%zu,\"sizes\":{\"min\":%" PRIu64
             ",\"max\":%" PRIu64 "},\"suppressed\":%s,\"reach\":\"%s\","
             "\"allocations\":[",
             g->bytes, g->count, g->min, g->max,
             g->suppressed ? "true" : "false", ca__reach_name(first->reach));
  for (size_t i = 0; i < g->count && i < CA__JSON_SAMPLES; i++) {
    const ca_report_block *b = &l->blocks[g->first + i];
    ca__printf(o,
               "%s{\"seq\":%" PRIu64 ",\"address\":\"0x%" PRIx64
               "\",\"bytes\":%" PRIu64 "}",
               i ? "," : "", b->seq, b->addr, b->bytes);
  }
  ca__out_put(o, "],\"frames\":[", 12);
  const uintptr_t *pcs;
  size_t n = ca__stack_of(first, &pcs);
  for (size_t i = g->shown_from; i < n; i++) {
    if (i > g->shown_from)
      ca__out_put(o, ",", 1);
    ca__json_frame(o, pcs[i], ca__symbol(&l->symbols, pcs[i]));
  }
  ca__out_put(o, "]}", 2);
}

static const char *ca__event_name(ca_report_event event) {
  switch (event) {
  case CA_EVENT_EXIT:
    return "exit";
  case CA_EVENT_CONTEXT_RESET:
    return "context_reset";
  case CA_EVENT_SIGNAL:
    return "signal";
  case CA_EVENT_API:
    return "api";
  case CA_EVENT_OOM:
    return "out_of_memory";
  }
  return "?";
}

/* "peak" and "growth" (report/over_time.c). */
static void ca__over_time_json(ca__out *o, const ca__leaks *l);

/* One document on one line: tools read a log file line by line. */
static void ca__json(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  ca__out o;
  ca__json_begin(&o, ca__event_name(in->event));
  if (in->event == CA_EVENT_CONTEXT_RESET)
    ca__printf(&o, ",\"device\":%d", in->device);
  if (in->leaks) {
    /* Suppressed and reachable groups are listed too, marked, for tools;
     * max_leaks counts the others, as in the text report. */
    ca__out_put(&o, ",\"leaks\":[", 10);
    size_t listed = 0, printed = 0;
    for (size_t i = 0; i < l->ngroups; i++) {
      const ca__group *g = &l->groups[i];
      if (!g->suppressed && !g->reachable && printed++ >= l->max_groups)
        continue;
      if (listed++ > 0)
        ca__out_put(&o, ",", 1);
      ca__json_group(&o, l, g);
    }
    const ca_leak_totals *t = &l->totals;
    ca__printf(&o,
               "],\"summary\":{\"bytes\":%" PRIu64 ",\"count\":%" PRIu64
               ",\"suppressed_bytes\":%" PRIu64
               ",\"suppressed_count\":%" PRIu64 ",\"reachable_bytes\":%" PRIu64
               ",\"reachable_count\":%" PRIu64 ",\"unclassed_bytes\":%" PRIu64
               ",\"unclassed_count\":%" PRIu64 ",\"scanned\":%s,\"groups\":%zu"
               ",\"allocations\":%" PRIu64 "}",
               t->bytes, t->count, t->suppressed_bytes, t->suppressed_count,
               t->reachable_bytes, t->reachable_count, t->unclassed_bytes,
               t->unclassed_count, l->scanned ? "true" : "false", l->ngroups,
               in->allocations);
  }
  if (in->nstats > 0) {
    ca__out_put(&o, ",\"stats\":[", 10);
    for (size_t i = 0; i < in->nstats; i++) {
      if (i > 0)
        ca__out_put(&o, ",", 1);
      ca__stats_json(&o, &in->stats[i]);
    }
    ca__out_put(&o, "]", 1);
  }
  ca__over_time_json(&o, l);
  ca__out_put(&o, "}\n", 2);
  ca__flush(&o);
}
