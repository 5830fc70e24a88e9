/*
 * mockcuda's modules and launches. The mock runs no device code: it knows
 * the kernels it emulates by name, the library's own (memcheck's gather,
 * src/backend/gather.c), and does what each does at once, as its other
 * stream-ordered calls act at once.
 *
 *  - cuModuleLoadData takes any image that is text (PTX) and names a
 *    module's kernels by their ".entry NAME(" lines; MOCKCUDA_JIT=0 makes
 *    it refuse with CUDA_ERROR_JIT_COMPILER_NOT_FOUND, as a driver that
 *    cannot compile PTX does (the library then copies as without it).
 *  - cuModuleGetFunction finds an entry the image declares and the mock
 *    emulates; CUDA_ERROR_NOT_FOUND for any other name.
 *  - cuLaunchKernel checks the context, the function and the stream as the
 *    mock's other stream-ordered calls do, then runs the emulation over
 *    the grid. A kernel's access outside every live allocation would fault
 *    the device; the mock answers the launch CUDA_ERROR_ILLEGAL_ADDRESS
 *    instead of failing a later call.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/gather_kernel.h"
#include "mockcuda_internal.h"

#define MOCK_MAX_MODULES 64

struct CUmod_st {
  CUcontext ctx;
  char *image;
};

/* What an emulated kernel does to a grid of gx blocks, with its launch's
 * parameters: 0, or -1 where it touched no live allocation. */
typedef int (*mock_kernel_fn)(unsigned gx, void **params);

struct CUfunc_st {
  const char *name;
  mock_kernel_fn run;
};

/* The library's gather kernel (its parameter: backend/gather_kernel.h):
 * block b takes set b, `rows` rows of `width` bytes, `pitch` apart from
 * `src` on; where any byte is not `expect`, it copies them to the host at
 * `dst`, one after another, and sets the byte at `copied` to 1. */

/* Whether set s's bytes all hold `expect`: 1, 0, or -1 for an access
 * outside every live allocation. */
static int mock_gather_all(const ca_gather_set *s, unsigned char expect) {
  unsigned char row[65536];
  if (s->width > sizeof row)
    return -1;
  for (uint32_t r = 0; r < s->rows; r++) {
    if (mockcuda_kernel_read(s->src + r * s->pitch, row, s->width) != 0)
      return -1;
    for (uint32_t i = 0; i < s->width; i++)
      if (row[i] != expect)
        return 0;
  }
  return 1;
}

static int mock_gather(unsigned gx, void **params) {
  const ca_gather_args *a = params[0];
  for (unsigned b = 0; b < gx; b++) {
    const ca_gather_set *s = &a->set[b];
    int all = mock_gather_all(s, (unsigned char)a->expect);
    if (all < 0)
      return -1;
    for (uint32_t r = 0; r < s->rows && !all; r++)
      if (mockcuda_kernel_read(s->src + r * s->pitch,
                               (unsigned char *)(uintptr_t)s->dst + (uint64_t)r * s->width,
                               s->width) != 0)
        return -1;
    if (!all)
      *(unsigned char *)(uintptr_t)s->copied = 1;
  }
  return 0;
}

static struct CUfunc_st g_kernels[] = {{"ca_gather", mock_gather}};
static struct CUmod_st g_modules[MOCK_MAX_MODULES];
static int g_nmodules;

static int mock_jit_off(void) {
  const char *jit = getenv("MOCKCUDA_JIT");
  return jit && strcmp(jit, "0") == 0;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  mock_lock();
  g_cnt.module_load++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && (!module || !image))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && mock_jit_off())
    rc = CUDA_ERROR_JIT_COMPILER_NOT_FOUND;
  if (rc == CUDA_SUCCESS && g_nmodules == MOCK_MAX_MODULES)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  char *text = rc == CUDA_SUCCESS ? strdup(image) : NULL;
  if (rc == CUDA_SUCCESS && !text)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    g_modules[g_nmodules] = (struct CUmod_st){c, text};
    *module = &g_modules[g_nmodules++];
  }
  mock_unlock();
  mock_trace("cuModuleLoadData(%p) = %d", image, rc);
  return rc;
}

/* Under the lock: whether m is a module loaded in context c. */
static int mock_module_ok(CUmodule m, CUcontext c) {
  for (int i = 0; i < g_nmodules; i++)
    if (m == &g_modules[i])
      return m->ctx == c;
  return 0;
}

/* Whether the image declares the entry `name`. */
static int mock_declares(const char *image, const char *name) {
  size_t n = strlen(name);
  for (const char *p = image; (p = strstr(p, ".entry ")) != NULL; p += 7)
    if (strncmp(p + 7, name, n) == 0 && p[7 + n] == '(')
      return 1;
  return 0;
}

CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name) {
  mock_lock();
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && (!fn || !name))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && !mock_module_ok(module, c))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS) {
    rc = CUDA_ERROR_NOT_FOUND;
    for (size_t i = 0; i < sizeof g_kernels / sizeof g_kernels[0]; i++)
      if (strcmp(g_kernels[i].name, name) == 0 && mock_declares(module->image, name)) {
        *fn = &g_kernels[i];
        rc = CUDA_SUCCESS;
      }
  }
  mock_unlock();
  return rc;
}

/* Whether f is one of the mock's kernels. */
static int mock_function_ok(CUfunction f) {
  for (size_t i = 0; i < sizeof g_kernels / sizeof g_kernels[0]; i++)
    if (f == &g_kernels[i])
      return 1;
  return 0;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz,
                        unsigned int shared_bytes, CUstream hs, void **params, void **extra) {
  (void)shared_bytes;
  mock_lock();
  g_cnt.launch_kernel++;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult arg = !mock_function_ok(f) ? CUDA_ERROR_INVALID_HANDLE
                 : !params || extra || !gx || !gy || !gz || !bx || !by || !bz
                     ? CUDA_ERROR_INVALID_VALUE
                     : CUDA_SUCCESS;
  CUresult rc = mock_need_ctx_stream(hs, 0, arg, &c, &s);
  mock_unlock();
  if (rc == CUDA_SUCCESS && f->run(gx * gy * gz, params) != 0)
    rc = CUDA_ERROR_ILLEGAL_ADDRESS;
  mock_trace("cuLaunchKernel(%s, %u blocks) = %d", mock_function_ok(f) ? f->name : "?",
             gx * gy * gz, rc);
  return rc;
}
