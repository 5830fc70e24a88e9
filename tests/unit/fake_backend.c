/*
 * The fake backend (see fake_backend.h).
 */
#include "fake_backend.h"

#include <stdlib.h>
#include <string.h>

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
      void *mem = malloc(size);
      if (!mem)
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
  pthread_mutex_destroy(&f->lock);
}

bool ca_fake_owns(ca_fake_backend *f, int device, uint64_t addr,
                  uint64_t size) {
  bool owned = false;
  pthread_mutex_lock(&f->lock);
  for (int i = 0; i < f->nsegments && !owned; i++) {
    const ca_fake_segment *s = &f->segments[i];
    owned = s->device == device && addr >= s->addr &&
            addr + size <= s->addr + s->size;
  }
  pthread_mutex_unlock(&f->lock);
  return owned;
}
