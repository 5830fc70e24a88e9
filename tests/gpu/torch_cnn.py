"""torch_cnn: a few seeded training steps of a small CNN in PyTorch.

Why: PyTorch reaches the driver through libcudart.so (shared runtime), cuDNN
and cuBLAS, each resolving driver functions through cuGetProcAddress. With
PYTORCH_NO_CUDA_MEMORY_CACHING=1 its own caching allocator is off, so every
tensor is a cudaMalloc/cudaFree that the library must pool. Training results
that change under the library would mean a block was handed out while still
in use, or an address was wrong.

What it does: seeds everything (torch.manual_seed, deterministic cuDNN,
torch.use_deterministic_algorithms(True) with CUBLAS_WORKSPACE_CONFIG), builds
a CNN (four convolutions, the last three strided, and a linear layer; no
pooling layers, whose backward passes are not deterministic on CUDA) and runs
SGD steps on one fixed random batch against random targets with MSE loss.
It writes the losses, and the library's statistics if it is loaded, as JSON
to the file named on the command line; scripts/gpu-check.sh runs it without
and with LD_PRELOAD and compares the two loss lists (relative 1e-5).

What it checks itself: CUDA is available; every loss is finite; the last
loss is below the first (training works); and, with --expect pooled, the
library's statistics, read in-process through ctypes, show the pool served
more than 100 allocations with backend_allocs < allocs / 10. Last line:
"torch_cnn: PASS" or "torch_cnn: FAIL: <why>".

Usage: torch_cnn.py OUT.json [--expect plain|pooled|any] [--steps 20]
                    [--device cuda:0]
"""

import json
import math
import os

# Must be set before cuBLAS initializes for deterministic algorithms.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import cudalloc_stats  # noqa: E402

NAME = "torch_cnn"

fail = cudalloc_stats.failer(NAME)


def train(steps, device):
    import torch
    import torch.nn as nn

    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False")
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)

    # Parameters and data are made on the CPU from the seed, then moved: the
    # same numbers in every run whatever the device does.
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 10),
    ).to(dev)
    gen = torch.Generator().manual_seed(5678)
    x = torch.randn(64, 3, 32, 32, generator=gen).to(dev)
    y = torch.randn(64, 10, generator=gen).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()

    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    info = {"torch": torch.__version__, "device": str(dev)}
    if dev.type == "cuda":
        torch.cuda.synchronize()
        info.update(cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version(),
                    device=torch.cuda.get_device_name(dev))
    return losses, info


def main():
    ap = cudalloc_stats.expect_parser(__doc__)
    ap.add_argument("out", help="JSON file to write the losses to")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cuda:0",
                    help="cpu runs the same steps without a GPU (a dry run "
                         "of this script, not a check of the library)")
    args = ap.parse_args()

    print("%s: PYTORCH_NO_CUDA_MEMORY_CACHING=%s CUBLAS_WORKSPACE_CONFIG=%s"
          % (NAME, os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"),
             os.environ.get("CUBLAS_WORKSPACE_CONFIG")), flush=True)
    # An error in CUDA/PyTorch is reported as the verdict.
    losses, info = cudalloc_stats.run_guarded(
        NAME, lambda: train(args.steps, args.device),
        "exception during training")
    stats = cudalloc_stats.get_stats(0)
    print("%s: %s" % (NAME, json.dumps(info)), flush=True)
    print("%s: losses %s" % (NAME, " ".join("%.8g" % v for v in losses)),
          flush=True)
    print(cudalloc_stats.pooled_line(stats), flush=True)
    with open(args.out, "w") as f:
        json.dump({"losses": losses, "stats": stats, "info": info,
                   "no_caching": os.environ.get(
                       "PYTORCH_NO_CUDA_MEMORY_CACHING")}, f, indent=1)

    if len(losses) != args.steps:
        fail("%d losses for %d steps" % (len(losses), args.steps))
    if not all(math.isfinite(v) for v in losses):
        fail("a loss is not finite: %r" % losses)
    if not losses[-1] < losses[0]:
        fail("loss did not decrease: first %r, last %r"
             % (losses[0], losses[-1]))
    cudalloc_stats.conclude(NAME, stats, args.expect, min_allocs=100)


if __name__ == "__main__":
    main()
