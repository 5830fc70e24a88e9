/*
 * trace_alloc: records a program's cudaMalloc/cudaFree sequence, so that the
 * pool's memory use can be studied and tuned offline (bench_replay replays
 * it through the pool over the fake backend).
 *
 * A tool, not part of the library: preload it alone (without cudalloc) into
 * a program that links the shared CUDA runtime, such as PyTorch with
 * PYTORCH_NO_CUDA_MEMORY_CACHING=1:
 *
 *   CUDALLOC_TRACE_OUT=resnet.trace LD_PRELOAD=./libtrace_alloc.so python3 ...
 *
 * Each line is one call that succeeded, in the order the calls returned:
 *   a <address> <bytes> <thread>   an allocation
 *   f <address> <thread>           a free
 *   s <flags>                      a stream created through the runtime
 * Addresses are hexadecimal, threads small numbers in order of first use.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int status_t; /* cudaError_t: an int-sized enum */

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *trace_file;
static atomic_int thread_count;
static _Thread_local int thread_id = -1;

static int this_thread(void) {
  if (thread_id < 0)
    thread_id = atomic_fetch_add(&thread_count, 1);
  return thread_id;
}

/* Opens the trace on first use; NULL (tracing nothing) without a path. */
static FILE *trace_out(void) {
  if (trace_file == NULL) {
    const char *path = getenv("CUDALLOC_TRACE_OUT");
    if (path == NULL || (trace_file = fopen(path, "w")) == NULL)
      return NULL;
    setvbuf(trace_file, NULL, _IOFBF, 1 << 20);
  }
  return trace_file;
}

static void *real(const char *name) {
  void *f = dlsym(RTLD_NEXT, name);
  if (f == NULL) {
    fprintf(stderr, "trace_alloc: %s not found\n", name);
    abort();
  }
  return f;
}

/* Writes one line: `kind`, then the numbers it carries, then the thread. */
static void put(char kind, int n, unsigned long long a, unsigned long long b) {
  int tid = this_thread();
  pthread_mutex_lock(&trace_lock);
  FILE *f = trace_out();
  if (f != NULL && n == 2)
    fprintf(f, "%c %llx %llu %d\n", kind, a, b, tid);
  else if (f != NULL)
    fprintf(f, "%c %llx %d\n", kind, a, tid);
  pthread_mutex_unlock(&trace_lock);
}

/* `next`: the function `fn` this one stands in front of, found once. */
#define NEXT(fn)                                                               \
  static __typeof__(&fn) next;                                                 \
  if (next == NULL)                                                            \
    next = (__typeof__(&fn))real(#fn)

status_t cudaMalloc(void **p, size_t size) {
  NEXT(cudaMalloc);
  status_t s = next(p, size);
  if (s == 0)
    put('a', 2, (uintptr_t)*p, size);
  return s;
}

status_t cudaFree(void *p) {
  NEXT(cudaFree);
  status_t s = next(p);
  if (s == 0 && p != NULL)
    put('f', 1, (uintptr_t)p, 0);
  return s;
}

status_t cudaStreamCreate(void **stream) {
  NEXT(cudaStreamCreate);
  status_t s = next(stream);
  if (s == 0)
    put('s', 1, 0, 0);
  return s;
}

status_t cudaStreamCreateWithFlags(void **stream, unsigned flags) {
  NEXT(cudaStreamCreateWithFlags);
  status_t s = next(stream, flags);
  if (s == 0)
    put('s', 1, flags, 0);
  return s;
}

status_t cudaStreamCreateWithPriority(void **stream, unsigned flags,
                                      int priority) {
  NEXT(cudaStreamCreateWithPriority);
  status_t s = next(stream, flags, priority);
  if (s == 0)
    put('s', 1, flags, 0);
  return s;
}
