"""py_alloc.py MODE: device allocations from named Python functions, made
through ctypes against libcuda.so.1 (the mock, in the tests), the way a
framework's native code makes them: ctypes releases the GIL around the
call, as PyTorch does around every operator.

  leak     keep_step() allocates 1 MiB per step from train(), called from
           main(); 8 steps, nothing freed (the leak report at exit)
  thread   the same steps from a worker thread's run_worker()
  unicode  the same steps from größe_step(), a name that is not ASCII

Each allocating line ends with a "# LINE:<name>" comment, which the test
reads to know the line numbers the report must name. Standard library
only; runs on Python 3.6 and later.
"""
# -*- coding: utf-8 -*-
import ctypes
import sys
import threading

STEPS = 8
cuda = ctypes.CDLL("libcuda.so.1")


def setup():
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    for rc in (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0),
               cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
               cuda.cuCtxSetCurrent(ctx)):
        if rc != 0:
            sys.exit("py_alloc: driver set-up failed with %d" % rc)


def keep_step(kept):
    p = ctypes.c_uint64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), 1 << 20)  # LINE:keep_step
    if rc != 0:
        sys.exit("py_alloc: cuMemAlloc_v2 returned %d" % rc)
    kept.append(p.value)


def train(kept):
    for _ in range(STEPS):
        keep_step(kept)  # LINE:train


def größe_step(kept):
    train(kept)  # LINE:unicode


def run_worker(kept):
    setup()  # a thread makes the context current for itself
    train(kept)  # LINE:run_worker


def main(mode):
    setup()
    kept = []
    if mode == "thread":
        t = threading.Thread(target=run_worker, args=(kept,))
        t.start()
        t.join()
    elif mode == "unicode":
        größe_step(kept)
    else:
        train(kept)  # LINE:main
    print("allocations=%d" % len(kept))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "leak")  # LINE:module
