/*
 * The library's own memory (see meta.h): power-of-two classes carved from
 * mmap'd regions, each region on one list the scan can read.
 */
#include "support/meta.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "support/fork.h"
#include "support/lock.h"

#define CA__META_MIN_SHIFT 6   /* 64 B */
#define CA__META_MAX_SHIFT 16  /* 64 KiB */
#define CA__META_CLASSES (CA__META_MAX_SHIFT - CA__META_MIN_SHIFT + 1)
#define CA__META_REGION (1u << 20)
/* A region starts with its header, padded to the largest alignment any
 * class needs from the start of a carved region (its first object). */
#define CA__META_HEADER 64u

typedef struct ca__region {
  struct ca__region *next, *prev;
  size_t bytes; /* the whole mapping, header included */
} ca__region;

_Static_assert(sizeof(ca__region) <= CA__META_HEADER, "header fits");

static ca_lock ca__meta_lock = CA_LOCK_INIT;
static ca__region *ca__regions;
static size_t ca__nregions;
static void *ca__free_lists[CA__META_CLASSES];
/* The unused end of the newest carved region. */
static char *ca__carve, *ca__carve_end;

static void ca__meta_prepare(void) { ca_lock_acquire(&ca__meta_lock); }
static void ca__meta_release(void) { ca_lock_release(&ca__meta_lock); }
static const ca_fork_handlers ca__meta_fork = {
    ca__meta_prepare, ca__meta_release, ca__meta_release};

static unsigned ca__meta_class(size_t bytes) {
  unsigned shift = CA__META_MIN_SHIFT;
  while (((size_t)1 << shift) < bytes)
    shift++;
  return shift - CA__META_MIN_SHIFT;
}

/* Under the lock: a new mapping of `bytes`, on the list. */
static ca__region *ca__region_map(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  ca__region *r = p;
  r->bytes = bytes;
  r->prev = NULL;
  r->next = ca__regions;
  if (ca__regions)
    ca__regions->prev = r;
  ca__regions = r;
  ca__nregions++;
  return r;
}

/* Under the lock: one object of class c, from its free list or carved from
 * the newest region at the next multiple of its size (regions are
 * page-aligned, so the object is aligned to its size). */
static void *ca__take(unsigned c) {
  size_t size = (size_t)1 << (c + CA__META_MIN_SHIFT);
  if (ca__free_lists[c]) {
    void *p = ca__free_lists[c];
    ca__free_lists[c] = *(void **)p;
    return memset(p, 0, size);
  }
  uintptr_t at = ((uintptr_t)ca__carve + size - 1) & ~(uintptr_t)(size - 1);
  if (ca__carve == NULL || at + size > (uintptr_t)ca__carve_end) {
    ca__region *r = ca__region_map(CA__META_REGION);
    if (r == NULL)
      return NULL;
    ca__carve = (char *)r + CA__META_HEADER;
    ca__carve_end = (char *)r + CA__META_REGION;
    at = ((uintptr_t)ca__carve + size - 1) & ~(uintptr_t)(size - 1);
  }
  ca__carve = (char *)(at + size);
  return (void *)at; /* fresh mmap'd memory is zero */
}

void *ca_meta_alloc(size_t bytes) {
  ca_fork_register(CA_FORK_META, &ca__meta_fork);
  void *p = NULL;
  ca_lock_acquire(&ca__meta_lock);
  if (bytes <= ((size_t)1 << CA__META_MAX_SHIFT)) {
    p = ca__take(ca__meta_class(bytes));
  } else {
    size_t page = 4096, whole = (bytes + CA__META_HEADER + page - 1) / page * page;
    ca__region *r = ca__region_map(whole);
    p = r ? (char *)r + CA__META_HEADER : NULL;
  }
  ca_lock_release(&ca__meta_lock);
  return p;
}

void ca_meta_free(void *p, size_t bytes) {
  if (p == NULL)
    return;
  ca_lock_acquire(&ca__meta_lock);
  if (bytes <= ((size_t)1 << CA__META_MAX_SHIFT)) {
    unsigned c = ca__meta_class(bytes);
    *(void **)p = ca__free_lists[c];
    ca__free_lists[c] = p;
    ca_lock_release(&ca__meta_lock);
    return;
  }
  ca__region *r = (ca__region *)((char *)p - CA__META_HEADER);
  if (r->prev)
    r->prev->next = r->next;
  else
    ca__regions = r->next;
  if (r->next)
    r->next->prev = r->prev;
  ca__nregions--;
  ca_lock_release(&ca__meta_lock);
  munmap(r, r->bytes);
}

void *ca_meta_grow(void *p, size_t old, size_t bytes) {
  void *q = ca_meta_alloc(bytes);
  if (q == NULL)
    return NULL;
  if (p != NULL)
    memcpy(q, p, old);
  ca_meta_free(p, old);
  return q;
}

size_t ca_meta_ranges(ca_meta_range *out, size_t max) {
  ca_lock_acquire(&ca__meta_lock);
  size_t i = 0;
  for (ca__region *r = ca__regions; r; r = r->next, i++)
    if (i < max)
      out[i] = (ca_meta_range){(uintptr_t)r, (uintptr_t)r + r->bytes};
  size_t n = ca__nregions;
  ca_lock_release(&ca__meta_lock);
  return n;
}

int ca_meta_thread(pthread_t *thread, bool detached, void *(*fn)(void *),
                   void *arg, void **stack) {
  *stack = ca_meta_alloc(CA_META_STACK);
  if (*stack == NULL)
    return ENOMEM;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, *stack, CA_META_STACK);
  if (detached)
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(thread, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    ca_meta_free(*stack, CA_META_STACK);
    *stack = NULL;
  }
  return rc;
}
