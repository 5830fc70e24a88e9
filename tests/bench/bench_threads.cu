/*
 * bench_threads: how allocation throughput scales with host threads, on a
 * real GPU.
 *
 * THREADS threads share device 0 (each calls cudaSetDevice(0), so all of
 * them work in the primary context, as the threads of a serving process
 * do). Each keeps a window of WINDOW (16) live blocks, sizes drawn from a
 * small fixed set (256 B to 64 KiB) by its own fixed-seed PRNG, and in each
 * step frees a random block of its window and allocates a new one in its
 * place: two operations. The threads start each round together at a
 * barrier and the round ends when the last of them is done; the figure is
 * the total number of operations per second of wall time, the median over
 * ROUNDS rounds (3) after one shorter warm-up round. Run with 1, 2, 4 and 8
 * threads and compare each figure with the same setting's 1-thread one.
 *
 * Modes: "sync" (default) calls cudaMalloc/cudaFree; run it plain and under
 * LD_PRELOAD=libcudalloc.so (scripts/bench-gpu.sh does). "async" calls
 * cudaMallocAsync/cudaFreeAsync, each thread on its own non-blocking
 * stream, all from the device's default memory pool keeping everything
 * (release threshold UINT64_MAX): the driver's stream-ordered pool, as a
 * reference; each thread synchronizes its stream at the end of a round,
 * inside the timing.
 *
 *   bench_threads [sync|async] [threads] [ops_per_thread] [rounds]
 *
 * This is a program, not a test: it checks every CUDA return code and exits
 * 1 on an error, and prints one line:
 *   bench_threads: <ops> ops per s (median of <rounds> rounds, ...), mode
 *   <mode>, threads <threads>
 */
#define BENCH_NAME "bench_threads"
#include "bench_gpu.h"

#include <cuda_runtime.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WINDOW 16
#define MAX_THREADS 64
#define MAX_ROUNDS 64
#define SEED 0x7EAD5EEDull

static const size_t sizes[] = {256, 1u << 10, 4u << 10, 16u << 10, 64u << 10};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* What every thread shares: the mode, the rounds and the barrier that
 * starts and ends each of them (THREADS workers and the timing thread). */
typedef struct shared {
  int async;
  int rounds;       /* timed rounds, after one warm-up round */
  long steps;       /* free+allocate steps per thread in a timed round */
  long warm_steps;  /* ... in the warm-up round */
  pthread_barrier_t barrier;
} shared;

typedef struct worker {
  shared *sh;
  int index;
  cudaStream_t stream;
  uint64_t rng;
  void *slot[WINDOW];
} worker;

static void alloc_slot(worker *w, int s) {
  size_t bytes = sizes[next_random(&w->rng) % N_SIZES];
  if (w->sh->async)
    CK(cudaMallocAsync(&w->slot[s], bytes, w->stream));
  else
    CK(cudaMalloc(&w->slot[s], bytes));
}

static void free_slot(worker *w, int s) {
  if (w->sh->async)
    CK(cudaFreeAsync(w->slot[s], w->stream));
  else
    CK(cudaFree(w->slot[s]));
  w->slot[s] = NULL;
}

/* STEPS steps of one freed and one allocated block each. */
static void run_steps(worker *w, long steps) {
  for (long i = 0; i < steps; i++) {
    int s = (int)(next_random(&w->rng) % WINDOW);
    free_slot(w, s);
    alloc_slot(w, s);
  }
  if (w->sh->async)
    CK(cudaStreamSynchronize(w->stream));
}

/* Meets the others at the barrier; the timing thread reads the clock
 * between two of them. */
static void meet(shared *sh) {
  int rc = pthread_barrier_wait(&sh->barrier);
  if (rc != 0 && rc != PTHREAD_BARRIER_SERIAL_THREAD) {
    fprintf(stderr, "bench_threads: pthread_barrier_wait failed\n");
    exit(1);
  }
}

static void *worker_main(void *arg) {
  worker *w = (worker *)arg;
  shared *sh = w->sh;
  CK(cudaSetDevice(0));
  if (sh->async)
    CK(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
  w->rng = SEED + (uint64_t)w->index * 0x1000193ull;
  for (int s = 0; s < WINDOW; s++)
    alloc_slot(w, s);
  for (int r = 0; r <= sh->rounds; r++) {
    meet(sh);
    run_steps(w, r == 0 ? sh->warm_steps : sh->steps);
    meet(sh);
  }
  for (int s = 0; s < WINDOW; s++)
    free_slot(w, s);
  if (sh->async) {
    CK(cudaStreamSynchronize(w->stream));
    CK(cudaStreamDestroy(w->stream));
  }
  return NULL;
}

static void setup_device(int async) {
  CK(cudaSetDevice(0));
  CK(cudaFree(0)); /* the context, outside the timing */
  if (async) {
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    CK(cudaDeviceGetDefaultMemPool(&pool, 0));
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
}

/* Starts the workers, times each round between its two barriers, joins
 * them. Operations per second of each timed round in OPS_PER_S. */
static void run_rounds(shared *sh, int threads, double *ops_per_s) {
  static worker workers[MAX_THREADS];
  pthread_t tid[MAX_THREADS];
  for (int t = 0; t < threads; t++) {
    workers[t].sh = sh;
    workers[t].index = t;
    if (pthread_create(&tid[t], NULL, worker_main, &workers[t]) != 0) {
      fprintf(stderr, "bench_threads: pthread_create failed\n");
      exit(1);
    }
  }
  for (int r = 0; r <= sh->rounds; r++) {
    meet(sh);
    double start = now_ns();
    meet(sh);
    double ns = now_ns() - start;
    if (r > 0)
      ops_per_s[r - 1] = 2.0 * (double)sh->steps * threads / (ns / 1e9);
  }
  for (int t = 0; t < threads; t++)
    pthread_join(tid[t], NULL);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "sync";
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  long ops = argc > 3 ? atol(argv[3]) : 200000;
  int rounds = argc > 4 ? atoi(argv[4]) : 3;
  if ((strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0) ||
      threads < 1 || threads > MAX_THREADS || ops < 2 || rounds < 1 ||
      rounds > MAX_ROUNDS) {
    fprintf(stderr,
            "usage: bench_threads [sync|async] [threads (1..%d)] "
            "[ops_per_thread (>= 2)] [rounds (1..%d)]\n",
            MAX_THREADS, MAX_ROUNDS);
    return 2;
  }
  static shared sh;
  double ops_per_s[MAX_ROUNDS];
  sh.async = strcmp(mode, "async") == 0;
  sh.rounds = rounds;
  sh.steps = ops / 2;
  sh.warm_steps = sh.steps / 4 > 0 ? sh.steps / 4 : 1;
  if (pthread_barrier_init(&sh.barrier, NULL, (unsigned)threads + 1) != 0) {
    fprintf(stderr, "bench_threads: pthread_barrier_init failed\n");
    return 1;
  }
  setup_device(sh.async);
  run_rounds(&sh, threads, ops_per_s);
  qsort(ops_per_s, (size_t)rounds, sizeof(ops_per_s[0]), cmp_double);
  printf("bench_threads: %.0f ops per s (median of %d rounds of %ld ops per "
         "thread, min %.0f, max %.0f), mode %s, threads %d\n",
         ops_per_s[rounds / 2], rounds, 2 * sh.steps, ops_per_s[0],
         ops_per_s[rounds - 1], mode, threads);
  pthread_barrier_destroy(&sh.barrier);
  return 0;
}
