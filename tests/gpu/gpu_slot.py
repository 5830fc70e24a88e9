"""The allocator slots on a GPU: cudalloc in PyTorch's and CuPy's own slot,
nothing preloaded (tests/gpu/torch_slot.py says what each mode runs).

  slot_torch     backward passes on autograd's thread, gradients against
                 float64; PyTorch's memory functions; record_stream racing a
                 reuse (and the same race without it, INFO: the hazard it
                 guards); torch.cuda.graph capture and replay; PyTorch's
                 memory-snapshot recipe, as written, read by _memory_viz
  slot_training  ResNet-50 and GPT-2 small, 20 seeded deterministic steps
                 each under PyTorch's allocator and through the slot: the
                 losses must be equal
  slot_cupy      CuPy under cudalloc.cupy.use(): out of memory raises
                 CuPy's error; blocks of streams CuPy destroyed, unseen by
                 the library, wait in the pool and the default stream's
                 requests are served after (the driver crashes on a dead
                 stream's handle); one of CuPy's own test modules passes as it
                 passes under CuPy's pool (GPU_CHECK_CUPY_TESTS names CuPy's
                 tests folder, default ../shared/suites/frameworks/cupy_tests/tests)
  slot_wheel     the wheel `pip wheel` builds from this tree, installed with
                 pip install --no-deps into the machine's PyTorch
                 environment: the slot_torch rows again with no PYTHONPATH
                 and no CUDALLOC_LIBRARY, the package and the library both
                 the wheel's; uninstalled after

Each row's program must end with "torch_slot: PASS" (or pytest's summary)
and exit 0; the library is loaded only by the helper (CUDALLOC_LIBRARY).
"""

import os
import re
import sys

from gpu_check import exit_problem, match_rows

TAG = "torch_slot"
# What one of CuPy's test modules needs at least, on the H200 (about 40 s).
MODULE_SECS = 60


def slot_env(check, extra=None):
    env = {"CUDALLOC_LIBRARY": check.lib, "PYTHONUNBUFFERED": "1",
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    env.update(extra or {})
    return env


def slot_row(check, row, args, result="PASS", limit=120, env=None, quiet=True):
    """Runs torch_slot.py ARGS for `row`; records PASS (or `result`) when it
    ended with its PASS line (and, when `quiet`, the library said nothing
    of the slot's), else FAIL with why. Returns the run or None."""
    cmd = [sys.executable, "tests/gpu/torch_slot.py"] + args
    if not os.path.exists(check.lib) or check.time_left() < 15:
        check.record(row, "torch", "slot", "-", "-", "FAIL", "not run: library not "
                     "built" if not os.path.exists(check.lib) else "not run: time budget spent")
        return None
    run = check.run(row, cmd, env=slot_env(check, env), limit=limit)
    line = run.last(r"^%s: (PASS|FAIL)" % TAG)
    why = [w for w in (exit_problem(run),) if w]
    if not line.startswith("%s: PASS" % TAG):
        why.append(line or 'no "%s: PASS" line' % TAG)
    said = [l for l in run.library_lines() if "allocator slot" in l]
    if said and quiet:
        why.append("the library said: " + said[0])
    note = "%ds, %s" % (run.secs, line[len(TAG) + 2:] if line else "-")
    check.record(row, "torch", "slot", "-", "-", "FAIL" if why else result,
                 note + ("; " + "; ".join(why) if why else ""))
    return run


def slot_torch(check, prefix="slot", **how):
    check.together(
        lambda: slot_row(check, prefix + "_backward", ["backward"], **how),
        lambda: slot_row(check, prefix + "_memory", ["memory"], **how),
        lambda: slot_row(check, prefix + "_record_stream", ["record_stream"], **how),
        lambda: slot_row(check, prefix + "_record_stream_bare", ["record_stream", "--bare"],
                         result="INFO", **how),
        lambda: slot_row(check, prefix + "_graph", ["graph"], **how),
        lambda: slot_row(check, prefix + "_history",
                         ["history", os.path.join(check.work, prefix + "_history.pickle")],
                         **how))


def slot_wheel(check):
    """The slot_torch rows through the wheel: built by pip from this tree
    (the in-tree backend, CMake), installed with pip install --no-deps into
    the machine's PyTorch environment (this Python's), run with neither
    PYTHONPATH nor CUDALLOC_LIBRARY, so that the package and the library can
    only be the wheel's (wheel_install says where they were found); then
    uninstalled, leaving the environment as it was."""
    row = "wheel_install"
    wheels = os.path.join(check.work, "wheel")
    pip = [sys.executable, "-m", "pip"]
    where = "import cudalloc; print('wheel_install:', cudalloc.__file__, cudalloc.library_path())"
    bare = {"PYTHONPATH": "", "CUDALLOC_LIBRARY": ""}
    had = check.run(row + "_before", pip + ["show", "cudalloc"]).rc == 0
    steps = [("build", pip + ["wheel", "--no-deps", "--no-index", "-w", wheels, check.root], {}),
             ("pip", pip + ["install", "--no-deps", "--no-index", "--force-reinstall",
                            "--find-links", wheels, "cudalloc"], bare),
             ("where", [sys.executable, "-c", where], bare)]
    why, run = ["cudalloc was installed in the environment before"] if had else [], None
    for step, cmd, env in steps if not why else []:
        run = check.run("%s_%s" % (row, step), cmd, env=env, limit=300)
        if run.rc != 0:
            why.append("%s: %s" % (step, exit_problem(run) or "exit status %d" % run.rc))
            break
    found = run.last(r"^wheel_install: ")[len("wheel_install: "):] if not why else ""
    if not why and not all(p.startswith(sys.prefix) and "site-packages" in p
                           for p in found.split()):
        why.append("the package or the library is not the wheel's: " + found)
    check.record(row, "torch", "slot (wheel)", "-", "-", "FAIL" if why else "PASS",
                 "; ".join(why) or found)
    try:
        if not why:
            slot_torch(check, "wheel_slot", env=bare)
    finally:
        if not had:
            check.run(row + "_uninstall", pip + ["uninstall", "-y", "cudalloc"])


def slot_train(check, model):
    """One model's training under PyTorch's allocator and through the slot,
    at once, then their losses compared."""
    files = {mode: os.path.join(check.work, "slot_%s_%s.json" % (model, mode))
             for mode in ("native", "slot")}

    def one(mode):
        args = ["train", model, files[mode]] + (["--native"] if mode == "native" else [])
        return slot_row(check, "slot_train_%s_%s" % (model, mode), args, limit=180)

    runs = dict(zip(("native", "slot"),
                    check.together(lambda: one("native"), lambda: one("slot"))))
    match_rows(check, "torch", "native",
               (("slot", "slot_train_%s_match" % model, "native vs slot"),),
               files, runs, "losses", "losses", 0.0)


def slot_training(check):
    check.together(lambda: slot_train(check, "resnet50"), lambda: slot_train(check, "gpt2"))


def cupy_tests_dir(check):
    return os.environ.get("GPU_CHECK_CUPY_TESTS") or os.path.join(
        check.root, "..", "shared", "suites", "frameworks", "cupy_tests", "tests")


def slot_cupy(check):
    check.together(lambda: slot_row(check, "slot_cupy_oom", ["cupy_oom"], quiet=False),
                   lambda: slot_row(check, "slot_cupy_dead_stream", ["cupy_dead_stream"]),
                   lambda: slot_cupy_module(check))


def slot_cupy_module(check):
    """One of CuPy's own test modules, under CuPy's pool and through the
    slot, at once: the same count must pass."""
    tests = cupy_tests_dir(check)
    module = os.path.join(tests, "cupy_tests", "core_tests", "test_ndarray_copy_and_view.py")
    if not os.path.exists(module):
        check.record("slot_cupy_module", "cupy", "slot", "-", "-", "FAIL",
                     "not run: CuPy's tests not found at %s (GPU_CHECK_CUPY_TESTS)" % tests)
        return
    plugin_dir = os.path.join(check.root, "tests", "gpu")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "cupy_slot_plugin",
           "-p", "no:cacheprovider", module]
    # One cut at once by the deadline read "exit 124", like a hang.
    skip = check.cannot_run(cmd, None, need=MODULE_SECS)
    if skip:
        check.record("slot_cupy_module", "cupy", "slot", "-", "-", "FAIL", "not run: " + skip)
        return

    def one(mode):
        env = slot_env(check, {"PYTHONPATH": plugin_dir + os.pathsep + os.environ.get("PYTHONPATH", ""),
                               "CUPY_SLOT": "1" if mode == "slot" else "0"})
        return check.run("slot_cupy_module_" + mode, cmd, env=env, limit=240)

    runs = dict(zip(("pool", "slot"), check.together(lambda: one("pool"), lambda: one("slot"))))
    counts, how = {}, {}
    for mode, run in runs.items():
        m = re.search(r"(\d+) passed", run.last(r"\d+ passed"))
        counts[mode] = (int(m.group(1)) if m else 0, run.rc)
        how[mode] = exit_problem(run) if run.rc == 124 else "exit %d" % run.rc
    plugged = runs["slot"].has("cupy_slot_plugin: cudalloc.cupy.use() installed")
    ok = counts["slot"] == counts["pool"] and counts["slot"][0] > 0 and plugged
    check.record("slot_cupy_module", "cupy", "slot", "-", "-", "PASS" if ok else "FAIL",
                 "test_ndarray_copy_and_view.py: %d passed under CuPy's pool (%s), "
                 "%d through the slot (%s)%s" % (
                     counts["pool"][0], how["pool"], counts["slot"][0], how["slot"],
                     "" if plugged else "; the slot was not installed"),
                 logs=[runs["pool"].log, runs["slot"].log])


CHECKS = {
    "slot_torch": (slot_torch, True),
    "slot_training": (slot_training, True),
    "slot_cupy": (slot_cupy, True),
    "slot_wheel": (slot_wheel, True),
}
