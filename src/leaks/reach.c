/*
 * Lost or still reachable (see reach.h): the mappings to read, the pages
 * of them in memory, and a test of every word against the targets.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "leaks/reach.h"

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "support/meta.h"

/* Bytes read at once: a buffer that stays in the core's cache. */
#define CA__READ_CHUNK (512u << 10)
/* Pages asked of mincore at once. */
#define CA__WINDOW_PAGES 16384u
/* Bits of the filter that a word passes before the targets are searched. */
#define CA__FILTER_BITS (1u << 20)
#define CA__PAGE 4096u

/* ---- The targets ---------------------------------------------------------- */

/* Heapsort by lo, in place: glibc's qsort copies an array this size into a
 * malloc'd buffer, whose freed copy of the addresses the scan would then
 * find in the heap. n log n at worst. */
static void ca__sift(ca_reach_target *t, size_t at, size_t n) {
  for (;;) {
    size_t top = at, l = 2 * at + 1, r = l + 1;
    if (l < n && t[l].lo > t[top].lo)
      top = l;
    if (r < n && t[r].lo > t[top].lo)
      top = r;
    if (top == at)
      return;
    ca_reach_target x = t[at];
    t[at] = t[top];
    t[top] = x;
    at = top;
  }
}

static void ca__sort_targets(ca_reach_target *t, size_t n) {
  for (size_t i = n / 2; i-- > 0;)
    ca__sift(t, i, n);
  for (size_t end = n; end-- > 1;) {
    ca_reach_target x = t[0];
    t[0] = t[end];
    t[end] = x;
    ca__sift(t, 0, end);
  }
}

/* The sorted targets, their span, and a bitmap over the span (one bit per
 * 2^shift bytes) that most words which point nowhere near a target fail. */
typedef struct ca__finder {
  ca_reach_target *t;
  size_t n;
  uint64_t lo, span;
  unsigned shift;
  uint64_t *bits;
} ca__finder;

static bool ca__finder_init(ca__finder *f, ca_reach_target *t, size_t n) {
  ca__sort_targets(t, n);
  f->t = t;
  f->n = n;
  f->lo = t[0].lo;
  f->span = t[n - 1].hi - f->lo;
  f->shift = 12;
  while ((f->span >> f->shift) >= CA__FILTER_BITS)
    f->shift++;
  f->bits = ca_meta_alloc(CA__FILTER_BITS / 8);
  if (f->bits == NULL)
    return false;
  for (size_t i = 0; i < n; i++) {
    uint64_t first = (t[i].lo - f->lo) >> f->shift;
    uint64_t last = (t[i].hi - 1 - f->lo) >> f->shift;
    for (uint64_t b = first; b <= last; b++)
      f->bits[b / 64] |= 1ull << (b % 64);
  }
  return true;
}

/* The word passed the filter: the last target starting at or below it. */
static void ca__finder_look(ca__finder *f, uint64_t v) {
  size_t lo = 0, hi = f->n;
  while (hi - lo > 1) {
    size_t mid = (lo + hi) / 2;
    if (f->t[mid].lo <= v)
      lo = mid;
    else
      hi = mid;
  }
  const ca_reach_target *t = &f->t[lo];
  if (v >= t->lo && v < t->hi &&
      !(t->blind && v != t->lo && v % t->blind == 0))
    __atomic_store_n(&f->t[lo].found, true, __ATOMIC_RELAXED); /* threads */
}

/* Past the span test (rare), the filter; past the filter, the search. */
static void ca__test_word(ca__finder *f, uint64_t v) {
  uint64_t b = (v - f->lo) >> f->shift;
  if (f->bits[b / 64] & (1ull << (b % 64)))
    ca__finder_look(f, v);
}

/* CPython keeps an int in 30-bit digits, least significant first, from a
 * word-aligned offset: an address below 2^60 held in a Python int (ctypes
 * code keeps them so) is the word whose halves are its first two digits. */
static inline uint64_t ca__as_python_int(uint64_t w) {
  uint64_t low = w & 0xffffffffu, high = w >> 32;
  return low < (1u << 30) && high < (1u << 30) ? low | high << 30 : 0;
}

static void ca__scan_words(ca__finder *f, const uint64_t *w, size_t n) {
  const uint64_t lo = f->lo, span = f->span;
  for (size_t i = 0; i < n; i++) {
    uint64_t v = w[i], p = ca__as_python_int(v);
    /* One branch for both, almost never taken in memory that holds no
     * address near the targets'. */
    if (((v - lo < span) | (p - lo < span)) == 0)
      continue;
    if (v - lo < span)
      ca__test_word(f, v);
    if (p - lo < span)
      ca__test_word(f, p);
  }
}

/* ---- Reading memory ----------------------------------------------------- */

/* One scanning thread's: its buffers, and what it read. */
typedef struct ca__reader {
  pid_t pid;
  int mem_fd; /* /proc/self/mem, when process_vm_readv is refused */
  char *buf;  /* CA__READ_CHUNK bytes */
  unsigned char *vec; /* CA__WINDOW_PAGES, for mincore */
  uint64_t bytes;
  bool refused; /* neither way of reading works here (a sandbox) */
} ca__reader;

static bool ca__reader_init(ca__reader *r) {
  *r = (ca__reader){.pid = getpid(), .mem_fd = -1};
  r->buf = ca_meta_alloc(CA__READ_CHUNK);
  r->vec = ca_meta_alloc(CA__WINDOW_PAGES);
  return r->buf && r->vec;
}

static void ca__reader_fini(ca__reader *r) {
  if (r->mem_fd >= 0)
    close(r->mem_fd);
  ca_meta_free(r->buf, CA__READ_CHUNK);
  ca_meta_free(r->vec, CA__WINDOW_PAGES);
}

/* Reads [at, at + n) into the buffer; returns the bytes read (0 for a
 * range no longer mapped). */
static size_t ca__read(ca__reader *r, uintptr_t at, size_t n) {
  if (r->mem_fd < 0) {
    struct iovec local = {r->buf, n}, remote = {(void *)at, n};
    ssize_t got = process_vm_readv(r->pid, &local, 1, &remote, 1, 0);
    if (got >= 0)
      return (size_t)got;
    if (errno != ENOSYS && errno != EPERM)
      return 0;
    r->mem_fd = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (r->mem_fd < 0) {
      r->refused = true;
      return 0;
    }
  }
  ssize_t got = pread(r->mem_fd, r->buf, n, (off_t)at);
  return got > 0 ? (size_t)got : 0;
}

/* Scans the resident pages of [lo, hi) (page-aligned but for lo, which may
 * start inside a page: the calling thread's stack). */
static void ca__scan_range(ca__finder *f, ca__reader *r, uintptr_t lo,
                           uintptr_t hi) {
  unsigned char *vec = r->vec;
  uintptr_t page = lo & ~(uintptr_t)(CA__PAGE - 1);
  while (page < hi) {
    uintptr_t end = page + (uintptr_t)CA__WINDOW_PAGES * CA__PAGE;
    if (end > hi || end < page)
      end = hi;
    size_t pages = (end - page + CA__PAGE - 1) / CA__PAGE;
    if (mincore((void *)page, end - page, vec) != 0)
      memset(vec, 1, pages); /* not page-backed as mincore knows: read */
    for (size_t i = 0; i < pages;) {
      if (!(vec[i] & 1)) {
        i++;
        continue;
      }
      size_t j = i;
      while (j < pages && (vec[j] & 1) && (j - i) * CA__PAGE < CA__READ_CHUNK)
        j++;
      uintptr_t from = page + i * CA__PAGE, to = page + j * CA__PAGE;
      if (from < lo)
        from = lo & ~(uintptr_t)7;
      if (to > hi)
        to = hi;
      size_t got = ca__read(r, from, to - from);
      ca__scan_words(f, (const uint64_t *)(void *)r->buf, got / 8);
      r->bytes += got;
      i = j;
    }
    page = end;
  }
}

/* ---- What to scan ----------------------------------------------------------- */

/* Ranges left out, sorted: the library's own memory and data. */
typedef struct ca__skip {
  ca_meta_range *v;
  size_t n, cap;
} ca__skip;

static int ca__own_data(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  ca__skip *s = arg;
  uintptr_t me = (uintptr_t)&ca_reach_scan;
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t at = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && me >= at && me < at + ph->p_memsz)
      mine = true;
  }
  if (!mine)
    return 0;
  for (int i = 0; i < info->dlpi_phnum && s->n < s->cap; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_W))
      continue;
    uintptr_t at = info->dlpi_addr + ph->p_vaddr;
    s->v[s->n++] = (ca_meta_range){at & ~(uintptr_t)(CA__PAGE - 1),
                                   (at + ph->p_memsz + CA__PAGE - 1) &
                                       ~(uintptr_t)(CA__PAGE - 1)};
  }
  return 1;
}

static bool ca__skip_init(ca__skip *s) {
  /* Room for the regions made while this runs (this table among them). */
  s->cap = ca_meta_ranges(NULL, 0) + 64;
  s->v = ca_meta_alloc(s->cap * sizeof(*s->v));
  if (s->v == NULL)
    return false;
  s->n = ca_meta_ranges(s->v, s->cap - 8);
  if (s->n > s->cap - 8)
    s->n = s->cap - 8;
  dl_iterate_phdr(ca__own_data, s);
  for (size_t i = 1; i < s->n; i++) /* insertion sort: a few hundred */
    for (size_t j = i; j > 0 && s->v[j - 1].lo > s->v[j].lo; j--) {
      ca_meta_range x = s->v[j];
      s->v[j] = s->v[j - 1];
      s->v[j - 1] = x;
    }
  return true;
}

/* What to read, in pieces that the scanning threads share out. */
#define CA__PIECE (8u << 20)
typedef struct ca__pieces {
  ca_meta_range *v;
  size_t n, cap;
} ca__pieces;

static void ca__add_piece(ca__pieces *p, uintptr_t lo, uintptr_t hi) {
  while (lo < hi) {
    if (p->n == p->cap) {
      size_t cap = p->cap ? 2 * p->cap : 256;
      ca_meta_range *v = ca_meta_grow(p->v, p->cap * sizeof(*v), cap * sizeof(*v));
      if (v == NULL)
        return; /* out of memory: the rest goes unread */
      p->v = v;
      p->cap = cap;
    }
    uintptr_t end = hi - lo > CA__PIECE ? lo + CA__PIECE : hi;
    p->v[p->n++] = (ca_meta_range){lo, end};
    lo = end;
  }
}

/* [lo, hi) but for the skipped ranges. */
static void ca__add_kept(ca__pieces *p, const ca__skip *s, uintptr_t lo,
                         uintptr_t hi) {
  for (size_t i = 0; i < s->n && lo < hi; i++) {
    if (s->v[i].hi <= lo || s->v[i].lo >= hi)
      continue;
    if (s->v[i].lo > lo)
      ca__add_piece(p, lo, s->v[i].lo);
    lo = s->v[i].hi;
  }
  if (lo < hi)
    ca__add_piece(p, lo, hi);
}

/* /proc/self/maps, whole, NUL-terminated, in the library's memory. */
static char *ca__read_maps(size_t *cap) {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  size_t n = 0;
  *cap = 64u << 10;
  char *text = ca_meta_alloc(*cap);
  while (text) {
    ssize_t got = read(fd, text + n, *cap - 1 - n);
    if (got <= 0)
      break;
    n += (size_t)got;
    if (n == *cap - 1) {
      text = ca_meta_grow(text, n, *cap * 2);
      *cap *= 2;
    }
  }
  close(fd);
  if (text)
    text[n] = '\0';
  return text;
}

static uintptr_t ca__hex(const char **p) {
  uintptr_t v = 0;
  for (;; (*p)++) {
    char c = **p;
    unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                 : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                                        : 16u;
    if (d == 16)
      return v;
    v = v * 16 + d;
  }
}

/* Whether a mapping may hold the program's pointers: readable and writable,
 * and not a device's window (the driver's command buffers are in its
 * /dev/nvidiactl mappings, full of device addresses, and slow to read),
 * nor the kernel's pages. */
static bool ca__worth_scanning(const char *perms, const char *path) {
  if (perms[0] != 'r' || perms[1] != 'w')
    return false;
  if (strncmp(path, "/dev/", 5) == 0)
    return strncmp(path, "/dev/shm/", 9) == 0 || strncmp(path, "/dev/zero", 9) == 0;
  return strcmp(path, "[vvar]") != 0 && strcmp(path, "[vsyscall]") != 0 &&
         strcmp(path, "[vvar_vclock]") != 0;
}

bool ca_reach_mapping_scanned(const char *line, const char *end, uintptr_t *lo,
                              uintptr_t *hi) {
  const char *at = line;
  *lo = ca__hex(&at);
  if (at < end)
    at++;
  *hi = ca__hex(&at);
  char perms[5] = {0};
  if (end - at > 4 && *at == ' ')
    memcpy(perms, at + 1, 4);
  /* Four fields (perms, offset, device, inode), then the path: the rest. */
  const char *path = at;
  for (int field = 0; field < 4 && path < end; field++) {
    while (path < end && *path == ' ')
      path++;
    while (path < end && *path != ' ')
      path++;
  }
  while (path < end && *path == ' ')
    path++;
  char name[64] = {0};
  size_t len = (size_t)(end - path) < sizeof(name) - 1 ? (size_t)(end - path)
                                                       : sizeof(name) - 1;
  memcpy(name, path, len);
  return *hi > *lo && ca__worth_scanning(perms, name);
}

/* Every mapping worth it, in pieces; the one holding `stack_from` (the
 * calling thread's stack) from there up. */
static void ca__collect(ca__pieces *p, const ca__skip *s, const char *maps,
                        uintptr_t stack_from) {
  for (const char *line = maps; *line;) {
    const char *end = strchr(line, '\n');
    if (end == NULL)
      end = line + strlen(line);
    uintptr_t lo, hi;
    if (ca_reach_mapping_scanned(line, end, &lo, &hi)) {
      if (stack_from >= lo && stack_from < hi)
        lo = stack_from;
      ca__add_kept(p, s, lo, hi);
    }
    line = *end ? end + 1 : end;
  }
}

static uint64_t ca__mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- Threads ------------------------------------------------------------------ */

/* Scanning threads at most, the caller's included: one thread reads a few
 * GiB/s (3.2 on the H200's host), less than the memory can give; 8 read a
 * PyTorch process's 1.1 GiB at 8.5-9.4 GiB/s, a 16 GiB heap at 15. */
#define CA__THREADS 16

typedef struct ca__work {
  ca__finder *f;
  const ca__pieces *p;
  size_t next; /* the next piece to take (atomic) */
  uint64_t bytes; /* read by all (atomic) */
  bool refused; /* a thread could not read memory at all (atomic) */
} ca__work;

static void *ca__worker(void *arg) {
  ca__work *w = arg;
  ca__reader r;
  if (ca__reader_init(&r)) {
    size_t i;
    while (!r.refused &&
           (i = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED)) < w->p->n)
      ca__scan_range(w->f, &r, w->p->v[i].lo, w->p->v[i].hi);
  }
  __atomic_fetch_add(&w->bytes, r.bytes, __ATOMIC_RELAXED);
  if (r.refused)
    __atomic_store_n(&w->refused, true, __ATOMIC_RELAXED);
  ca__reader_fini(&r);
  return NULL;
}

/* Reads every piece with up to CA__THREADS threads (each with every signal
 * blocked: the program's go to its own threads); with fewer where they
 * cannot be made, the caller alone at worst. Returns the bytes read; false
 * in *whole when a piece went unread (memory could not be read here, or
 * no thread had the memory to try): nothing may then be called lost. */
static uint64_t ca__scan_pieces(ca__finder *f, const ca__pieces *p, bool *whole) {
  ca__work w = {.f = f, .p = p};
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  size_t want = cpus > CA__THREADS ? CA__THREADS : cpus > 1 ? (size_t)cpus : 1;
  if (want > p->n)
    want = p->n ? p->n : 1;
  pthread_t threads[CA__THREADS];
  void *stacks[CA__THREADS];
  size_t made = 0;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (made + 1 < want &&
         ca_meta_thread(&threads[made], false, ca__worker, &w, &stacks[made]) == 0)
    made++;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  ca__worker(&w);
  for (size_t i = 0; i < made; i++) {
    pthread_join(threads[i], NULL);
    ca_meta_free(stacks[i], CA_META_STACK);
  }
  *whole = !w.refused && w.next >= p->n;
  return w.bytes;
}

void ca_reach_scan(ca_reach_target *targets, size_t n,
                   const ca_reach_roots *roots, ca_reach_stats *stats) {
  uint64_t start = ca__mono_ns();
  *stats = (ca_reach_stats){0};
  for (size_t i = 0; i < n; i++)
    targets[i].found = false;
  if (n == 0) {
    stats->complete = true;
    return;
  }
  ca__finder f = {0};
  ca__skip s = {0};
  ca__pieces p = {0};
  size_t maps_cap = 0;
  char *maps = NULL;
  if (ca__finder_init(&f, targets, n) && ca__skip_init(&s) &&
      (maps = ca__read_maps(&maps_cap)) != NULL) {
    ca__collect(&p, &s, maps, roots->stack_from);
    bool whole = false;
    stats->scanned_bytes = ca__scan_pieces(&f, &p, &whole);
    ca__scan_words(&f, (const uint64_t *)roots->regs, CA_REACH_REGS);
    stats->complete = whole;
  }
  ca_meta_free(maps, maps_cap);
  ca_meta_free(s.v, s.cap * sizeof(*s.v));
  ca_meta_free(p.v, p.cap * sizeof(*p.v));
  ca_meta_free(f.bits, CA__FILTER_BITS / 8);
  stats->ns = ca__mono_ns() - start;
  if (!stats->complete)
    for (size_t i = 0; i < n; i++)
      targets[i].found = false;
}
