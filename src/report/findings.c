/*
 * memcheck's findings and totals (report.h), as text for people or one
 * JSON document each for tools, with the frames named as the leak
 * report names them.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
static bool ca__finding_past_end(const ca_report_finding *f) {
  return f->kind != CA_FINDING_AFTER_FREE;
}

/* "    allocated at:" and its frames, or "(no stack)". */
static void ca__finding_stack_text(const char *what, uint32_t stack,
                                   const ca__symbols *s) {
  const uintptr_t *pcs;
  size_t n = stack ? ca_stacks_get(stack, &pcs) : 0;
  if (n == 0) {
    ca_log("    %s: (no stack)", what);
    return;
  }
  ca_log("    %s:", what);
  char words[1024];
  for (size_t i = ca__first_shown(pcs, n, s), k = 0; i < n; i++, k++) {
    ca__frame_words(words, sizeof(words), ca__symbol(s, pcs[i]));
    ca_log("      #%zu in %s", k, words);
  }
}

static void ca__finding_text(const ca_report_finding *f, const ca__symbols *s) {
  char bytes[40] = "";
  if (f->requested >= 1024) {
    char size[32];
    ca_format_bytes(size, sizeof(size), f->requested);
    snprintf(bytes, sizeof(bytes), " (%s)", size);
  }
  if (!ca__finding_past_end(f))
    ca_log("memcheck: write after free at offset %" PRIu64 " of a block of "
           "%" PRIu64 " bytes%s at 0x%" PRIx64 " on device %d: %" PRIu64
           " byte%s changed in the part checked",
           f->first, f->requested, bytes, f->addr, f->device, f->count,
           f->count == 1 ? "" : "s");
  else
    ca_log("memcheck: %" PRIu64 " byte%s written past the end of a block of "
           "%" PRIu64 " bytes%s at 0x%" PRIx64 " on device %d, the first "
           "%" PRIu64 " past it%s",
           f->count, f->count == 1 ? "" : "s", f->requested, bytes, f->addr,
           f->device, f->first,
           f->kind == CA_FINDING_PAST_END_LIVE ? "; the block is still live" : "");
  ca__finding_stack_text("allocated at", f->alloc_stack, s);
  if (f->kind != CA_FINDING_PAST_END_LIVE)
    ca__finding_stack_text("freed at", f->free_stack, s);
}

/* ,"NAME":[frames], or null for no stack. */
static void ca__finding_stack_json(ca__out *o, const char *name, uint32_t stack,
                                   const ca__symbols *s) {
  const uintptr_t *pcs;
  size_t n = stack ? ca_stacks_get(stack, &pcs) : 0;
  ca__printf(o, ",\"%s\":", name);
  if (n == 0) {
    ca__out_put(o, "null", 4);
    return;
  }
  ca__out_put(o, "[", 1);
  size_t from = ca__first_shown(pcs, n, s);
  for (size_t i = from; i < n; i++) {
    if (i > from)
      ca__out_put(o, ",", 1);
    ca__json_frame(o, pcs[i], ca__symbol(s, pcs[i]));
  }
  ca__out_put(o, "]", 1);
}

/* One document: what was found, where in the block, and both stacks. */
static void ca__finding_json(const ca_report_finding *f, const ca__symbols *s) {
  ca__out o;
  bool past = ca__finding_past_end(f);
  ca__json_begin(&o, "memcheck");
  ca__printf(&o,
             ",\"kind\":\"%s\",\"live\":%s,\"device\":%d,\"address\":\"0x%" PRIx64
             "\",\"bytes\":%" PRIu64 ",\"changed_bytes\":%" PRIu64
             ",\"offset\":%" PRIu64,
             past ? "past_end" : "after_free",
             f->kind == CA_FINDING_PAST_END_LIVE ? "true" : "false", f->device,
             f->addr, f->requested, f->count,
             past ? f->requested + f->first : f->first);
  if (past)
    ca__printf(&o, ",\"past_end\":%" PRIu64, f->first);
  ca__finding_stack_json(&o, "allocated_at", f->alloc_stack, s);
  if (f->kind == CA_FINDING_PAST_END_LIVE)
    ca__out_put(&o, ",\"freed_at\":null", 16);
  else
    ca__finding_stack_json(&o, "freed_at", f->free_stack, s);
  ca__out_put(&o, "}\n", 2);
  ca__flush(&o);
}

void ca_report_findings(const ca_report_finding *f, size_t n, size_t unprinted) {
  bool json = ca_config_get()->report_format == CA_REPORT_JSON;
  for (size_t i = 0; i < n; i++) {
    uint32_t ids[2] = {f[i].alloc_stack, f[i].free_stack};
    ca__symbols s;
    ca__symbolize_stacks(ids, 2, &s);
    if (json)
      ca__finding_json(&f[i], &s);
    else
      ca__finding_text(&f[i], &s);
    ca__symbols_free(&s);
  }
  if (unprinted > 0)
    ca__report_warn(json, "memcheck: %zu more finding%s not printed",
                    unprinted, unprinted == 1 ? "" : "s");
}

void ca_report_memcheck_totals(uint64_t checked, uint64_t past_end,
                               uint64_t after_free) {
  if (ca_config_get()->report_format != CA_REPORT_JSON) {
    ca_log("memcheck: %" PRIu64 " block%s checked: %" PRIu64 " written past "
           "the end, %" PRIu64 " written after the free",
           checked, checked == 1 ? "" : "s", past_end, after_free);
    return;
  }
  ca__out o;
  ca__json_begin(&o, "memcheck_summary");
  ca__printf(&o,
             ",\"checked\":%" PRIu64 ",\"past_end\":%" PRIu64
             ",\"after_free\":%" PRIu64 "}\n",
             checked, past_end, after_free);
  ca__flush(&o);
}
