"""torch_group: two PyTorch trainings of one shared_limit group on one GPU.

Why: shared_limit caps the device memory of every process of a group
together. Two trainings whose peaks add up past the cap can both run only if
the one that went idle gives back what its pool caches when the other asks
(through the library's watcher), and a request the group cannot make room
for must fail as PyTorch's out of memory, saying who holds what.

What it does: a seeded, deterministic CNN training (torch_cnn's settings,
with larger images so that activations dominate), PyTorch's own cache off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1), so the library's pool is the only cache.

  solo OUT.json [--steps N]
      trains 2N steps alone; writes the losses and the pool's reserved peak
  pair DIR [--steps N] [--hold-live]
      runs "first" and "second" at once, each in a process of its own, with
      the environment it was given (the library preloaded, CUDALLOC_CONF
      naming the group), and waits for both; their files are DIR/first.json
      and DIR/second.json
  first DIR: trains N steps, then stays idle (its pool caching what the steps
      freed; with --hold-live it first takes most of that back in one tensor
      it keeps) until second is done, then trains N steps more
  second DIR: waits until first is idle, then trains N steps; an out of
      memory (PyTorch's OutOfMemoryError, or AcceleratorError "out of memory"
      where the refusal reaches it from a library call, as from F.conv2d on
      the H200) is caught and written down

Each file holds the losses, the pool's reserved bytes before idling and
after second is done (first), and the out-of-memory message if any. Last
line of each process: "torch_group: PASS" or "torch_group: FAIL: <why>".
"""

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import cudalloc_stats  # noqa: E402

NAME = "torch_group"
WAIT_S = 120
fail = cudalloc_stats.failer(NAME)


def setup(batch=128):
    import torch
    import torch.nn as nn

    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 12 * 12, 10),
    ).cuda()
    gen = torch.Generator().manual_seed(5678)
    x = torch.randn(batch, 3, 96, 96, generator=gen).cuda()
    y = torch.randn(batch, 10, generator=gen).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, x, y, opt


def train(state, steps):
    import torch.nn as nn

    model, x, y, opt = state
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses


def reserved():
    stats = cudalloc_stats.get_stats(0)
    return stats["reserved_bytes"]["current"] if stats else None


def wait_for(path):
    deadline = time.time() + WAIT_S
    while not os.path.exists(path):
        if time.time() > deadline:
            fail("%s did not appear within %d s" % (path, WAIT_S))
        time.sleep(0.05)


def write(path, doc):
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.rename(path + ".tmp", path)


def solo(out, steps):
    import torch

    losses = cudalloc_stats.run_guarded(NAME, lambda: train(setup(), 2 * steps),
                                        "exception during training")
    torch.cuda.synchronize()
    stats = cudalloc_stats.get_stats(0)
    write(out, {"losses": losses,
                "reserved_peak": stats["reserved_bytes"]["peak"] if stats else None})
    print("%s: losses %s" % (NAME, " ".join("%.8g" % v for v in losses)), flush=True)
    print(cudalloc_stats.pooled_line(stats), flush=True)


def first(folder, steps, hold_live):
    import torch

    state = setup()
    losses = train(state, steps)
    torch.cuda.synchronize()
    ballast = None
    if hold_live:  # most of what the pool caches, taken back and kept
        ballast = torch.empty(int(reserved() * 0.8), dtype=torch.uint8, device="cuda")
    idle = reserved()
    write(os.path.join(folder, "first.idle"), {"reserved": idle})
    print("%s: first idle, reserving %d bytes" % (NAME, idle), flush=True)
    wait_for(os.path.join(folder, "second.json"))
    after = reserved()
    del ballast
    losses += train(state, steps)
    torch.cuda.synchronize()
    write(os.path.join(folder, "first.json"),
          {"losses": losses, "reserved_idle": idle, "reserved_after": after})


def second(folder, steps):
    import torch

    wait_for(os.path.join(folder, "first.idle"))
    free, total = torch.cuda.mem_get_info()
    doc = {"losses": [], "oom": None, "error": None, "mem_get_info": [free, total]}
    try:
        state = setup()
        doc["losses"] = train(state, steps)
        torch.cuda.synchronize()
    except RuntimeError as e:  # OutOfMemoryError, or AcceleratorError "out of memory"
        what = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
        doc["oom" if "out of memory" in str(e) else "error"] = what
        print("%s: second: %s" % (NAME, what), flush=True)
    finally:  # the first waits for this file, whatever happened
        write(os.path.join(folder, "second.json"), doc)
    if doc["error"]:
        fail("second: %s" % doc["error"])


def pair(folder, steps, hold_live):
    """Both roles at once; the exit status is the worse of theirs."""
    os.makedirs(folder, exist_ok=True)
    for name in ("first.idle", "first.json", "second.json"):
        if os.path.exists(os.path.join(folder, name)):
            os.unlink(os.path.join(folder, name))
    me = os.path.abspath(__file__)
    extra = ["--steps", str(steps)] + (["--hold-live"] if hold_live else [])
    procs = [subprocess.Popen([sys.executable, me, role, folder] + extra)
             for role in ("first", "second")]
    print("%s: pair: first pid %d, second pid %d" % (NAME, procs[0].pid, procs[1].pid),
          flush=True)
    codes = [p.wait() for p in procs]
    if any(codes):
        fail("exit statuses %r" % codes)


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=("solo", "pair", "first", "second"))
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--hold-live", action="store_true")
    args = ap.parse_args()
    if args.role == "solo":
        solo(args.path, args.steps)
    elif args.role == "pair":
        pair(args.path, args.steps, args.hold_live)
    else:
        run = (lambda: first(args.path, args.steps, args.hold_live)) if args.role == "first" \
            else (lambda: second(args.path, args.steps))
        cudalloc_stats.run_guarded(NAME, run, "exception in %s" % args.role)
    print("%s: PASS" % NAME, flush=True)


if __name__ == "__main__":
    main()
