"""Stream-safe reuse on a GPU: each reuse_policy held to what it promises.

  hazard         tests/gpu/hazard.cu: a kernel on one stream still to write
                 a block when the host frees it, the new block used on
                 another stream. Without the library, by default, under safe
                 and device_sync no round sees the new block overwritten; under
                 device_sync no free returns before the kernel ended; under
                 immediate the overwritten rounds are the documented hazard
                 (INFO, with the count). Also with two blocking streams and
                 with a per-thread default stream (HAZARD_STREAMS)
  graph_replay   a graph captured with memory nodes, replayed 100 times with
                 allocations around it: correct without and under each policy
  oom_limit      memory_limit_mb:1024: 64 MiB blocks until
                 cudaErrorMemoryAllocation, cleared, freed, obtained again;
                 without the library it stops at --max 24
  torch_streams  PyTorch (no caching), tensors crossing two streams and
                 dropped while the other reads them: results without and with
                 the library agree to a relative 1e-6

Every preloaded run must show that the pool served the program's
allocations and that the library accepted CUDALLOC_CONF.
"""

import os
import re
import sys

from gpu_check import (exit_problem, match_rows, no_library_problems, pooled_numbers,
                       verdict_problem)


def reuse_run(check, row, runtime, conf, max_t, tag, cmd, env=None):
    """Runs `cmd` without the library (conf None) or under CUDALLOC_CONF=conf
    ("" the default) for at most max_t seconds; the run, its pooled counts
    and what it showed wrong. None (recorded as FAIL) when it cannot run."""
    skip = check.cannot_run(cmd, conf)
    if skip:
        record(check, row, runtime, conf, "-/-", "FAIL", "not run: " + skip)
        return None
    run = check.run(row, cmd, conf=conf, env=env, limit=max_t, kill=5)
    why = [w for w in (exit_problem(run), verdict_problem(run, tag)) if w]
    pooled, allocs, backend, _ = pooled_numbers(run)
    counts = "-/-" if allocs is None else "%d/%d" % (allocs, backend)
    if conf is None:
        why += no_library_problems(run, pooled)
    else:
        mine = run.last(r"^program: allocs=([0-9]*) ", 1)
        if allocs is None:
            why.append("no pool statistics: %s" % (pooled or "no pooled line"))
        elif mine and allocs < int(mine):
            why.append("the pool served %d allocations, the program made %s" % (allocs, mine))
        elif allocs == 0:
            why.append("the pool served no allocation")
        complaint = run.grep(r"^(cudalloc: )?CUDALLOC_CONF: ")
        if complaint:
            why.append("CUDALLOC_CONF=%s not accepted: %s" % (conf, complaint[0]))
    return run, counts, why


def record(check, row, runtime, conf, counts, result, note):
    pre = "no" if conf is None else "yes, " + (conf or "default")
    check.record(row, runtime, pre, "-", counts, result, note)


def verdict(check, row, runtime, conf, outcome, result, facts):
    """RESULT (PASS or INFO) when the run showed nothing wrong, else FAIL."""
    run, counts, why = outcome
    note = "%ds%s" % (run.secs, ", " + facts if facts else "")
    if why:
        record(check, row, runtime, conf, counts, "FAIL", note + "; " + "; ".join(why))
    else:
        record(check, row, runtime, conf, counts, result, note)


def hazard_one(check, row, conf, mode, env=None):
    """mode safe: nothing overwritten; sync: also no free returned while the
    kernel ran; report: INFO with the count."""
    outcome = reuse_run(check, row, "static", conf, 20, "hazard",
                        [check.program("hazard"), "report" if mode == "report" else "safe"], env)
    if outcome is None:
        return
    m = re.search(r"rounds=(\d+) overwritten=(\d+) reused=(\d+) pending=(\d+)",
                  outcome[0].last(r"^hazard: result "))
    if m:
        rounds, over, reused, pending = m.groups()
        if mode != "report" and int(over) > 0:
            outcome[2].append("%s of %s rounds had the new block overwritten" % (over, rounds))
        if mode == "sync" and int(pending) > 0:
            outcome[2].append("%s frees returned while the kernel still ran: no device wait"
                              % pending)
    else:
        rounds = over = reused = pending = "?"
        outcome[2].append("no 'hazard: result' line")
    verdict(check, row, "static", conf, outcome, "INFO" if mode == "report" else "PASS",
            "overwritten %s/%s rounds, address reused %s, kernel still running after the free %s"
            % (over, rounds, reused, pending))


def hazard(check):
    # Streams ordered only through the legacy stream (two blocking streams),
    # and a per-thread default stream: what the fence's one event on the
    # legacy stream must order.
    blocking = {"HAZARD_STREAMS": "blocking"}
    check.each(hazard_one, (
        ("hazard_plain", None, "safe"),
        ("hazard_default", "", "safe"),
        ("hazard_safe", "reuse_policy:safe", "safe"),
        ("hazard_device_sync", "reuse_policy:device_sync", "sync"),
        ("hazard_immediate", "reuse_policy:immediate", "report"),
        ("hazard_safe_blocking", "reuse_policy:safe", "safe", blocking),
        ("hazard_immediate_blocking", "reuse_policy:immediate", "report", blocking),
        ("hazard_safe_perthread", "reuse_policy:safe", "safe", {"HAZARD_STREAMS": "perthread"}),
        ("hazard_expandable", "expandable_segments:1", "safe")))


def graph_replay_one(check, row, conf):
    outcome = reuse_run(check, row, "static", conf, 20, "graph_replay",
                        [check.program("graph_replay"), "100"])
    if outcome:
        facts = outcome[0].last(r"^graph_replay: ([0-9]* replays checked)", 1)
        verdict(check, row, "static", conf, outcome, "PASS", facts or "no replay count")


def graph_replay(check):
    check.each(graph_replay_one, (
        ("graph_replay_plain", None), ("graph_replay_default", ""),
        ("graph_replay_safe", "reuse_policy:safe"),
        ("graph_replay_immediate", "reuse_policy:immediate"),
        ("graph_replay_device_sync", "reuse_policy:device_sync"),
        ("graph_replay_expandable", "expandable_segments:1")))


def oom_limit_one(check, row, conf, args):
    outcome = reuse_run(check, row, "static", conf, 20, "oom_limit",
                        [check.program("oom_limit")] + args)
    if outcome:
        line = outcome[0].last(r"^oom_limit: result (.*)", 1)
        if not line:
            outcome[2].append("no 'oom_limit: result' line")
        verdict(check, row, "static", conf, outcome, "PASS", line)


def oom_limit(check):
    check.each(oom_limit_one, (
        ("oom_limit_plain", None, ["--max", "24"]),
        ("oom_limit_1024", "memory_limit_mb:1024", ["--limit-mb", "1024", "--max", "24"]),
        ("oom_limit_1024_expandable", "memory_limit_mb:1024,expandable_segments:1",
         ["--limit-mb", "1024", "--max", "24"])))


def torch_streams(check):
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    modes = (("plain", None), ("pool", ""), ("expandable", "expandable_segments:1"))
    files = {mode: os.path.join(check.work, "torch_streams_%s.json" % mode) for mode, _ in modes}

    def one(check, mode, conf):
        row = "torch_streams_" + mode
        outcome = reuse_run(check, row, "torch", conf, 60, "torch_streams",
                            [sys.executable, "tests/gpu/torch_streams.py", files[mode],
                             "--expect", "plain" if conf is None else "pooled"], env)
        if outcome:
            verdict(check, row, "torch", conf, outcome, "PASS", "")
            return outcome[0]
        return None

    runs = dict(zip([m for m, _ in modes], check.each(one, modes)))
    match_rows(check, "torch", "plain", (
        ("pool", "torch_streams_match", "no vs yes"),
        ("expandable", "torch_streams_match_expandable", "no vs expandable")),
        files, runs, "result", "results", 1e-6)


CHECKS = {
    "hazard": (hazard, True),
    "graph_replay": (graph_replay, True),
    "oom_limit": (oom_limit, True),
    "torch_streams": (torch_streams, True),
}
