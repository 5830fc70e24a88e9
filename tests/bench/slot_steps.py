"""slot_steps: training steps of several models, one after another, in one process.

A benchmark, not a test: scripts/bench-gpu.sh's part slot runs it once per
allocator setting and round. Why one process for all the cases: a run's
seconds go to starting PyTorch (importing it and transformers, setting up
CUDA, cuDNN and cuBLAS: some 15-25 s) against 1-3 s of steps, and the
allocator is chosen once per process anyway (the environment, --slot or
--plug, before any tensor is made), so one process per setting measures the
same steps in a third of the time that one per case would take.

Cases (each as its own script runs it, with these step counts):
  gpt2       gpt2_step.py: GPT-2 124M, bf16 autocast, batch 8 of 512 tokens,
             AdamW; 15 timed steps after 3
  resnet50   resnet_step.py: fp32, batch 64, 224x224, SGD with momentum;
             20 timed steps after 5
  resnet152  the same; 15 timed steps after 4 (a step takes twice
             ResNet-50's, and its median of 15 is as steady)
Between two cases everything of the first is freed and the cache emptied
(gc, torch.cuda.empty_cache(), which cudalloc's slot answers too; the floor
keeps its region), so that a case's peak is its own on top of what the
process holds anyway (the CUDA context, cuBLAS's workspaces). Each case
prints, once it is done:
  slot_steps: <case> in use before <GiB> GiB
  slot_steps: <case> <ms> ms (median of N steps, min .., max ..)
  slot_steps: <case> peak in use <GiB> GiB (nvml)
the peak being the memory in use after each step as resnet_step.py samples
it (NVML). Exits 0; on an error 1, the cases done before it printed.

Usage: slot_steps.py CASE... [--slot | --plug PATH]
"""

import argparse
import gc
import os
import statistics
import sys

import gpt2_step
import resnet_step

# Each case's (timed steps, warm-up steps).
STEPS = {"gpt2": (15, 3), "resnet50": (20, 5), "resnet152": (15, 4)}


def run_case(case):
    """One case's timed steps (ms), peak in use (bytes) and its source."""
    steps, warmup = STEPS[case]
    # Nothing to plug here: main() plugged the slot once for every case.
    common = dict(steps=steps, warmup=warmup, slot=False, plug=None)
    if case == "gpt2":
        args = argparse.Namespace(batch=8, seq=512, **common)
        times, _, peak, source = gpt2_step.train_steps(args)
        return times, peak, source
    args = argparse.Namespace(model=case, amp="none", batch=64, **common)
    times, peak, _, _ = resnet_step.train_steps(args)
    return times, peak, args.memory_source


def pool_figures(case):
    """Under cudalloc, what its pool held at the case's peaks and the driver
    calls it made so far (warm-up included): what the peak in use and the
    step time are made of."""
    import cudalloc
    s = cudalloc.stats(0)
    print("slot_steps: %s pool: requested peak %.2f GiB, reserved peak %.2f "
          "GiB, %d segments asked of the driver, %d given back (all cases "
          "so far)" % (case, s["requested_bytes"]["peak"] / 2.0 ** 30,
                       s["reserved_bytes"]["peak"] / 2.0 ** 30,
                       s["backend_allocs"], s["backend_frees"]), flush=True)


def torch_figures(torch, case):
    """Under PyTorch's own allocator, what it reserved and handed out at
    the case's peaks, beside pool_figures' for cudalloc."""
    print("slot_steps: %s pool: requested peak %.2f GiB, reserved peak %.2f "
          "GiB (PyTorch's allocator)"
          % (case, torch.cuda.max_memory_allocated() / 2.0 ** 30,
             torch.cuda.max_memory_reserved() / 2.0 ** 30), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", choices=sorted(STEPS), metavar="CASE",
                    help="gpt2, resnet50 or resnet152, in the order to run")
    resnet_step.add_plug_options(ap)
    args = ap.parse_args()
    import torch
    resnet_step.plug(args)
    if not torch.cuda.is_available():
        sys.exit("slot_steps: torch.cuda.is_available() is False")
    dev = torch.device("cuda:0")
    in_use, _ = resnet_step.memory_in_use(torch, dev)
    print("slot_steps: torch %s, PYTORCH_CUDA_ALLOC_CONF=%s, CUDALLOC_CONF=%s%s"
          % (torch.__version__, os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
             os.environ.get("CUDALLOC_CONF", ""), resnet_step.plugged(args)),
          flush=True)
    for case in args.cases:
        before = in_use()
        times, peak, source = run_case(case)
        print("slot_steps: %s in use before %.2f GiB" % (case, before / 2.0 ** 30))
        print("slot_steps: %s %.2f ms (median of %d steps, min %.2f, max %.2f)"
              % (case, statistics.median(times), len(times), min(times),
                 max(times)))
        print("slot_steps: %s peak in use %.2f GiB (%s)"
              % (case, peak / 2.0 ** 30, source), flush=True)
        if args.slot:
            pool_figures(case)
        elif not args.plug:
            torch_figures(torch, case)
        # The case's model, optimizer and batch went with run_case's frame;
        # collect what cycles hold, then give the cache back for the next.
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        # The next case's peaks start from what is left (under the slot,
        # cudalloc.torch.use() answers this from the library; another
        # plug-in has no peaks to reset).
        if not args.plug:
            torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()
