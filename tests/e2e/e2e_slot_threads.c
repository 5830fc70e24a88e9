/*
 * The allocator-slot pair from threads the way a framework calls it, against
 * the mock driver (which keeps the current context per thread, as the
 * driver does). The library is dlopen'ed (as PyTorch's pluggable allocator
 * loads it) or, with E2E_EXPECT=pooled, preloaded as well.
 *
 * E2E_SLOT_MODE=threads: the main thread makes device 0's primary context
 * current; then
 *  1. 8 threads with no current context (autograd's backward thread is
 *     one) each ask cudalloc_stream_malloc for 8 blocks of device 0: every
 *     one is served, and the thread still has no current context after;
 *  2. 4 threads with device 1's primary context current ask for device 0:
 *     served on device 0, and device 1's context is still current after;
 *  3. the main thread finds every block on device 0 and holding what it
 *     writes; threads with no context free half of them, the main thread
 *     the rest (a free from another thread than the allocation's), after
 *     which the pool holds no live block.
 * E2E_SLOT_MODE=oom (MOCKCUDA_MEM_MB=64):
 *  4. a block freed on stream A and cached makes room for a larger one on
 *     stream B (the cache is given back and the request retried);
 *  5. a request the device cannot hold returns NULL from
 *     cudalloc_stream_try_malloc with one line naming the size, the device,
 *     the memory in use and cached;
 *  6. cudalloc_stream_malloc (PyTorch's slot, which never checks the
 *     pointer) says the same, in one line that ends saying it stops the
 *     process, and ends it with SIGABRT instead of returning NULL (run in
 *     a child forked before any CUDA call).
 * E2E_SLOT_MODE=record:
 *  7. a block recorded on stream B (cudalloc_record_stream, as PyTorch's
 *     tensor.record_stream) and freed on its own stream A makes A wait for
 *     an event recorded on B, and A then reuses it; a block not recorded
 *     is freed with no event and no wait.
 * E2E_SLOT_MODE=graph (a stream capture in global mode, as
 * torch.cuda.graph makes, told to the library as cudalloc.torch.use()
 * tells it):
 *  8. a request during the capture that needs a new segment is served and
 *     the capture stays valid (no call of the library's breaks it);
 *  9. a block freed during the capture serves the capture's next request
 *     of its size; after the capture, the graph's blocks, freed or not,
 *     serve no one else;
 * 10. once the graph is released, the blocks the program freed go back to
 *     the pool.
 * E2E_SLOT_MODE=faults (answered as PyTorch's allocator answers: the call
 * succeeds, and no block is handed out before its stream's work is done):
 * 11. a stream destroyed while a block freed on it waits: preloaded, the
 *     library sees the destroy, and another stream's request gets the
 *     block with no new segment, behind one event recorded on the stream
 *     before it went; loaded alone (as PyTorch loads it) it never learns
 *     of it, and the block stays the dead stream's, as PyTorch keeps it,
 *     until its segment goes back to the driver (whose cuMemFree waits for
 *     the device); no event is ever recorded on the dead handle;
 * 12. a block freed on a stream that is capturing serves another stream
 *     only after the capture (preloaded: loaded alone, the library records
 *     nothing on a stream it did not see made, and the block stays the
 *     stream's): during it, nothing is recorded on the capturing stream
 *     and the capture stays valid;
 * 13. a block allocated on one thread and freed on another serves the
 *     first thread's next request on its stream at once, with no event.
 * Last line of its own: PASS or FAIL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int failures;

#define MiB (1ull << 20)
#define E2E_NAME "e2e_slot_threads"
#include "cudalloc.h"
#include "e2e_check.h"
#include "mockcuda.h"

#define BARE_THREADS 8
#define OTHER_THREADS 4
#define PER_THREAD 8
#define NBLOCKS ((BARE_THREADS + OTHER_THREADS) * PER_THREAD)

typedef void *(*slot_malloc)(size_t, int, void *);
typedef void (*slot_free)(void *, size_t, int, void *);
typedef int (*stats_fn)(int, cudalloc_device_stats *, size_t);
typedef void (*record_fn)(void *, int, void *);
typedef int (*graph_begin_fn)(int, void *);
typedef void (*graph_fn)(int);

static slot_malloc sm, try_sm;
static slot_free sf;
static stats_fn stats;
static record_fn record;
static graph_begin_fn graph_begin;
static graph_fn graph_end, graph_release;
static void *blocks[NBLOCKS];

typedef struct worker {
  int index;
  CUcontext current; /* made current before asking: NULL for none */
} worker;

static CUcontext current(void) {
  CUcontext c = NULL;
  cuCtxGetCurrent(&c);
  return c;
}

static size_t block_size(int i) { return (size_t)(i % 4 + 1) * 64 * 1024; }

static void *allocating(void *arg) {
  worker *w = arg;
  if (w->current)
    CHECK(cuCtxSetCurrent(w->current));
  for (int k = 0; k < PER_THREAD; k++) {
    int i = w->index * PER_THREAD + k;
    blocks[i] = sm(block_size(i), 0, NULL);
    if (blocks[i] == NULL)
      FAIL("thread %d: cudalloc_stream_malloc(%zu, device 0) returned NULL "
           "with %s current", w->index, block_size(i),
           w->current ? "device 1's context" : "no context");
  }
  if (current() != w->current)
    FAIL("thread %d: the current context changed across the slot (%p, was %p)",
         w->index, (void *)current(), (void *)w->current);
  return NULL;
}

static void *freeing(void *arg) {
  worker *w = arg;
  for (int i = w->index; i < NBLOCKS; i += 2 * BARE_THREADS)
    sf(blocks[i], block_size(i), 0, NULL);
  if (current() != NULL)
    FAIL("a freeing thread got a current context");
  return NULL;
}

static void run_threads(void *(*fn)(void *), worker *w, int n) {
  pthread_t t[BARE_THREADS + OTHER_THREADS];
  for (int i = 0; i < n; i++)
    pthread_create(&t[i], NULL, fn, &w[i]);
  for (int i = 0; i < n; i++)
    pthread_join(t[i], NULL);
}

/* 3: every block is device 0's and holds what is written to it. */
static void check_blocks(void) {
  for (int i = 0; i < NBLOCKS; i++) {
    if (blocks[i] == NULL)
      continue;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)blocks[i];
    int ordinal = -1;
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    unsigned char last = 0;
    CHECK(cuMemsetD8(p, (unsigned char)(i + 1), block_size(i)));
    CHECK(cuMemcpyDtoH(&last, p + block_size(i) - 1, 1));
    if (ordinal != 0 || last != (unsigned char)(i + 1))
      FAIL("block %d: device %d, last byte %#x (want device 0, %#x)", i,
           ordinal, last, i + 1);
  }
}

static void threads_mode(void) {
  CUcontext ctx1 = e2e_primary(1);
  CHECK(cuCtxSetCurrent(e2e_primary(0)));

  worker w[BARE_THREADS + OTHER_THREADS];
  for (int i = 0; i < BARE_THREADS + OTHER_THREADS; i++)
    w[i] = (worker){i, i < BARE_THREADS ? NULL : ctx1};
  run_threads(allocating, w, BARE_THREADS + OTHER_THREADS);
  check_blocks();

  run_threads(freeing, w, BARE_THREADS);
  for (int i = 0; i < NBLOCKS; i++)
    if (i % (2 * BARE_THREADS) >= BARE_THREADS)
      sf(blocks[i], block_size(i), 0, NULL);
  cudalloc_device_stats s = {0};
  stats(0, &s, sizeof(s));
  if (s.allocs < NBLOCKS || s.blocks.current != 0)
    FAIL("statistics after every free: %llu allocations, %llu blocks live "
         "(want >= %d, 0)", (unsigned long long)s.allocs,
         (unsigned long long)s.blocks.current, NBLOCKS);
}

/* 6, in a child forked before any CUDA call: what it said, and how it
 * ended. */
static void abort_case(void) {
  int fds[2];
  if (pipe(fds) != 0)
    exit(2);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    if (e2e_primary(0) == NULL)
      _exit(3);
    void *p = sm(8 * MiB, 0, NULL);
    void *q = sm(256 * MiB, 0, NULL);
    fprintf(stderr, "returned %p, %p\n", p, q);
    _exit(0);
  }
  close(fds[1]);
  char said[4096] = "";
  size_t n = 0;
  ssize_t got;
  while (n < sizeof(said) - 1 &&
         (got = read(fds[0], said + n, sizeof(said) - 1 - n)) > 0)
    n += (size_t)got;
  said[n] = '\0';
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  /* The out-of-memory report's first line says why the process stops. */
  char *eol = strchr(said, '\n');
  if (eol)
    *eol = '\0';
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT ||
      strncmp(said, "cudalloc: out of memory on device 0", 35) != 0 ||
      !strstr(said, "stopping the process"))
    FAIL("cudalloc_stream_malloc past the device: %s %d, said: %s",
         WIFSIGNALED(status) ? "signal" : "exit",
         WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), said);
}

/* Device 0's primary context current, and two streams of it. */
static void primary_with_streams(CUstream *a, CUstream *b, unsigned flags) {
  CHECK(cuCtxSetCurrent(e2e_primary(0)));
  CHECK(cuStreamCreate(a, flags));
  CHECK(cuStreamCreate(b, flags));
}

static void oom_mode(void) {
  abort_case();
  CUstream a, b;
  primary_with_streams(&a, &b, 0);

  void *x = try_sm(40 * MiB, 0, a);
  if (x == NULL)
    FAIL("40 MiB of 64 refused");
  sf(x, 40 * MiB, 0, a);
  void *y = try_sm(48 * MiB, 0, b);
  if (y == NULL)
    FAIL("48 MiB refused while 40 MiB lay cached: the cache was not given back");

  capture c;
  capture_begin(&c);
  void *z = try_sm(256 * MiB, 0, a);
  char *said = capture_end(&c);
  /* The report: its first line the request and the figures, then the
   * sites and what would help. */
  if (z != NULL || strncmp(said, "cudalloc: out of memory on device 0", 35) ||
      !strstr(said, "256.0 MiB") || !strstr(said, "in use 48.0 MiB") ||
      !strstr(said, "cached") || !strstr(said, "\ncudalloc: what would help: "))
    FAIL("256 MiB of 64: %p, said (want the out-of-memory report): %s", z, said);
  free(said);
  sf(y, 48 * MiB, 0, b);
}

static uint64_t waits(const mockcuda_counters *k) {
  return k->wait_event_other + k->wait_event_legacy + k->wait_event_nonblocking;
}

static void record_mode(void) {
  CUstream a, b;
  primary_with_streams(&a, &b, 0);
  void *p = sm(MiB, 0, a);
  mockcuda_counters k0, k1, k2;
  mockcuda_get_counters(&k0);
  sf(p, MiB, 0, a); /* not recorded: no event, no wait */
  mockcuda_get_counters(&k1);
  if (k1.event_record != k0.event_record || waits(&k1) != waits(&k0))
    FAIL("a free with no other stream recorded an event or waited");
  void *q = sm(MiB, 0, a);
  record(q, 0, b);
  record(q, 0, b); /* once is enough */
  sf(q, MiB, 0, a);
  mockcuda_get_counters(&k2);
  if (k2.event_record - k1.event_record != 1 || waits(&k2) - waits(&k1) != 1)
    FAIL("a block recorded on B, freed on A: %llu event(s), %llu wait(s) "
         "(want 1 on B, A waiting for it)",
         (unsigned long long)(k2.event_record - k1.event_record),
         (unsigned long long)(waits(&k2) - waits(&k1)));
  void *r = sm(MiB, 0, a);
  if (r != q)
    FAIL("A did not reuse its block after waiting for B (%p, %p)", q, r);
  sf(r, MiB, 0, a);
}

static unsigned long long live_blocks(void) {
  cudalloc_device_stats s = {0};
  stats(0, &s, sizeof(s));
  return (unsigned long long)s.blocks.current;
}

static void graph_mode(void) {
  CUstream cap, other;
  CUgraph g = NULL;
  primary_with_streams(&cap, &other, CU_STREAM_NON_BLOCKING);
  mockcuda_counters k0, k1;
  mockcuda_get_counters(&k0);

  CHECK(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL));
  int graph = graph_begin(0, cap);
  if (graph <= 0)
    FAIL("cudalloc_graph_begin returned %d", graph);
  void *a = try_sm(32 * MiB, 0, cap); /* a new segment */
  void *b = try_sm(4 * MiB, 0, cap);
  sf(a, 32 * MiB, 0, cap);
  void *c = try_sm(32 * MiB, 0, cap);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK(cuStreamIsCapturing(cap, &st));
  if (!a || !b || c != a || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
    FAIL("during the capture: a %p, b %p, c %p (want a again), capture %s",
         a, b, c, st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active" : "broken");
  sf(c, 32 * MiB, 0, cap);
  CHECK(cuStreamEndCapture(cap, &g));
  graph_end(graph);
  mockcuda_get_counters(&k1);
  if (k1.capture_violations != k0.capture_violations)
    FAIL("%llu call(s) broke the capture",
         (unsigned long long)(k1.capture_violations - k0.capture_violations));

  sf(b, 4 * MiB, 0, cap); /* the graph still holds it */
  void *d = try_sm(32 * MiB, 0, cap), *e = try_sm(32 * MiB, 0, other);
  void *f = try_sm(4 * MiB, 0, cap);
  if (d == a || e == a || f == b)
    FAIL("after the capture a block the graph holds was handed out again "
         "(%p %p %p, graph's %p %p)", d, e, f, a, b);
  unsigned long long held = live_blocks();
  graph_release(graph);
  unsigned long long after = live_blocks();
  if (held != 5 || after != 3)
    FAIL("blocks live: %llu with the graph held (want 5: its 2 and 3 others), "
         "%llu once released (want 3)", held, after);
  sf(d, 32 * MiB, 0, cap);
  sf(e, 32 * MiB, 0, other);
  sf(f, 4 * MiB, 0, cap);
  if (live_blocks() != 0)
    FAIL("%llu block(s) live after every free", live_blocks());
}

/* Event records that failed (a handle the mock does not know). */
static uint64_t failed_records(const mockcuda_counters *k) {
  return k->event_record - k->event_record_legacy - k->event_record_per_thread -
         k->event_record_blocking - k->event_record_nonblocking;
}

/* 11 */
static void destroyed_stream_case(bool preloaded) {
  CUstream a, b;
  primary_with_streams(&a, &b, 0);
  void *p = sm(8 * MiB, 0, a);
  sf(p, 8 * MiB, 0, a);
  mockcuda_counters k0, k1;
  mockcuda_get_counters(&k0);
  CHECK(cuStreamDestroy(a));
  void *q = sm(8 * MiB, 0, b);
  mockcuda_get_counters(&k1);
  if (preloaded && (q != p || k1.mem_alloc != k0.mem_alloc ||
                    k1.event_record_blocking - k0.event_record_blocking != 1))
    FAIL("a destroyed stream's block: %p (want %p), %llu new segment(s), "
         "%llu event(s) on it (want 1, before it went)", q, p,
         (unsigned long long)(k1.mem_alloc - k0.mem_alloc),
         (unsigned long long)(k1.event_record_blocking -
                              k0.event_record_blocking));
  if (!preloaded && q == p && k1.mem_free == k0.mem_free)
    FAIL("a block of a stream destroyed unseen served another stream "
         "without going back to the driver first");
  if (failed_records(&k1) != failed_records(&k0))
    FAIL("%llu event(s) recorded on a destroyed stream",
         (unsigned long long)(failed_records(&k1) - failed_records(&k0)));
  sf(q, 8 * MiB, 0, b);
  CHECK(cuStreamDestroy(b));
}

/* 12 */
static void capturing_stream_case(bool preloaded) {
  CUstream cap, other;
  CUgraph g = NULL;
  primary_with_streams(&cap, &other, CU_STREAM_NON_BLOCKING);
  void *keep = sm(MiB, 0, other); /* other's stream has a block of its own */
  void *p = sm(8 * MiB, 0, cap);
  mockcuda_counters k0, k1;
  mockcuda_get_counters(&k0);
  CHECK(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED));
  sf(p, 8 * MiB, 0, cap);
  void *q = sm(8 * MiB, 0, other);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CHECK(cuStreamIsCapturing(cap, &st));
  CHECK(cuStreamEndCapture(cap, &g));
  mockcuda_get_counters(&k1);
  if (!q || q == p || st != CU_STREAM_CAPTURE_STATUS_ACTIVE ||
      k1.capture_violations != k0.capture_violations)
    FAIL("during a capture: another stream got %p (the capturing stream's "
         "block %p: want another), capture %s, %llu violation(s)", q, p,
         st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active" : "broken",
         (unsigned long long)(k1.capture_violations - k0.capture_violations));
  CHECK(cuGraphDestroy(g));
  sf(q, 8 * MiB, 0, other);
  void *r = sm(16 * MiB, 0, other);
  void *s = sm(8 * MiB, 0, other);
  if (r == NULL || (preloaded && s != p))
    FAIL("after the capture, another stream did not get the captured "
         "stream's block (%p, want %p)", s, p);
  sf(r, 16 * MiB, 0, other);
  sf(s, 8 * MiB, 0, other);
  sf(keep, MiB, 0, other);
}

/* 13 */
static void *free_on(void *arg) {
  void **block = arg;
  sf(*block, 4 * MiB, 0, NULL);
  return NULL;
}

static void cross_thread_case(void) {
  CHECK(cuCtxSetCurrent(e2e_primary(0)));
  void *p = sm(4 * MiB, 0, NULL);
  pthread_t t;
  pthread_create(&t, NULL, free_on, &p);
  pthread_join(t, NULL);
  mockcuda_counters k0, k1;
  mockcuda_get_counters(&k0);
  void *q = sm(4 * MiB, 0, NULL);
  mockcuda_get_counters(&k1);
  if (q != p || k1.event_record != k0.event_record)
    FAIL("a block freed on another thread: %p (want %p at once), %llu "
         "event(s)", q, p,
         (unsigned long long)(k1.event_record - k0.event_record));
  sf(q, 4 * MiB, 0, NULL);
}

static void faults_mode(bool preloaded) {
  destroyed_stream_case(preloaded);
  capturing_stream_case(preloaded);
  cross_thread_case();
}

int main(int argc, char **argv) {
  void *lib = e2e_slot_library(argc, argv);
  sm = (slot_malloc)dlsym(lib, "cudalloc_stream_malloc");
  try_sm = (slot_malloc)dlsym(lib, "cudalloc_stream_try_malloc");
  sf = (slot_free)dlsym(lib, "cudalloc_stream_free");
  stats = (stats_fn)dlsym(lib, "cudalloc_get_stats");
  record = (record_fn)dlsym(lib, "cudalloc_record_stream");
  graph_begin = (graph_begin_fn)dlsym(lib, "cudalloc_graph_begin");
  graph_end = (graph_fn)dlsym(lib, "cudalloc_graph_end");
  graph_release = (graph_fn)dlsym(lib, "cudalloc_graph_release");
  if (!sm || !try_sm || !sf || !stats || !record || !graph_begin ||
      !graph_end || !graph_release) {
    printf("FAIL " E2E_NAME ": the slot functions are not exported\n");
    return 1;
  }
  const char *mode = getenv("E2E_SLOT_MODE");
  if (mode && strcmp(mode, "oom") == 0)
    oom_mode();
  else if (mode && strcmp(mode, "record") == 0)
    record_mode();
  else if (mode && strcmp(mode, "graph") == 0)
    graph_mode();
  else if (mode && strcmp(mode, "faults") == 0)
    faults_mode(dlsym(RTLD_DEFAULT, "cudalloc_version") != NULL);
  else
    threads_mode();
  printf("%s " E2E_NAME " (%s)\n", failures ? "FAIL" : "PASS",
         mode ? mode : "threads");
  return failures ? 1 : 0;
}
