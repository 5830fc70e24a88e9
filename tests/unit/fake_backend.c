/*
 * The fake backend (see fake_backend.h).
 */
#include "fake_backend.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Fake device ranges start high and far apart per device, never overlapping
 * host memory a test could touch by mistake. */
#define CA__FAKE_BASE 0x7e0000000000ull
#define CA__FAKE_DEVICE_SPAN (1ull << 40)
#define CA__FAKE_ALIGN (2ull << 20)

static int ca__fake_reserve(void *ctx, int device, uint64_t size,
                            uint64_t *addr) {
  ca_fake_backend *f = ctx;
  int rc = 0;
  pthread_mutex_lock(&f->lock);
  f->reserves++;
  if (device < 0 || device >= CA_FAKE_DEVICES) {
    rc = 101; /* CUDA_ERROR_INVALID_DEVICE */
  } else if (f->fail_reserves > 0) {
    f->fail_reserves--;
    rc = f->fail_code;
  } else if (f->used[device] + size > f->capacity[device] ||
             f->nsegments == CA_FAKE_MAX_SEGMENTS) {
    rc = CA_FAKE_OOM;
  } else {
    if (f->host_backed) {
      /* 2 MiB-aligned, as the driver places segments (and as the pools'
       * address index needs to answer for them). */
      void *mem = NULL;
      if (posix_memalign(&mem, CA__FAKE_ALIGN, size) != 0)
        rc = CA_FAKE_OOM;
      *addr = (uint64_t)(uintptr_t)mem;
    } else if (f->next_reserve_at) {
      *addr = f->next_reserve_at;
      f->next_reserve_at = 0;
    } else {
      *addr = f->next_addr[device];
      f->next_addr[device] += (size + 2 * CA__FAKE_ALIGN - 1) / CA__FAKE_ALIGN *
                              CA__FAKE_ALIGN; /* leave a gap */
    }
    if (rc == 0) {
      f->used[device] += size;
      if (f->used[device] > f->peak_used[device])
        f->peak_used[device] = f->used[device];
      f->segments[f->nsegments++] = (ca_fake_segment){*addr, size, device};
    }
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

static int ca__fake_release(void *ctx, int device, uint64_t addr,
                            uint64_t size) {
  ca_fake_backend *f = ctx;
  pthread_mutex_lock(&f->lock);
  int found = -1;
  for (int i = 0; i < f->nsegments; i++)
    if (f->segments[i].addr == addr && f->segments[i].device == device)
      found = i;
  if (found < 0 || f->segments[found].size != size) {
    f->bad_releases++;
    pthread_mutex_unlock(&f->lock);
    return 1; /* CUDA_ERROR_INVALID_VALUE */
  }
  if (f->host_backed)
    free((void *)(uintptr_t)addr);
  f->used[device] -= size;
  f->segments[found] = f->segments[--f->nsegments];
  f->released_addrs[f->releases++ % CA_FAKE_MAX_SEGMENTS] = addr;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

uint64_t ca_fake_free_behind(ca_fake_backend *f, int device, uint64_t addr) {
  uint64_t size = 0;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->nsegments; i++)
    if (f->segments[i].addr == addr && f->segments[i].device == device) {
      size = f->segments[i].size;
      f->used[device] -= size;
      f->segments[i] = f->segments[--f->nsegments];
      break;
    }
  pthread_mutex_unlock(&f->lock);
  return size;
}

static int ca__fake_mem_info(void *ctx, int device, uint64_t *free_bytes,
                             uint64_t *total_bytes) {
  ca_fake_backend *f = ctx;
  pthread_mutex_lock(&f->lock);
  f->mem_infos++;
  *total_bytes = f->capacity[device];
  *free_bytes = f->capacity[device] - f->used[device];
  pthread_mutex_unlock(&f->lock);
  return 0;
}

static int ca__fake_synchronize(void *ctx, int device) {
  ca_fake_backend *f = ctx;
  (void)device;
  pthread_mutex_lock(&f->lock);
  int rc = f->refuse_sync ? 1 : 0;
  if (rc)
    f->refused_syncs++;
  else
    f->syncs++;
  pthread_mutex_unlock(&f->lock);
  return rc;
}

static int ca__fake_mark(void *ctx, int device, uint64_t *marker) {
  ca_fake_backend *f = ctx;
  (void)device;
  pthread_mutex_lock(&f->lock);
  int rc = f->refuse_sync ? 1 : 0;
  if (rc) {
    f->refused_marks++;
  } else {
    *marker = (uint64_t)++f->marks;
    if (f->auto_pass)
      f->passed = *marker;
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

/* A marker on one stream: numbered with the others, so the same clock
 * passes it. */
static int ca__fake_mark_on(void *ctx, int device, uint64_t stream,
                            uint64_t *marker) {
  ca_fake_backend *f = ctx;
  int rc = ca__fake_mark(ctx, device, marker);
  if (rc == 0) {
    pthread_mutex_lock(&f->lock);
    f->marks_on++;
    f->last_mark_stream = stream;
    pthread_mutex_unlock(&f->lock);
  }
  return rc;
}

static int ca__fake_poll(void *ctx, int device, uint64_t marker) {
  ca_fake_backend *f = ctx;
  (void)device;
  pthread_mutex_lock(&f->lock);
  f->polls++;
  int rc = f->passed >= marker ? 0 : 1;
  pthread_mutex_unlock(&f->lock);
  return rc;
}

int ca_fake_fence(void *ctx, int device) {
  ca_fake_backend *f = ctx;
  (void)device;
  pthread_mutex_lock(&f->lock);
  int rc = f->refuse_sync ? 1 : 0;
  if (rc)
    f->refused_fences++;
  else
    f->fences++;
  pthread_mutex_unlock(&f->lock);
  return rc;
}

/* Waiting is what makes the device reach the marker, in this model. */
static int ca__fake_wait(void *ctx, int device, uint64_t marker) {
  ca_fake_backend *f = ctx;
  (void)device;
  pthread_mutex_lock(&f->lock);
  int rc = f->refuse_sync ? 1 : 0;
  if (!rc) {
    f->waits++;
    if (f->passed < marker)
      f->passed = marker;
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

static void ca__fake_forget(void *ctx, int device, uint64_t marker) {
  ca_fake_backend *f = ctx;
  (void)device;
  (void)marker;
  pthread_mutex_lock(&f->lock);
  f->forgets++;
  pthread_mutex_unlock(&f->lock);
}

static int ca__fake_fill(void *ctx, int device, uint64_t addr, uint64_t width,
                         uint64_t rows, uint64_t pitch, unsigned char byte,
                         const uint64_t *stream) {
  ca_fake_backend *f = ctx;
  (void)device;
  (void)stream;
  if (f->refuse_fills)
    return 1;
  for (uint64_t r = 0; r < rows; r++)
    memset((void *)(uintptr_t)(addr + r * pitch), byte, (size_t)width);
  pthread_mutex_lock(&f->lock);
  f->fills++;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

/* Whether n bytes at p all hold `expect`. */
static bool ca__fake_all(const unsigned char *p, uint64_t n, unsigned char expect) {
  for (uint64_t i = 0; i < n; i++)
    if (p[i] != expect)
      return false;
  return true;
}

/* As the CUDA backend's kernel does: a set whose bytes all hold `expect`
 * is not copied. */
static int ca__fake_fetch(void *ctx, int device, const ca_backend_rows *sets,
                          size_t n, unsigned char expect,
                          const uint64_t *stream, size_t *started) {
  ca_fake_backend *f = ctx;
  (void)device;
  (void)stream;
  size_t k = f->fetch_cap == 0 ? n
             : f->fetch_cap < 0 ? 0
             : n < (size_t)f->fetch_cap ? n : (size_t)f->fetch_cap;
  int copies = 0;
  for (size_t i = 0; i < k; i++) {
    const ca_backend_rows *s = &sets[i];
    bool all = true;
    for (uint64_t r = 0; r < s->rows && all; r++)
      all = ca__fake_all((const unsigned char *)(uintptr_t)(s->addr + r * s->pitch),
                         s->width, expect);
    for (uint64_t r = 0; r < s->rows && !all; r++)
      memcpy((char *)s->host + r * s->width,
             (const void *)(uintptr_t)(s->addr + r * s->pitch), (size_t)s->width);
    *s->copied = !all;
    copies += !all;
  }
  pthread_mutex_lock(&f->lock);
  f->fetches += (int)k;
  f->fetch_calls++;
  f->fetch_copies += copies;
  pthread_mutex_unlock(&f->lock);
  *started = k;
  return k == n ? 0 : 1;
}

/* Kept for the process's life, as the contract says. */
static void *ca__fake_host_alloc(void *ctx, int device, uint64_t size) {
  (void)ctx;
  (void)device;
  return calloc(1, (size_t)size);
}

void ca_fake_enable_bytes(ca_fake_backend *f) {
  f->backend.fill = ca__fake_fill;
  f->backend.fetch = ca__fake_fetch;
  f->backend.host_alloc = ca__fake_host_alloc;
}

void ca_fake_init(ca_fake_backend *f, uint64_t capacity, bool with_sync,
                  bool host_backed) {
  memset(f, 0, sizeof(*f));
  pthread_mutex_init(&f->lock, NULL);
  f->host_backed = host_backed;
  for (int d = 0; d < CA_FAKE_DEVICES; d++) {
    f->capacity[d] = capacity;
    f->next_addr[d] = CA__FAKE_BASE + (uint64_t)d * CA__FAKE_DEVICE_SPAN;
  }
  f->backend.ctx = f;
  f->backend.oom_code = CA_FAKE_OOM;
  f->backend.reserve = ca__fake_reserve;
  f->backend.release = ca__fake_release;
  f->backend.mem_info = ca__fake_mem_info;
  f->backend.synchronize = with_sync ? ca__fake_synchronize : NULL;
  f->backend.mark = with_sync ? ca__fake_mark : NULL;
  f->backend.mark_on = with_sync ? ca__fake_mark_on : NULL;
  f->backend.poll = with_sync ? ca__fake_poll : NULL;
  f->backend.wait = with_sync ? ca__fake_wait : NULL;
  f->backend.forget = with_sync ? ca__fake_forget : NULL;
  f->auto_pass = true;
}

void ca_fake_fini(ca_fake_backend *f) {
  if (f->host_backed)
    for (int i = 0; i < f->nsegments; i++)
      free((void *)(uintptr_t)f->segments[i].addr);
  f->nsegments = 0;
  for (int i = 0; i < f->nranges; i++) {
    free(f->ranges[i].mapped);
    if (f->ranges[i].host)
      munmap(f->ranges[i].host, f->ranges[i].host_len);
  }
  f->nranges = 0;
  pthread_mutex_destroy(&f->lock);
}

static ca_fake_range *ca__fake_range_at(ca_fake_backend *f, int device,
                                        uint64_t addr, uint64_t size);
static bool ca__fake_pages_are(const ca_fake_range *r, uint64_t addr,
                               uint64_t size, unsigned char state);

bool ca_fake_owns(ca_fake_backend *f, int device, uint64_t addr,
                  uint64_t size) {
  bool owned = false;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->nsegments && !owned; i++) {
    const ca_fake_segment *s = &f->segments[i];
    owned = s->device == device && addr >= s->addr &&
            addr + size <= s->addr + s->size;
  }
  uint64_t lo = addr & ~(CA_FAKE_PAGE - 1);
  ca_fake_range *r = owned ? NULL : ca__fake_range_at(f, device, addr, size);
  owned = owned || (r && ca__fake_pages_are(r, lo, addr + size - lo, 1));
  pthread_mutex_unlock(&f->lock);
  return owned;
}

/* ---- Address ranges ------------------------------------------------------ */

/* The range of `device` holding [addr, addr + size) whole, or NULL. */
static ca_fake_range *ca__fake_range_at(ca_fake_backend *f, int device,
                                        uint64_t addr, uint64_t size) {
  for (int i = 0; i < f->nranges; i++) {
    ca_fake_range *r = &f->ranges[i];
    if (r->device == device && addr >= r->addr &&
        addr + size <= r->addr + r->size)
      return r;
  }
  return NULL;
}

/* Whether pages [addr, addr + size) of r are all `state` (size > 0). */
static bool ca__fake_pages_are(const ca_fake_range *r, uint64_t addr,
                               uint64_t size, unsigned char state) {
  for (uint64_t at = addr; at < addr + size; at += CA_FAKE_PAGE)
    if (r->mapped[(at - r->addr) / CA_FAKE_PAGE] != state)
      return false;
  return size > 0;
}

static void ca__fake_pages_set(ca_fake_range *r, uint64_t addr, uint64_t size,
                               unsigned char state) {
  for (uint64_t at = addr; at < addr + size; at += CA_FAKE_PAGE)
    r->mapped[(at - r->addr) / CA_FAKE_PAGE] = state;
}

static int ca__fake_va_reserve(void *ctx, int device, uint64_t size,
                               uint64_t *addr) {
  ca_fake_backend *f = ctx;
  int rc = 0;
  void *m = NULL;
  pthread_mutex_lock(&f->lock);
  f->va_reserves++;
  unsigned char *pages = calloc(size / CA_FAKE_PAGE + 1, 1);
  if (f->busy_maps) {
    rc = CA_BACKEND_BUSY;
  } else if (f->fail_maps > 0) {
    f->fail_maps--;
    rc = f->fail_code;
  } else if (!pages || size % CA_FAKE_PAGE ||
             f->nranges == CA_FAKE_MAX_RANGES || device < 0 ||
             device >= CA_FAKE_DEVICES) {
    rc = 1; /* CUDA_ERROR_INVALID_VALUE */
  } else if (f->host_backed) {
    m = mmap(NULL, size + CA_FAKE_PAGE, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    rc = m == MAP_FAILED ? CA_FAKE_OOM : 0;
    *addr = ((uint64_t)(uintptr_t)m + CA_FAKE_PAGE - 1) & ~(CA_FAKE_PAGE - 1);
  } else {
    *addr = f->next_addr[device];
    f->next_addr[device] += size + CA__FAKE_ALIGN; /* leave a gap */
  }
  if (rc == 0) {
    f->ranges[f->nranges++] = (ca_fake_range){
        *addr, size, device, pages, m, m ? size + CA_FAKE_PAGE : 0};
    pages = NULL;
  }
  free(pages);
  pthread_mutex_unlock(&f->lock);
  return rc;
}

static int ca__fake_va_release(void *ctx, int device, uint64_t addr,
                               uint64_t size) {
  ca_fake_backend *f = ctx;
  int rc = 1;
  pthread_mutex_lock(&f->lock);
  f->va_releases++;
  for (int i = 0; i < f->nranges; i++) {
    ca_fake_range *r = &f->ranges[i];
    if (r->device != device || r->addr != addr || r->size != size ||
        !ca__fake_pages_are(r, addr, size, 0))
      continue;
    free(r->mapped);
    if (r->host)
      munmap(r->host, r->host_len);
    *r = f->ranges[--f->nranges];
    rc = 0;
    break;
  }
  if (rc)
    f->bad_releases++;
  pthread_mutex_unlock(&f->lock);
  return rc;
}

static int ca__fake_map(void *ctx, int device, uint64_t addr, uint64_t size) {
  ca_fake_backend *f = ctx;
  int rc = 0;
  pthread_mutex_lock(&f->lock);
  f->maps++;
  ca_fake_range *r = ca__fake_range_at(f, device, addr, size);
  if (f->busy_maps) {
    rc = CA_BACKEND_BUSY;
  } else if (f->fail_maps > 0) {
    f->fail_maps--;
    rc = f->fail_code;
  } else if (!r || addr % CA_FAKE_PAGE || size % CA_FAKE_PAGE ||
             !ca__fake_pages_are(r, addr, size, 0)) {
    f->bad_maps++;
    rc = 1;
  } else if (f->used[device] + size > f->capacity[device]) {
    rc = CA_FAKE_OOM;
  } else if (f->host_backed &&
             mprotect((void *)(uintptr_t)addr, size, PROT_READ | PROT_WRITE)) {
    rc = CA_FAKE_OOM;
  }
  if (rc == 0) {
    ca__fake_pages_set(r, addr, size, 1);
    f->used[device] += size;
    f->mapped_now += size;
    f->mapped_total += size;
    if (f->used[device] > f->peak_used[device])
      f->peak_used[device] = f->used[device];
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

static int ca__fake_unmap(void *ctx, int device, uint64_t addr,
                          uint64_t size) {
  ca_fake_backend *f = ctx;
  int rc = 0;
  pthread_mutex_lock(&f->lock);
  f->unmaps++;
  ca_fake_range *r = ca__fake_range_at(f, device, addr, size);
  if (!r || addr % CA_FAKE_PAGE || size % CA_FAKE_PAGE ||
      !ca__fake_pages_are(r, addr, size, 1)) {
    f->bad_maps++;
    rc = 1;
  } else {
    if (f->host_backed) { /* the bytes go with the memory */
      madvise((void *)(uintptr_t)addr, size, MADV_DONTNEED);
      mprotect((void *)(uintptr_t)addr, size, PROT_NONE);
    }
    ca__fake_pages_set(r, addr, size, 0);
    f->used[device] -= size;
    f->mapped_now -= size;
  }
  pthread_mutex_unlock(&f->lock);
  return rc;
}

void ca_fake_enable_ranges(ca_fake_backend *f) {
  f->backend.page = CA_FAKE_PAGE;
  f->backend.va_reserve = ca__fake_va_reserve;
  f->backend.va_release = ca__fake_va_release;
  f->backend.map = ca__fake_map;
  f->backend.unmap = ca__fake_unmap;
}
