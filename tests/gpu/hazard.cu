/*
 * hazard: a block freed while device work queued before the free still
 * writes it, handed out again and used on another stream.
 *
 * Why: cudaFree waits for all device work on every stream, so a program may
 * free a buffer that a kernel on some stream has yet to write, and allocate
 * and use a new buffer on another stream, without any synchronization of its
 * own (design.md, section 3: cudaFree waited 2.2 ms for a 2 ms kernel). A
 * pool that skips that wait must not hand the block out again until the
 * work queued before its free can no longer touch it, whatever stream it
 * was on: that is cudalloc's reuse_policy:safe (the default); device_sync
 * waits as cudaFree does; immediate reuses at once and is documented as
 * hazardous with several streams. This program is the hazard, made
 * deterministic: it shows as a new buffer overwritten by an old kernel.
 *
 * What it does, each round (200 by default, sizes 256 B, 4 KiB, 64 KiB,
 * 1 MiB, 16 MiB and 64 MiB in turn), with two streams S1, S2: non-blocking
 * streams by default; with HAZARD_STREAMS=blocking two blocking streams
 * (ordered only through the legacy stream), with HAZARD_STREAMS=perthread
 * S1 the thread's per-thread default stream and S2 a non-blocking stream:
 *  - cudaMalloc X; launch on S1 a kernel that waits DELAY (3 ms, on the
 *    GPU's %globaltimer) and then writes pattern A into all of X;
 *  - at once, without any synchronization: cudaFree(X), cudaMalloc Y of the
 *    same size, cudaMemsetAsync Y to pattern B on S2;
 *  - records whether the kernel was still running at that point (an event
 *    after it, queried) and whether Y == X (the address came back);
 *  - synchronizes S1 and S2, counts the words of Y that are not B with a
 *    kernel, and copies the first and last 4 KiB of Y back to check on the
 *    host; a round with any such word had Y overwritten; frees Y.
 * Before the rounds, a calibration run checks that the kernel really takes
 * at least 80% of DELAY and really writes A (else "0 overwritten" would
 * prove nothing).
 *
 * Checks (first argument):
 *   safe    no round may have Y overwritten (plain cudaFree, cudalloc's
 *           reuse_policy safe and device_sync);
 *   report  the count is printed, never judged (reuse_policy:immediate,
 *           where overwritten rounds are the documented hazard).
 * Every CUDA return code is checked in both. It prints the line
 *   hazard: result rounds=R overwritten=N reused=M pending=P
 * (reused: Y == X; pending: the kernel still ran after the free and the new
 * allocation: under plain cudaFree and device_sync it is 0, under a pool
 * that does not wait it is close to R) which scripts/gpu-check.sh reads, the
 * library's "pooled:" line (gpu_check.h), and last "hazard: PASS" or
 * "hazard: FAIL: <why>".
 *
 * Usage: hazard <safe|report> [rounds] [delay_us]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_check.h"

#define THREADS 256u
#define WINDOW_WORDS 1024u /* 4 KiB checked on the host at each end */
#define PATTERN_A 0xA11CE5EDu
#define BYTE_B 0x5B
#define PATTERN_B 0x5B5B5B5Bu

static const size_t sizes[] = {256,      4096,      65536,
                               1u << 20, 16u << 20, 64u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

__device__ static uint64_t global_ns(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Every block waits `delay_ns` from its own start, then the grid writes
 * `a` into all of p. The grid is small enough to be resident at once, so
 * the whole kernel takes about delay_ns. */
__global__ void late_write_kernel(uint32_t *p, size_t n, uint32_t a,
                                  uint64_t delay_ns) {
  if (threadIdx.x == 0) {
    uint64_t t0 = global_ns();
    while (global_ns() - t0 < delay_ns)
      __nanosleep(1000);
  }
  __syncthreads();
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    p[i] = a;
}

__global__ void count_kernel(const uint32_t *p, size_t n, uint32_t want,
                             unsigned long long *bad) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  unsigned long long mine = 0;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    mine += p[i] != want;
  if (mine)
    atomicAdd(bad, mine);
}

typedef struct ctx {
  cudaStream_t s1, s2;
  int per_thread; /* s1 is cudaStreamPerThread */
  cudaEvent_t done;          /* after the late write, on S1 */
  unsigned long long *d_bad; /* one counter, live all along */
  unsigned resident_blocks;  /* blocks that fit on the GPU at once */
  uint64_t delay_ns;
  uint32_t host_window[WINDOW_WORDS];
  uint64_t my_allocs, my_frees;
} ctx;

typedef struct tally {
  long rounds, overwritten, reused, pending;
  long overwritten_by_size[NSIZES];
  long first_round; /* first overwritten round, -1: none */
  unsigned long long first_bad;
} tally;

static unsigned grid_for(const ctx *c, size_t n) {
  size_t blocks = (n + THREADS - 1) / THREADS;
  if (blocks > c->resident_blocks)
    blocks = c->resident_blocks;
  return blocks == 0 ? 1u : (unsigned)blocks;
}

static void late_write(ctx *c, uint32_t *p, size_t bytes) {
  size_t n = bytes / 4;
  late_write_kernel<<<grid_for(c, n), THREADS, 0, c->s1>>>(p, n, PATTERN_A,
                                                           c->delay_ns);
  CK_LAUNCH();
  CK(cudaEventRecord(c->done, c->s1));
}

/* Words of p (bytes long) that are not `want`, counted on S2 after the work
 * queued there, plus the host's look at both ends. */
static unsigned long long count_not(ctx *c, const uint32_t *p, size_t bytes,
                                    uint32_t want) {
  size_t n = bytes / 4;
  unsigned long long bad = ~0ull;
  CK(cudaMemsetAsync(c->d_bad, 0, sizeof(*c->d_bad), c->s2));
  count_kernel<<<grid_for(c, n), THREADS, 0, c->s2>>>(p, n, want, c->d_bad);
  CK_LAUNCH();
  CK(cudaMemcpyAsync(&bad, c->d_bad, sizeof(bad), cudaMemcpyDeviceToHost,
                     c->s2));
  CK(cudaStreamSynchronize(c->s2));
  size_t window = n < WINDOW_WORDS ? n : WINDOW_WORDS;
  size_t starts[2] = {0, n - window};
  unsigned long long host_bad = 0;
  for (int k = 0; k < 2; k++) {
    CK(cudaMemcpyAsync(c->host_window, p + starts[k], window * 4,
                       cudaMemcpyDeviceToHost, c->s2));
    CK(cudaStreamSynchronize(c->s2));
    for (size_t i = 0; i < window; i++)
      host_bad += c->host_window[i] != want;
  }
  if (host_bad != 0 && bad == 0)
    gc_fail("the host saw %llu wrong words where the counting kernel saw "
            "none",
            host_bad);
  return bad;
}

/* The kernel must take about the delay and write A everywhere: otherwise
 * the rounds test nothing. */
static void calibrate(ctx *c) {
  const size_t bytes = 16u << 20;
  uint32_t *p = NULL;
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  CK(cudaMalloc((void **)&p, bytes));
  c->my_allocs++;
  CK(cudaEventRecord(t0, c->s1));
  late_write(c, p, bytes);
  CK(cudaEventRecord(t1, c->s1));
  CK(cudaStreamSynchronize(c->s1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, t0, t1));
  printf("hazard: calibration: the late write took %.2f ms (delay %.2f ms)\n",
         ms, (double)c->delay_ns / 1e6);
  if (ms < 0.8 * ((double)c->delay_ns / 1e6))
    gc_fail("the late-write kernel took %.2f ms, less than 80%% of its "
            "%.2f ms delay: %%globaltimer does not wait here",
            ms, (double)c->delay_ns / 1e6);
  unsigned long long bad = count_not(c, p, bytes, PATTERN_A);
  if (bad != 0)
    gc_fail("calibration: %llu words of the late write are not A", bad);
  CK(cudaFree(p));
  c->my_frees++;
  CK(cudaEventDestroy(t0));
  CK(cudaEventDestroy(t1));
}

/* Whether the event after the late write is still ahead: the kernel had not
 * finished. Never waits. */
static int still_running(const ctx *c) {
  cudaError_t e = cudaEventQuery(c->done);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError(); /* not an error; keep CK_LAUNCH clean */
    return 1;
  }
  CK(e);
  return 0;
}

static void one_round(ctx *c, tally *t, long round) {
  size_t k = (size_t)round % NSIZES, bytes = sizes[k];
  uint32_t *x = NULL, *y = NULL;
  CK(cudaMalloc((void **)&x, bytes));
  late_write(c, x, bytes);
  CK(cudaFree(x)); /* at once: the kernel is still waiting */
  CK(cudaMalloc((void **)&y, bytes));
  CK(cudaMemsetAsync(y, BYTE_B, bytes, c->s2));
  c->my_allocs += 2;
  c->my_frees++;
  t->pending += still_running(c);
  t->reused += x == y;
  CK(cudaStreamSynchronize(c->s1));
  CK(cudaStreamSynchronize(c->s2));
  unsigned long long bad = count_not(c, y, bytes, PATTERN_B);
  if (bad != 0) {
    if (t->first_round < 0) {
      t->first_round = round;
      t->first_bad = bad;
    }
    t->overwritten++;
    t->overwritten_by_size[k]++;
  }
  CK(cudaFree(y));
  c->my_frees++;
  t->rounds++;
}

static void setup(ctx *c, long delay_us) {
  int device = 0, sms = 0, per_sm = 0;
  memset(c, 0, sizeof(*c));
  CK(cudaSetDevice(0));
  CK(cudaGetDevice(&device));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, late_write_kernel,
                                                   (int)THREADS, 0));
  if (sms < 1 || per_sm < 1)
    gc_fail("device reports %d SMs, %d resident blocks per SM", sms, per_sm);
  c->resident_blocks = (unsigned)sms * (per_sm < 2 ? (unsigned)per_sm : 2u);
  c->delay_ns = (uint64_t)delay_us * 1000u;
  const char *kind = getenv("HAZARD_STREAMS");
  c->per_thread = kind != NULL && strcmp(kind, "perthread") == 0;
  unsigned flags = kind != NULL && strcmp(kind, "blocking") == 0
                       ? cudaStreamDefault
                       : cudaStreamNonBlocking;
  if (kind != NULL && flags == cudaStreamNonBlocking && !c->per_thread &&
      strcmp(kind, "nonblocking") != 0)
    gc_fail("HAZARD_STREAMS=%s: nonblocking, blocking or perthread", kind);
  if (c->per_thread)
    c->s1 = cudaStreamPerThread;
  else
    CK(cudaStreamCreateWithFlags(&c->s1, flags));
  CK(cudaStreamCreateWithFlags(&c->s2, flags));
  CK(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
  CK(cudaMalloc((void **)&c->d_bad, sizeof(*c->d_bad)));
  c->my_allocs++;
  printf("hazard: %d SMs, grid of at most %u blocks, delay %ld us, streams "
         "%s\n",
         sms, c->resident_blocks, delay_us, kind ? kind : "nonblocking");
}

static void teardown(ctx *c) {
  CK(cudaFree(c->d_bad));
  c->my_frees++;
  CK(cudaEventDestroy(c->done));
  if (!c->per_thread)
    CK(cudaStreamDestroy(c->s1));
  CK(cudaStreamDestroy(c->s2));
  CK(cudaDeviceSynchronize());
}

static void print_tally(const tally *t) {
  printf("hazard: overwritten rounds by size:");
  for (size_t k = 0; k < NSIZES; k++)
    printf(" %zuB=%ld", sizes[k], t->overwritten_by_size[k]);
  printf("\n");
  if (t->first_round >= 0)
    printf("hazard: first overwritten round %ld (%zu bytes): %llu words not "
           "B\n",
           t->first_round, sizes[(size_t)t->first_round % NSIZES],
           t->first_bad);
  printf("hazard: result rounds=%ld overwritten=%ld reused=%ld pending=%ld\n",
         t->rounds, t->overwritten, t->reused, t->pending);
}

int main(int argc, char **argv) {
  gc_name = "hazard";
  setvbuf(stdout, NULL, _IOLBF, 0);
  int judge = argc > 1 && strcmp(argv[1], "safe") == 0;
  if (argc < 2 || (!judge && strcmp(argv[1], "report") != 0)) {
    fprintf(stderr, "usage: hazard <safe|report> [rounds] [delay_us]\n");
    return 2;
  }
  long rounds = argc > 2 ? strtol(argv[2], NULL, 10) : 200;
  long delay_us = argc > 3 ? strtol(argv[3], NULL, 10) : 3000;
  if (rounds < (long)NSIZES || delay_us < 100 || delay_us > 100000)
    gc_fail("bad arguments: rounds %ld (at least %zu), delay %ld us "
            "(100 to 100000)",
            rounds, NSIZES, delay_us);

  ctx *c = (ctx *)malloc(sizeof(ctx));
  if (c == NULL)
    gc_fail("host malloc failed");
  setup(c, delay_us);
  calibrate(c);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  tally t;
  memset(&t, 0, sizeof(t));
  t.first_round = -1;
  for (long r = 0; r < rounds; r++)
    one_round(c, &t, r);
  teardown(c);
  printf("hazard: %ld rounds in %.2f s, expectation %s\n", t.rounds,
         gc_elapsed(&t0), argv[1]);
  print_tally(&t);
  gc_check_stats(GC_EXPECT_ANY, 0, c->my_allocs, c->my_frees);
  if (judge && t.overwritten != 0)
    gc_fail("%ld of %ld rounds had the new block overwritten by a kernel "
            "queued before the old block's free (first: round %ld, %zu "
            "bytes)",
            t.overwritten, t.rounds, t.first_round,
            sizes[(size_t)t.first_round % NSIZES]);
  free(c);
  printf("hazard: PASS\n");
  return 0;
}
