"""gpt2_step: the time of one GPT-2 training step (a benchmark, not a test).

transformers' GPT-2 (the 124M configuration, random weights: no download),
batch 8 of 512 random tokens, AdamW, bf16 autocast. After WARMUP (3) steps
it times STEPS (15) steps one by one, torch.cuda.synchronize() before and
after each, and prints the median, the losses' checksum (the same losses
plain and under cudalloc mean the same computation) and the peak of device
memory in use, sampled after each step as resnet_step.py samples it (NVML):
  gpt2_step: <ms> ms (median of 15 steps, min .., max ..)
  gpt2_step: losses <first> .. <last>
  gpt2_step: peak in use <GiB> GiB (nvml)
Run it as is, with PYTORCH_NO_CUDA_MEMORY_CACHING=1 for a cudaMalloc per
tensor, and that under LD_PRELOAD=libcudalloc.so.

--slot plugs cudalloc into PyTorch's allocator slot first (cudalloc.torch.use());
--plug PATH the library PATH (slot_floor_alloc and slot_floor_free:
tests/bench/slot_floor.c), as resnet_step.py does.

Usage: gpt2_step.py [--steps 15] [--warmup 3] [--batch 8] [--seq 512]
                    [--slot | --plug PATH]
"""

import argparse
import statistics
import sys
import time

from resnet_step import add_plug_options, memory_in_use, plug


def train_steps(args):
    """Plugs what args ask for (--slot, --plug), then WARMUP and STEPS steps:
    the timed steps' milliseconds, every step's loss, the peak of memory in
    use and where that figure comes from (slot_steps.py calls it too)."""
    import torch
    plug(args)
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        sys.exit("gpt2_step: transformers is not importable: %s" % e)
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    model = GPT2LMHeadModel(GPT2Config()).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 50257, (args.batch, args.seq), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        return float(loss)

    in_use, source = memory_in_use(torch, dev)
    losses, times, peak = [], [], 0
    for _ in range(args.warmup):
        losses.append(step())
        peak = max(peak, in_use())
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        peak = max(peak, in_use())
    return times, losses, peak, source


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    add_plug_options(ap)
    args = ap.parse_args()
    times, losses, peak, source = train_steps(args)
    print("gpt2_step: %.2f ms (median of %d steps, min %.2f, max %.2f)"
          % (statistics.median(times), len(times), min(times), max(times)))
    print("gpt2_step: losses %.6f .. %.6f" % (losses[0], losses[-1]))
    print("gpt2_step: peak in use %.2f GiB (%s)" % (peak / 2.0 ** 30, source))


if __name__ == "__main__":
    main()
