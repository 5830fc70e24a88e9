"""cupy_ipc: a CuPy array shared with a spawned child through CUDA IPC.

Why: cupy.cuda.runtime.ipcGetMemHandle(ptr) hands out the handle of the
allocation that holds ptr, and ipcOpenMemHandle in the other process maps
that allocation at the pointer it returns. Under a pool the array's block
is inside a segment; the handle must open to exactly the block's bytes,
not the segment's start (another array's bytes). The child inherits
LD_PRELOAD, as children of a preloaded program do.

What it does: with CuPy's memory pool off (every array its own cudaMalloc,
so under the library its own pooled block) or on (--pool: arrays inside
CuPy's chunks, which are pooled blocks themselves), the parent makes a
small array and then two larger ones (so the later ones sit after the
start of a segment), exports each, and a "spawn" child opens the handles,
checks every element, negates the first element of each (shared memory:
the parent must see it) and answers. Every wait has a timeout.

Last line: "cupy_ipc: PASS" or "cupy_ipc: FAIL: <why>".

Usage: cupy_ipc.py [--pool] [--timeout SECONDS]
"""

import faulthandler
import multiprocessing as mp
import sys

import cudalloc_stats

NAME = "cupy_ipc"
fail = cudalloc_stats.failer(NAME)
SIZES = (250, 16384, 2 << 20)  # float32 elements: 1000 B, 64 KiB, 8 MiB


def child(inbox, outbox, timeout):
    faulthandler.dump_traceback_later(timeout, exit=True)
    import cupy as cp
    try:
        handles, pool = inbox.get(timeout=timeout)
        if not pool:
            cp.cuda.set_allocator(None)
        sums, opened = [], []
        for handle, n in handles:
            ptr = cp.cuda.runtime.ipcOpenMemHandle(handle)
            mem = cp.cuda.UnownedMemory(ptr, n * 4, None)
            a = cp.ndarray((n,), cp.float32, cp.cuda.MemoryPointer(mem, 0))
            sums.append(float(a.sum(dtype=cp.float64)))
            a[0] = -a[0] - 1
            opened.append(ptr)
        cp.cuda.Device().synchronize()
        outbox.put(("sums", sums))
        inbox.get(timeout=timeout)  # keep them open until the parent read
        for ptr in opened:
            cp.cuda.runtime.ipcCloseMemHandle(ptr)
    except Exception as e:
        outbox.put(("error", repr(e)))


def run(pool, timeout):
    faulthandler.dump_traceback_later(3 * timeout, exit=True)
    import cupy as cp
    if not pool:
        cp.cuda.set_allocator(None)
    print("%s: cupy %s, CuPy's memory pool %s" %
          (NAME, cp.__version__, "on" if pool else "off"), flush=True)
    arrays = [cp.arange(n, dtype=cp.float32) + i for i, n in enumerate(SIZES)]
    cp.cuda.Device().synchronize()
    want = [float(sum(range(n))) + i * n for i, n in enumerate(SIZES)]
    handles = [(cp.cuda.runtime.ipcGetMemHandle(a.data.ptr), a.size)
               for a in arrays]
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(inbox, outbox, timeout))
    proc.start()
    inbox.put((handles, pool))
    value = cudalloc_stats.child_answer(proc, outbox, timeout, fail)
    firsts = [float(a[0].get()) for a in arrays]
    inbox.put("done")
    proc.join(timeout)
    if proc.exitcode != 0:
        proc.kill()
        fail("the child exited with %r" % proc.exitcode)
    for i, (got, exp, first) in enumerate(zip(value, want, firsts)):
        if got != exp:
            fail("the child read array %d (%d elements) wrong: sum %r, "
                 "expected %r" % (i, SIZES[i], got, exp))
        if first != -float(i) - 1:
            fail("the child's write to array %d is not seen: %r" % (i, first))
    print("%s: child sums %s match; its writes are seen" % (NAME, value))
    print(cudalloc_stats.pooled_line(cudalloc_stats.get_stats()), flush=True)
    print("%s: PASS" % NAME, flush=True)


def main():
    args = sys.argv[1:]
    pool = "--pool" in args
    timeout = 60
    if "--timeout" in args:
        timeout = int(args[args.index("--timeout") + 1])
    cudalloc_stats.run_guarded(NAME, lambda: run(pool, timeout))


if __name__ == "__main__":
    main()
