"""gpu_check: one GPU check, run and judged by content; a ctest test each.

Why: the preload tests in CI run against a mock driver; these prove on real
hardware that LD_PRELOAD=libcudalloc.so serves a program's device memory
from the pool whichever way the program reaches the driver, that results do
not change, that the leak report says what docs/LEAKS.md says, that reuse
is stream-safe and that a pooled block answers as its own allocation. A
check runs programs (tests/gpu, examples) without the library and under it
and reads what they print: the program's own verdict line ("TAG: PASS"),
its "pooled:" line, the hooks the library logs under verbose:2, the report.

Each check writes its rows (check, runtime, preloaded, interception path,
pooled allocs/backend allocs, result, notes) to OUT/results/CHECK.tsv, each
run's output to OUT/logs/<row>.log, what its programs write for it to judge
(results, logs, files to wait on) to OUT/work/CHECK/, emptied as the check
starts, so that a check run again into the same OUT never judges what its
last run left, and prints one line per row. RESULT:
PASS, FAIL (the exit status is 1), INFO (informative: compute-sanitizer,
hazard under immediate reuse) or SKIP: without a GPU a check writes one SKIP
row saying why and exits 77, which ctest reports as skipped
(programs_linkage needs no GPU).

A check's independent cases run at once (Check.together), at most --jobs
programs at a time: tests/gpu/CMakeLists.txt gives each check its jobs, and
ctest, run with -j, keeps the sum of the running checks' jobs within the
machine's cores. A FAIL row also leaves, in OUT/results/CHECK.fail.md, the
last lines of the logs of the runs it judged, for the summary.

Usage (tests/gpu/CMakeLists.txt gives the paths):
  gpu_check.py --root SRC --lib LIB --bin DIR --examples DIR --out DIR [--jobs N] CHECK
The environment may set GPU_CHECK_OUT (instead of --out) and
GPU_CHECK_DEADLINE (seconds since the epoch: no run starts past it, and each
ends by it; scripts/gpu-check.sh sets both).
"""

import argparse
import concurrent.futures
import ctypes
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

SKIP = 77
RUN_TIMEOUT = 120  # seconds, one program run at most
TAIL_LINES = 15  # of each log, under a failed row in the summary


def gpu_absent():
    """Why this process sees no GPU to check on, or None when it sees one."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return "libcuda.so.1 cannot be loaded (%s)" % e
    if hasattr(cuda, "mockcuda_owns"):
        return "libcuda.so.1 is the project's mock driver (LD_LIBRARY_PATH)"
    rc = cuda.cuInit(0)
    if rc != 0:
        return "cuInit failed with CUresult %d" % rc
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return "the driver reports no CUDA device"
    return None


class Run:
    """What one program run left: its log file, its output, its exit status
    (124 when it was stopped at its time limit) and how long it took."""

    def __init__(self, log, rc, secs, limit):
        self.log, self.rc, self.secs, self.limit = log, rc, secs, limit
        with open(log, errors="replace") as f:
            self.text = f.read()
        self.lines = self.text.splitlines()

    def has(self, line):
        return line in self.lines

    def grep(self, pattern):
        """The lines that match the regular expression `pattern` (re.search)."""
        rx = re.compile(pattern)
        return [l for l in self.lines if rx.search(l)]

    def last(self, pattern, group=None, default=""):
        """The last line that matches `pattern`, or its group `group`."""
        found = [m for m in map(re.compile(pattern).search, self.lines) if m]
        if not found:
            return default
        return found[-1].string if group is None else found[-1].group(group)

    def library_lines(self):
        return [l for l in self.lines if l.startswith("cudalloc: ")]


class Case:
    """What one case of a check has done and not yet handed on: its rows
    (row, log tail) and the logs of its runs since its last row. The
    top-level case (parent None) writes its rows at once."""

    def __init__(self, parent):
        self.parent, self.rows, self.logs = parent, [], []


def log_tails(row, note, logs):
    """Markdown for the summary: a failed row, its note, and the last
    TAIL_LINES lines of each of its logs (paths, or (title, text) pairs)."""
    out = ["### %s: FAIL" % row, "", note, ""]
    if not logs:
        out.append("(no log: the row ran no program)")
    for log in logs:
        if isinstance(log, tuple):
            title, text = log
        else:
            title = os.path.join("logs", os.path.basename(log))
            try:
                with open(log, errors="replace") as f:
                    text = f.read()
            except OSError as e:
                text = "(unreadable: %s)" % e
        lines = text.splitlines()[-TAIL_LINES:]
        out += ["%s, last %d lines:" % (title, len(lines)), "", "```"]
        out += [l if len(l) <= 240 else l[:237] + "..." for l in lines]
        out += ["```", ""]
    return "\n".join(out) + "\n"


class Check:
    """One check: its paths, its rows, its runs. Its independent cases may
    run at once (together), at most `jobs` programs at a time; the rows are
    written in the order the code gives them either way."""

    def __init__(self, name, args):
        self.name = name
        self.root, self.lib, self.bin = args.root, args.lib, args.bin
        self.examples = args.examples
        self.jobs = max(1, args.jobs)
        self.out = os.path.abspath(os.environ.get("GPU_CHECK_OUT") or args.out)
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(os.path.join(self.out, "results"), exist_ok=True)
        self.work = os.path.join(self.out, "work", name)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.results = os.path.join(self.out, "results", name + ".tsv")
        self.tails = os.path.join(self.out, "results", name + ".fail.md")
        for path in (self.results, self.tails):
            open(path, "w").close()
        deadline = os.environ.get("GPU_CHECK_DEADLINE", "")
        self.deadline = float(deadline) if deadline else None
        self.failed = 0
        self._lock = threading.Lock()
        self._thread = threading.local()  # .case: the Case this thread runs

    def program(self, name):
        return os.path.join(self.bin, name)

    def path(self, relative):
        return os.path.join(self.root, relative)

    def record(self, name, runtime, preloaded, path, pooled, result, note, logs=None):
        """One row. A FAIL row keeps the last lines of its logs for the
        summary: `logs`, or else the runs its case made since its last row."""
        note = " ".join(str(note).replace("\t", " ").split("\n")).strip()
        case = self._case()
        runs, case.logs = case.logs, []
        row = "\t".join([name, runtime, preloaded, path, pooled, result, note]) + "\n"
        tail = log_tails(name, note, runs if logs is None else logs) if result == "FAIL" else ""
        with self._lock:
            if result == "FAIL":
                self.failed += 1
            self._hand_on(case, [(row, tail)])
        print("[gpu-check] %s: %s%s" % (name, result, " (%s)" % note if note else ""),
              flush=True)

    def together(self, *cases):
        """Runs the cases (functions of no argument, each making its own runs
        and rows) at once, at most `jobs` at a time; when all have ended,
        returns what each returned, in the order of `cases`, as their rows
        follow. A case that raises leaves a FAIL row saying so, and None."""
        parent = self._case()
        mine = [Case(parent) for _ in cases]

        def one(i):
            self._thread.case = mine[i]
            try:
                return cases[i]()
            except Exception as e:  # noqa: BLE001 - a broken case is a failed row
                self.broken(e)
                return None
            finally:
                self._thread.case = None

        with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
            results = list(pool.map(one, range(len(cases))))
        with self._lock:
            self._hand_on(parent, [r for c in mine for r in c.rows])
        return results

    def each(self, fn, argsets):
        """together(): fn(check, *args) for each args of argsets."""
        return self.together(*[functools.partial(fn, self, *args) for args in argsets])

    def broken(self, e):
        """The FAIL row of a check or case that raised `e`: the logs of its
        runs since its last row, and its traceback."""
        trace = traceback.format_exc()
        print(trace, end="", flush=True)
        self.record(self.name, "-", "-", "-", "-", "FAIL", "the check itself failed: %r" % e,
                    logs=self._case().logs + [("traceback", trace)])

    def _case(self):
        case = getattr(self._thread, "case", None)
        if case is None:
            case = self._thread.case = Case(None)
        return case

    def _hand_on(self, case, rows):
        """Rows (row, log tail) of `case`: written now at the top level, else
        kept for its parent to hand on in order. Under self._lock."""
        if case.parent is not None:
            case.rows += rows
            return
        with open(self.results, "a") as f:
            f.writelines(row for row, _ in rows)
        with open(self.tails, "a") as f:
            f.writelines(tail for _, tail in rows)

    def time_left(self, most=RUN_TIMEOUT):
        """Seconds a run may still take: `most`, less near the deadline."""
        if self.deadline is None:
            return most
        return max(1, min(most, int(self.deadline - time.time() - 10)))

    def cannot_run(self, cmd, conf, need=15):
        """Why `cmd` cannot run (None when it can): no library where it is to
        be preloaded, a program not built, the deadline nearer than `need`
        seconds (what the run takes at least: one cut short proves nothing)."""
        if conf is not None and not os.path.exists(self.lib):
            return "library not built"
        exe = cmd[0]
        if os.sep in exe and not os.access(exe, os.X_OK):
            return "%s not built" % os.path.basename(exe)
        if self.time_left() < need:
            return "time budget spent"
        return None

    def run(self, row, cmd, conf=None, env=None, limit=None, kill=10, prefix=()):
        """Runs `cmd` (from the repository root) with the library preloaded
        under CUDALLOC_CONF=conf, or without it when conf is None; env adds
        variables; prefix goes before cmd (compute-sanitizer), and LD_PRELOAD
        reaches it too, as it passes it on. Output in logs/ROW.log."""
        e = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CUDALLOC_CONF")}
        e.update(env or {})
        if conf is not None:
            e.update(LD_PRELOAD=self.lib, CUDALLOC_CONF=conf)
        limit = self.time_left() if limit is None else min(limit, self.time_left())
        log = os.path.join(self.logs, row + ".log")
        setting = "(no library)" if conf is None else "LD_PRELOAD=%s CUDALLOC_CONF=%s" % (self.lib, conf)
        extra = " ".join("%s=%s" % kv for kv in (env or {}).items())
        print("[gpu-check] running %s (timeout %ds) -> %s" % (row, limit, log), flush=True)
        with open(log, "w") as f:
            f.write("# %s: %s %s %s\n" % (row, setting, extra, " ".join(list(prefix) + list(cmd))))
            f.flush()
            t0 = time.time()
            proc = subprocess.Popen(list(prefix) + list(cmd), stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=e, cwd=self.root,
                                    start_new_session=True)
            rc = wait_or_stop(proc, limit, kill)
        self._case().logs.append(log)
        return Run(log, rc, int(time.time() - t0), limit)


def wait_or_stop(proc, limit, kill):
    """proc's exit status; at `limit` seconds its process group gets SIGTERM,
    `kill` seconds later SIGKILL, and the status is 124 (as timeout(1))."""
    try:
        return proc.wait(limit)
    except subprocess.TimeoutExpired:
        pass
    for sig, grace in ((signal.SIGTERM, kill), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return 124


def exit_problem(run):
    """What a run's exit shows that no run may: a time-out or a non-zero status."""
    if run.rc == 124:
        return "timed out after %ds" % run.limit
    if run.rc != 0:
        return "exit status %d" % run.rc
    return None


def verdict_problem(run, tag):
    """No "TAG: PASS" line: the program's first "TAG: FAIL" line, or that."""
    if run.has("%s: PASS" % tag):
        return None
    fails = run.grep("^%s: FAIL" % re.escape(tag))
    return fails[0] if fails else 'no "%s: PASS" line' % tag


def no_library_problems(run, pooled):
    """What a run without the library may not show: a "pooled:" line other
    than "pooled: none", or any line of the library's."""
    why = []
    if not pooled.startswith("pooled: none"):
        why.append("expected no library, saw: %s" % (pooled or "no pooled line"))
    if run.library_lines():
        why.append("library output in a run without it")
    return why


POOLED_RE = r"^pooled: allocs=(\d+) backend_allocs=(\d+) cache_hits=(\d+)"


def pooled_numbers(run):
    """The last "pooled:" line, and its allocs, backend_allocs, cache_hits
    (None each when it shows none)."""
    line = run.last(r"^pooled: ")
    m = re.match(POOLED_RE, line)
    return (line,) + (tuple(int(g) for g in m.groups()) if m else (None, None, None))


def compare_numbers(label, a_file, b_file, key, rel_tol):
    """PASS/FAIL and a note: the number lists `key` of two JSON files
    (without, with the library) compared to a relative `rel_tol`."""
    import json
    import math
    try:
        a = json.load(open(a_file))[key]
        b = json.load(open(b_file))[key]
    except Exception as e:  # noqa: BLE001 - a missing or broken file is the finding
        return "FAIL", "cannot read both %s files: %s" % (label, e)
    if len(a) != len(b) or not a:
        return "FAIL", "%d %s without the library, %d with" % (len(a), key, len(b))
    worst = max(abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(a, b))
    bad = [i for i, (x, y) in enumerate(zip(a, b))
           if not math.isclose(x, y, rel_tol=rel_tol, abs_tol=0.0)]
    note = "%d %s, max relative difference %.3g, %s" % (
        len(a), key, worst, "bit-identical" if a == b else "not bit-identical")
    if bad:
        note += ", first differing step %d of %d differing" % (bad[0], len(bad))
    return ("FAIL" if bad else "PASS"), note


def match_rows(check, runtime, base, pairs, files, runs, label, key, rel_tol):
    """A row per (mode, row, preloaded) of `pairs`: the numbers `key` that
    the run `base` wrote (files[base]) against those of the run `mode`
    (compare_numbers); a failed row keeps both runs' logs (runs[...])."""
    for mode, row, preloaded in pairs:
        result, note = compare_numbers(label, files[base], files[mode], key, rel_tol)
        check.record(row, runtime, preloaded, "-", "-", result, note,
                     logs=[r.log for r in (runs[base], runs[mode]) if r])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for opt in ("--root", "--lib", "--bin", "--examples", "--out"):
        ap.add_argument(opt, required=True)
    ap.add_argument("--jobs", type=int, default=1,
                    help="programs the check may run at once (tests/gpu/CMakeLists.txt)")
    ap.add_argument("check")
    args = ap.parse_args()
    # Keep tests/gpu free of __pycache__, here and in the Python checks run.
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    import gpu_general
    import gpu_group
    import gpu_identity
    import gpu_leaks
    import gpu_reuse
    import gpu_slot
    checks = {}
    for part in (gpu_general, gpu_leaks, gpu_reuse, gpu_identity, gpu_slot, gpu_group):
        checks.update(part.CHECKS)
    if args.check not in checks:
        ap.error("unknown check %r (known: %s)" % (args.check, " ".join(checks)))
    fn, needs_gpu = checks[args.check]
    check = Check(args.check, args)
    why = gpu_absent() if needs_gpu else None
    if why:
        check.record(args.check, "-", "-", "-", "-", "SKIP", "no GPU here: " + why)
        return SKIP
    try:
        fn(check)
    except Exception as e:  # noqa: BLE001 - a broken check is a failed one, with its rows
        check.broken(e)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
