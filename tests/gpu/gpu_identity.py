"""A pooled block looks like its own allocation: what a program asks the
driver about its memory gets the answer it would get without the pool.

  ipc_check     tests/gpu/ipc_check.cu: CUDA IPC to a second process (blocks
                at and after a segment's start; the importer with and without
                the library; a block freed while an importer holds it is not
                handed out again; a stream-ordered pool's pointer), pointer
                queries on a 1000 B block, and cudaMemGetInfo's free memory,
                less the margin the driver needs (searched for without the
                library, then used with it), allocated in one piece
  driver_facts  driver_probe (tests/mockcuda) against the real driver: its
                output must be tests/mockcuda/driver_facts.txt, which the mock
                is diffed against in CI (the new output is kept as
                OUT/work/driver_facts/driver_facts.txt); preloaded, every
                answer must be the same, or the difference
                docs/COMPATIBILITY.md documents
                (tests/probe_compare.py, which CI runs on the mock), by
                default and under reuse_policy:immediate
  torch_ipc     torch.multiprocessing, PyTorch's caching allocator on and
                off: the run with the library ends as the run without it
  cupy_ipc      the same with CuPy's pool off and on
"""

import difflib
import os
import re
import subprocess
import sys

from gpu_general import run_check

import probe_compare  # tests/probe_compare.py, shared with the mock's test (PYTHONPATH)


def ipc_check(check):
    prog = check.program("ipc_check")
    plain = run_check(check, "ipc_check_plain", "static", "plain", "recorded", "ipc_check",
                      [prog, "plain", "0"])
    margin = plain.last(r"^ipc_check: free margin ([0-9]*) MiB", 1) if plain else ""
    run_check(check, "ipc_check_pool", "static", "pool", "recorded", "ipc_check",
              [prog, "any", margin or "4"])


def driver_facts(check):
    probe = check.program("driver_probe_driver")
    if not os.access(probe, os.X_OK):
        check.record("driver_facts", "driver", "no", "-", "-", "FAIL", "driver_probe not built")
        return
    facts_file = os.path.join(check.work, "driver_facts.txt")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CUDALLOC_CONF")}
    plain = subprocess.run([probe], capture_output=True, text=True, timeout=120, env=env)
    with open(facts_file, "w") as f:
        f.write(plain.stdout)
    with open(os.path.join(check.logs, "driver_probe.log"), "w") as f:
        f.write(plain.stderr)
    with open(check.path("tests/mockcuda/driver_facts.txt")) as f:
        recorded = f.read()
    if plain.stdout == recorded:
        check.record("driver_facts", "driver", "no", "-", "-", "PASS",
                     "the driver answers as tests/mockcuda/driver_facts.txt says")
    else:
        diff = difflib.unified_diff(recorded.splitlines(), plain.stdout.splitlines(),
                                    "tests/mockcuda/driver_facts.txt", "driver_facts.txt",
                                    lineterm="")
        check.record("driver_facts", "driver", "no", "-", "-", "FAIL",
                     "answers differ from tests/mockcuda/driver_facts.txt: the new ones are "
                     "in driver_facts.txt",
                     logs=[("the difference", "\n".join(diff)),
                           os.path.join(check.logs, "driver_probe.log")])
    with open(check.path("docs/COMPATIBILITY.md")) as f:
        table = probe_compare.documented(f.read())
    for row, conf in (("driver_probe_pool", "leak_report:0"),
                      ("driver_probe_pool_immediate", "leak_report:0,reuse_policy:immediate")):
        probe_pooled(check, row, probe, dict(env, LD_PRELOAD=check.lib, CUDALLOC_CONF=conf),
                     plain.stdout, table)


def probe_pooled(check, row, probe, env, plain, table):
    """The probe under the library (env): every answer the plain run's but
    the differences docs/COMPATIBILITY.md names (`table`). Under immediate
    reuse a freed block stays in the pool's live table, parked."""
    log = os.path.join(check.logs, row + ".log")
    pooled = subprocess.run([probe], capture_output=True, text=True, timeout=120, env=env)
    with open(log, "w") as f:
        f.write(pooled.stdout + pooled.stderr)
    failures, n, seen = probe_compare.compare(plain, pooled.stdout, table)
    with open(log, "a") as f:
        f.write("\n".join(["== judged"] + failures + ["documented: " + q for q in seen]) + "\n")
    pre = "yes, " + env["CUDALLOC_CONF"]
    if not failures:
        check.record(row, "driver", pre, "-", "-", "PASS",
                     "%d answers, every one the driver's but the %d differences "
                     "docs/COMPATIBILITY.md names" % (n, len(seen)))
    else:
        check.record(row, "driver", pre, "-", "-", "FAIL",
                     "%d answers differ from the run without the library, undocumented; "
                     "first: %s (logs/%s.log)" % (len(failures), failures[0], row),
                     logs=[log])


def verdict_of(run, tag):
    """The verdict line a run ended with, addresses blanked; "none" if none."""
    lines = run.grep(r"^%s: (PASS|UNSUPPORTED|FAIL)" % tag)
    return re.sub(r"0x[0-9a-f]+", "0x?", lines[-1]) if lines else "none"


def pair_run(check, row, runtime, tag, cmd, env=None):
    """cmd without and with the library: PASS when the run with it ends with
    the verdict of the run without it, and that is no FAIL."""
    if not os.path.exists(check.lib):
        check.record(row, runtime, "no vs yes", "-", "-", "FAIL", "not run: library not built")
        return
    plain, pooled = check.together(
        lambda: check.run(row + "_plain", cmd, conf=None, env=env, kill=5),
        lambda: check.run(row + "_pool", cmd, conf="", env=env, kill=5))
    a, b = verdict_of(plain, tag), verdict_of(pooled, tag)
    ok = a == b and a != "none" and ": FAIL" not in a
    strip = lambda v: v[len(tag) + 2:] if v.startswith(tag + ": ") else v  # noqa: E731
    check.record(row, runtime, "no vs yes", "-", "-", "PASS" if ok else "FAIL",
                 "%ds; without: %s; with: %s" % (plain.secs + pooled.secs, strip(a), strip(b)),
                 logs=[plain.log, pooled.log])


def torch_ipc(check):
    cmd = [sys.executable, "tests/gpu/torch_ipc.py"]
    check.together(
        lambda: pair_run(check, "torch_ipc_caching", "torch", "torch_ipc", cmd),
        lambda: pair_run(check, "torch_ipc_no_caching", "torch", "torch_ipc", cmd,
                         {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}))


def cupy_ipc(check):
    cmd = [sys.executable, "tests/gpu/cupy_ipc.py"]
    check.together(
        lambda: pair_run(check, "cupy_ipc_pool_off", "cupy", "cupy_ipc", cmd),
        lambda: pair_run(check, "cupy_ipc_pool_on", "cupy", "cupy_ipc", cmd + ["--pool"]))


CHECKS = {
    "ipc_check": (ipc_check, True),
    "driver_facts": (driver_facts, True),
    "torch_ipc": (torch_ipc, True),
    "cupy_ipc": (cupy_ipc, True),
}
