"""torch_slot: PyTorch with cudalloc in its allocator slot (cudalloc.torch.use()).

Why: through the slot PyTorch calls the library from any thread (autograd
runs the backward pass on a thread of its own, where no CUDA context is
current), uses the pointer unchecked, and loses what its pluggable interface
lacks (memory statistics, empty_cache, record_stream, graph pools). Each
mode checks one of these on the GPU and judges what the program observes:
gradients, losses, byte figures, tensor contents.

Modes (the last line is "torch_slot: PASS ..." or "torch_slot: FAIL: <why>"):
  backward            five backward passes (a sum, an MLP, a convolution,
                      a double backward, a backward from a Python thread)
                      with gradients equal to float64 ones on the CPU, and
                      the pool serving allocations on autograd's thread
  train MODEL OUT     MODEL (resnet50 or gpt2), 20 seeded, deterministic
                      training steps; the losses written to OUT (JSON);
                      --native runs under PyTorch's own allocator instead
  memory              torch.cuda's memory functions answer from the
                      library's figures as the program allocates and frees
  record_stream       a long read on a second stream racing the reuse of a
                      tensor dropped after record_stream(): the read sees
                      the tensor's own values in every round; with --bare
                      (no record_stream) it counts the rounds that read the
                      next tensor's values instead (the hazard it guards)
  graph               torch.cuda.graph under the slot: 10 replays give the
                      eager results, and tensors allocated between replays
                      (of the sizes the capture freed) keep their values
  history OUT         PyTorch's documented memory-snapshot recipe, as
                      written, through the slot: _record_memory_history,
                      a few training steps, _dump_snapshot(OUT), history
                      off; PyTorch's _memory_viz reads OUT (stats, trace,
                      segments), whose segments hold exactly the bytes
                      torch.cuda.memory_reserved() says and a cache beside
                      the live blocks, and whose trace has the steps'
                      allocations and frees; memory_snapshot() answers
  cupy_oom            CuPy under cudalloc.cupy.use(): a request past the
                      device raises CuPy's OutOfMemoryError, and CuPy keeps
                      working after it
  cupy_dead_stream    CuPy under cudalloc.cupy.use(): blocks freed on
                      streams CuPy then destroys (the library, loaded as a
                      plug-in, never sees it: the driver crashes on a
                      destroyed stream's handle) wait in the pool; requests
                      on the default stream that only their memory can
                      serve are served, with the right values, and the
                      process lives

Usage: torch_slot.py MODE [MODEL OUT.json | OUT.pickle] [--native] [--bare]
"""

import json
import os
import sys
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HERE = os.path.dirname(os.path.abspath(__file__))
import cudalloc  # noqa: E402

NAME = "torch_slot"
MiB = 1 << 20


def fail(why):
    print("%s: FAIL: %s" % (NAME, why), flush=True)
    sys.exit(1)


def plug(torch):
    if not torch.cuda.is_available():
        fail("torch.cuda.is_available() is False")
    cudalloc.torch.use()


def allocs():
    return cudalloc.stats(0)["allocs"]


def close(torch, got, ref, what, tol=1e-4):
    got = got.detach().double().cpu()
    err = float((got - ref).norm() / max(float(ref.norm()), 1e-30))
    if not err <= tol:
        fail("%s: relative error %.3g against float64 on the CPU" % (what, err))


def backward():
    import torch
    plug(torch)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    before = allocs()
    # 1. The case.
    x = torch.ones(4, device="cuda", requires_grad=True)
    x.sum().backward()
    if x.grad is None or x.grad.tolist() != [1.0] * 4:
        fail("ones(4).sum().backward(): grad %s" % x.grad)
    # 2. An MLP with a loss, against the same in float64 on the CPU.
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 10))
    ref = [p.detach().double().clone().requires_grad_(True) for p in mlp.parameters()]
    data, labels = torch.randn(32, 64), torch.randint(0, 10, (32,))
    mlp = mlp.cuda()
    torch.nn.functional.cross_entropy(mlp(data.cuda()), labels.cuda()).backward()
    h = torch.relu(data.double() @ ref[0].T + ref[1]) @ ref[2].T + ref[3]
    torch.nn.functional.cross_entropy(h, labels).backward()
    for p, r in zip(mlp.parameters(), ref):
        close(torch, p.grad, r.grad, "MLP gradient")
    # 3. A convolution.
    conv = torch.nn.Conv2d(3, 8, 3)
    cw = conv.weight.detach().double().clone().requires_grad_(True)
    img = torch.randn(2, 3, 16, 16)
    conv = conv.cuda()
    conv(img.cuda()).square().sum().backward()
    torch.nn.functional.conv2d(img.double(), cw, conv.bias.detach().double().cpu()
                               ).square().sum().backward()
    close(torch, conv.weight.grad, cw.grad, "convolution gradient")
    # 4. A double backward (create_graph).
    z = torch.randn(256, device="cuda", requires_grad=True)
    (g,) = torch.autograd.grad((z ** 3).sum(), z, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), z)
    close(torch, gg, 6 * z.detach().double().cpu(), "double backward")
    # 5. A backward started from a Python thread of its own.
    out = {}

    def run():
        w = torch.randn(512, 512, device="cuda", requires_grad=True)
        (w @ w).sum().backward()
        out["grad"] = w.grad
        out["w"] = w.detach()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "grad" not in out:
        fail("the backward on a Python thread raised")
    wd = out["w"].double().cpu()
    ones = torch.ones(512, 512, dtype=torch.float64)
    close(torch, out["grad"], ones @ wd.T + wd.T @ ones, "backward from a thread")
    torch.cuda.synchronize()
    served = allocs() - before
    if served <= 0:
        fail("the pool served no allocation")
    print("%s: PASS backward: 5 cases, gradients within 1e-4 of float64, "
          "%d allocations served" % (NAME, served), flush=True)


def build(torch, model):
    if model == "resnet50":
        import torchvision
        net = torchvision.models.resnet50(weights=None).cuda()
        x = torch.randn(32, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (32,), device="cuda")
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        return lambda: torch.nn.functional.cross_entropy(net(x), y), opt
    from transformers import GPT2Config, GPT2LMHeadModel
    net = GPT2LMHeadModel(GPT2Config()).cuda()
    ids = torch.randint(0, 50257, (4, 256), device="cuda")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    return lambda: net(input_ids=ids, labels=ids).loss, opt


def train(model, out_file, native):
    import torch
    if not native:
        plug(torch)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
    loss_of, opt = build(torch, model)
    losses, t0 = [], time.perf_counter()
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    if not all(l == l and abs(l) < 1e30 for l in losses):
        fail("a loss is not finite: %s" % losses)
    with open(out_file, "w") as f:
        json.dump({"losses": losses, "native": native}, f)
    print("%s: PASS train %s %s: 20 steps in %.1f s, losses %.6f .. %.6f" % (
        NAME, model, "native" if native else "slot", secs, losses[0], losses[-1]),
        flush=True)


def memory():
    import torch
    plug(torch)
    cuda = torch.cuda
    base = cuda.memory_allocated()
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    got = cuda.memory_allocated() - base
    lib = cudalloc.stats(0)["allocated_bytes"]["current"]
    if got < 64 * MiB or cuda.memory_allocated() != lib:
        fail("memory_allocated grew by %d for 64 MiB (library: %d in use, torch: %d)"
             % (got, lib, cuda.memory_allocated()))
    if cuda.memory_reserved() < cuda.memory_allocated():
        fail("memory_reserved %d below memory_allocated %d"
             % (cuda.memory_reserved(), cuda.memory_allocated()))
    if cuda.max_memory_allocated() < cuda.memory_allocated():
        fail("max_memory_allocated below memory_allocated")
    stats = cuda.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak",
                "num_alloc_retries", "num_ooms", "allocation.all.current"):
        if key not in stats:
            fail("memory_stats() lacks %s" % key)
    if stats["allocated_bytes.all.current"] != cuda.memory_allocated():
        fail("memory_stats and memory_allocated disagree")
    summary = cuda.memory_summary()
    if "Allocated memory" not in summary:
        fail("memory_summary() has no 'Allocated memory' row")
    del x
    if cuda.max_memory_allocated() < base + 64 * MiB:
        fail("the peak forgot the 64 MiB block")
    cuda.reset_peak_memory_stats()
    if cuda.max_memory_allocated() != cuda.memory_allocated():
        fail("after reset_peak_memory_stats the peak is %d, in use %d"
             % (cuda.max_memory_allocated(), cuda.memory_allocated()))
    reserved = cuda.memory_reserved()
    cuda.empty_cache()
    if cuda.memory_reserved() > reserved - 64 * MiB:
        fail("empty_cache gave back %d of the 64 MiB freed"
             % (reserved - cuda.memory_reserved()))
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "memory_allocated") and \
            acc.memory_allocated() != cuda.memory_allocated():
        fail("torch.accelerator.memory_allocated disagrees")
    print("%s: PASS memory: memory_allocated +%d for 64 MiB, reserved %d -> %d by "
          "empty_cache, peak reset, memory_stats/summary answered"
          % (NAME, got, reserved, cuda.memory_reserved()), flush=True)


def history(out):
    import pickle
    import torch
    from torch.cuda import _memory_viz as viz
    plug(torch)
    # The recipe (pytorch.org/docs/stable/torch_cuda_memory.html), as written.
    torch.cuda.memory._record_memory_history(max_entries=100000)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(out)
    torch.cuda.memory._record_memory_history(enabled=None)
    reserved, allocated = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    with open(out, "rb") as f:
        snap = pickle.load(f)
    stats = viz.segsum(snap)
    entries = viz.trace(snap)
    viz.segments(snap, format_flamegraph=str)
    segs = snap["segments"]
    total = sum(s["total_size"] for s in segs)
    held = sum(s["allocated_size"] for s in segs)
    actions = {e["action"] for e in snap["device_traces"][0]}
    if "total_reserved" not in stats or " entries" not in entries:
        fail("_memory_viz did not read the snapshot: %r" % stats[:200])
    if total != reserved:
        fail("the snapshot's segments hold %d bytes, memory_reserved() says %d" % (total, reserved))
    if not held or held > allocated or held >= total:
        fail("live blocks %d of %d bytes reserved (memory_allocated %d): want a cache beside them"
             % (held, total, allocated))
    if not {"segment_alloc", "alloc", "free_completed"} <= actions:
        fail("the trace's actions %s" % sorted(actions))
    if sum(len(s["blocks"]) for s in torch.cuda.memory.memory_snapshot()) < len(segs):
        fail("memory_snapshot() answered no blocks")
    print("%s: PASS history: %d segments, %d bytes reserved (memory_reserved too), %d in live "
          "blocks, %d trace entries; _memory_viz stats, trace, segments read it"
          % (NAME, len(segs), total, held, len(snap["device_traces"][0])), flush=True)


def record_stream(bare):
    import torch
    plug(torch)
    n = 64 * MiB  # float32: 256 MiB a tensor
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    wrong = 0
    rounds = 8
    for _ in range(rounds):
        a = torch.full((n,), 1.0, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)  # about 50 ms of the side stream
            total = a.sum()
        if not bare:
            a.record_stream(side)
        del a
        b = torch.full((n,), 2.0, device="cuda")  # may reuse a's block
        main.wait_stream(side)
        if float(total) != float(n):
            wrong += 1
        del b, total
    torch.cuda.synchronize()
    if bare:
        print("%s: PASS record_stream --bare: %d of %d rounds read the next "
              "tensor's values (the hazard record_stream guards)" % (NAME, wrong, rounds))
    elif wrong:
        fail("%d of %d rounds read the next tensor's values after record_stream"
             % (wrong, rounds))
    else:
        print("%s: PASS record_stream: %d rounds, every read saw its tensor"
              % (NAME, rounds), flush=True)


def graph():
    import torch
    plug(torch)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256)).cuda()
    static_x = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            net(static_x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_y = net(static_x)
    worst = 0.0
    for i in range(10):
        static_x.copy_(torch.randn(64, 256, device="cuda"))
        junk = [torch.full((1 << k,), float(i), device="cuda") for k in range(10, 22)]
        g.replay()
        with torch.no_grad():
            want = net(static_x)
        worst = max(worst, float((static_y - want).abs().max()))
        if any(float(j[0]) != float(i) or float(j[-1]) != float(i) for j in junk):
            fail("replay %d overwrote a tensor allocated between replays" % i)
        del junk
    if worst > 1e-5:
        fail("a replay differs from eager by %.3g" % worst)
    print("%s: PASS graph: captured, 10 replays equal to eager (max diff %.3g), "
          "tensors allocated between replays intact" % (NAME, worst), flush=True)


def cupy_oom():
    import cupy
    cudalloc.cupy.use()
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    try:
        cupy.empty(1 << 42, dtype=cupy.uint8)  # 4 TiB
        fail("4 TiB was served")
    except cupy.cuda.memory.OutOfMemoryError:
        pass
    if float(a.sum()) != float((1 << 20) * ((1 << 20) - 1) / 2):
        fail("CuPy computed a wrong sum after the refused request")
    print("%s: PASS cupy_oom: OutOfMemoryError raised, CuPy works after it" % NAME,
          flush=True)


def cupy_dead_stream():
    import gc
    import cupy
    cudalloc.cupy.use()
    n = 16 << 20  # 64 MiB of float32
    for i in range(8):
        s = cupy.cuda.Stream(non_blocking=i % 2 == 0)
        with s:
            a = cupy.arange(n, dtype=cupy.float32)
            a += 1
        s.synchronize()
        del a
        del s  # CuPy destroys the stream; its block waits in the pool
        gc.collect()
    free, total = cupy.cuda.runtime.memGetInfo()
    # Enough 64 MiB blocks on the default stream that the pool must take
    # the dead streams' memory or grow past it.
    blocks = [cupy.full(n, float(k), dtype=cupy.float32) for k in range(24)]
    for k, b in enumerate(blocks):
        if float(b[n - 1]) != float(k) or float(b[0]) != float(k):
            fail("block %d holds %s, not %d" % (k, float(b[0]), k))
    print("%s: PASS cupy_dead_stream: 8 streams destroyed with their blocks "
          "cached, %d blocks served after on the default stream (%d MiB "
          "free of %d before)" % (NAME, len(blocks), free >> 20, total >> 20),
          flush=True)


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    mode = argv[1]
    if mode == "backward":
        backward()
    elif mode == "train" and len(argv) >= 4:
        train(argv[2], argv[3], "--native" in argv)
    elif mode == "memory":
        memory()
    elif mode == "history" and len(argv) >= 3:
        history(argv[2])
    elif mode == "record_stream":
        record_stream("--bare" in argv)
    elif mode == "graph":
        graph()
    elif mode == "cupy_oom":
        cupy_oom()
    elif mode == "cupy_dead_stream":
        cupy_dead_stream()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
