#!/usr/bin/env python3
"""growth_report_test.py [CHECK...]: memory over time, checked by content.

A training loop that keeps one block per step and frees everything at the
end leaks nothing at exit, yet its memory grew all run long: with
growth_report:1 the report at exit must name the site that kept growing,
with its run, and the peak must name it as the site that held the most.
A loop whose memory is steady must report no growth. Runs
tests/e2e/e2e_leaks (modes growth and steady) with libcudalloc.so
preloaded, through leak_report_test.py's runner (same environment).
"""
import json
import os
import re
import sys

from leak_report_test import (FRAME, expect, lines_of, load_docs, main, parse_reports,
                              run, split_over_time)

STEPS = 40
GROWTH_HEAD = re.compile(r"^growth: (\d+) site\(s\) kept growing \((\d+) snapshot\(s\) of live "
                         r"memory by site taken\):$")
GROWTH_SITE = re.compile(r"^\+(\S+ \S+) \((\d+) bytes\), from (\S+ \S+) to (\S+ \S+), over (\d+) "
                         r"consecutive snapshots \(rising in (\d+); allocations (\d+) to (\d+)\), "
                         r"allocated from:$")
PEAK_HEAD = re.compile(r"^peak: \S+ \S+ \((\d+) bytes\) of device memory live at once, [0-9.]+ s "
                       r"into the run \(allocation (\d+)\); at \S+ \S+ \((\d+) bytes\), "
                       r"the sites holding the most:$")
HELD = re.compile(r"^held on device 0 \(the pool's segments and what went to the driver directly\) "
                  r"peaked at \S+ \S+ \((\d+) bytes\), [0-9.]+ s into the run$")
PEAK_SITE = re.compile(r"^\S+ \S+ \((\d+) bytes\) in (\d+) allocation\(s\), allocated from:$")


def over_time(r):
    """The memory-over-time sections printed at exit, by their first word;
    around them, a leak report or the one line that says nothing leaked."""
    rest, sections = split_over_time(lines_of(r, r.err))
    reports, other = parse_reports(r, rest)
    other = [l for l in other if not l.startswith("no device memory leaks (")]
    expect(len(reports) <= 1 and not other, f"lines outside the report: {other}", r)
    return {s[0].split(":")[0]: s for s in sections}


def first_frame_is(r, line, fn, want_line):
    f = FRAME.match(line)
    expect(f and re.match(rf"{fn} \S*e2e_leaks\.c:{want_line} ", f.group(3)),
           f"frame #0 is '{line}', want {fn} at e2e_leaks.c:{want_line}", r)


def check_growth(tmp):
    """growth_report:1, automatic snapshots: no leak at exit, one site kept
    growing (keep_step, 1 MiB a step), and it held the most at the peak."""
    r = run("growth", "growth_report:1")
    keep = r.integer("keep_line")
    expect(re.search(r"^cudalloc: no device memory leaks \(", r.err, re.M),
           "no 'no device memory leaks' line: the loop freed everything", r)
    sections = over_time(r)
    g = sections.get("growth")
    expect(g, "no growth section at exit", r)
    head = GROWTH_HEAD.match(g[0])
    expect(head and head.group(1) == "1", f"growth header '{g[0]}', want 1 site", r)
    site = GROWTH_SITE.match(g[1])
    expect(site, f"growth site line '{g[1]}' is not in the documented form", r)
    snaps, rises = int(site.group(5)), int(site.group(6))
    grown = int(site.group(2))
    expect(snaps >= 8 and rises * 2 >= snaps - 1 and grown >= 20 * (1 << 20),
           f"the run is {snaps} snapshots, {rises} rises, {grown} bytes: want >= 8, half rising, >= 20 MiB", r)
    first_frame_is(r, g[2], "keep_step", keep)
    p = sections.get("peak")
    expect(p, "no peak section at exit", r)
    ph, ps = PEAK_HEAD.match(p[0]), PEAK_SITE.match(p[1])
    expect(ph and ps and int(ps.group(1)) == STEPS << 20 and int(ps.group(2)) == STEPS,
           f"peak '{p[0]}' / '{p[1]}': want keep_step's {STEPS} MiB in {STEPS} allocations first", r)
    first_frame_is(r, p[2], "keep_step", keep)
    held = [HELD.match(l) for l in p if l.startswith("held on device")]
    expect(len(held) == 1 and held[0] and int(held[0].group(1)) >= STEPS << 20,
           f"held lines {[l for l in p if l.startswith('held')]}: want device 0's, at least {STEPS} MiB", r)
    return f"{g[1][:60]}...; peak {ph.group(1)} bytes, held {held[0].group(1)}"


def check_marks(tmp):
    """cudalloc_mark() after each step: a snapshot per step, only at marks;
    keep_step grew over every marked step."""
    r = run("growth", "growth_report:1", "marks")
    sections = over_time(r)
    g = sections.get("growth")
    expect(g and GROWTH_HEAD.match(g[0]), f"growth section {g}", r)
    head, site = GROWTH_HEAD.match(g[0]), GROWTH_SITE.match(g[1])
    expect(int(head.group(2)) == STEPS, f"{head.group(2)} snapshots, want {STEPS} (one per mark)", r)
    expect(site and int(site.group(5)) == STEPS and int(site.group(6)) == STEPS - 1
           and int(site.group(2)) == (STEPS - 1) << 20,
           f"growth site '{g[1]}': want {STEPS} snapshots, {STEPS - 1} rises, {STEPS - 1} MiB", r)
    first_frame_is(r, g[2], "keep_step", r.integer("keep_line"))
    return g[1][:80]


def check_steady(tmp):
    """The same loop keeping nothing: no site kept growing."""
    r = run("steady", "growth_report:1")
    sections = over_time(r)
    g = sections.get("growth")
    m = re.match(r"^growth: no site kept growing over 8 snapshots or more \((\d+) snapshot\(s\) taken\)$",
                 g[0] if g else "")
    expect(m and int(m.group(1)) >= 8, f"growth section {g}, want no site (after 8 or more snapshots)", r)
    return g[0]


def check_json(tmp):
    """The JSON exit document carries "peak" and "growth" with frames."""
    r = run("growth", f"growth_report:1,report_format:json,log_path:{tmp}/g.%p.json")
    docs = load_docs(r, os.path.join(tmp, f"g.{r.pid}.json"))
    expect(len(docs) == 1 and docs[0].get("event") == "exit", f"{len(docs)} documents", r)
    d, keep = docs[0], r.integer("keep_line")
    growth, peak = d.get("growth", {}), d.get("peak", {})
    sites = growth.get("sites", [])
    expect(growth.get("found") == 1 and len(sites) == 1 and growth.get("snapshots", 0) >= 8,
           f"growth {json.dumps(growth)[:300]}", r)
    f0 = (sites[0].get("frames") or [{}])[0]
    expect(f0.get("function") == "keep_step" and f0.get("line") == keep
           and sites[0]["to_bytes"] > sites[0]["from_bytes"], f"growth site {json.dumps(sites[0])[:300]}", r)
    top = (peak.get("sites") or [{}])[0]
    held = peak.get("held") or [{}]
    expect(held[0].get("device") == 0 and held[0].get("bytes", 0) >= STEPS << 20
           and isinstance(held[0].get("seconds"), float), f"peak held {held}", r)
    expect(peak.get("bytes", 0) >= STEPS << 20 and top.get("bytes") == STEPS << 20
           and top.get("count") == STEPS and top["frames"][0].get("function") == "keep_step",
           f"peak {json.dumps(peak)[:300]}", r)
    return f"growth {sites[0]['from_bytes']}->{sites[0]['to_bytes']}, peak {peak['bytes']}"


def check_quiet(tmp):
    """By default (no stacks) neither section is printed; with stacks but
    without growth_report, the peak only."""
    r = run("growth", "")
    sections = over_time(r)
    expect(not sections, f"sections {list(sections)} without stacks", r)
    s = run("growth", "backtrace_depth:8")
    sections = over_time(s)
    expect(list(sections) == ["peak"], f"sections {list(sections)} with stacks, want the peak only", s)
    return "nothing without stacks; the peak alone with backtrace_depth:8"


def check_signal(tmp):
    """growth_report:1 alone: SIGUSR1 prints the growth report (the watcher
    runs without stats_signal), and the exit report prints it again."""
    r = run("signal", "growth_report:1")
    heads = [l for l in lines_of(r, r.err) if l.startswith("growth: ")]
    expect(len(heads) == 2, f"{len(heads)} growth sections, want 2 (SIGUSR1, exit): {heads}", r)
    expect(not re.search(r"memory summary", r.err), "a memory summary without stats_signal", r)
    return heads[0]


CHECKS = {
    "growth": check_growth,
    "marks": check_marks,
    "steady": check_steady,
    "json": check_json,
    "quiet": check_quiet,
    "signal": check_signal,
}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "growth_report"))
