/*
 * The leak scan's own pieces (reach.h, meta.h): which /proc/self/maps lines
 * it reads, the library's memory it leaves out, and a scan of this process
 * finding what it holds and not what it dropped.
 */
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "support/meta.h"
#include "leaks/reach.h"

static bool scanned(const char *line, uintptr_t *lo, uintptr_t *hi) {
  return ca_reach_mapping_scanned(line, line + strlen(line), lo, hi);
}

/* Writable memory is read: heap, stacks, anonymous, data of objects, shared
 * memory files; device files (the driver's command buffers), read-only
 * mappings and the kernel's pages are not. */
static void reads_writable_host_memory_only(void **state) {
  (void)state;
  struct {
    const char *line;
    bool read;
  } cases[] = {
      {"557b3eada000-557b4062b000 rw-p 00000000 00:00 0          [heap]", true},
      {"7ffc4220a000-7ffc4222b000 rw-p 00000000 00:00 0          [stack]", true},
      {"7f3e80000000-7f3e80021000 rw-p 00000000 00:00 0 ", true},
      {"7f3e80000000-7f3e80021000 rw-p 00000000 00:00 0", true},
      {"7f12ab200000-7f12ab204000 rw-p 001f0000 fe:00 1234   /usr/lib/libc.so.6", true},
      {"7f12ab200000-7f12ab204000 rw-p 00000000 fe:00 99   /tmp/my lib.so", true},
      {"7f0000000000-7f0000100000 rw-s 00000000 00:1a 7   /dev/shm/torch_1_2", true},
      {"7f0000000000-7f0000100000 rw-s 00000000 00:01 9   /dev/zero (deleted)", true},
      {"200800000-204000000 rw-s 00000000 00:06 142      /dev/nvidiactl", false},
      {"7f5400000000-7f5402000000 rw-s 00000000 00:06 143  /dev/nvidia0", false},
      {"7f5400000000-7f5402000000 rw-s 00000000 00:06 144  /dev/nvidia-uvm", false},
      {"7f12ab000000-7f12ab1f0000 r-xp 00000000 fe:00 1234   /usr/lib/libc.so.6", false},
      {"7f12ab1f0000-7f12ab200000 r--p 001e0000 fe:00 1234   /usr/lib/libc.so.6", false},
      {"7ffc42300000-7ffc42304000 r--p 00000000 00:00 0      [vvar]", false},
      {"7f3e80021000-7f3e84000000 ---p 00000000 00:00 0 ", false},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uintptr_t lo = 0, hi = 0;
    if (scanned(cases[i].line, &lo, &hi) != cases[i].read)
      fail_msg("'%s': read %d, want %d", cases[i].line, !cases[i].read, cases[i].read);
  }
  uintptr_t lo, hi;
  scanned("200800000-204000000 rw-s 00000000 00:06 142 /dev/nvidiactl", &lo, &hi);
  assert_int_equal(lo, 0x200800000u);
  assert_int_equal(hi, 0x204000000u);
}

/* Memory of every size class and beyond comes zeroed, aligned to its class
 * (64 B at least), inside a range the scan leaves out; freed, it serves the
 * next request of its class; a large region leaves the list when freed. */
static void meta_memory_is_the_librarys_own(void **state) {
  (void)state;
  size_t sizes[] = {1, 64, 100, 4096, 65536, 65537, 1u << 20};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    unsigned char *p = ca_meta_alloc(sizes[i]);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    for (size_t k = 0; k < sizes[i]; k++)
      assert_int_equal(p[k], 0);
    memset(p, 0xab, sizes[i]);
    ca_meta_range r[4096];
    size_t n = ca_meta_ranges(r, 4096), inside = 0;
    for (size_t k = 0; k < n && k < 4096; k++)
      inside += (uintptr_t)p >= r[k].lo && (uintptr_t)p + sizes[i] <= r[k].hi;
    assert_int_equal(inside, 1);
    ca_meta_free(p, sizes[i]);
    if (sizes[i] <= 65536) {
      unsigned char *q = ca_meta_alloc(sizes[i]);
      assert_ptr_equal(q, p);
      assert_int_equal(q[sizes[i] - 1], 0); /* zeroed again */
      ca_meta_free(q, sizes[i]);
    }
  }
  size_t before = ca_meta_ranges(NULL, 0);
  void *big = ca_meta_alloc(3u << 20);
  assert_int_equal(ca_meta_ranges(NULL, 0), before + 1);
  ca_meta_free(big, 3u << 20);
  assert_int_equal(ca_meta_ranges(NULL, 0), before);
}

/* Stands for device allocations: a range of address space no host memory
 * of this process lies in. (The library is linked into this program, so
 * its globals are the library's own, left out: the held addresses are on
 * the stack, above the entry, and in the heap.) */

static __attribute__((noinline)) void scan_now(ca_reach_target *t, size_t n,
                                               ca_reach_stats *st) {
  ca_reach_roots roots;
  CA_REACH_ROOTS_HERE(&roots);
  ca_reach_scan(t, n, &roots, st);
}

/* Scans for the n targets, which must complete, and sets found[k] for the
 * target of index k. */
static ca_reach_stats scan_found(ca_reach_target *t, size_t n, bool *found) {
  ca_reach_stats st;
  scan_now(t, n, &st);
  assert_true(st.complete);
  for (size_t i = 0; i < n; i++)
    found[t[i].index] = t[i].found;
  return st;
}

static void scan_finds_held_addresses_only(void **state) {
  (void)state;
  const uint64_t base = 0x7e0000000000ull, mib = 1u << 20;
  ca_reach_target *t = ca_meta_alloc(4 * sizeof(*t));
  for (size_t i = 0; i < 4; i++)
    t[i] = (ca_reach_target){.lo = base + i * mib, .hi = base + (i + 1) * mib, .index = i};
  volatile uint64_t on_stack = base + 0 * mib; /* block 0 */
  volatile uint64_t *heap = malloc(sizeof(*heap));
  *heap = base + 2 * mib + 4096;        /* the heap, inside block 2 */
  bool found[4] = {false};
  assert_true(scan_found(t, 4, found).scanned_bytes > 0);
  assert_true(found[0]);
  assert_false(found[1]);
  assert_true(found[2]);
  assert_false(found[3]);
  free((void *)heap);
  ca_meta_free(t, 4 * sizeof(*t));
  (void)on_stack;
}

/* The driver keeps the start of every mapped page: inside a block of an
 * expandable segment such a word is the driver's, not the program's, and
 * does not make the block reachable; any other word into it does, and so
 * does the block's own start. */
static void page_starts_inside_a_block_do_not_count(void **state) {
  (void)state;
  const uint64_t base = 0x7e4000000000ull, page = 2u << 20;
  ca_reach_target *t = ca_meta_alloc(3 * sizeof(*t));
  for (size_t i = 0; i < 3; i++) /* blocks of two and a half pages */
    t[i] = (ca_reach_target){.lo = base + i * 8 * page + 512,
                             .hi = base + i * 8 * page + 5 * page / 2,
                             .blind = page, .index = i};
  volatile uint64_t *heap = malloc(3 * sizeof(*heap));
  heap[0] = base + page;                    /* block 0: a page's start */
  heap[1] = base + 8 * page + page + 64;    /* block 1: inside a page */
  heap[2] = base + 16 * page + 512;         /* block 2: its own start */
  bool found[3] = {false};
  scan_found(t, 3, found);
  assert_false(found[0]);
  assert_true(found[1]);
  assert_true(found[2]);
  free((void *)heap);
  ca_meta_free(t, 3 * sizeof(*t));
}

/* A thread that holds `held` in its frame until told to go. */
typedef struct holder {
  uint64_t held;
  sem_t ready, go;
} holder;

static void *hold(void *arg) {
  holder *h = arg;
  volatile uint64_t mine = h->held;
  h->held = 0; /* in the frame alone */
  sem_post(&h->ready);
  sem_wait(&h->go);
  (void)mine;
  return NULL;
}

/* The library's threads hold in their frames the addresses they last
 * worked on (a trace's events, a scan's words); the C library keeps a dead
 * thread's stack for the next. A program's thread counts; a thread of the
 * library's, started by ca_meta_thread, does not. */
static void the_librarys_threads_hold_nothing(void **state) {
  (void)state;
  const uint64_t base = 0x7e8000000000ull, mib = 1u << 20;
  ca_reach_target *t = ca_meta_alloc(2 * sizeof(*t));
  holder h[2] = {{.held = base + 64}, {.held = base + mib + 64}};
  pthread_t threads[2];
  void *stack = NULL;
  for (size_t i = 0; i < 2; i++) {
    t[i] = (ca_reach_target){.lo = base + i * mib, .hi = base + i * mib + 4096, .index = i};
    sem_init(&h[i].ready, 0, 0);
    sem_init(&h[i].go, 0, 0);
  }
  assert_int_equal(pthread_create(&threads[0], NULL, hold, &h[0]), 0);
  assert_int_equal(ca_meta_thread(&threads[1], false, hold, &h[1], &stack), 0);
  for (size_t i = 0; i < 2; i++)
    sem_wait(&h[i].ready);
  bool found[2] = {false};
  scan_found(t, 2, found);
  assert_true(found[0]);  /* the program's thread */
  assert_false(found[1]); /* the library's */
  for (size_t i = 0; i < 2; i++) {
    sem_post(&h[i].go);
    pthread_join(threads[i], NULL);
  }
  ca_meta_free(stack, CA_META_STACK);
  ca_meta_free(t, 2 * sizeof(*t));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(reads_writable_host_memory_only),
      cmocka_unit_test(meta_memory_is_the_librarys_own),
      cmocka_unit_test(scan_finds_held_addresses_only),
      cmocka_unit_test(page_starts_inside_a_block_do_not_count),
      cmocka_unit_test(the_librarys_threads_hold_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
