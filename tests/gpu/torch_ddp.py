"""torch_ddp.py OUT [--slot] [--wait] | nccl OUT: one rank of a job that
torchrun starts (gpu_group.py's torchrun rows).

  OUT [--slot] [--wait]
      DistributedDataParallel over gloo (CUDA tensors; NCCL refuses two ranks
      on one device), every rank on cuda:0: a small MLP, 10 SGD steps, each
      rank its own data; writes OUT/rank<R>.json {"pid", "losses"}. --slot:
      cudalloc.torch.use() first (the allocator slot, nothing preloaded).
      --wait: after training, writes OUT/ready.<R> and waits up to 60 s for
      OUT/go, so that cudalloc top can look at the job meanwhile.
  nccl OUT
      one rank over NCCL: all_reduce and all_gather of CUDA tensors, their
      results checked; writes OUT/nccl.json {"pid", "ok", "sum", "gathered"}.

Prints "torch_ddp: rank R done" at the end.
"""
import json
import os
import sys
import time


def train(out, slot, wait):
    if slot:
        import cudalloc
        cudalloc.torch.use()
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(dev)
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(100 + rank)
    losses = []
    for _ in range(10):
        x = torch.randn(64, 256, generator=gen).to(dev)
        y = torch.randint(0, 10, (64,), generator=gen).to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump({"pid": os.getpid(), "losses": losses}, f)
    if wait:
        open(os.path.join(out, "ready.%d" % rank), "w").close()
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(out, "go")) and time.time() < deadline:
            time.sleep(0.1)
    dist.barrier()
    del ddp, model, opt
    dist.destroy_process_group()
    print("torch_ddp: rank %d done" % rank, flush=True)


def nccl(out):
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", 0)
    t = torch.arange(1 << 20, dtype=torch.float32, device=dev)
    dist.all_reduce(t)
    parts = [torch.empty(1 << 16, device=dev) for _ in range(world)]
    dist.all_gather(parts, torch.full((1 << 16,), float(rank + 1), device=dev))
    torch.cuda.synchronize()
    total = float(t.sum().item())
    want = float(world) * (1 << 20) * ((1 << 20) - 1) / 2
    gathered = [float(p[0].item()) for p in parts]
    ok = abs(total - want) <= 1e-6 * want and gathered == [float(i + 1) for i in range(world)]
    with open(os.path.join(out, "nccl.json"), "w") as f:
        json.dump({"pid": os.getpid(), "ok": ok, "sum": total, "gathered": gathered}, f)
    del t, parts
    dist.destroy_process_group()
    print("torch_ddp: rank %d done" % rank, flush=True)


def main(argv):
    if len(argv) > 2 and argv[1] == "nccl":
        nccl(argv[2])
    elif len(argv) > 1:
        train(argv[1], "--slot" in argv, "--wait" in argv)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
