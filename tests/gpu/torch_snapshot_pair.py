#!/usr/bin/env python3
"""torch_snapshot_pair.py: one training run's memory, as PyTorch's own
snapshot shows it and as cudalloc's trace does.

  torch_snapshot_pair.py train [OUT.pickle]
      trains a small convolutional network 5 steps, then drops the model,
      its optimizer and its data, so that what is left is the allocator's
      cache; with OUT, under PyTorch's own allocator (PYTORCH_NO_CUDA_MEMORY_CACHING
      unset here), records its memory history and dumps its snapshot there
      (torch.cuda.memory._record_memory_history, _dump_snapshot); without,
      run it under cudalloc with trace_path and make the snapshot with
      `cudalloc view --torch-snapshot`.
  torch_snapshot_pair.py read TORCH.pickle CUDALLOC.pickle
      has PyTorch's _memory_viz read both (stats, trace, the segments'
      stacks) and prints, for each, its segments, reserved and allocated
      bytes, then one PASS or FAIL line: both read, each shows a cache
      (more bytes reserved than allocated: cuBLAS keeps its workspace).
"""
import os
import pickle
import sys


def train(out):
    if out:
        os.environ.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)  # PyTorch's own cache
    import torch
    if out:
        torch.cuda.memory._record_memory_history(max_entries=100000)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    print("torch_snapshot_pair: loss %.6f" % loss.item())
    del model, opt, x, y, loss
    if out:
        torch.cuda.memory._dump_snapshot(out)
        print("torch_snapshot_pair: wrote", out)


def figures(snap):
    segs = snap["segments"]
    return (len(segs), sum(s["total_size"] for s in segs),
            sum(s["allocated_size"] for s in segs))


def read(paths):
    from torch.cuda import _memory_viz as viz
    problems, said = [], []
    for name, path in zip(("pytorch", "cudalloc"), paths):
        with open(path, "rb") as f:
            snap = pickle.load(f)
        try:
            stats = viz.segsum(snap)
            viz.trace(snap)
            viz.segments(snap, format_flamegraph=str)
        except Exception as e:  # noqa: BLE001 - any failure of PyTorch's readers
            problems.append("%s: _memory_viz failed: %r" % (name, e))
            continue
        n, reserved, allocated = figures(snap)
        if "total_reserved" not in stats:
            problems.append("%s: stats printed no total_reserved" % name)
        if n == 0 or reserved <= allocated:
            problems.append("%s: %d segments, %d reserved, %d allocated: want a cache "
                            "beside what is still held" % (name, n, reserved, allocated))
        said.append("%s %d segments, %.1f MiB reserved, %d allocated" % (
            name, n, reserved / 2**20, allocated))
    print("torch_snapshot_pair: " + "; ".join(said))
    print("torch_snapshot_pair: " + ("FAIL " + "; ".join(problems) if problems else "PASS"))
    return 1 if problems else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "train" and len(argv) <= 3:
        train(argv[2] if len(argv) == 3 else None)
        return 0
    if len(argv) == 4 and argv[1] == "read":
        return read(argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
