"""torch_oom.py OUT [--slot]: a PyTorch program that runs out of memory
(gpu_leaks.py's oom_report rows), under memory_limit_mb:2048.

load_weights() keeps 4 tensors of 256 MiB, make_activations() 2 of 256 MiB;
then too_much() asks 1 GiB, which the limit refuses: PyTorch raises its
out-of-memory error, caught. With --slot, cudalloc.torch.use() first (the
allocator slot); without, the library is preloaded with PyTorch's caching off.
Writes OUT {"oom": the error's first line, "lines": {function: the line of
its allocating call}}.
"""
import json
import sys

MIB = 1 << 20
LINES = {}


def load_weights(torch):
    kept = []
    for _ in range(4):
        LINES["load_weights"] = sys._getframe().f_lineno + 1
        kept.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))
    return kept


def make_activations(torch):
    kept = []
    for _ in range(2):
        LINES["make_activations"] = sys._getframe().f_lineno + 1
        kept.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))
    return kept


def too_much(torch):
    return torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda")


def main(argv):
    if "--slot" in argv:
        import cudalloc
        cudalloc.torch.use()
    import torch
    weights = load_weights(torch)
    acts = make_activations(torch)
    print("torch_oom: lines %s" % json.dumps(LINES), flush=True)
    doc = {"lines": LINES}
    try:
        too_much(torch)
        doc["oom"] = None
    except (torch.OutOfMemoryError, RuntimeError) as e:
        doc["oom"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    del weights, acts
    with open(argv[1], "w") as f:
        json.dump(doc, f)
    print("torch_oom: %s" % ("refused" if doc["oom"] else "served"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
