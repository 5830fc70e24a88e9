/*
 * e2e_streams: the streams a program makes, and the markers of
 * stream-ordered reuse (backend.h: mark/poll/wait/forget) built on them.
 *
 * A driver-API program linked to libcuda (the mock) makes a non-blocking
 * stream with cuStreamCreate, another with cuStreamCreateWithPriority, and
 * a blocking one. Preloaded, it checks through the mock's counters what the
 * CUDA backend does when asked for markers (through ca_test_backend_cuda,
 * which the library exports for this test): one event on the legacy stream
 * plus one on each live non-blocking stream of the context, none on blocking
 * streams, none during a stream capture (nor any query that would break
 * one), none on destroyed streams or streams of a dead context, and a
 * pending marker keeps saying so until the device is done.
 *
 * Then the pool's own use of markers, in a cuMemAlloc/cuMemFree loop. The
 * checks that need the pool to call mark (reuse_policy safe) run only with
 * E2E_EXPECT_MARKERS=1; those that hold either way (never an event during a
 * capture, never a record on a blocking or destroyed stream) always run.
 *
 * Runs plainly, preloaded, and preloaded with enabled:0 (E2E_EXPECT says
 * which, as for the other e2e programs). The last line is one PASS/FAIL.
 */
#include <cuda.h>

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "mockcuda.h"

typedef enum { PLAIN, POOLED, PASSTHROUGH } run_mode;
static const char *const mode_names[] = {"plain", "pooled", "passthrough"};

static int failures;

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond)) {                                                      \
      failures++;                                                       \
      fprintf(stderr, "FAIL e2e_streams: %s (", #cond);                 \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, ") [%s:%d]\n", __FILE__, __LINE__);               \
    }                                                                   \
  } while (0)

#define RC(call, want)                                                             \
  do {                                                                             \
    CUresult rc_ = (call);                                                         \
    CHECK(rc_ == (want), "%s returned %d, want %d", #call, (int)rc_, (int)(want)); \
  } while (0)

static mockcuda_counters snap(void) {
  mockcuda_counters c;
  mockcuda_get_counters(&c);
  return c;
}

/* Records that succeeded between two snapshots, by kind of stream. */
typedef struct records {
  uint64_t legacy, per_thread, blocking, nonblocking, all;
} records;

static records records_between(const mockcuda_counters *a, const mockcuda_counters *b) {
  records r = {
      .legacy = b->event_record_legacy - a->event_record_legacy,
      .per_thread = b->event_record_per_thread - a->event_record_per_thread,
      .blocking = b->event_record_blocking - a->event_record_blocking,
      .nonblocking = b->event_record_nonblocking - a->event_record_nonblocking,
  };
  r.all = r.legacy + r.per_thread + r.blocking + r.nonblocking;
  return r;
}

/* One marker's worth: one event on the legacy stream, one on each of the
 * `nb` live non-blocking streams, nothing else. */
#define CHECK_ONE_MARKER(r, nb, what)                                                     \
  CHECK((r).legacy == 1 && (r).nonblocking == (uint64_t)(nb) && (r).blocking == 0 &&     \
            (r).per_thread == 0,                                                         \
        "%s: records legacy %" PRIu64 ", non-blocking %" PRIu64 " (want %d), blocking %" \
        PRIu64 ", per-thread %" PRIu64,                                                  \
        what, (r).legacy, (r).nonblocking, (int)(nb), (r).blocking, (r).per_thread)

static run_mode detect_mode(void) {
  run_mode m = PLAIN;
  if (dlsym(RTLD_DEFAULT, "cudalloc_version")) {
    const char *conf = getenv("CUDALLOC_CONF");
    m = conf && (strstr(conf, "enabled:0") || strstr(conf, "enabled:false")) ? PASSTHROUGH
                                                                             : POOLED;
  }
  const char *want = getenv("E2E_EXPECT");
  if (want && *want)
    CHECK(!strcmp(want, mode_names[m]), "E2E_EXPECT=%s but this run is %s (LD_PRELOAD=%s)", want,
          mode_names[m], getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "unset");
  return m;
}

/* Whether fn lies in the mock itself (not a hook). */
static int in_mock(const void *fn) {
  Dl_info a, b;
  return fn && dladdr(fn, &a) && dladdr((const void *)mockcuda_get_counters, &b) &&
         a.dli_fbase == b.dli_fbase;
}

/* ---- the backend, asked directly ---------------------------------------- */

static const ca_backend *be;

static uint64_t mark(int device, const char *what) {
  uint64_t m = 0;
  int rc = be->mark(be->ctx, device, &m);
  CHECK(rc == 0 && m != 0, "%s: mark returned %d, handle %" PRIu64, what, rc, m);
  return m;
}

/* A marker covers the legacy stream and each live non-blocking stream of
 * the context, blocking streams never; a destroyed stream drops out. Events
 * come back for reuse after forget. */
static void check_marks_cover_streams(CUstream nb1, CUstream nb2, CUstream blk) {
  mockcuda_counters c0 = snap();
  uint64_t n1 = mockcuda_stream_records(nb1), n2 = mockcuda_stream_records(nb2),
           nb = mockcuda_stream_records(blk);
  uint64_t m = mark(0, "two non-blocking streams");
  mockcuda_counters c1 = snap();
  records r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 2, "two non-blocking streams and a blocking one");
  CHECK(mockcuda_stream_records(nb1) == n1 + 1 && mockcuda_stream_records(nb2) == n2 + 1 &&
            mockcuda_stream_records(blk) == nb,
        "per stream: %" PRIu64 " %" PRIu64 " %" PRIu64, mockcuda_stream_records(nb1) - n1,
        mockcuda_stream_records(nb2) - n2, mockcuda_stream_records(blk) - nb);
  CHECK(be->poll(be->ctx, 0, m) == 0, "a marker on an idle device has not passed");
  be->forget(be->ctx, 0, m);

  c0 = snap();
  m = mark(0, "again");
  c1 = snap();
  CHECK(c1.event_create == c0.event_create, "forgotten events not reused: %" PRIu64 " created",
        c1.event_create - c0.event_create);
  be->forget(be->ctx, 0, m);

  RC(cuStreamDestroy(nb2), CUDA_SUCCESS);
  c0 = snap();
  m = mark(0, "after a destroy");
  c1 = snap();
  r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 1, "after cuStreamDestroy of one non-blocking stream");
  be->forget(be->ctx, 0, m);

  /* The CUDA 2.0 export, reached by name. */
  CUresult (*destroy_v1)(CUstream) = (CUresult(*)(CUstream))dlsym(RTLD_DEFAULT, "cuStreamDestroy");
  CUstream nb3 = NULL;
  RC(cuStreamCreate(&nb3, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK(destroy_v1 != NULL && !in_mock((const void *)destroy_v1),
        "dlsym(cuStreamDestroy) gave %p, want the hook", (const void *)destroy_v1);
  if (destroy_v1 != NULL)
    RC(destroy_v1(nb3), CUDA_SUCCESS);
  c0 = snap();
  m = mark(0, "after a v1 destroy");
  c1 = snap();
  r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 1, "after cuStreamDestroy (v1)");
  be->forget(be->ctx, 0, m);
}

/* Pending work: poll says "not yet" without waiting, wait waits. */
static void check_pending(void) {
  mockcuda_set_event_delay(-1);
  uint64_t m = mark(0, "pending");
  CHECK(be->poll(be->ctx, 0, m) == 1 && be->poll(be->ctx, 0, m) == 1,
        "a marker the device has not reached reads as passed");
  mockcuda_counters c0 = snap();
  CHECK(be->wait(be->ctx, 0, m) == 0, "wait refused");
  mockcuda_counters c1 = snap();
  CHECK(c1.event_synchronize - c0.event_synchronize == 2,
        "wait synchronized %" PRIu64 " events, want 2 (legacy, one stream)",
        c1.event_synchronize - c0.event_synchronize);
  CHECK(be->poll(be->ctx, 0, m) == 0, "a marker waited for has not passed");
  be->forget(be->ctx, 0, m);

  mockcuda_set_event_delay(2);
  m = mark(0, "short delay");
  int first = be->poll(be->ctx, 0, m), polls = 1;
  while (be->poll(be->ctx, 0, m) != 0 && polls < 50)
    polls++;
  CHECK(first == 1 && polls < 50, "short delay: first poll %d, %d polls", first, polls);
  be->forget(be->ctx, 0, m);

  mockcuda_set_event_delay(-1);
  m = mark(0, "until the context synchronizes");
  CHECK(be->poll(be->ctx, 0, m) == 1, "pending marker");
  RC(cuCtxSynchronize(), CUDA_SUCCESS);
  CHECK(be->poll(be->ctx, 0, m) == 0, "a marker before cuCtxSynchronize has not passed");
  be->forget(be->ctx, 0, m);
  mockcuda_set_event_delay(0);
}

/* During a capture no marker is made and nothing is queried or waited on
 * (the driver would break the capture); afterwards all is as before. */
static void check_capture_on(CUstream s, const char *what) {
  uint64_t before = mark(0, what);
  mockcuda_counters c0 = snap();
  RC(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  uint64_t m = 0;
  int rm = be->mark(be->ctx, 0, &m);
  int rp = be->poll(be->ctx, 0, before);
  int rw = be->wait(be->ctx, 0, before);
  CUgraph g = NULL;
  CUresult re = cuStreamEndCapture(s, &g);
  mockcuda_counters c1 = snap();
  CHECK(rm != 0 && rp == 1 && rw != 0,
        "capture on a %s: mark %d, poll %d, wait %d (want refused, not yet, refused)", what, rm,
        rp, rw);
  CHECK(re == CUDA_SUCCESS && c1.capture_violations == c0.capture_violations &&
            c1.event_record == c0.event_record && c1.event_query == c0.event_query &&
            c1.event_synchronize == c0.event_synchronize,
        "capture on a %s ended %d after %" PRIu64 " violations, %" PRIu64 " records, %" PRIu64
        " queries, %" PRIu64 " synchronizes",
        what, (int)re, c1.capture_violations - c0.capture_violations,
        c1.event_record - c0.event_record, c1.event_query - c0.event_query,
        c1.event_synchronize - c0.event_synchronize);
  if (g)
    cuGraphDestroy(g);
  CHECK(be->poll(be->ctx, 0, before) == 0, "capture on a %s: the marker never passes", what);
  be->forget(be->ctx, 0, before);
}

/* A destroyed context's streams are no longer recorded on, its markers
 * count as passed without a query, and its events are not reused in the
 * next context (which may well get the dead one's address). */
static void check_context_destroyed(void) {
  CUcontext c2 = NULL, c3 = NULL;
  CUstream s2 = NULL, s3 = NULL;
  RC(cuCtxCreate_v4(&c2, NULL, 0, 1), CUDA_SUCCESS);
  RC(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mockcuda_counters c0 = snap();
  uint64_t m = mark(1, "own context on device 1");
  mockcuda_counters c1 = snap();
  records r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 1, "a created context with one non-blocking stream");
  RC(cuCtxDestroy(c2), CUDA_SUCCESS);
  c0 = snap();
  CHECK(be->poll(be->ctx, 1, m) == 0, "a dead context's marker has not passed");
  c1 = snap();
  CHECK(c1.event_query == c0.event_query, "polled a dead context's events");
  be->forget(be->ctx, 1, m);

  RC(cuCtxCreate_v4(&c3, NULL, 0, 1), CUDA_SUCCESS);
  c0 = snap();
  m = mark(1, "next context on device 1");
  c1 = snap();
  r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 0, "a new context (the dead one's stream forgotten)");
  CHECK(c1.event_create - c0.event_create == 1, "%" PRIu64 " events created, want 1",
        c1.event_create - c0.event_create);
  be->forget(be->ctx, 1, m);
  RC(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuStreamDestroy(s3), CUDA_SUCCESS);
  RC(cuCtxDestroy(c3), CUDA_SUCCESS);
}

/* The same for the primary context, through cuDevicePrimaryCtxReset. */
static void check_primary_reset(void) {
  CUcontext p1 = NULL, popped = NULL;
  CUstream s = NULL;
  RC(cuDevicePrimaryCtxRetain(&p1, 1), CUDA_SUCCESS);
  RC(cuCtxPushCurrent(p1), CUDA_SUCCESS);
  RC(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mockcuda_counters c0 = snap();
  uint64_t m1 = mark(1, "primary context of device 1");
  mockcuda_counters c1 = snap();
  records r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 1, "device 1's primary context with one non-blocking stream");
  RC(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  RC(cuDevicePrimaryCtxReset(1), CUDA_SUCCESS);
  RC(cuDevicePrimaryCtxRetain(&p1, 1), CUDA_SUCCESS);
  RC(cuCtxPushCurrent(p1), CUDA_SUCCESS);
  CHECK(be->poll(be->ctx, 1, m1) == 0, "a marker of a reset context has not passed");
  be->forget(be->ctx, 1, m1);
  c0 = snap();
  uint64_t m2 = mark(1, "after the reset");
  c1 = snap();
  r = records_between(&c0, &c1);
  CHECK_ONE_MARKER(r, 0, "after cuDevicePrimaryCtxReset");
  be->forget(be->ctx, 1, m2);
  RC(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  RC(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

/* Several threads mark, poll and forget while another makes and destroys
 * non-blocking streams (run under ThreadSanitizer by the thread build). */
static CUcontext thread_ctx;

static void *marker_thread(void *arg) {
  (void)arg;
  if (cuCtxSetCurrent(thread_ctx) != CUDA_SUCCESS)
    return (void *)1;
  for (int i = 0; i < 300; i++) {
    uint64_t m = 0;
    if (be->mark(be->ctx, 0, &m) != 0 || m == 0)
      return (void *)1;
    if (i % 3 == 0 && be->wait(be->ctx, 0, m) != 0)
      return (void *)1;
    be->poll(be->ctx, 0, m);
    be->forget(be->ctx, 0, m);
  }
  return NULL;
}

static void *stream_thread(void *arg) {
  (void)arg;
  if (cuCtxSetCurrent(thread_ctx) != CUDA_SUCCESS)
    return (void *)1;
  for (int i = 0; i < 300; i++) {
    CUstream s = NULL;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cuStreamDestroy(s) != CUDA_SUCCESS)
      return (void *)1;
  }
  return NULL;
}

static pthread_barrier_t fence_start;

static void *fence_thread(void *arg) {
  if (cuCtxSetCurrent((CUcontext)arg) != CUDA_SUCCESS)
    return (void *)1;
  pthread_barrier_wait(&fence_start); /* the first fences race */
  for (int i = 0; i < 100; i++)
    if (be->fence(be->ctx, 1) != 0)
      return (void *)1;
  return NULL;
}

/* Fences from four threads at once in a context that had none: one fence
 * event in all (a stream made later waits for the one every fence records),
 * and a non-blocking stream made after them waits for it. (The first
 * fences race for the event; the mock, whose calls take one lock, seldom
 * lets them collide, so this checks the outcome more than the race.) */
static void check_fence_threads(void) {
  CUcontext c = NULL;
  RC(cuCtxCreate_v4(&c, NULL, 0, 1), CUDA_SUCCESS);
  mockcuda_counters c0 = snap();
  pthread_t t[4];
  pthread_barrier_init(&fence_start, NULL, 4);
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, fence_thread, c);
  for (int i = 0; i < 4; i++) {
    void *r = NULL;
    pthread_join(t[i], &r);
    CHECK(r == NULL, "fence thread %d failed", i);
  }
  pthread_barrier_destroy(&fence_start);
  mockcuda_counters c1 = snap();
  records r = records_between(&c0, &c1);
  CHECK(c1.event_create - c0.event_create - (c1.event_destroy - c0.event_destroy) == 1 &&
            r.legacy == 400 && r.all == 400,
        "fences: %" PRIu64 " events kept, %" PRIu64 " legacy records of %" PRIu64
        " (want 1 event, 400 records on the legacy stream)",
        c1.event_create - c0.event_create - (c1.event_destroy - c0.event_destroy), r.legacy,
        r.all);
  CUstream s = NULL;
  c0 = snap();
  RC(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK(snap().wait_event_nonblocking == c0.wait_event_nonblocking + 1,
        "a stream made after the fences does not wait for them");
  RC(cuStreamDestroy(s), CUDA_SUCCESS);
  RC(cuCtxSetCurrent(c), CUDA_SUCCESS);
  RC(cuCtxDestroy(c), CUDA_SUCCESS);
}

static void check_threads(CUcontext ctx) {
  thread_ctx = ctx;
  mockcuda_counters c0 = snap();
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, i == 3 ? stream_thread : marker_thread, NULL);
  for (int i = 0; i < 4; i++) {
    void *r = NULL;
    pthread_join(t[i], &r);
    CHECK(r == NULL, "thread %d failed", i);
  }
  mockcuda_counters c1 = snap();
  records r = records_between(&c0, &c1);
  CHECK(r.legacy == 900 && r.blocking == 0 && r.per_thread == 0,
        "threads: %" PRIu64 " legacy records, want 900", r.legacy);
}

/* ---- the pool ------------------------------------------------------------ */

#define BLOCKS 4
#define BLOCK_SIZE (1u << 20)

static void alloc_all(CUdeviceptr *p) {
  for (int i = 0; i < BLOCKS; i++)
    RC(cuMemAlloc(&p[i], BLOCK_SIZE), CUDA_SUCCESS);
}

static void free_all(const CUdeviceptr *p) {
  for (int i = 0; i < BLOCKS; i++)
    RC(cuMemFree(p[i]), CUDA_SUCCESS);
}

/* Allocation churn with `live_nb` non-blocking streams alive. The pool
 * fences (backend.h): each fence records the fence event on the legacy
 * stream, and only there; with non-blocking streams alive, it first records
 * each one's tie event, which the legacy stream waits for, and after makes
 * each of them wait for the fence event. Nothing is recorded on, or made to
 * wait, any other stream. */
static records churn(int live_nb, const char *what) {
  mockcuda_counters c0 = snap();
  CUdeviceptr p[BLOCKS];
  for (int round = 0; round < 50; round++) {
    alloc_all(p);
    free_all(p);
  }
  mockcuda_counters c1 = snap();
  records r = records_between(&c0, &c1);
  uint64_t nb = (uint64_t)live_nb, fences = r.legacy;
  uint64_t wl = c1.wait_event_legacy - c0.wait_event_legacy,
           wn = c1.wait_event_nonblocking - c0.wait_event_nonblocking,
           wo = c1.wait_event_other - c0.wait_event_other;
  CHECK(r.nonblocking == fences * nb && r.blocking == 0 &&
            r.per_thread == 0 && wl == fences * nb && wn == fences * nb && wo == 0,
        "%s: records legacy %" PRIu64 ", non-blocking %" PRIu64 ", blocking %" PRIu64
        ", per-thread %" PRIu64 "; waits legacy %" PRIu64 ", non-blocking %" PRIu64
        ", other %" PRIu64 " (%d non-blocking streams)",
        what, r.legacy, r.nonblocking, r.blocking, r.per_thread, wl, wn, wo, live_nb);
  return r;
}

static int overlaps(CUdeviceptr x, const CUdeviceptr *set, int n) {
  for (int i = 0; i < n; i++)
    if (x == set[i])
      return 1;
  return 0;
}

/* A block freed while the device may still use it (its markers never pass
 * here) is handed out again only behind a fence made after its free: every
 * live non-blocking stream made to wait. A non-blocking stream made after a
 * fence waits for the fence event at once. */
#define MORE 64

static void check_pool_fences_reuse(int live_nb) {
  CUdeviceptr a[BLOCKS], b[MORE];
  mockcuda_set_event_delay(-1);
  alloc_all(a);
  free_all(a);
  mockcuda_counters c0 = snap();
  int reused = 0, unfenced = 0;
  for (int i = 0; i < MORE; i++) {
    RC(cuMemAlloc(&b[i], BLOCK_SIZE), CUDA_SUCCESS);
    if (overlaps(b[i], a, BLOCKS)) {
      mockcuda_counters c = snap();
      reused++;
      unfenced += c.event_record_legacy == c0.event_record_legacy ||
                  c.wait_event_nonblocking - c0.wait_event_nonblocking < (uint64_t)live_nb;
    }
  }
  mockcuda_set_event_delay(0);
  CHECK(unfenced == 0, "%d block(s) handed out again with no fence after their free", unfenced);
  CHECK(reused > 0, "the pool grew instead of fencing its %d pending blocks", BLOCKS);
  for (int i = 0; i < MORE; i++)
    RC(cuMemFree(b[i]), CUDA_SUCCESS);
  c0 = snap();
  CUstream late = NULL;
  RC(cuStreamCreate(&late, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CHECK(snap().wait_event_nonblocking == c0.wait_event_nonblocking + 1,
        "a non-blocking stream made after a fence does not wait for it");
  RC(cuStreamDestroy(late), CUDA_SUCCESS);
}

/* Allocating and freeing during a capture, as PyTorch's allocator does (a
 * global capture, the thread relaxed around its calls): no event. */
static void check_pool_capture(CUstream s) {
  CUdeviceptr p[BLOCKS];
  alloc_all(p);
  free_all(p);
  mockcuda_counters c0 = snap();
  RC(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  RC(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
  for (int round = 0; round < 4; round++) {
    alloc_all(p);
    free_all(p);
  }
  RC(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
  CUgraph g = NULL;
  RC(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  if (g)
    cuGraphDestroy(g);
  mockcuda_counters c1 = snap();
  CHECK(c1.event_record == c0.event_record && c1.event_query == c0.event_query &&
            c1.event_synchronize == c0.event_synchronize &&
            c1.capture_violations == c0.capture_violations,
        "during a capture: %" PRIu64 " records, %" PRIu64 " queries, %" PRIu64
        " synchronizes, %" PRIu64 " violations",
        c1.event_record - c0.event_record, c1.event_query - c0.event_query,
        c1.event_synchronize - c0.event_synchronize,
        c1.capture_violations - c0.capture_violations);
}

int main(void) {
  run_mode mode = detect_mode();
  const char *em = getenv("E2E_EXPECT_MARKERS");
  int expect_markers = mode == POOLED && em && !strcmp(em, "1");
  CUcontext ctx = NULL;
  RC(cuInit(0), CUDA_SUCCESS);
  mockcuda_set_event_delay(0); /* whatever MOCKCUDA_EVENT_DELAY says */
  RC(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  if (failures) {
    printf("FAIL e2e_streams: driver set-up failed\n");
    return 1;
  }

  /* The stream functions the program is bound to: the hooks when preloaded
   * (enabled:0 too: they pass through), the driver's own otherwise. */
  const void *create = (const void *)cuStreamCreate,
             *create_prio = (const void *)cuStreamCreateWithPriority,
             *destroy = (const void *)cuStreamDestroy;
  CHECK(in_mock(create) == (mode == PLAIN) && in_mock(create_prio) == (mode == PLAIN) &&
            in_mock(destroy) == (mode == PLAIN),
        "cuStreamCreate/WithPriority/Destroy_v2 in the mock: %d %d %d, run %s", in_mock(create),
        in_mock(create_prio), in_mock(destroy), mode_names[mode]);

  CUstream nb1 = NULL, nb2 = NULL, blk = NULL;
  RC(cuStreamCreate(&nb1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  RC(cuStreamCreateWithPriority(&nb2, CU_STREAM_NON_BLOCKING, -1), CUDA_SUCCESS);
  RC(cuStreamCreate(&blk, CU_STREAM_DEFAULT), CUDA_SUCCESS);

  be = NULL;
  const ca_backend *(*test_backend)(void) =
      (const ca_backend *(*)(void))dlsym(RTLD_DEFAULT, "ca_test_backend_cuda");
  CHECK((test_backend != NULL) == (mode != PLAIN), "ca_test_backend_cuda %s in a %s run",
        test_backend ? "found" : "missing", mode_names[mode]);
  if (mode == POOLED && test_backend != NULL) {
    be = test_backend();
    CHECK(be && be->mark && be->poll && be->wait && be->forget && be->fence,
          "the CUDA backend has no markers or fences");
  }

  /* The pool first, with both non-blocking streams alive. */
  records r = churn(2, "two non-blocking streams");
  if (expect_markers)
    CHECK(r.legacy > 0, "the pool made no marker in %d allocations", 50 * BLOCKS);
  else if (mode != POOLED)
    CHECK(r.all == 0, "%" PRIu64 " events recorded without a pool", r.all);
  check_pool_capture(blk);
  check_pool_capture(nb1);
  if (expect_markers)
    check_pool_fences_reuse(2);

  if (be && be->mark) {
    check_marks_cover_streams(nb1, nb2, blk); /* destroys nb2 */
    check_pending();
    check_capture_on(blk, "blocking stream");
    check_capture_on(nb1, "non-blocking stream");
    check_capture_on(CU_STREAM_PER_THREAD, "per-thread default stream");
    check_context_destroyed();
    check_primary_reset();
    check_threads(ctx);
    check_fence_threads();
    RC(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  } else {
    RC(cuStreamDestroy(nb2), CUDA_SUCCESS);
  }

  /* nb2 is gone: the pool's markers record on nb1 alone. */
  r = churn(1, "one non-blocking stream left");
  RC(cuStreamDestroy(nb1), CUDA_SUCCESS);
  RC(cuStreamDestroy(blk), CUDA_SUCCESS);
  r = churn(0, "no non-blocking stream left");
  RC(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);

  mockcuda_counters end = snap();
  if (failures) {
    printf("FAIL e2e_streams [%s]: %d assertion(s) failed\n", mode_names[mode], failures);
    return 1;
  }
  printf("PASS e2e_streams [%s%s]: %" PRIu64 " events recorded (%" PRIu64 " legacy, %" PRIu64
         " non-blocking), %" PRIu64 " created, %" PRIu64 " queries, %" PRIu64
         " synchronizes, %" PRIu64 " cuCtxSynchronize\n",
         mode_names[mode], expect_markers ? ", markers expected" : "", end.event_record,
         end.event_record_legacy, end.event_record_nonblocking, end.event_create, end.event_query,
         end.event_synchronize, end.ctx_synchronize);
  return 0;
}
