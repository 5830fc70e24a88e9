/*
 * bench_fence: what the driver calls that make up cudalloc's fence cost on
 * their own, so that the fence's share of a pooled allocate+free pair (see
 * bench_latency) can be read layer by layer.
 *
 * A fence (src/backend/backend_cuda.c) asks whether a capture is under way
 * (cuStreamIsCapturing on the legacy stream), records one event on the
 * legacy stream and, for each live non-blocking stream, records an event on
 * it, makes the legacy stream wait for that, and makes the stream wait for
 * the fence event. This program times each of those calls alone, on an idle
 * device (the calls only queue work), then the whole sequence by hand with
 * no non-blocking stream and with one.
 *
 *   bench_fence [calls_per_case]
 *
 * Prints one line per case:
 *   bench_fence: <case> <ns> ns per call (median of <groups> groups of 64)
 * This is a program, not a test: it checks every return code and exits 1 on
 * an error.
 */
#define BENCH_NAME "bench_fence"
#include "bench_gpu.h"

#include <string.h>

#define GROUP 64
#define GROUPS_MAX 4001


typedef struct fixture {
  CUstream nb;          /* a non-blocking stream */
  CUevent fence, tie;   /* the fence event; the stream's tie-in event */
} fixture;

typedef void (*call_fn)(const fixture *f);

static void get_current(const fixture *f) {
  (void)f;
  CUcontext c;
  DK(cuCtxGetCurrent(&c));
}

static void capturing(CUstream s) {
  CUstreamCaptureStatus st;
  DK(cuStreamIsCapturing(s, &st));
}

static void capturing_legacy(const fixture *f) {
  (void)f;
  capturing(CU_STREAM_LEGACY);
}

static void capturing_per_thread(const fixture *f) {
  (void)f;
  capturing(CU_STREAM_PER_THREAD);
}

static void record_legacy(const fixture *f) {
  DK(cuEventRecord(f->fence, CU_STREAM_LEGACY));
}

static void record_nb(const fixture *f) { DK(cuEventRecord(f->tie, f->nb)); }

static void legacy_waits(const fixture *f) {
  DK(cuStreamWaitEvent(CU_STREAM_LEGACY, f->tie, 0));
}

static void nb_waits(const fixture *f) {
  DK(cuStreamWaitEvent(f->nb, f->fence, 0));
}

static void query(const fixture *f) { (void)cuEventQuery(f->fence); }

/* The fence with no non-blocking stream: a capture check and a record. */
static void fence_plain(const fixture *f) {
  capturing_legacy(f);
  record_legacy(f);
}

/* The fence with one non-blocking stream tied in before and after. */
static void fence_one_stream(const fixture *f) {
  capturing_legacy(f);
  record_nb(f);
  legacy_waits(f);
  record_legacy(f);
  nb_waits(f);
}

typedef struct bench_case {
  const char *name;
  call_fn fn;
} bench_case;

static const bench_case cases[] = {
    {"cuCtxGetCurrent", get_current},
    {"cuStreamIsCapturing(legacy)", capturing_legacy},
    {"cuStreamIsCapturing(per-thread)", capturing_per_thread},
    {"cuEventRecord(legacy)", record_legacy},
    {"cuEventRecord(non-blocking)", record_nb},
    {"cuStreamWaitEvent(legacy)", legacy_waits},
    {"cuStreamWaitEvent(non-blocking)", nb_waits},
    {"cuEventQuery", query},
    {"fence, no non-blocking stream", fence_plain},
    {"fence, one non-blocking stream", fence_one_stream},
};

static double group_ns[GROUPS_MAX];

static void measure(const fixture *f, const bench_case *c, int calls) {
  int groups = calls / GROUP;
  groups = groups < 11 ? 11 : groups > GROUPS_MAX ? GROUPS_MAX : groups;
  for (int i = 0; i < GROUP; i++) /* warm-up */
    c->fn(f);
  for (int g = 0; g < groups; g++) {
    double start = now_ns();
    for (int i = 0; i < GROUP; i++)
      c->fn(f);
    group_ns[g] = (now_ns() - start) / GROUP;
  }
  /* The queue of recorded events and waits drains between cases. */
  CK(cudaDeviceSynchronize());
  qsort(group_ns, (size_t)groups, sizeof(group_ns[0]), cmp_double);
  printf("bench_fence: %s %.1f ns per call (median of %d groups of %d, min "
         "%.1f, max %.1f)\n",
         c->name, group_ns[groups / 2], groups, GROUP, group_ns[0],
         group_ns[groups - 1]);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int calls = argc > 1 ? atoi(argv[1]) : 100000;
  if (calls <= 0) {
    fprintf(stderr, "usage: bench_fence [calls_per_case]\n");
    return 2;
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* the primary context, current from here on */
  fixture f;
  memset(&f, 0, sizeof(f));
  DK(cuStreamCreate(&f.nb, CU_STREAM_NON_BLOCKING));
  DK(cuEventCreate(&f.fence, CU_EVENT_DISABLE_TIMING));
  DK(cuEventCreate(&f.tie, CU_EVENT_DISABLE_TIMING));
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    measure(&f, &cases[i], calls);
  DK(cuEventDestroy(f.tie));
  DK(cuEventDestroy(f.fence));
  DK(cuStreamDestroy(f.nb));
  return 0;
}
