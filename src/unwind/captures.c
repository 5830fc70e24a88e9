/*
 * Captures: the entry points of unwind.h, on the fast path where it can
 * serve and libgcc's otherwise.
 *
 * Part of unwind's one compilation unit (src/unwind/unwind.c includes the
 * files in order); not compiled alone.
 */
enum { CA__ANY, CA__FAST_ONLY, CA__LIBGCC_ONLY };

/* Out of line, so that every entry point shares one register read (one
 * cached rule for its pc). The walk reads only frames above this one, which
 * stay put until it returns. */
__attribute__((noinline)) static size_t ca__capture(ca__sink *s, int path) {
#if defined(__x86_64__)
  if (path != CA__LIBGCC_ONLY && ca__libgcc_get()->find_fde != NULL) {
    ca__regs r;
    CA__READ_REGS(r);
    ca__sink fresh = *s;
    if (ca__walk(r, s) == CA__WALK_DONE && s->seen_first)
      return s->n;
    *s = fresh;
  }
#endif
  if (path == CA__FAST_ONLY)
    return CA_UNWIND_NOT_FAST;
  return ca__libgcc_capture(s);
}

/* Each entry point names its own return address as the first frame to keep,
 * so whatever the compiler inlines in between, both paths drop exactly the
 * unwinder's own frames. Entry points are never inlined: their return
 * address is the caller's pc that pcs[0] promises. */
#define CA__ENTRY(pcs, max, skip, skip_self, path)                             \
  do {                                                                         \
    if ((max) == 0)                                                            \
      return 0;                                                                \
    ca__sink s = ca__sink_make(                                                \
        pcs, max, skip, (uintptr_t)__builtin_return_address(0), skip_self);    \
    return ca__capture(&s, path);                                              \
  } while (0)

__attribute__((noinline)) size_t ca_unwind(uintptr_t *pcs, size_t max,
                                           size_t skip) {
  CA__ENTRY(pcs, max, skip, false, CA__ANY);
}

__attribute__((noinline)) size_t ca_unwind_fast(uintptr_t *pcs, size_t max,
                                                size_t skip) {
  CA__ENTRY(pcs, max, skip, false, CA__FAST_ONLY);
}

__attribute__((noinline)) size_t ca_unwind_libgcc(uintptr_t *pcs, size_t max,
                                                  size_t skip) {
  CA__ENTRY(pcs, max, skip, false, CA__LIBGCC_ONLY);
}

__attribute__((noinline)) size_t ca_unwind_outside_self(uintptr_t *pcs,
                                                        size_t max) {
  ca__self_range(); /* found before the first frame: outside the capture */
  CA__ENTRY(pcs, max, 0, true, CA__ANY);
}
