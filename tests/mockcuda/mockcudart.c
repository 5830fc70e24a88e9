/*
 * mockcudart: a fake shared CUDA runtime (libcudart.so.13) for machines
 * without a GPU.
 *
 * Why: with it, a real program built by nvcc with `-cudart shared` (such as
 * examples/leaky_loop.cu) runs in CI and on this project's GPU-less machines,
 * against the mock driver (mockcuda.c, libcuda.so.1), with or without
 * libcudalloc.so preloaded. It is a test double, not a runtime: it provides
 * only what nvcc's host code and our examples use, and a program that needs
 * more fails to load with "undefined symbol: cuda...".
 *
 * What matters most is HOW it reaches the driver, because that is what
 * cudalloc's hooks see. It does what the real runtime does (measured, see
 * /work/shared/design.md section 3): dlopen("libcuda.so.1"), ONE
 * dlsym(handle, "cuGetProcAddress_v2"), then every driver function through
 * cuGetProcAddress -- cuGetProcAddress itself first, at version 12000, as the
 * runtime asks for it. cudaMalloc therefore ends in whatever the look-up of
 * "cuMemAlloc" hands back: the driver's cuMemAlloc_v2, or cudalloc's hook.
 *
 * Kernels do NOT run: there is no device. Registration, the <<<>>> call
 * configuration and launches are accepted and checked (unknown kernel,
 * invalid grid or block), and a launch then returns success without touching
 * device memory. Copies and memsets do reach the mock driver, which backs
 * device memory with host buffers.
 *
 * Like the real runtime it initializes lazily: nothing is loaded before the
 * first call that needs the device, so registration at program start makes
 * no driver call. Every entry point is exported under the version node
 * libcudart.so.13, as the real library's are, so binaries linked against
 * the toolkit's libcudart.so.13 load against this one (see CMakeLists.txt).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOCKRT_MAX_DEVICES 16
#define MOCKRT_MAX_KERNELS 1024
#define MOCKRT_CONFIG_DEPTH 16 /* nested <<<>>> configurations per thread */
#define MOCKRT_FATBIN_MAGIC 0x466243b1u

/* The entry points nvcc's generated host code calls. They are declared in
 * crt/host_runtime.h and crt/device_functions.h, which are C++ only. */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize);
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global);
char __cudaInitModule(void **fatCubinHandle);
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void **args, size_t sharedMem, cudaStream_t stream);

/* ---- the driver, reached as the runtime reaches it --------------------- */

/* The driver functions used, each asked for at the version of the
 * signature called through (cudaTypedefs.h's PFN_<name>_v<version>), so the
 * variant handed back always matches the pointer type. */
static struct {
  PFN_cuInit_v2000 init;
  PFN_cuDeviceGetCount_v2000 device_get_count;
  PFN_cuDeviceGet_v2000 device_get;
  PFN_cuDevicePrimaryCtxRetain_v7000 primary_retain;
  PFN_cuDevicePrimaryCtxReset_v11000 primary_reset;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current;
  PFN_cuCtxSynchronize_v2000 ctx_synchronize;
  PFN_cuMemAlloc_v3020 mem_alloc;
  PFN_cuMemFree_v3020 mem_free;
  PFN_cuMemGetInfo_v3020 mem_get_info;
  PFN_cuMemGetAddressRange_v3020 mem_get_address_range;
  PFN_cuMemsetD8_v3020 memset_d8;
  PFN_cuMemcpyHtoD_v3020 memcpy_htod;
  PFN_cuMemcpyDtoH_v3020 memcpy_dtoh;
  PFN_cuMemcpyDtoD_v3020 memcpy_dtod;
  PFN_cuStreamCreate_v2000 stream_create;
  PFN_cuStreamDestroy_v4000 stream_destroy;
  PFN_cuStreamSynchronize_v2000 stream_synchronize;
  PFN_cuMemAllocAsync_v11020 mem_alloc_async;
  PFN_cuMemFreeAsync_v11020 mem_free_async;
  PFN_cuDeviceGetDefaultMemPool_v11020 default_mem_pool;
} drv;

#define MOCKRT_SYM(field, name, version) {name, version, (void **)&drv.field}
static const struct mockrt_sym {
  const char *name; /* the base name, as cuGetProcAddress wants it */
  int version;
  void **slot;
} mockrt_syms[] = {
    MOCKRT_SYM(init, "cuInit", 2000),
    MOCKRT_SYM(device_get_count, "cuDeviceGetCount", 2000),
    MOCKRT_SYM(device_get, "cuDeviceGet", 2000),
    MOCKRT_SYM(primary_retain, "cuDevicePrimaryCtxRetain", 7000),
    MOCKRT_SYM(primary_reset, "cuDevicePrimaryCtxReset", 11000),
    MOCKRT_SYM(ctx_set_current, "cuCtxSetCurrent", 4000),
    MOCKRT_SYM(ctx_synchronize, "cuCtxSynchronize", 2000),
    MOCKRT_SYM(mem_alloc, "cuMemAlloc", 3020),
    MOCKRT_SYM(mem_free, "cuMemFree", 3020),
    MOCKRT_SYM(mem_get_info, "cuMemGetInfo", 3020),
    MOCKRT_SYM(mem_get_address_range, "cuMemGetAddressRange", 3020),
    MOCKRT_SYM(memset_d8, "cuMemsetD8", 3020),
    MOCKRT_SYM(memcpy_htod, "cuMemcpyHtoD", 3020),
    MOCKRT_SYM(memcpy_dtoh, "cuMemcpyDtoH", 3020),
    MOCKRT_SYM(memcpy_dtod, "cuMemcpyDtoD", 3020),
    MOCKRT_SYM(stream_create, "cuStreamCreate", 2000),
    MOCKRT_SYM(stream_destroy, "cuStreamDestroy", 4000),
    MOCKRT_SYM(stream_synchronize, "cuStreamSynchronize", 2000),
    MOCKRT_SYM(mem_alloc_async, "cuMemAllocAsync", 11020),
    MOCKRT_SYM(mem_free_async, "cuMemFreeAsync", 11020),
    MOCKRT_SYM(default_mem_pool, "cuDeviceGetDefaultMemPool", 11020),
};
#undef MOCKRT_SYM

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_error; /* why the driver is unusable, once known */
static int g_ndev;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext g_primary[MOCKRT_MAX_DEVICES]; /* retained, per device */
static unsigned g_epoch = 1; /* bumped by cudaDeviceReset */

static _Thread_local cudaError_t t_last_error;
static _Thread_local int t_device;
static _Thread_local int t_bound_device = -1; /* primary context made current */
static _Thread_local unsigned t_bound_epoch;

/* The runtime's mapping of the driver results the mock driver gives. */
static cudaError_t mockrt_from_driver(CUresult rc) {
  switch (rc) {
  case CUDA_SUCCESS: return cudaSuccess;
  case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
  case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
  case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
  case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
  case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
  case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
  case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
  case CUDA_ERROR_CONTEXT_IS_DESTROYED: return cudaErrorContextIsDestroyed;
  case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
  case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
  case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
  case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
  case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return cudaErrorStreamCaptureImplicit;
  case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
  default: return cudaErrorUnknown;
  }
}

/* Every entry point returns through here: a failure becomes the thread's
 * last error, as cudaGetLastError reports it. */
static cudaError_t mockrt_result(cudaError_t e) {
  if (e != cudaSuccess)
    t_last_error = e;
  return e;
}

static cudaError_t mockrt_driver_result(CUresult rc) {
  return mockrt_result(mockrt_from_driver(rc));
}

/* Fills drv through `gpa`; 0 when a function is missing. */
static int mockrt_resolve(PFN_cuGetProcAddress_v12000 gpa) {
  for (size_t i = 0; i < sizeof mockrt_syms / sizeof *mockrt_syms; i++) {
    const struct mockrt_sym *s = &mockrt_syms[i];
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (gpa(s->name, s->slot, s->version, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||
        st != CU_GET_PROC_ADDRESS_SUCCESS || !*s->slot) {
      fprintf(stderr, "mockcudart: the driver has no %s\n", s->name);
      return 0;
    }
  }
  return 1;
}

/* Runs once, at the first call that needs the device. */
static void mockrt_load(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) {
    g_init_error = cudaErrorInsufficientDriver;
    return;
  }
  PFN_cuGetProcAddress_v12000 gpa =
      (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
  void *self = NULL;
  if (gpa && gpa("cuGetProcAddress", &self, 12000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) ==
                 CUDA_SUCCESS && self)
    gpa = (PFN_cuGetProcAddress_v12000)self;
  if (!gpa || !mockrt_resolve(gpa)) {
    g_init_error = cudaErrorInsufficientDriver;
    return;
  }
  g_init_error = mockrt_from_driver(drv.init(0));
  if (g_init_error == cudaSuccess)
    g_init_error = mockrt_from_driver(drv.device_get_count(&g_ndev));
  if (g_init_error == cudaSuccess && g_ndev > MOCKRT_MAX_DEVICES)
    g_ndev = MOCKRT_MAX_DEVICES;
}

static cudaError_t mockrt_driver(void) {
  pthread_once(&g_once, mockrt_load);
  return g_init_error;
}

/* The device's primary context, retained on first use and made current on
 * the calling thread, as the runtime does before any device work. */
static cudaError_t mockrt_context(void) {
  cudaError_t e = mockrt_driver();
  if (e != cudaSuccess)
    return e;
  int dev = t_device;
  if (dev >= g_ndev)
    return cudaErrorInvalidDevice;
  CUresult rc = CUDA_SUCCESS;
  pthread_mutex_lock(&g_lock);
  if (!g_primary[dev]) {
    CUdevice d;
    rc = drv.device_get(&d, dev);
    if (rc == CUDA_SUCCESS)
      rc = drv.primary_retain(&g_primary[dev], d);
  }
  CUcontext ctx = g_primary[dev];
  unsigned epoch = g_epoch;
  pthread_mutex_unlock(&g_lock);
  if (rc == CUDA_SUCCESS && (t_bound_device != dev || t_bound_epoch != epoch)) {
    rc = drv.ctx_set_current(ctx);
    if (rc == CUDA_SUCCESS) {
      t_bound_device = dev;
      t_bound_epoch = epoch;
    }
  }
  return mockrt_from_driver(rc);
}

/* ---- device management ------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
  if (!count)
    return mockrt_result(cudaErrorInvalidValue);
  cudaError_t e = mockrt_driver();
  *count = e == cudaSuccess ? g_ndev : 0;
  return mockrt_result(e);
}

cudaError_t cudaSetDevice(int device) {
  cudaError_t e = mockrt_driver();
  if (e == cudaSuccess && (device < 0 || device >= g_ndev))
    e = cudaErrorInvalidDevice;
  if (e == cudaSuccess) {
    t_device = device;
    e = mockrt_context();
  }
  return mockrt_result(e);
}

cudaError_t cudaGetDevice(int *device) {
  if (!device)
    return mockrt_result(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(drv.ctx_synchronize());
}

/* Destroys the device's primary context and everything allocated in it;
 * the next call that needs the device starts a new one. */
cudaError_t cudaDeviceReset(void) {
  cudaError_t e = mockrt_driver();
  if (e != cudaSuccess)
    return mockrt_result(e);
  int dev = t_device;
  CUresult rc = CUDA_SUCCESS;
  pthread_mutex_lock(&g_lock);
  if (g_primary[dev]) {
    CUdevice d;
    rc = drv.device_get(&d, dev);
    if (rc == CUDA_SUCCESS)
      rc = drv.primary_reset(d);
    g_primary[dev] = NULL;
    g_epoch++;
  }
  pthread_mutex_unlock(&g_lock);
  return mockrt_driver_result(rc);
}

/* ---- streams and the stream-ordered pool --------------------------------- */

/* What the benchmark programs ask of the runtime (tests/bench/bench_*.cu), so
 * that they run against the mock too: each call is its driver twin's. */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(drv.stream_create((CUstream *)stream, flags));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(drv.stream_destroy((CUstream)stream));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(drv.stream_synchronize((CUstream)stream));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream) {
  if (!devPtr)
    return mockrt_result(cudaErrorInvalidValue);
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  CUdeviceptr p = 0;
  CUresult rc = drv.mem_alloc_async(&p, size, (CUstream)stream);
  *devPtr = rc == CUDA_SUCCESS ? (void *)(uintptr_t)p : NULL;
  return mockrt_driver_result(rc);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(
      drv.mem_free_async((CUdeviceptr)(uintptr_t)devPtr, (CUstream)stream));
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  cudaError_t e = mockrt_driver();
  if (e != cudaSuccess)
    return mockrt_result(e);
  if (device < 0 || device >= g_ndev)
    return mockrt_result(cudaErrorInvalidDevice);
  CUdevice d;
  CUresult rc = drv.device_get(&d, device);
  if (rc == CUDA_SUCCESS)
    rc = drv.default_mem_pool((CUmemoryPool *)memPool, d);
  return mockrt_driver_result(rc);
}

/* The mock driver's pools keep every freed block and have no attributes to
 * set: a known attribute of a pool is accepted and changes nothing. */
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                    void *value) {
  if (!memPool || !value || attr < cudaMemPoolReuseFollowEventDependencies ||
      attr > cudaMemPoolAttrUsedMemHigh)
    return mockrt_result(cudaErrorInvalidValue);
  return cudaSuccess;
}

/* ---- memory ------------------------------------------------------------- */

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  if (!devPtr)
    return mockrt_result(cudaErrorInvalidValue);
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  if (size == 0) { /* the runtime answers a zero-byte request with NULL */
    *devPtr = NULL;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  CUresult rc = drv.mem_alloc(&p, size);
  *devPtr = rc == CUDA_SUCCESS ? (void *)(uintptr_t)p : NULL;
  return mockrt_driver_result(rc);
}

/* cudaFree(NULL) is the classic way to create the context: it must do so. */
cudaError_t cudaFree(void *devPtr) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess || !devPtr)
    return mockrt_result(e);
  return mockrt_driver_result(drv.mem_free((CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(drv.mem_get_info(free_bytes, total_bytes));
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  return mockrt_driver_result(
      drv.memset_d8((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count));
}

/* cudaMemcpyDefault: what the pointer is, by asking the driver (unified
 * addressing), as the runtime does. */
static int mockrt_is_device(const void *p) {
  CUdeviceptr base = 0;
  size_t size = 0;
  return drv.mem_get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS;
}

static enum cudaMemcpyKind mockrt_copy_kind(void *dst, const void *src) {
  int d = mockrt_is_device(dst), s = mockrt_is_device(src);
  if (d && s)
    return cudaMemcpyDeviceToDevice;
  if (d)
    return cudaMemcpyHostToDevice;
  return s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  cudaError_t e = mockrt_context();
  if (e != cudaSuccess)
    return mockrt_result(e);
  if (kind == cudaMemcpyDefault)
    kind = mockrt_copy_kind(dst, src);
  CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, s = (CUdeviceptr)(uintptr_t)src;
  switch (kind) {
  case cudaMemcpyHostToHost:
    if (count)
      memmove(dst, src, count);
    return cudaSuccess;
  case cudaMemcpyHostToDevice: return mockrt_driver_result(drv.memcpy_htod(d, src, count));
  case cudaMemcpyDeviceToHost: return mockrt_driver_result(drv.memcpy_dtoh(dst, s, count));
  case cudaMemcpyDeviceToDevice: return mockrt_driver_result(drv.memcpy_dtod(d, s, count));
  default: return mockrt_result(cudaErrorInvalidMemcpyDirection);
  }
}

/* ---- errors ------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

static const struct {
  cudaError_t code;
  const char *name, *text;
} mockrt_errors[] = {
#define E(c, t) {c, #c, t}
    E(cudaSuccess, "no error"),
    E(cudaErrorInvalidValue, "invalid argument"),
    E(cudaErrorMemoryAllocation, "out of memory"),
    E(cudaErrorInitializationError, "initialization error"),
    E(cudaErrorCudartUnloading, "driver shutting down"),
    E(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    E(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"),
    E(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version"),
    E(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
    E(cudaErrorInvalidDeviceFunction, "invalid device function"),
    E(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    E(cudaErrorInvalidDevice, "invalid device ordinal"),
    E(cudaErrorDeviceUninitialized, "invalid device context"),
    E(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    E(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    E(cudaErrorSymbolNotFound, "named symbol not found"),
    E(cudaErrorNotReady, "device not ready"),
    E(cudaErrorContextIsDestroyed, "context is destroyed"),
    E(cudaErrorNotSupported, "operation not supported"),
    E(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"),
    E(cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture"),
    E(cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream"),
    E(cudaErrorUnknown, "unknown error"),
#undef E
};

static const char *mockrt_error_text(cudaError_t e, int name) {
  for (size_t i = 0; i < sizeof mockrt_errors / sizeof *mockrt_errors; i++)
    if (mockrt_errors[i].code == e)
      return name ? mockrt_errors[i].name : mockrt_errors[i].text;
  return "unrecognized error code";
}

const char *cudaGetErrorString(cudaError_t error) { return mockrt_error_text(error, 0); }
const char *cudaGetErrorName(cudaError_t error) { return mockrt_error_text(error, 1); }

/* ---- fat binaries and kernels ------------------------------------------ */

/* What the fat binary wrapper nvcc emits starts with (fatbinary_section.h). */
typedef struct {
  unsigned magic, version;
  const void *data;
  void *unused;
} mockrt_fatbin_wrapper;

/* The handle nvcc's code keeps is a void **: it points at `self`. */
typedef struct {
  void *self;
  const void *wrapper;
} mockrt_module;

typedef struct {
  const void *host_fun; /* the host stub: what <<<>>> and cudaLaunchKernel name */
  const char *device_name;
  const mockrt_module *module;
} mockrt_kernel;

static mockrt_kernel g_kernels[MOCKRT_MAX_KERNELS];
static size_t g_nkernels;

void **__cudaRegisterFatBinary(void *fatCubin) {
  const mockrt_fatbin_wrapper *w = fatCubin;
  if (!w || w->magic != MOCKRT_FATBIN_MAGIC)
    fprintf(stderr, "mockcudart: __cudaRegisterFatBinary: not a fat binary wrapper\n");
  mockrt_module *m = calloc(1, sizeof *m);
  if (!m) {
    fprintf(stderr, "mockcudart: out of host memory\n");
    abort();
  }
  m->self = m;
  m->wrapper = fatCubin;
  return &m->self;
}

void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }

/* Called at exit (nvcc's code registers it with atexit): the module's
 * kernels can no longer be launched. Their records stay, emptied, because
 * the generated code keeps pointers to them (__cudaGetKernel's handles). */
void __cudaUnregisterFatBinary(void **fatCubinHandle) {
  mockrt_module *m = (mockrt_module *)fatCubinHandle;
  if (!m)
    return;
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_nkernels; i++)
    if (g_kernels[i].module == m)
      g_kernels[i] = (mockrt_kernel){NULL, NULL, NULL};
  pthread_mutex_unlock(&g_lock);
  free(m);
}

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize) {
  (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim,
      (void)wSize;
  pthread_mutex_lock(&g_lock);
  if (g_nkernels < MOCKRT_MAX_KERNELS)
    g_kernels[g_nkernels++] =
        (mockrt_kernel){hostFun, deviceName, (const mockrt_module *)fatCubinHandle};
  else
    fprintf(stderr, "mockcudart: more than %d kernels: %s not registered\n",
            MOCKRT_MAX_KERNELS, deviceName);
  pthread_mutex_unlock(&g_lock);
}

/* __device__ variables have no device storage here. */
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                       const char *deviceName, int ext, size_t size, int constant, int global) {
  (void)fatCubinHandle, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext,
      (void)size, (void)constant, (void)global;
}

char __cudaInitModule(void **fatCubinHandle) {
  (void)fatCubinHandle;
  return 1;
}

/* The kernel record for a host stub, as a handle (NULL: not registered). */
static const mockrt_kernel *mockrt_find_kernel(const void *host_fun) {
  const mockrt_kernel *k = NULL;
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < g_nkernels && !k && host_fun; i++)
    if (g_kernels[i].host_fun == host_fun)
      k = &g_kernels[i];
  pthread_mutex_unlock(&g_lock);
  return k;
}

/* Whether a handle still names a registered kernel. */
static int mockrt_kernel_live(const mockrt_kernel *k) {
  pthread_mutex_lock(&g_lock);
  int live = k && k->host_fun;
  pthread_mutex_unlock(&g_lock);
  return live;
}

cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun) {
  const mockrt_kernel *k = mockrt_find_kernel(hostFun);
  if (!kernel || !k)
    return mockrt_result(cudaErrorInvalidDeviceFunction);
  *kernel = (cudaKernel_t)(uintptr_t)k;
  return cudaSuccess;
}

/* <<<grid, block, shmem, stream>>>: the configuration waits here for the
 * launch that the generated stub makes next. */
static _Thread_local struct {
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
} t_config[MOCKRT_CONFIG_DEPTH];
static _Thread_local int t_nconfig;

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st *stream) {
  if (t_nconfig == MOCKRT_CONFIG_DEPTH)
    return 1; /* non-zero: the generated code skips the launch */
  t_config[t_nconfig].grid = gridDim;
  t_config[t_nconfig].block = blockDim;
  t_config[t_nconfig].shmem = sharedMem;
  t_config[t_nconfig].stream = stream;
  t_nconfig++;
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream) {
  if (t_nconfig == 0)
    return mockrt_result(cudaErrorMissingConfiguration);
  t_nconfig--;
  *gridDim = t_config[t_nconfig].grid;
  *blockDim = t_config[t_nconfig].block;
  *sharedMem = t_config[t_nconfig].shmem;
  *(cudaStream_t *)stream = t_config[t_nconfig].stream;
  return cudaSuccess;
}

/* The limits of an sm_90 device. */
static int mockrt_config_ok(dim3 g, dim3 b) {
  unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
  return g.x >= 1 && g.y >= 1 && g.z >= 1 && g.x <= 0x7fffffffu && g.y <= 65535 &&
         g.z <= 65535 && b.x >= 1 && b.y >= 1 && b.z >= 1 && b.x <= 1024 && b.y <= 1024 &&
         b.z <= 64 && threads <= 1024;
}

/* A launch is checked, then does nothing: kernels do not run on the mock,
 * so device memory keeps what copies and memsets put there. */
static cudaError_t mockrt_launch(const mockrt_kernel *k, dim3 grid, dim3 block) {
  if (!mockrt_kernel_live(k))
    return mockrt_result(cudaErrorInvalidDeviceFunction);
  if (!mockrt_config_ok(grid, block))
    return mockrt_result(cudaErrorInvalidConfiguration);
  return mockrt_result(mockrt_context());
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream) {
  (void)args, (void)sharedMem, (void)stream;
  return mockrt_launch((const mockrt_kernel *)kernel, gridDim, blockDim);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void **args, size_t sharedMem, cudaStream_t stream) {
  (void)args, (void)sharedMem, (void)stream;
  return mockrt_launch((const mockrt_kernel *)kernel, gridDim, blockDim);
}

/* What code built with __NV_LEGACY_LAUNCH, and programs by hand, call. */
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream) {
  (void)args, (void)sharedMem, (void)stream;
  return mockrt_launch(mockrt_find_kernel(func), gridDim, blockDim);
}
