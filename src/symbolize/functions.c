/*
 * Function names: the look-up table of the addresses asked about, and the
 * ELF symbol tables that name them (demangled when the process has a C++
 * runtime).
 *
 * Part of symbolize's one compilation unit (src/symbolize/symbolize.c
 * includes the files in order); not compiled alone.
 */
/* ---- lookups ------------------------------------------------------------- */

typedef struct ca__lookup {
  uintptr_t pc;
  uintptr_t bias;
  size_t module; /* the object's rank in dl_iterate_phdr's order */
  bool main_program;
  size_t out;    /* index in the caller's arrays */
  uint64_t addr; /* pc - 1 - bias: inside the call, in the file's terms */
  /* The symbol found so far (its name points into a mapping). */
  const char *sym;
  uint64_t sym_start;
  /* The nearest symbol starting after the previous lookup's address and at
   * or before this one's, for symbols of size 0 (see ca__settle_sizeless). */
  const char *near;
  uint64_t near_start;
  uint64_t near_size;
  bool line_done;
} ca__lookup;

static int ca__by_module_addr(const void *a, const void *b) {
  const ca__lookup *x = a, *y = b;
  if (x->module != y->module)
    return x->module < y->module ? -1 : 1;
  if (x->addr != y->addr)
    return x->addr < y->addr ? -1 : 1;
  return x->out < y->out ? -1 : x->out > y->out;
}

/* The first lookup whose address is >= addr (lookups sorted by address). */
static size_t ca__lower_bound(const ca__lookup *lk, size_t n, uint64_t addr) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (lk[mid].addr < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* ---- function names ------------------------------------------------------ */

static size_t ca__underscores(const char *s) {
  size_t k = 0;
  while (s[k] == '_')
    k++;
  return k;
}

/* Of two aliases at one address (write, __write, __GI___write), the one with
 * the fewest leading underscores is the name the program called; a name
 * with a version glued on (shm_open@GLIBC_2.2.5, from .symver) comes last. */
static bool ca__nicer(const char *name, const char *than) {
  if (than == NULL)
    return true;
  bool versioned = strchr(name, '@') != NULL;
  if (versioned != (strchr(than, '@') != NULL))
    return !versioned;
  return ca__underscores(name) < ca__underscores(than);
}

/* A symbol being offered to the lookups. Its name is looked up only when
 * the symbol is kept, which few of a large object's symbols are. */
typedef struct ca__offered {
  uint64_t start;
  uint64_t size;
  const ca__sect *strs;
  uint64_t name_off;
  const char *name;
  bool looked_up;
} ca__offered;

/* The symbol's name; NULL when it is empty or lies outside the table. */
static const char *ca__offered_name(ca__offered *o) {
  if (!o->looked_up) {
    o->name = ca__str_at(o->strs, o->name_off);
    if (o->name != NULL && o->name[0] == '\0')
      o->name = NULL;
    o->looked_up = true;
  }
  return o->name;
}

/* Nearest-start candidates: the later start wins, then the sized symbol
 * (see ca__settle_sizeless), then the nicer name. */
static bool ca__beats_near(ca__offered *o, const ca__lookup *c) {
  if (c->near != NULL &&
      (o->start < c->near_start ||
       (o->start == c->near_start && o->size < c->near_size)))
    return false;
  const char *name = ca__offered_name(o);
  return name != NULL && (c->near == NULL || o->start > c->near_start ||
                          o->size > c->near_size || ca__nicer(name, c->near));
}

/* Containing symbols: the innermost (latest start) wins, then the nicer
 * name. */
static bool ca__beats_sym(ca__offered *o, const ca__lookup *l) {
  if (l->sym != NULL && o->start < l->sym_start)
    return false;
  const char *name = ca__offered_name(o);
  return name != NULL &&
         (l->sym == NULL || o->start > l->sym_start || ca__nicer(name, l->sym));
}

/* Offers one function symbol to the lookups: it names those it contains,
 * and becomes the nearest-start candidate of the first lookup past it. */
static void ca__symbol_offer(ca__lookup *lk, size_t n, ca__offered *o) {
  size_t i = ca__lower_bound(lk, n, o->start);
  if (i == n)
    return;
  if (ca__beats_near(o, &lk[i])) {
    lk[i].near = o->name;
    lk[i].near_start = o->start;
    lk[i].near_size = o->size;
  }
  uint64_t end =
      o->start + o->size < o->start ? UINT64_MAX : o->start + o->size;
  for (size_t j = i; j < n && lk[j].addr < end; j++) {
    if (ca__beats_sym(o, &lk[j])) {
      lk[j].sym = o->name;
      lk[j].sym_start = o->start;
    }
  }
}

static void ca__offer_table(ca__lookup *lk, size_t n, const ca__sect *syms,
                            const ca__sect *strs) {
  size_t count = syms->p != NULL ? syms->n / sizeof(ElfW(Sym)) : 0;
  for (size_t i = 0; i < count; i++) {
    ElfW(Sym) s;
    memcpy(&s, syms->p + i * sizeof(s), sizeof(s));
    unsigned type = s.st_info & 0xf; /* ELF32_ST_TYPE and ELF64_ST_TYPE agree */
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) ||
        s.st_shndx == SHN_UNDEF || s.st_value == 0)
      continue;
    ca__offered o = {s.st_value, s.st_size, strs, s.st_name, NULL, false};
    ca__symbol_offer(lk, n, &o);
  }
}

/* Hand-written assembly often leaves st_size 0: an address that no sized
 * symbol contains takes the nearest symbol starting at or before it, but only
 * when that one is sizeless (after a sized one it lies in a gap). The
 * candidates were filed at the first lookup past their start, so the
 * nearest for each lookup is the latest candidate at or before it. */
static void ca__settle_sizeless(ca__lookup *lk, size_t n) {
  const ca__lookup *best = NULL;
  for (size_t j = 0; j < n; j++) {
    if (lk[j].near != NULL)
      best = &lk[j];
    if (lk[j].sym == NULL && best != NULL && best->near_size == 0) {
      lk[j].sym = best->near;
      lk[j].sym_start = best->near_start;
    }
  }
}

typedef char *(*ca__demangle_fn)(const char *, char *, size_t *, int *);

static void ca__copy(char *dst, size_t cap, const char *src) {
  size_t len = strnlen(src, cap - 1);
  memcpy(dst, src, len);
  dst[len] = '\0';
}

/* The C++ runtime's demangler: from the global scope; else from a libstdc++
 * the process loaded privately (Python loads extension modules, and so
 * PyTorch's libstdc++, with RTLD_LOCAL); else from libstdc++ loaded for the
 * purpose, since even a C-looking CUDA program is C++ to nvcc and its names
 * are mangled. Reports are rare; unreadable names cost the reader more.
 * NULL when there is no libstdc++ at all. */
static ca__demangle_fn ca__demangler(void) {
  void *fn = ca_dl_sym(RTLD_DEFAULT, "__cxa_demangle");
  if (fn == NULL) {
    void *lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == NULL)
      lib = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_LOCAL);
    if (lib != NULL)
      fn = ca_dl_sym(lib, "__cxa_demangle");
  }
  ca__demangle_fn demangle = NULL;
  memcpy(&demangle, &fn, sizeof(fn));
  return demangle;
}

/* The demangled name when the process carries a C++ runtime, else the
 * symbol as it is. */
static void ca__set_function(char *dst, size_t cap, const char *name,
                             ca__demangle_fn demangle) {
  char *plain = NULL;
  int status = -1;
  if (demangle != NULL && name[0] == '_' && name[1] == 'Z')
    plain = demangle(name, NULL, NULL, &status);
  ca__copy(dst, cap, plain != NULL && status == 0 ? plain : name);
  free(plain);
}

static void ca__put_functions(const ca__lookup *lk, size_t n, ca_symbol *out,
                              ca__demangle_fn demangle) {
  for (size_t j = 0; j < n; j++) {
    if (lk[j].sym == NULL)
      continue;
    ca_symbol *s = &out[lk[j].out];
    ca__set_function(s->function, sizeof(s->function), lk[j].sym, demangle);
    s->function_offset = lk[j].addr + 1 - lk[j].sym_start;
  }
}
