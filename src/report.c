/*
 * The leak report and the memory summary (see report.h, docs/LEAKS.md).
 *
 * A report is built in four steps: the live blocks are sorted into groups
 * (same device, same allocating call, same stack; or same size when there
 * is no stack), the groups are ordered by total bytes, every frame of every
 * group is symbolized in one batch (each object file is parsed once), and
 * the groups are printed, after the suppressions have set some aside.
 */
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "stacks.h"
#include "stats.h"
#include "symbolize.h"

/* Allocation numbers listed per group without stacks, and in JSON. */
#define CA__TEXT_SAMPLES 3
#define CA__JSON_SAMPLES 8
/* Suppression rules read from the file, at most. */
#define CA__MAX_RULES 256
/* A suppressions file larger than this is read only this far. */
#define CA__MAX_RULES_FILE (1u << 20)

#define CA__STR2(x) #x
#define CA__STR(x) CA__STR2(x)
#define CA__VERSION                                                            \
  CA__STR(CUDALLOC_VERSION_MAJOR)                                              \
  "." CA__STR(CUDALLOC_VERSION_MINOR) "." CA__STR(CUDALLOC_VERSION_PATCH)

/* ---- Scratch memory ------------------------------------------------------ */

/* Scratch comes from mmap: the report runs at exit, where the program's
 * malloc may be in any state (a profiler's, torn down, or the one that
 * leaked), and must not be made to hold our garbage either. */
static void *ca__scratch(size_t bytes) {
  if (bytes == 0)
    bytes = 1;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void ca__unscratch(void *p, size_t bytes) {
  if (p != NULL)
    munmap(p, bytes ? bytes : 1);
}

/* ---- Output ------------------------------------------------------------- */

/* Unprefixed output (JSON), gathered into writes of a few KiB. */
typedef struct ca__out {
  size_t len;
  char buf[8192];
} ca__out;

static void ca__flush(ca__out *o) {
  ca_log_raw(o->buf, o->len);
  o->len = 0;
}

static void ca__out_put(ca__out *o, const char *s, size_t n) {
  while (n > 0) {
    if (o->len == sizeof(o->buf))
      ca__flush(o);
    size_t room = sizeof(o->buf) - o->len;
    size_t take = n < room ? n : room;
    memcpy(o->buf + o->len, s, take);
    o->len += take;
    s += take;
    n -= take;
  }
}

static void ca__printf(ca__out *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ca__printf(ca__out *o, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n > 0)
    ca__out_put(o, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* A JSON string, or null for NULL and "". */
static void ca__put_json_string(ca__out *o, const char *s) {
  if (s == NULL || s[0] == '\0') {
    ca__out_put(o, "null", 4);
    return;
  }
  ca__out_put(o, "\"", 1);
  for (size_t left = strlen(s); left > 0;) {
    unsigned char ch = (unsigned char)*s;
    size_t k = ca_log_printable(s, left);
    if (ch == '"' || ch == '\\') {
      char esc[2] = {'\\', (char)ch};
      ca__out_put(o, esc, 2);
    } else if (k > 0) {
      ca__out_put(o, s, k);
    } else {
      /* A control, or a byte of no UTF-8 character: as the code point of
       * the same number, so that the document stays valid JSON. */
      ca__printf(o, "\\u%04x", ch);
    }
    k = k ? k : 1;
    s += k;
    left -= k;
  }
  ca__out_put(o, "\"", 1);
}

/* Opens a JSON document with the fields every one of ours starts with, so
 * that tools can tell them apart from other lines and from each other. */
static void ca__json_begin(ca__out *o, const char *event) {
  o->len = 0;
  ca__printf(o,
             "{\"tool\":\"cudalloc\",\"version\":\"" CA__VERSION
             "\",\"pid\":%d,\"event\":\"%s\"",
             (int)getpid(), event);
}

/* A problem found while reporting (a bad suppressions line, say): a line
 * of its own, as JSON when the report is JSON, so that a log file of JSON
 * documents stays one document per line. */
static void ca__report_warn(bool json, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ca__report_warn(bool json, const char *fmt, ...) {
  char message[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof(message), fmt, ap);
  va_end(ap);
  if (!json) {
    ca_log("%s", message);
    return;
  }
  ca__out o;
  ca__json_begin(&o, "warning");
  ca__out_put(&o, ",\"message\":", 11);
  ca__put_json_string(&o, message);
  ca__out_put(&o, "}\n", 2);
  ca__flush(&o);
}


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

static void ca__json_stat(ca__out *o, const char *name, const cudalloc_stat *s,
                          bool comma) {
  ca__printf(o,
             "\"%s\":{\"current\":%" PRIu64 ",\"peak\":%" PRIu64
             ",\"total\":%" PRIu64 "}%s",
             name, s->current, s->peak, s->total, comma ? "," : "");
}

/* Every field, by its name in the struct, in the struct's order. */
static void ca__stats_json(ca__out *o, const cudalloc_device_stats *s) {
  ca__printf(o, "{\"device\":%d,", s->device);
#define CA__TRIPLE(field, row, bytes) ca__json_stat(o, #field, &s->field, true);
#define CA__COUNT(field) ca__printf(o, "\"" #field "\":%" PRIu64 ",", s->field);
  CA_STATS_TRIPLES(CA__TRIPLE)
  CA_STATS_COUNTERS(CA__COUNT)
  CA_STATS_LARGEST(CA__COUNT)
#undef CA__TRIPLE
#undef CA__COUNT
  ca__printf(o, "\"fragmentation\":%.6f}", s->fragmentation);
}

/* ---- Grouping ------------------------------------------------------------ */

typedef struct ca__group {
  size_t first, count;  /* a run of the sorted blocks */
  uint64_t first_seq;   /* the oldest allocation's number */
  uint64_t bytes, min, max;
  bool suppressed;
  size_t shown_from;    /* frames before this are runtime plumbing */
} ca__group;

/* Blocks with a stack group by stack; blocks without one group by size. */
static uint64_t ca__size_key(const ca_report_block *b) {
  return b->stack ? 0 : b->bytes;
}

static int ca__cmp_u64(uint64_t x, uint64_t y) { return (x > y) - (x < y); }

static int ca__cmp_block(const void *a, const void *b) {
  const ca_report_block *x = a, *y = b;
  int c = (x->device > y->device) - (x->device < y->device);
  if (c == 0)
    c = strcmp(x->call, y->call);
  if (c == 0)
    c = ca__cmp_u64(x->stack, y->stack);
  if (c == 0)
    c = ca__cmp_u64(ca__size_key(x), ca__size_key(y));
  return c ? c : ca__cmp_u64(x->seq, y->seq);
}

static bool ca__same_group(const ca_report_block *x,
                           const ca_report_block *y) {
  return x->device == y->device && strcmp(x->call, y->call) == 0 &&
         x->stack == y->stack && ca__size_key(x) == ca__size_key(y);
}

/* Largest total first; then more allocations; then the oldest. */
static int ca__cmp_group(const void *a, const void *b) {
  const ca__group *x = a, *y = b;
  int c = ca__cmp_u64(y->bytes, x->bytes);
  if (c == 0)
    c = ca__cmp_u64(y->count, x->count);
  return c ? c : ca__cmp_u64(x->first_seq, y->first_seq);
}

/* Fills groups (room for n) from the sorted blocks; returns how many. */
static size_t ca__make_groups(const ca_report_block *b, size_t n,
                              ca__group *groups) {
  size_t ng = 0;
  for (size_t i = 0; i < n; i++) {
    if (i == 0 || !ca__same_group(&b[i - 1], &b[i]))
      groups[ng++] =
          (ca__group){.first = i, .first_seq = b[i].seq, .min = UINT64_MAX};
    ca__group *g = &groups[ng - 1];
    g->count++;
    g->bytes += b[i].bytes;
    g->min = b[i].bytes < g->min ? b[i].bytes : g->min;
    g->max = b[i].bytes > g->max ? b[i].bytes : g->max;
  }
  return ng;
}

/* ---- Symbols -------------------------------------------------------------- */

/* Every distinct frame of every group, sorted, with its symbol. */
typedef struct ca__symbols {
  uintptr_t *pcs;
  ca_symbol *syms;
  size_t n, pcs_bytes, syms_bytes;
} ca__symbols;

static int ca__cmp_pc(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return (x > y) - (x < y);
}

static size_t ca__stack_of(const ca_report_block *b, const uintptr_t **pcs) {
  return ca_stacks_get(b->stack, pcs);
}

static void ca__symbolize_groups(const ca_report_block *blocks,
                                 const ca__group *groups, size_t ng,
                                 ca__symbols *s) {
  *s = (ca__symbols){0};
  size_t total = 0;
  for (size_t g = 0; g < ng; g++) {
    const uintptr_t *pcs;
    total += ca__stack_of(&blocks[groups[g].first], &pcs);
  }
  if (total == 0)
    return;
  s->pcs_bytes = total * sizeof(uintptr_t);
  s->pcs = ca__scratch(s->pcs_bytes);
  if (s->pcs == NULL)
    return;
  for (size_t g = 0; g < ng; g++) {
    const uintptr_t *pcs;
    size_t k = ca__stack_of(&blocks[groups[g].first], &pcs);
    memcpy(s->pcs + s->n, pcs, k * sizeof(uintptr_t));
    s->n += k;
  }
  qsort(s->pcs, s->n, sizeof(uintptr_t), ca__cmp_pc);
  size_t unique = 0;
  for (size_t i = 0; i < s->n; i++)
    if (unique == 0 || s->pcs[unique - 1] != s->pcs[i])
      s->pcs[unique++] = s->pcs[i];
  s->n = unique;
  s->syms_bytes = unique * sizeof(ca_symbol);
  s->syms = ca__scratch(s->syms_bytes);
  if (s->syms == NULL) {
    s->n = 0;
    return;
  }
  ca_symbolize(s->pcs, s->n, s->syms);
}

static void ca__symbols_free(ca__symbols *s) {
  ca__unscratch(s->pcs, s->pcs_bytes);
  ca__unscratch(s->syms, s->syms_bytes);
}

/* The symbol of `pc`, or NULL when symbolizing failed. */
static const ca_symbol *ca__symbol(const ca__symbols *s, uintptr_t pc) {
  if (s->n == 0)
    return NULL;
  const uintptr_t *hit = bsearch(&pc, s->pcs, s->n, sizeof(uintptr_t),
                                 ca__cmp_pc);
  return hit ? &s->syms[hit - s->pcs] : NULL;
}

static const char *ca__basename(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

static bool ca__starts(const char *s, const char *prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Whether a frame is the plumbing between the program's call and the pool:
 * cudalloc itself, the CUDA runtime or the driver. A runtime linked
 * statically into the program is told apart by its names only: its API
 * (cudaMalloc), its internals (libcudart_static_<hash>, __cudart<n>, and
 * cudart:: when not demangled, _ZN6cudart) and the driver's (cuMemAlloc). */
static bool ca__is_plumbing(const ca_symbol *sym) {
  const char *module = ca__basename(sym->module);
  const char *f = sym->function;
  return ca__starts(module, "libcudalloc") ||
         ca__starts(module, "libcudart") || ca__starts(module, "libcuda.") ||
         ca__starts(f, "cuda") || ca__starts(f, "__cuda") ||
         ca__starts(f, "libcudart_static") || ca__starts(f, "_ZN6cudart") ||
         (f[0] == 'c' && f[1] == 'u' && f[2] >= 'A' && f[2] <= 'Z');
}

/* The first frame of the group's stack worth showing: leading plumbing is
 * folded away, unless it is all there is. */
static size_t ca__first_shown(const uintptr_t *pcs, size_t n,
                              const ca__symbols *s) {
  size_t i = 0;
  while (i < n) {
    const ca_symbol *sym = ca__symbol(s, pcs[i]);
    if (sym == NULL || !ca__is_plumbing(sym))
      break;
    i++;
  }
  return i < n ? i : 0;
}

/* ---- Suppressions ------------------------------------------------------- */

typedef struct ca__rules {
  char *text; /* the file, NUL-terminated, patterns cut in place */
  size_t text_bytes;
  const char *pattern[CA__MAX_RULES];
  size_t n;
} ca__rules;

static char *ca__rule_trim(char *s) {
  while (*s == ' ' || *s == '\t' || *s == '\r')
    s++;
  char *end = s + strlen(s);
  while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
    *--end = '\0';
  return s;
}

/* Bad lines of a suppressions file named one by one; the rest counted. */
#define CA__MAX_RULE_WARNINGS 5

static void ca__parse_rules(ca__rules *r, const char *path, bool json) {
  size_t line_no = 0, dropped = 0, bad = 0;
  for (char *line = r->text; line != NULL;) {
    char *next = strchr(line, '\n');
    if (next != NULL)
      *next++ = '\0';
    line_no++;
    char *t = ca__rule_trim(line);
    if (t[0] != '\0' && t[0] != '#') {
      char *pattern = ca__starts(t, "leak:") ? ca__rule_trim(t + 5) : NULL;
      if (pattern != NULL && pattern[0] != '\0' && r->n < CA__MAX_RULES)
        r->pattern[r->n++] = pattern;
      else if (pattern != NULL && pattern[0] != '\0')
        dropped++;
      else if (++bad <= CA__MAX_RULE_WARNINGS)
        ca__report_warn(json,
                        "suppressions: %s:%zu: '%.60s' ignored (expected "
                        "leak:<pattern>)",
                        path, line_no, t);
    }
    line = next;
  }
  if (bad > CA__MAX_RULE_WARNINGS)
    ca__report_warn(json,
                    "suppressions: %s: ... and %zu more bad lines ignored",
                    path, bad - CA__MAX_RULE_WARNINGS);
  if (dropped > 0)
    ca__report_warn(json,
                    "suppressions: %s: only the first %d rules are used; "
                    "%zu more ignored",
                    path, CA__MAX_RULES, dropped);
}

/* Reads the suppressions file, if one is configured. Opening never blocks
 * (a FIFO with no writer) and only a regular file is read. */
static void ca__load_rules(ca__rules *r, const char *path, bool json) {
  *r = (ca__rules){0};
  if (path[0] == '\0')
    return;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  struct stat st;
  const char *why = fd < 0 || fstat(fd, &st) != 0 ? strerror(errno)
                    : !S_ISREG(st.st_mode)
                        ? "not a regular file (a FIFO, a device, a socket "
                          "or a directory)"
                        : NULL;
  if (why != NULL) {
    ca__report_warn(json,
                    "suppressions: cannot read '%s': %s; no leak is "
                    "suppressed",
                    path, why);
    if (fd >= 0)
      close(fd);
    return;
  }
  size_t size = st.st_size > (off_t)CA__MAX_RULES_FILE ? CA__MAX_RULES_FILE
                                                       : (size_t)st.st_size;
  if (size < (size_t)st.st_size)
    ca__report_warn(json, "suppressions: %s: only the first %u bytes are read",
                    path, CA__MAX_RULES_FILE);
  r->text_bytes = size + 1;
  r->text = ca__scratch(r->text_bytes); /* zero-filled: NUL-terminated */
  size_t got = 0;
  while (r->text != NULL && got < size) {
    ssize_t k = read(fd, r->text + got, size - got);
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  if (r->text != NULL)
    ca__parse_rules(r, path, json);
}

/* Whether text[0..] matches glob p[0..pn) ('*' = any run) as a whole. */
static bool ca__glob(const char *p, size_t pn, const char *text) {
  size_t pi = 0, star = SIZE_MAX;
  const char *t = text, *star_t = NULL;
  while (*t) {
    if (pi < pn && p[pi] == '*') {
      star = pi++;
      star_t = t;
    } else if (pi < pn && p[pi] == *t) {
      pi++;
      t++;
    } else if (star != SIZE_MAX) {
      pi = star + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (pi < pn && p[pi] == '*')
    pi++;
  return pi == pn;
}

/* A pattern matches anywhere in the name unless anchored by ^ or $. */
static bool ca__rule_matches(const char *pattern, const char *name) {
  if (name[0] == '\0')
    return false;
  char glob[512];
  size_t n = 0, len = strlen(pattern);
  bool head = pattern[0] == '^', tail = len > 0 && pattern[len - 1] == '$';
  const char *from = pattern + head, *to = pattern + len - tail;
  if (to < from || (size_t)(to - from) + 2 >= sizeof(glob))
    return false;
  if (!head)
    glob[n++] = '*';
  memcpy(glob + n, from, (size_t)(to - from));
  n += (size_t)(to - from);
  if (!tail)
    glob[n++] = '*';
  return ca__glob(glob, n, name);
}

/* Whether any rule matches a function or module of any frame. */
static bool ca__suppressed(const ca__rules *r, const uintptr_t *pcs, size_t n,
                           const ca__symbols *s) {
  for (size_t i = 0; i < n; i++) {
    const ca_symbol *sym = ca__symbol(s, pcs[i]);
    if (sym == NULL)
      continue;
    for (size_t k = 0; k < r->n; k++)
      if (ca__rule_matches(r->pattern[k], sym->function) ||
          ca__rule_matches(r->pattern[k], sym->module))
        return true;
  }
  return false;
}

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
  if (sym == NULL || sym->module[0] == '\0') {
    ca_log("    #%zu 0x%" PRIxPTR " in ??", index, pc);
    return;
  }
  const char *module = ca__basename(sym->module);
  if (sym->function[0] != '\0' && sym->line != 0)
    ca_log("    #%zu 0x%" PRIxPTR " in %s %s:%u (%s+0x%" PRIx64 ")", index, pc,
           sym->function, sym->file, sym->line, module, sym->module_offset);
  else if (sym->function[0] != '\0')
    ca_log("    #%zu 0x%" PRIxPTR " in %s+0x%" PRIx64 " (%s+0x%" PRIx64 ")",
           index, pc, sym->function, sym->function_offset, module,
           sym->module_offset);
  else
    ca_log("    #%zu 0x%" PRIxPTR " in ?? (%s+0x%" PRIx64 ")", index, pc,
           module, sym->module_offset);
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

static void ca__text_group(const ca_report_input *in,
                           const ca_report_block *b, const ca__group *g,
                           const ca__symbols *s) {
  char on[48], call[64];
  const ca_report_block *first = &b[g->first];
  ca__device_words(on, sizeof(on), first->device);
  ca__call_words(call, sizeof(call), first->call);
  ca_log("%s", "");
  const uintptr_t *pcs;
  size_t n = ca__stack_of(first, &pcs);
  if (n == 0) {
    ca_log("%" PRIu64 " bytes %s in %zu allocation(s) of %" PRIu64
           " bytes%s%s:",
           g->bytes, ca__verb(in->event), g->count, first->bytes, on, call);
    ca__text_samples(b, g);
    return;
  }
  ca_log("%" PRIu64 " bytes %s in %zu allocation(s)%s%s, allocated from:",
         g->bytes, ca__verb(in->event), g->count, on, call);
  for (size_t i = g->shown_from; i < n; i++)
    ca__text_frame(i - g->shown_from, pcs[i], ca__symbol(s, pcs[i]));
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
} ca__leaks;

/* The one line for a report with nothing to list. */
static void ca__text_nothing(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  const ca_leak_totals *t = &l->totals;
  char how[128];
  if (t->suppressed_count == 0)
    snprintf(how, sizeof(how), "all freed");
  else
    snprintf(how, sizeof(how),
             "%" PRIu64 " bytes in %" PRIu64 " allocations suppressed",
             t->suppressed_bytes, t->suppressed_count);
  if (in->event == CA_EVENT_API)
    ca_log("no live device allocations%s%s%s", t->suppressed_count ? " (" : "",
           t->suppressed_count ? how : "", t->suppressed_count ? ")" : "");
  else if (in->event == CA_EVENT_EXIT)
    ca_log("no device memory leaks (%" PRIu64 " allocations, %s)",
           in->allocations, how);
}

static void ca__leaks_text(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  if (l->totals.count == 0) {
    ca__text_nothing(l);
    return;
  }
  ca__text_header(in);
  size_t printed = 0;
  uint64_t rest_bytes = 0, rest_count = 0, rest_groups = 0;
  bool stackless = false;
  for (size_t i = 0; i < l->ngroups; i++) {
    const ca__group *g = &l->groups[i];
    if (g->suppressed)
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
  ca_log("SUMMARY: %" PRIu64 " bytes %s in %" PRIu64 " allocations%s",
         t->bytes, ca__verb(in->event), t->count, apart);
  if (stackless)
    ca_log("set CUDALLOC_CONF=backtrace_depth:16 to see where %s memory was "
           "allocated",
           in->event == CA_EVENT_API ? "live" : "leaked");
}

static void ca__json_frame(ca__out *o, uintptr_t pc, const ca_symbol *sym) {
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

static void ca__json_group(ca__out *o, const ca__leaks *l, const ca__group *g) {
  const ca_report_block *first = &l->blocks[g->first];
  ca__printf(o, "{\"device\":%d,\"call\":", first->device);
  ca__put_json_string(o, first->call);
  ca__printf(o,
             ",\"bytes\":%" PRIu64 ",\"count\":%zu,\"sizes\":{\"min\":%" PRIu64
             ",\"max\":%" PRIu64 "},\"suppressed\":%s,\"allocations\":[",
             g->bytes, g->count, g->min, g->max,
             g->suppressed ? "true" : "false");
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
  }
  return "?";
}

/* One document on one line: tools read a log file line by line. */
static void ca__json(const ca__leaks *l) {
  const ca_report_input *in = l->in;
  ca__out o;
  ca__json_begin(&o, ca__event_name(in->event));
  if (in->event == CA_EVENT_CONTEXT_RESET)
    ca__printf(&o, ",\"device\":%d", in->device);
  if (in->leaks) {
    /* Suppressed groups are listed too, marked, for tools; max_leaks
     * counts the others, as in the text report. */
    ca__out_put(&o, ",\"leaks\":[", 10);
    size_t listed = 0, printed = 0;
    for (size_t i = 0; i < l->ngroups; i++) {
      const ca__group *g = &l->groups[i];
      if (!g->suppressed && printed++ >= l->max_groups)
        continue;
      if (listed++ > 0)
        ca__out_put(&o, ",", 1);
      ca__json_group(&o, l, g);
    }
    const ca_leak_totals *t = &l->totals;
    ca__printf(&o,
               "],\"summary\":{\"bytes\":%" PRIu64 ",\"count\":%" PRIu64
               ",\"suppressed_bytes\":%" PRIu64
               ",\"suppressed_count\":%" PRIu64 ",\"groups\":%zu"
               ",\"allocations\":%" PRIu64 "}",
               t->bytes, t->count, t->suppressed_bytes, t->suppressed_count,
               l->ngroups, in->allocations);
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
  ca__out_put(&o, "}\n", 2);
  ca__flush(&o);
}

/* Sorts, groups, symbolizes and applies the suppressions. Returns false
 * when scratch memory ran out (the report then says so and stops). */
static bool ca__leaks_prepare(ca__leaks *l, const ca_config *cfg,
                              ca_report_block **sorted, size_t *sorted_bytes,
                              size_t *groups_bytes) {
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
  ca__symbolize_groups(*sorted, l->groups, l->ngroups, &l->symbols);
  ca__rules rules;
  ca__load_rules(&rules, cfg->suppressions,
                 cfg->report_format == CA_REPORT_JSON);
  for (size_t i = 0; i < l->ngroups; i++) {
    ca__group *g = &l->groups[i];
    const uintptr_t *pcs;
    size_t k = ca__stack_of(&(*sorted)[g->first], &pcs);
    g->shown_from = ca__first_shown(pcs, k, &l->symbols);
    g->suppressed = rules.n > 0 && ca__suppressed(&rules, pcs, k, &l->symbols);
    uint64_t *bytes = g->suppressed ? &l->totals.suppressed_bytes
                                    : &l->totals.bytes;
    uint64_t *count = g->suppressed ? &l->totals.suppressed_count
                                    : &l->totals.count;
    *bytes += g->bytes;
    *count += g->count;
  }
  ca__unscratch(rules.text, rules.text_bytes);
  return true;
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
  if (job->cfg->max_leaks > 0)
    job->l.max_groups = (size_t)job->cfg->max_leaks;
  job->ok = !in->leaks ||
            ca__leaks_prepare(&job->l, job->cfg, &job->sorted,
                              &job->sorted_bytes, &job->groups_bytes);
  return job;
}

ca_leak_totals ca_report_print(ca_report_job *job) {
  ca_leak_totals none = {0, 0, 0, 0};
  if (job == NULL) {
    ca__report_warn(false, "report: out of memory");
    return none;
  }
  const ca_report_input *in = job->l.in;
  bool json = job->cfg->report_format == CA_REPORT_JSON;
  if (!job->ok)
    ca__report_warn(json, "leak report: out of memory for %zu live blocks",
                    in->nblocks);
  if (job->ok && json) {
    ca__json(&job->l);
  } else if (job->ok) {
    for (size_t i = 0; i < in->nstats; i++)
      ca__stats_text(&in->stats[i]);
    if (in->leaks)
      ca__leaks_text(&job->l);
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
