"""gpt2_varlen: a workload that fragments device memory (a benchmark, not a
test): a GPT-2-shaped model trained on batches of random lengths, then used
for generation with a key-value cache that grows by one token per step.

Every step allocates tensors of a new size: a training step at length 1,900
after one at 130 finds no cached block of the sizes it needs, and a cache
that grows by concatenation frees the previous, slightly smaller copy at
each token. Lengths come from a seeded generator, so every run, plain or
under any allocator, makes the same requests in the same order.

For each batch size in --batches (ascending), it runs --train training steps
(bf16 autocast, AdamW) at lengths drawn from 64..2048 and --gen generation
rounds (prompts of 64..1024 tokens, --tokens new tokens each, greedy), then
prints
  gpt2_varlen: batch B: ok, held peak H GiB, reserved peak R GiB (source) in T s
where the peaks come from cudalloc's statistics when the library is loaded
and from torch.cuda.max_memory_allocated/reserved otherwise. The first batch
size that runs out of device memory prints
  gpt2_varlen: batch B: out of memory
and ends the run: the largest size that ran is the figure to compare under a
fixed limit. --limit-gib sets PyTorch's per-process memory fraction (for
PyTorch's own allocators; cudalloc's limit is memory_limit_mb).

--slot plugs cudalloc into PyTorch's allocator slot first (cudalloc.torch.use();
its limit is then memory_limit_mb: PyTorch's memory fraction does not reach a
pluggable allocator).

Usage: gpt2_varlen.py [--batches 8] [--train 16] [--gen 2] [--tokens 128]
                      [--seed 0] [--limit-gib 0] [--layers 12] [--slot]
"""

import argparse
import random
import sys
import time

import cudalloc


def peaks(torch, dev):
    """(held, reserved, source) peaks in bytes."""
    if cudalloc.loaded():
        s = cudalloc.stats(0)
        if s and s["rc"] == 0:
            return (s["requested_bytes"]["peak"], s["reserved_bytes"]["peak"],
                    "cudalloc")
    return (torch.cuda.max_memory_allocated(dev),
            torch.cuda.max_memory_reserved(dev), "torch")


def run_batch(torch, model, opt, dev, batch, args, rng):
    model.train()
    for _ in range(args.train):
        length = rng.randint(64, 2048)
        x = torch.randint(0, 50257, (batch, length), device=dev)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        del x, loss
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(args.gen):
            prompt = torch.randint(0, 50257, (batch, rng.randint(64, 1024)),
                                   device=dev)
            out = model(input_ids=prompt, use_cache=True)
            past = out.past_key_values
            for _ in range(args.tokens):
                nxt = out.logits[:, -1:].argmax(-1)
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
            del prompt, out, past, nxt
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8")
    ap.add_argument("--train", type=int, default=16)
    ap.add_argument("--gen", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-gib", type=float, default=0)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--slot", action="store_true")
    args = ap.parse_args()
    import torch
    if args.slot:
        cudalloc.torch.use()
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(args.seed)
    dev = torch.device("cuda:0")
    if args.limit_gib:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, args.limit_gib * 2**30 / total), dev)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers,
                                       n_positions=2048)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for batch in [int(b) for b in args.batches.split(",")]:
        rng = random.Random(args.seed * 1000 + batch)
        t0 = time.perf_counter()
        try:
            run_batch(torch, model, opt, dev, batch, args, rng)
        except Exception as e:  # noqa: BLE001 (torch.AcceleratorError too)
            # Without PyTorch's cache a failed cudaMalloc surfaces as an
            # AcceleratorError ("CUDA error: out of memory").
            if "out of memory" not in str(e):
                raise
            print("gpt2_varlen: batch %d: out of memory" % batch, flush=True)
            return 0
        held, reserved, source = peaks(torch, dev)
        print("gpt2_varlen: batch %d: ok, held peak %.3f GiB, reserved peak "
              "%.3f GiB (%s) in %.1f s" % (batch, held / 2**30,
                                           reserved / 2**30, source,
                                           time.perf_counter() - t0),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
