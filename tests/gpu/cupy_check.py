"""cupy_check: CuPy array arithmetic with checked results, pool disabled.

Why: CuPy links the CUDA runtime statically, so a library that hooks only
cudaMalloc in libcudart.so never sees it; cudalloc must catch it at the
driver, through the runtime's dlsym(cuGetProcAddress_v2)/cuGetProcAddress.
With CuPy's own memory pool disabled (cp.cuda.set_allocator(None)) every
array is a cudaMalloc/cudaFree, so the pool is exercised per array.

What it checks: elementwise arithmetic and reductions over many sizes whose
results are exact in float64 (sum of 2i+1 over i < n is n*n; max, min, an
integer count; the mean to 1e-12), a float64 matmul against NumPy (rtol 1e-9), a
device-to-device copy and an in-place update; CUDA device 0 is really used.
With --expect pooled: the library's statistics, read in-process through
ctypes, show more than 100 pooled allocations with backend_allocs <
allocs / 10. Last line: "cupy_check: PASS" or "cupy_check: FAIL: <why>".

Usage: cupy_check.py [--expect plain|pooled|any]
"""


import cudalloc_stats

NAME = "cupy_check"

fail = cudalloc_stats.failer(NAME)


def expect_equal(what, got, want):
    if got != want:
        fail("%s: got %r, expected %r" % (what, got, want))


def run():
    import cupy as cp
    import numpy as np

    # No memory pool: every allocation reaches cudaMalloc, every free cudaFree.
    cp.cuda.set_allocator(None)
    cp.cuda.Device(0).use()
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    print("%s: cupy %s, runtime %d, driver %d, device %s"
          % (NAME, cp.__version__, cp.cuda.runtime.runtimeGetVersion(),
             cp.cuda.runtime.driverGetVersion(), name), flush=True)

    checks = 0
    for rep in range(40):
        n = 1000 + rep * 7919 + (rep % 5) * 100003
        a = cp.arange(n, dtype=cp.float64)
        b = a * 2 + 1
        expect_equal("sum(2i+1), n=%d" % n, float(b.sum()), float(n) * n)
        expect_equal("max, n=%d" % n, float(b.max()), float(2 * n - 1))
        expect_equal("min, n=%d" % n, float(b.min()), 1.0)
        mean = float(b.mean())  # n*n / n: exact unless divided by 1/n
        if abs(mean - n) > 1e-12 * n:
            fail("mean, n=%d: got %r, expected %r" % (n, mean, float(n)))
        ai = cp.arange(n, dtype=cp.int64)
        count = int(cp.count_nonzero(ai % 7 == 3))
        expect_equal("count i%%7==3, n=%d" % n, count,
                     (n - 3 + 6) // 7 if n > 3 else 0)
        c = cp.empty_like(b)
        c[...] = b            # device-to-device copy
        c -= a                # in place: c = a + 1
        expect_equal("sum(i+1), n=%d" % n, float(c.sum()),
                     float(n) * (n + 1) / 2)
        host = cp.asnumpy(c[-3:])
        expect_equal("tail of c, n=%d" % n, host.tolist(),
                     [float(n - 2), float(n - 1), float(n)])
        del a, b, ai, c
        checks += 7

    rng = np.random.default_rng(42)
    for m, k, n in [(256, 384, 128), (512, 512, 512), (100, 1000, 37)]:
        x = rng.standard_normal((m, k))
        y = rng.standard_normal((k, n))
        got = cp.asnumpy(cp.asarray(x) @ cp.asarray(y))
        want = x @ y
        if not np.allclose(got, want, rtol=1e-9, atol=1e-9):
            fail("matmul %dx%dx%d differs from NumPy by up to %g"
                 % (m, k, n, float(np.max(np.abs(got - want)))))
        checks += 1
    cp.cuda.Device(0).synchronize()
    print("%s: %d results checked" % (NAME, checks), flush=True)


if __name__ == "__main__":
    cudalloc_stats.check_main(NAME, __doc__, run)
