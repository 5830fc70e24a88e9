"""The leak report on a GPU, judged against the form docs/LEAKS.md gives it.

  leaky_loop_static  examples/leaky_loop.cu (static runtime): runs without
                     the library; with backtrace_depth:16 one group whose
                     frame #0 is the line marked "LEAK: this line", and the
                     SUMMARY; --fixed reports no leaks; without stacks the
                     group by size and the hint; the JSON document in a
                     log_path file; leak_exitcode on a leak and only then
  leaky_loop_shared  the same program with libcudart.so: plain, stacks, fixed
  torch_leak         examples/torch_leak.py (no caching): the report it
                     prints at the end of training shows a group of one
                     allocation per step, --fixed none, and with
                     examples/torch.supp nothing leaked at exit; under
                     growth_report:1 the report at exit names a site that
                     grew over every marked step, though Python freed it
                     all, and --fixed none; the group of kept outputs shows
                     the Python line that made them (train's model(x));
                     its trace, cut halfway, as a PyTorch memory snapshot
                     that PyTorch's own _memory_viz reads, naming that line;
                     a training's snapshot from PyTorch's own memory history
                     and from cudalloc's trace, both read by _memory_viz and
                     each showing its allocator's cache (segments)
  oom_report         tests/gpu/torch_oom.py out of memory under
                     memory_limit_mb:2048, preloaded (PyTorch raises) and
                     through the slot (the process stops, SIGABRT, after the
                     report): the library's report, unasked, names the request, the
                     two Python sites holding the most at their lines, the
                     limit as what would help; oom_snapshot's file read by
                     PyTorch's _memory_viz
  reset_leak         cudaDeviceReset in mid-program (tests/gpu/reset_leak.cu):
                     reported at the reset, correct after it

leaky_loop leaks 100 buffers of 1 MiB from the marked line; --fixed frees
them. The scan of host memory classes at least 95 of them lost and the rest still
reachable: the CUDA runtime keeps the arguments of its most recent kernel
launch in its heap, so the buffer the last launch was given (allocation
#100) is still reachable, as are, with the shared runtime and stacks, up to
two more whose addresses linger in stack slots (97 + 3 measured on the H200;
the scan errs toward reachable, never the other way; docs/LEAKS.md). torch_leak.py keeps two tensors per step and prints the report itself
at the end of training (Python frees everything before exit).
"""

import glob
import json
import os
import re
import signal
import sys

from gpu_check import exit_problem

ALLOCATIONS = 100
LOST_MIN = 95  # the rest still reachable: see above
# Under expandable_segments:1 half of the buffers start at a 2 MiB page,
# whose address the driver keeps: leaked but unclassed (counted with the
# lost in the SUMMARY); of the others 12 read as still reachable on the
# H200 (88 + 12 measured): the scan errs toward reachable there too.
LOST_MIN_EXPANDABLE = 80
LEAK_GROUP_RE = r"^cudalloc: [0-9]+ bytes leaked in [0-9]+ allocation\(s\)"
# The same groups in the report printed on request (cudalloc_print_report),
# which lists every live block: lost, still reachable (the kept tensors are
# held by a Python list), or live where the scan cannot class it.
LIVE_GROUP_RE = r"^cudalloc: ([0-9]+) bytes (?:live|lost|still reachable) in ([0-9]+) allocation\(s\)"
SUMMARY_RE = (r"^cudalloc: SUMMARY: ([0-9]+) bytes leaked in ([0-9]+) allocations"
              r"(?:; ([0-9]+) bytes in ([0-9]+) allocations still reachable "
              r"\(report_reachable:1 lists them\))?$")


def lost_of(r, lost_min=LOST_MIN):
    """The lost count the SUMMARY gives, when the 100 buffers of 1 MiB are
    all accounted for (lost + still reachable), at least lost_min lost;
    else None, with the reason in r.why."""
    m = [re.match(SUMMARY_RE, l) for l in r.run.grep(SUMMARY_RE)]
    if len(m) != 1:
        r.why.append("%d SUMMARY lines of the documented form, want 1" % len(m))
        return None
    lost_b, lost, reach_b, reach = (int(x or 0) for x in m[0].groups())
    if (lost + reach != ALLOCATIONS or lost_b != lost << 20 or reach_b != reach << 20
            or lost < lost_min):
        r.why.append("SUMMARY: %d lost + %d still reachable of %d buffers of 1 MiB, want at "
                     "least %d lost" % (lost, reach, ALLOCATIONS, lost_min))
        return None
    return lost
TORCH_STEPS = 40
STACKS = "backtrace_depth:16"


class LeakRun:
    """One run of a leak check and what it found wrong (`why`)."""

    def __init__(self, check, row, runtime, conf, cmd, want_rc=0, env=None):
        self.check, self.row, self.runtime, self.conf = check, row, runtime, conf
        self.why = []
        skip = check.cannot_run(cmd, conf)
        if skip is None and marker_line(check) is None:
            skip = "no single 'LEAK: this line' in examples/leaky_loop.cu"
        self.skipped = skip is not None
        if self.skipped:
            self.verdict("", "not run: " + skip)
            return
        self.run = check.run(row, cmd, conf=conf, env=env)
        if self.run.rc != want_rc:
            self.why.append(exit_problem(self.run) if self.run.rc == 124 else
                            "exit status %d, want %d" % (self.run.rc, want_rc))

    def groups(self, want):
        n = len(self.run.grep(LEAK_GROUP_RE))
        if n != want:
            self.why.append("%d leak group(s), want %d" % (n, want))

    def want_line(self, line, why=None):
        if not self.run.has(line):
            self.why.append(why or 'no line "%s"' % line)

    def verdict(self, passed, facts=""):
        """The row: PASS when nothing was found wrong; FACTS either way."""
        work = self.check.work
        pre = "no" if self.conf is None else "yes" + (
            ", " + self.conf.replace(work, "work") if self.conf else "")
        if self.skipped or self.why:
            note = "; ".join(([facts] if facts else []) + self.why)
            self.check.record(self.row, self.runtime, pre, "-", "-", "FAIL", note)
        else:
            note = "; ".join(x for x in (passed, facts) if x)
            self.check.record(self.row, self.runtime, pre, "-", "-", "PASS", note)


def marker_line(check):
    """The line number of examples/leaky_loop.cu marked "LEAK: this line"."""
    with open(check.path("examples/leaky_loop.cu")) as f:
        hits = [n for n, l in enumerate(f, 1) if "LEAK: this line" in l]
    return hits[0] if len(hits) == 1 else None


def leak_plain(check, row, runtime, prog):
    r = LeakRun(check, row, runtime, None, [prog])
    if r.skipped:
        return
    if not r.run.grep(r"^leaky_loop: 100 iterations"):
        r.why.append("no 'leaky_loop: 100 iterations' line")
    if r.run.library_lines():
        r.why.append("library output in a run without it")
    r.verdict("runs on the GPU")


def leak_stacks(check, row, runtime, prog, extra="", lost_min=LOST_MIN):
    """With stacks: one group whose first frame is the marked line."""
    r = LeakRun(check, row, runtime, STACKS + extra, [prog])
    if r.skipped:
        return
    lost = lost_of(r, lost_min) or 0
    head = ("cudalloc: %d bytes leaked in %d allocation(s) on device 0, allocated from:"
            % (lost << 20, lost))
    r.groups(1)
    frame0 = ""
    if r.run.has(head):
        i = r.run.lines.index(head)
        frame0 = r.run.lines[i + 1] if i + 1 < len(r.run.lines) else ""
        if not re.match(r"^cudalloc: +#0 .*leaky_loop\.cu:%d([^0-9]|$)" % marker_line(check),
                        frame0):
            r.why.append("frame #0 is not leaky_loop.cu:%d (shown above)" % marker_line(check))
    else:
        r.why.append('no line "%s"' % head)
    r.verdict("", "%d lost; frame #0: %s" % (lost, frame0[len("cudalloc:"):].strip() or "-"))


def leak_fixed(check, row, runtime, prog):
    r = LeakRun(check, row, runtime, STACKS, [prog, "--fixed"])
    if r.skipped:
        return
    line = (r.run.grep(r"^cudalloc: no device memory leaks") or [""])[0]
    if not line:
        r.why.append('no line "cudalloc: no device memory leaks ..."')
    if r.run.grep(r"^cudalloc: SUMMARY: "):
        r.why.append("a SUMMARY of leaks")
    r.groups(0)
    r.verdict(line[len("cudalloc: "):])


def leak_nostack(check, row, runtime, prog):
    """Without stacks, leaks are grouped by size, with the hint."""
    r = LeakRun(check, row, runtime, "", [prog])
    if r.skipped:
        return
    lost = lost_of(r) or 0
    r.groups(1)
    group = ("cudalloc: %d bytes leaked in %d allocation(s) of 1048576 bytes on device 0:"
             % (lost << 20, lost))
    if not r.run.has(group) and not r.run.has(group[:-1]):
        r.why.append('no line "%s"' % group)
    if not r.run.grep(r"^cudalloc: .*CUDALLOC_CONF=backtrace_depth"):
        r.why.append("no hint line about backtrace_depth")
    r.verdict("%d lost, grouped by size, hint present" % lost)


def leak_json(check, row, runtime, prog):
    """The JSON report, in the log_path file, one document per line."""
    conf = "%s,report_format:json,log_path:%s/leak.%%p.json" % (STACKS, check.work)
    if "," in check.work:  # CUDALLOC_CONF items are split at commas
        check.record(row, runtime, "yes", "-", "-", "FAIL",
                     "not run: the path of OUT contains a comma")
        return
    r = LeakRun(check, row, runtime, conf, [prog])
    if r.skipped:
        return
    if r.run.library_lines():
        r.why.append("library output on stderr despite log_path")
    bad, facts = json_problems(check.work, marker_line(check))
    r.why += bad
    r.verdict(facts)


def json_problems(folder, marker):
    """What the leak.<pid>.json files get wrong, and what they show."""
    files = sorted(glob.glob(folder + "/leak.*.json"))
    bad, docs = [], []
    for name in files:
        with open(name) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        docs.append(json.loads(line))
                    except ValueError as e:
                        bad.append("%s line %d is not JSON (%s)" % (os.path.basename(name), n, e))
    exits = [d for d in docs if isinstance(d, dict) and d.get("event") == "exit"]
    if not files:
        return ["no work/leak.<pid>.json written"], ""
    if len(exits) != 1:
        return bad + ["%d documents with event exit in %d file(s), want 1"
                      % (len(exits), len(files))], ""
    doc = exits[0]
    leaks = [g for g in doc.get("leaks", []) if not g.get("suppressed")
             and g.get("reach") != "reachable"]
    if len(leaks) != 1:
        bad.append("%d leak groups, want 1" % len(leaks))
    summary = doc.get("summary") or {}
    lost, reach = summary.get("count", 0), summary.get("reachable_count", 0)
    if (lost + reach != ALLOCATIONS or lost < LOST_MIN or summary.get("bytes") != lost << 20
            or summary.get("scanned") is not True):
        bad.append("summary %s: want %d buffers lost or still reachable, at least %d lost"
                   % (json.dumps(summary), ALLOCATIONS, LOST_MIN))
    groups = [g for g in leaks if g.get("count") == lost and g.get("bytes") == lost << 20]
    if not groups:
        bad.append("no group of count %d and bytes %d: %s" % (
            lost, lost << 20, [(g.get("count"), g.get("bytes")) for g in leaks]))
    else:
        frames = groups[0].get("frames") or []
        if not any(str(f.get("file") or "").endswith("leaky_loop.cu") and f.get("line") == marker
                   for f in frames):
            bad.append("no frame at leaky_loop.cu:%d; frames: %s" % (marker, [
                "%s:%s" % (f.get("file"), f.get("line")) for f in frames[:4]]))
    return bad, "%d document(s), one group of %d lost (%d still reachable), a frame at " \
        "leaky_loop.cu:%d" % (len(docs), lost, reach, marker)


def leak_exitcode(check, row, runtime, prog, want, args):
    """leak_exitcode turns a leak into an exit status, and only a leak."""
    r = LeakRun(check, row, runtime, "leak_exitcode:23", [prog] + args, want_rc=want)
    if not r.skipped:
        r.verdict("exit status %d" % r.run.rc)


def leaky_loop_static(check):
    prog = os.path.join(check.examples, "leaky_loop")
    check.together(
        lambda: leak_plain(check, "leaky_loop_static_plain", "static", prog),
        lambda: leak_stacks(check, "leak_static_stacks", "static", prog),
        # 1 MiB buffers: the large heap, from mapped pages under expandable_segments.
        lambda: leak_stacks(check, "leak_static_stacks_expandable", "static", prog,
                            ",expandable_segments:1", LOST_MIN_EXPANDABLE),
        lambda: leak_fixed(check, "leak_static_fixed", "static", prog),
        lambda: leak_nostack(check, "leak_static_nostack", "static", prog),
        lambda: leak_json(check, "leak_static_json", "static", prog),
        lambda: leak_exitcode(check, "leak_exitcode_leaky", "static", prog, 23, []),
        lambda: leak_exitcode(check, "leak_exitcode_fixed", "static", prog, 0, ["--fixed"]))


def leaky_loop_shared(check):
    prog = os.path.join(check.examples, "leaky_loop_shared")
    check.together(
        lambda: leak_plain(check, "leaky_loop_shared_plain", "shared", prog),
        lambda: leak_stacks(check, "leak_shared_stacks", "shared", prog),
        lambda: leak_fixed(check, "leak_shared_fixed", "shared", prog))


def training_report(run):
    """The lines of the report torch_leak.py prints at the end of training."""
    section, on = [], False
    for line in run.lines:
        if re.match(r"^torch_leak: cudalloc.s report", line):
            on = True
        elif re.search(r"==[0-9]+== .*\(at exit\)", line):
            on = False
        elif on:
            section.append(line)
    return section


def torch_report(check, row, fixed):
    """The report torch_leak.py prints at the end of training (not the one
    at exit): a group of a multiple of TORCH_STEPS allocations, or none."""
    cmd = [sys.executable, "examples/torch_leak.py", "--steps", str(TORCH_STEPS)]
    r = LeakRun(check, row, "torch", STACKS, cmd + (["--fixed"] if fixed else []))
    if r.skipped:
        return
    section = training_report(r.run)
    groups = [re.match(LIVE_GROUP_RE, l).groups() for l in section if re.match(LIVE_GROUP_RE, l)]
    shown = " ".join("%sx%sB" % (count, size) for size, count in groups)
    hits = [g for g in groups if int(g[1]) > 0 and int(g[1]) % TORCH_STEPS == 0]
    growth = r.run.last(r"\(([-+][0-9.]*) MiB since step 1\)", 1, "?")
    if not any(l.startswith("cudalloc: ") for l in section):
        r.why.append("no report printed at the end of training")
    elif fixed and hits:
        r.why.append("%d group(s) of a multiple of %d allocations: %s" % (len(hits), TORCH_STEPS, shown))
    elif not fixed and not hits:
        r.why.append("no group of a multiple of %d allocations: %s" % (TORCH_STEPS, shown or "no groups"))
    r.verdict("", "groups (count x bytes): %s; memory growth %s MiB over %d steps"
              % (shown or "none", growth, TORCH_STEPS))


GROWTH_SITE_RE = (r"^cudalloc: \+\S+ \S+ \(([0-9]+) bytes\), .* over ([0-9]+) consecutive "
                  r"snapshots")


def torch_growth(check, row, fixed):
    """growth_report:1 (the script marks each step): at exit, a site that
    grew by at least a MiB per step over the steps; with --fixed, none."""
    cmd = [sys.executable, "examples/torch_leak.py", "--steps", str(TORCH_STEPS)]
    r = LeakRun(check, row, "torch", "growth_report:1", cmd + (["--fixed"] if fixed else []))
    if r.skipped:
        return
    head = r.run.last(r"^cudalloc: growth: ")
    sites = [re.match(GROWTH_SITE_RE, l).groups() for l in r.run.grep(GROWTH_SITE_RE)]
    big = [(int(b), int(n)) for b, n in sites
           if int(b) >= (TORCH_STEPS - 2) << 20 and int(n) >= TORCH_STEPS - 1]
    if not head:
        r.why.append("no growth section at exit")
    elif fixed and sites:
        r.why.append("%d growing site(s) in the fixed loop: %s" % (len(sites), head))
    elif not fixed and not big:
        r.why.append("no site grew a MiB a step over the %d marked steps: %s %s"
                     % (TORCH_STEPS, head, sites))
    r.verdict(head[len("cudalloc: "):], "largest: %s" % (
        "%d bytes over %d snapshots" % max((int(b), int(n)) for b, n in sites) if sites else "-"))


def torch_python_frames(check):
    """With stacks, the group of the kept outputs names the line of
    train() that made them: Python frames under PyTorch, which releases the
    GIL around every operator."""
    cmd = [sys.executable, "examples/torch_leak.py", "--steps", str(TORCH_STEPS)]
    r = LeakRun(check, "leak_torch_python", "torch", STACKS, cmd)
    if r.skipped:
        return
    with open(check.path("examples/torch_leak.py")) as f:
        line = next(n for n, l in enumerate(f, 1) if "logits = model(x)" in l)
    want = re.compile(r"^cudalloc: +#[0-9]+ in train \S*torch_leak\.py:%d \(Python\)$" % line)
    groups, cur = [], None
    for l in training_report(r.run):
        m = re.match(LIVE_GROUP_RE, l)
        if m:
            cur = [int(m.group(2)), []]
            groups.append(cur)
        elif cur is not None and l.startswith("cudalloc:     #"):
            cur[1].append(l)
    hit = [g for g in groups if g[0] == TORCH_STEPS and any(want.match(f) for f in g[1])]
    if not hit:
        r.why.append("no group of %d allocations with the frame 'in train ...torch_leak.py:%d "
                     "(Python)'" % (TORCH_STEPS, line))
    py = [f for f in (hit[0][1] if hit else []) if f.endswith("(Python)")]
    r.verdict("", "%d Python frames, innermost: %s" % (
        len(py), py[0].split(" in ", 1)[-1] if py else "-"))


def torch_leak(check):
    torch_env = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    try:
        check.together(
            lambda: torch_report(check, "leak_torch", False),
            lambda: torch_report(check, "leak_torch_fixed", True),
            lambda: torch_exit_suppressed(check),
            lambda: torch_growth(check, "leak_torch_growth", False),
            lambda: torch_growth(check, "leak_torch_growth_fixed", True),
            lambda: torch_python_frames(check),
            lambda: torch_snapshot(check),
            lambda: torch_snapshot_pair(check))
    finally:
        if torch_env is None:
            del os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"]


def torch_snapshot(check):
    """The trace of a PyTorch run, cut halfway (its kept outputs live), as a
    PyTorch memory snapshot (cudalloc view --torch-snapshot), read by
    PyTorch's own readers: `python -m torch.cuda._memory_viz stats` and
    `trace` as a user types them, and the stacks behind `segments` and
    `memory` (tests/gpu/torch_snapshot_read.py: their command-line forms
    fetch flamegraph.pl from the web); the memory stacks must name the line
    of train() that made the outputs."""
    row = "leak_torch_snapshot"
    trace = os.path.join(check.work, row + ".trace.json")
    cmd = [sys.executable, "examples/torch_leak.py", "--steps", str(TORCH_STEPS)]
    r = LeakRun(check, row, "torch", STACKS + ",trace_path:" + trace, cmd)
    if r.skipped:
        return
    if not os.path.exists(trace):
        r.why.append("no trace at " + trace)
        r.verdict("")
        return
    with open(trace) as f:
        lines = f.read().split("\n")
    cut, snap = os.path.join(check.work, row + ".cut.json"), os.path.join(check.work, row + ".pickle")
    with open(cut, "w") as f:
        f.write("\n".join(lines[: len(lines) // 2]).rstrip().rstrip(","))
    with open(check.path("examples/torch_leak.py")) as f:
        line = next(n for n, l in enumerate(f, 1) if "logits = model(x)" in l)
    frame = "torch_leak.py:%d:train" % line
    viz = [sys.executable, "-m", "torch.cuda._memory_viz"]
    for step, c, want in [
            ("view", ["sh", "scripts/cudalloc", "view", "--torch-snapshot", snap, "--force", cut],
             "a PyTorch memory snapshot"),
            ("stats", viz + ["stats", snap], "total_reserved"),
            ("trace", viz + ["trace", snap], " entries"),
            ("read", [sys.executable, "tests/gpu/torch_snapshot_read.py", snap, frame],
             "torch_snapshot: PASS")]:
        run = check.run("%s_%s" % (row, step), c)
        if run.rc != 0 or not run.grep(re.escape(want)):
            r.why.append("%s: %s" % (step, exit_problem(run) or "no '%s' in its output" % want))
    r.verdict("PyTorch's _memory_viz reads the snapshot of the trace cut halfway and names "
              + frame)


def torch_snapshot_pair(check):
    """The same training under PyTorch's own allocator, its memory history
    dumped as its snapshot, and under the library with trace_path (PyTorch's
    caching off: the pool serves each tensor), made a snapshot by `cudalloc
    view --torch-snapshot`; PyTorch's _memory_viz reads both, and each must
    show its allocator's cache once the model is dropped (reserved bytes
    beyond those allocated: the pool's segments, no longer only its live
    blocks). The row's note puts their segments and bytes side by side."""
    row = "leak_torch_snapshot_pair"
    theirs = os.path.join(check.work, row + ".pytorch.pickle")
    trace = os.path.join(check.work, row + ".trace.json")
    ours = os.path.join(check.work, row + ".cudalloc.pickle")
    script = [sys.executable, "tests/gpu/torch_snapshot_pair.py"]
    facts = ""
    r = LeakRun(check, row, "torch", "trace_path:" + trace, script + ["train"])
    if r.skipped:
        return
    for step, c, conf, want in [
            ("pytorch", script + ["train", theirs], None, "wrote"),
            ("view", ["sh", "scripts/cudalloc", "view", "--torch-snapshot", ours, "--force", trace],
             None, "a PyTorch memory snapshot"),
            ("read", script + ["read", theirs, ours], None, "torch_snapshot_pair: PASS")]:
        run = check.run("%s_%s" % (row, step), c, conf=conf)
        if run.rc != 0 or not run.grep(re.escape(want)):
            r.why.append("%s: %s" % (step, exit_problem(run) or "no '%s' in its output" % want))
        if step == "read":
            facts = "; ".join(l.split(": ", 1)[1] for l in run.grep(r"^torch_snapshot_pair: \w+ \d"))
    r.verdict("PyTorch's _memory_viz reads both snapshots; each shows its cache", facts)


def oom_sites(run):
    """The sites of the out-of-memory report, largest first: each its
    innermost Python frame of torch_oom.py, (function, line), or None."""
    sites, inside = [], False
    frame = re.compile(r"^cudalloc: +#[0-9]+ in (\S+) \S*torch_oom\.py:(\d+) \(Python\)$")
    for line in open(run.log, errors="replace").read().splitlines():
        if line.startswith("cudalloc: out of memory on device"):
            inside = True
        elif line.startswith("cudalloc: what would help:"):
            inside = False
        elif inside and re.match(r"^cudalloc: [0-9.]+ \S+ \(\d+ bytes\) live in ", line):
            sites.append(None)
        elif inside and sites and sites[-1] is None and frame.match(line):
            m = frame.match(line)
            sites[-1] = (m.group(1), int(m.group(2)))
    return sites


def torch_oom(check, row, slot):
    """A PyTorch program out of memory under memory_limit_mb:2048, through
    the slot or preloaded (tests/gpu/torch_oom.py): PyTorch raises; the
    library's report, unasked, names the request and the limit, the two
    Python sites holding the most (load_weights 1 GiB, then
    make_activations 512 MiB, each at its line) and the limit as what would
    help; oom_snapshot's file is read by PyTorch's _memory_viz, its memory
    stacks naming load_weights' line."""
    doc_path = os.path.join(check.work, row + ".json")
    snap = os.path.join(check.work, row + ".pickle")
    conf = "memory_limit_mb:2048,%s,oom_snapshot:%s" % (STACKS, snap)
    cmd = [sys.executable, "tests/gpu/torch_oom.py", doc_path]
    if slot:
        skip = check.cannot_run(cmd, "")
        if skip:
            check.record(row, "torch", "slot", "-", "-", "FAIL", "not run: " + skip)
            return
        run = check.run(row, cmd + ["--slot"], env={"CUDALLOC_CONF": conf,
                                                    "CUDALLOC_LIBRARY": check.lib})
        r = LeakRun.__new__(LeakRun)
        r.check, r.row, r.runtime, r.conf, r.why, r.skipped, r.run = (
            check, row, "torch", conf, [], False, run)
        # Through PyTorch's slot the library stops the process (SIGABRT)
        # once it has said why: PyTorch would use the missing memory.
        if run.rc != -signal.SIGABRT:
            r.why.append(exit_problem(run) or "exit status %d, want SIGABRT" % run.rc)
        outcome = "the process stopped after the report, as through PyTorch's slot it must"
    else:
        r = LeakRun(check, row, "torch", conf, cmd,
                    env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        if r.skipped:
            return
        try:
            with open(doc_path) as f:
                outcome = "PyTorch raised %r" % (json.load(f).get("oom") or "")[:60]
        except (OSError, ValueError):
            r.verdict("", "no result file")
            return
        if outcome == "PyTorch raised ''":
            r.why.append("1 GiB past the limit was served")
    said = r.run.grep(r"^torch_oom: lines ")
    lines = json.loads(said[0].split("lines ", 1)[1]) if said else {}
    call = "the allocator slot" if slot else "cuMemAlloc"
    first = r.run.grep(r"^cudalloc: out of memory on device 0: requested 1\.0 GiB \(%s\)" % call)
    if not first or "limit 2.0 GiB" not in first[0]:
        r.why.append("no first line naming the request (%s) and the limit: %s" % (call, first))
    elif slot and "stopping the process" not in first[0]:
        r.why.append("the first line does not say the process stops: %s" % first[0])
    named = oom_sites(r.run)
    want = [(n, lines.get(n)) for n in ("load_weights", "make_activations")]
    if named[:2] != want:
        r.why.append("the sites' innermost lines of torch_oom.py are %s, want %s"
                     % (named, want))
    if not r.run.grep(r"^cudalloc: what would help: memory_limit_mb caps"):
        r.why.append("no advice to raise the limit")
    read = check.run(row + "_read", [sys.executable, "tests/gpu/torch_snapshot_read.py", snap,
                                      "torch_oom.py:%s:load_weights" % lines.get("load_weights")])
    if read.rc != 0 or not read.grep(r"torch_snapshot: PASS"):
        r.why.append("_memory_viz on the oom_snapshot: %s" % (read.grep(r"torch_snapshot:") or
                                                              exit_problem(read)))
    r.verdict("%s; the report named the request, load_weights (1 GiB) and "
              "make_activations (512 MiB) at their lines, the limit; _memory_viz read the "
              "snapshot" % outcome)


def oom_report(check):
    check.together(lambda: torch_oom(check, "oom_report_slot", True),
                   lambda: torch_oom(check, "oom_report_preload", False))


def torch_exit_suppressed(check):
    """At exit PyTorch still holds what it keeps to the end by design (cuBLAS
    handles and workspaces); examples/torch.supp sets exactly that aside."""
    cmd = [sys.executable, "examples/torch_leak.py", "--steps", str(TORCH_STEPS), "--fixed"]
    r = LeakRun(check, "leak_torch_exit_suppressed", "torch",
                STACKS + ",suppressions:examples/torch.supp", cmd)
    if r.skipped:
        return
    line = (r.run.grep(r"^cudalloc: no device memory leaks \(") or [""])[-1]
    if not line:
        r.why.append("no 'no device memory leaks' line at exit")
    if r.run.grep(r"^cudalloc: SUMMARY: [0-9]+ bytes leaked"):
        r.why.append("a SUMMARY of leaks at exit")
    r.verdict(line[len("cudalloc: "):])


def reset_leak(check):
    """The blocks a reset kills unfreed are reported at the reset, the pool
    forgets their segments, and the program computes correctly after it."""
    r = LeakRun(check, "leak_reset", "static", "", [check.program("reset_leak")])
    if r.skipped:
        return
    r.want_line("reset_leak: PASS", "no 'reset_leak: PASS'")
    if not r.run.grep(r"^cudalloc: ==[0-9]+== device memory leak report "
                      r"\(at context reset of device 0\)$"):
        r.why.append("no report at the context reset")
    r.want_line("cudalloc: 2097152 bytes leaked in 2 allocation(s) of 1048576 bytes on device 0:",
                "the reset report does not show the 2 unfreed blocks")
    if not r.run.grep(r"^cudalloc: no device memory leaks \("):
        r.why.append("no 'no device memory leaks' at exit")
    r.verdict("reported at the reset, correct after it")


CHECKS = {
    "leaky_loop_static": (leaky_loop_static, True),
    "leaky_loop_shared": (leaky_loop_shared, True),
    "torch_leak": (torch_leak, True),
    "oom_report": (oom_report, True),
    "reset_leak": (reset_leak, True),
}
