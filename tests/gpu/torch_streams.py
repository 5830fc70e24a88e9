"""torch_streams: PyTorch tensors crossing two CUDA streams, freed early.

Why: PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1 frees every tensor with
cudaFree, which waits for all device work on every stream; so a tensor made
on one stream and still read by another may be dropped by the host at once,
with or without Tensor.record_stream, and nothing goes wrong. Under
cudalloc the free returns at once; the pool must keep the block from being
handed out again until the other stream's work queued before the free is
done (reuse_policy:safe, the default). A block reused too early shows here
as a result that differs from the run without the library.

What it does: seeded, deterministic (torch.use_deterministic_algorithms,
CUBLAS_WORKSPACE_CONFIG), a pipeline of STEPS (300) steps over two
torch.cuda.Stream()s. Each step, a producer on s1 (which never waits for s2,
so it runs ahead) updates its own state and makes a fresh tensor `a` (and a
second one whose size changes from step to step); the consumer on s2 waits
for s1 (wait_stream), reads them in a few matrix products, updates its own
state and writes one number into the results. The host then drops `a` and
the other at once, while s2 still reads them: on even steps after
a.record_stream(s2), as a PyTorch user should, on odd steps without it (safe
only because the free waits: what the library must preserve). The
results, plus the consumer state's final sum, are written as JSON to the
file named on the command line; scripts/gpu-check.sh runs this without and
with the library and compares the two lists (equal, or within 1e-6
relative).

What it checks itself: CUDA is available, two streams really are distinct,
every result is finite and, with --expect pooled, the library's statistics
(read through ctypes) show the pool served the tensors. Last line:
"torch_streams: PASS" or "torch_streams: FAIL: <why>".

Usage: torch_streams.py OUT.json [--expect plain|pooled|any] [--steps 300]
"""

import json
import math
import os
import time

# Must be set before cuBLAS initializes for deterministic algorithms.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import cudalloc_stats  # noqa: E402

NAME = "torch_streams"
WIDTH = 2048  # the consumer's products: WIDTH x WIDTH weights
ROWS = 512    # rows of `a`

fail = cudalloc_stats.failer(NAME)


def setup(torch):
    """Deterministic settings and the seeded weights and states (made on the
    CPU from the seed, then moved: the same numbers in every run)."""
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False")
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(4321)
    dev = torch.device("cuda:0")

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dev)

    return {
        "w1": rand(WIDTH, WIDTH, scale=WIDTH ** -0.5),
        "w2": rand(WIDTH, WIDTH, scale=WIDTH ** -0.5),
        "w3": rand(WIDTH, WIDTH, scale=WIDTH ** -0.5),
        "p_state": rand(ROWS, WIDTH),
        "c_state": rand(WIDTH),
    }


def produce(torch, t, step):
    """On s1: the producer's next state and two fresh tensors from it."""
    t["p_state"] = torch.sin(t["p_state"] @ t["w1"] + 0.01 * step)
    a = torch.tanh(t["p_state"] @ t["w2"])
    rows = 64 + (step * 37) % 448  # another size every step
    extra = torch.cos(t["p_state"][:rows] * (1.0 + step % 7))
    return a, extra


def consume(torch, t, a, extra, results, step):
    """On s2: a few products over a and extra; one result per step."""
    b = torch.relu(a @ t["w3"])
    c = torch.tanh(b @ t["w1"]) @ t["w2"]
    e = (extra @ t["w3"]).square().mean()
    t["c_state"] = 0.9 * t["c_state"] + 0.1 * torch.tanh(c.mean(0))
    results[step] = c.square().mean() + e + t["c_state"].sum() * 1e-3


def pipeline(steps):
    import torch

    t = setup(torch)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    if s1.cuda_stream == s2.cuda_stream:
        fail("the two streams are the same CUDA stream")
    results = torch.zeros(steps, device="cuda:0")
    torch.cuda.synchronize()  # set-up done before both streams start
    recorded = 0
    for step in range(steps):
        with torch.cuda.stream(s1):
            a, extra = produce(torch, t, step)
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            consume(torch, t, a, extra, results, step)
        if step % 2 == 0:  # what a PyTorch user should do
            a.record_stream(s2)
            extra.record_stream(s2)
            recorded += 1
        del a, extra  # dropped while s2 may still read them
    torch.cuda.synchronize()
    out = [float(v) for v in results.tolist()]
    out.append(float(t["c_state"].sum().item()))
    info = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0),
            "record_stream_steps": recorded}
    return out, info


def main():
    ap = cudalloc_stats.expect_parser(__doc__)
    ap.add_argument("out", help="JSON file to write the results to")
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()

    print("%s: PYTORCH_NO_CUDA_MEMORY_CACHING=%s CUBLAS_WORKSPACE_CONFIG=%s"
          % (NAME, os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"),
             os.environ.get("CUBLAS_WORKSPACE_CONFIG")), flush=True)
    t0 = time.monotonic()
    results, info = cudalloc_stats.run_guarded(
        NAME, lambda: pipeline(args.steps), "exception in the pipeline")
    stats = cudalloc_stats.get_stats(0)
    print("%s: %s, %d steps in %.2f s" % (NAME, json.dumps(info), args.steps,
                                         time.monotonic() - t0), flush=True)
    print("%s: first results %s, last %s" % (
        NAME, " ".join("%.8g" % v for v in results[:4]),
        "%.8g" % results[-1]), flush=True)
    print(cudalloc_stats.pooled_line(stats), flush=True)
    with open(args.out, "w") as f:
        json.dump({"results": results, "stats": stats, "info": info,
                   "no_caching": os.environ.get(
                       "PYTORCH_NO_CUDA_MEMORY_CACHING")}, f, indent=1)

    if len(results) != args.steps + 1:
        fail("%d results for %d steps" % (len(results), args.steps))
    if not all(math.isfinite(v) for v in results):
        fail("a result is not finite")
    cudalloc_stats.conclude(NAME, stats, args.expect, min_allocs=100)


if __name__ == "__main__":
    main()
