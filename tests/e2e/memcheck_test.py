#!/usr/bin/env python3
"""memcheck_test.py [CHECK...]: memcheck:1 (docs/LEAKS.md, "memcheck"), checked
by what e2e_memcheck observes and what the library prints.

Runs tests/e2e/e2e_memcheck (the mock driver's kernel hooks write into
blocks as kernels would) with libcudalloc.so preloaded: each memory error is
found once, named in one line with the block's size and the offset, with
the allocating and freeing frames of the program (function, file, line);
blocks are handed out filled with 0xFF, their red zone set, freed blocks
refilled and held in the quarantine; a clean run finds nothing; the leak
report's exit status rules apply; memcheck:0 prints nothing.

Environment as leak_report_test.py's, with E2E_MEMCHECK_PROG the program.
"""
import os
import re
import sys

import leak_report_test as lr
from leak_report_test import CheckFailed, env_path, expect, lines_of, load_docs, main

PROG = env_path("E2E_MEMCHECK_PROG")
CONF = "memcheck:1,leak_report:0"
BLOCK = 1000
RED_ZONE = 512

OVER = re.compile(r"^memcheck: (\d+) bytes? written past the end of a block of (\d+) bytes"
                  r"(?: \(.*\))? at 0x([0-9a-f]+) on device (\d+), the first (\d+) past it"
                  r"(; the block is still live)?$")
AFTER = re.compile(r"^memcheck: write after free at offset (\d+) of a block of (\d+) bytes"
                   r"(?: \(.*\))? at 0x([0-9a-f]+) on device (\d+): (\d+) bytes? changed in the part "
                   r"checked$")
TOTALS = re.compile(r"^memcheck: (\d+) blocks? checked: (\d+) written past the end, (\d+) "
                    r"written after the free$")
FRAME = re.compile(r"^      #(\d+) in (\S+)(?: (\S+):(\d+))? ")


def run(mode, *args, conf=CONF, expect_rc=0):
    return lr.run(mode, conf, *args, prog=PROG, expect_rc=expect_rc)


def findings(r):
    """The findings: (match, kind, {"allocated at": frames, "freed at": frames})
    in order, and the totals line's numbers."""
    out, totals, cur, section = [], None, None, None
    for line in lines_of(r, r.err):
        m = OVER.match(line) or AFTER.match(line)
        if m:
            cur = (m, "over" if m.re is OVER else "after", {})
            out.append(cur)
            continue
        t = TOTALS.match(line)
        if t:
            totals = tuple(int(x) for x in t.groups())
            continue
        if line.strip() in ("allocated at:", "freed at:") and cur:
            section = line.strip()[:-1]
            cur[2][section] = []
            continue
        f = FRAME.match(line)
        if f and cur and section:
            cur[2][section].append((f.group(2), f.group(3) or "", int(f.group(4) or 0)))
            continue
        expect(False, f"a line memcheck should not print: {line!r}", r)
    expect(totals is not None, "no totals line at exit", r)
    return out, totals


def frame_at(r, frames, function, line):
    expect(any(fn == function and file.endswith("e2e_memcheck.c") and ln == line
               for fn, file, ln in frames),
           f"no frame {function} e2e_memcheck.c:{line} in {frames}", r)


def one(r, kind):
    found, totals = findings(r)
    expect(len(found) == 1, f"{len(found)} findings, want 1", r)
    m, k, stacks = found[0]
    expect(k == kind, f"a finding of kind {k}, want {kind}", r)
    return m, stacks, totals


def check_overflow(tmp):
    """One byte past a 1000-byte block: found at its free, both stacks."""
    r = run("over", "1")
    m, stacks, totals = one(r, "over")
    expect(m.group(1) == "1" and m.group(2) == str(BLOCK) and m.group(5) == "0",
           f"the finding says {m.group(0)!r}", r)
    expect(int(m.group(3), 16) == int(r.one("addr"), 16), "the finding names another address", r)
    frame_at(r, stacks.get("allocated at", []), "make_block", r.integer("alloc_line"))
    frame_at(r, stacks.get("freed at", []), "drop_block", r.integer("free_line"))
    expect(totals == (1, 1, 0), f"totals {totals}, want 1 checked, 1 past the end", r)
    return "1 byte past 1000: one finding, its allocating and freeing lines"


def check_zone_edge(tmp):
    """The red zone's size less one byte past the end: every byte counted."""
    n = RED_ZONE - 1
    r = run("over", str(n))
    m, _, _ = one(r, "over")
    expect(m.group(1) == str(n), f"{m.group(1)} bytes counted, want {n}", r)
    return f"{n} bytes past the end, all counted"


def check_slot(tmp):
    """Through the allocator slot, freed on a stream: found the same way."""
    r = run("slot", "8")
    m, stacks, _ = one(r, "over")
    expect(m.group(1) == "8", f"the finding says {m.group(0)!r}", r)
    frame_at(r, stacks.get("allocated at", []), "mode_slot", r.integer("alloc_line"))
    frame_at(r, stacks.get("freed at", []), "mode_slot", r.integer("free_line"))
    return "8 bytes past a slot block: found, with the slot's calls"


def check_stale(tmp):
    """Through the slot, large freed blocks set to 0xFF only where checked:
    blocks later carved out of the bytes between, written whole, start
    with red zones of 0xFF and end with no finding."""
    r = run("stale")
    got = {k: r.integer(k) for k in ("mid_byte", "head_byte", "zones", "blocks")}
    want = {"mid_byte": 0x44, "head_byte": 0xFF, "zones": 64, "blocks": 64}
    expect(got == want, f"the program saw {got}, want {want}", r)
    found, totals = findings(r)
    expect(not found and totals == (104, 0, 0), f"{len(found)} findings, totals {totals}", r)
    return "middles left as written, 64 red zones 0xFF over them, 104 blocks checked, no finding"


def check_live(tmp):
    """A block never freed, written past its end: found at exit, still live."""
    r = run("live")
    m, stacks, _ = one(r, "over")
    expect(m.group(6) is not None, f"the finding does not say the block is live: {m.group(0)!r}", r)
    frame_at(r, stacks.get("allocated at", []), "make_block", r.integer("alloc_line"))
    expect("freed at" not in stacks, "a live block's finding names a free", r)
    return "found at exit, with its allocation only"


def check_after_free(tmp):
    """A write at offset 4 of a freed 1000-byte block: found, both stacks."""
    r = run("uaf", "4")
    m, stacks, _ = one(r, "after")
    expect(m.group(1) == "4" and m.group(2) == str(BLOCK) and m.group(5) == "4",
           f"the finding says {m.group(0)!r}", r)
    frame_at(r, stacks.get("allocated at", []), "make_block", r.integer("alloc_line"))
    frame_at(r, stacks.get("freed at", []), "drop_block", r.integer("free_line"))
    return "offset 4, 4 bytes: found with both stacks"


def check_large(tmp):
    """A 1 MiB block: its first and last 4 KiB are checked, not its middle."""
    size = 1 << 20
    seen = []
    for off, want in ((0, True), (size - 8, True), (size // 2, False)):
        r = run("bigfree", str(off))
        found, _ = findings(r)
        expect(bool(found) == want,
               f"a write at offset {off} of a freed 1 MiB block: {len(found)} findings", r)
        if want:
            expect(found[0][0].group(1) == str(off), f"the finding says {found[0][0].group(0)!r}", r)
        seen.append(f"{off}: {'found' if want else 'unchecked, as documented'}")
    return "; ".join(seen)


def check_fills(tmp):
    """Handed out 0xFF, red zone 0xFF, freed 0xFF, held from reuse."""
    r = run("fills")
    got = {k: r.integer(k) for k in ("first_byte", "all_fill", "zone_byte", "freed_byte", "reused")}
    want = {"first_byte": 0xFF, "all_fill": 1, "zone_byte": 0xFF, "freed_byte": 0xFF, "reused": 0}
    expect(got == want, f"the program saw {got}, want {want}", r)
    found, _ = findings(r)
    expect(not found, "a finding in a run that wrote only inside its block", r)
    return "0xFF, red zone 0xFF, refilled at free, not reused at once"


def check_churn(tmp):
    """The quarantine's bound (256 MiB): a freed 4 MiB block's place comes
    back once 64 younger frees passed it, not before."""
    r = run("churn")
    again, distinct = r.integer("first_again"), r.integer("distinct")
    expect(again >= 63, f"a freed place came back after {again} frees, inside the quarantine", r)
    expect(distinct < 100, f"{distinct} places for 100 blocks: nothing left the quarantine", r)
    _, totals = findings(r)
    expect(totals[0] == 100, f"{totals[0]} blocks checked, want 100", r)
    return f"the first place seen again at allocation {again}; {distinct} places, 100 checked"


def check_double(tmp):
    """A second free gets the answer a double free gets without memcheck."""
    plain = run("double", conf="leak_report:0")
    r = run("double")
    expect(r.one("second_free") == plain.one("second_free"),
           f"second free {r.one('second_free')} under memcheck, {plain.one('second_free')} without", r)
    return f"second free answers {r.one('second_free')} either way"


def check_clean(tmp):
    """Blocks written only inside: nothing found, every block checked."""
    r = run("clean")
    found, totals = findings(r)
    expect(not found and totals == (20, 0, 0), f"{len(found)} findings, totals {totals}", r)
    return "20 blocks checked, no finding"


def check_reset(tmp):
    """The context reset with a freed block in the quarantine and a live
    one, both written past their end: both found before the memory goes."""
    r = run("reset")
    found, totals = findings(r)
    kinds = sorted(bool(m.group(6)) for m, _, _ in found)
    expect(kinds == [False, True], f"{len(found)} findings {kinds}, want a freed and a live block", r)
    return f"both found before the reset; totals {totals}"


def check_shutdown(tmp):
    """The driver gone before the library's exit report (the static runtime
    and the driver take themselves down from handlers registered at their
    start): the checks at exit ran before, and found the overflow."""
    r = run("shutdown")
    m, _, totals = one(r, "over")
    expect(totals == (1, 1, 0), f"totals {totals}, want the block checked", r)
    return "found before the driver went: " + m.group(0)[len("memcheck: "):60] + "..."


def check_batch(tmp):
    """A batch of blocks leaving the quarantine is checked by one launch of
    the library's gather kernel, not a copy each, and judged the same;
    where the driver cannot load the kernel (MOCKCUDA_JIT=0), or no pinned
    memory is to be had for the copies (MOCKCUDA_PINNED=0: the kernel
    writes only pinned memory), by a copy each, with the same findings."""
    n = 16
    # (environment, launches, copies, module loads)
    cases = (({}, 1, 0, 1), ({"MOCKCUDA_JIT": "0"}, 0, 2 * n, 1),
             ({"MOCKCUDA_PINNED": "0"}, 0, 2 * n, 0))
    for env_add, *want_calls in cases:
        r = lr.run("batch", CONF, str(n), prog=PROG, env_add=env_add)
        found, totals = findings(r)
        addrs = [int(a, 16) for a in r.kv.get("addr", [])]
        got = sorted((int(m.group(3), 16), int(m.group(1))) for m, _, _ in found)
        want = sorted([(addrs[0], 1), (addrs[1], 2)])
        expect(got == want, f"findings {got}, want {want} ({env_add})", r)
        expect(totals == (2 * n, 2, 0), f"totals {totals}, want {2 * n} checked, 2 past the end", r)
        calls = [r.integer("launches"), r.integer("copies"), r.integer("module_loads")]
        expect(calls == want_calls, f"launches, copies, module loads {calls}, want {want_calls} "
               f"({env_add})", r)
    return (f"{2 * n} blocks: one launch (the kernel loaded once); {2 * n} copies without the "
            "kernel or without pinned memory; the same two findings")


def check_exitcode(tmp):
    """leak_exitcode:23: a finding ends the process with 23, a clean run 0."""
    run("over", "1", conf=CONF + ",leak_exitcode:23", expect_rc=23)
    run("clean", conf=CONF + ",leak_exitcode:23", expect_rc=0)
    return "finding exits 23, clean 0"


def json_frame_at(r, frames, function, line):
    expect(any(f.get("function") == function and (f.get("file") or "").endswith("e2e_memcheck.c")
               and f.get("line") == line for f in frames or []),
           f"no frame {function} e2e_memcheck.c:{line} in {frames}", r)


def json_findings(tmp, mode, *args):
    """The run's documents under report_format:json (every line one), its
    memcheck findings and its totals."""
    log = os.path.join(tmp, f"json-{mode}.log")
    r = run(mode, *args, conf=CONF + f",report_format:json,log_path:{log}")
    docs = load_docs(r, log)
    found = [d for d in docs if d.get("event") == "memcheck"]
    totals = [d for d in docs if d.get("event") == "memcheck_summary"]
    expect(len(totals) == 1, f"{len(totals)} memcheck_summary documents, want 1", r)
    expect(len(found) + 1 == len(docs), f"documents other than findings: {docs}", r)
    return r, found, totals[0]


def check_json(tmp):
    """report_format:json: each finding one document, with its kind, block,
    bytes changed, offset and both stacks; the totals one more."""
    r, found, totals = json_findings(tmp, "over", "3")
    expect(len(found) == 1, f"{len(found)} findings, want 1", r)
    f = found[0]
    want = {"kind": "past_end", "live": False, "device": 0, "bytes": BLOCK,
            "changed_bytes": 3, "offset": BLOCK, "past_end": 0}
    got = {k: f.get(k) for k in want}
    expect(got == want, f"the finding is {got}, want {want}", r)
    expect(int(f["address"], 16) == int(r.one("addr"), 16), "the finding names another address", r)
    json_frame_at(r, f["allocated_at"], "make_block", r.integer("alloc_line"))
    json_frame_at(r, f["freed_at"], "drop_block", r.integer("free_line"))
    expect((totals["checked"], totals["past_end"], totals["after_free"]) == (1, 1, 0),
           f"totals {totals}", r)
    r, found, _ = json_findings(tmp, "uaf", "4")
    expect(len(found) == 1 and found[0]["kind"] == "after_free" and found[0]["offset"] == 4
           and found[0]["changed_bytes"] == 4 and "past_end" not in found[0],
           f"the write after free is {found}", r)
    r, found, _ = json_findings(tmp, "live")
    expect(len(found) == 1 and found[0]["live"] is True and found[0]["freed_at"] is None,
           f"the live block's finding is {found}", r)
    json_frame_at(r, found[0]["allocated_at"], "make_block", r.integer("alloc_line"))
    return "past the end, after free and live: one document each, with both stacks"


def check_off(tmp):
    """Without memcheck: nothing printed, nothing found."""
    r = run("over", "1", conf="leak_report:0")
    expect(r.err == "", f"stderr is {r.err!r}, want nothing", r)
    return "silent"


CHECKS = {
    "overflow": check_overflow,
    "zone_edge": check_zone_edge,
    "slot": check_slot,
    "stale": check_stale,
    "live": check_live,
    "after_free": check_after_free,
    "large": check_large,
    "fills": check_fills,
    "churn": check_churn,
    "double": check_double,
    "clean": check_clean,
    "reset": check_reset,
    "shutdown": check_shutdown,
    "batch": check_batch,
    "exitcode": check_exitcode,
    "json": check_json,
    "off": check_off,
}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "memcheck"))
