"""shared_limit on a GPU: two PyTorch trainings under one cap.

  shared_limit   tests/gpu/torch_group.py, PyTorch's cache off: a training
                 alone without the library and under it (its losses, the
                 pool's reserved peak P); then two at once, in one group
                 whose cap is 1.6 P, smaller than their sum: the first goes
                 idle holding its cache, the second trains, which it can only
                 if the first gave that cache back when asked; both trainings'
                 losses equal the training alone. Beside it, a second pair in
                 a group of its own, the first keeping most of its memory in
                 use: the second's out of memory is PyTorch's
                 (OutOfMemoryError, or AcceleratorError "out of memory" where
                 it reaches PyTorch from a library call), and the library's
                 one line names the cap and the first process with what it
                 holds.

  torchrun       tests/gpu/torch_ddp.py under torchrun --nproc_per_node=2 on
                 the one GPU (gloo, CUDA tensors): DistributedDataParallel
                 trains without the library, then under `cudalloc run` with
                 one shared_limit for the job (torchrun_run), then with each
                 rank through the allocator slot under the same (torchrun_slot):
                 each rank's losses equal the job without the library; each
                 rank's leak report is a log file of its own (its pid in the
                 path), the launcher writes none; `cudalloc top` lists both
                 ranks in the group while they wait. torchrun_nccl: one rank
                 over NCCL (all_reduce, all_gather) under the library: results
                 right, nothing reported leaked.

Judged by what the programs observe: their verdict lines, losses, PyTorch's
exception, the memory the first process's pool reserves, the total the
second is told (torch.cuda.mem_get_info), the library's line; for torchrun,
the ranks' files, the log files and what cudalloc top prints.
"""

import glob
import json
import math
import os
import re
import subprocess
import sys
import time

from gpu_check import exit_problem, verdict_problem

TAG = "torch_group"
ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
       "PYTHONUNBUFFERED": "1"}
STEPS = 10
MIB = 1 << 20


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def problems(run):
    return [w for w in (exit_problem(run), verdict_problem(run, TAG)) if w]


def run_solo(check, row, conf, out):
    why = check.cannot_run([sys.executable], conf)
    if why:
        check.record(row, "torch", "-", "-", "-", "FAIL", "not run: " + why)
        return None
    run = check.run(row, [sys.executable, "tests/gpu/torch_group.py", "solo", out,
                          "--steps", str(STEPS)], conf=conf, env=ENV, limit=90)
    why = problems(run)
    doc = load(out)
    if doc is None:
        why.append("no %s" % os.path.basename(out))
    elif conf is not None and not doc.get("reserved_peak"):
        why.append("no pool statistics: the library was not loaded")
    peak = (doc or {}).get("reserved_peak")
    note = "%ds, %d steps%s" % (run.secs, 2 * STEPS,
                                ", pool reserved at most %.0f MiB" % (peak / MIB) if peak else "")
    check.record(row, "torch", "no" if conf is None else "yes", "-", "-",
                 "FAIL" if why else "PASS", note + ("; " + "; ".join(why) if why else ""))
    return None if why else doc


def same_losses(got, want):
    return len(got) == len(want) and all(
        math.isclose(a, b, rel_tol=1e-5, abs_tol=0.0) for a, b in zip(got, want))


def run_pair(check, row, conf, folder, hold_live):
    why = check.cannot_run([sys.executable], conf, need=40)
    if why:
        check.record(row, "torch", "-", "-", "-", "FAIL", "not run: " + why)
        return None, None, None, ["not run: " + why]
    cmd = [sys.executable, "tests/gpu/torch_group.py", "pair", folder, "--steps", str(STEPS)]
    run = check.run(row, cmd + (["--hold-live"] if hold_live else []), conf=conf, env=ENV,
                    limit=150)
    first = load(os.path.join(folder, "first.json"))
    second = load(os.path.join(folder, "second.json"))
    why = problems(run)
    if first is None or second is None:
        why.append("first.json or second.json missing")
    return run, first, second, why


def shared_limit(check):
    """The training alone without and under the library at once; then the
    two pairs at once, each in a group of its own."""
    plain, solo = check.together(
        lambda: run_solo(check, "shared_limit_plain", None,
                         os.path.join(check.work, "group_plain.json")),
        lambda: run_solo(check, "shared_limit_solo", "",
                         os.path.join(check.work, "group_solo.json")))
    if plain is None or solo is None:
        for row in ("shared_limit_give_back", "shared_limit_full"):
            check.record(row, "torch", "-", "-", "-", "FAIL", "not run: a training alone failed")
        return
    peak = solo["reserved_peak"]
    cap_mib = int(math.ceil(1.6 * peak / MIB))
    groups = ["gpucheck-%d-%s" % (os.getpid(), pair) for pair in ("give_back", "full")]
    confs = ["memory_limit_mb:%d,shared_limit:%s" % (cap_mib, group) for group in groups]
    try:
        check.together(
            lambda: give_back(check, confs[0], "yes, " + confs[0], plain, peak, cap_mib),
            lambda: full(check, confs[1], "yes, " + confs[1], plain, groups[1]))
    finally:
        for group in groups:
            path = "/dev/shm/cudalloc-groups.%d/%s" % (os.geteuid(), group)
            if os.path.exists(path):
                os.unlink(path)


def give_back(check, conf, pre, plain, peak, cap_mib):
    folder = os.path.join(check.work, "group_give_back")
    run, first, second, why = run_pair(check, "shared_limit_give_back", conf, folder, False)
    if run is None:
        return
    note = "%ds, cap %d MiB (1.6 x %.0f MiB, less than two trainings)" % (
        run.secs, cap_mib, peak / MIB)
    if first and second:
        if second.get("oom"):
            why.append("the second training ran out of memory: %s" % second["oom"])
        if not same_losses(second["losses"], plain["losses"][:STEPS]):
            why.append("the second training's losses differ from the training alone")
        if not same_losses(first["losses"], plain["losses"]):
            why.append("the first training's losses differ from the training alone")
        idle, after = first["reserved_idle"], first["reserved_after"]
        if after is None or idle is None or after > idle - peak // 2:
            why.append("the first process did not give back its cache (reserved %s, then %s)"
                       % (idle, after))
        else:
            note += "; the first gave back %.0f of %.0f MiB" % ((idle - after) / MIB, idle / MIB)
        total = second["mem_get_info"][1]
        if total != cap_mib * MIB:
            why.append("the second was told a total of %d bytes, not the cap" % total)
        else:
            note += "; the second was told total = the cap"
        note += "; both trainings' losses equal the training alone"
    check.record("shared_limit_give_back", "torch", pre, "-", "-",
                 "FAIL" if why else "PASS", note + ("; " + "; ".join(why) if why else ""))


def full(check, conf, pre, plain, group):
    folder = os.path.join(check.work, "group_full")
    run, first, second, why = run_pair(check, "shared_limit_full", conf, folder, True)
    if run is None:
        return
    note = "%ds" % run.secs
    pids = run.last(r"^torch_group: pair: first pid (\d+)", 1)
    lines = run.grep(r"^cudalloc: out of memory: .*shared_limit:%s" % group)
    if first and second:
        if not second.get("oom"):
            why.append("the second training was not refused past the cap: %s"
                       % (second.get("error") or "it trained"))
        else:
            note += "; the second got %s" % second["oom"]
        if not same_losses(first["losses"], plain["losses"]):
            why.append("the first training's losses differ from the training alone")
    if not lines:
        why.append("no line of the library naming the group")
    elif not pids or ("pid %s (python" % pids) not in lines[0]:
        why.append("the line names no first process (pid %s): %s" % (pids, lines[0]))
    else:
        note += "; %d line(s), the first: %s" % (len(lines), lines[0][len("cudalloc: "):])
    check.record("shared_limit_full", "torch", pre, "-", "-", "FAIL" if why else "PASS",
                 note + ("; " + "; ".join(why) if why else ""))


DDP = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def ddp_ranks(folder, n):
    docs = [load(os.path.join(folder, "rank%d.json" % r)) for r in range(n)]
    return None if None in docs else docs


def look_when_ready(check, folder, group):
    """Once both ranks wait, what cudalloc top prints of the job's group;
    then the ranks go on."""
    deadline = time.time() + 120
    while time.time() < deadline and not all(
            os.path.exists(os.path.join(folder, "ready.%d" % r)) for r in range(2)):
        time.sleep(0.2)
    try:
        r = subprocess.run(["sh", check.path("scripts/cudalloc"), "top", "--once"],
                           capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, CUDALLOC_TOP=os.path.join(
                               os.path.dirname(check.lib), "cudalloc-top")))
        text = r.stdout + r.stderr
    except (OSError, subprocess.SubprocessError) as e:
        text = "cudalloc top failed: %s" % e
    open(os.path.join(folder, "go"), "w").close()
    head = "shared_limit:%s - " % group
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith(head)), None)
    if start is None:
        return text, set()
    pids = set()
    for row in lines[start + 1:]:
        if row.startswith("shared_limit:"):
            break
        m = re.match(r"^ +(\d+) (\S+) ", row)
        if m and m.group(2) != "(ended)":
            pids.add(int(m.group(1)))
    return text, pids


def ddp_job(check, row, folder, slot, plain):
    """One two-rank job in a group of its own: the row's verdict."""
    os.makedirs(folder, exist_ok=True)
    group = "gpucheck-%d-%s" % (os.getpid(), row)
    items = "shared_limit:%s,memory_limit_mb:16384,log_path:%s/ddp.%%p.log" % (group, folder)
    cmd = DDP + ["--nproc_per_node=2", "tests/gpu/torch_ddp.py", folder, "--wait"]
    env = dict(ENV, CUDALLOC_LIBRARY=check.lib)
    if slot:
        cmd.append("--slot")
        env["CUDALLOC_CONF"] = items
    else:
        cmd = [check.path("scripts/cudalloc"), "run", "--conf", items, "--"] + cmd
    try:
        run, (text, listed) = check.together(
            lambda: check.run(row, cmd, env=env, limit=240),
            lambda: look_when_ready(check, folder, group))
    finally:
        path = "/dev/shm/cudalloc-groups.%d/%s" % (os.geteuid(), group)
        if os.path.exists(path):
            os.unlink(path)
    why = [w for w in (exit_problem(run),) if w]
    ranks = ddp_ranks(folder, 2)
    note = "%ds" % run.secs
    if ranks is None:
        why.append("a rank wrote no result")
    else:
        pids = {d["pid"] for d in ranks}
        for r, (got, want) in enumerate(zip(ranks, plain)):
            if not same_losses(got["losses"], want["losses"]):
                why.append("rank %d's losses differ from the job without the library" % r)
        logs = {int(re.search(r"ddp\.(\d+)\.log$", p).group(1))
                for p in glob.glob(os.path.join(folder, "ddp.*.log"))}
        if logs != pids:
            why.append("log files of pids %s, want the ranks' %s alone" % (sorted(logs), sorted(pids)))
        else:
            reports = [open(os.path.join(folder, "ddp.%d.log" % p)).read() for p in pids]
            if not all("device memory leak" in t or "no device memory leaks" in t for t in reports):
                why.append("a rank's log holds no leak report")
        if listed != pids:
            why.append("cudalloc top listed %s in the group, want the ranks %s"
                       % (sorted(listed), sorted(pids)))
        note += "; both ranks' losses equal the job without the library, a log each (pids %s), " \
                "both listed by cudalloc top" % sorted(pids)
    check.record(row, "torch", "slot" if slot else "yes, cudalloc run", "-", "-",
                 "FAIL" if why else "PASS", note + ("; " + "; ".join(why) if why else ""),
                 logs=None if not why else [run.log, ("cudalloc top", text)])


def ddp_plain(check):
    folder = os.path.join(check.work, "ddp_plain")
    os.makedirs(folder, exist_ok=True)
    run = check.run("torchrun_plain", DDP + ["--nproc_per_node=2", "tests/gpu/torch_ddp.py",
                                             folder], env=ENV, limit=240)
    why = [w for w in (exit_problem(run),) if w]
    ranks = ddp_ranks(folder, 2)
    if ranks is None:
        why.append("a rank wrote no result")
    check.record("torchrun_plain", "torch", "no", "-", "-", "FAIL" if why else "PASS",
                 "%ds, 2 ranks x 10 steps%s" % (run.secs, "; " + "; ".join(why) if why else ""))
    return None if why else ranks


def ddp_nccl(check):
    folder = os.path.join(check.work, "ddp_nccl")
    os.makedirs(folder, exist_ok=True)
    cmd = [check.path("scripts/cudalloc"), "run", "--conf",
           "log_path:%s/nccl.%%p.log" % folder, "--"] + DDP + [
               "--nproc_per_node=1", "tests/gpu/torch_ddp.py", "nccl", folder]
    run = check.run("torchrun_nccl", cmd, env=dict(ENV, CUDALLOC_LIBRARY=check.lib), limit=180)
    why = [w for w in (exit_problem(run),) if w]
    doc = load(os.path.join(folder, "nccl.json"))
    note = "%ds" % run.secs
    if doc is None or not doc.get("ok"):
        why.append("all_reduce/all_gather: %s" % doc)
    else:
        log = os.path.join(folder, "nccl.%d.log" % doc["pid"])
        text = open(log).read() if os.path.exists(log) else ""
        if "no device memory leaks" not in text:
            why.append("the rank's report is not 'no device memory leaks': %s"
                       % (text.strip().splitlines() or ["(no log)"])[-1])
        else:
            note += "; sum and gathered right; " + [
                l for l in text.splitlines() if "no device memory leaks" in l][0].split(
                    "cudalloc: ", 1)[-1]
    check.record("torchrun_nccl", "torch", "yes, cudalloc run", "-", "-",
                 "FAIL" if why else "PASS", note + ("; " + "; ".join(why) if why else ""))


def torchrun(check):
    """The job without the library first (the losses to equal), then the
    two jobs under it, and the NCCL rank, at once."""
    plain = ddp_plain(check)
    if plain is None:
        for row in ("torchrun_run", "torchrun_slot"):
            check.record(row, "torch", "-", "-", "-", "FAIL", "not run: the job without the "
                         "library failed")
        ddp_nccl(check)
        return
    check.together(
        lambda: ddp_job(check, "torchrun_run", os.path.join(check.work, "ddp_run"), False, plain),
        lambda: ddp_job(check, "torchrun_slot", os.path.join(check.work, "ddp_slot"), True, plain),
        lambda: ddp_nccl(check))


CHECKS = {
    "shared_limit": (shared_limit, True),
    "torchrun": (torchrun, True),
}
