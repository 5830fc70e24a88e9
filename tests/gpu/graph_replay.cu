/*
 * graph_replay: a CUDA graph captured from a stream, with memory nodes,
 * replayed while the program allocates and frees around it.
 *
 * Why: a stream capture turns every call on the captured stream into a
 * graph node instead of running it, and in global capture mode a
 * synchronizing call or an event query made while the capture is open
 * invalidates it (design.md, section 4). A pool that waits for the device,
 * records or queries events to keep freed blocks safe (reuse_policy safe,
 * device_sync) must never do so into an open capture, and must still keep
 * the blocks safe from the graph's replays afterwards. Graphs are how
 * PyTorch (CUDA graphs), JAX and TensorRT run; their memory nodes are
 * stream-ordered allocations (cudaMallocAsync inside the capture), which
 * the library passes to the driver and tracks.
 *
 * What it does, on a non-blocking stream S:
 *  - before the capture, cudaMalloc the graph's buffers (input, output,
 *    accumulator) and a scratch block that a kernel on S writes and that is
 *    freed with cudaFree at once, so that a free is pending when the
 *    capture begins;
 *  - captures, in cudaStreamCaptureModeGlobal: cudaMallocAsync of two
 *    temporaries, three kernels (mid = in*3+1; mid2 = mid ^ (mid >> 7) +
 *    round constant; out = mid2 + in, acc += out), cudaFreeAsync of both
 *    temporaries; checks the capture ended valid and instantiates it;
 *  - replays it 100 times: a kernel on S writes the replay's input, the
 *    graph is launched on S, and while it runs the host frees the plain
 *    scratch blocks of the previous replay and cudaMalloc's new ones of
 *    assorted sizes, fills and checks them on a second non-blocking stream
 *    S2 (a block is used on S2 only and freed one replay later, after S2
 *    was synchronized, so this is correct under every reuse policy; the
 *    graph's own work is what is queued at each free);
 *    then the output is copied back and compared with the host's
 *    computation of the same replay, and the scratch mismatch counter must
 *    be 0;
 *  - at the end the accumulator is compared with the host's sum over all
 *    replays.
 * Every CUDA return code is checked. At the end the library's statistics
 * are printed (no expectation here; the script requires the pool to have
 * served the program's allocations when preloaded). Last line:
 * "graph_replay: PASS" or "graph_replay: FAIL: <why>".
 *
 * Usage: graph_replay [replays] (100 by default)
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
#define GRID 512u
#define N_WORDS ((size_t)1 << 20) /* 4 MiB per graph buffer */
#define SCRATCH 6                 /* plain blocks churned per replay */
#define ROUND_CONST 0x1F3D5B79u

/* ---- The computation, on the device and on the host ------------------- */

GC_HD static inline uint32_t input_of(uint32_t replay, size_t i) {
  return gc_pattern(replay + 1000u, i);
}

GC_HD static inline uint32_t out_of(uint32_t in) {
  uint32_t mid = in * 3u + 1u;
  uint32_t mid2 = (mid ^ (mid >> 7)) + ROUND_CONST;
  return mid2 + in;
}

__global__ void input_kernel(uint32_t *in, size_t n, uint32_t replay) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    in[i] = input_of(replay, i);
}

__global__ void step1_kernel(const uint32_t *in, uint32_t *mid, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mid[i] = in[i] * 3u + 1u;
}

__global__ void step2_kernel(const uint32_t *mid, uint32_t *mid2, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mid2[i] = (mid[i] ^ (mid[i] >> 7)) + ROUND_CONST;
}

__global__ void step3_kernel(const uint32_t *mid2, const uint32_t *in,
                             uint32_t *out, uint32_t *acc, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint32_t o = mid2[i] + in[i];
    out[i] = o;
    acc[i] += o;
  }
}

typedef struct ctx {
  cudaStream_t s, s2;
  uint32_t *in, *out, *acc;  /* the graph's buffers (plain cudaMalloc) */
  unsigned long long *d_bad; /* scratch mismatches, on S2 */
  uint32_t *h_out;           /* pinned */
  uint32_t *h_acc;           /* the host's accumulator */
  uint32_t *scratch[SCRATCH];
  uint32_t serial;
  uint64_t my_allocs, my_frees, scratch_bytes;
} ctx;

/* ---- Before the capture ------------------------------------------------ */

static void setup(ctx *c) {
  memset(c, 0, sizeof(*c));
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&c->s2, cudaStreamNonBlocking));
  CK(cudaMalloc((void **)&c->in, N_WORDS * 4));
  CK(cudaMalloc((void **)&c->out, N_WORDS * 4));
  CK(cudaMalloc((void **)&c->acc, N_WORDS * 4));
  CK(cudaMalloc((void **)&c->d_bad, sizeof(*c->d_bad)));
  c->my_allocs += 4;
  CK(cudaMemsetAsync(c->acc, 0, N_WORDS * 4, c->s));
  CK(cudaMemsetAsync(c->d_bad, 0, sizeof(*c->d_bad), c->s2));
  CK(cudaMallocHost((void **)&c->h_out, N_WORDS * 4));
  c->h_acc = (uint32_t *)calloc(N_WORDS, 4);
  if (c->h_acc == NULL)
    gc_fail("host calloc failed");
  c->serial = 1;

  /* A block freed with a kernel still writing it, just before the capture:
   * the pool has a pending free when the capture begins. */
  uint32_t *pending = NULL;
  CK(cudaMalloc((void **)&pending, 16u << 20));
  c->my_allocs++;
  gc_fill_kernel<<<GRID, THREADS, 0, c->s>>>(pending, (16u << 20) / 4, 7u);
  CK_LAUNCH();
  CK(cudaFree(pending));
  c->my_frees++;
}

/* ---- The capture ------------------------------------------------------- */

/* The captured graph must hold the two allocations, three kernels and two
 * frees: the capture recorded every call. Returns the node count. */
static size_t check_nodes(cudaGraph_t graph) {
  size_t n = 0;
  CK(cudaGraphGetNodes(graph, NULL, &n));
  cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof(*nodes));
  if (nodes == NULL)
    gc_fail("host calloc failed");
  CK(cudaGraphGetNodes(graph, nodes, &n));
  int kernels = 0, allocs = 0, frees = 0;
  for (size_t i = 0; i < n; i++) {
    cudaGraphNodeType type;
    CK(cudaGraphNodeGetType(nodes[i], &type));
    kernels += type == cudaGraphNodeTypeKernel;
    allocs += type == cudaGraphNodeTypeMemAlloc;
    frees += type == cudaGraphNodeTypeMemFree;
  }
  free(nodes);
  if (kernels != 3 || allocs != 2 || frees != 2)
    gc_fail("the graph has %d kernel, %d allocation and %d free nodes (of "
            "%zu), expected 3, 2 and 2",
            kernels, allocs, frees, n);
  return n;
}

static cudaGraphExec_t capture(ctx *c) {
  cudaGraph_t graph = NULL;
  uint32_t *mid = NULL, *mid2 = NULL;
  size_t n = N_WORDS;
  CK(cudaStreamBeginCapture(c->s, cudaStreamCaptureModeGlobal));
  CK(cudaMallocAsync((void **)&mid, n * 4, c->s));
  step1_kernel<<<GRID, THREADS, 0, c->s>>>(c->in, mid, n);
  CK_LAUNCH();
  CK(cudaMallocAsync((void **)&mid2, n * 4, c->s));
  step2_kernel<<<GRID, THREADS, 0, c->s>>>(mid, mid2, n);
  CK_LAUNCH();
  CK(cudaFreeAsync(mid, c->s));
  step3_kernel<<<GRID, THREADS, 0, c->s>>>(mid2, c->in, c->out, c->acc, n);
  CK_LAUNCH();
  CK(cudaFreeAsync(mid2, c->s));
  CK(cudaStreamEndCapture(c->s, &graph));
  if (graph == NULL)
    gc_fail("cudaStreamEndCapture gave no graph");
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  CK(cudaStreamIsCapturing(c->s, &st));
  if (st != cudaStreamCaptureStatusNone)
    gc_fail("stream still capturing after cudaStreamEndCapture (%d)", (int)st);
  size_t nodes = check_nodes(graph);
  cudaGraphExec_t exec = NULL;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphDestroy(graph));
  printf("graph_replay: captured %zu nodes (global capture mode), "
         "instantiated\n",
         nodes);
  return exec;
}

/* ---- The replays ------------------------------------------------------- */

/* Frees the previous replay's scratch blocks, allocates new ones of
 * assorted sizes and queues their fill and check on S2: all while the graph
 * runs on S. Each block is used on S2 only and S2 was synchronized since,
 * so its free is safe under every reuse policy. */
static void churn(ctx *c, int replay) {
  for (int k = 0; k < SCRATCH; k++) {
    if (c->scratch[k] != NULL) {
      CK(cudaFree(c->scratch[k]));
      c->my_frees++;
    }
    size_t bytes = (size_t)4096 << ((replay + k * 3) % 13); /* 4 KiB..16 MiB */
    bytes += (size_t)(k * 512);
    size_t n = bytes / 4;
    uint32_t serial = c->serial++;
    CK(cudaMalloc((void **)&c->scratch[k], bytes));
    c->my_allocs++;
    c->scratch_bytes += bytes;
    gc_fill_kernel<<<GRID, THREADS, 0, c->s2>>>(c->scratch[k], n, serial);
    CK_LAUNCH();
    gc_verify_kernel<<<GRID, THREADS, 0, c->s2>>>(c->scratch[k], n, serial,
                                               c->d_bad);
    CK_LAUNCH();
  }
}

static void check_replay(ctx *c, int replay) {
  for (size_t i = 0; i < N_WORDS; i++) {
    uint32_t in = input_of((uint32_t)replay, i);
    uint32_t want = out_of(in);
    c->h_acc[i] += want;
    if (c->h_out[i] != want)
      gc_fail("replay %d: out[%zu] is 0x%08x, expected 0x%08x", replay, i,
              c->h_out[i], want);
  }
  unsigned long long bad = ~0ull;
  CK(cudaMemcpy(&bad, c->d_bad, sizeof(bad), cudaMemcpyDeviceToHost));
  if (bad != 0)
    gc_fail("replay %d: %llu words of the scratch blocks were wrong", replay,
            bad);
}

static void replay_all(ctx *c, cudaGraphExec_t exec, int replays) {
  for (int r = 0; r < replays; r++) {
    input_kernel<<<GRID, THREADS, 0, c->s>>>(c->in, N_WORDS, (uint32_t)r);
    CK_LAUNCH();
    CK(cudaGraphLaunch(exec, c->s));
    churn(c, r);
    CK(cudaMemcpyAsync(c->h_out, c->out, N_WORDS * 4, cudaMemcpyDeviceToHost,
                       c->s));
    CK(cudaStreamSynchronize(c->s));
    CK(cudaStreamSynchronize(c->s2));
    check_replay(c, r);
  }
}

static void check_acc(ctx *c, int replays) {
  CK(cudaMemcpy(c->h_out, c->acc, N_WORDS * 4, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < N_WORDS; i++)
    if (c->h_out[i] != c->h_acc[i])
      gc_fail("after %d replays: acc[%zu] is 0x%08x, expected 0x%08x", replays,
              i, c->h_out[i], c->h_acc[i]);
}

static void teardown(ctx *c) {
  for (int k = 0; k < SCRATCH; k++)
    if (c->scratch[k] != NULL) {
      CK(cudaFree(c->scratch[k]));
      c->my_frees++;
    }
  uint32_t *bufs[4] = {c->in, c->out, c->acc, (uint32_t *)c->d_bad};
  for (int k = 0; k < 4; k++) {
    CK(cudaFree(bufs[k]));
    c->my_frees++;
  }
  CK(cudaFreeHost(c->h_out));
  free(c->h_acc);
  CK(cudaStreamDestroy(c->s));
  CK(cudaStreamDestroy(c->s2));
  CK(cudaDeviceSynchronize());
}

int main(int argc, char **argv) {
  gc_name = "graph_replay";
  setvbuf(stdout, NULL, _IOLBF, 0);
  int replays = argc > 1 ? atoi(argv[1]) : 100;
  if (replays < 1)
    gc_fail("bad replay count '%s'", argv[1]);
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);

  ctx *c = (ctx *)malloc(sizeof(ctx));
  if (c == NULL)
    gc_fail("host malloc failed");
  setup(c);
  cudaGraphExec_t exec = capture(c);
  /* The kernel writing the block freed before the capture ends before any
   * replay: the scratch blocks may be that block under reuse_policy
   * immediate. */
  CK(cudaStreamSynchronize(c->s));
  replay_all(c, exec, replays);
  check_acc(c, replays);
  CK(cudaGraphExecDestroy(exec));
  teardown(c);
  printf("graph_replay: %d replays checked, %llu scratch blocks (%.1f MiB) "
         "allocated and freed around them, %.2f s\n",
         replays, (unsigned long long)(replays * SCRATCH),
         (double)c->scratch_bytes / (1024.0 * 1024.0), gc_elapsed(&t0));
  gc_check_stats(GC_EXPECT_ANY, 0, c->my_allocs, c->my_frees);
  free(c);
  printf("graph_replay: PASS\n");
  return 0;
}
