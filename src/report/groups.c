/*
 * Grouping the live blocks by call site (or size), and the symbols of
 * their frames.
 *
 * Part of report's one compilation unit (src/report/report.c
 * includes the files in order); not compiled alone.
 */
/* ---- Grouping ------------------------------------------------------------ */

typedef struct ca__group {
  size_t first, count;  /* a run of the sorted blocks */
  uint64_t first_seq;   /* the oldest allocation's number */
  uint64_t bytes, min, max;
  bool suppressed;
  bool reachable;       /* its blocks are still reachable, not leaks */
  size_t shown_from;    /* frames before this are runtime plumbing */
} ca__group;

/* Blocks with a stack group by stack; blocks without one group by size. */
static uint64_t ca__size_key(const ca_report_block *b) {
  return b->stack ? 0 : b->bytes;
}

static int ca__cmp_u64(uint64_t x, uint64_t y) { return (x > y) - (x < y); }

static bool ca__reachable(const ca_report_block *b) {
  return b->reach == CA_REACH_REACHABLE;
}

static int ca__cmp_block(const void *a, const void *b) {
  const ca_report_block *x = a, *y = b;
  int c = ca__reachable(x) - ca__reachable(y);
  if (c == 0)
    c = (x->device > y->device) - (x->device < y->device);
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
  return ca__reachable(x) == ca__reachable(y) && x->device == y->device &&
         strcmp(x->call, y->call) == 0 &&
         x->stack == y->stack && ca__size_key(x) == ca__size_key(y);
}

/* Leaks before reachable groups; largest total first; then more
 * allocations; then the oldest. */
static int ca__cmp_group(const void *a, const void *b) {
  const ca__group *x = a, *y = b;
  int c = x->reachable - y->reachable;
  if (c == 0)
    c = ca__cmp_u64(y->bytes, x->bytes);
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
      groups[ng++] = (ca__group){.first = i,
                                 .first_seq = b[i].seq,
                                 .min = UINT64_MAX,
                                 .reachable = ca__reachable(&b[i])};
    ca__group *g = &groups[ng - 1];
    g->count++;
    g->bytes += b[i].bytes;
    g->min = b[i].bytes < g->min ? b[i].bytes : g->min;
    g->max = b[i].bytes > g->max ? b[i].bytes : g->max;
  }
  return ng;
}

/* ---- Symbols -------------------------------------------------------------- */

/* Every distinct frame of every stack shown, sorted, with its symbol. */
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

/* The module a Python frame's symbol names. */
#define CA__PYTHON_MODULE "<python>"

static bool ca__is_python(const ca_symbol *sym) {
  return strcmp(sym->module, CA__PYTHON_MODULE) == 0;
}

static void ca__copy_name(char *dst, size_t len, const char *src) {
  snprintf(dst, len, "%s", src ? src : "");
}

/* A Python frame word's symbol: its function, file and line. */
static void ca__python_symbol(uintptr_t pc, ca_symbol *sym) {
  ca_pyframe f;
  memset(sym, 0, sizeof(*sym));
  sym->pc = pc;
  if (!ca_pyframes_describe(pc, &f))
    return;
  ca__copy_name(sym->module, sizeof(sym->module), CA__PYTHON_MODULE);
  ca__copy_name(sym->function, sizeof(sym->function), f.function);
  ca__copy_name(sym->file, sizeof(sym->file), f.file);
  sym->line = f.line;
}

/* Symbolizes the frames of the stacks ids[0..n) in one batch (each
 * object file is parsed once). */
static void ca__symbolize_stacks(const uint32_t *ids, size_t n,
                                 ca__symbols *s) {
  *s = (ca__symbols){0};
  size_t total = 0;
  const uintptr_t *pcs;
  for (size_t i = 0; i < n; i++)
    total += ca_stacks_get(ids[i], &pcs);
  if (total == 0)
    return;
  s->pcs_bytes = total * sizeof(uintptr_t);
  s->pcs = ca__scratch(s->pcs_bytes);
  if (s->pcs == NULL)
    return;
  for (size_t i = 0; i < n; i++) {
    size_t k = ca_stacks_get(ids[i], &pcs);
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
  /* Python frames (tagged, so sorted last) are named by pyframes. */
  size_t native = 0;
  while (native < s->n && !ca_pyframes_is(s->pcs[native]))
    native++;
  ca_symbolize(s->pcs, native, s->syms);
  for (size_t i = native; i < s->n; i++)
    ca__python_symbol(s->pcs[i], &s->syms[i]);
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

/* A frame as every output names it, after "in ": "fn file:line (Python)",
 * "fn file:line (module+0xoff)", "fn+0xoff (module+0xoff)",
 * "?? (module+0xoff)", or "??" when nothing is known. */
static void ca__frame_words(char *buf, size_t len, const ca_symbol *sym) {
  if (sym != NULL && ca__is_python(sym)) {
    snprintf(buf, len, "%s %s:%u (Python)", sym->function, sym->file, sym->line);
    return;
  }
  if (sym == NULL || sym->module[0] == '\0') {
    snprintf(buf, len, "??");
    return;
  }
  const char *module = ca__basename(sym->module);
  if (sym->function[0] != '\0' && sym->line != 0)
    snprintf(buf, len, "%s %s:%u (%s+0x%" PRIx64 ")", sym->function, sym->file, sym->line,
             module, sym->module_offset);
  else if (sym->function[0] != '\0')
    snprintf(buf, len, "%s+0x%" PRIx64 " (%s+0x%" PRIx64 ")", sym->function,
             sym->function_offset, module, sym->module_offset);
  else
    snprintf(buf, len, "?? (%s+0x%" PRIx64 ")", module, sym->module_offset);
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
  if (ca__is_python(sym))
    return false;
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
