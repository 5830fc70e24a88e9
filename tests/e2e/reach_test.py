#!/usr/bin/env python3
"""reach_test.py [CHECK...]: lost or still reachable, checked by content.

Runs tests/e2e/e2e_reach (100 pooled 1 MiB blocks per mode, their addresses
kept in a local that is overwritten, a global, the heap, as interior
pointers, on another thread's stack, or half cleared) with libcudalloc.so
preloaded, through leak_report_test.py's runner, and reads the report at
exit: the lost ones are the leaks (they decide leak_exitcode), the still
reachable ones are summed in the SUMMARY (listed with report_reachable:1),
a managed block the driver keeps an address of is a leak said to be
unclassed, and leak_scan:0 lists everything as before. The scan's cost on a
process with a large heap is bounded.
"""
import os
import re
import sys

from leak_report_test import (CheckFailed, env_path, expect, lines_of, load_docs, main,
                              parse_reports, run)

PROG = env_path("E2E_REACH_PROG")
MIB, COUNT = 1 << 20, 100
ALL = COUNT * MIB
SCAN = re.compile(r"^leak scan: ([0-9.]+) MiB of host memory in ([0-9.]+) ms$")


def report_of(mode, conf="", *args, expect_rc=0):
    r = run(mode, conf, *args, expect_rc=expect_rc, prog=PROG)
    lines = [l for l in lines_of(r, r.err) if not SCAN.match(l)]
    reports, other = parse_reports(r, lines)
    return r, reports, other


def reachable_words(nbytes, count, listed=False):
    tail = "" if listed else " (report_reachable:1 lists them)"
    return f"; {nbytes} bytes in {count} allocations still reachable{tail}"


def all_reachable(mode):
    r, reports, other = report_of(mode)
    want = f"no device memory leaks ({COUNT} allocations, none lost{reachable_words(ALL, COUNT)})"
    expect(not reports and other == [want], f"lines {other}, want only '{want}'", r)
    return other[0]


def check_lost(tmp, mode="lost"):
    """One local, overwritten each iteration: all 100 lost, listed."""
    r, reports, other = report_of(mode)
    expect(len(reports) == 1 and not other, f"{len(reports)} reports, other lines {other}", r)
    rep = reports[0]
    groups = rep["groups"]
    expect(len(groups) == 1 and not groups[0]["reachable"] and groups[0]["count"] == COUNT,
           f"groups {[g['line'] for g in groups]}, want one of {COUNT} leaked", r)
    want = f"SUMMARY: {ALL} bytes leaked in {COUNT} allocations"
    expect(rep["summary"] == want, f"summary '{rep['summary']}', want '{want}'", r)
    return rep["summary"]


def check_checked(tmp):
    """As lost, the last block memset first: the library's range check
    leaves no word that reads as a pointer to it (all 100 still lost)."""
    return check_lost(tmp, "checked")


def check_global(tmp):
    """Kept in a global array: all 100 still reachable, nothing leaked."""
    return all_reachable("global")


def check_heap(tmp):
    """Kept in a malloc'd array: all still reachable."""
    return all_reachable("heap")


def check_interior(tmp):
    """Only an address 4 KiB into each block is kept: still reachable."""
    return all_reachable("interior")


def check_thread(tmp):
    """Kept on another thread's stack, that thread waiting at exit."""
    return all_reachable("thread")


def check_half(tmp):
    """Half the global array cleared: 50 lost, 50 still reachable."""
    r, reports, other = report_of("half")
    expect(len(reports) == 1 and not other, f"{len(reports)} reports, other lines {other}", r)
    rep = reports[0]
    half = COUNT // 2
    want = f"SUMMARY: {half * MIB} bytes leaked in {half} allocations" + reachable_words(half * MIB, half)
    expect(rep["summary"] == want, f"summary '{rep['summary']}', want '{want}'", r)
    expect([g["count"] for g in rep["groups"]] == [half] and not rep["groups"][0]["reachable"],
           f"groups {[g['line'] for g in rep['groups']]}: want only the {half} lost listed", r)
    return rep["summary"]


def check_managed(tmp):
    """A lost managed block: a leak, said to be unclassed (the driver keeps
    its address, so no scan can tell)."""
    r, reports, other = report_of("managed")
    expect(len(reports) == 1 and not other, f"{len(reports)} reports, other lines {other}", r)
    rep = reports[0]
    expect(rep["summary"] == f"SUMMARY: {MIB} bytes leaked in 1 allocations",
           f"summary '{rep['summary']}'", r)
    expect(rep["unclassed"] and rep["unclassed"].startswith(f"{MIB} bytes in 1 of them could not"),
           f"unclassed line {rep['unclassed']!r}", r)
    return rep["unclassed"]


def check_listed(tmp):
    """report_reachable:1 lists the reachable group too, after the leaks."""
    r, reports, other = report_of("half", "report_reachable:1")
    rep = reports[0] if len(reports) == 1 else None
    expect(rep and not other, f"{len(reports)} reports, other lines {other}", r)
    kinds = [(g["reachable"], g["count"]) for g in rep["groups"]]
    r2, reports2, other2 = report_of("global", "report_reachable:1")
    only = reports2[0]["summary"] if len(reports2) == 1 else None
    want = "SUMMARY: nothing leaked" + reachable_words(ALL, COUNT, listed=True)
    expect(only == want, f"summary '{only}' with only reachable blocks, want '{want}'", r2)
    expect(kinds == [(False, 50), (True, 50)], f"groups {[g['line'] for g in rep['groups']]}", r)
    tail = reachable_words(50 * MIB, 50, listed=True)
    expect(rep["summary"].endswith(tail), f"summary '{rep['summary']}', want it to end '{tail}'", r)
    return rep["groups"][1]["line"]


def check_json(tmp):
    """JSON: each group says what the scan found; the summary counts both."""
    log = os.path.join(tmp, "r.json")
    r = run("half", f"report_format:json,log_path:{log}", prog=PROG)
    docs = [d for d in load_docs(r, log) if d.get("event") == "exit"]
    expect(len(docs) == 1, f"{len(docs)} exit documents", r)
    s = docs[0]["summary"]
    reach = sorted((g["reach"], g["count"]) for g in docs[0]["leaks"])
    expect(reach == [("lost", 50), ("reachable", 50)], f"groups' reach {reach}", r)
    expect(s["count"] == 50 and s["reachable_count"] == 50 and s["reachable_bytes"] == 50 * MIB
           and s["scanned"] is True and s["unclassed_count"] == 0, f"summary {s}", r)
    return f"summary {s}"


def check_exitcode(tmp):
    """leak_exitcode follows the lost ones only."""
    run("global", "leak_exitcode:23", prog=PROG)
    run("lost", "leak_exitcode:23", expect_rc=23, prog=PROG)
    return "global: 0, lost: 23"


def check_off(tmp):
    """leak_scan:0: every unfreed block is a leak, as before the scan."""
    r, reports, other = report_of("global", "leak_scan:0")
    rep = reports[0] if len(reports) == 1 else None
    expect(rep and rep["summary"] == f"SUMMARY: {ALL} bytes leaked in {COUNT} allocations",
           f"reports {reports}, other {other}", r)
    return rep["summary"]


def check_refused(tmp):
    """Where memory cannot be read (process_vm_readv and /proc/self/mem
    refused, as a sandbox may), nothing is classed: every block is a leak,
    as under leak_scan:0, and verbose:2 says the scan was incomplete."""
    preload = env_path("E2E_NOREAD") + ":" + os.environ["E2E_PRELOAD"]
    r = run("global", "verbose:2", prog=PROG, preload=preload)
    lines = lines_of(r, r.err)
    scans = [l for l in lines if SCAN.match(l.replace(" (incomplete: nothing classed)", ""))]
    expect(len(scans) == 1 and scans[0].endswith("(incomplete: nothing classed)"),
           f"scan lines {scans}: want one, incomplete", r)
    reports, other = parse_reports(r, [l for l in lines if l not in scans])
    want = f"SUMMARY: {ALL} bytes leaked in {COUNT} allocations"
    expect(len(reports) == 1 and reports[0]["summary"] == want,
           f"summary {[rep['summary'] for rep in reports]}, want '{want}'", r)
    return scans[0]


def check_bound(tmp):
    """The scan of a process with 2 GiB of heap: every byte read, in at
    most 4 times what one plain pass over the heap takes in the program
    (the absolute bound, 1 s per 10 GiB, is measured on the GPU machine,
    docs/BENCHMARKS.md); every block still found lost."""
    heap = 2048
    r, reports, other = report_of("bigheap", "verbose:2", str(heap))
    scans = [SCAN.match(l) for l in lines_of(r, r.err) if SCAN.match(l)]
    expect(len(scans) == 1, f"{len(scans)} 'leak scan' lines", r)
    mib, ms = float(scans[0].group(1)), float(scans[0].group(2))
    read_ms = float(r.one("read_ms"))
    expect(mib >= heap, f"scanned {mib} MiB, want at least the {heap} MiB heap", r)
    expect(ms <= 4 * read_ms + 50, f"{ms} ms for {mib} MiB: over 4x a plain pass ({read_ms} ms)", r)
    expect(len(reports) == 1 and reports[0]["groups"][0]["count"] == COUNT,
           f"reports {[rep['summary'] for rep in reports]}", r)
    return f"{mib:.0f} MiB in {ms:.0f} ms; a plain pass {read_ms:.0f} ms"


CHECKS = {"lost": check_lost, "checked": check_checked, "global": check_global, "heap": check_heap,
          "interior": check_interior, "thread": check_thread, "half": check_half,
          "managed": check_managed, "listed": check_listed, "json": check_json,
          "exitcode": check_exitcode, "off": check_off, "refused": check_refused,
          "bound": check_bound}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "reach"))
