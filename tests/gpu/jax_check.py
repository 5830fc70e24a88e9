"""jax_check: jitted JAX computations on the GPU with checked results.

Why: JAX/XLA does not go through the CUDA runtime for memory: its CUDA
plugin dlsym's exact driver names (cuMemAlloc_v2, cuMemCreate, ...), the
library's second way in. By default XLA preallocates 75% of the GPU in one
virtual-memory allocation; scripts/gpu-check.sh runs this with
XLA_PYTHON_CLIENT_PREALLOCATE=false (XLA's BFC allocator grows on demand)
and, in a second run, also XLA_PYTHON_CLIENT_ALLOCATOR=platform (XLA asks
the driver for every buffer), so the library sees XLA's allocations.

What it checks: the default backend is a GPU; a jitted function (matmul at
HIGHEST precision, tanh, reductions, sin^2+cos^2) agrees with NumPy in
float32 (rtol 1e-4) over several shapes and repeated calls on fresh inputs;
results come back to the host intact. The library's statistics are printed
(read in-process through ctypes) but not judged: how much of XLA's memory
reaches cuMemAlloc depends on XLA's allocator, so the pooled count is
recorded, not required (--expect pooled makes it required). Last line:
"jax_check: PASS" or "jax_check: FAIL: <why>".

Usage: jax_check.py [--expect plain|pooled|any]
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import cudalloc_stats  # noqa: E402

NAME = "jax_check"

fail = cudalloc_stats.failer(NAME)


def run():
    import jax
    import jax.numpy as jnp
    import numpy as np

    devices = jax.devices()
    print("%s: jax %s, devices %s, XLA_PYTHON_CLIENT_PREALLOCATE=%s "
          "XLA_PYTHON_CLIENT_ALLOCATOR=%s"
          % (NAME, jax.__version__, devices,
             os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
             os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR")), flush=True)
    if not devices or devices[0].platform != "gpu":
        fail("default JAX device is %r, not a GPU" % (devices[:1],))

    @jax.jit
    def step(x, w):
        y = jnp.tanh(jnp.matmul(x, w, precision=jax.lax.Precision.HIGHEST))
        ones = jnp.sum(jnp.sin(x) ** 2 + jnp.cos(x) ** 2)
        return y, jnp.sum(y * y), ones

    rng = np.random.default_rng(7)
    checks = 0
    for m, k, n in [(128, 256, 64), (512, 512, 256), (1024, 256, 512),
                    (333, 77, 1000)]:
        for rep in range(5):
            x = rng.standard_normal((m, k), dtype=np.float32)
            w = (rng.standard_normal((k, n), dtype=np.float32)
                 / np.float32(np.sqrt(k)))
            y, sq, ones = step(jax.device_put(x), jax.device_put(w))
            y = np.asarray(y)
            want = np.tanh(x.astype(np.float64) @ w.astype(np.float64))
            if y.shape != (m, n):
                fail("shape %r, expected %r" % (y.shape, (m, n)))
            if not np.allclose(y, want, rtol=1e-4, atol=1e-4):
                fail("tanh(x@w) %dx%dx%d rep %d differs from NumPy by up to "
                     "%g" % (m, k, n, rep, float(np.max(np.abs(y - want)))))
            if not np.isclose(float(sq), float(np.sum(want * want)),
                              rtol=1e-4):
                fail("sum(y*y) %dx%dx%d rep %d: got %r, expected %r"
                     % (m, k, n, rep, float(sq), float(np.sum(want * want))))
            if not np.isclose(float(ones), float(m * k), rtol=1e-4):
                fail("sum(sin^2+cos^2) over %d elements gave %r"
                     % (m * k, float(ones)))
            checks += 4
    # Device arrays kept alive across calls, then dropped.
    kept = [jnp.full((1 << 16,), float(i), dtype=jnp.float32)
            for i in range(64)]
    total = sum(float(jnp.sum(a)) for a in kept)
    want_total = float(sum(i * (1 << 16) for i in range(64)))
    if total != want_total:
        fail("sum over kept arrays %r, expected %r" % (total, want_total))
    del kept
    checks += 1
    print("%s: %d results checked" % (NAME, checks), flush=True)


if __name__ == "__main__":
    cudalloc_stats.check_main(NAME, __doc__, run)
