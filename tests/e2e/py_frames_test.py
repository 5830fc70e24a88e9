#!/usr/bin/env python3
"""py_frames_test.py [CHECK...]: Python frames in the leak report, for every
CPython installed here.

Runs tests/e2e/py_alloc.py (allocations through ctypes, which releases the
GIL, from named functions) under each interpreter found: this one, and
python3.9 to python3.13 on PATH or under ~/.pyenv. For each supported
version (3.9-3.13) the report's group must list, innermost first, the
Python frames keep_step, train, main, <module> (a worker thread:
keep_step, train, run_worker, then threading's), each at the line its
"# LINE:" marker names, as text and in JSON; python_frames:0 keeps native
frames only. An interpreter of another version must get native frames
only, and run as well. With none of the supported versions found the
checks say so and are skipped (exit 77).
"""
import glob
import json
import os
import re
import subprocess
import sys

from leak_report_test import MOCK_DIR, PRELOAD, CheckFailed, expect, main

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "py_alloc.py")
SKIP = 77
PY_FRAME = re.compile(r"^cudalloc:     #\d+ in (\S+) (\S+):(\d+) \(Python\)$")


def interpreters():
    """{(major, minor): path} of the CPythons found here."""
    found = {}
    candidates = [sys.executable]
    for minor in range(6, 15):
        candidates += glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
        candidates += [p for p in (f"/usr/bin/python3.{minor}", f"/usr/local/bin/python3.{minor}")
                       if os.path.exists(p)]
    for path in candidates:
        try:
            out = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 2:
            found.setdefault((int(out[0]), int(out[1])), path)
    return found


def markers():
    with open(PROGRAM) as f:
        return {m.group(1): n for n, line in enumerate(f, 1)
                for m in [re.search(r"# LINE:(\w+)", line)] if m}


class PyRun:
    def __init__(self, what, proc):
        self.what, self.rc, self.out, self.err = what, proc.returncode, proc.stdout, proc.stderr

    def describe(self):
        return "\n".join([f"  run: {self.what}  exit status {self.rc}", "  --- stderr"] +
                         ["  | " + l for l in self.err.splitlines()[-50:]])


def run(python, mode, conf):
    """py_alloc.py keeps its blocks in a list: still reachable, listed."""
    conf += ",report_reachable:1"
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_")}
    env.update(LD_LIBRARY_PATH=MOCK_DIR, LD_PRELOAD=PRELOAD, CUDALLOC_CONF=conf,
               MOCKCUDA_DEVICES="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([python, PROGRAM, mode], env=env, capture_output=True, text=True,
                          timeout=120)
    r = PyRun(f"{python} py_alloc.py {mode}  CUDALLOC_CONF={conf}", proc)
    expect(r.rc == 0 and "allocations=8" in r.out, f"exit status {r.rc}, stdout {r.out!r}", r)
    return r


def python_frames(r):
    """(function, file, line) of the Python frames of the report's group."""
    return [(m.group(1), m.group(2), int(m.group(3)))
            for m in map(PY_FRAME.match, r.err.split("SUMMARY:")[0].splitlines()) if m]


def expect_frames(r, got, want, lines):
    """The first Python frames are `want`'s (function, marker) pairs, in
    py_alloc.py at the marked lines."""
    wanted = [(fn, PROGRAM, lines[mark]) for fn, mark in want]
    expect(got[:len(want)] == wanted, f"Python frames {got[:len(want) + 2]}, want {wanted}", r)


def supported():
    found = {v: p for v, p in interpreters().items() if v[0] == 3 and 9 <= v[1] <= 13}
    if not found:
        print("SKIP py_frames: no CPython 3.9 to 3.13 found here")
        sys.exit(SKIP)
    return found


def check_frames(tmp):
    """Each supported version: the four frames at their lines."""
    lines, done = markers(), []
    for (major, minor), python in sorted(supported().items()):
        r = run(python, "leak", "backtrace_depth:16")
        expect_frames(r, python_frames(r), [("keep_step", "keep_step"), ("train", "train"),
                                           ("main", "main"), ("<module>", "module")], lines)
        done.append(f"{major}.{minor}")
    return "keep_step, train, main, <module> at their lines under " + ", ".join(done)


def check_thread(tmp):
    """A worker thread's allocations: its own frames, then threading's."""
    lines, done = markers(), []
    for (major, minor), python in sorted(supported().items()):
        r = run(python, "thread", "backtrace_depth:16")
        got = python_frames(r)
        expect_frames(r, got, [("keep_step", "keep_step"), ("train", "train"),
                               ("run_worker", "run_worker")], lines)
        expect(any(path.endswith("threading.py") for _, path, _ in got[3:]),
               f"no frame of threading.py after run_worker: {got}", r)
        done.append(f"{major}.{minor}")
    return "the worker's frames, then threading.py's, under " + ", ".join(done)


def check_unicode(tmp):
    """A function name that is not ASCII comes out as UTF-8."""
    lines, done = markers(), []
    for (major, minor), python in sorted(supported().items()):
        r = run(python, "unicode", "backtrace_depth:16")
        expect_frames(r, python_frames(r), [("keep_step", "keep_step"), ("train", "train"),
                                           ("größe_step", "unicode")], lines)
        done.append(f"{major}.{minor}")
    return "größe_step named under " + ", ".join(done)


def check_json(tmp):
    """The JSON frames: {"python": true, "function", "file", "line"}."""
    lines = markers()
    (major, minor), python = max(supported().items())
    r = run(python, "leak", f"backtrace_depth:16,report_format:json,log_path:{tmp}/l.%p.json")
    docs = [json.loads(l) for f in glob.glob(f"{tmp}/l.*.json") for l in open(f) if l.strip()]
    frames = [f for d in docs for g in d.get("leaks", []) for f in g.get("frames", [])]
    py = [f for f in frames if f.get("python") is True]
    expect(py and py[0].get("function") == "keep_step" and py[0].get("file") == PROGRAM
           and py[0].get("line") == lines["keep_step"], f"Python frames in JSON: {py[:3]}", r)
    return f"{len(py)} Python frames in the exit document under {major}.{minor}"


def check_off(tmp):
    """python_frames:0: native frames only, in every version."""
    for version, python in sorted(supported().items()):
        r = run(python, "leak", "backtrace_depth:16,python_frames:0")
        expect(not python_frames(r), f"Python frames with python_frames:0: {python_frames(r)}", r)
    return "native frames only"


def check_unsupported(tmp):
    """An interpreter of another version runs as well, native frames only."""
    other = {v: p for v, p in interpreters().items() if not (v[0] == 3 and 9 <= v[1] <= 13)}
    if not other:
        return "no other CPython here to run"
    done = []
    for (major, minor), python in sorted(other.items()):
        if (major, minor) < (3, 6):
            continue
        r = run(python, "leak", "backtrace_depth:16")
        expect(not python_frames(r) and "still reachable in 8 allocation(s)" in r.err,
               f"under {major}.{minor}: Python frames {python_frames(r)} or no leak group", r)
        done.append(f"{major}.{minor}")
    return "native frames only under " + (", ".join(done) or "none")


CHECKS = {"frames": check_frames, "thread": check_thread, "unicode": check_unicode,
          "json": check_json,
          "off": check_off, "unsupported": check_unsupported}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "py_frames"))
