#!/usr/bin/env python3
"""view_test.py [CHECK...]: the allocation timeline (trace_path) and the
page `cudalloc view` makes of it, checked by content.

Runs tests/e2e/e2e_leaks growth (40 steps, each keeping a 1 MiB block from
keep_step and allocating and freeing 20 temporaries from scratch_step) with
libcudalloc.so preloaded and trace_path set, through leak_report_test.py's
runner, then reads the trace (a JSON array of Chrome trace events), and the
page in a real headless browser (Debian's chromium): it loads with no error
and draws one band per site. Skipped (exit 77) where there is no chromium.
"""
import json
import os
import re
import shutil
import subprocess
import sys

from leak_report_test import CheckFailed, env_path, expect, main, run

COMMAND = env_path("CUDALLOC_COMMAND")
STEPS, SCRATCH = 40, 20


def traced(tmp, conf="backtrace_depth:16"):
    path = os.path.join(tmp, "trace.%p.json")
    r = run("growth", f"{conf},trace_path:{path}")
    real = path.replace("%p", str(r.pid))
    expect(os.path.exists(real), f"no trace at {real}", r)
    with open(real) as f:
        text = f.read()
    r.files[real] = text[:4000]
    return r, real, text


def check_trace(tmp):
    """The trace is one JSON array: the process's name, each allocation as
    an async slice with its bytes and stack, each stack's frames once."""
    r, path, text = traced(tmp)
    try:
        events = json.loads(text)
    except ValueError as e:
        raise CheckFailed(f"the trace is not one JSON array: {e}", [r])
    begins = [e for e in events if e.get("ph") == "b" and e.get("name") == "allocation"]
    ends = [e for e in events if e.get("ph") == "e" and e.get("name") == "allocation"]
    stacks = {e["args"]["id"]: e["args"]["frames"] for e in events
              if e.get("ph") == "M" and e.get("name") == "cudalloc_stack"}
    want = STEPS * (1 + SCRATCH)
    expect(len(begins) == want and len(ends) == want,
           f"{len(begins)} allocations and {len(ends)} frees, want {want} each", r)
    expect({b["id"] for b in begins} >= {e["id"] for e in ends}, "a free of no allocation", r)
    sites = {b["args"]["stack"] for b in begins}
    named = {s: stacks.get(s, [""])[0] for s in sites}
    expect(len(sites) == 2 and any(n.startswith("keep_step ") for n in named.values()) and
           any(n.startswith("scratch_step ") for n in named.values()),
           f"sites {named}: want keep_step's and scratch_step's", r)
    kept = [b for b in begins if named[b["args"]["stack"]].startswith("keep_step ")]
    expect(len(kept) == STEPS and all(b["args"]["bytes"] == 1 << 20 for b in kept),
           f"{len(kept)} kept blocks of {set(b['args']['bytes'] for b in kept)} bytes", r)
    expect(any(e.get("ph") == "M" and e.get("name") == "process_name" for e in events),
           "no process_name", r)
    return f"{len(events)} events: {want} slices, {len(stacks)} stacks"


def check_events(tmp):
    """Each device's counters (every 100 ms and at exit: the held blocks'
    bytes; at each new peak, when it came, the requested or the reserved
    bytes alone), an out-of-memory retry, and a context death, as events.
    The requested peak is the allocations' own, to the byte and the
    microsecond, in a run shorter than a tick; a request the driver refused
    is no peak."""
    r, path, text = traced(tmp, conf="verbose:0")
    events = json.loads(text)
    counters = [e for e in events if e.get("ph") == "C" and e.get("name") == "device 0"]
    sampled = [c for c in counters if "allocated" in c["args"]]
    reserved = [c for c in counters if set(c["args"]) == {"reserved"}]
    requested = [c for c in counters if set(c["args"]) == {"requested"}]
    expect(sampled and all(c["args"]["reserved"] >= c["args"]["allocated"] >=
                           c["args"]["requested"] for c in sampled),
           f"device 0's counters {counters[:2]}", r)
    last = max(sampled, key=lambda c: c["ts"])
    expect(reserved and max(c["args"]["reserved"] for c in reserved) >=
           max(c["args"]["reserved"] for c in sampled) and
           all(c["ts"] <= last["ts"] for c in reserved),
           f"reserved peaks {reserved[:3]} beside the sampled {sampled[:3]}", r)
    live, peak = 0, (0, 0)
    sizes = {}
    for e in sorted((e for e in events if e.get("ph") in ("b", "e") and
                     e.get("name") == "allocation"), key=lambda e: e["ts"]):
        if e["ph"] == "b":
            sizes[e["id"]] = e["args"]["bytes"]
            live += sizes[e["id"]]
            peak = max(peak, (live, -e["ts"]))
        else:
            live -= sizes.pop(e["id"])
    top = max(requested, key=lambda c: c["args"]["requested"], default=None)
    expect(top and top["args"]["requested"] == peak[0] and top["ts"] == -peak[1],
           f"requested peak {top}, want {peak[0]} bytes at {-peak[1]} (from the slices)", r)
    d = os.path.join(tmp, "reset.%p.json")
    r2 = run("reset", f"trace_path:{d}")
    with open(d.replace("%p", str(r2.pid))) as f:
        reset = json.load(f)
    names = [e.get("name") for e in reset if e.get("ph") == "i"]
    expect("context death (its memory gone)" in names, f"instant events {names}", r2)
    d = os.path.join(tmp, "oom.%p.json")
    r3 = run("huge", f"trace_path:{d}", prog=env_path("E2E_REACH_PROG"))
    with open(d.replace("%p", str(r3.pid))) as f:
        oom = json.load(f)
    names3 = [e.get("name") for e in oom if e.get("ph") == "i"]
    expect("out-of-memory retry" in names3, f"instant events of a refused 64 GiB request {names3}",
           r3)
    held = max((e["args"]["reserved"] for e in oom if e.get("ph") == "C"), default=0)
    expect(held < 1 << 30, f"a refused 64 GiB request counted: reserved peaked at {held}", r3)
    return (f"{len(sampled)} counter(s), {len(requested)} requested and {len(reserved)} "
            f"reserved peak(s); {sorted(set(names + names3))}")


def check_unfinished(tmp):
    """A trace without its closing bracket (the process was killed) still
    makes a page."""
    r, path, text = traced(tmp)
    cut = os.path.join(tmp, "cut.json")
    with open(cut, "w") as f:
        f.write(text[: text.rfind("\n]")])
    out = os.path.join(tmp, "cut.html")
    v = subprocess.run(["sh", COMMAND, "view", cut, "-o", out], capture_output=True, text=True)
    expect(v.returncode == 0 and os.path.exists(out),
           f"cudalloc view exited {v.returncode}: {v.stderr.strip()}", r)
    return v.stdout.strip()


# What PyTorch 2.11's snapshot holds (torch.cuda.memory._dump_snapshot), and
# what its readers (torch.cuda._memory_viz) rely on.
SNAPSHOT_KEYS = {"segments", "device_traces", "allocator_settings", "external_annotations"}
SEGMENT_KEYS = {"address", "total_size", "allocated_size", "active_size", "requested_size",
                "device", "stream", "segment_type", "segment_pool_id", "is_expandable",
                "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
ENTRY_KEYS = {"action", "addr", "size", "stream", "time_us", "frames", "compile_context",
              "user_metadata"}
ACTIONS = {"segment_alloc", "alloc", "free_requested", "free_completed", "segment_free",
           "segment_map", "segment_unmap"}


def snapshot_problems(snap):
    """Where a snapshot departs from PyTorch's schema, or from what its
    readers assume (blocks tile their segment; a free follows its alloc)."""
    why = []
    frame_ok = lambda f: (set(f) == {"filename", "line", "name"} and  # noqa: E731
                          isinstance(f["line"], int) and isinstance(f["name"], str))
    if set(snap) != SNAPSHOT_KEYS:
        why.append(f"top-level keys {sorted(snap)}")
    for seg in snap.get("segments", []):
        if set(seg) != SEGMENT_KEYS or any(set(b) != BLOCK_KEYS for b in seg["blocks"]):
            why.append(f"segment keys {sorted(seg)}")
        elif sum(b["size"] for b in seg["blocks"]) != seg["total_size"] or any(
                b["requested_size"] > b["size"] or b["state"] not in
                ("active_allocated", "active_pending_free", "inactive") or
                not all(map(frame_ok, b["frames"])) for b in seg["blocks"]):
            why.append(f"blocks that do not tile segment {seg['address']:#x}")
    for entries in snap.get("device_traces", []):
        live = set()
        for e in entries:
            if set(e) != ENTRY_KEYS or e["action"] not in ACTIONS or \
                    not all(map(frame_ok, e["frames"])):
                why.append(f"trace entry {e}")
                break
            if e["action"] == "alloc":
                live.add(e["addr"])
            elif e["action"] == "free_completed":
                live.discard(e["addr"])
    return why[:3]


def check_snapshot(tmp):
    """`cudalloc view --torch-snapshot`: the trace as PyTorch's memory
    snapshot, round trip through pickle: its schema, every allocation and
    free in the device's trace, the blocks live at the end as its segments,
    the sites named by their frames. The trace is cut halfway (as a process
    killed mid-run leaves it), so that blocks are live at its end."""
    import pickle
    r, path, text = traced(tmp)
    half = os.path.join(tmp, "half.json")
    with open(half, "w") as f:
        f.write(text[: text.rfind("\n", 0, len(text) // 2)])
    out = os.path.join(tmp, "snap.pickle")
    v = subprocess.run(["sh", COMMAND, "view", "--torch-snapshot", out, half],
                       capture_output=True, text=True)
    expect(v.returncode == 0 and os.path.exists(out),
           f"cudalloc view --torch-snapshot exited {v.returncode}: {v.stderr.strip()}", r)
    with open(out, "rb") as f:
        snap = pickle.load(f)
    why = snapshot_problems(snap)
    expect(not why, f"not PyTorch's snapshot schema: {why}", r)
    entries = snap["device_traces"][0]
    count = {a: sum(e["action"] == a for e in entries) for a in ACTIONS}
    expect(0 < count["alloc"] < STEPS * (1 + SCRATCH) and
           count["free_requested"] == count["free_completed"], f"trace entries {count}", r)
    blocks = [b for seg in snap["segments"] for b in seg["blocks"]]
    held = [b for b in blocks if b["state"] == "active_allocated"]
    expect(snap["segments"] and len(held) == count["alloc"] - count["free_completed"] and
           count["segment_alloc"] == len(snap["segments"]) and
           any(b["state"] == "inactive" for b in blocks),
           f"{len(held)} blocks live at the end in {len(snap['segments'])} segments "
           f"({count['segment_alloc']} reserved), trace says "
           f"{count['alloc'] - count['free_completed']} live", r)
    names = {e["frames"][0]["name"] for e in entries if e["frames"]}
    expect(names == {"keep_step", "scratch_step"}, f"innermost frames {names}", r)
    return f"{len(entries)} entries, {len(held)} live blocks, sites {sorted(names)}"


def snapshot_of(tmp, name, conf):
    """A whole run's trace and its snapshot: (run, events, snapshot)."""
    import pickle
    path = os.path.join(tmp, name + ".%p.json")
    r = run("growth", f"{conf},trace_path:{path}")
    real = path.replace("%p", str(r.pid))
    out = os.path.join(tmp, name + ".pickle")
    v = subprocess.run(["sh", COMMAND, "view", "--torch-snapshot", out, real],
                       capture_output=True, text=True)
    expect(v.returncode == 0, f"cudalloc view --torch-snapshot exited {v.returncode}: "
           f"{v.stderr.strip()}", r)
    with open(real) as f:
        events = json.load(f)
    with open(out, "rb") as f:
        return r, events, pickle.load(f)


def check_segments(tmp):
    """The pool's cache as PyTorch's tools read it: a program that freed
    every block leaves segments of inactive blocks, whose bytes are what
    the pool's own reserved counter says at the end, plain and with
    expandable segments (their mapped pages, segment_map entries)."""
    said = []
    for name, conf in (("plain", "verbose:0"), ("expandable", "expandable_segments:1")):
        r, events, snap = snapshot_of(tmp, name, conf)
        why = snapshot_problems(snap)
        expect(not why, f"{name}: not PyTorch's snapshot schema: {why}", r)
        segs = snap["segments"]
        reserved = sum(s["total_size"] for s in segs)
        allocated = sum(s["allocated_size"] for s in segs)
        last = max((e for e in events if e.get("ph") == "C" and "allocated" in
                    (e.get("args") or {})), key=lambda e: e["ts"])["args"]
        actions = {e["action"] for e in snap["device_traces"][0]}
        expect(segs and allocated == 0 and reserved == last["reserved"] > 0 and
               all(b["state"] == "inactive" for s in segs for b in s["blocks"]),
               f"{name}: {len(segs)} segments, {reserved} bytes reserved, {allocated} in "
               f"blocks; the pool said {last}", r)
        # Expandable segments serve the large heap; the small one keeps its
        # 2 MiB segments.
        expandable = name == "expandable"
        kinds = [(s["is_expandable"], s["total_size"]) for s in segs]
        expect(any(x for x, _ in kinds) == expandable and
               all(n <= 2 << 20 for x, n in kinds if expandable and not x) and
               ("segment_map" in actions) == expandable and "segment_alloc" in actions,
               f"{name}: segments (expandable, bytes) {kinds}, actions {actions}", r)
        said.append(f"{name}: {len(segs)} segments, {reserved} bytes cached")
    return "; ".join(said)


def check_live(tmp):
    """A trace still being written, read by the helper's snapshot through
    the slot (view.load_live): a last event cut short by the watcher's
    64 KiB pieces is left out, where a finished trace's is refused."""
    r, path, text = traced(tmp)
    body = text[: text.rfind("\n]")]
    cut = os.path.join(tmp, "writing.json")
    writing = body[: body.rfind('"bytes"')]
    with open(cut, "w") as f:
        f.write(writing)
    view = view_module()
    whole = view.parse(writing[: writing.rfind("\n")], path)  # every line before the cut
    live = view.load_live(cut)
    expect(len(live) == len(whole) > 0,
           f"{len(live)} events read of a trace cut mid-event, {len(whole)} whole lines", r)
    try:
        view.load(cut)
        refused = False
    except ValueError:
        refused = True
    expect(refused, "view.load read a trace cut mid-event without refusing it", r)
    return f"{len(live)} events read while being written, the cut one left out"


def check_bad_traces(tmp):
    """A trace cut in the middle of an event, an older one (no segments) for
    a snapshot, a newer one: one line each naming what is wrong, exit 1, no
    output written."""
    r, path, text = traced(tmp)
    cut = os.path.join(tmp, "cut-mid.json")
    with open(cut, "w") as f:
        f.write(text[: text.rfind('"bytes"')])
    old = os.path.join(tmp, "old.json")
    with open(old, "w") as f:
        f.write("\n".join(l for l in text.split("\n") if '"cudalloc_trace"' not in l and
                          '"segment' not in l))
    new = os.path.join(tmp, "new.json")
    with open(new, "w") as f:
        f.write(text.replace('"version":2', '"version":99'))
    said = []
    for trace, snapshot, want in ((cut, False, "cut off in the middle of line"),
                                  (old, True, "older cudalloc"), (new, False, "newer cudalloc")):
        out = os.path.join(tmp, os.path.basename(trace) + (".pickle" if snapshot else ".html"))
        argv = ["--torch-snapshot", out] if snapshot else ["-o", out]
        v = subprocess.run(["sh", COMMAND, "view", *argv, trace], capture_output=True, text=True)
        expect(v.returncode == 1 and want in v.stderr and v.stderr.count("\n") == 1 and
               not os.path.exists(out), f"{os.path.basename(trace)}: exit {v.returncode}, "
               f"said {v.stderr!r}, {'wrote' if os.path.exists(out) else 'no'} {out}", r)
        said.append(v.stderr.strip())
    o = subprocess.run(["sh", COMMAND, "view", "-o", os.path.join(tmp, "old.html"), old],
                       capture_output=True, text=True)
    expect(o.returncode == 0, f"an older trace as a page: exit {o.returncode}: {o.stderr}", r)
    return " | ".join(said)


def check_overwrite(tmp):
    """An existing file, the default page mem.html included, is never written
    over: one line names --force; with --force the page replaces the file
    and says so."""
    r, path, text = traced(tmp)
    work = os.path.join(tmp, "work")
    os.makedirs(work)
    with open(os.path.join(work, "mem.html"), "w") as f:
        f.write("mine")
    v = subprocess.run(["sh", COMMAND, "view", path], capture_output=True, text=True, cwd=work)
    with open(os.path.join(work, "mem.html")) as f:
        kept = f.read()
    expect(v.returncode == 2 and kept == "mine" and "--force" in v.stderr and
           v.stderr.count("\n") == 1, f"over an existing mem.html: exit {v.returncode}, "
           f"file {'kept' if kept == 'mine' else 'written over'}, said {v.stderr!r}", r)
    n = subprocess.run(["sh", COMMAND, "view", path, "-o", "mem.html", "--force"],
                       capture_output=True, text=True, cwd=work)
    expect(n.returncode == 0 and "mem.html (replaced):" in n.stdout,
           f"--force over the file: exit {n.returncode}, said {n.stdout!r}", r)
    return v.stderr.strip()


def check_refused(tmp):
    """A trace_path that is a symbolic link is refused, with one line; the
    program runs as without it."""
    target = os.path.join(tmp, "elsewhere")
    link = os.path.join(tmp, "link.json")
    os.symlink(target, link)
    r = run("growth", f"trace_path:{link}")
    lines = [l for l in r.err.splitlines() if "trace_path" in l]
    expect(len(lines) == 1 and "no trace" in lines[0], f"lines about the path: {lines}", r)
    expect(not os.path.exists(target), "the link was followed", r)
    return lines[0]


def check_page(tmp):
    """The page, in headless chromium: no error, one band per site, and a
    pointer over the peak's largest band shows its site (keep_step's)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("SKIP view page: no chromium on this machine (apt-get install chromium)")
        sys.exit(77)
    r, path, text = traced(tmp)
    out = os.path.join(tmp, "mem.html")
    v = subprocess.run(["sh", COMMAND, "view", path, "-o", out], capture_output=True, text=True)
    expect(v.returncode == 0, f"cudalloc view exited {v.returncode}: {v.stderr}", r)
    with open(out) as f:
        page = f.read()
    expect("<script src" not in page and "http://" not in page and "https://" not in page,
           "the page reaches for the network", r)
    b = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu",
                        "--enable-logging=stderr", "--v=0", "--user-data-dir=" + tmp + "/profile",
                        "--virtual-time-budget=2000", "--dump-dom", "file://" + out + "#selftest"],
                       capture_output=True, text=True, timeout=120)
    status = re.search(r'id="cudalloc-status">([^<]*)<', b.stdout)
    expect(status, f"no status in the page chromium ran (exit {b.returncode}): "
                   f"{b.stderr[-500:]}", r)
    expect(status.group(1).startswith("bands=2 ") and status.group(1).endswith(" errors=0"),
           f"page status '{status.group(1)}', want bands=2 and errors=0", r)
    hover = re.search(r'tip=&quot;(.*?)&quot;', status.group(1)) or \
        re.search(r'tip="(.*?)"', status.group(1))
    expect(hover and hover.group(1).startswith("keep_step "),
           f"the pointer over the peak's largest band shows {hover and hover.group(1)!r}, "
           f"want keep_step's site", r)
    console = [l for l in b.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    expect(not console, f"console messages: {console[:3]}", r)
    return status.group(1).replace("&quot;", '"')


def view_module():
    """cudalloc's viewer, from the package (PYTHONPATH: the checks' env)."""
    from cudalloc import view
    return view


def check_naming(tmp):
    """A band is named by its innermost frame that is neither a framework's
    allocator nor the CUDA runtime, a Python line first: never after
    PyTorch's caching allocator, as a trace of PyTorch under the library
    once was."""
    label = view_module().label
    torch = "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate " \
            "(libc10_cuda.so+0x5d1f2)"
    cases = [
        (["cudaMalloc (libcudart.so.13+0x4d1e0)", torch,
          "at::native::empty_cuda (libtorch_cuda.so+0x19c1e45)",
          "_conv_forward torch/nn/modules/conv.py:456 (Python)",
          "train_step train.py:31 (Python)"], "_conv_forward torch/nn/modules/conv.py:456"),
        (["cuMemAlloc_v2 (libcudalloc.so+0x9a10)", torch,
          "at::native::empty_cuda (libtorch_cuda.so+0x19c1e45)"],
         "at::native::empty_cuda (libtorch_cuda.so+0x19c1e45)"),
        (["tsl::BFCAllocator::AllocateRaw (libxla_extension.so+0x1)",
          "stream_executor::gpu::GpuExecutor::Allocate (libxla_extension.so+0x2)",
          "jit_step model.py:8 (Python)"], "jit_step model.py:8"),
        (["memalloc site-packages/numba/cuda/cudadrv/driver.py:1400 (Python)",
          "to_device app.py:5 (Python)"], "to_device app.py:5"),
        (["malloc cupy/cuda/memory.pyx:1356 (Python)", "make_batch data.py:77 (Python)"],
         "make_batch data.py:77"),
        (["keep_step e2e_leaks.c:120 (e2e_leaks+0x2a1f)", "main e2e_leaks.c:365 (e2e_leaks+0x23f0)"],
         "keep_step e2e_leaks.c:120 (e2e_leaks+0x2a1f)"),
        (["cudaMalloc (libcudart.so.13+0x4d1e0)"], "cudaMalloc (libcudart.so.13+0x4d1e0)"),
    ]
    for frames, want in cases:
        got = label(frames, 1)
        expect(got == want, f"a band over {frames} is named {got!r}, want {want!r}")
    return f"{len(cases)} stacks named past their allocators"


def check_startup(tmp):
    """Time is counted from the first allocation; how long start-up took is
    said as an offset, from the trace's "program start" instant."""
    r, path, text = traced(tmp)
    events = json.loads(text)
    start = [e["ts"] for e in events if e.get("ph") == "i" and e.get("name") == "program start"]
    first = min((e["ts"] for e in events if e.get("ph") == "b" and
                 e.get("name") == "allocation"), default=None)
    expect(len(start) == 1 and first is not None and start[0] <= first,
           f"program start {start}, first allocation at {first}", r)
    data = view_module().timeline(events, 8)
    expect(data["times"][0] == 0 and data["startup"] == (first - start[0]) / 1e6,
           f"times from {data['times'][:1]}, start-up {data['startup']}, "
           f"want 0 and {(first - start[0]) / 1e6}", r)
    expect(all(name != "program start" for _, name in data["instants"]),
           "the program's start drawn as an event", r)
    return f"first allocation {data['startup']:.3f} s after the program started"


CHECKS = {"naming": check_naming, "startup": check_startup, "trace": check_trace, "events": check_events, "unfinished": check_unfinished,
          "refused": check_refused, "page": check_page, "snapshot": check_snapshot,
          "overwrite": check_overwrite, "segments": check_segments, "bad_traces": check_bad_traces,
          "live": check_live}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "view"))
