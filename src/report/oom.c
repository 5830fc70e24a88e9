/*
 * The report of a request refused for memory (CA_EVENT_OOM): the request
 * and what the device holds, the sites holding the most live memory there,
 * largest first, and what would help; as text, or one JSON document.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* The groups past the first CA_REPORT_OOM_SITES: how many, their bytes and
 * allocations. */
typedef struct ca__oom_rest {
  size_t groups;
  uint64_t bytes, count;
} ca__oom_rest;

static ca__oom_rest ca__oom_rest_of(const ca__leaks *l) {
  ca__oom_rest rest = {0};
  for (size_t i = l->max_groups; i < l->ngroups; i++) {
    rest.groups++;
    rest.bytes += l->groups[i].bytes;
    rest.count += l->groups[i].count;
  }
  return rest;
}

static size_t ca__oom_shown(const ca__leaks *l) {
  return l->ngroups < l->max_groups ? l->ngroups : l->max_groups;
}

/* "48.0 MiB (50331648 bytes) live in 3 allocation(s), allocated from:"
 * and the frames (the report is of one device: it names none). */
static void ca__oom_group_text(const ca__leaks *l, const ca__group *g) {
  char bytes[32], amount[64];
  ca_format_bytes(bytes, sizeof(bytes), g->bytes);
  snprintf(amount, sizeof(amount), "%s (%" PRIu64 " bytes) live", bytes,
           g->bytes);
  ca__text_group_as(amount, "", l->blocks, g, &l->symbols);
}

static void ca__oom_text(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  const ca_report_oom *o = in->oom;
  char asked[32];
  ca_held_text t;
  ca_format_bytes(asked, sizeof(asked), o->requested);
  ca_stats_held_text(&o->stats, o->limit, &t);
  ca_log("out of memory on device %d: requested %s (%s); in use %s, cached %s, "
         "largest free block %s, limit %s, fragmentation %.1f%%%s%s",
         in->device, asked, o->call, t.used, t.cached, t.largest, t.limit,
         100.0 * o->stats.fragmentation, o->then ? "; " : "",
         o->then ? o->then : "");
  if (o->brief)
    return;
  size_t shown = ca__oom_shown(l);
  bool stackless = false;
  if (shown == 0)
    ca_log("no allocation of this process is live on device %d", in->device);
  else
    ca_log("the sites holding the most live memory on device %d, largest "
           "first:",
           in->device);
  for (size_t i = 0; i < shown; i++) {
    ca__oom_group_text(l, &l->groups[i]);
    stackless |= l->blocks[l->groups[i].first].stack == 0;
  }
  ca__oom_rest rest = ca__oom_rest_of(l);
  if (rest.groups > 0)
    ca_log("... %zu more site(s): %" PRIu64 " bytes in %" PRIu64
           " allocations", rest.groups, rest.bytes, rest.count);
  if (shown > 0)
    ca_log("%s", "");
  ca_log("what would help: %s", o->advice);
  if (stackless)
    ca_log("set CUDALLOC_CONF=backtrace_depth:16 to see where the live memory "
           "was allocated");
}

static void ca__oom_json(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  const ca_report_oom *o = in->oom;
  const cudalloc_device_stats *s = &o->stats;
  ca__out out;
  ca__json_begin(&out, "out_of_memory");
  ca__printf(&out, ",\"device\":%d,\"call\":", in->device);
  ca__put_json_string(&out, o->call);
  ca__printf(&out,
             ",\"requested\":%" PRIu64 ",\"in_use\":%" PRIu64
             ",\"cached\":%" PRIu64 ",\"largest_free_block\":%" PRIu64
             ",\"limit\":%" PRIu64 ",\"fragmentation\":%.4f,\"advice\":",
             o->requested, s->allocated_bytes.current,
             s->free_cached_bytes + s->pending_free_bytes,
             s->largest_free_block, o->limit, s->fragmentation);
  ca__put_json_string(&out, o->advice);
  ca__out_put(&out, ",\"then\":", 8);
  ca__put_json_string(&out, o->then);
  ca__out_put(&out, ",\"sites\":[", 10);
  for (size_t i = 0; i < ca__oom_shown(l); i++) {
    if (i > 0)
      ca__out_put(&out, ",", 1);
    ca__json_group(&out, l, &l->groups[i]);
  }
  ca__oom_rest rest = ca__oom_rest_of(l);
  ca__printf(&out,
             "],\"more_sites\":{\"groups\":%zu,\"bytes\":%" PRIu64
             ",\"count\":%" PRIu64 "}}\n",
             rest.groups, rest.bytes, rest.count);
  ca__flush(&out);
}
