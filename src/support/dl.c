/*
 * The C library's dlsym (see dl.h).
 */
#include "support/dl.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

/* The hooks' dlsym runs before anything else in the process may be ready: a
 * sanitizer runtime, preloaded ahead of us, resolves its interceptors with
 * dlsym before it has set up its own shadow memory, so what it calls here
 * must not be instrumented (sanitizer builds of the library only). */
#define CA__EARLY __attribute__((no_sanitize("address", "undefined", "thread")))

/* The versions dlsym has had: GLIBC_2.34 since it moved into libc, and the
 * architectures' base versions before that (x86-64, aarch64 and ppc64le,
 * i386, s390x). */
static const char *const ca__dlsym_versions[] = {
    "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", "GLIBC_2.2"};

CA__EARLY static void *ca__dlvsym_any(void *handle) {
  for (size_t i = 0; i < sizeof(ca__dlsym_versions) / sizeof(char *); i++) {
    void *sym = dlvsym(handle, "dlsym", ca__dlsym_versions[i]);
    if (sym != NULL)
      return sym;
  }
  return NULL;
}

/* Finds the C library's dlsym with dlvsym, which we do not replace: first
 * the next definition after us (the C library, or another interposer
 * preloaded after us, which we then chain to), then in libc or libdl
 * themselves, for when the C library comes before us in the search order
 * (we were linked, not preloaded). Never through the public dlsym, which is
 * ours and would recurse; never __libc_dlsym or _dl_sym, gone since 2.34. */
CA__EARLY static ca_dl_dlsym_fn ca__find_real_dlsym(void) {
  void *sym = ca__dlvsym_any(RTLD_NEXT);
  const char *libs[] = {"libc.so.6", "libdl.so.2"};
  for (size_t i = 0; sym == NULL && i < 2; i++) {
    void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
    if (h != NULL) {
      sym = ca__dlvsym_any(h);
      dlclose(h);
    }
  }
  ca_dl_dlsym_fn fn;
  memcpy(&fn, &sym, sizeof(fn));
  return fn;
}

static _Atomic(ca_dl_dlsym_fn) ca__real_dlsym_fn;

/* Resolved without a lock: dlsym may be called while a lock of ours or of
 * the program is held (a malloc replacement's initialization, for one), and
 * the look-up is idempotent, so two threads racing both store one answer. */
CA__EARLY ca_dl_dlsym_fn ca_dl_real_dlsym(void) {
  ca_dl_dlsym_fn fn =
      atomic_load_explicit(&ca__real_dlsym_fn, memory_order_acquire);
  if (fn == NULL) {
    fn = ca__find_real_dlsym();
    atomic_store_explicit(&ca__real_dlsym_fn, fn, memory_order_release);
  }
  return fn;
}

void *ca_dl_sym(void *handle, const char *name) {
  ca_dl_dlsym_fn fn = ca_dl_real_dlsym();
  return fn != NULL ? fn(handle, name) : NULL;
}
