#!/usr/bin/env python3
"""leak_report_test.py [CHECK...]: cudalloc's leak report, checked by content.

Runs tests/e2e/e2e_leaks (a driver-API program linked to the mock driver)
with libcudalloc.so preloaded under various CUDALLOC_CONF settings and reads
what the library prints against docs/LEAKS.md: the groups, their frames
(function, file and line of the leaking call), the SUMMARY line, the JSON
document, suppressions, max_leaks, leak_exitcode, log_path, stats, fork,
context reset, SIGUSR1, and silence where nothing may be printed.

Environment (set by tests/e2e/CMakeLists.txt):
  E2E_LEAKS_PROG  the e2e_leaks program
  E2E_MOCK_DIR    the folder of the mock libcuda.so.1 (LD_LIBRARY_PATH)
  E2E_PRELOAD     the LD_PRELOAD value for the program (a sanitizer runtime
                  first in sanitized builds); applied to the program only

With no CHECK, runs them all. Each prints one PASS or FAIL line (on FAIL, with
the reason and the program's captured output); the exit status is 1 when any
failed. Python 3 standard library only.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PREFIX = "cudalloc: "
BIG, SMALL = 1 << 20, 4096
LEAKED_BYTES, LEAKED_COUNT = 2 * BIG + SMALL, 3


class CheckFailed(Exception):
    def __init__(self, reason, runs=()):
        super().__init__(reason)
        self.reason = reason
        self.runs = list(runs)


class Run:
    """One finished run of e2e_leaks: exit status, output, pid, key=values."""

    def __init__(self, mode, args, conf, rc, out, err, pid, files):
        self.mode, self.args, self.conf = mode, args, conf
        self.rc, self.out, self.err, self.pid = rc, out, err, pid
        self.files = files  # {path: text} of files the checker read
        self.kv = {}
        for line in out.splitlines():
            key, eq, value = line.partition("=")
            if eq:
                self.kv.setdefault(key, []).append(value)

    def one(self, key):
        values = self.kv.get(key, [])
        if len(values) != 1:
            raise CheckFailed(f"the program printed {key}= {len(values)} times, want once", [self])
        return values[0]

    def integer(self, key):
        return int(self.one(key))

    def describe(self):
        text = [f"  run: e2e_leaks {' '.join([self.mode] + list(self.args))}  "
                f"CUDALLOC_CONF='{self.conf}'  pid {self.pid}  exit status {self.rc}"]
        for name, body in [("stdout", self.out), ("stderr", self.err)] + sorted(self.files.items()):
            text.append(f"  --- {name} ({len(body)} bytes)")
            text.extend("  | " + line for line in body.splitlines()[-80:])
        return "\n".join(text)


def env_path(name):
    value = os.environ.get(name, "")
    if not value:
        raise SystemExit(f"FAIL leak_report: {name} is not set (run through ctest)")
    return value


PROG = env_path("E2E_LEAKS_PROG")
MOCK_DIR = env_path("E2E_MOCK_DIR")
PRELOAD = env_path("E2E_PRELOAD")


def run(mode, conf, *args, expect_rc=0, preloaded=True, stderr=subprocess.PIPE, timeout=60,
        prog=None, preload=None, env_add=None):
    """Runs e2e_leaks MODE ARGS (or `prog`) with cudalloc preloaded and
    CUDALLOC_CONF=conf; its stderr is read unless `stderr` says where it goes
    instead."""
    env = dict(os.environ)
    for key in ("E2E_LEAKS_PROG", "E2E_REACH_PROG", "E2E_NOREAD", "E2E_MOCK_DIR",
                "E2E_PRELOAD", "MOCKCUDA_VERBOSE"):
        env.pop(key, None)
    env["LD_LIBRARY_PATH"] = MOCK_DIR + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["LD_PRELOAD"] = preload or PRELOAD
    env["CUDALLOC_CONF"] = conf
    env["MOCKCUDA_DEVICES"] = "2"
    env.update(env_add or {})
    env["ASAN_OPTIONS"] = "detect_leaks=0" + (":" + env["ASAN_OPTIONS"] if env.get("ASAN_OPTIONS") else "")
    proc = subprocess.Popen([prog or PROG, mode, *args], env=env, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err = err or ""
        raise CheckFailed(f"the program ran for over {timeout} s (hung?)",
                          [Run(mode, args, conf, "timeout", out, err, proc.pid, {})])
    r = Run(mode, args, conf, proc.returncode, out, err or "", proc.pid, {})
    if r.rc != expect_rc:
        raise CheckFailed(f"exit status {r.rc}, want {expect_rc}", [r])
    if r.kv.get("preloaded") != ["1" if preloaded else "0"]:
        raise CheckFailed("cudalloc is not loaded in the program (is E2E_PRELOAD right?)", [r])
    return r


def expect(cond, reason, *runs):
    if not cond:
        raise CheckFailed(reason, runs)


def read_file(r, path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    r.files[path] = text
    return text


# ---- The text report --------------------------------------------------------

HEADER = re.compile(r"^==(\d+)== device memory leak report \((at exit|at context reset of device \d+)\)$")
GROUP = re.compile(r"^(\d+) bytes (?:leaked|still reachable) in (\d+) allocation\(s\)(?: of (\d+) bytes)? on device (\d+)"
                   r"(?: \((\w+)\))?(, allocated from)?:$")
FRAME = re.compile(r"^    #(\d+) 0x([0-9a-f]+) in (.*)$")
FRAME_LINE = re.compile(r"^(\S+) (\S+):(\d+) \((\S+)\+0x([0-9a-f]+)\)$")
SAMPLES = re.compile(r"^    allocations? (#\d+ at 0x[0-9a-f]+(?:, #\d+ at 0x[0-9a-f]+)*)(?:, \.\.\. \((\d+) more\))?$")
SUMMARY = re.compile(r"^SUMMARY: ")
HINT = "set CUDALLOC_CONF=backtrace_depth:16 to see where leaked memory was allocated"
UNCLASSED = re.compile(r"^(\d+) bytes in (\d+) of them could not be classed: the driver keeps "
                       r"their addresses too \(passed through to it, or at the start of one of its "
                       r"allocations\)$")


def lines_of(r, text, where="stderr"):
    """The library's lines of `text`, prefix removed; every line must have it."""
    lines = []
    for line in text.splitlines():
        expect(line.startswith(PREFIX) or line == PREFIX.rstrip(),
               f"{where} line without the '{PREFIX}' prefix: {line!r}", r)
        lines.append(line[len(PREFIX):].rstrip())
    return lines


# Memory over time, after a report's leaks: "peak: ..." and "growth: ..."
# sections, each after a blank line, of site lines and their frames.
OVER_TIME = re.compile(r"^(peak|growth): ")
OVER_TIME_LINE = re.compile(r"^(\S.* in \d+ allocation\(s\), allocated from:"
                            r"|\+.* over \d+ consecutive snapshots .*allocated from:"
                            r"|held on device \d+ .* peaked at .* into the run"
                            r"|    #\d+ .*|\.\.\. \d+ more growing site\(s\))$")


def split_over_time(lines):
    """The lines without their memory-over-time sections, and those sections'
    lines (each section's first line is its "peak:" or "growth:" line)."""
    rest, sections, inside = [], [], False
    for line in lines:
        if OVER_TIME.match(line):
            if rest and rest[-1] == "":
                rest.pop()
            sections.append([line])
            inside = True
        elif inside and OVER_TIME_LINE.match(line):
            sections[-1].append(line)
        else:
            inside = False
            rest.append(line)
    return rest, sections


def parse_reports(r, lines):
    """Splits library lines into leak reports. Returns (reports, the lines
    outside any report). A report: pid, when, groups, more, summary, hint,
    lines, and the memory-over-time sections printed with it (over_time). A
    report ends with its SUMMARY line, or the hint after it."""
    lines, over_time = split_over_time(lines)
    reports, other, cur = [], [], None
    for line in lines:
        m = HEADER.match(line)
        if m:
            cur = {"pid": int(m.group(1)), "when": m.group(2), "groups": [], "more": None,
                   "summary": None, "hint": None, "unclassed": None, "lines": [line]}
            reports.append(cur)
            continue
        if cur is None:
            other.append(line)
            continue
        if cur["summary"] is not None and UNCLASSED.match(line) and cur["unclassed"] is None:
            cur["unclassed"] = line  # right after the SUMMARY, before the hint
            cur["lines"].append(line)
            continue
        if cur["summary"] is not None:
            if line == HINT and cur["hint"] is None:
                cur["hint"] = line
                cur["lines"].append(line)
            else:
                other.append(line)
            cur = None  # the hint, if any, comes right after the SUMMARY
            continue
        cur["lines"].append(line)
        if line == "":
            continue
        g = GROUP.match(line)
        if g:
            cur["groups"].append({
                "bytes": int(g.group(1)), "count": int(g.group(2)),
                "size": int(g.group(3)) if g.group(3) else None, "device": int(g.group(4)),
                "call": g.group(5), "stacked": bool(g.group(6)), "frames": [], "samples": None,
                "reachable": " bytes still reachable in " in line, "line": line})
            continue
        f = FRAME.match(line)
        if f and cur["groups"]:
            cur["groups"][-1]["frames"].append((int(f.group(1)), f.group(2), f.group(3)))
            continue
        s = SAMPLES.match(line)
        if s and cur["groups"]:
            samples = re.findall(r"#(\d+) at (0x[0-9a-f]+)", s.group(1))
            cur["groups"][-1]["samples"] = [(int(n), int(a, 16)) for n, a in samples]
            cur["groups"][-1]["more_samples"] = int(s.group(2) or 0)
            continue
        if line.startswith("... ") and cur["more"] is None:
            cur["more"] = line
            continue
        if SUMMARY.match(line):
            cur["summary"] = line
            continue
        raise CheckFailed(f"unexpected line inside a leak report: {line!r}", [r])
    if reports:
        reports[-1]["over_time"] = over_time
    else:
        other += [line for section in over_time for line in section]
    for rep in reports:
        expect(rep["summary"] is not None, f"the report of pid {rep['pid']} has no SUMMARY line", r)
    return reports, other


def load_docs(r, path):
    """The JSON documents of a log file, one a line."""
    if not os.path.exists(path):
        raise CheckFailed(f"no file {path}", [r])
    docs = []
    text = read_file(r, path)
    for i, line in enumerate(text.splitlines()):
        try:
            docs.append(json.loads(line))
        except ValueError as e:
            raise CheckFailed(f"line {i + 1} of {path} is not one JSON document: {e}", [r])
    expect(text.endswith("\n"), f"{path} does not end with a newline", r)
    return docs


def parse_frame(r, frame):
    """(function, file, line, module) of a frame's text, for frames with a line."""
    m = FRAME_LINE.match(frame[2])
    expect(m, f"frame #{frame[0]} is not 'FUNCTION FILE:LINE (MODULE+0xOFF)': {frame[2]!r}", r)
    return m.group(1), m.group(2), int(m.group(3)), m.group(4)


def check_frames(r, group, function, line):
    """Frame #0 is `function` at e2e_leaks.c:line in e2e_leaks; frames are
    numbered from 0; main is among them; no frame of cudalloc or the driver."""
    frames = group["frames"]
    expect(frames, f"group '{group['line']}' lists no frames", r)
    expect([f[0] for f in frames] == list(range(len(frames))),
           f"frames are not numbered #0, #1, ...: {[f[0] for f in frames]}", r)
    expect(len(frames) <= 16, f"{len(frames)} frames shown with backtrace_depth:16", r)
    fn, path, ln, module = parse_frame(r, frames[0])
    expect(fn == function and path.endswith("e2e_leaks.c") and ln == line and module == "e2e_leaks",
           f"frame #0 is '{frames[0][2]}', want '{function} .../e2e_leaks.c:{line} (e2e_leaks+0x...)'", r)
    expect(any(re.match(r"^main .*e2e_leaks\.c:\d+ \(e2e_leaks\+0x", f[2]) for f in frames),
           f"no frame in main (e2e_leaks.c) under {function}", r)
    for f in frames:
        expect(not re.search(r"\((libcudalloc|libcuda\.)", f[2]),
               f"frame #{f[0]} of cudalloc or the driver is shown: '{f[2]}'", r)


def leaked_addresses(r):
    return [int(a, 16) for a in r.kv.get("leak", [])]


def one_report(r, lines, pid, when="at exit"):
    reports, other = parse_reports(r, lines)
    expect(len(reports) == 1, f"{len(reports)} leak reports printed, want 1", r)
    rep = reports[0]
    expect(rep["pid"] == pid, f"the report names pid {rep['pid']}, the process is {pid}", r)
    expect(rep["when"] == when, f"the report is '({rep['when']})', want '({when})'", r)
    return rep, other


def expect_summary(r, rep, text):
    expect(rep["summary"] == text, f"summary is '{rep['summary']}', want '{text}'", r)


# ---- The checks ---------------------------------------------------------------

def check_stacks(tmp, extra=""):
    """backtrace_depth:16: two groups by call site, largest first, frame #0
    at the leaking line; the freed managed block nowhere."""
    r = run("leaks", "backtrace_depth:16" + extra)
    big_line, small_line = r.integer("big_line"), r.integer("small_line")
    rep, other = one_report(r, lines_of(r, r.err), r.pid)
    expect(not other, f"lines outside the report: {other}", r)
    groups = rep["groups"]
    expect(len(groups) == 2, f"{len(groups)} leak groups, want 2", r)
    g0, g1 = groups
    expect(g0["line"] == "2097152 bytes leaked in 2 allocation(s) on device 0, allocated from:",
           f"first group is '{g0['line']}', want 2097152 bytes in 2 allocation(s) on device 0 with frames", r)
    check_frames(r, g0, "leak_big", big_line)
    expect(g1["line"] == "4096 bytes leaked in 1 allocation(s) on device 0, allocated from:",
           f"second group is '{g1['line']}', want 4096 bytes in 1 allocation(s) on device 0 with frames", r)
    check_frames(r, g1, "leak_small", small_line)
    expect_summary(r, rep, f"SUMMARY: {LEAKED_BYTES} bytes leaked in {LEAKED_COUNT} allocations")
    expect("cuMemAllocManaged" not in r.err, "the freed managed block is in the report", r)
    expect(rep["more"] is None and not rep["hint"], "a max_leaks line or the no-stacks hint with stacks on", r)
    return f"2 groups, frame #0 leak_big:{big_line} and leak_small:{small_line}, {rep['summary']}"


def check_expandable(tmp):
    """The same report when the 1 MiB blocks come from mapped pages
    (expandable_segments:1)."""
    return check_stacks(tmp, ",expandable_segments:1")


def check_json(tmp):
    """report_format:json into log_path leaks.%p.json: one exit document,
    agreeing with the text report."""
    r = run("leaks", f"backtrace_depth:16,report_format:json,log_path:{tmp}/leaks.%p.json")
    big_line, small_line = r.integer("big_line"), r.integer("small_line")
    expect(r.err == "", "the library wrote to stderr despite log_path", r)
    files = glob.glob(os.path.join(tmp, "leaks.*.json"))
    want = os.path.join(tmp, f"leaks.{r.pid}.json")
    expect(files == [want], f"log files {files}, want just {want}", r)
    docs = load_docs(r, want)
    expect(len(docs) == 1, f"{len(docs)} documents, want 1 (the exit report)", r)
    d = docs[0]
    expect(d.get("tool") == "cudalloc" and isinstance(d.get("version"), str)
           and re.match(r"^\d+\.\d+\.\d+$", d["version"]), f"tool/version are {d.get('tool')}/{d.get('version')}", r)
    expect(d.get("pid") == r.pid and d.get("event") == "exit",
           f"pid {d.get('pid')} event {d.get('event')}, want {r.pid} exit", r)
    expect("stats" not in d, "a stats member without stats:1", r)
    leaks = d.get("leaks")
    expect(isinstance(leaks, list) and len(leaks) == 2, f"leaks is {leaks!r:.200}, want 2 groups", r)
    addrs = set(leaked_addresses(r))
    for g, (nbytes, count, size, fn, line) in zip(
            leaks, [(2 * BIG, 2, BIG, "leak_big", big_line), (SMALL, 1, SMALL, "leak_small", small_line)]):
        expect(g.get("device") == 0 and g.get("call") == "cuMemAlloc" and g.get("bytes") == nbytes
               and g.get("count") == count and g.get("sizes") == {"min": size, "max": size}
               and g.get("suppressed") is False,
               f"group {json.dumps({k: v for k, v in g.items() if k != 'frames'})} "
               f"want device 0, cuMemAlloc, {nbytes} bytes in {count} of {size}, not suppressed", r)
        allocs = g.get("allocations", [])
        expect(len(allocs) == count and all(a.get("bytes") == size for a in allocs)
               and all(int(a.get("address", "0"), 16) in addrs for a in allocs)
               and all(isinstance(a.get("seq"), int) and a["seq"] > 0 for a in allocs),
               f"allocations {allocs} are not the program's leaked blocks {sorted(hex(a) for a in addrs)}", r)
        frames = g.get("frames", [])
        expect(frames, f"no frames in the {fn} group", r)
        f0 = frames[0]
        expect(f0.get("function") == fn and str(f0.get("file", "")).endswith("e2e_leaks.c")
               and f0.get("line") == line and str(f0.get("module", "")).endswith("/e2e_leaks")
               and re.match(r"^0x[0-9a-f]+$", f0.get("pc", "")) and re.match(r"^0x[0-9a-f]+$", f0.get("module_offset", "")),
               f"frame 0 is {f0}, want {fn} in .../e2e_leaks.c:{line}, module .../e2e_leaks", r)
        expect(any(f.get("function") == "main" for f in frames), f"no frame in main in the {fn} group", r)
    s = d.get("summary", {})
    expect(s.get("bytes") == LEAKED_BYTES and s.get("count") == LEAKED_COUNT
           and s.get("suppressed_bytes") == 0 and s.get("suppressed_count") == 0,
           f"summary {s}, want {LEAKED_BYTES} bytes in {LEAKED_COUNT}, none suppressed", r)
    return f"one exit document in leaks.{r.pid}.json, 2 groups, summary {s.get('bytes')}/{s.get('count')}"


def check_suppressions(tmp):
    """A leak:leak_small rule: that group is not printed and is counted apart."""
    supp = os.path.join(tmp, "supp.txt")
    with open(supp, "w") as f:
        f.write("# the small leak is known\nleak:leak_small\n")
    r = run("leaks", f"backtrace_depth:16,suppressions:{supp}")
    rep, other = one_report(r, lines_of(r, r.err), r.pid)
    expect(not other, f"lines outside the report: {other}", r)
    expect(len(rep["groups"]) == 1, f"{len(rep['groups'])} groups printed, want 1 (leak_big)", r)
    check_frames(r, rep["groups"][0], "leak_big", r.integer("big_line"))
    expect(rep["groups"][0]["bytes"] == 2 * BIG, f"the group printed is '{rep['groups'][0]['line']}'", r)
    expect("leak_small" not in r.err, "the suppressed leak_small is printed", r)
    expect_summary(r, rep, "SUMMARY: 2097152 bytes leaked in 2 allocations (4096 bytes in 1 allocations suppressed)")
    return rep["summary"]


def check_exitcode(tmp):
    """leak_exitcode:23: exit 23 with leaks (the program's output kept), 0 without."""
    r = run("leaks", "leak_exitcode:23", expect_rc=23)
    expect(r.kv.get("done") == ["leaks"], "the program's buffered stdout was lost at the forced exit", r)
    rep, _ = one_report(r, lines_of(r, r.err), r.pid)
    expect_summary(r, rep, f"SUMMARY: {LEAKED_BYTES} bytes leaked in {LEAKED_COUNT} allocations")
    c = run("clean", "leak_exitcode:23", expect_rc=0)
    lines = lines_of(c, c.err)
    n = c.integer("allocations")
    want = f"no device memory leaks ({n} allocations, all freed)"
    expect(lines == [want], f"stderr is {lines}, want just '{want}'", c)
    return f"leaks exit 23, clean exits 0 with '{want}'"


def check_log_path(tmp):
    """log_path run.%p.log: stderr silent, the report in the pid's file."""
    r = run("leaks", f"log_path:{tmp}/run.%p.log")
    expect(r.err == "", "the library wrote to stderr despite log_path", r)
    want = os.path.join(tmp, f"run.{r.pid}.log")
    files = sorted(glob.glob(os.path.join(tmp, "*")))
    expect(files == [want], f"files {files}, want just {want}", r)
    text = read_file(r, want)
    rep, other = one_report(r, lines_of(r, text, want), r.pid)
    expect(not other, f"lines outside the report: {other}", r)
    expect_summary(r, rep, f"SUMMARY: {LEAKED_BYTES} bytes leaked in {LEAKED_COUNT} allocations")
    return f"report in run.{r.pid}.log, nothing on stderr"


def check_off(tmp):
    """leak_report:0: the library prints nothing."""
    r = run("leaks", "leak_report:0")
    expect(r.err == "", "the library printed with leak_report:0", r)
    return "nothing printed"


def check_layers(tmp):
    """verbose:2 names the layers composed around the pool: each setting's
    concern (verbose's own out-of-memory line among them), and nothing for
    what is off."""
    want = {
        "verbose:2,leak_report:0":
            "cuMemAlloc and cuMemFree capture_rule+pool; stream-ordered pool",
        "verbose:2,leak_report:0,backtrace_depth:8,memory_limit_mb:512":
            "cuMemAlloc and cuMemFree capture_rule+site_bytes+limit_room+pool; "
            "stream-ordered site_bytes+limit_room+pool",
    }
    def layers_said(r):
        return [line[len(PREFIX):] for line in r.err.splitlines()
                if line.startswith(PREFIX + "layers around the pool: ")]

    for conf, layers in want.items():
        r = run("leaks", conf)
        said = layers_said(r)
        expect(said == ["layers around the pool: " + layers],
               f"with {conf}, the library said {said}, want the layers '{layers}'", r)
    # An NVTX tool named (here one NVTX cannot load, so its calls do
    # nothing): the regions layer joins both chains, and the leak report
    # is still the same.
    r = run("leaks", "verbose:2", env_add={"NVTX_INJECTION64_PATH": "/nonexistent/libtool.so"})
    layers = ("cuMemAlloc and cuMemFree capture_rule+nvtx_regions+pool; "
              "stream-ordered nvtx_regions+pool")
    said = layers_said(r)
    expect(said == ["layers around the pool: " + layers],
           f"with an NVTX tool named, the library said {said}, want '{layers}'", r)
    expect_summary(r, one_report(r, lines_of(r, r.err), r.pid)[0],
                   f"SUMMARY: {LEAKED_BYTES} bytes leaked in {LEAKED_COUNT} allocations")
    return "each setting's layer named, in order, once; an NVTX tool's too"


def check_no_stacks(tmp):
    """Default settings: groups by size, sample allocations, the hint."""
    r = run("leaks", "")
    rep, other = one_report(r, lines_of(r, r.err), r.pid)
    expect(not other, f"lines outside the report: {other}", r)
    leaked = leaked_addresses(r)
    expect(len(leaked) == 3, f"the program printed {len(leaked)} leaked addresses", r)
    groups = rep["groups"]
    expect(len(groups) == 2, f"{len(groups)} groups, want 2", r)
    for g, line, addrs in zip(groups, [
            "2097152 bytes leaked in 2 allocation(s) of 1048576 bytes on device 0:",
            "4096 bytes leaked in 1 allocation(s) of 4096 bytes on device 0:"], [leaked[:2], leaked[2:]]):
        expect(g["line"] == line, f"group '{g['line']}', want '{line}'", r)
        expect(not g["frames"], f"frames listed without stacks under '{line}'", r)
        samples = g["samples"]
        expect(samples is not None and sorted(a for _, a in samples) == sorted(addrs)
               and g.get("more_samples") == 0,
               f"allocations listed under '{line}' are {samples}, want the addresses "
               f"{[hex(a) for a in addrs]}", r)
        seqs = [n for n, _ in samples]
        expect(all(n > 0 for n in seqs) and seqs == sorted(set(seqs)),
               f"allocation numbers {seqs} are not increasing positive numbers", r)
    expect_summary(r, rep, f"SUMMARY: {LEAKED_BYTES} bytes leaked in {LEAKED_COUNT} allocations")
    expect(rep["hint"] == HINT and rep["lines"][-1] == HINT,
           f"the report does not end with '{HINT}'", r)
    return "2 groups by size, addresses listed, hint printed"


def check_max_leaks(tmp):
    """max_leaks:1: one group, the rest counted on one line, SUMMARY whole."""
    r = run("leaks", "max_leaks:1,backtrace_depth:16")
    rep, other = one_report(r, lines_of(r, r.err), r.pid)
    expect(not other, f"lines outside the report: {other}", r)
    expect(len(rep["groups"]) == 1, f"{len(rep['groups'])} groups printed, want 1", r)
    check_frames(r, rep["groups"][0], "leak_big", r.integer("big_line"))
    want = "... 1 more group(s) (4096 bytes in 1 allocations); max_leaks:0 shows all"
    expect(rep["more"] == want, f"the line after the groups is '{rep['more']}', want '{want}'", r)
    expect_summary(r, rep, f"SUMMARY: {LEAKED_BYTES} bytes leaked in {LEAKED_COUNT} allocations")
    return want


def check_stats(tmp):
    """stats:1: the device 0 summary before the report (text), and exact
    numbers in the JSON document."""
    r = run("leaks", "stats:1")
    lines = lines_of(r, r.err)
    expect("device 0 memory summary" in lines, "no 'device 0 memory summary' line", r)
    expect("device 1 memory summary" not in lines, "a summary of device 1, which has no pool", r)
    at = lines.index("device 0 memory summary")
    header = next((i for i, l in enumerate(lines) if HEADER.match(l)), None)
    expect(header is not None and at < header, "the memory summary is not before the leak report", r)
    requested = next((l for l in lines[at:header] if l.lstrip().startswith("requested")), "")
    expect(re.match(r"^\s+requested\s+2\.0 MiB\s", requested),
           f"requested row is '{requested}', want current 2.0 MiB (2101248 B live)", r)
    one_report(r, lines[header:], r.pid)
    j = run("leaks", f"stats:1,report_format:json,log_path:{tmp}/stats.%p.json")
    docs = load_docs(j, f"{tmp}/stats.{j.pid}.json")
    expect(len(docs) == 1 and docs[0].get("event") == "exit", f"{len(docs)} documents, want one exit document", j)
    stats = docs[0].get("stats")
    expect(isinstance(stats, list) and len(stats) == 1 and stats[0].get("device") == 0,
           f"stats is {stats!r:.300}, want one entry for device 0", j)
    req = stats[0].get("requested_bytes", {})
    expect(req.get("current") == LEAKED_BYTES and isinstance(req.get("peak"), int) and req["peak"] >= LEAKED_BYTES,
           f"requested_bytes {req}, want current {LEAKED_BYTES}", j)
    expect(docs[0].get("summary", {}).get("bytes") == LEAKED_BYTES, "the JSON summary with stats:1 is wrong", j)
    return "device 0 summary before the report; JSON requested current 2101248"


def check_fork(tmp):
    """A forked child reports its own leak under its own pid, each once."""
    r = run("fork", "")
    child = r.integer("child_pid")
    reports, other = parse_reports(r, lines_of(r, r.err))
    expect(not other, f"lines outside the reports: {other}", r)
    pids = [rep["pid"] for rep in reports]
    expect(pids == [child, r.pid], f"reports by pids {pids}, want the child's {child} then the parent's {r.pid}", r)
    for rep, size in zip(reports, [8192, BIG]):
        expect([g["line"] for g in rep["groups"]] == [f"{size} bytes leaked in 1 allocation(s) of {size} bytes on device 0:"],
               f"the report of pid {rep['pid']} has groups {[g['line'] for g in rep['groups']]}, want one of {size} bytes", r)
        expect_summary(r, rep, f"SUMMARY: {size} bytes leaked in 1 allocations")
    j = run("fork", f"report_format:json,log_path:{tmp}/fork.%p.json")
    child = j.integer("child_pid")
    files = sorted(glob.glob(os.path.join(tmp, "fork.*.json")))
    want = sorted(os.path.join(tmp, f"fork.{p}.json") for p in (child, j.pid))
    expect(files == want, f"files {files}, want {want}", j)
    for pid, size in [(child, 8192), (j.pid, BIG)]:
        docs = load_docs(j, os.path.join(tmp, f"fork.{pid}.json"))
        expect(len(docs) == 1 and docs[0].get("pid") == pid and docs[0].get("event") == "exit",
               f"fork.{pid}.json holds {[(d.get('pid'), d.get('event')) for d in docs]}, want one exit document of {pid}", j)
        s = docs[0].get("summary", {})
        expect(s.get("bytes") == size and s.get("count") == 1, f"pid {pid}: summary {s}, want {size} bytes in 1", j)
    return "child and parent each reported once, 8192 and 1048576 bytes"


def check_reset(tmp):
    """cuDevicePrimaryCtxReset: a report of the leak then, none at exit."""
    r = run("reset", "")
    reports, other = parse_reports(r, lines_of(r, r.err))
    expect(len(reports) == 1, f"{len(reports)} leak reports, want 1 (at the context reset)", r)
    rep = reports[0]
    expect(rep["pid"] == r.pid and rep["when"] == "at context reset of device 0",
           f"report '{rep['lines'][0]}', want '==({r.pid})== ... (at context reset of device 0)'", r)
    expect([g["line"] for g in rep["groups"]] == ["2097152 bytes leaked in 1 allocation(s) of 2097152 bytes on device 0:"],
           f"groups {[g['line'] for g in rep['groups']]}, want the 2 MiB block", r)
    expect_summary(r, rep, "SUMMARY: 2097152 bytes leaked in 1 allocations")
    exit_lines = [l for l in other if l]
    want = f"no device memory leaks ({r.integer('allocations')} allocations, all freed)"
    expect(exit_lines == [want], f"after the reset report: {exit_lines}, want just '{want}'", r)
    j = run("reset", f"report_format:json,log_path:{tmp}/reset.%p.json")
    docs = load_docs(j, f"{tmp}/reset.{j.pid}.json")
    expect([d.get("event") for d in docs] == ["context_reset", "exit"],
           f"events {[d.get('event') for d in docs]}, want context_reset then exit", j)
    d0, d1 = docs
    expect(d0.get("device") == 0 and [(g.get("bytes"), g.get("count")) for g in d0.get("leaks", [])] == [(2 * BIG, 1)],
           f"context_reset document {json.dumps(d0)[:300]}, want device 0 with the 2 MiB block", j)
    expect(d1.get("leaks") == [] and d1.get("summary", {}).get("bytes") == 0,
           f"exit document {json.dumps(d1)[:300]}, want no leaks", j)
    return f"'{rep['lines'][0]}' with the 2 MiB block, then '{exit_lines[0]}'"


def check_signal(tmp):
    """stats_signal:1: SIGUSR1 prints the summary (from the watcher thread)
    while the program runs."""
    log = f"{tmp}/sig.%p.log"
    r = run("signal", f"stats_signal:1,log_path:{log}", log)
    expect(r.err == "", "the library wrote to stderr despite log_path", r)
    expect(r.integer("waited_ms") < 2000, "no memory summary in the log 2 s after SIGUSR1", r)
    lines = lines_of(r, read_file(r, log.replace("%p", str(r.pid))), "log")
    expect(lines and lines[0] == "device 0 memory summary", f"the log does not start with the summary: {lines[:3]}", r)
    requested = next((l for l in lines if l.lstrip().startswith("requested")), "")
    expect(re.match(r"^\s+requested\s+1\.0 MiB\s", requested),
           f"requested row '{requested}', want current 1.0 MiB (the block live at the signal)", r)
    expect(not any(HEADER.match(l) for l in lines), "a leak report was printed, none is due", r)
    want = "no device memory leaks (1 allocations, all freed)"
    expect(lines[-1] == want, f"the last line is '{lines[-1]}', want '{want}'", r)
    # On stderr, and the program waits the full 2 s: the summary is there.
    e = run("signal", "stats_signal:1")
    el = lines_of(e, e.err)
    expect("device 0 memory summary" in el and el[-1] == want,
           f"stderr {el}, want the summary and then '{want}'", e)
    j = run("signal", f"stats_signal:1,report_format:json,log_path:{log}", log)
    docs = load_docs(j, log.replace("%p", str(j.pid)))
    expect(j.integer("waited_ms") < 2000, "no signal document in the log 2 s after SIGUSR1", j)
    expect([d.get("event") for d in docs] == ["signal", "exit"],
           f"events {[d.get('event') for d in docs]}, want signal then exit", j)
    expect("leaks" not in docs[0] and docs[0].get("stats", [{}])[0].get("requested_bytes", {}).get("current") == BIG,
           f"signal document {json.dumps(docs[0])[:300]}, want stats only, requested current {BIG}", j)
    return f"summary {r.integer('waited_ms')} ms after SIGUSR1, in text and JSON"


def check_none(tmp):
    """A process that never touches CUDA prints nothing and makes no file
    with valid settings; a bad setting is said in one line on stderr as the
    library loads, whatever the process does (a log_path beside it is not
    made either)."""
    for conf, bad in [("stats:1,backtrace_depth:16", False), ("report_format:xml", True),
                      (f"report_format:xml,leak_exitcode:23,log_path:{tmp}/none.%p.log", True)]:
        r = run("none", conf)
        said = "cudalloc: CUDALLOC_CONF: report_format:xml " in r.err
        expect(r.out == "preloaded=1\ndone=none\n" and
               (r.err.count("\n") == 1 and said if bad else r.err == ""),
               f"with CUDALLOC_CONF='{conf}': stderr {r.err!r}", r)
        expect(not os.listdir(tmp), f"files were created: {os.listdir(tmp)}", r)
    return "valid settings silent, a bad one one line, no file, exit 0"


CHECKS = {
    "stacks": check_stacks,
    "expandable": check_expandable,
    "json": check_json,
    "suppressions": check_suppressions,
    "exitcode": check_exitcode,
    "log_path": check_log_path,
    "off": check_off,
    "layers": check_layers,
    "no_stacks": check_no_stacks,
    "max_leaks": check_max_leaks,
    "stats": check_stats,
    "fork": check_fork,
    "reset": check_reset,
    "signal": check_signal,
    "none": check_none,
}


def main(argv, checks=CHECKS, label="leak_report"):
    names = argv[1:] or list(checks)
    unknown = [n for n in names if n not in checks]
    if unknown:
        print(f"unknown check(s) {unknown}; known: {' '.join(checks)}")
        return 2
    failed = 0
    for name in names:
        tmp = tempfile.mkdtemp(prefix=f"{label}_{name}.")
        try:
            what = checks[name](tmp)
            print(f"PASS {label} {name}: {what}")
        except CheckFailed as e:
            failed += 1
            print(f"FAIL {label} {name}: {e.reason}")
            for r in e.runs:
                print(r.describe())
        except Exception as e:  # a crash of the checker is a failure too
            failed += 1
            print(f"FAIL {label} {name}: checker error {type(e).__name__}: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
