/*
 * The entry points of report.h: preparing a report (sorting, grouping,
 * symbolizing, suppressing) and printing it.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* Sorts the live blocks into groups, ordered for printing. Returns false
 * when scratch memory ran out (the report then says so and stops). */
static bool ca__leaks_group(ca__leaks *l, ca_report_block **sorted,
                            size_t *sorted_bytes, size_t *groups_bytes) {
  const ca_report_input *in = l->in;
  size_t n = in->nblocks;
  if (n == 0)
    return true;
  *sorted_bytes = n * sizeof(ca_report_block);
  *groups_bytes = n * sizeof(ca__group);
  *sorted = ca__scratch(*sorted_bytes);
  l->groups = ca__scratch(*groups_bytes);
  if (*sorted == NULL || l->groups == NULL)
    return false;
  memcpy(*sorted, in->blocks, *sorted_bytes);
  qsort(*sorted, n, sizeof(ca_report_block), ca__cmp_block);
  l->blocks = *sorted;
  l->ngroups = ca__make_groups(*sorted, n, l->groups);
  qsort(l->groups, l->ngroups, sizeof(ca__group), ca__cmp_group);
  return true;
}

/* Every stack the report shows: the groups', the peak's sites', the
 * growing sites'; symbolized in one batch. */
static void ca__symbolize_all(ca__leaks *l) {
  const ca_report_input *in = l->in;
  size_t n = l->ngroups + in->ngrowth + (in->peak ? in->peak->nsites : 0);
  size_t bytes = n * sizeof(uint32_t), k = 0;
  uint32_t *ids = n ? ca__scratch(bytes) : NULL;
  if (ids == NULL) {
    l->symbols = (ca__symbols){0};
    return;
  }
  for (size_t i = 0; i < l->ngroups; i++)
    ids[k++] = l->blocks[l->groups[i].first].stack;
  for (size_t i = 0; i < in->ngrowth; i++)
    ids[k++] = in->growth[i].stack;
  for (size_t i = 0; in->peak && i < in->peak->nsites; i++)
    ids[k++] = in->peak->sites[i].stack;
  ca__symbolize_stacks(ids, k, &l->symbols);
  ca__unscratch(ids, bytes);
}

/* A reported group's blocks that the scan could not class. */
static void ca__count_unclassed(ca__leaks *l, const ca__group *g) {
  for (size_t i = g->first; i < g->first + g->count; i++) {
    const ca_report_block *b = &l->blocks[i];
    if (b->reach == CA_REACH_UNCLASSED) {
      l->totals.unclassed_bytes += b->bytes;
      l->totals.unclassed_count++;
    }
  }
}

/* Where each group's shown frames begin, and which groups the
 * suppressions set aside; the totals. */
static void ca__leaks_suppress(ca__leaks *l, const ca_config *cfg) {
  ca__rules rules = {0};
  if (l->in->event != CA_EVENT_OOM) /* live memory, not leaks: all of it */
    ca__load_rules(&rules, cfg->suppressions,
                   cfg->report_format == CA_REPORT_JSON);
  for (size_t i = 0; i < l->ngroups; i++) {
    ca__group *g = &l->groups[i];
    const uintptr_t *pcs;
    size_t k = ca__stack_of(&l->blocks[g->first], &pcs);
    g->shown_from = ca__first_shown(pcs, k, &l->symbols);
    l->scanned |= l->blocks[g->first].reach != CA_REACH_UNSCANNED;
    if (g->reachable) {
      l->totals.reachable_bytes += g->bytes;
      l->totals.reachable_count += g->count;
      continue;
    }
    g->suppressed = rules.n > 0 && ca__suppressed(&rules, pcs, k, &l->symbols);
    if (!g->suppressed)
      ca__count_unclassed(l, g);
    uint64_t *bytes = g->suppressed ? &l->totals.suppressed_bytes
                                    : &l->totals.bytes;
    uint64_t *count = g->suppressed ? &l->totals.suppressed_count
                                    : &l->totals.count;
    *bytes += g->bytes;
    *count += g->count;
  }
  ca__unscratch(rules.text, rules.text_bytes);
}

/* A report made ready to print (see ca_report_prepare). */
struct ca_report_job {
  ca__leaks l;
  const ca_config *cfg;
  ca_report_block *sorted;
  size_t sorted_bytes, groups_bytes;
  bool ok;
};

ca_report_job *ca_report_prepare(const ca_report_input *in) {
  ca_report_job *job = ca__scratch(sizeof(*job));
  if (job == NULL)
    return NULL;
  memset(job, 0, sizeof(*job));
  job->cfg = in->config ? in->config : ca_config_get();
  job->l = (ca__leaks){.in = in, .max_groups = SIZE_MAX};
  if (in->event == CA_EVENT_OOM)
    job->l.max_groups = CA_REPORT_OOM_SITES;
  else if (job->cfg->max_leaks > 0)
    job->l.max_groups = (size_t)job->cfg->max_leaks;
  /* A report on request lists every live block; at exit, the leaks. */
  job->l.list_reachable = job->cfg->report_reachable || in->event == CA_EVENT_API;
  job->ok = !in->leaks || ca__leaks_group(&job->l, &job->sorted,
                                          &job->sorted_bytes, &job->groups_bytes);
  if (job->ok) {
    ca__symbolize_all(&job->l);
    ca__leaks_suppress(&job->l, job->cfg);
  }
  return job;
}

ca_leak_totals ca_report_print(ca_report_job *job) {
  ca_leak_totals none = {0};
  if (job == NULL) {
    ca__report_warn(false, "report: out of memory");
    return none;
  }
  const ca_report_input *in = job->l.in;
  bool json = job->cfg->report_format == CA_REPORT_JSON;
  if (!job->ok)
    ca__report_warn(json, "leak report: out of memory for %zu live blocks",
                    in->nblocks);
  if (job->ok && in->event == CA_EVENT_OOM) {
    if (json)
      ca__oom_json(&job->l);
    else
      ca__oom_text(&job->l);
  } else if (job->ok && json) {
    ca__json(&job->l);
  } else if (job->ok) {
    for (size_t i = 0; i < in->nstats; i++)
      ca__stats_text(&in->stats[i]);
    if (in->leaks)
      ca__leaks_text(&job->l);
    ca__over_time_text(&job->l);
  }
  ca_leak_totals totals = job->l.totals;
  ca__symbols_free(&job->l.symbols);
  ca__unscratch(job->sorted, job->sorted_bytes);
  ca__unscratch(job->l.groups, job->groups_bytes);
  ca__unscratch(job, sizeof(*job));
  return totals;
}

ca_leak_totals ca_report(const ca_report_input *in) {
  return ca_report_print(ca_report_prepare(in));
}

/* A frame as the loader knows it, from memory: its dynamic symbol, if
 * any, and its object. No file is opened. */
static void ca__symbol_in_memory(uintptr_t pc, ca_symbol *sym) {
  Dl_info info;
  memset(sym, 0, sizeof(*sym));
  sym->pc = pc;
  if (ca_pyframes_is(pc)) {
    ca__python_symbol(pc, sym);
    return;
  }
  if (dladdr((void *)(pc - 1), &info) == 0)
    return;
  ca__copy_name(sym->module, sizeof(sym->module), info.dli_fname);
  ca__copy_name(sym->function, sizeof(sym->function), info.dli_sname);
  sym->module_offset = pc - (uintptr_t)info.dli_fbase;
}

void ca_report_site_name(uint32_t stack, char *buf, size_t len) {
  const uintptr_t *pcs;
  size_t n = ca_stacks_get(stack, &pcs);
  ca_symbol sym = {0};
  bool named = false;
  for (size_t i = 0; i < n && !named; i++) {
    ca__symbol_in_memory(pcs[i], &sym);
    named = !ca__is_plumbing(&sym) || i + 1 == n;
  }
  if (!named || (sym.function[0] == '\0' && sym.module[0] == '\0'))
    snprintf(buf, len, "?");
  else if (ca__is_python(&sym))
    snprintf(buf, len, "%s (%s:%u)", sym.function, ca__basename(sym.file), sym.line);
  else if (sym.function[0] != '\0')
    snprintf(buf, len, "%s", sym.function);
  else
    snprintf(buf, len, "%s+0x%" PRIx64, ca__basename(sym.module), sym.module_offset);
}

void ca_report_stack_lines(uint32_t stack, void (*line)(const char *text, void *arg),
                           void *arg) {
  ca__symbols s;
  ca__symbolize_stacks(&stack, 1, &s);
  const uintptr_t *pcs;
  size_t n = ca_stacks_get(stack, &pcs);
  char words[1024];
  for (size_t i = ca__first_shown(pcs, n, &s); i < n; i++) {
    ca__frame_words(words, sizeof(words), ca__symbol(&s, pcs[i]));
    line(words, arg);
  }
  ca__symbols_free(&s);
}
