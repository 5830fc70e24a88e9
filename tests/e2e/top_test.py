#!/usr/bin/env python3
"""top_test.py [CHECK...]: `cudalloc top`, checked by content.

Runs tests/e2e/e2e_reach (modes hold and grow: device blocks kept while the
program sleeps) under libcudalloc.so against the mock driver, and reads what
`cudalloc top` shows of them: once (--once), in a real terminal (tmux: the
live view refreshes, q quits), the file each process publishes (private,
gone at exit, none with publish_stats:0), the file of a killed process
removed by top, and the growing site. Skipped (exit 77) without tmux for the
terminal check.

Environment (tests/e2e/CMakeLists.txt): E2E_REACH_PROG, E2E_MOCK_DIR,
E2E_PRELOAD as for leak_report_test.py; CUDALLOC_COMMAND (scripts/cudalloc)
and CUDALLOC_TOP (the built cudalloc-top).
"""
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

from leak_report_test import CheckFailed, env_path, expect, main

PROG = env_path("E2E_REACH_PROG")
MOCK_DIR = env_path("E2E_MOCK_DIR")
PRELOAD = env_path("E2E_PRELOAD")
COMMAND = env_path("CUDALLOC_COMMAND")
TOP = env_path("CUDALLOC_TOP")
SHM = "/dev/shm"
ROW = re.compile(r"^ *(\d+) (\S+) +(\d+) +([0-9.]+ \S+) +([0-9.]+ \S+) +([0-9.]+ \S+) +"
                 r"([0-9.]+ \S+) +([0-9.]+)% +(\S+)  (.*)$")
MIB = 1 << 20
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


class Program:
    """One e2e_reach run in the background; its stdout is read when asked."""

    def __init__(self, *args, conf=""):
        env = dict(os.environ, LD_LIBRARY_PATH=MOCK_DIR, LD_PRELOAD=PRELOAD,
                   CUDALLOC_CONF=conf, MOCKCUDA_DEVICES="1",
                   ASAN_OPTIONS="detect_leaks=0")
        for key in ("E2E_REACH_PROG", "E2E_LEAKS_PROG", "CUDALLOC_TOP"):
            env.pop(key, None)
        self.args = args
        self.proc = subprocess.Popen([PROG, *args], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.path = os.path.join(SHM, "cudalloc.%d.%d" % (os.getuid(), self.pid))

    def wait_for_file(self, timeout=5):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(self.path):
                return True
            time.sleep(0.05)
        return False

    def finish(self):
        """Ends the program (SIGTERM: no exit handler runs, as for a killed
        program) and lets top remove the file it left."""
        if self.proc.poll() is None:
            self.proc.terminate()
        out, err = self.proc.communicate(timeout=30)
        if os.path.exists(self.path):
            top("--once")
        return out, err

    def describe(self):
        return f"  run: e2e_reach {' '.join(self.args)}  pid {self.pid}"


def top(*args):
    env = dict(os.environ, CUDALLOC_TOP=TOP)
    r = subprocess.run(["sh", COMMAND, "top", *args], env=env, capture_output=True,
                       text=True, timeout=30)
    return r


def rows(text):
    found = {}
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            found[int(m.group(1))] = m
    return found


def size_of(text):
    value, unit = text.split()
    return float(value) * UNITS[unit]


class Failed(CheckFailed):
    pass


def expect_row(row, prog, held, why_runs):
    expect(row is not None, f"no row for pid {prog.pid}", *why_runs)
    expect(row.group(2) == "e2e_reach" and row.group(3) == "0",
           f"row {row.group(0)!r}: want command e2e_reach on device 0", *why_runs)
    in_use, reserved, peak = size_of(row.group(4)), size_of(row.group(6)), size_of(row.group(7))
    expect(held * MIB <= in_use <= reserved <= peak,
           f"row {row.group(0)!r}: want {held} MiB <= in use <= reserved <= peak", *why_runs)


class TopRun:
    """What a `cudalloc top` run printed, for a failure's report."""

    def __init__(self, text):
        self.text = text

    def describe(self):
        return "\n".join(["  --- cudalloc top"] + ["  | " + l for l in self.text.splitlines()])


def check_once(tmp):
    """Two programs under the library: one row each, their memory in it."""
    a, b = Program("hold", "30", "20"), Program("hold", "70", "20")
    try:
        expect(a.wait_for_file() and b.wait_for_file(), "no published file", a, b)
        time.sleep(1.2)  # a refresh after both allocated
        r = top("--once")
        seen = rows(r.stdout)
        run = TopRun(r.stdout + r.stderr)
        expect(r.returncode == 0 and "cudalloc top - " in r.stdout,
               f"exit status {r.returncode}", run)
        expect_row(seen.get(a.pid), a, 30, [run])
        expect_row(seen.get(b.pid), b, 70, [run])
        return f"{seen[a.pid].group(4)} and {seen[b.pid].group(4)} in use"
    finally:
        a.finish()
        b.finish()


def check_tui(tmp):
    """In a terminal (tmux): the live view shows both programs, refreshes,
    and q quits it."""
    if shutil.which("tmux") is None:
        print("SKIP top tui: no tmux on this machine")
        sys.exit(77)
    sock = "cudalloc_top_%d" % os.getpid()
    tmux = ["tmux", "-L", sock]
    a, b = Program("hold", "30", "20"), Program("hold", "70", "20")
    try:
        expect(a.wait_for_file() and b.wait_for_file(), "no published file", a, b)
        cmd = "CUDALLOC_TOP=%s sh %s top" % (TOP, COMMAND)
        subprocess.run(tmux + ["new-session", "-d", "-x", "160", "-y", "30", cmd], check=True)
        screen, first = "", ""
        for _ in range(60):  # up to 6 s for two refreshes
            time.sleep(0.1)
            screen = subprocess.run(tmux + ["capture-pane", "-p"], capture_output=True,
                                    text=True).stdout
            clock = re.search(r"cudalloc top - \d+ process\(es\) - (\S+)", screen)
            if clock and not first:
                first = clock.group(1)
            if clock and first and clock.group(1) != first and len(rows(screen)) >= 2:
                break
        run = TopRun(screen)
        expect(first and "(q quits)" in screen, "no live view in the terminal", run)
        expect(clock and clock.group(1) != first, "the view did not refresh", run)
        seen = rows(screen)
        expect_row(seen.get(a.pid), a, 30, [run])
        expect_row(seen.get(b.pid), b, 70, [run])
        subprocess.run(tmux + ["send-keys", "q"], check=True)
        for _ in range(30):
            time.sleep(0.1)
            if subprocess.run(tmux + ["has-session"], capture_output=True).returncode != 0:
                break
        else:
            raise CheckFailed("q did not quit cudalloc top", [run])
        return f"refreshed ({first} -> {clock.group(1)}), 2 rows, q quits"
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
        a.finish()
        b.finish()


def check_stale(tmp):
    """A process killed with SIGKILL leaves its file; top removes it and
    shows no row for it."""
    p = Program("hold", "10", "20")
    expect(p.wait_for_file(), "no published file", p)
    p.proc.send_signal(signal.SIGKILL)
    p.proc.wait()
    expect(os.path.exists(p.path), "the killed process's file is already gone", p)
    r = top("--once")
    run = TopRun(r.stdout)
    expect(p.pid not in rows(r.stdout), "a row for the killed process", run)
    expect(not os.path.exists(p.path), "top left the killed process's file", run)
    return "file removed, no row"


def check_private(tmp):
    """The file is a regular file of this user, 0600; gone after exit."""
    p = Program("hold", "10", "1")
    expect(p.wait_for_file(), "no published file", p)
    st = os.lstat(p.path)
    mode = stat.S_IMODE(st.st_mode)
    expect(stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and mode == 0o600,
           f"{p.path}: mode {oct(mode)}, owner {st.st_uid}", p)
    p.proc.wait(timeout=30)
    p.finish()
    expect(not os.path.exists(p.path), "the file is left after the program exited", p)
    return f"{oct(mode)}, removed at exit"


def check_quick(tmp):
    """Programs that exit right after their first allocations (one through
    leak_exitcode's _exit) leave no file, though their watcher may be about
    to make it as exit begins."""
    left = []
    for i in range(10):
        p = Program("lost", conf="leak_exitcode:23" if i % 2 else "")
        p.proc.wait(timeout=30)
        p.finish()
        if os.path.exists(p.path):
            left.append(p.path)
    expect(not left, f"files left by exited programs: {left}")
    return "10 runs, no file left"


def check_off(tmp):
    """publish_stats:0: no file, the program runs as before."""
    p = Program("hold", "10", "2", conf="publish_stats:0")
    time.sleep(1.5)
    exists = os.path.exists(p.path)
    out, err = p.finish()
    expect(not exists, "a file was published under publish_stats:0", p)
    return "nothing published"


def check_growth(tmp):
    """growth_report:1: the site that kept growing is named in its row."""
    p = Program("grow", "20", conf="growth_report:1,backtrace_depth:8")
    try:
        expect(p.wait_for_file(), "no published file", p)
        deadline, row = time.time() + 8, None
        while time.time() < deadline:
            row = rows(top("--once").stdout).get(p.pid)
            if row and "grow_step" in row.group(10):
                break
            time.sleep(0.3)
        expect(row and re.match(r"^\+[0-9.]+ MiB grow_step$", row.group(10)),
               f"top growing site {row.group(10) if row else None!r}", p)
        return row.group(10)
    finally:
        p.finish()


CHECKS = {"once": check_once, "tui": check_tui, "stale": check_stale,
          "private": check_private, "quick": check_quick, "off": check_off,
          "growth": check_growth}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "top"))
