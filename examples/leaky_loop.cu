/*
 * leaky_loop: the classic device-memory leak, and its fix.
 *
 * Each of 100 iterations allocates a 1 MiB buffer with cudaMalloc, fills it
 * with a small kernel, and then forgets it: nothing ever calls cudaFree, so
 * the program holds 100 MiB of device memory more at the end than at the
 * start. In a real training loop this is the buffer that grows until the
 * device runs out of memory. With --fixed, each iteration frees its buffer.
 *
 * Build (examples/CMakeLists.txt does this when nvcc is found; -g gives the
 * line numbers the report shows):
 *   nvcc -g -arch=sm_90 -o leaky_loop examples/leaky_loop.cu
 *
 * Run under cudalloc to see where the leaked memory was allocated:
 *   CUDALLOC_CONF=backtrace_depth:16 LD_PRELOAD=build/libcudalloc.so ./leaky_loop
 * At exit the report names one group, "104857600 bytes leaked in 100
 * allocation(s) on device 0, allocated from:", whose first frame is the
 * cudaMalloc line marked LEAK below. The fixed twin reports no leaks:
 *   CUDALLOC_CONF=backtrace_depth:16 LD_PRELOAD=build/libcudalloc.so ./leaky_loop --fixed
 * See docs/LEAKS.md for the report and its settings.
 */
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITERATIONS 100
#define BUFFER_BYTES (1u << 20) /* 1 MiB */
#define BUFFER_WORDS (BUFFER_BYTES / sizeof(unsigned))

/* Ends the program on any CUDA error, naming the call that failed; where no
 * driver here can serve this build, it says instead what to run (defined at
 * the end of the file). */
__attribute__((noreturn)) static void cuda_failed(const char *call, cudaError_t err);
#define CHECK(call)                                                            \
  do {                                                                         \
    cudaError_t err_ = (call);                                                 \
    if (err_ != cudaSuccess)                                                   \
      cuda_failed(#call, err_);                                                \
  } while (0)

/* Writes `value` into every word of the buffer. */
__global__ void fill(unsigned *buf, size_t words, unsigned value) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
    buf[i] = value;
}

/* One iteration's work on its buffer: a kernel launch, as a training step
 * would make. The launch is asynchronous; its errors show up here. */
static void use_buffer(unsigned *buf, int iteration) {
  fill<<<64, 256>>>(buf, BUFFER_WORDS, (unsigned)iteration);
  CHECK(cudaGetLastError());
}

/* The leak: every buffer is allocated, used, and never freed. Not inlined,
 * so the report's first frame names this function. */
__attribute__((noinline)) static void leaky_loop(void) {
  for (int i = 0; i < ITERATIONS; i++) {
    unsigned *buf = NULL;
    CHECK(cudaMalloc((void **)&buf, BUFFER_BYTES)); /* LEAK: this line */
    use_buffer(buf, i);
    /* Missing: cudaFree(buf). The pointer is lost at the end of the loop
     * body, and its megabyte with it. */
  }
}

/* The fixed twin: the same work, and each buffer is freed when its
 * iteration is done with it. */
__attribute__((noinline)) static void fixed_loop(void) {
  for (int i = 0; i < ITERATIONS; i++) {
    unsigned *buf = NULL;
    CHECK(cudaMalloc((void **)&buf, BUFFER_BYTES));
    use_buffer(buf, i);
    CHECK(cudaFree(buf));
  }
}

int main(int argc, char **argv) {
  int fixed = argc > 1 && strcmp(argv[1], "--fixed") == 0;
  if (argc > 2 || (argc == 2 && !fixed)) {
    fprintf(stderr, "usage: %s [--fixed]\n", argv[0]);
    return 2;
  }
  if (fixed)
    fixed_loop();
  else
    leaky_loop();
  CHECK(cudaDeviceSynchronize());
  if (fixed)
    printf("leaky_loop --fixed: %d iterations of 1 MiB, each buffer freed\n", ITERATIONS);
  else
    printf("leaky_loop: %d iterations of 1 MiB, no buffer freed: %u MiB leaked\n",
           ITERATIONS, (unsigned)(ITERATIONS * (BUFFER_BYTES >> 20)));
  /* No cudaDeviceReset: it would free everything and hide the leak from the
   * report at exit, as it hides it from any leak checker. */
  return 0;
}

/* Included here, at the end, so that the lines above keep the numbers the
 * README's leak report shows. */
#include <dlfcn.h>

/* Where the first CUDA call fails because no driver here can serve this
 * build, one line saying what to run, rather than the runtime's error. The
 * project's mock driver (tests/mockcuda, for machines without a GPU) serves
 * only its own CUDA runtime, libcudart.so.13, which this file's -cudart
 * shared build (leaky_loop_shared) loads and the static build (nvcc's
 * default) cannot: its runtime is inside the program. */
static void cuda_failed(const char *call, cudaError_t err) {
  /* Loaded again: a runtime that gave up on the driver has unloaded it. */
  void *driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver)
    fprintf(stderr, "leaky_loop: no CUDA driver (libcuda.so.1) here: install the NVIDIA "
                    "driver, or without a GPU run leaky_loop_shared against the project's "
                    "mock (LD_LIBRARY_PATH=build/tests/mockcuda)\n");
  else if (dlsym(driver, "mockcuda_get_counters"))
    fprintf(stderr, "leaky_loop: the project's mock driver serves only its own CUDA runtime "
                    "(libcudart.so.13), which this static-runtime build does not load: run "
                    "leaky_loop_shared\n");
  else
    fprintf(stderr, "leaky_loop: %s failed: %s\n", call, cudaGetErrorString(err));
  exit(1);
}
