/*
 * The caching unwinder against libgcc's _Unwind_Backtrace, frame for frame.
 *
 * Every comparison is made between captures taken from one call instruction
 * (take_shots calls each capture function through the same indirect call),
 * so even the innermost return address must match. The call chains mix
 * three kinds of frame: plain frames without a frame pointer (this file is
 * built with -O2 -fomit-frame-pointer), frames that need RBP as a frame
 * pointer (a variable-length array), and frames of 16 KiB. On x86-64 each
 * check also makes sure the fast path itself took the capture, since a
 * fallback to libgcc would agree with libgcc trivially.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "unwind/unwind.h"

/* libgcc's unwinder, declared here: <unwind.h> would find src/unwind.h,
 * which comes first on the include path. */
struct _Unwind_Context;
typedef int (*unwind_trace_fn)(struct _Unwind_Context *ctx, void *arg);
int _Unwind_Backtrace(unwind_trace_fn trace, void *arg);
uintptr_t _Unwind_GetIP(struct _Unwind_Context *ctx);
#define URC_NO_REASON 0
#define URC_END_OF_STACK 5

#define NOINLINE __attribute__((noinline))
#define MAX_FRAMES 64
#define DEPTH 30
/* A return address this close after a function's entry (unsigned: and not
 * before it) is taken to lie inside it; sanitizers make functions long. */
#define FUNCTION_SPAN 2048

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#if !defined(SANITIZED) &&                                                     \
    (defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__))
#define SANITIZED 1
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#if defined(__x86_64__)
#define FAST_PATH 1
#else
#define FAST_PATH 0
#endif

/* ---- Captures from one call site ---------------------------------------- */

typedef size_t (*capture_fn)(uintptr_t *pcs, size_t max, size_t skip);

typedef struct shot {
  capture_fn fn; /* NULL: ca_unwind_outside_self */
  size_t max, skip, n;
  uintptr_t pcs[MAX_FRAMES];
} shot;

typedef struct roll {
  shot *shots;
  int count;
} roll;

/* _Unwind_Backtrace as it is, minus its first frame (raw_unwind's) and the
 * frame of pc 0 with which libgcc reports the end of the stack. */
typedef struct raw_state {
  uintptr_t *pcs;
  size_t max, skip, n;
  int own;
} raw_state;

static int raw_frame(struct _Unwind_Context *ctx, void *arg) {
  raw_state *r = arg;
  uintptr_t pc = _Unwind_GetIP(ctx);
  if (r->own-- > 0)
    return URC_NO_REASON;
  if (pc == 0)
    return URC_END_OF_STACK;
  if (r->skip > 0) {
    r->skip--;
    return URC_NO_REASON;
  }
  r->pcs[r->n++] = pc;
  return r->n < r->max ? URC_NO_REASON : URC_END_OF_STACK;
}

NOINLINE static size_t raw_unwind(uintptr_t *pcs, size_t max, size_t skip) {
  raw_state r = {pcs, max, skip, 0, 1};
  if (max == 0)
    return 0;
  _Unwind_Backtrace(raw_frame, &r);
  return r.n;
}

/* One call instruction for every capture: the loop's trip count is read
 * through a volatile, so the compiler cannot unroll it into several. */
NOINLINE static void take_shots(roll *r) {
  volatile int *count = &r->count;
  for (int i = 0; i < *count; i++) {
    shot *s = &r->shots[i];
    s->n = s->fn != NULL ? s->fn(s->pcs, s->max, s->skip)
                         : ca_unwind_outside_self(s->pcs, s->max);
  }
}

/* ---- The call chain ----------------------------------------------------- */

static inline __attribute__((always_inline)) int chain(int depth, roll *r);

/* Each link uses its callee's result, so no call is a tail call. */
NOINLINE static int plain_link(int depth, roll *r) {
  int v = chain(depth - 1, r);
  __asm__ volatile("" : "+r"(v));
  return v + 1;
}

NOINLINE static int vla_link(int depth, roll *r) {
  volatile char buf[depth + 8]; /* needs RBP as frame pointer */
  buf[depth] = (char)depth;
  int v = chain(depth - 1, r);
  return v + buf[depth];
}

NOINLINE static int big_link(int depth, roll *r) {
  volatile char buf[16384];
  buf[depth * 100] = 1;
  int v = chain(depth - 1, r);
  return v + buf[depth * 100];
}

/* Inlined into each link, so that every depth is exactly one frame. */
static inline __attribute__((always_inline)) int chain(int depth, roll *r) {
  if (depth < 0) {
    take_shots(r);
    return 0;
  }
  switch (depth % 3) {
  case 0:
    return plain_link(depth, r);
  case 1:
    return vla_link(depth, r);
  default:
    return big_link(depth, r);
  }
}

/* Frames from a capture to the caller of chain(depth): take_shots, then one
 * link per depth from 0 to depth. */
#define CHAIN_FRAMES(depth) ((size_t)(depth) + 2)

/* ---- Checks ------------------------------------------------------------- */

static shot *make_shots(const capture_fn *fns, int count, size_t max,
                        size_t skip) {
  shot *shots = calloc((size_t)count, sizeof(shot));
  assert_non_null(shots);
  for (int i = 0; i < count; i++)
    shots[i] = (shot){.fn = fns[i], .max = max, .skip = skip};
  return shots;
}

static void assert_same_frames(const shot *a, const shot *b) {
  assert_int_equal(a->n, b->n);
  for (size_t i = 0; i < a->n; i++)
    if (a->pcs[i] != b->pcs[i])
      fail_msg("frame %zu of %zu differs: %#lx against %#lx", i, a->n,
               (unsigned long)a->pcs[i], (unsigned long)b->pcs[i]);
}

/* The fast path took the capture (where there is one). */
static void assert_fast(const shot *s) {
  if (FAST_PATH && s->n == CA_UNWIND_NOT_FAST)
    fail_msg("the fast path fell back to libgcc");
}

static const char *object_of(uintptr_t pc) {
  Dl_info info;
  if (dladdr((void *)(pc - 1), &info) == 0 || info.dli_fname == NULL)
    return "";
  return info.dli_fname;
}

static void *object_base(uintptr_t pc) {
  Dl_info info;
  return dladdr((void *)(pc - 1), &info) != 0 ? info.dli_fbase : NULL;
}

static const capture_fn all_paths[] = {ca_unwind_fast, ca_unwind,
                                       ca_unwind_libgcc, raw_unwind};
#define ALL_PATHS 4

/* Fast path, the public entry, libgcc through ca_unwind, and libgcc raw:
 * the same frames. Returns the shots for more checks. */
static shot *capture_all_ways(int depth, size_t max, size_t skip) {
  shot *shots = make_shots(all_paths, ALL_PATHS, max, skip);
  roll r = {shots, ALL_PATHS};
  chain(depth, &r);
  assert_fast(&shots[0]);
  for (int i = 1; i < ALL_PATHS; i++)
    assert_same_frames(&shots[0], &shots[i]);
  return shots;
}

/* ---- Tests -------------------------------------------------------------- */

/* Threads ------------------------------------------------------------------ */

#define THREADS 8
#define THREAD_ROUNDS 200

typedef struct worker {
  pthread_barrier_t *start;
  shot shots[2]; /* fast, libgcc */
  shot first;
  int failures;
} worker;

/* Frames every round of every thread shares: a capture's, up to and
 * including the return into one_round. */
#define COMMON_FRAMES (CHAIN_FRAMES(DEPTH) + 1)

/* One capture of each kind, from one call site whatever the compiler does
 * to the loop around it (it may peel a first round into a copy). */
NOINLINE static void one_round(worker *w) {
  roll r = {w->shots, 2};
  chain(DEPTH, &r);
  const shot *fast = &w->shots[0], *slow = &w->shots[1];
  if (fast->n == CA_UNWIND_NOT_FAST && FAST_PATH)
    w->failures++;
  else if (fast->n != slow->n ||
           memcmp(fast->pcs, slow->pcs, slow->n * sizeof(uintptr_t)) != 0)
    w->failures++;
  if (w->first.n == 0)
    w->first = *slow;
  else if (slow->n != w->first.n ||
           memcmp(slow->pcs, w->first.pcs, COMMON_FRAMES * sizeof(uintptr_t)))
    w->failures++;
}

NOINLINE static void *thread_body(void *arg) {
  worker *w = arg;
  if (w->start != NULL)
    pthread_barrier_wait(w->start);
  for (int round = 0; round < THREAD_ROUNDS; round++)
    one_round(w);
  __asm__ volatile("" ::: "memory"); /* not a tail position */
  return NULL;
}

static void init_worker(worker *w, pthread_barrier_t *start) {
  memset(w, 0, sizeof(*w));
  w->start = start;
  w->shots[0] = (shot){.fn = ca_unwind_fast, .max = MAX_FRAMES};
  w->shots[1] = (shot){.fn = ca_unwind_libgcc, .max = MAX_FRAMES};
}

/* Eight threads unwinding at once (first in this file, so that they also
 * fill the cache at once) get what one thread gets: the same frames up to
 * and including the return into one_round. */
static void eight_threads_agree_with_one(void **state) {
  (void)state;
  static worker workers[THREADS], alone;
  pthread_t threads[THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, THREADS);
  for (int t = 0; t < THREADS; t++) {
    init_worker(&workers[t], &start);
    assert_int_equal(
        pthread_create(&threads[t], NULL, thread_body, &workers[t]), 0);
  }
  for (int t = 0; t < THREADS; t++)
    pthread_join(threads[t], NULL);
  pthread_barrier_destroy(&start);
  init_worker(&alone, NULL);
  thread_body(&alone);
  assert_int_equal(alone.failures, 0);
  size_t common = COMMON_FRAMES;
  assert_true(alone.first.n > common + 1);
  for (int t = 0; t < THREADS; t++) {
    assert_int_equal(workers[t].failures, 0);
    assert_true(workers[t].first.n > common + 1);
    assert_memory_equal(workers[t].first.pcs, alone.first.pcs,
                        common * sizeof(uintptr_t));
    /* Past thread_body: start_thread in the threads, this test here. */
    assert_true(workers[t].first.pcs[common + 1] !=
                alone.first.pcs[common + 1]);
  }
}

/* Recursion 30 deep through all three kinds of frame, to the end of the
 * stack: every path gives the same frames, and all of them. */
static void deep_chain_matches_libgcc(void **state) {
  (void)state;
  shot *shots = capture_all_ways(DEPTH, MAX_FRAMES, 0);
  assert_true(shots[0].n > CHAIN_FRAMES(DEPTH));
  assert_true(shots[0].n < MAX_FRAMES); /* the whole stack */
  free(shots);
}

/* pcs[0] is the return address into take_shots, the caller of the capture
 * function; pcs[1] the return into the innermost link. */
static void first_frame_is_in_the_caller(void **state) {
  (void)state;
  shot *shots = capture_all_ways(0, MAX_FRAMES, 0);
  assert_true(shots[0].pcs[0] - (uintptr_t)take_shots < FUNCTION_SPAN);
  assert_true(shots[0].pcs[1] - (uintptr_t)plain_link < FUNCTION_SPAN);
  free(shots);
}

/* skip drops leading frames before max counts: every (max, skip) gives the
 * slice [skip, skip + max) of the whole stack, on every path. */
static void skip_and_max_slice_the_stack(void **state) {
  (void)state;
  static const size_t maxes[] = {1, 3, 10, MAX_FRAMES, 5, 0, 4};
  static const size_t skips[] = {0, 2, 5, 1, 40, 3, 1000};
  enum { CASES = sizeof(maxes) / sizeof(maxes[0]) };
  shot *shots = calloc(1 + CASES * ALL_PATHS, sizeof(shot));
  assert_non_null(shots);
  shots[0] = (shot){.fn = ca_unwind, .max = MAX_FRAMES}; /* the whole stack */
  for (int c = 0; c < CASES; c++)
    for (int p = 0; p < ALL_PATHS; p++)
      shots[1 + c * ALL_PATHS + p] =
          (shot){.fn = all_paths[p], .max = maxes[c], .skip = skips[c]};
  roll r = {shots, 1 + CASES * ALL_PATHS};
  chain(10, &r);
  const shot *whole = &shots[0];
  assert_true(whole->n > CHAIN_FRAMES(10) && whole->n < MAX_FRAMES);
  for (int c = 0; c < CASES; c++) {
    size_t left = whole->n > skips[c] ? whole->n - skips[c] : 0;
    size_t want = left < maxes[c] ? left : maxes[c];
    for (int p = 0; p < ALL_PATHS; p++) {
      const shot *s = &shots[1 + c * ALL_PATHS + p];
      assert_fast(s);
      assert_int_equal(s->n, want);
      if (want > 0)
        assert_memory_equal(s->pcs, whole->pcs + skips[c],
                            want * sizeof(uintptr_t));
    }
  }
  free(shots);
}

/* qsort -------------------------------------------------------------------- */

static roll *sort_roll;

static int compare_and_capture(const void *a, const void *b) {
  if (sort_roll != NULL) {
    take_shots(sort_roll);
    sort_roll = NULL;
  }
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* One capture before the sort, from this function; one from inside the
 * comparator, which libc calls. */
NOINLINE static int sort_with_capture(roll *before, roll *inside) {
  int v[32];
  for (int i = 0; i < 32; i++)
    v[i] = (i * 7919) % 32;
  take_shots(before);
  sort_roll = inside;
  qsort(v, 32, sizeof(int), compare_and_capture);
  __asm__ volatile("" ::: "memory");
  return v[0];
}

/* A capture from a callback (`inside`) against one taken by the function
 * that led to the callback, before it (`before`: take_shots, that function,
 * its callers): inside ends with exactly the callers' frames, after the
 * return into that function. Returns the index of that return. */
static size_t assert_reached_through(const shot *in, const shot *before,
                                     const void *function) {
  size_t tail = before->n - 2;
  assert_true(before->n > 2 && in->n > tail + 3);
  size_t j = in->n - tail - 1;
  assert_memory_equal(in->pcs + j + 1, before->pcs + 2,
                      tail * sizeof(uintptr_t));
  assert_true(in->pcs[j] - (uintptr_t)function < FUNCTION_SPAN);
  return j;
}

/* A chain through libc: the comparator's frame, libc's sorting frames, then
 * exactly the frames of the function that called qsort and its callers. */
static void chain_through_a_libc_callback(void **state) {
  (void)state;
  shot *before = make_shots(all_paths, 1, MAX_FRAMES, 0);
  shot *inside = make_shots(all_paths, ALL_PATHS, MAX_FRAMES, 0);
  roll rb = {before, 1}, ri = {inside, ALL_PATHS};
  sort_with_capture(&rb, &ri);
  assert_fast(&inside[0]);
  for (int i = 1; i < ALL_PATHS; i++)
    assert_same_frames(&inside[0], &inside[i]);
  const shot *in = &inside[0];
  size_t j = assert_reached_through(in, &before[0], sort_with_capture);
  assert_true(in->pcs[1] - (uintptr_t)compare_and_capture < FUNCTION_SPAN);
  /* Between them, qsort's own frames: libc's, or under a sanitizer its
   * interceptor's, which may sort by itself. */
  assert_true(j >= 3);
  if (!SANITIZED) {
    int in_libc = 0;
    for (size_t k = 2; k < j; k++)
      in_libc += strstr(object_of(in->pcs[k]), "libc.so") != NULL;
    assert_true(in_libc > 0);
  }
  free(before);
  free(inside);
}

/* Our own object ----------------------------------------------------------- */

/* Linked into this test, "our object" is the test executable: the first
 * frame kept is the first one outside it (cmocka's, calling this test), and
 * the executable's frames further out (main) are kept. */
static void outside_self_starts_outside_our_object(void **state) {
  (void)state;
  shot shots[2] = {{.fn = ca_unwind, .max = MAX_FRAMES},
                   {.fn = NULL, .max = MAX_FRAMES}};
  roll r = {shots, 2};
  chain(5, &r);
  void *self = object_base((uintptr_t)take_shots + 1);
  size_t k = 0;
  while (k < shots[0].n && object_base(shots[0].pcs[k]) == self)
    k++;
  assert_true(k > CHAIN_FRAMES(5) && k < shots[0].n);
  assert_int_equal(shots[1].n, shots[0].n - k);
  assert_memory_equal(shots[1].pcs, shots[0].pcs + k,
                      shots[1].n * sizeof(uintptr_t));
  int later_self = 0;
  for (size_t i = 0; i < shots[1].n; i++)
    later_self += object_base(shots[1].pcs[i]) == self;
  assert_true(later_self > 0); /* main */
}

/* Fallbacks ---------------------------------------------------------------- */

#if defined(__x86_64__)
/* A frame whose CFA is a DWARF expression (rsp + 16, written the long way):
 * libgcc follows it, the fast path cannot. It calls fn(r). */
void test_unwind_expr_frame(roll *r, void (*fn)(roll *));
__asm__(".text\n"
        ".globl test_unwind_expr_frame\n"
        ".hidden test_unwind_expr_frame\n"
        ".type test_unwind_expr_frame, @function\n"
        "test_unwind_expr_frame:\n"
        ".cfi_startproc\n"
        "  subq $8, %rsp\n"
        /* DW_CFA_def_cfa_expression, 2 bytes: DW_OP_breg7 (rsp) 16 */
        "  .cfi_escape 0x0f, 0x02, 0x77, 0x10\n"
        "  call *%rsi\n"
        "  addq $8, %rsp\n"
        "  .cfi_def_cfa %rsp, 8\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size test_unwind_expr_frame, .-test_unwind_expr_frame\n");

static int expr_chain(int depth, roll *r) {
  if (depth < 0) {
    test_unwind_expr_frame(r, take_shots);
    return 0;
  }
  int v = expr_chain(depth - 1, r);
  __asm__ volatile("" : "+r"(v));
  return v + 1;
}

/* A frame the rules cannot express, within max: the fast path declines and
 * ca_unwind gives libgcc's frames; beyond max, it never looks. */
static void falls_back_past_an_expression_frame(void **state) {
  (void)state;
  shot *shots = make_shots(all_paths, ALL_PATHS, MAX_FRAMES, 0);
  roll r = {shots, ALL_PATHS};
  expr_chain(4, &r);
  assert_int_equal(shots[0].n, CA_UNWIND_NOT_FAST);
  assert_true(shots[1].n > 8);
  assert_same_frames(&shots[1], &shots[2]);
  assert_same_frames(&shots[1], &shots[3]);
  for (int i = 0; i < ALL_PATHS; i++)
    shots[i].max = 1; /* take_shots only: the expression frame is next */
  expr_chain(4, &r);
  assert_fast(&shots[0]);
  for (int i = 1; i < ALL_PATHS; i++)
    assert_same_frames(&shots[0], &shots[i]);
  free(shots);
}
#endif

/* Signal ------------------------------------------------------------------- */

static roll *signal_roll;

static void capture_in_handler(int sig) {
  (void)sig;
  take_shots(signal_roll);
  __asm__ volatile("" ::: "memory"); /* not a tail call */
}

NOINLINE static int raise_and_capture(roll *before, roll *inside) {
  take_shots(before);
  signal_roll = inside;
  raise(SIGUSR1);
  __asm__ volatile("" ::: "memory");
  return 0;
}

/* Past a signal frame only libgcc knows the way (the kernel's frame is not
 * described by CFA rules): the fast path declines, and ca_unwind gives
 * libgcc's frames, through the signal frame to the function that raised
 * the signal and its callers. */
static void falls_back_across_a_signal_frame(void **state) {
  (void)state;
  struct sigaction sa, old;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = capture_in_handler;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
  shot *before = make_shots(all_paths, 1, MAX_FRAMES, 0);
  shot *inside = make_shots(all_paths, ALL_PATHS, MAX_FRAMES, 0);
  roll rb = {before, 1}, ri = {inside, ALL_PATHS};
  raise_and_capture(&rb, &ri);
  sigaction(SIGUSR1, &old, NULL);
  if (FAST_PATH)
    assert_int_equal(inside[0].n, CA_UNWIND_NOT_FAST);
  assert_same_frames(&inside[1], &inside[2]);
  assert_same_frames(&inside[1], &inside[3]);
  assert_reached_through(&inside[1], &before[0], raise_and_capture);
  assert_true(inside[1].pcs[1] - (uintptr_t)capture_in_handler < FUNCTION_SPAN);
  free(before);
  free(inside);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(eight_threads_agree_with_one),
      cmocka_unit_test(deep_chain_matches_libgcc),
      cmocka_unit_test(first_frame_is_in_the_caller),
      cmocka_unit_test(skip_and_max_slice_the_stack),
      cmocka_unit_test(chain_through_a_libc_callback),
      cmocka_unit_test(outside_self_starts_outside_our_object),
#if defined(__x86_64__)
      cmocka_unit_test(falls_back_past_an_expression_frame),
#endif
      cmocka_unit_test(falls_back_across_a_signal_frame),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
