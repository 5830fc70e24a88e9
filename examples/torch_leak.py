#!/usr/bin/env python3
"""torch_leak: the classic PyTorch training-loop leak, and its fix.

A tiny MLP trains on random data. To log its progress, the leaky loop keeps
every step's loss tensor and output tensor in lists ("I'll look at them
later"). Each one is a live device tensor with its autograd history, so
device memory grows by about 1 MiB every step until the device runs out.
With --fixed the loop keeps plain Python numbers instead: loss.item() and
the step's accuracy.

Run it under cudalloc, with PyTorch's caching allocator off so that every
tensor is its own device allocation that cudalloc sees:

  PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDALLOC_CONF=backtrace_depth:16 \\
      LD_PRELOAD=build/libcudalloc.so python3 examples/torch_leak.py [--fixed]

Each step prints the device memory in use and marks the step's end for
cudalloc (cudalloc.mark()). At the end of training the script asks cudalloc
for its report of live allocations (cudalloc.report()): the leaky run shows
groups of --steps allocations (one per step: the kept outputs, the kept
losses); the fixed run shows no such group.

Python frees every tensor while the interpreter shuts down, so by the time
cudalloc's report at exit runs, the kept tensors are gone and it
(truthfully) finds no leak. Two ways to see the growth anyway: the report
asked for at the end of training, as here, or CUDALLOC_CONF=growth_report:1,
whose report at exit names the sites whose live memory grew step after step
(one snapshot per mark), freed or not. Both go through the package
`cudalloc` (`pip install .`, or scripts/python on PYTHONPATH), the library's
Python helper; without cudalloc the script just trains.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import cudalloc

FEATURES, HIDDEN, CLASSES = 512, 1024, 256
BATCH = 1024  # one output is BATCH x CLASSES floats: exactly 1 MiB
MIB = 1 << 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixed", action="store_true",
                   help="keep Python numbers (loss.item()), not tensors")
    p.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def device_memory_in_use():
    """Bytes in use on the device, from the driver: torch.cuda.memory_allocated
    counts only the caching allocator's tensors, and it is off here."""
    free, total = torch.cuda.mem_get_info()
    return total - free


def print_cudalloc_report():
    """Prints cudalloc's report of live device allocations, when cudalloc is
    loaded (LD_PRELOAD); says how to get it otherwise."""
    if not cudalloc.loaded():
        print("torch_leak: cudalloc is not loaded; run with "
              "LD_PRELOAD=build/libcudalloc.so to see where the memory went")
        return
    print("torch_leak: cudalloc's report of the device memory still allocated:")
    cudalloc.report()
    sys.stderr.flush()


def train(steps, fixed):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(BATCH, FEATURES, device="cuda")
    y = torch.randint(0, CLASSES, (BATCH,), device="cuda")
    losses, outputs, accuracies = [], [], []
    start = None
    for step in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        if fixed:
            # Python numbers: the step's tensors are freed when the names
            # are rebound next step.
            losses.append(loss.item())
            accuracies.append((logits.argmax(1) == y).float().mean().item())
        else:
            # THE LEAK: tensors on the device, each holding its graph's
            # nodes, kept for "later" -- one loss and one 1 MiB output per step.
            losses.append(loss)
            outputs.append(logits)
        torch.cuda.synchronize()
        cudalloc.mark()  # the step's end: growth_report:1 snapshots here
        used = device_memory_in_use()
        start = used if start is None else start
        print("step %3d: loss %.4f, device memory in use %8.1f MiB (%+.1f MiB since step 1)"
              % (step, float(loss), used / MIB, (used - start) / MIB))
    return losses, outputs, accuracies


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_leak: needs a CUDA device")
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        print("torch_leak: note: PYTORCH_NO_CUDA_MEMORY_CACHING=1 is not set, so PyTorch "
              "caches memory itself and cudalloc sees its large segments, not the tensors")
    # What the loop kept stays referenced here until the report is printed.
    losses, outputs, accuracies = train(args.steps, args.fixed)
    if args.fixed:
        kept = "%d losses and %d accuracies as Python floats" % (len(losses), len(accuracies))
    else:
        kept = "%d losses and %d outputs as device tensors" % (len(losses), len(outputs))
    print("torch_leak%s: %d steps done, final loss %.4f; the loop kept %s"
          % (" --fixed" if args.fixed else "", args.steps, float(losses[-1]), kept))
    print_cudalloc_report()


if __name__ == "__main__":
    main()
