/*
 * mockcuda: a fake libcuda.so.1 (see mockcuda.h for what it simulates).
 *
 * Everything runs under one mutex: the mock is for correctness tests, not
 * speed. Exported functions never call each other, so no lock is taken
 * twice, and the library is linked with -Bsymbolic-functions so that the
 * addresses cuGetProcAddress hands out are this library's own exports even
 * when a preloaded interposer exports the same names (the real driver behaves
 * that way, and interposers map those addresses back to names with dladdr).
 */

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mockcuda_internal.h"

#define MOCK_CTX_STACK 32
#define MOCK_MAX_CAPTURES 64
#define MOCK_DRIVER_VERSION 13000

enum { MOCK_OBJ_CTX = 1, MOCK_OBJ_STREAM, MOCK_OBJ_EVENT };
enum { MOCK_STREAM_USER, MOCK_STREAM_LEGACY, MOCK_STREAM_PER_THREAD };

struct CUstream_st {
  mock_obj hdr;
  int kind;
  unsigned flags;
  CUcontext ctx;    /* user streams: the context current at creation */
  uint64_t records; /* cuEventRecord calls on it that succeeded */
  CUstreamCaptureStatus capture;
  CUstreamCaptureMode mode;
  pthread_t thread; /* that began the capture */
};

/* An event completes when the work before it does. The mock's work is done
 * the moment it is queued, so an event completes at once, unless the test
 * asked for a delay (mockcuda_set_event_delay): then it stays NOT_READY for
 * `pending` more queries (-1: until something waits for it). */
struct CUevent_st {
  mock_obj hdr;
  int recorded;
  CUcontext ctx;   /* current at creation */
  CUstream stream; /* last recorded on (the resolved stream) */
  int pending;
  int captured; /* last recorded on a capturing stream: part of a graph */
};

struct CUmemPoolHandle_st {
  int device;
};

struct CUgraph_st {
  int unused;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_verbose;
static int g_inited;
static int g_shut; /* mockcuda_shutdown: every later call fails */
MOCK_HIDDEN int g_ndev;
MOCK_HIDDEN uint64_t g_capacity;
MOCK_HIDDEN mock_device g_dev[MOCK_MAX_DEVICES];
static struct CUmemPoolHandle_st g_pools[MOCK_MAX_DEVICES];
MOCK_HIDDEN mockcuda_counters g_cnt;
static mock_obj *g_objs;
/* Streams and events of destroyed contexts: invalid handles from then on,
 * but kept allocated, so that no new object takes a dead one's address
 * while a test still holds the old handle. */
static mock_obj *g_zombies;
static int g_event_delay; /* mockcuda_set_event_delay */
static CUstream g_captures[MOCK_MAX_CAPTURES]; /* captures begun, not ended */
static int g_ncaptures;
static struct CUstream_st g_legacy = {.kind = MOCK_STREAM_LEGACY};
static struct CUgraph_st g_graph; /* every capture "produces" this graph */

static _Thread_local CUcontext t_stack[MOCK_CTX_STACK];
static _Thread_local int t_depth;
static _Thread_local struct CUstream_st t_ptds = {.kind = MOCK_STREAM_PER_THREAD};
/* cuThreadExchangeStreamCaptureMode's per-thread mode (0: global). */
static _Thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* A fork while another thread is inside the mock would leave the child's
 * copy of the lock held forever; holding it across fork keeps both whole,
 * as a real driver's locks are (or the library's fork tests would test
 * the mock). */
static void mock_fork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void mock_fork_release(void) { pthread_mutex_unlock(&g_lock); }

__attribute__((constructor)) static void mock_ctor(void) {
  const char *v = getenv("MOCKCUDA_VERBOSE");
  g_verbose = v && v[0] == '1';
  pthread_atfork(mock_fork_prepare, mock_fork_release, mock_fork_release);
}

void mock_trace(const char *fmt, ...) {
  if (!g_verbose)
    return;
  va_list ap;
  va_start(ap, fmt);
  fputs("mockcuda: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

void mock_lock(void) { pthread_mutex_lock(&g_lock); }
void mock_unlock(void) { pthread_mutex_unlock(&g_lock); }

/* The shape of the simple queries: under the lock, the precondition `check`
 * (a CUresult), then CUDA_ERROR_INVALID_VALUE when `bad`, else `action`. */
#define MOCK_QUERY(check, bad, action)                                         \
  do {                                                                         \
    mock_lock();                                                               \
    CUresult rc_ = (check);                                                    \
    if (rc_ == CUDA_SUCCESS && (bad))                                          \
      rc_ = CUDA_ERROR_INVALID_VALUE;                                          \
    else if (rc_ == CUDA_SUCCESS)                                              \
      action;                                                                  \
    mock_unlock();                                                             \
    return rc_;                                                                \
  } while (0)

uint64_t mock_round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static long mock_env_long(const char *name, long def, long lo, long hi) {
  const char *v = getenv(name);
  if (!v || !*v)
    return def;
  char *end;
  long x = strtol(v, &end, 10);
  if (*end || x < lo || x > hi)
    return def;
  return x;
}

/* ---- objects ---------------------------------------------------------- */

static void mock_obj_link(mock_obj *o, int type) {
  o->type = type;
  o->next = g_objs;
  g_objs = o;
}

static int mock_obj_find(const void *p, int type) {
  for (mock_obj *o = g_objs; o; o = o->next)
    if (o == p && o->type == type)
      return 1;
  return 0;
}

static void mock_obj_unlink(mock_obj *o) {
  for (mock_obj **pp = &g_objs; *pp; pp = &(*pp)->next)
    if (*pp == o) {
      *pp = o->next;
      return;
    }
}

/* ---- preconditions ---------------------------------------------------- */

CUresult mock_need_init(void) {
  return g_shut ? CUDA_ERROR_DEINITIALIZED
         : g_inited ? CUDA_SUCCESS
                    : CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult mock_need_dev(CUdevice dev) {
  if (g_shut || !g_inited)
    return mock_need_init();
  return dev >= 0 && dev < g_ndev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static int mock_ctx_known(CUcontext c) {
  for (int d = 0; d < g_ndev; d++)
    if (c == &g_dev[d].primary)
      return 1;
  return mock_obj_find(c, MOCK_OBJ_CTX);
}

/* The calling thread's current context, usable for work. Like the driver,
 * memory calls without one fail with CUDA_ERROR_INVALID_CONTEXT. */
CUresult mock_need_ctx(CUcontext *out) {
  if (g_shut || !g_inited)
    return mock_need_init();
  CUcontext c = t_depth ? t_stack[t_depth - 1] : NULL;
  if (!c || !mock_ctx_known(c))
    return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive)
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

static CUresult mock_stream_get(CUstream s, int ptsz, CUstream *out);

CUresult mock_need_ctx_stream(CUstream hs, int ptsz, CUresult arg_rc, CUcontext *c, CUstream *s) {
  CUresult rc = mock_need_ctx(c);
  if (rc == CUDA_SUCCESS)
    rc = arg_rc;
  if (rc == CUDA_SUCCESS)
    rc = mock_stream_get(hs, ptsz, s);
  return rc;
}

/* Streams destroyed with cuStreamDestroy, until their address names a new
 * one: the real driver crashes on such a handle (cuStreamIsCapturing on a
 * destroyed stream: SIGSEGV, driver 580 on an H200, 2026-12-04), so the
 * mock ends the process there too, saying why. */
#define MOCK_GRAVES 64
static CUstream g_graves[MOCK_GRAVES];
static unsigned g_ngraves;

static void mock_grave_set(CUstream s, bool dead) {
  for (unsigned i = 0; i < MOCK_GRAVES; i++)
    if (g_graves[i] == s)
      g_graves[i] = NULL;
  if (dead)
    g_graves[g_ngraves++ % MOCK_GRAVES] = s;
}

static void mock_grave_check(CUstream s) {
  for (unsigned i = 0; s && i < MOCK_GRAVES; i++)
    if (g_graves[i] == s) {
      fprintf(stderr, "mockcuda: a call on destroyed stream %p: the real "
                      "driver crashes here\n", (void *)s);
      abort();
    }
}

static CUresult mock_stream_get(CUstream s, int ptsz, CUstream *out) {
  mock_grave_check(s);
  if (s == NULL)
    *out = ptsz ? &t_ptds : &g_legacy;
  else if (s == CU_STREAM_LEGACY)
    *out = &g_legacy;
  else if (s == CU_STREAM_PER_THREAD)
    *out = &t_ptds;
  else if (mock_obj_find(s, MOCK_OBJ_STREAM))
    *out = s;
  else
    return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

/* Stream capture: "potentially unsafe" calls -- cuMemAlloc/cuMemFree and
 * friends, event queries, synchronization -- are refused and invalidate the
 * capture, as measured on the driver (driver_facts.txt): when the calling
 * thread has a capture of its own not begun relaxed, or, unless the thread
 * made itself relaxed (cuThreadExchangeStreamCaptureMode), when any thread
 * has a global capture. `any_mode`: the call waits for every stream, the
 * capturing one too (cuCtxSynchronize): refused whatever the modes. This is
 * what makes a pool that synchronizes at the wrong time fail visibly here. */
static CUresult mock_capture_guard(const char *what, int any_mode) {
  pthread_t self = pthread_self();
  int hit = 0;
  for (int i = 0; i < g_ncaptures; i++) {
    CUstream s = g_captures[i];
    int own = pthread_equal(s->thread, self);
    if (any_mode ||
        (own && s->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
         t_capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
        (!own && s->mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
         t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      hit = 1;
    }
  }
  if (!hit)
    return CUDA_SUCCESS;
  g_cnt.capture_violations++;
  mock_trace("%s during a stream capture: capture invalidated", what);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

static void mock_capture_forget(CUstream s) {
  for (int i = 0; i < g_ncaptures; i++)
    if (g_captures[i] == s) {
      g_captures[i] = g_captures[--g_ncaptures];
      return;
    }
}

/* ---- simulated device memory ------------------------------------------ */

mock_alloc *mock_find(uint64_t p, uint64_t n, mock_device **dev_out) {
  mock_alloc *m = mock_vmm_find(p, n, dev_out);
  if (m)
    return m;
  for (int d = 0; d < g_ndev; d++) {
    mock_device *dv = &g_dev[d];
    if (p < dv->va_base || p >= dv->va_end || dv->n == 0)
      continue;
    size_t lo = 0, hi = dv->n; /* last allocation with addr <= p */
    while (hi - lo > 1) {
      size_t mid = (lo + hi) / 2;
      if (dv->allocs[mid].addr <= p)
        lo = mid;
      else
        hi = mid;
    }
    mock_alloc *a = &dv->allocs[lo];
    uint64_t off = p - a->addr;
    if (p < a->addr || off >= a->size || (n && n > a->size - off))
      return NULL;
    if (dev_out)
      *dev_out = dv;
    return a;
  }
  return NULL;
}

/* A mapping of a reserved range is no allocation of cuMemAlloc's: the
 * calls that free one refuse it (measured). */
static mock_alloc *mock_find_base(uint64_t p, mock_device **dev_out) {
  mock_alloc *a = mock_find(p, 0, dev_out);
  return a && a->addr == p && a->kind != MOCK_KIND_MAPPED ? a : NULL;
}

/* Imports take no capacity: their memory is the exporter's. */
void mock_remove(mock_device *dv, mock_alloc *a) {
  size_t i = (size_t)(a - dv->allocs);
  if (a->kind == MOCK_KIND_IMPORTED) {
    g_cnt.live_imports--;
  } else {
    dv->used -= a->span;
    mock_device_changed((int)(dv - g_dev));
    g_cnt.used_bytes -= a->span;
    g_cnt.live_allocs--;
    g_cnt.live_bytes -= a->size;
  }
  if (a->shared)
    mock_shared_release(a);
  else
    free(a->host);
  memmove(a, a + 1, (dv->n - i - 1) * sizeof *a);
  dv->n--;
}

/* First fit in the device's range, so freed addresses come back soon, as
 * with the real driver: stale-address bugs in a pool show up here. */
mock_alloc *mock_place(int dev, uint64_t span, uint64_t align) {
  mock_device *dv = &g_dev[dev];
  if (dv->n == dv->cap) {
    size_t cap = dv->cap ? dv->cap * 2 : 64;
    mock_alloc *p = realloc(dv->allocs, cap * sizeof *p);
    if (!p)
      return NULL;
    dv->allocs = p;
    dv->cap = cap;
  }
  size_t i = 0;
  uint64_t at = mock_round_up(dv->va_base, align);
  for (; i < dv->n; i++) {
    if (at + span <= dv->allocs[i].addr)
      break;
    at = mock_round_up(dv->allocs[i].addr + dv->allocs[i].span, align);
  }
  if (at + span > dv->va_end) /* address space, not capacity: fragmentation */
    return NULL;
  memmove(&dv->allocs[i + 1], &dv->allocs[i], (dv->n - i) * sizeof *dv->allocs);
  dv->n++;
  dv->allocs[i] = (mock_alloc){.addr = at, .span = span};
  return &dv->allocs[i];
}

/* Every allocation from any API gets an id of its own, never reused
 * (CU_POINTER_ATTRIBUTE_BUFFER_ID). */
static uint64_t g_next_id = 0x300;

static CUresult mock_alloc_locked(int dev, CUcontext ctx, uint64_t size, int kind,
                                  CUdeviceptr *out) {
  if (!out || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  mock_device *dv = &g_dev[dev];
  /* As measured (driver_facts.txt, "alignment of"): up to 1 MiB, packed at
   * 512 B; above, 2 MiB-aligned, in whole 2 MiB granules. Whether a packed
   * one may straddle two granules was not measured: here it may. */
  uint64_t align = size > MOCK_PACKED_MAX ? MOCK_LARGE : MOCK_SMALL_ALIGN;
  uint64_t span = mock_round_up(size, align);
  unsigned char *host = NULL;
  mock_alloc *a = NULL;
  if (size > g_capacity || mock_device_used(dev) + span > g_capacity ||
      !(host = malloc(size)) ||
      !(a = mock_place(dev, span, align))) {
    free(host);
    g_cnt.oom++;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->size = size;
  a->host = host;
  a->ctx = ctx;
  a->kind = kind;
  a->id = ++g_next_id;
  dv->used += span;
  mock_device_changed(dev);
  g_cnt.used_bytes += span;
  if (g_cnt.used_bytes > g_cnt.peak_used_bytes)
    g_cnt.peak_used_bytes = g_cnt.used_bytes;
  g_cnt.live_allocs++;
  g_cnt.live_bytes += size;
  *out = (CUdeviceptr)a->addr;
  return CUDA_SUCCESS;
}

static void mock_capture_forget(CUstream s);

/* The context a stream or event object belongs to. */
static CUcontext mock_obj_ctx(const mock_obj *o) {
  if (o->type == MOCK_OBJ_STREAM)
    return ((const struct CUstream_st *)o)->ctx;
  if (o->type == MOCK_OBJ_EVENT)
    return ((const struct CUevent_st *)o)->ctx;
  return NULL;
}

/* A destroyed context takes its allocations, streams and events with it,
 * as on a GPU. */
static void mock_ctx_teardown(CUcontext c) {
  for (int d = 0; d < g_ndev; d++) {
    mock_device *dv = &g_dev[d];
    for (size_t i = dv->n; i-- > 0;)
      if (dv->allocs[i].ctx == c)
        mock_remove(dv, &dv->allocs[i]);
  }
  for (mock_obj **pp = &g_objs; *pp;) {
    mock_obj *o = *pp;
    if (mock_obj_ctx(o) != c) {
      pp = &o->next;
      continue;
    }
    if (o->type == MOCK_OBJ_STREAM)
      mock_capture_forget((CUstream)o);
    *pp = o->next;
    o->next = g_zombies;
    g_zombies = o;
  }
  c->alive = 0;
}

/* Work is done: every event of `c` recorded on `s` (NULL: any stream) has
 * completed. */
static void mock_events_complete(CUcontext c, CUstream s) {
  for (mock_obj *o = g_objs; o; o = o->next) {
    struct CUevent_st *e = (struct CUevent_st *)o;
    if (o->type == MOCK_OBJ_EVENT && e->ctx == c && (!s || e->stream == s))
      e->pending = 0;
  }
}

/* ---- initialization and devices --------------------------------------- */

CUresult cuInit(unsigned int flags) {
  mock_lock();
  g_cnt.init++;
  CUresult rc = CUDA_SUCCESS;
  if (flags != 0) {
    rc = CUDA_ERROR_INVALID_VALUE;
  } else if (!g_inited) {
    int n = (int)mock_env_long("MOCKCUDA_DEVICES", 2, 0, MOCK_MAX_DEVICES);
    g_capacity = (uint64_t)mock_env_long("MOCKCUDA_MEM_MB", 1024, 1, 1L << 24) << 20;
    g_event_delay = (int)mock_env_long("MOCKCUDA_EVENT_DELAY", 0, -1, 1L << 30);
    /* Address space to place allocations in: several times the capacity so
     * that first fit never runs out for want of addresses alone. Reserved
     * PROT_NONE, so no host object can live there and a host access faults. */
    uint64_t span = g_capacity * 16 > (64ull << 30) ? g_capacity * 16 : (64ull << 30);
    span = (uint64_t)mock_env_long("MOCKCUDA_SPAN_MB", (long)(span >> 20), 1, 1L << 30) << 20;
    span = mock_round_up(span, MOCK_LARGE);
    for (int d = 0; d < n && rc == CUDA_SUCCESS; d++) {
      void *p = mmap(NULL, span + MOCK_LARGE, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        break;
      }
      g_dev[d].va_base = mock_round_up((uint64_t)(uintptr_t)p, MOCK_LARGE);
      g_dev[d].va_end = g_dev[d].va_base + span;
      g_dev[d].primary = (struct CUctx_st){.hdr = {NULL, MOCK_OBJ_CTX}, .device = d, .primary = 1};
      g_pools[d].device = d;
    }
    if (rc == CUDA_SUCCESS && n == 0)
      rc = CUDA_ERROR_NO_DEVICE;
    if (rc == CUDA_SUCCESS) {
      g_ndev = n;
      g_inited = 1;
    }
  }
  mock_unlock();
  mock_trace("cuInit(%u) = %d (%d devices, %llu MiB each)", flags, rc, g_ndev,
             (unsigned long long)(g_capacity >> 20));
  return rc;
}

CUresult cuDriverGetVersion(int *version) {
  if (!version)
    return CUDA_ERROR_INVALID_VALUE;
  *version = MOCK_DRIVER_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  mock_lock();
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && !device)
    rc = CUDA_ERROR_INVALID_VALUE;
  else if (rc == CUDA_SUCCESS && (ordinal < 0 || ordinal >= g_ndev))
    rc = CUDA_ERROR_INVALID_DEVICE;
  else if (rc == CUDA_SUCCESS)
    *device = ordinal;
  mock_unlock();
  return rc;
}

CUresult cuDeviceGetCount(int *count) {
  MOCK_QUERY(mock_need_init(), !count, *count = g_ndev);
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  MOCK_QUERY(mock_need_dev(dev), !name || len <= 0,
             snprintf(name, (size_t)len, "mockcuda device %d", dev));
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  MOCK_QUERY(mock_need_dev(dev), !bytes, *bytes = (size_t)g_capacity);
}

/* A device's UUID, the same in every process that loads the mock (two
 * processes name one device alike, as on a real machine), never all zero. */
static void mock_uuid(CUuuid *uuid, CUdevice dev) {
  memset(uuid->bytes, 0, sizeof(uuid->bytes));
  memcpy(uuid->bytes, "mockcuda-gpu", 12);
  uuid->bytes[15] = (char)(dev + 1);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  MOCK_QUERY(mock_need_dev(dev), !uuid, mock_uuid(uuid, dev));
}

/* An H100/H200-like device for the few attributes a caller may branch on;
 * every other attribute reads 0. */
static int mock_attribute(CUdevice_attribute attrib, CUdevice dev) {
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return dev + 1;
  case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return (int)MOCK_SMALL_ALIGN;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
  case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
  default: return 0;
  }
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  MOCK_QUERY(mock_need_dev(dev), !pi, *pi = mock_attribute(attrib, dev));
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  MOCK_QUERY(mock_need_dev(dev), !pool_out, *pool_out = &g_pools[dev]);
}

/* ---- contexts --------------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  mock_lock();
  CUresult rc = mock_need_dev(dev);
  if (rc == CUDA_SUCCESS && !pctx)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    g_dev[dev].primary.refcount++;
    g_dev[dev].primary.alive = 1;
    *pctx = &g_dev[dev].primary;
  }
  mock_unlock();
  mock_trace("cuDevicePrimaryCtxRetain(%d) = %d", dev, rc);
  return rc;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  mock_lock();
  CUresult rc = mock_need_dev(dev);
  if (rc == CUDA_SUCCESS && g_dev[dev].primary.refcount == 0)
    rc = CUDA_ERROR_INVALID_CONTEXT;
  if (rc == CUDA_SUCCESS && --g_dev[dev].primary.refcount == 0)
    mock_ctx_teardown(&g_dev[dev].primary);
  mock_unlock();
  mock_trace("cuDevicePrimaryCtxRelease_v2(%d) = %d", dev, rc);
  return rc;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  mock_lock();
  CUresult rc = mock_need_dev(dev);
  if (rc == CUDA_SUCCESS) {
    mock_ctx_teardown(&g_dev[dev].primary);
    g_dev[dev].primary.refcount = 0;
  }
  mock_unlock();
  mock_trace("cuDevicePrimaryCtxReset_v2(%d) = %d", dev, rc);
  return rc;
}

/* The pre-11.0 originals, which the driver still exports under the plain
 * names: they work the same way. */
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  MOCK_QUERY(mock_need_dev(dev), !flags || !active, {
    *flags = 0;
    *active = g_dev[dev].primary.alive;
  });
}

static CUresult mock_ctx_create(CUcontext *pctx, CUdevice dev) {
  mock_lock();
  CUresult rc = mock_need_dev(dev);
  if (rc == CUDA_SUCCESS && !pctx)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && t_depth == MOCK_CTX_STACK)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext c = NULL;
  if (rc == CUDA_SUCCESS && !(c = calloc(1, sizeof *c)))
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    c->device = dev;
    c->alive = 1;
    mock_obj_link(&c->hdr, MOCK_OBJ_CTX);
    t_stack[t_depth++] = c; /* a new context becomes current */
    *pctx = c;
  }
  mock_unlock();
  return rc;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  (void)flags;
  return mock_ctx_create(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                        CUdevice dev) {
  (void)params, (void)n, (void)flags;
  return mock_ctx_create(pctx, dev);
}

/* CUDA 13's cuCtxCreate. */
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                        CUdevice dev) {
  (void)params, (void)flags;
  return mock_ctx_create(pctx, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
  mock_lock();
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && !mock_obj_find(ctx, MOCK_OBJ_CTX)) /* primary: not ours to destroy */
    rc = CUDA_ERROR_INVALID_CONTEXT;
  if (rc == CUDA_SUCCESS) {
    mock_ctx_teardown(ctx);
    int j = 0;
    for (int i = 0; i < t_depth; i++)
      if (t_stack[i] != ctx)
        t_stack[j++] = t_stack[i];
    t_depth = j;
    mock_obj_unlink(&ctx->hdr);
    free(ctx);
  }
  mock_unlock();
  return rc;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  mock_lock();
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && ctx && !mock_ctx_known(ctx))
    rc = CUDA_ERROR_INVALID_CONTEXT;
  if (rc == CUDA_SUCCESS) {
    if (!ctx) {
      if (t_depth)
        t_depth--;
    } else if (t_depth) {
      t_stack[t_depth - 1] = ctx;
    } else {
      t_stack[t_depth++] = ctx;
    }
  }
  mock_unlock();
  return rc;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  MOCK_QUERY(mock_need_init(), !pctx, *pctx = t_depth ? t_stack[t_depth - 1] : NULL);
}

/* Answers even for a released primary context, as the driver does. */
CUresult cuCtxGetDevice(CUdevice *device) {
  mock_lock();
  CUcontext c = t_depth ? t_stack[t_depth - 1] : NULL;
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && (!c || !mock_ctx_known(c)))
    rc = CUDA_ERROR_INVALID_CONTEXT;
  if (rc == CUDA_SUCCESS && !device)
    rc = CUDA_ERROR_INVALID_VALUE;
  else if (rc == CUDA_SUCCESS)
    *device = c->device;
  mock_unlock();
  return rc;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  mock_lock();
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && (!ctx || !mock_ctx_known(ctx)))
    rc = CUDA_ERROR_INVALID_CONTEXT;
  if (rc == CUDA_SUCCESS && t_depth == MOCK_CTX_STACK)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS)
    t_stack[t_depth++] = ctx;
  mock_unlock();
  return rc;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
  mock_lock();
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && t_depth == 0)
    rc = CUDA_ERROR_INVALID_CONTEXT;
  if (rc == CUDA_SUCCESS) {
    CUcontext c = t_stack[--t_depth];
    if (pctx)
      *pctx = c;
  }
  mock_unlock();
  return rc;
}

CUresult cuCtxSynchronize(void) {
  mock_lock();
  g_cnt.ctx_synchronize++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard("cuCtxSynchronize", 1);
  if (rc == CUDA_SUCCESS)
    mock_events_complete(c, NULL);
  mock_unlock();
  mock_trace("cuCtxSynchronize() = %d", rc);
  return rc;
}

/* ---- streams and capture ---------------------------------------------- */

/* Priorities are accepted and ignored: the mock runs nothing. */
static CUresult mock_stream_create(CUstream *ph, unsigned int flags, const char *what) {
  mock_lock();
  g_cnt.stream_create++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)))
    rc = CUDA_ERROR_INVALID_VALUE;
  CUstream s = NULL;
  if (rc == CUDA_SUCCESS && !(s = calloc(1, sizeof *s)))
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    mock_grave_set(s, false);
    s->kind = MOCK_STREAM_USER;
    s->flags = flags;
    s->ctx = c;
    mock_obj_link(&s->hdr, MOCK_OBJ_STREAM);
    *ph = s;
  }
  mock_unlock();
  mock_trace("%s(flags %u) = %d -> %p", what, flags, rc, rc == CUDA_SUCCESS ? (void *)s : NULL);
  return rc;
}

CUresult cuStreamCreate(CUstream *ph, unsigned int flags) {
  return mock_stream_create(ph, flags, "cuStreamCreate");
}

CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority) {
  (void)priority;
  return mock_stream_create(ph, flags, "cuStreamCreateWithPriority");
}

/* Returns at once, as the driver does even with work queued on the stream. */
static CUresult mock_stream_destroy(CUstream s, const char *what) {
  mock_lock();
  g_cnt.stream_destroy++;
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && !mock_obj_find(s, MOCK_OBJ_STREAM))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS) {
    mock_grave_set(s, true);
    mock_capture_forget(s);
    mock_obj_unlink(&s->hdr);
    free(s);
  }
  mock_unlock();
  mock_trace("%s(%p) = %d", what, (void *)s, rc);
  return rc;
}

CUresult cuStreamDestroy_v2(CUstream s) { return mock_stream_destroy(s, "cuStreamDestroy_v2"); }
/* The CUDA 2.0 name, which the driver still exports. */
CUresult cuStreamDestroy(CUstream s) { return mock_stream_destroy(s, "cuStreamDestroy"); }

static CUresult mock_stream_sync(CUstream hs, int ptsz) {
  mock_lock();
  g_cnt.stream_synchronize++;
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc = mock_need_ctx_stream(hs, ptsz, CUDA_SUCCESS, &c, &s);
  if (rc == CUDA_SUCCESS && s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
    s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED; /* never legal, any mode */
    g_cnt.capture_violations++;
    rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard("cuStreamSynchronize", 0);
  if (rc == CUDA_SUCCESS)
    mock_events_complete(c, s);
  mock_unlock();
  return rc;
}

CUresult cuStreamSynchronize(CUstream s) { return mock_stream_sync(s, 0); }
CUresult cuStreamSynchronize_ptsz(CUstream s) { return mock_stream_sync(s, 1); }

static CUresult mock_is_capturing(CUstream hs, CUstreamCaptureStatus *st, int ptsz) {
  mock_lock();
  g_cnt.stream_is_capturing++;
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc =
      mock_need_ctx_stream(hs, ptsz, st ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, &c, &s);
  if (rc == CUDA_SUCCESS && s->kind == MOCK_STREAM_LEGACY) {
    /* Asking about the legacy stream while a blocking stream captures
     * would join it to the capture: the driver refuses. */
    for (int i = 0; i < g_ncaptures; i++)
      if (!(g_captures[i]->flags & CU_STREAM_NON_BLOCKING))
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  if (rc == CUDA_SUCCESS)
    *st = s->capture;
  mock_unlock();
  return rc;
}

CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) {
  return mock_is_capturing(s, st, 0);
}
CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st) {
  return mock_is_capturing(s, st, 1);
}

static CUresult mock_begin_capture(CUstream hs, CUstreamCaptureMode mode, int ptsz) {
  mock_lock();
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc = mock_need_ctx_stream(hs, ptsz, CUDA_SUCCESS, &c, &s);
  if (rc == CUDA_SUCCESS && s->kind == MOCK_STREAM_LEGACY)
    rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  else if (rc == CUDA_SUCCESS && s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
    rc = CUDA_ERROR_ILLEGAL_STATE;
  else if (rc == CUDA_SUCCESS && (unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    rc = CUDA_ERROR_INVALID_VALUE;
  else if (rc == CUDA_SUCCESS && g_ncaptures == MOCK_MAX_CAPTURES)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    s->mode = mode;
    s->thread = pthread_self();
    g_captures[g_ncaptures++] = s;
  }
  mock_unlock();
  mock_trace("cuStreamBeginCapture(mode %d) = %d", (int)mode, rc);
  return rc;
}

/* CUDA 10.0's mode-less original captures in global mode. */
CUresult cuStreamBeginCapture(CUstream s) {
  return mock_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, 0);
}
CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  return mock_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL, 1);
}
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return mock_begin_capture(s, mode, 0);
}
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return mock_begin_capture(s, mode, 1);
}

static CUresult mock_end_capture(CUstream hs, CUgraph *ph, int ptsz) {
  mock_lock();
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc =
      mock_need_ctx_stream(hs, ptsz, ph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, &c, &s);
  if (rc == CUDA_SUCCESS && s->capture == CU_STREAM_CAPTURE_STATUS_NONE)
    rc = CUDA_ERROR_ILLEGAL_STATE;
  else if (rc == CUDA_SUCCESS && s->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
           !pthread_equal(s->thread, pthread_self()))
    rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  if (rc == CUDA_SUCCESS) {
    int invalid = s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    mock_capture_forget(s);
    s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    *ph = invalid ? NULL : &g_graph;
    rc = invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
  }
  mock_unlock();
  mock_trace("cuStreamEndCapture() = %d", rc);
  return rc;
}

CUresult cuStreamEndCapture(CUstream s, CUgraph *ph) { return mock_end_capture(s, ph, 0); }
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *ph) { return mock_end_capture(s, ph, 1); }

/* How this thread's potentially unsafe calls meet other captures (PyTorch's
 * allocator turns relaxed around cudaMalloc during a capture). */
CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g) { return g == &g_graph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* ---- events ----------------------------------------------------------- */

CUresult cuEventCreate(CUevent *ph, unsigned int flags) {
  mock_lock();
  g_cnt.event_create++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS &&
      (!ph || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                                   CU_EVENT_INTERPROCESS))))
    rc = CUDA_ERROR_INVALID_VALUE;
  CUevent e = NULL;
  if (rc == CUDA_SUCCESS && !(e = calloc(1, sizeof *e)))
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    e->ctx = c;
    mock_obj_link(&e->hdr, MOCK_OBJ_EVENT);
    *ph = e;
  }
  mock_unlock();
  return rc;
}

/* Which counter a record on `s` moves. */
static void mock_count_record(CUstream s) {
  if (s->kind == MOCK_STREAM_LEGACY)
    g_cnt.event_record_legacy++;
  else if (s->kind == MOCK_STREAM_PER_THREAD)
    g_cnt.event_record_per_thread++;
  else if (s->flags & CU_STREAM_NON_BLOCKING)
    g_cnt.event_record_nonblocking++;
  else
    g_cnt.event_record_blocking++;
  s->records++;
}

/* A record on the legacy stream makes it wait for every blocking stream,
 * the per-thread default streams included: while one of them captures,
 * the driver refuses (cudaErrorStreamCaptureImplicit, "the operation would
 * make the legacy stream depend on a capturing blocking stream") and the
 * capture is invalidated. From CUDA's documentation of that error; not yet
 * measured by driver_probe. */
static CUresult mock_record_guard(CUstream s) {
  if (s->kind != MOCK_STREAM_LEGACY)
    return CUDA_SUCCESS;
  CUresult rc = CUDA_SUCCESS;
  for (int i = 0; i < g_ncaptures; i++)
    if (!(g_captures[i]->flags & CU_STREAM_NON_BLOCKING)) {
      g_captures[i]->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  if (rc != CUDA_SUCCESS) {
    g_cnt.capture_violations++;
    mock_trace("cuEventRecord on the legacy stream during a capture: capture invalidated");
  }
  return rc;
}

/* The context `s` (as mock_stream_get resolved it) belongs to: a created
 * stream's own; the legacy and per-thread streams are the current one's,
 * `cur`. An event must belong to it to be recorded on or waited by `s`. */
static CUcontext mock_stream_ctx(CUstream s, CUcontext cur) {
  return s->kind == MOCK_STREAM_USER ? s->ctx : cur;
}

/* Event and stream must belong to one context. */
static CUresult mock_event_record(CUevent e, CUstream hs, int ptsz) {
  mock_lock();
  g_cnt.event_record++;
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc = mock_need_ctx_stream(
      hs, ptsz, mock_obj_find(e, MOCK_OBJ_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE, &c, &s);
  if (rc == CUDA_SUCCESS && e->ctx != mock_stream_ctx(s, c))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS)
    rc = mock_record_guard(s);
  if (rc == CUDA_SUCCESS) {
    e->recorded = 1;
    e->stream = s;
    e->captured = s->capture != CU_STREAM_CAPTURE_STATUS_NONE;
    e->pending = e->captured ? 0 : g_event_delay;
    mock_count_record(s);
  }
  mock_unlock();
  mock_trace("cuEventRecord%s(%p, %p) = %d", ptsz ? "_ptsz" : "", (void *)e, (void *)hs, rc);
  return rc;
}

CUresult cuEventRecord(CUevent e, CUstream s) { return mock_event_record(e, s, 0); }
CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return mock_event_record(e, s, 1); }

/* The mock's work is done when queued, so a wait orders nothing; it is
 * checked (a live event of the stream's context, recorded or not, as the
 * driver accepts) and counted by the stream made to wait. */
CUresult cuStreamWaitEvent(CUstream hs, CUevent e, unsigned int flags) {
  mock_lock();
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc = mock_need_ctx_stream(
      hs, 0, mock_obj_find(e, MOCK_OBJ_EVENT) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE, &c, &s);
  if (rc == CUDA_SUCCESS && (flags & ~1u) != 0)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && e->ctx != mock_stream_ctx(s, c))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS) {
    if (s->kind == MOCK_STREAM_LEGACY)
      g_cnt.wait_event_legacy++;
    else if (s->kind == MOCK_STREAM_USER && (s->flags & CU_STREAM_NON_BLOCKING))
      g_cnt.wait_event_nonblocking++;
    else
      g_cnt.wait_event_other++;
  }
  mock_unlock();
  mock_trace("cuStreamWaitEvent(%p, %p, %u) = %d", (void *)hs, (void *)e, flags, rc);
  return rc;
}

/* Query or wait: refused during a capture as other unsafe calls are
 * (driver_facts.txt), then refused for an event recorded into a graph. */
static CUresult mock_event_check(CUevent e, uint64_t *counter, const char *what) {
  (*counter)++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && !mock_obj_find(e, MOCK_OBJ_EVENT))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard(what, 0);
  if (rc == CUDA_SUCCESS && e->captured)
    rc = CUDA_ERROR_CAPTURED_EVENT;
  return rc;
}

CUresult cuEventQuery(CUevent e) {
  mock_lock();
  CUresult rc = mock_event_check(e, &g_cnt.event_query, "cuEventQuery");
  if (rc == CUDA_SUCCESS && e->pending) {
    if (e->pending > 0)
      e->pending--;
    g_cnt.event_not_ready++;
    rc = CUDA_ERROR_NOT_READY;
  }
  mock_unlock();
  return rc;
}

CUresult cuEventSynchronize(CUevent e) {
  mock_lock();
  CUresult rc = mock_event_check(e, &g_cnt.event_synchronize, "cuEventSynchronize");
  if (rc == CUDA_SUCCESS)
    e->pending = 0;
  mock_unlock();
  return rc;
}

/* As the driver, an event may be destroyed while pending. */
CUresult cuEventDestroy_v2(CUevent e) {
  mock_lock();
  g_cnt.event_destroy++;
  CUresult rc = mock_need_init();
  if (rc == CUDA_SUCCESS && !mock_obj_find(e, MOCK_OBJ_EVENT))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS) {
    mock_obj_unlink(&e->hdr);
    free(e);
  }
  mock_unlock();
  return rc;
}

/* ---- memory ----------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  mock_lock();
  g_cnt.mem_alloc++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard("cuMemAlloc_v2", 0);
  if (rc == CUDA_SUCCESS)
    rc = mock_alloc_locked(c->device, c, bytesize, MOCK_KIND_ALLOC, dptr);
  mock_unlock();
  mock_trace("cuMemAlloc_v2(%zu) = %d -> 0x%llx", bytesize, rc,
             rc == CUDA_SUCCESS ? (unsigned long long)*dptr : 0ull);
  return rc;
}

/* Frees an allocation of any kind (cudaFree accepts pitch, managed and
 * stream-ordered pointers); only an allocation's base is accepted, and 0,
 * which the driver takes as a no-op. */
CUresult cuMemFree_v2(CUdeviceptr dptr) {
  mock_lock();
  g_cnt.mem_free++;
  CUcontext c = NULL;
  mock_device *dv = NULL;
  mock_alloc *a = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard("cuMemFree_v2", 0);
  if (rc == CUDA_SUCCESS && dptr &&
      (!(a = mock_find_base(dptr, &dv)) || a->kind == MOCK_KIND_IMPORTED)) {
    g_cnt.mem_free_unknown++;
    rc = CUDA_ERROR_INVALID_VALUE; /* an import closes with cuIpcCloseMemHandle */
  }
  if (rc == CUDA_SUCCESS && a)
    mock_remove(dv, a);
  mock_unlock();
  mock_trace("cuMemFree_v2(0x%llx) = %d", (unsigned long long)dptr, rc);
  return rc;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  mock_lock();
  g_cnt.get_info++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && total_bytes)
    *total_bytes = (size_t)g_capacity;
  if (rc == CUDA_SUCCESS && free_bytes)
    *free_bytes = (size_t)(g_capacity - mock_device_used(c->device));
  mock_unlock();
  return rc;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int elem) {
  mock_lock();
  g_cnt.alloc_pitch++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && (!dptr || !pitch || !width || !height ||
                             (elem != 4 && elem != 8 && elem != 16)))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard("cuMemAllocPitch_v2", 0);
  uint64_t p = mock_round_up(width, MOCK_SMALL_ALIGN);
  if (rc == CUDA_SUCCESS && height > g_capacity / p) {
    g_cnt.oom++;
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (rc == CUDA_SUCCESS)
    rc = mock_alloc_locked(c->device, c, p * height, MOCK_KIND_PITCH, dptr);
  if (rc == CUDA_SUCCESS)
    *pitch = (size_t)p;
  mock_unlock();
  return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
  mock_lock();
  g_cnt.alloc_managed++;
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  if (rc == CUDA_SUCCESS && flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    rc = mock_capture_guard("cuMemAllocManaged", 0);
  if (rc == CUDA_SUCCESS)
    rc = mock_alloc_locked(c->device, c, bytesize, MOCK_KIND_MANAGED, dptr);
  mock_unlock();
  return rc;
}

/* Pinned host memory is plain host memory to the mock, whose copies are
 * done when they return; the driver wants a current context and knows
 * four flags. */
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
  mock_lock();
  CUcontext c = NULL;
  CUresult rc = mock_need_ctx(&c);
  mock_unlock();
  if (rc == CUDA_SUCCESS && (pp == NULL || bytesize == 0 || (flags & ~0xFu)))
    rc = CUDA_ERROR_INVALID_VALUE;
  const char *pinned = getenv("MOCKCUDA_PINNED");
  if (rc == CUDA_SUCCESS && pinned && strcmp(pinned, "0") == 0)
    rc = CUDA_ERROR_OUT_OF_MEMORY; /* no page can be locked */
  if (rc == CUDA_SUCCESS && (*pp = calloc(1, bytesize)) == NULL)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  return rc;
}

/* What cuMemHostAlloc gave back to the host. */
CUresult cuMemFreeHost(void *p) {
  mock_lock();
  CUresult rc = mock_need_init();
  mock_unlock();
  if (rc == CUDA_SUCCESS)
    free(p);
  return rc;
}

/* Stream-ordered calls act at once: the mock's streams have no pending work.
 * They are legal during a capture (the driver records graph nodes). */
static CUresult mock_alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hs, int ptsz) {
  mock_lock();
  if (pool) {
    g_cnt.alloc_from_pool_async++;
    g_cnt.alloc_from_pool_async_ptsz += (uint64_t)ptsz;
  } else {
    g_cnt.alloc_async++;
    g_cnt.alloc_async_ptsz += (uint64_t)ptsz;
  }
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  CUresult rc = mock_need_ctx_stream(hs, ptsz, CUDA_SUCCESS, &c, &s);
  int dev = c ? c->device : 0;
  if (rc == CUDA_SUCCESS && pool) {
    if (pool < &g_pools[0] || pool >= &g_pools[g_ndev])
      rc = CUDA_ERROR_INVALID_VALUE;
    else
      dev = pool->device;
  }
  if (rc == CUDA_SUCCESS)
    rc = mock_alloc_locked(dev, c, bytesize, pool ? MOCK_KIND_POOL_ASYNC : MOCK_KIND_ASYNC, dptr);
  mock_unlock();
  mock_trace("cuMemAlloc%sAsync%s(%zu) = %d -> 0x%llx", pool ? "FromPool" : "",
             ptsz ? "_ptsz" : "", bytesize, rc,
             rc == CUDA_SUCCESS ? (unsigned long long)*dptr : 0ull);
  return rc;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
  return mock_alloc_async(dptr, bytesize, NULL, s, 0);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s) {
  return mock_alloc_async(dptr, bytesize, NULL, s, 1);
}
/* A NULL pool is invalid here; the real driver refuses it too. */
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream s) {
  return pool ? mock_alloc_async(dptr, bytesize, pool, s, 0) : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream s) {
  return pool ? mock_alloc_async(dptr, bytesize, pool, s, 1) : CUDA_ERROR_INVALID_VALUE;
}

static CUresult mock_free_async(CUdeviceptr dptr, CUstream hs, int ptsz) {
  mock_lock();
  g_cnt.free_async++;
  g_cnt.free_async_ptsz += (uint64_t)ptsz;
  g_cnt.ptsz_calls += (uint64_t)ptsz;
  CUcontext c = NULL;
  CUstream s = NULL;
  mock_device *dv = NULL;
  mock_alloc *a = NULL;
  CUresult rc = mock_need_ctx_stream(hs, ptsz, CUDA_SUCCESS, &c, &s);
  if (rc == CUDA_SUCCESS && !(a = mock_find_base(dptr, &dv))) {
    g_cnt.free_async_unknown++;
    rc = CUDA_ERROR_INVALID_VALUE;
  }
  if (rc == CUDA_SUCCESS)
    mock_remove(dv, a);
  mock_unlock();
  mock_trace("cuMemFreeAsync%s(0x%llx) = %d", ptsz ? "_ptsz" : "", (unsigned long long)dptr, rc);
  return rc;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { return mock_free_async(dptr, s, 0); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return mock_free_async(dptr, s, 1); }

/* ---- errors ----------------------------------------------------------- */

static const struct {
  CUresult code;
  const char *name, *text;
} mock_errors[] = {
#define E(c, t) {c, #c, t}
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
#undef E
};

static CUresult mock_error(CUresult e, const char **p, int text) {
  if (!p)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof mock_errors / sizeof *mock_errors; i++)
    if (mock_errors[i].code == e) {
      *p = text ? mock_errors[i].text : mock_errors[i].name;
      return CUDA_SUCCESS;
    }
  *p = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult e, const char **p) { return mock_error(e, p, 0); }
CUresult cuGetErrorString(CUresult e, const char **p) { return mock_error(e, p, 1); }

/* ---- cuGetProcAddress ------------------------------------------------- */

/* Every export, by the base name callers ask for, with the CUDA version that
 * introduced it (from cudaTypedefs.h's PFN_..._vNNNNN names). ptds marks the
 * per-thread-default-stream twin. */
static const struct mock_sym {
  const char *base;
  const char *name;
  int version;
  int ptds;
  void *fn;
} mock_syms[] = {
#define S(base, fn, ver) {base, #fn, ver, 0, (void *)fn}
#define P(base, fn, ver) {base, #fn, ver, 1, (void *)fn}
/* An export and its per-thread twin (fn##twin), which came with CUDA 7.0. */
#define T(base, fn, twin, ver) S(base, fn, ver), P(base, fn##twin, 7000)
    S("cuInit", cuInit, 2000),
    S("cuDriverGetVersion", cuDriverGetVersion, 2020),
    S("cuDeviceGet", cuDeviceGet, 2000),
    S("cuDeviceGetCount", cuDeviceGetCount, 2000),
    S("cuDeviceGetName", cuDeviceGetName, 2000),
    S("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    S("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000),
    S("cuDeviceGetUuid", cuDeviceGetUuid_v2, 11040),
    S("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool, 11020),
    S("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    S("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000),
    S("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease, 7000),
    S("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    S("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset, 7000),
    S("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, 11000),
    S("cuCtxCreate", cuCtxCreate_v2, 3020),
    S("cuCtxCreate", cuCtxCreate_v3, 11040),
    S("cuCtxCreate", cuCtxCreate_v4, 12050),
    S("cuCtxDestroy", cuCtxDestroy_v2, 4000),
    S("cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    S("cuCtxGetCurrent", cuCtxGetCurrent, 4000),
    S("cuCtxGetDevice", cuCtxGetDevice, 2000),
    S("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000),
    S("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000),
    S("cuCtxSynchronize", cuCtxSynchronize, 2000),
    S("cuStreamCreate", cuStreamCreate, 2000),
    S("cuStreamCreateWithPriority", cuStreamCreateWithPriority, 5050),
    S("cuStreamDestroy", cuStreamDestroy, 2000),
    S("cuStreamDestroy", cuStreamDestroy_v2, 4000),
    S("cuStreamSynchronize", cuStreamSynchronize, 2000),
    P("cuStreamSynchronize", cuStreamSynchronize_ptsz, 7000),
    S("cuStreamIsCapturing", cuStreamIsCapturing, 10000),
    P("cuStreamIsCapturing", cuStreamIsCapturing_ptsz, 10000),
    S("cuStreamBeginCapture", cuStreamBeginCapture, 10000),
    P("cuStreamBeginCapture", cuStreamBeginCapture_ptsz, 10000),
    S("cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010),
    P("cuStreamBeginCapture", cuStreamBeginCapture_v2_ptsz, 10010),
    S("cuStreamEndCapture", cuStreamEndCapture, 10000),
    P("cuStreamEndCapture", cuStreamEndCapture_ptsz, 10000),
    S("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode, 10010),
    S("cuGraphDestroy", cuGraphDestroy, 10000),
    S("cuEventCreate", cuEventCreate, 2000),
    S("cuEventRecord", cuEventRecord, 2000),
    S("cuStreamWaitEvent", cuStreamWaitEvent, 3020),
    P("cuEventRecord", cuEventRecord_ptsz, 7000),
    S("cuEventQuery", cuEventQuery, 2000),
    S("cuEventSynchronize", cuEventSynchronize, 2000),
    S("cuEventDestroy", cuEventDestroy_v2, 4000),
    S("cuGetErrorName", cuGetErrorName, 6000),
    S("cuGetErrorString", cuGetErrorString, 6000),
    S("cuGetProcAddress", cuGetProcAddress, 11030),
    S("cuGetProcAddress", cuGetProcAddress_v2, 12000),
    S("cuMemAlloc", cuMemAlloc_v2, 3020),
    S("cuMemFree", cuMemFree_v2, 3020),
    S("cuMemGetInfo", cuMemGetInfo_v2, 3020),
    S("cuMemAllocPitch", cuMemAllocPitch_v2, 3020),
    S("cuMemAllocManaged", cuMemAllocManaged, 6000),
    S("cuMemAllocAsync", cuMemAllocAsync, 11020),
    P("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020),
    S("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020),
    S("cuMemFreeAsync", cuMemFreeAsync, 11020),
    P("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020),
    S("cuMemCreate", cuMemCreate, 10020),
    S("cuMemRelease", cuMemRelease, 10020),
    S("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020),
    S("cuMemAddressReserve", cuMemAddressReserve, 10020),
    S("cuMemAddressFree", cuMemAddressFree, 10020),
    S("cuMemMap", cuMemMap, 10020),
    S("cuMemUnmap", cuMemUnmap, 10020),
    S("cuMemSetAccess", cuMemSetAccess, 10020),
    S("cuMemGetAddressRange", cuMemGetAddressRange_v2, 3020),
    S("cuMemGetHandleForAddressRange", cuMemGetHandleForAddressRange, 11070),
    S("cuPointerGetAttribute", cuPointerGetAttribute, 4000),
    S("cuPointerGetAttributes", cuPointerGetAttributes, 7000),
    S("cuPointerSetAttribute", cuPointerSetAttribute, 6000),
    S("cuIpcGetMemHandle", cuIpcGetMemHandle, 4010),
    S("cuIpcOpenMemHandle", cuIpcOpenMemHandle, 4010),
    S("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2, 11000),
    S("cuIpcCloseMemHandle", cuIpcCloseMemHandle, 4010),
    T("cuMemsetD8", cuMemsetD8_v2, _ptds, 3020),
    T("cuMemsetD16", cuMemsetD16_v2, _ptds, 3020),
    T("cuMemsetD32", cuMemsetD32_v2, _ptds, 3020),
    T("cuMemsetD2D8", cuMemsetD2D8_v2, _ptds, 3020),
    T("cuMemsetD2D16", cuMemsetD2D16_v2, _ptds, 3020),
    T("cuMemsetD2D32", cuMemsetD2D32_v2, _ptds, 3020),
    T("cuMemsetD8Async", cuMemsetD8Async, _ptsz, 3020),
    T("cuMemsetD16Async", cuMemsetD16Async, _ptsz, 3020),
    T("cuMemsetD32Async", cuMemsetD32Async, _ptsz, 3020),
    T("cuMemsetD2D8Async", cuMemsetD2D8Async, _ptsz, 3020),
    T("cuMemsetD2D16Async", cuMemsetD2D16Async, _ptsz, 3020),
    T("cuMemsetD2D32Async", cuMemsetD2D32Async, _ptsz, 3020),
    T("cuMemcpy", cuMemcpy, _ptds, 4000),
    T("cuMemcpyAsync", cuMemcpyAsync, _ptsz, 4000),
    T("cuMemcpyHtoD", cuMemcpyHtoD_v2, _ptds, 3020),
    T("cuMemcpyDtoH", cuMemcpyDtoH_v2, _ptds, 3020),
    T("cuMemcpyDtoD", cuMemcpyDtoD_v2, _ptds, 3020),
    T("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2, _ptsz, 3020),
    T("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2, _ptsz, 3020),
    T("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2, _ptsz, 3020),
    T("cuMemcpyDtoA", cuMemcpyDtoA_v2, _ptds, 3020),
    T("cuMemcpyAtoD", cuMemcpyAtoD_v2, _ptds, 3020),
    T("cuMemcpyPeer", cuMemcpyPeer, _ptds, 4000),
    T("cuMemcpyPeerAsync", cuMemcpyPeerAsync, _ptsz, 4000),
    T("cuMemcpy2D", cuMemcpy2D_v2, _ptds, 3020),
    T("cuMemcpy2DUnaligned", cuMemcpy2DUnaligned_v2, _ptds, 3020),
    T("cuMemcpy2DAsync", cuMemcpy2DAsync_v2, _ptsz, 3020),
    T("cuMemcpy3D", cuMemcpy3D_v2, _ptds, 3020),
    T("cuMemcpy3DAsync", cuMemcpy3DAsync_v2, _ptsz, 3020),
    T("cuMemcpy3DPeer", cuMemcpy3DPeer, _ptds, 4000),
    T("cuMemcpy3DPeerAsync", cuMemcpy3DPeerAsync, _ptsz, 4000),
    S("cuMemcpyBatchAsync", cuMemcpyBatchAsync, 12080),
    P("cuMemcpyBatchAsync", cuMemcpyBatchAsync_ptsz, 12080),
    S("cuMemcpyBatchAsync", cuMemcpyBatchAsync_v2, 13000),
    P("cuMemcpyBatchAsync", cuMemcpyBatchAsync_v2_ptsz, 13000),
    S("cuMemcpy3DBatchAsync", cuMemcpy3DBatchAsync, 12080),
    P("cuMemcpy3DBatchAsync", cuMemcpy3DBatchAsync_ptsz, 12080),
    S("cuMemcpy3DBatchAsync", cuMemcpy3DBatchAsync_v2, 13000),
    P("cuMemcpy3DBatchAsync", cuMemcpy3DBatchAsync_v2_ptsz, 13000),
#undef S
#undef P
#undef T
};

/* As the driver: `symbol` is a base name; the variant is the newest one not
 * newer than cudaVersion, the per-thread twin if asked for (either flag bit
 * with the per-thread one wins) and one exists. A name not found is, as
 * measured: v1, CUDA_ERROR_NOT_FOUND; v2, CUDA_SUCCESS with *pfn = NULL and
 * the reason in symbolStatus -- and *pfn untouched when symbolStatus is NULL.
 * 32-bit v1 entry points (before 3020) are not simulated: asking for them
 * answers as for a version too old. The driver crashes on a NULL symbol; the
 * mock says CUDA_ERROR_INVALID_VALUE. */
static CUresult mock_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status, int v2) {
  const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  mock_lock();
  g_cnt.get_proc_address++;
  mock_unlock();
  if (!symbol || !pfn || (flags & ~known))
    return CUDA_ERROR_INVALID_VALUE;
  int found = 0, has_ptds = 0;
  for (size_t i = 0; i < sizeof mock_syms / sizeof *mock_syms; i++)
    if (!strcmp(mock_syms[i].base, symbol)) {
      found = 1;
      has_ptds |= mock_syms[i].ptds;
    }
  int want = has_ptds && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  const struct mock_sym *best = NULL;
  for (size_t i = 0; i < sizeof mock_syms / sizeof *mock_syms; i++) {
    const struct mock_sym *e = &mock_syms[i];
    if (!strcmp(e->base, symbol) && e->ptds == want && e->version <= version &&
        (!best || e->version > best->version))
      best = e;
  }
  mock_trace("cuGetProcAddress%s(%s, %d, %llu) -> %s", v2 ? "_v2" : "", symbol, version,
             (unsigned long long)flags, best ? best->name : "not found");
  if (best) {
    *pfn = best->fn;
    if (status)
      *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (!v2)
    return CUDA_ERROR_NOT_FOUND;
  if (status) {
    *pfn = NULL;
    *status = found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return mock_proc_address(symbol, pfn, version, flags, NULL, 0);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  return mock_proc_address(symbol, pfn, version, flags, status, 1);
}

/* ---- test queries ----------------------------------------------------- */

void mockcuda_get_counters(mockcuda_counters *out) {
  if (!out)
    return;
  mock_lock();
  *out = g_cnt;
  out->capacity_bytes = g_capacity;
  out->devices = g_ndev;
  mock_unlock();
}

void mockcuda_set_event_delay(int queries) {
  mock_lock();
  g_event_delay = queries < 0 ? -1 : queries;
  mock_unlock();
}

uint64_t mockcuda_stream_records(const void *stream) {
  mock_lock();
  uint64_t n = 0;
  if (stream == CU_STREAM_LEGACY)
    n = g_legacy.records;
  else if (mock_obj_find(stream, MOCK_OBJ_STREAM))
    n = ((const struct CUstream_st *)stream)->records;
  mock_unlock();
  return n;
}

int mockcuda_owns(uint64_t ptr, uint64_t size) {
  mock_lock();
  int r = mock_find(ptr, size, NULL) != NULL;
  mock_unlock();
  return r;
}

/* The bytes behind [ptr, ptr+n) of one live allocation, or NULL. Under the
 * lock. */
static unsigned char *mock_kernel_bytes(uint64_t ptr, uint64_t n) {
  mock_alloc *a = n ? mock_find(ptr, n, NULL) : NULL;
  return a && a->host ? a->host + (ptr - a->addr) : NULL;
}

void mockcuda_shutdown(void) {
  mock_lock();
  g_shut = 1;
  mock_unlock();
}

int mockcuda_kernel_write(uint64_t ptr, const void *src, uint64_t n) {
  mock_lock();
  unsigned char *p = mock_kernel_bytes(ptr, n);
  if (p)
    memcpy(p, src, n);
  mock_unlock();
  return p ? 0 : -1;
}

int mockcuda_kernel_read(uint64_t ptr, void *dst, uint64_t n) {
  mock_lock();
  const unsigned char *p = mock_kernel_bytes(ptr, n);
  if (p)
    memcpy(dst, p, n);
  mock_unlock();
  return p ? 0 : -1;
}
