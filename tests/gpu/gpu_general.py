"""The general GPU checks: each way in, each framework, served and correct.

  preload_true       a preloaded process that never touches CUDA: silent, exit 0
  alloc_fill_static  tests/gpu/alloc_fill.cu, static runtime: without the
                     library, preloaded (pooling required), preloaded with
                     enabled:0 (nothing pooled, still correct)
  alloc_fill_shared  the same with -cudart=shared (libcudart.so)
  driver_api         tests/gpu/driver_api.c, linked to libcuda: the same
  torch_cnn          PyTorch, its caching allocator off: without and
                     preloaded, losses compared to a relative 1e-5
  cupy               CuPy, its pool off: without and preloaded
  jax                JAX without preallocation: without, preloaded, and with
                     the platform allocator (pooling recorded, not required)
  sanitizer          alloc_fill under compute-sanitizer memcheck (INFO)
  programs_linkage   each program links the runtime it is meant to (no GPU)

Every preloaded run logs under verbose:2, so the row says which way the
allocations reached the library (the look-up that handed out the
cuMemAlloc_v2 hook, or "export" when the program bound the name at load).
"""

import os
import re
import subprocess
import sys

from gpu_check import (exit_problem, match_rows, no_library_problems, pooled_numbers,
                       verdict_problem)

MIN_ALLOCS = 100

# How each mode runs: (preloaded column, CUDALLOC_CONF or None, prefix, INFO only).
SANITIZER = ("compute-sanitizer", "--tool", "memcheck")
MODES = {
    "plain": ("no", None, (), False),
    "pool": ("yes", "verbose:2", (), False),
    "off": ("yes, enabled:0", "enabled:0,verbose:2", (), False),
    "expandable": ("yes, expandable_segments:1", "expandable_segments:1,verbose:2", (), False),
    "sanitizer-plain": ("no", None, SANITIZER, True),
    "sanitizer-pool": ("yes", "verbose:2", SANITIZER, True),
}


def path_of(run, allocs):
    """How allocations reached the library, from the verbose:2 log."""
    hook_re = r"^cudalloc: hooked cuMemAlloc_v2 via ([A-Za-z_]*)"
    ways = sorted({re.match(hook_re, l).group(1) for l in run.grep(hook_re)})
    if ways:
        return "+".join(ways)
    if allocs:
        return "export"
    any_re = r"^cudalloc: hooked .* via ([A-Za-z_]*)"
    others = sorted({re.match(any_re, l).group(1) for l in run.grep(any_re)})
    return "hooks via %s, no cuMemAlloc_v2" % "+".join(others) if others else "none seen"


def run_check(check, row, runtime, mode, pooling, tag, cmd, env=None):
    """One run of `cmd` in MODE, judged: its verdict line "TAG: PASS", the
    library absent (plain), idle (off) or serving (pool; with pooling
    "required", more than MIN_ALLOCS allocations at under 10% backend
    allocations)."""
    preloaded, conf, prefix, info = MODES[mode]
    fail_word = "INFO" if info else "FAIL"
    skip = check.cannot_run(cmd, conf)
    if skip:
        check.record(row, runtime, preloaded, "-", "-", fail_word, "not run: " + skip)
        return None
    run = check.run(row, cmd, conf=conf, env=env, prefix=prefix)
    pooled, allocs, backend, hits = pooled_numbers(run)
    why = [w for w in (exit_problem(run), verdict_problem(run, tag)) if w]
    if conf is None:
        why += no_library_problems(run, pooled)
    elif allocs is None:
        why.append("no pool statistics: %s" % (pooled or "no pooled line"))
    elif mode == "off" and allocs != 0:
        why.append("enabled:0 should pool nothing, saw: %s" % pooled)
    elif mode == "pool" and pooling == "required":
        if allocs <= MIN_ALLOCS:
            why.append("only %d allocations pooled" % allocs)
        if backend * 10 >= allocs:
            why.append("backend_allocs %d not below 10%% of %d" % (backend, allocs))
    note = ["%ds" % run.secs]
    if hits is not None:
        note.append("cache hits %d" % hits)
    others = [l for l in run.library_lines() if not l.startswith("cudalloc: hooked ")]
    if others:
        note.append("%d other library line(s) in the log" % len(others))
    if prefix:
        summary = run.last(r"ERROR SUMMARY: \d+ error").lstrip("= ")
        note.append("memcheck: %s" % (summary or "no ERROR SUMMARY line (tool incompatible?)"))
    text = ", ".join(note) + "".join("; " + w for w in why)
    path = path_of(run, allocs) if conf is not None else "-"
    counts = "%s/%s" % ("-" if allocs is None else allocs, "-" if backend is None else backend)
    check.record(row, runtime, preloaded, path, counts, fail_word if why else "PASS", text)
    return run


def preload_true(check):
    proc = subprocess.run(["/bin/true"], env=dict(os.environ, LD_PRELOAD=check.lib),
                          capture_output=True, text=True, timeout=30)
    out = (proc.stdout + proc.stderr)[:200]
    ok = proc.returncode == 0 and not out
    check.record("preload_true", "none", "yes", "-", "-", "PASS" if ok else "FAIL",
                 "/bin/true: silent, exit 0" if ok else
                 "/bin/true: exit %d, output: %s" % (proc.returncode, out))


def three_modes(name, runtime, tag):
    """A C program (verdict prefix TAG) run without the library, pooled, and
    with enabled:0."""
    def one(check, mode, expect, pooling):
        run_check(check, "%s_%s" % (name, mode), runtime, mode, pooling, tag,
                  [check.program(name), expect])

    return lambda check: check.each(one, (("plain", "plain", "recorded"),
                                          ("pool", "pooled", "required"),
                                          ("expandable", "pooled", "required"),
                                          ("off", "passthrough", "recorded")))


def torch_cnn(check):
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    modes = (("plain", "plain"), ("pool", "pooled"), ("expandable", "pooled"))
    files = {mode: os.path.join(check.work, "torch_%s.json" % mode) for mode, _ in modes}

    def one(check, mode, expect):
        return run_check(check, "torch_cnn_" + mode, "torch", mode,
                         "recorded" if mode == "plain" else "required", "torch_cnn",
                         [sys.executable, "tests/gpu/torch_cnn.py", files[mode], "--expect",
                          expect], env)

    runs = dict(zip([m for m, _ in modes], check.each(one, modes)))
    match_rows(check, "torch", "plain", (
        ("pool", "torch_cnn_losses_match", "no vs yes"),
        ("expandable", "torch_cnn_losses_match_expandable", "no vs expandable")),
        files, runs, "loss", "losses", 1e-5)


def cupy_one(check, mode, expect):
    run_check(check, "cupy_" + mode, "cupy", mode, "recorded" if mode == "plain" else "required",
              "cupy_check", [sys.executable, "tests/gpu/cupy_check.py", "--expect", expect])


def cupy(check):
    check.each(cupy_one, (("plain", "plain"), ("pool", "pooled"), ("expandable", "pooled")))


def jax(check):
    cmd = [sys.executable, "tests/gpu/jax_check.py", "--expect"]
    no_prealloc = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    check.together(
        lambda: run_check(check, "jax_plain", "jax", "plain", "recorded", "jax_check",
                          cmd + ["plain"], no_prealloc),
        lambda: run_check(check, "jax_pool", "jax", "pool", "recorded", "jax_check",
                          cmd + ["any"], no_prealloc),
        lambda: run_check(check, "jax_platform_pool", "jax (platform allocator)", "pool",
                          "recorded", "jax_check", cmd + ["any"],
                          dict(no_prealloc, XLA_PYTHON_CLIENT_ALLOCATOR="platform")))


def sanitizer(check):
    """300 iterations, sizes below 4 MiB: compute-sanitizer is slow."""
    if subprocess.run(["sh", "-c", "command -v compute-sanitizer"],
                      capture_output=True).returncode != 0:
        check.record("sanitizer_alloc_fill", "static", "-", "-", "-", "INFO",
                     "compute-sanitizer not found")
        return
    prog = check.program("alloc_fill_static")
    check.together(
        lambda: run_check(check, "sanitizer_alloc_fill_plain", "static", "sanitizer-plain",
                          "recorded", "alloc_fill", [prog, "plain", "300", "22"]),
        lambda: run_check(check, "sanitizer_alloc_fill_pool", "static", "sanitizer-pool",
                          "recorded", "alloc_fill", [prog, "any", "300", "22"]))


# compute-sanitizer with NVTX's memory API on: a pooled block is then a
# region of exactly its size (src/concerns/nvtx_regions.c).
NVTX_SANITIZER = ("compute-sanitizer", "--tool", "memcheck", "--nvtx", "yes",
                  "--leak-check", "full")
# What the tool must find in memerr's 1000-byte block, plainly and pooled.
NVTX_FINDS = (
    ("overflow", r"is 1 bytes after the nearest allocation at 0x[0-9a-f]+ of size 1,000 bytes"),
    ("freed", r"Invalid __global__ write of size 1 bytes"),
    ("leak", r"Leaked 1,000 bytes at 0x[0-9a-f]+"),
    ("clean", r"ERROR SUMMARY: 0 errors"),
)


def nvtx_run_problems(run, name, mode, want):
    why = [] if run.grep(want) else ["%s: no line matching '%s'" % (name, want)]
    if not run.grep(r"^memerr: %s " % mode):
        why.append("%s: memerr did not finish (exit %s)" % (name, run.rc))
    return why


def nvtx(check):
    """compute-sanitizer --nvtx yes finds in a pooled block what it finds in
    the driver's own: a write one byte past its end, a write after its free,
    a leak, and nothing in a clean run. Judged by the tool's own lines, the
    same pattern in both runs; the pooled run, started as the documents say
    (compute-sanitizer ... cudalloc run -- PROGRAM), must have served the
    block (its statistics) through the nvtx_regions layer (verbose:2 names
    it)."""
    tool = subprocess.run(["sh", "-c", "command -v compute-sanitizer"], capture_output=True)
    check.each(nvtx_one, [(mode, want, tool.returncode) for mode, want in NVTX_FINDS])


def nvtx_one(check, mode, want, no_tool):
    prog = check.program("memerr")
    row = "nvtx_" + mode
    skip = "compute-sanitizer not found" if no_tool else check.cannot_run([prog], "")
    if skip:
        check.record(row, "static", "no vs yes", "-", "-", "FAIL", "not run: " + skip)
        return
    plain, pooled = check.together(
        lambda: check.run(row + "_plain", [prog, mode], prefix=NVTX_SANITIZER),
        lambda: check.run(row + "_pool", [check.path("scripts/cudalloc"), "run", "--conf",
                                          "verbose:2,backtrace_depth:8", "--", prog, mode],
                          env={"CUDALLOC_LIBRARY": check.lib}, prefix=NVTX_SANITIZER))
    why = nvtx_run_problems(plain, "plain", mode, want)
    why += nvtx_run_problems(pooled, "pooled", mode, want)
    if not pooled.grep(r"^cudalloc: layers around the pool: .*nvtx_regions\+pool;"):
        why.append("pooled: no nvtx_regions layer named")
    allocs = pooled_numbers(pooled)[1]
    if not allocs:
        why.append("pooled: the library served nothing")
    found = "; ".join("%s: %s" % (name, (r.grep(want) or ["-"])[0].lstrip("= ").strip())
                      for name, r in (("plain", plain), ("pooled", pooled)))
    check.record(row, "static", "no vs yes", "-", "%s/-" % (allocs or "-"),
                 "FAIL" if why else "PASS",
                 "; ".join(why) if why else "%ds + %ds; %s" % (plain.secs, pooled.secs, found),
                 logs=[plain.log, pooled.log])


# memcheck:1 (src/concerns/memcheck.c): what it must say of each of
# memerr's runs, and whose frames: (mode, the finding's pattern or None for
# none, stacks naming main: allocated and freed, allocated only, none).
MEMCHECK_CONF = "memcheck:1,leak_report:0"
MEMCHECK_FINDS = (
    ("overflow", r"^cudalloc: memcheck: 1 byte written past the end of a block of 1000 bytes", 2),
    ("over511", r"^cudalloc: memcheck: 511 bytes written past the end of a block of 1000 bytes", 2),
    ("freed", r"^cudalloc: memcheck: write after free at offset 0 of a block of 1000 bytes", 2),
    ("leak", None, 0),
    ("unwritten", None, 0),
    ("clean", None, 0),
    ("stale", None, 0),
    ("batch", None, 0),
)
MEMCHECK_TOTALS = r"^cudalloc: memcheck: (\d+) blocks? checked: (\d+) written past the end, (\d+) written after the free$"
MEMCHECK_FINDING = r"^cudalloc: memcheck: (\d+ bytes? written past|write after free)"


def memcheck_problems(run, mode, want, mains):
    why = [] if run.grep(r"^memerr: %s cudaSuccess" % mode) else \
        ["memerr did not finish cleanly (exit %s)" % run.rc]
    found = run.grep(MEMCHECK_FINDING)
    if mode == "batch":
        return why + batch_problems(run, found)
    if want is None and found:
        why.append("a finding in a run without the error: %s" % found[0])
    if want is not None and (len(found) != 1 or not run.grep(want)):
        why.append("findings %s, want one matching '%s'" % (found or "none", want))
    if len(run.grep(r"^cudalloc:       #\d+ in main ")) < mains:
        why.append("the finding's stacks do not name main %d times" % mains)
    if not run.grep(MEMCHECK_TOTALS):
        why.append("no memcheck totals line at exit")
    if mode == "unwritten" and not run.grep(r"^memerr: read 0xffffffff$"):
        why.append("a block never written did not read 0xFF bytes: %s"
                   % (run.grep(r"^memerr: read") or ["no read"])[0])
    if mode == "stale":
        why += stale_problems(run)
    return why


def stale_problems(run):
    """memerr stale: freed blocks set to 0xFF at their head (the checked
    rows, one 2D fill) and not in their middle; every red zone carved over
    those middles 0xFF as handed out; every block checked (the slot's 104
    and the program's one byte)."""
    why = []
    if not run.grep(r"^memerr: stale zones 64/64 mid 0x44 head 0xff$"):
        why.append("the program saw %s, want zones 64/64 mid 0x44 head 0xff"
                   % (run.grep(r"^memerr: stale zones") or ["nothing"])[0])
    m = re.match(MEMCHECK_TOTALS, (run.grep(MEMCHECK_TOTALS) or [""])[0])
    if m and int(m.group(1)) != 105:
        why.append("%s blocks checked, want 105: the 104 the slot freed and the "
                   "byte the kernels read into" % m.group(1))
    return why


# memerr batch: the two errors among 64 blocks checked as one batch.
BATCH_FINDS = (r"^cudalloc: memcheck: 1 byte written past the end of a block of 1000 bytes",
               r"^cudalloc: memcheck: write after free at offset 0 of a block of 65536 bytes")


def batch_problems(run, found):
    """memerr batch: 64 blocks checked at exit as one batch, copied back by
    the library's gather kernel (the run is verbose:1, where the library
    says when the driver would not load it): the overflow and the write
    after free found, nothing else."""
    why = []
    if len(found) != 2 or not all(run.grep(p) for p in BATCH_FINDS):
        why.append("findings %s, want the overflow of a 1000-byte block and the write "
                   "after free of a 64 KiB one" % (found or "none"))
    m = re.match(MEMCHECK_TOTALS, (run.grep(MEMCHECK_TOTALS) or [""])[0])
    if not m or int(m.group(1)) < 64 or (m.group(2), m.group(3)) != ("1", "1"):
        why.append("totals %s, want 64 blocks checked or more, 1 and 1 found"
                   % (run.grep(MEMCHECK_TOTALS) or ["none"])[0])
    why += run.grep(r"^cudalloc: memcheck copies blocks back one by one")
    return why


def memcheck(check):
    """memcheck:1 finds in memerr's 1000-byte pooled block a write one byte
    past its end and one of 511 bytes (its red zone less one byte), a write
    after its free, each once, with main in the stacks of the allocation and
    the free; a block never written reads 0xFF bytes; nothing is found in the
    runs without an error. Through the slot, a freed block is set to 0xFF
    where it is checked and not between, and red zones over those bytes
    read 0xFF as handed out (memerr stale). 64 blocks checked as one batch,
    copied back by one launch of the library's kernel, give their two
    errors (memerr batch). Then 20 steps of GPT-2 small training through
    PyTorch's allocator slot under memcheck:1: no finding, finite losses."""
    check.together(lambda: check.each(memcheck_one, MEMCHECK_FINDS), lambda: memcheck_gpt2(check))


def memcheck_one(check, mode, want, mains):
    prog = check.program("memerr")
    row = "memcheck_" + mode
    skip = check.cannot_run([prog], MEMCHECK_CONF)
    if skip:
        check.record(row, "static", "yes", "-", "-", "FAIL", "not run: " + skip)
        return
    verbose = ",verbose:1" if mode == "batch" else ""
    run = check.run(row, [prog, mode], conf=MEMCHECK_CONF + ",backtrace_depth:16" + verbose)
    why = memcheck_problems(run, mode, want, mains)
    totals = (run.grep(MEMCHECK_TOTALS) or ["-"])[0][len("cudalloc: memcheck: "):]
    found = [line[len("cudalloc: "):] for line in run.grep(MEMCHECK_FINDING)]
    check.record(row, "static", "yes", "-", "-", "FAIL" if why else "PASS",
                 "; ".join(why) if why else
                 "%s; %s" % ((found or ["no finding"])[0], totals))


def memcheck_gpt2(check):
    row = "memcheck_gpt2"
    cmd = [sys.executable, check.path("tests/bench/gpt2_step.py"), "--slot", "--steps", "20",
           "--warmup", "0", "--batch", "2", "--seq", "128"]
    skip = check.cannot_run(cmd, None, need=60)
    if skip:
        check.record(row, "python", "slot", "-", "-", "FAIL", "not run: " + skip)
        return
    run = check.run(row, cmd, env={"CUDALLOC_CONF": MEMCHECK_CONF,
                                   "CUDALLOC_LIBRARY": check.lib})
    losses = run.grep(r"^gpt2_step: losses ")
    totals = run.grep(MEMCHECK_TOTALS)
    why = [p for p in [exit_problem(run)] if p]
    if not losses or "nan" in losses[0] or "inf" in losses[0]:
        why.append("losses %s" % (losses or "not printed"))
    m = re.match(MEMCHECK_TOTALS, totals[0]) if totals else None
    if m is None or int(m.group(1)) == 0:
        why.append("no block checked: %s" % (totals or "no totals line"))
    elif int(m.group(2)) or int(m.group(3)) or run.grep(MEMCHECK_FINDING):
        why.append("findings in a correct training: %s" % totals[0])
    step = (run.grep(r"^gpt2_step: [\d.]+ ms") or ["-"])[0]
    check.record(row, "python", "slot", "-", "-", "FAIL" if why else "PASS",
                 "; ".join(why) if why else "%s; %s; %s" % (
                     totals[0][len("cudalloc: memcheck: "):], losses[0][len("gpt2_step: "):],
                     step[len("gpt2_step: "):]))


def needs(path, prefix):
    """Whether the ELF file at `path` lists a DT_NEEDED library named prefix*."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return re.search(r"NEEDED.*\[%s" % re.escape(prefix), out) is not None


def programs_linkage(check):
    """Static-runtime programs must not link libcudart.so; the shared ones
    and the driver-API ones must link what they are meant to."""
    want = [(check.program(p), "libcudart.so", False) for p in
            ("alloc_fill_static", "hazard", "graph_replay", "oom_limit", "reset_leak",
             "ipc_check", "memerr")]
    want += [(check.program("alloc_fill_shared"), "libcudart.so", True),
             (check.program("driver_api"), "libcuda.so.1", True),
             (check.program("driver_probe_driver"), "libcuda.so.1", True),
             (os.path.join(check.examples, "leaky_loop"), "libcudart.so", False),
             (os.path.join(check.examples, "leaky_loop_shared"), "libcudart.so", True)]
    why = []
    for path, lib, linked in want:
        if not os.access(path, os.X_OK):
            why.append("%s not built" % os.path.basename(path))
        elif needs(path, lib) != linked:
            why.append("%s %s %s" % (os.path.basename(path),
                                     "does not link" if linked else "links", lib))
    check.record("programs_linkage", "-", "-", "-", "-", "FAIL" if why else "PASS",
                 "; ".join(why) if why else
                 "%d programs: static runtime, libcudart.so, libcuda.so.1 as meant" % len(want))


CHECKS = {
    "preload_true": (preload_true, True),
    "alloc_fill_static": (three_modes("alloc_fill_static", "static", "alloc_fill"), True),
    "alloc_fill_shared": (three_modes("alloc_fill_shared", "shared", "alloc_fill"), True),
    "driver_api": (three_modes("driver_api", "driver", "driver_api"), True),
    "torch_cnn": (torch_cnn, True),
    "cupy": (cupy, True),
    "jax": (jax, True),
    "sanitizer": (sanitizer, True),
    "nvtx": (nvtx, True),
    "memcheck": (memcheck, True),
    "programs_linkage": (programs_linkage, False),
}
