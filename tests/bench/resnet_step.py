"""resnet_step: the time of one ResNet training step, and the memory used.

A benchmark, not a test (scripts/bench-gpu.sh runs it): torchvision's
ResNet-50 or ResNet-152 (no pretrained weights), batch 64 of 224x224 random
images with random labels, fp32 or under torch.autocast(bfloat16) (weights
and optimizer stay fp32: the usual mixed-precision recipe), cross-entropy,
SGD with momentum. After WARMUP (5)
steps it times STEPS (20) steps one by one, torch.cuda.synchronize() before
and after each, and prints the median. Memory in use is sampled after each
step as nvidia-smi shows it: NVML's "used" for the device (pynvml), which
counts every allocator's cache alike. torch.cuda.mem_get_info would not do:
under cudalloc it counts the pool's cached blocks as free, by design, so
that frameworks see them as available. Without pynvml it falls back to
mem_get_info and says so.

Run it as is for PyTorch's caching allocator, with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 for a cudaMalloc per tensor, and that under
LD_PRELOAD=libcudalloc.so to measure cudalloc. Prints
  resnet_step: <ms> ms (median of 20 steps, min .., max ..)
  resnet_step: peak in use <GiB> GiB
and, under PyTorch's own caching allocator, what it reserved and allocated
at its peak (torch.cuda.max_memory_reserved/allocated), then exits 0; 1 on an
error (a missing torchvision included).

--slot plugs cudalloc into PyTorch's allocator slot first
(cudalloc.torch.use(): nothing preloaded, PyTorch's cache replaced);
--plug PATH plugs the library PATH instead, whose functions are
NAME_alloc and NAME_free for libNAME.so (tests/bench/slot_floor.c, the floor
bench-gpu.sh sets the slot beside; tests/bench/slot_trace.c, the recorder).

Usage: resnet_step.py [--model resnet50|resnet152] [--amp none|bf16]
                      [--steps 20] [--warmup 5] [--batch 64]
                      [--slot | --plug PATH]
"""

import argparse
import os
import statistics
import sys
import time

try:
    import pynvml
except ImportError:
    pynvml = None


def nvml_device(index):
    """The NVML handle of CUDA device `index`, or None without pynvml."""
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError:
        return None


def memory_in_use(torch, dev):
    """A function giving the device memory in use now, as nvidia-smi shows
    it (NVML), or from mem_get_info without pynvml; and which it is."""
    handle = nvml_device(dev.index or 0)
    if handle is not None:
        return (lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used), "nvml"

    def from_info():
        free_b, total_b = torch.cuda.mem_get_info(dev)
        return total_b - free_b
    return from_info, "mem_get_info"


def plug_slot():
    """cudalloc in PyTorch's allocator slot, before any tensor is made."""
    import cudalloc
    cudalloc.torch.use()


def plug_library(path):
    """The library `path` in PyTorch's allocator slot, before any tensor is
    made: its NAME_alloc and NAME_free, NAME its file's (libslot_floor.so:
    slot_floor_alloc; libslot_trace.so, the recorder: slot_trace_alloc),
    plugged as cudalloc.torch.use() plugs cudalloc's, with nothing else of
    PyTorch's answered by it (memory_stats and the like say nothing under
    it)."""
    import torch
    name = os.path.basename(path)
    name = name[3:] if name.startswith("lib") else name
    name = name.split(".so")[0]
    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        os.path.abspath(path), name + "_alloc", name + "_free")
    torch.cuda.memory.change_current_allocator(alloc)


def plug(args):
    """What --slot or --plug asks to put in PyTorch's allocator slot."""
    if args.slot:
        plug_slot()
    elif args.plug:
        plug_library(args.plug)


def add_plug_options(ap):
    """--slot and --plug PATH, one or the other, on the parser `ap`."""
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--slot", action="store_true",
                       help="cudalloc in PyTorch's allocator slot")
    which.add_argument("--plug", metavar="PATH",
                       help="the library PATH (slot_floor_alloc and "
                       "slot_floor_free) in PyTorch's allocator slot")


def train_steps(args):
    import torch
    import torch.nn as nn
    plug(args)
    try:
        import torchvision
    except ImportError as e:
        sys.exit("resnet_step: torchvision is not importable: %s" % e)
    if not torch.cuda.is_available():
        sys.exit("resnet_step: torch.cuda.is_available() is False")
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    in_use, args.memory_source = memory_in_use(torch, dev)
    model = getattr(torchvision.models, args.model)(weights=None).to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16,
                            enabled=args.amp == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    peak, times = 0, []
    for _ in range(args.warmup):
        step()
        torch.cuda.synchronize()
        peak = max(peak, in_use())
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        peak = max(peak, in_use())
    torch_peaks = None
    if torch.cuda.get_allocator_backend() == "native" and \
            torch.cuda.max_memory_allocated(dev) > 0:
        torch_peaks = (torch.cuda.max_memory_reserved(dev),
                       torch.cuda.max_memory_allocated(dev))
    return times, peak, torch.__version__, torch_peaks


def plugged(args):
    """What is in the allocator slot, for the first line of the output."""
    if args.slot:
        return ", cudalloc in the allocator slot"
    if args.plug:
        return ", %s in the allocator slot" % os.path.basename(args.plug)
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("resnet50", "resnet152"),
                    default="resnet50")
    ap.add_argument("--amp", choices=("none", "bf16"), default="none")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    add_plug_options(ap)
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.batch < 1:
        sys.exit("resnet_step: bad arguments")
    times, peak, version, torch_peaks = train_steps(args)
    print("resnet_step: torch %s, %s, %s, batch %d, "
          "PYTORCH_NO_CUDA_MEMORY_CACHING=%s, PYTORCH_CUDA_ALLOC_CONF=%s%s"
          % (version, args.model, args.amp, args.batch,
             os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", ""),
             os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
             plugged(args)))
    print("resnet_step: %.2f ms (median of %d steps, min %.2f, max %.2f)"
          % (statistics.median(times), len(times), min(times), max(times)))
    print("resnet_step: peak in use %.2f GiB (%s)"
          % (peak / 2.0 ** 30, args.memory_source))
    if torch_peaks is not None:
        print("resnet_step: torch reserved %.2f GiB, allocated %.2f GiB at "
              "their peaks" % (torch_peaks[0] / 2.0 ** 30,
                               torch_peaks[1] / 2.0 ** 30))


if __name__ == "__main__":
    main()
