/*
 * CPU benchmark of stack capture: what backtrace_depth costs at every
 * allocation.
 *
 *   bench_unwind [CAPTURES]
 *
 * From the bottom of a chain of 20 frames (plus main and libc's start-up
 * frames), captures 8 and 16 return addresses CAPTURES times (default
 * 200000) with each unwinder and prints nanoseconds per capture, the best of
 * five runs:
 *   ca_unwind           the caching unwinder (src/unwind/), cache warm
 *   ca_unwind (libgcc)  the same entry forced onto its libgcc fallback
 *   _Unwind_Backtrace   libgcc directly, one callback per frame
 *   backtrace()         glibc's, itself built on _Unwind_Backtrace
 */
#include <execinfo.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "unwind/unwind.h"

/* libgcc's unwinder, declared here: <unwind.h> would find src/unwind.h,
 * which comes first on the include path. */
struct _Unwind_Context;
typedef int (*unwind_trace_fn)(struct _Unwind_Context *ctx, void *arg);
int _Unwind_Backtrace(unwind_trace_fn trace, void *arg);
uintptr_t _Unwind_GetIP(struct _Unwind_Context *ctx);
#define URC_NO_REASON 0
#define URC_END_OF_STACK 5

#define CHAIN 20
#define RUNS 5

typedef enum method {
  M_CA,
  M_CA_LIBGCC,
  M_UNWIND_BACKTRACE,
  M_BACKTRACE,
  M_COUNT
} method;

static const char *const method_names[M_COUNT] = {
    "ca_unwind", "ca_unwind (libgcc)", "_Unwind_Backtrace", "backtrace()"};

typedef struct job {
  method m;
  size_t depth;
  long captures;
  size_t frames; /* what the last capture found */
  double ns;     /* per capture */
} job;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct trace_state {
  uintptr_t *pcs;
  size_t n, max;
} trace_state;

static int trace_frame(struct _Unwind_Context *ctx, void *arg) {
  trace_state *t = arg;
  t->pcs[t->n++] = _Unwind_GetIP(ctx);
  return t->n < t->max ? URC_NO_REASON : URC_END_OF_STACK;
}

static size_t capture(method m, uintptr_t *pcs, size_t depth) {
  switch (m) {
  case M_CA:
    return ca_unwind(pcs, depth, 0);
  case M_CA_LIBGCC:
    return ca_unwind_libgcc(pcs, depth, 0);
  case M_UNWIND_BACKTRACE: {
    trace_state t = {pcs, 0, depth};
    _Unwind_Backtrace(trace_frame, &t);
    return t.n;
  }
  default:
    return (size_t)backtrace((void **)pcs, (int)depth);
  }
}

/* The timed loop, at the bottom of the chain. */
__attribute__((noinline)) static void run_job(job *j) {
  uintptr_t pcs[64];
  j->frames = capture(j->m, pcs, j->depth); /* warms the cache */
  double best = 0;
  for (int run = 0; run < RUNS; run++) {
    double start = now_ns();
    for (long i = 0; i < j->captures; i++)
      j->frames = capture(j->m, pcs, j->depth);
    double ns = (now_ns() - start) / (double)j->captures;
    best = run == 0 || ns < best ? ns : best;
  }
  j->ns = best;
}

/* Each link uses its callee's result, so none is a tail call. */
__attribute__((noinline)) static int chain(int depth, job *j) {
  if (depth == 0) {
    run_job(j);
    return 0;
  }
  int v = chain(depth - 1, j);
  __asm__ volatile("" : "+r"(v));
  return v + 1;
}

int main(int argc, char **argv) {
  long captures = argc > 1 ? atol(argv[1]) : 200000;
  if (captures <= 0) {
    fprintf(stderr, "usage: bench_unwind [CAPTURES]\n");
    return 2;
  }
  static const size_t depths[] = {8, 16};
  printf("stack capture, %d-frame chain, ns per capture (best of %d x %ld)\n",
         CHAIN, RUNS, captures);
  printf("%-20s %12s %12s\n", "", "depth 8", "depth 16");
  for (int m = 0; m < M_COUNT; m++) {
    printf("%-20s", method_names[m]);
    for (int d = 0; d < 2; d++) {
      job j = {(method)m, depths[d], captures, 0, 0};
      chain(CHAIN, &j);
      if (j.frames != depths[d])
        printf(" %7.0f (%zu!)", j.ns, j.frames);
      else
        printf(" %12.0f", j.ns);
    }
    printf("\n");
  }
  return 0;
}
