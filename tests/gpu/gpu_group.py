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

Judged by what the programs observe: their verdict lines, losses, PyTorch's
exception, the memory the first process's pool reserves, the total the
second is told (torch.cuda.mem_get_info), the library's line.
"""

import json
import math
import os
import sys

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
    if os.path.exists(out):
        os.unlink(out)
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
                         os.path.join(check.out, "group_plain.json")),
        lambda: run_solo(check, "shared_limit_solo", "",
                         os.path.join(check.out, "group_solo.json")))
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
    folder = os.path.join(check.out, "group_give_back")
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
    folder = os.path.join(check.out, "group_full")
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


CHECKS = {
    "shared_limit": (shared_limit, True),
}
