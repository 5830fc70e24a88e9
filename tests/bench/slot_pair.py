"""slot_pair: what one tensor's allocation and free cost the host through
PyTorch's allocator, as it comes or with a library in its slot: the
bookkeeping every plug-in pays (PyTorch's own around the slot), the
library's share above it, against PyTorch's caching allocator.

Makes and drops a 4 KiB tensor N times (default 200,000) after a warm-up,
three times, and prints the best of the three in microseconds per pair:

  slot_pair: <setting> <us> us per allocation and free (best of 3 x N)

Usage: slot_pair.py [--pairs N] [--slot | --plug PATH]
(--slot: cudalloc, cudalloc.torch.use(); --plug: libNAME.so's
NAME_alloc and NAME_free, as resnet_step.py plugs them.)
"""
import argparse
import time

import resnet_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200000)
    resnet_step.add_plug_options(ap)
    args = ap.parse_args()
    import torch
    resnet_step.plug(args)
    dev = torch.device("cuda:0")
    for _ in range(1000):
        x = torch.empty(1024, device=dev)
        del x
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(args.pairs):
            x = torch.empty(1024, device=dev)
            del x
        t = (time.perf_counter() - t0) / args.pairs * 1e6
        best = t if best is None else min(best, t)
    torch.cuda.synchronize()
    setting = resnet_step.plugged(args).strip(", ") or "pytorch caching"
    print("slot_pair: %s %.3f us per allocation and free (best of 3 x %d)"
          % (setting, best, args.pairs), flush=True)


if __name__ == "__main__":
    main()
