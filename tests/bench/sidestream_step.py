"""sidestream_step: ResNet-50 training steps fed from a side stream.

A workload for allocation traces with more than one stream (tests/bench/
slot_trace.c records them; bench_replay replays them with +stream): the
pattern Tensor.record_stream exists for. torchvision's ResNet-50 (no
pretrained weights), fp32, batch 64 of random 224x224 images with random
labels, cross-entropy, SGD with momentum, on the default stream. Each next
batch is made on the host (pinned, so that its copy is asynchronous) and
copied to the GPU on a side stream while the current step runs; the step
then waits for the side stream (wait_stream) and records the batch on its
own stream (record_stream), so that the allocator does not hand the batch's
memory out again before the step's kernels are done with it.

--plug PATH puts the library at PATH in PyTorch's allocator slot first
(torch.cuda.memory.CUDAPluggableAllocator with slot_trace_alloc and
slot_trace_free, and slot_trace_record for record_stream), before any CUDA
use. Without it PyTorch's own allocator runs.

Usage: sidestream_step.py [--steps 6] [--batch 64] [--plug PATH]
"""

import argparse
import ctypes
import sys


def plug(torch, path):
    """The library at `path` as PyTorch's allocator; the library, loaded."""
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        path, "slot_trace_alloc", "slot_trace_free")
    lib = ctypes.CDLL(path)  # the same copy PyTorch's class just loaded
    # record_stream reaches a pluggable allocator only through this setter
    # of the C++ object: PyTorch's Python class takes no third function.
    setter = getattr(alloc.allocator(), "set_record_stream_fn", None)
    if setter is not None:
        setter(ctypes.cast(lib.slot_trace_record, ctypes.c_void_p).value)
    else:
        print("sidestream_step: this PyTorch has no set_record_stream_fn: "
              "no record_stream lines in the trace")
    torch.cuda.memory.change_current_allocator(alloc)
    return lib


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--plug", metavar="PATH")
    args = ap.parse_args()
    if args.steps < 1 or args.batch < 1:
        sys.exit("sidestream_step: bad arguments")
    import torch
    import torch.nn as nn
    lib = plug(torch, args.plug) if args.plug else None
    try:
        import torchvision
    except ImportError as e:
        sys.exit("sidestream_step: torchvision is not importable: %s" % e)
    if not torch.cuda.is_available():
        sys.exit("sidestream_step: torch.cuda.is_available() is False")
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    model = torchvision.models.resnet50(weights=None).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    main_stream = torch.cuda.current_stream(dev)  # the default stream
    side = torch.cuda.Stream(dev)

    def upload():
        """The next batch: made on the host, copied on the side stream
        (allocated there too: the slot sees the side stream)."""
        x = torch.randn(args.batch, 3, 224, 224).pin_memory()
        y = torch.randint(0, 1000, (args.batch,)).pin_memory()
        with torch.cuda.stream(side):
            return (x.to(dev, non_blocking=True), y.to(dev, non_blocking=True))

    batch = upload()
    for _ in range(args.steps):
        # The step's kernels read the batch only after its copy ...
        main_stream.wait_stream(side)
        x, y = batch  # the previous batch is dropped here (freed)
        # ... and its memory is not reused before they are done.
        x.record_stream(main_stream)
        y.record_stream(main_stream)
        batch = upload()  # the next copy overlaps this step
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    print("sidestream_step: torch %s, resnet50 fp32, batch %d, %d steps, "
          "loss %.3f, %s" % (torch.__version__, args.batch, args.steps,
                             loss.item(),
                             "slot: " + args.plug if lib else
                             "PyTorch's allocator"))
    if lib is not None:
        lib.slot_trace_flush()  # whole even if teardown ends abruptly


if __name__ == "__main__":
    main()
