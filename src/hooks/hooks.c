/*
 * The hook layer: the three ways a program's driver calls reach us, all
 * ending in one table of handled functions.
 *
 *  1. Exported driver names (cuMemAlloc_v2, ...) for programs linked to
 *     libcuda: as a preloaded library we come before libcuda in the global
 *     scope, so their references bind to us.
 *  2. Our dlsym: a program asking libcuda (or RTLD_DEFAULT) for a handled
 *     name gets our hook. The CUDA runtime, static or shared, reaches the
 *     driver only this way: one dlsym of cuGetProcAddress_v2.
 *  3. Our cuGetProcAddress(_v2): every other driver function comes through
 *     it; we route by the pointer the real look-up returns.
 *
 * This file is the only one that knows about dlsym and cuGetProcAddress.
 * Each hook is a one-line call into the policy (intercept.c).
 */

#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "support/config.h"
#include "support/dl.h"
#include "driver/driver.h"
#include "policy/intercept.h"
#include "support/lazy.h"
#include "support/log.h"
#include "policy/pointer.h"
#include "policy/ranges.h"

/* The dlsym path runs before anything else in the process may be ready: a
 * sanitizer runtime, preloaded ahead of us, resolves its interceptors with
 * dlsym before it has set up its own shadow memory, so code on that path must
 * not be instrumented (sanitizer builds of the library only). */
#define CA__EARLY __attribute__((no_sanitize("address", "undefined", "thread")))

/* cuda.h maps the name cuGetProcAddress to cuGetProcAddress_v2 for callers;
 * we define both exports, so the name must mean itself here. */
#undef cuGetProcAddress
/* Likewise cuStreamBeginCapture, which cuda.h maps to its _v2: the driver
 * still exports the mode-less CUDA 10.0 original under the plain name. */
#undef cuStreamBeginCapture
/* And cuDevicePrimaryCtxReset and cuDevicePrimaryCtxRelease, whose pre-11.0
 * originals the driver exports too (they work the same way). */
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxRelease
/* And cuStreamDestroy, whose CUDA 2.0 original the driver still exports
 * (it destroys the same way). */
#undef cuStreamDestroy
/* And the batched copies, whose CUDA 12.8 originals (with a failIdx) the
 * driver exports beside their _v2. */
#undef cuMemcpyBatchAsync
#undef cuMemcpy3DBatchAsync

/* ------------------------------------------------------------------------ */
/* The hooks                                                                 */

/* Each hook is file-static, so its address is ours whatever the symbol
 * search order of the process: the exported driver names below are aliases
 * of these, and dlsym/cuGetProcAddress hand out these same addresses. Each
 * is one call into the policy (driver_api.h's `call` column). */

static CUresult CUDAAPI ca__get_proc_address(const char *symbol, void **pfn,
                                             int version, cuuint64_t flags);
static CUresult CUDAAPI
ca__get_proc_address_v2(const char *symbol, void **pfn, int version,
                        cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status);

/* A memset or copy (CA_DRIVER_RANGED): the driver's function, if the
 * policy passes its ranges. */
#define CA_CHECKED(check, field, args)                                         \
  ((check) ? (ca_driver()->field != NULL ? ca_driver()->field args             \
                                         : ca_driver_missing())                \
           : CUDA_ERROR_INVALID_VALUE)

#define CA__HOOK(export, field, params, call)                                  \
  static CUresult CUDAAPI ca__hook_##field params { return call; }
CA_DRIVER_HOOKED(CA__HOOK)
#undef CA__HOOK

/* The one table of handled functions: the libcuda export and our hook for
 * it. Every other part of this file (exports, dlsym, cuGetProcAddress)
 * works from it. */
typedef struct ca__hook {
  const char *name;
  void *hook;
} ca__hook;

#define CA__HOOK_ROW(export, field, params, call)                              \
  {#export, (void *)ca__hook_##field},
static const ca__hook ca__hooks[] = {CA_DRIVER_HOOKED(CA__HOOK_ROW)};
#undef CA__HOOK_ROW

#define CA__NHOOKS (sizeof(ca__hooks) / sizeof(ca__hooks[0]))

/* Our hook for the libcuda export `name`, or NULL. Called for every dlsym in
 * the process, so names that cannot be ours (ours are "cuMem...",
 * "cuGetProc...", "cuStream...", "cuDevice...", "cuCtx...", "cuPointer..."
 * and "cuIpc...") leave after three character compares. */
CA__EARLY static void *ca__hook_for_name(const char *name) {
  if (name == NULL || name[0] != 'c' || name[1] != 'u' ||
      (name[2] != 'M' && name[2] != 'G' && name[2] != 'S' &&
       name[2] != 'D' && name[2] != 'C' && name[2] != 'P' && name[2] != 'I'))
    return NULL;
  for (size_t i = 0; i < CA__NHOOKS; i++) {
    if (strcmp(name, ca__hooks[i].name) == 0)
      return ca__hooks[i].hook;
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Way 1: the exported driver names                                          */

/* Exports each handled name as an alias of its hook, with the prototype of
 * driver_api.h (for the names cuda.h declares, the compiler checks that
 * the two agree). */
#define CA__EXPORT(export, field, params, call)                                \
  __attribute__((visibility("default"), alias("ca__hook_" #field)))           \
  CUresult CUDAAPI export params;
CA_DRIVER_HOOKED(CA__EXPORT)
#undef CA__EXPORT

/* ------------------------------------------------------------------------ */
/* Saying, once per way in, that it works                                    */

enum { CA__VIA_DLSYM, CA__VIA_GET_PROC_ADDRESS, CA__VIA_COUNT };
static const char *const ca__via_name[CA__VIA_COUNT] = {"dlsym",
                                                        "cuGetProcAddress"};
static atomic_bool ca__via_seen[CA__VIA_COUNT];

/* With verbose:1 the first hook handed out by each way in is reported (the
 * GPU checks read it to tell which way a program reached us); with
 * verbose:2, every one. Silent otherwise. */
static void ca__note_hooked(int via, const char *name) {
  int verbose = ca_config_get()->verbose;
  if (verbose <= 0)
    return;
  bool first = !atomic_exchange(&ca__via_seen[via], true);
  if (first || verbose >= 2)
    ca_log("hooked %s via %s", name, ca__via_name[via]);
}

/* ------------------------------------------------------------------------ */
/* Way 2: our dlsym                                                          */

/* Whether `sym` lies in a libcuda (libcuda.so, libcuda.so.1, or a mock of
 * that name): only the driver's own functions are replaced, never another
 * interposer's. */
static bool ca__in_libcuda(void *sym) {
  Dl_info info;
  if (dladdr(sym, &info) == 0 || info.dli_fname == NULL)
    return false;
  const char *base = strrchr(info.dli_fname, '/');
  base = base != NULL ? base + 1 : info.dli_fname;
  return strncmp(base, "libcuda.so", 10) == 0;
}

/* `name` if the object `map` itself defines it (not one of its
 * dependencies), else NULL. */
static void *ca__defined_in(struct link_map *map, const char *name) {
  if (map->l_name == NULL || map->l_name[0] == '\0')
    return NULL;
  void *h = dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD);
  if (h == NULL)
    return NULL;
  void *sym = ca_dl_sym(h, name);
  dlclose(h);
  Dl_info info;
  struct link_map *owner = NULL;
  if (sym == NULL ||
      dladdr1(sym, &info, (void **)&owner, RTLD_DL_LINKMAP) == 0 ||
      owner != map)
    return NULL;
  return sym;
}

/* The object that holds `addr`, or NULL. */
static struct link_map *ca__object_of(const void *addr) {
  Dl_info info;
  struct link_map *map = NULL;
  if (dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP) == 0)
    return NULL;
  return map;
}

/* dlsym(RTLD_NEXT, name) as seen from `caller`, this library left out: the
 * first other object after the caller's, in load order, that defines
 * `name`. Used only for the handled names (every other RTLD_NEXT look-up
 * reaches the real dlsym with the caller intact; see the entry stub
 * below), where the answer a program can expect is another interposer's
 * or libcuda's, and NULL when the driver lacks the function: our own
 * export must not make it seem to exist. A call of the real dlsym from
 * here would search after libcudalloc instead, and find nothing when
 * libcuda is not in the global scope (as the CUDA runtime loads it). */
static void *ca__next_after(const void *caller, const char *name) {
  struct link_map *map = ca__object_of(caller);
  struct link_map *self = ca__object_of((const void *)ca__object_of);
  if (map == NULL)
    return NULL;
  for (struct link_map *l = map->l_next; l != NULL; l = l->l_next) {
    void *sym = l != self ? ca__defined_in(l, name) : NULL;
    if (sym != NULL)
      return sym;
  }
  return NULL;
}

/* RTLD_NEXT of a handled name no object after the caller defines: NULL,
 * with dlerror() set, as without this library, by a look-up that fails the
 * same way. Its message names the symbol; the object it names is the C
 * library, not the caller (glibc offers no way to name that one). The
 * handle is never closed: a dl call after the failed one would clear the
 * error, and the C library is never unloaded anyway. */
static void *ca__not_found(ca_dl_dlsym_fn real, const char *name) {
  static _Atomic(void *) libc;
  void *h = atomic_load(&libc);
  if (h == NULL) {
    h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    atomic_store(&libc, h);
  }
  if (h != NULL)
    real(h, name);
  return NULL;
}

/* A handled name: the real answer, with libcuda's function replaced by our
 * hook. A program asking for a handled name never gets NULL from us when it
 * would have got libcuda's function, and never gets our hook when it would
 * have got NULL (no driver loaded, or one without the function: feature
 * probes must see that). A search that finds our own export (RTLD_DEFAULT,
 * the global handle) goes on past it, to what it would have found without
 * us. */
static void *ca__dlsym_handled(ca_dl_dlsym_fn real, void *handle,
                               const char *name, const void *caller,
                               void *hook) {
  void *sym;
  if (handle == RTLD_NEXT) {
    sym = ca__next_after(caller, name);
    if (sym == NULL)
      return ca__not_found(real, name);
  } else {
    sym = real(handle, name);
    /* Past us, in the same scope: RTLD_NEXT from here searches the global
     * scope after this library (a driver loaded RTLD_LOCAL stays unseen,
     * as it would be), and sets dlerror() when nothing is found. */
    if (sym == hook)
      sym = real(RTLD_NEXT, name);
  }
  if (sym == NULL || !ca__in_libcuda(sym))
    return sym;
  ca__note_hooked(CA__VIA_DLSYM, name);
  return hook;
}

/* The body of our dlsym, called by the entry stub with the caller's return
 * address. Returns 1 with the final answer in *out, or 0 with the real dlsym
 * in *out: the stub then jumps to it with the program's own arguments and
 * return address, so the real dlsym sees the original caller. */
CA__EARLY __attribute__((visibility("hidden"))) int
ca_hooks_dlsym_route(void *handle, const char *name, const void *caller,
                     void **out) {
  ca_dl_dlsym_fn real = ca_dl_real_dlsym();
  if (real == NULL) {
    *out = NULL;
    return 1;
  }
  void *hook = ca__hook_for_name(name);
  if (hook == NULL) {
    memcpy(out, &real, sizeof(real));
    return 0;
  }
  *out = ca__dlsym_handled(real, handle, name, caller, hook);
  return 1;
}

/*
 * The entry stub: the exported dlsym.
 *
 * dlsym(RTLD_NEXT, ...) and dlsym(RTLD_DEFAULT, ...) resolve relative to the
 * object that called dlsym, which glibc finds from the return address
 * (__builtin_return_address(0) inside dlsym). A replacement that calls the
 * real dlsym makes libcudalloc the caller: RTLD_NEXT then searches after us
 * (a library loaded RTLD_LOCAL, as Python loads extensions, would get
 * symbols from the global scope instead of its own dependencies; a PyTorch
 * import livelocked this way in another interposer), and RTLD_DEFAULT loses
 * the caller's local scope and namespace.
 *
 * So the real dlsym must be entered by a jump, not a call, with the
 * program's return address still in place. C cannot promise a tail call
 * (-O0, sanitizers), so the stub is written in assembly: it saves the
 * arguments, asks ca_hooks_dlsym_route what to do, restores the arguments
 * and either returns the routed answer or jumps to the real dlsym. Every
 * look-up we do not handle is then exactly the program's own, down to
 * dlerror(). The alternative we rejected, re-implementing RTLD_NEXT by
 * walking the link maps, cannot see glibc's private scope lists (local
 * scopes, namespaces), so it is used only for the handled names, where any
 * answer but libcuda's or an interposer's is impossible anyway.
 *
 * On an architecture without a stub the fallback is a C function, which
 * forwards RTLD_NEXT through the same link-map walk and everything else
 * from our own frame; RTLD_DEFAULT then resolves from our scope.
 */
#if defined(__x86_64__)
#if defined(__CET__) && (__CET__ & 1)
#define CA__ENDBR "endbr64\n\t"
#else
#define CA__ENDBR ""
#endif
__asm__(".text\n\t"
        ".globl dlsym\n\t"
        ".type dlsym, @function\n\t"
        ".p2align 4\n"
        "dlsym:\n\t"
        ".cfi_startproc\n\t" CA__ENDBR
        /* Save the arguments; 2 pushes + 24 bytes keep %rsp 16-aligned at
         * the call, with a slot for *out at 0(%rsp). */
        "pushq %rdi\n\t"
        ".cfi_adjust_cfa_offset 8\n\t"
        "pushq %rsi\n\t"
        ".cfi_adjust_cfa_offset 8\n\t"
        "subq $24, %rsp\n\t"
        ".cfi_adjust_cfa_offset 24\n\t"
        "movq 40(%rsp), %rdx\n\t" /* the program's return address */
        "movq %rsp, %rcx\n\t"     /* out */
        "call ca_hooks_dlsym_route\n\t"
        "movq (%rsp), %r11\n\t"
        "addq $24, %rsp\n\t"
        ".cfi_adjust_cfa_offset -24\n\t"
        "popq %rsi\n\t"
        ".cfi_adjust_cfa_offset -8\n\t"
        "popq %rdi\n\t"
        ".cfi_adjust_cfa_offset -8\n\t"
        "testl %eax, %eax\n\t"
        "jz 1f\n\t"
        "movq %r11, %rax\n\t"
        "ret\n"
        "1:\n\t"
        "jmp *%r11\n\t"
        ".cfi_endproc\n\t"
        ".size dlsym, .-dlsym\n\t"
        ".previous");
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_BTI_DEFAULT) && __ARM_FEATURE_BTI_DEFAULT
#define CA__BTI "hint 34\n\t" /* bti c */
#else
#define CA__BTI ""
#endif
__asm__(".text\n\t"
        ".globl dlsym\n\t"
        ".type dlsym, %function\n\t"
        ".p2align 2\n"
        "dlsym:\n\t"
        ".cfi_startproc\n\t" CA__BTI
        "stp x29, x30, [sp, #-48]!\n\t"
        ".cfi_def_cfa_offset 48\n\t"
        ".cfi_offset 29, -48\n\t"
        ".cfi_offset 30, -40\n\t"
        "mov x29, sp\n\t"
        "stp x0, x1, [sp, #16]\n\t"
        "mov x2, x30\n\t" /* the program's return address */
        "add x3, sp, #32\n\t"
        "bl ca_hooks_dlsym_route\n\t"
        "mov w17, w0\n\t"
        "ldr x16, [sp, #32]\n\t"
        "ldp x0, x1, [sp, #16]\n\t"
        "ldp x29, x30, [sp], #48\n\t"
        ".cfi_def_cfa_offset 0\n\t"
        ".cfi_restore 29\n\t"
        ".cfi_restore 30\n\t"
        "cbz w17, 1f\n\t"
        "mov x0, x16\n\t"
        "ret\n"
        "1:\n\t"
        "br x16\n\t"
        ".cfi_endproc\n\t"
        ".size dlsym, .-dlsym\n\t"
        ".previous");
#else
__attribute__((visibility("default"))) void *dlsym(void *restrict handle,
                                                   const char *restrict name) {
  const void *caller = __builtin_return_address(0);
  void *out = NULL;
  if (ca_hooks_dlsym_route(handle, name, caller, &out))
    return out;
  if (handle == RTLD_NEXT)
    return ca__next_after(caller, name);
  ca_dl_dlsym_fn real;
  memcpy(&real, &out, sizeof(real));
  return real(handle, name);
}
#endif

/* ------------------------------------------------------------------------ */
/* Way 3: our cuGetProcAddress                                               */

/* The real address of every handled export, sorted, with its hook: the
 * real cuGetProcAddress answers with exactly one of libcuda's exports, so
 * the returned address names the variant the driver chose for the asked
 * version and flags (cuMemAllocAsync or its _ptsz twin, cuGetProcAddress or
 * _v2; cuMemAlloc below version 3020 is the 32-bit v1 export, not in the
 * table, and stays the driver's). */
typedef struct ca__route {
  uintptr_t real;
  void *hook;
  const char *name; /* the export, for the verbose log */
} ca__route;

typedef struct ca__route_table {
  size_t n;
  ca__route route[CA__NHOOKS];
} ca__route_table;

/* Built on the first reroute with no lock held (lazy.h): building it asks
 * the loader for every handled export, and the first cuGetProcAddress may
 * come from a constructor that dlopen runs with the loader's lock held. */
static ca_lazy ca__routes = CA_LAZY_INIT;
static ca__route_table ca__routes_fallback;

static int ca__route_cmp(const void *a, const void *b) {
  uintptr_t x = ((const ca__route *)a)->real;
  uintptr_t y = ((const ca__route *)b)->real;
  return (x > y) - (x < y);
}

static void ca__routes_build(ca__route_table *t) {
  t->n = 0;
  for (size_t i = 0; i < CA__NHOOKS; i++) {
    void *real = ca_driver_symbol(ca__hooks[i].name);
    if (real == NULL)
      continue;
    t->route[t->n].real = (uintptr_t)real;
    t->route[t->n].hook = ca__hooks[i].hook;
    t->route[t->n].name = ca__hooks[i].name;
    t->n++;
  }
  qsort(t->route, t->n, sizeof(t->route[0]), ca__route_cmp);
}

static const ca__route_table *ca__routes_get(void) {
  return CA_LAZY_ONCE(&ca__routes, ca__route_table, ca__routes_build, &ca__routes_fallback);
}

/* The route for the libcuda function at `real`, or NULL. */
static const ca__route *ca__route_for_address(void *real) {
  const ca__route_table *t = ca__routes_get();
  ca__route key = {.real = (uintptr_t)real};
  return bsearch(&key, t->route, t->n, sizeof(t->route[0]), ca__route_cmp);
}

/* After a successful real look-up: hands back our hook in place of the
 * driver's function when we handle that exact export. The log names the
 * export the driver chose, which shows the variant (_v2, _ptsz) selected. */
static void ca__reroute(void **pfn) {
  if (pfn == NULL || *pfn == NULL)
    return;
  const ca__route *r = ca__route_for_address(*pfn);
  if (r == NULL)
    return;
  *pfn = r->hook;
  ca__note_hooked(CA__VIA_GET_PROC_ADDRESS, r->name);
}

/* Both versions call the real function of the same version with the
 * program's arguments unchanged (symbolStatus may be NULL: the runtime
 * passes NULL), so the driver alone decides the answer; cuGetProcAddress
 * may come before cuInit, and nothing here needs an initialized driver. */
static CUresult CUDAAPI ca__get_proc_address(const char *symbol, void **pfn,
                                             int version, cuuint64_t flags) {
  const ca_driver_api *d = ca_driver();
  if (d->get_proc_address == NULL)
    return d->handle == NULL ? CUDA_ERROR_NOT_INITIALIZED
                             : CUDA_ERROR_NOT_FOUND;
  CUresult r = d->get_proc_address(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS)
    ca__reroute(pfn);
  return r;
}

static CUresult CUDAAPI
ca__get_proc_address_v2(const char *symbol, void **pfn, int version,
                        cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status) {
  const ca_driver_api *d = ca_driver();
  if (d->get_proc_address_v2 == NULL)
    return d->handle == NULL ? CUDA_ERROR_NOT_INITIALIZED
                             : CUDA_ERROR_NOT_FOUND;
  CUresult r = d->get_proc_address_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS)
    ca__reroute(pfn);
  return r;
}
