#!/usr/bin/env python3
"""oom_report_test.py [CHECK...]: the report of a request refused for memory
(docs/LEAKS.md, "Out of memory"), checked by what the program saw and what
the library printed.

Runs tests/e2e/e2e_leaks oom (hold_big() keeps 3 x 16 MiB, hold_small()
8 MiB, then 32 and 40 MiB are asked) under memory_limit_mb:80, preloaded:
both requests are refused with CUDA_ERROR_OUT_OF_MEMORY, and the first, with
no other setting, prints the request, what the device holds, the two sites
largest first (their frames with stacks on, their sizes and the setting that
shows stacks without), and what would help; the second prints nothing unless
verbose; report_format:json makes it one document; oom_snapshot:PATH writes
PyTorch's memory snapshot of that moment there.

Environment as leak_report_test.py's.
"""
import glob
import os
import pickle
import re
import sys

import leak_report_test as lr
from leak_report_test import expect, lines_of, load_docs, main

LIMIT = "memory_limit_mb:80,leak_report:0"
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
FIRST = re.compile(r"^out of memory on device 0: requested 32\.0 MiB \(cuMemAlloc\); "
                   r"in use 56\.0 MiB, cached \S+ \S+, largest free block \S+ \S+, "
                   r"limit 80\.0 MiB, fragmentation [\d.]+%$")
SITE = re.compile(r"^(\d+\.\d \S+) \((\d+) bytes\) live in (\d+) allocation\(s\)(.*):$")
FRAME = re.compile(r"^    #(\d+) 0x[0-9a-f]+ in (\S+) (\S+):(\d+) ")
ADVICE = "what would help: memory_limit_mb caps the device below what is asked: raise it"
HINT = "set CUDALLOC_CONF=backtrace_depth:16 to see where the live memory was allocated"


def run(conf):
    r = lr.run("oom", conf)
    expect(r.integer("oom_32") == OOM and r.integer("oom_40") == OOM,
           f"the requests got {r.one('oom_32')} and {r.one('oom_40')}, want {OOM} twice", r)
    return r


def reports(r, lines):
    """The reports among the lines: each a list of its lines, from its first."""
    out = []
    for line in lines:
        if line.startswith("out of memory on device"):
            out.append([])
        expect(out, f"a line before any report: {line!r}", r)
        out[-1].append(line)
    return out


def sites(r, report):
    """(bytes, count, rest of the site line, [(function, file, line)]) each."""
    found = []
    for line in report:
        m = SITE.match(line)
        if m:
            found.append((int(m.group(2)), int(m.group(3)), m.group(4), []))
            continue
        f = FRAME.match(line)
        if f and found:
            found[-1][3].append((f.group(2), f.group(3), int(f.group(4))))
    return found


def check_stacks(tmp):
    """backtrace_depth:8: the request, the two sites largest first with the
    program's own lines, the advice; nothing for the second refusal."""
    r = run(LIMIT + ",backtrace_depth:8")
    got = reports(r, lines_of(r, r.err))
    expect(len(got) == 1, f"{len(got)} reports, want 1 (the second only under verbose)", r)
    report = got[0]
    expect(FIRST.match(report[0]), f"first line {report[0]!r}", r)
    s = sites(r, report)
    want = [(48 << 20, 3, "hold_big", r.integer("hold_big_line")),
            (8 << 20, 1, "hold_small", r.integer("hold_small_line"))]
    expect(len(s) == 2, f"{len(s)} sites, want 2", r)
    for (nbytes, count, _, frames), (wbytes, wcount, fn, line) in zip(s, want):
        expect((nbytes, count) == (wbytes, wcount), f"site of {nbytes} bytes in {count}, "
               f"want {wbytes} in {wcount}", r)
        expect(frames and frames[0][0] == fn and frames[0][1].endswith("e2e_leaks.c")
               and frames[0][2] == line, f"the site's first frame is {frames[:1]}, want {fn} "
               f"e2e_leaks.c:{line}", r)
    expect(report[-1] == ADVICE, f"last line {report[-1]!r}, want the advice", r)
    expect(HINT not in report, "the hint for stacks while stacks are on", r)
    return "first refusal: 48 MiB at hold_big, 8 MiB at hold_small, the limit's advice"


def check_no_stacks(tmp):
    """No setting but the limit: the sites by size, and which setting shows
    their stacks."""
    r = run(LIMIT)
    got = reports(r, lines_of(r, r.err))
    expect(len(got) == 1, f"{len(got)} reports, want 1", r)
    s = sites(r, got[0])
    expect([(b, c, rest) for b, c, rest, _ in s] ==
           [(48 << 20, 3, " of 16777216 bytes"), (8 << 20, 1, " of 8388608 bytes")],
           f"sites {s}", r)
    expect(got[0][-2:] == [ADVICE, HINT], f"last lines {got[0][-2:]}", r)
    return "sites by size, then the advice and backtrace_depth:16"


def check_verbose(tmp):
    """verbose:1: each refusal its report."""
    r = run(LIMIT + ",verbose:1")
    got = reports(r, [x for x in lines_of(r, r.err) if not x.startswith("verbose")])
    expect(len(got) == 2 and "requested 40.0 MiB" in got[1][0],
           f"{len(got)} reports, want 2, the second for 40 MiB", r)
    return "two refusals, two reports"


def check_json(tmp):
    """report_format:json: one out_of_memory document with the figures and
    the sites."""
    log = os.path.join(tmp, "oom.log")
    r = run(LIMIT + f",backtrace_depth:8,report_format:json,log_path:{log}")
    docs = load_docs(r, log)
    expect(len(docs) == 1 and docs[0].get("event") == "out_of_memory",
           f"documents {[d.get('event') for d in docs]}, want one out_of_memory", r)
    d = docs[0]
    want = {"device": 0, "call": "cuMemAlloc", "requested": 32 << 20, "in_use": 56 << 20,
            "limit": 80 << 20, "then": None}
    expect({k: d.get(k) for k in want} == want, f"figures {d}", r)
    expect(d.get("advice", "").startswith("memory_limit_mb caps"), f"advice {d.get('advice')}", r)
    got = [(x["bytes"], x["count"], x["frames"][0]["function"]) for x in d.get("sites", [])]
    expect(got == [(48 << 20, 3, "hold_big"), (8 << 20, 1, "hold_small")], f"sites {got}", r)
    expect(d.get("more_sites") == {"groups": 0, "bytes": 0, "count": 0},
           f"more_sites {d.get('more_sites')}", r)
    return "one document: the request, the limit, two sites with frames"


def check_snapshot(tmp):
    """oom_snapshot: PyTorch's snapshot of the first refusal: the pools'
    segments tiled with the four live blocks (their frames) and the cache,
    the four allocations and the refused request in device 0's trace."""
    path = os.path.join(tmp, "oom.%p.pickle")
    r = run(LIMIT + f",backtrace_depth:8,oom_snapshot:{path}")
    files = glob.glob(os.path.join(tmp, "oom.*.pickle"))
    want = os.path.join(tmp, f"oom.{r.pid}.pickle")
    expect(files == [want], f"snapshot files {files}, want {want}", r)
    said = [l for l in lines_of(r, r.err) if l.startswith("oom_snapshot:")]
    expect(len(said) == 1 and want in said[0], f"the snapshot's line: {said}", r)
    with open(want, "rb") as f:
        snap = pickle.load(f)
    expect(set(snap) >= {"segments", "device_traces"}, f"keys {sorted(snap)}", r)
    live = []
    for seg in snap["segments"]:
        blocks = seg["blocks"]
        expect(blocks and blocks[0]["address"] == seg["address"]
               and sum(b["size"] for b in blocks) == seg["total_size"]
               and all(a["address"] + a["size"] == b["address"] for a, b in zip(blocks, blocks[1:])),
               f"segment {seg['address']:#x}: its blocks do not tile it", r)
        held = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        expect(seg["allocated_size"] == held, f"segment {seg['address']:#x}: allocated_size", r)
        live += [(b["requested_size"], b["frames"][0]["name"]) for b in blocks
                 if b["state"] == "active_allocated"]
    expect(sorted(live) == sorted([(16 << 20, "hold_big")] * 3 + [(8 << 20, "hold_small")]),
           f"live blocks {live}", r)
    trace = snap["device_traces"][0]
    got = [(e["action"], e["size"], (e["frames"] or [{}])[0].get("name")) for e in trace]
    expect(got == [("alloc", 16 << 20, "hold_big")] * 3 + [("alloc", 8 << 20, "hold_small"),
                                                         ("oom", 32 << 20, None)],
           f"device 0's trace {got}", r)
    expect("device_free" in trace[-1],
           "the oom entry has no device_free", r)
    return (f"{len(snap['segments'])} segments tiled, 4 live blocks with their frames, "
            "4 allocations and the refused request in the trace")


def check_snapshot_refused(tmp):
    """oom_snapshot into a folder that does not exist: one line saying so,
    the report and the program as without it."""
    path = os.path.join(tmp, "no", "such", "folder", "oom.pickle")
    r = run(LIMIT + f",oom_snapshot:{path}")
    said = [l for l in lines_of(r, r.err) if l.startswith("oom_snapshot:")]
    expect(len(said) == 1 and "cannot write the snapshot there" in said[0]
           and "No such file or directory" in said[0], f"the snapshot's line: {said}", r)
    expect(len(reports(r, [l for l in lines_of(r, r.err) if l not in said])) == 1,
           "not one report", r)
    return said[0][:90] + "..."


CHECKS = {
    "stacks": check_stacks,
    "no_stacks": check_no_stacks,
    "verbose": check_verbose,
    "json": check_json,
    "snapshot": check_snapshot,
    "snapshot_refused": check_snapshot_refused,
}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "oom_report"))
