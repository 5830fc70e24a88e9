"""bench_pyframes: what Python frames cost per allocation (a benchmark, not
a test). Run it with the library preloaded, against the mock driver or a
real one, once per setting, and compare:

  LD_PRELOAD=<build>/libcudalloc.so CUDALLOC_CONF=backtrace_depth:16[,python_frames:0] \\
      python3 tests/bench/bench_pyframes.py [python_depth] [pairs]

It calls itself python_depth (30) frames deep, then makes `pairs` (200,000)
cuMemAlloc_v2+cuMemFree_v2 pairs of 4 KiB through ctypes (served from the
pool's cache), best of 5 rounds, and prints ns per pair. The difference
between python_frames:1 and 0 is what reading and storing the Python frames
costs per allocation; between backtrace_depth:16 and 0, what stacks cost.
"""
import ctypes
import sys
import time


def main():
    depth = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200000
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc in (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0),
               cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), cuda.cuCtxSetCurrent(ctx)):
        if rc != 0:
            sys.exit("bench_pyframes: driver set-up failed with %d" % rc)
    alloc, free = cuda.cuMemAlloc_v2, cuda.cuMemFree_v2
    p = ctypes.c_uint64()
    ref = ctypes.byref(p)

    def pairs(count):
        for _ in range(count):
            alloc(ref, 4096)
            free(p)

    def deep(k, count):
        return deep(k - 1, count) if k else pairs(count)

    deep(depth, 1000)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        deep(depth, n)
        best = min(best, time.perf_counter() - t0)
    print("bench_pyframes: %.0f ns per pair at Python depth %d (best of 5 rounds of %d)"
          % (best / n * 1e9, depth, n))


if __name__ == "__main__":
    main()
