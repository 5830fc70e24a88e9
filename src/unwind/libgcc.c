/*
 * libgcc, found at run time; our own object's code, which captures leave
 * out; where frames go; and the libgcc path, which every frame the fast
 * path cannot take goes to.
 *
 * Part of unwind's one compilation unit (src/unwind/unwind.c includes the
 * files in order); not compiled alone.
 */
/* ------------------------------------------------------------------------ */
/* libgcc, found at run time                                                 */

/* The base addresses _Unwind_Find_FDE reports with an FDE (libgcc's struct
 * dwarf_eh_bases), for pointer encodings relative to text, data or the
 * function. */
typedef struct ca__eh_bases {
  void *tbase;
  void *dbase;
  void *func;
} ca__eh_bases;

/* The libgcc entry points, with libgcc's ABI but without its header: the
 * reason codes are plain ints, the contexts opaque. */
typedef const void *(*ca__find_fde_fn)(void *pc, ca__eh_bases *bases);
typedef int (*ca__trace_fn)(void *context, void *arg);
typedef int (*ca__backtrace_fn)(ca__trace_fn trace, void *arg);
typedef uintptr_t (*ca__get_ip_fn)(void *context);

#define CA__URC_NO_REASON 0
#define CA__URC_END_OF_STACK 5

typedef struct ca__libgcc {
  ca__find_fde_fn find_fde;
  ca__backtrace_fn backtrace;
  ca__get_ip_fn get_ip;
} ca__libgcc;

/* Both found with loader calls, and published without a lock (lazy.h):
 * the first capture may run in a constructor that dlopen runs with the
 * loader's lock held. */
static ca_lazy ca__gcc = CA_LAZY_INIT;
static ca__libgcc ca__gcc_fallback;

/* POSIX makes a function pointer from dlsym valid; memcpy says so without a
 * cast warning. */
static void ca__gcc_resolve(void *handle, const char *name, void *fn_out) {
  void *sym = ca_dl_sym(handle, name);
  memcpy(fn_out, &sym, sizeof(sym));
}

/* The library links only libc, so libgcc_s is the program's: almost every
 * C++ or threaded program has it loaded already (RTLD_NOLOAD finds that
 * copy without a second search); otherwise it is loaded once, here. */
static void ca__gcc_load(ca__libgcc *gcc) {
  memset(gcc, 0, sizeof(*gcc));
  void *handle = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == NULL)
    handle = dlopen("libgcc_s.so.1", RTLD_NOW);
  if (handle == NULL)
    return;
  ca__gcc_resolve(handle, "_Unwind_Find_FDE", &gcc->find_fde);
  ca__gcc_resolve(handle, "_Unwind_Backtrace", &gcc->backtrace);
  ca__gcc_resolve(handle, "_Unwind_GetIP", &gcc->get_ip);
}

static const ca__libgcc *ca__libgcc_get(void) {
  return CA_LAZY_ONCE(&ca__gcc, ca__libgcc, ca__gcc_load, &ca__gcc_fallback);
}

/* ------------------------------------------------------------------------ */
/* Our own object's code, for ca_unwind_outside_self                         */

typedef struct ca__range {
  uintptr_t lo, hi;
} ca__range;

static ca_lazy ca__self = CA_LAZY_INIT;
static ca__range ca__self_fallback;

static bool ca__object_holds(const struct dl_phdr_info *info, uintptr_t addr) {
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && addr - start < ph->p_memsz)
      return true;
  }
  return false;
}

/* The span of the executable segments of the object holding this file. */
static int ca__find_self(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  ca__range *r = arg;
  if (!ca__object_holds(info, (uintptr_t)&ca__find_self))
    return 0;
  r->lo = UINTPTR_MAX;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
      continue;
    r->lo = start < r->lo ? start : r->lo;
    r->hi = start + ph->p_memsz > r->hi ? start + ph->p_memsz : r->hi;
  }
  return 1;
}

static void ca__self_find(ca__range *r) {
  *r = (ca__range){0, 0};
  dl_iterate_phdr(ca__find_self, r);
}

static const ca__range *ca__self_range(void) {
  return CA_LAZY_ONCE(&ca__self, ca__range, ca__self_find, &ca__self_fallback);
}

/* A return address belongs to the code of its call instruction, one byte
 * back: a call that ends the object's text returns just past it. */
static bool ca__in_self(uintptr_t pc) {
  const ca__range *r = ca__self_range();
  return pc - 1 >= r->lo && pc - 1 < r->hi;
}

/* ------------------------------------------------------------------------ */
/* Where frames go                                                           */

/* One capture's destination and filters, shared by the fast path and
 * libgcc's so that both drop exactly the same frames. */
typedef struct ca__sink {
  uintptr_t *pcs;
  size_t max, skip, n;
  uintptr_t first; /* the caller's return address: frames before are ours */
  bool seen_first; /* first has gone by */
  bool skip_self;  /* still dropping frames inside our own object */
  size_t own, visits;
} ca__sink;

static ca__sink ca__sink_make(uintptr_t *pcs, size_t max, size_t skip,
                              uintptr_t first, bool skip_self) {
  ca__sink s = {pcs, max, skip, 0, first, false, skip_self, 0, 0};
  return s;
}

enum { CA__PUT_MORE, CA__PUT_FULL, CA__PUT_BROKEN };

/* Takes the next frame outward. Frames before the caller's return address
 * are the unwinder's own and never stored; seeing too many of them means
 * the walk is not where it thinks it is. */
static int ca__sink_put(ca__sink *s, uintptr_t pc) {
  if (++s->visits > CA__MAX_VISITS)
    return CA__PUT_FULL;
  if (!s->seen_first) {
    if (pc != s->first)
      return ++s->own > CA__MAX_OWN_FRAMES ? CA__PUT_BROKEN : CA__PUT_MORE;
    s->seen_first = true;
  }
  if (s->skip_self && ca__in_self(pc))
    return CA__PUT_MORE;
  s->skip_self = false;
  if (s->skip > 0) {
    s->skip--;
    return CA__PUT_MORE;
  }
  s->pcs[s->n++] = pc;
  return s->n < s->max ? CA__PUT_MORE : CA__PUT_FULL;
}

/* ------------------------------------------------------------------------ */
/* The libgcc path                                                           */

static int ca__libgcc_frame(void *context, void *arg) {
  ca__sink *s = arg;
  uintptr_t pc = ca__libgcc_get()->get_ip(context);
  /* libgcc reports the end of the stack as one last frame of pc 0. */
  if (pc == 0 || ca__sink_put(s, pc) != CA__PUT_MORE)
    return CA__URC_END_OF_STACK;
  return CA__URC_NO_REASON;
}

static size_t ca__libgcc_capture(ca__sink *s) {
  const ca__libgcc *gcc = ca__libgcc_get();
  if (gcc->backtrace == NULL || gcc->get_ip == NULL)
    return 0;
  gcc->backtrace(ca__libgcc_frame, s);
  return s->seen_first ? s->n : 0;
}
