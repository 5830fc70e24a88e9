"""torch_ipc: CUDA tensors shared with a spawned child by torch.multiprocessing.

Why: PyTorch shares a CUDA tensor by sending a CUDA IPC handle of the
allocation that holds it, with the tensor's offset in it; the child opens the
handle and adds the offset. Under a pool every tensor lives inside a segment
of the pool, so a handle or a base address that names the segment instead of
the tensor's own block hands the child another tensor's bytes, or hangs it.
The child inherits LD_PRELOAD, as children of a preloaded program do.

What it does: the parent makes three tensors that share the pool's segments
in different places (a 1000-byte one first, a 64 KiB one after it, an 8 MiB
one), sends them to a child started with the "spawn" method, and the child
checks every element, writes one element of each (shared memory: the parent
must see the write), and answers with the sums. Every wait has a timeout, so
a hang is a failure, not a stuck run. Run with PyTorch's caching allocator
on and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (set by the caller). PyTorch
2.11 itself cannot share a tensor with its caching allocator off (the
sharing code asks the allocator for the tensor's base, and it knows none:
"invalid device pointer"); the parent asks for the handles before sending,
so that case ends at once with "torch_ipc: UNSUPPORTED: <PyTorch's error>",
which scripts/gpu-check.sh compares with the run without the library.

Last line: "torch_ipc: PASS", "torch_ipc: UNSUPPORTED: <why>" or
"torch_ipc: FAIL: <why>".

Usage: torch_ipc.py [--timeout SECONDS]
"""

import faulthandler
import os
import sys

import cudalloc_stats

NAME = "torch_ipc"
fail = cudalloc_stats.failer(NAME)


def tensors(torch):
    """The three shared tensors, made in this order so that they sit at and
    after the start of their segments."""
    small = torch.full((250,), 3.0, device="cuda")  # 1000 bytes
    mid = torch.arange(16384, dtype=torch.float32, device="cuda")  # 64 KiB
    large = torch.full((2 << 20,), 5.0, device="cuda")  # 8 MiB
    return small, mid, large


def expected(torch):
    """What the child must find, computed on the CPU."""
    return [float(t.double().sum()) for t in
            (torch.full((250,), 3.0), torch.arange(16384, dtype=torch.float32),
             torch.full((2 << 20,), 5.0))]


def child(inbox, outbox, timeout):
    faulthandler.dump_traceback_later(timeout, exit=True)
    import torch
    try:
        shared = inbox.get(timeout=timeout)
        sums = [float(t.double().sum()) for t in shared]
        for t in shared:
            t[0] = -1.0  # the parent must see it
        torch.cuda.synchronize()
        outbox.put(("sums", sums))
        inbox.get(timeout=timeout)  # keep them open until the parent has read
    except Exception as e:  # reported to the parent, which fails
        outbox.put(("error", repr(e)))


def run(timeout):
    faulthandler.dump_traceback_later(3 * timeout, exit=True)
    import torch
    import torch.multiprocessing as mp
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False")
    caching = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1"
    print("%s: torch %s, caching allocator %s" %
          (NAME, torch.__version__, "on" if caching else "off"), flush=True)
    shared = tensors(torch)
    torch.cuda.synchronize()
    try:  # what the queue's feeder thread would do, here where it is seen
        for t in shared if not caching else ():
            t.untyped_storage()._share_cuda_()
    except RuntimeError as e:
        print("%s: UNSUPPORTED: %s" % (NAME, str(e).splitlines()[0]), flush=True)
        sys.exit(3)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(inbox, outbox, timeout))
    proc.start()
    inbox.put(list(shared))
    value = cudalloc_stats.child_answer(proc, outbox, timeout, fail)
    torch.cuda.synchronize()
    firsts = [float(t[0]) for t in shared]
    inbox.put("done")
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill()
        fail("the child did not exit within %d s" % timeout)
    want = expected(torch)
    for name, got, exp, first in zip(("1000 B", "64 KiB", "8 MiB"), value,
                                      want, firsts):
        if got != exp:
            fail("the child read the %s tensor wrong: sum %r, expected %r"
                 % (name, got, exp))
        if first != -1.0:
            fail("the child's write to the %s tensor is not seen: %r"
                 % (name, first))
    if proc.exitcode != 0:
        fail("the child exited with %d" % proc.exitcode)
    print("%s: child sums %s match; its writes are seen" % (NAME, value))
    print(cudalloc_stats.pooled_line(cudalloc_stats.get_stats()), flush=True)
    print("%s: PASS" % NAME, flush=True)


def main():
    timeout = 60
    args = sys.argv[1:]
    if args[:1] == ["--timeout"] and len(args) == 2:
        timeout = int(args[1])
    elif args:
        fail("usage: torch_ipc.py [--timeout SECONDS]")
    cudalloc_stats.run_guarded(NAME, lambda: run(timeout))


if __name__ == "__main__":
    main()
