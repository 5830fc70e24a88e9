#!/usr/bin/env python3
"""cudalloc view TRACE [-o OUT.html] [--sites N] [--force]: the allocation timeline
that trace_path wrote, as one self-contained HTML page (no network: the
data and the script are inline): device memory live over time, stacked by
allocation site (the N that held the most at their peak, the rest as
"other"), the peak marked; hovering a band shows its site's stack (Python
lines too).

cudalloc view --torch-snapshot OUT.pickle TRACE: the same trace as a PyTorch
memory snapshot (the dict torch.cuda.memory._dump_snapshot pickles), for
PyTorch's memory viewer and torch.cuda._memory_viz, whatever the program
was: the pool's segments and what they cache, as PyTorch's own show.

An existing OUT is never written over unless --force says so. Standard
library only.
"""
import argparse
import bisect
import html
import json
import os
import pickle
import re
import sys


TRACE_VERSION = 2  # timeline/trace.h's CA_TRACE_VERSION: segments recorded


def load(path):
    """The trace's events. The array's closing bracket is optional (a
    process that died mid-run left none); a last event cut short (it died
    while writing it) is refused, naming the line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse(f.read(), path)


def load_live(path):
    """The events of a trace its process is still writing: the watcher
    writes the file in pieces of 64 KiB, which may end inside an event, so
    a last line cut short is left out, not refused."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        return parse(text, path)
    except ValueError:
        return parse(text[:text.rfind("\n")], path)


def parse(text, path):
    """load()'s events from the trace's text."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(text.rstrip().rstrip(",") + "\n]")
    except ValueError as e:
        lines = text.rstrip().split("\n")
        if e.lineno >= len(lines) and not lines[-1].rstrip().endswith(("}", "},", "]")):
            n = len(lines)
            raise ValueError(
                "cut off in the middle of line %d (the program was killed while writing "
                "it?); the %d lines before it are whole: head -n %d %s > whole.json, "
                "then view whole.json" % (n, n - 1, n - 1, path)) from None
        raise ValueError("not a cudalloc trace (%s)" % e) from None


def trace_version(events):
    """The trace's format: its "cudalloc_trace" event's, else 1 (allocations
    alone, before segments were recorded)."""
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "cudalloc_trace":
            return int((e.get("args") or {}).get("version", 0))
    return 1


def check_version(events, snapshot):
    """Refuses a trace this view cannot read right: a newer format, or, for
    a snapshot, one without the pool's segments."""
    version = trace_version(events)
    if version > TRACE_VERSION:
        raise ValueError("written by a newer cudalloc (trace format %d; this view reads "
                         "up to %d): view it with that version" % (version, TRACE_VERSION))
    if snapshot and version < TRACE_VERSION:
        raise ValueError("written by an older cudalloc (trace format %d, which records no "
                         "segments, so a snapshot would show no cache): record it again "
                         "with this version, or view it as a page" % version)


# Frames that allocate on someone else's behalf: the CUDA runtime and
# driver, this library, and the frameworks' own allocators (PyTorch's c10,
# XLA's BFC allocator and stream executor, CuPy's and numba's memory
# managers). A band is named past them.
ALLOCATOR_RE = re.compile(
    r"\((?:libcudart|libcuda|libcudalloc|libc10_cuda|libc10)\.so[^)]*\)$"
    r"|^(?:c10::|tsl::|stream_executor::|xla::.*Allocator|cuMem|cudaMalloc|cudaFree)"
    r"|Allocator::|(?:cupy|numba)[/.]cuda[/.](?:memory|cudadrv)")


def label(frames, stack):
    """What a band is called: its innermost frame that is neither a
    framework's allocator nor the CUDA runtime, a Python line first (the
    user's), else the first frame the report shows."""
    own = [f for f in frames if not ALLOCATOR_RE.search(f)]
    for f in own:
        if f.endswith(" (Python)"):
            return f[: -len(" (Python)")]
    if own or frames:
        return (own or frames)[0]
    return "allocations without a stack" if not stack else "stack %s" % stack


def timeline(events, nsites):
    """Sites (name, frames, values per time), times (s), the peak and each
    device's reserved bytes, from the allocations' async slices. Stacks
    with the same label are one site."""
    stacks, live, changes = {}, {}, []
    for e in events:
        ph, args = e.get("ph"), e.get("args") or {}
        if ph == "M" and e.get("name") == "cudalloc_stack":
            stacks[args.get("id")] = args.get("frames") or []
    site_of, frames_of = {}, {}
    for sid, frames in stacks.items():
        site_of[sid] = label(frames, sid)
        frames_of.setdefault(site_of[sid], frames)
    for e in allocations(events):
        key = (e.get("pid"), e.get("id"))
        if e["ph"] == "b":
            args = e.get("args") or {}
            sid = args.get("stack", 0)
            site, size = site_of.get(sid) or label([], sid), int(args.get("bytes", 0))
            live[key] = (site, size)
            changes.append((e["ts"], site, size))
        elif key in live:
            site, size = live.pop(key)
            changes.append((e["ts"], site, -size))
    # Each site's live bytes after each change; its peak; the total's peak.
    current, peak_of, total, peak = {}, {}, 0, (0, 0)
    for ts, site, delta in changes:
        current[site] = current.get(site, 0) + delta
        peak_of[site] = max(peak_of.get(site, 0), current[site])
        total += delta
        if total > peak[1]:
            peak = (ts, total)
    top = sorted(peak_of, key=lambda s: -peak_of[s])[:nsites]
    names = {s: s for s in top}
    # Sampled at most 2,000 times, always at the peak.
    t0 = changes[0][0] if changes else 0
    step = max(1, len(changes) // 2000)
    times, values = [], {s: [] for s in top + ["other"]}
    current = {}
    for i, (ts, site, delta) in enumerate(changes):
        current[site] = current.get(site, 0) + delta
        if i % step and ts != peak[0] and i != len(changes) - 1:
            continue
        times.append((ts - t0) / 1e6)
        rest = sum(v for s, v in current.items() if s not in names)
        for s in top:
            values[s].append(current.get(s, 0))
        values["other"].append(rest)
    sites = [{"name": names[s], "frames": frames_of.get(s, []), "values": values[s]}
             for s in top]
    if any(values["other"]):
        sites.append({"name": "other sites", "frames": [], "values": values["other"]})
    started = [e["ts"] for e in events
               if e.get("ph") == "i" and e.get("name") == "program start" and "ts" in e]
    reserved = {}
    for e in events:
        if e.get("ph") == "C" and "ts" in e:
            reserved.setdefault(e.get("name", "device"), []).append(
                [(e["ts"] - t0) / 1e6, (e.get("args") or {}).get("reserved", 0)])
    for points in reserved.values():
        points.sort()  # a peak's counter comes when it is seen, stamped when it came
    return {"sites": sites, "times": times, "reserved": reserved,
            "peak": {"t": (peak[0] - t0) / 1e6, "bytes": peak[1]},
            # Start-up, before the first allocation: an offset, not drawn.
            "startup": (t0 - started[0]) / 1e6 if started and changes else None,
            "instants": [[(e["ts"] - t0) / 1e6, e.get("name", "")] for e in events
                         if e.get("ph") == "i" and "ts" in e
                         and e.get("name") not in ("program start", "segment map",
                                                   "segment unmap")]}


# A frame as the library names it: "fn file:line (module+0x..)", "fn
# file:line (Python)", "fn (module+0x..)" or "0x.. (module+0x..)".
FRAME_RE = re.compile(r"^(?P<name>\S+)(?: (?P<file>\S+):(?P<line>\d+))?(?: \((?P<where>[^)]*)\))?$")


def torch_frame(text):
    """One frame as PyTorch's snapshot holds it: filename, line, name."""
    m = FRAME_RE.match(text)
    if not m:
        return {"filename": "??", "line": 0, "name": text}
    where = (m.group("where") or "??").split("+")[0]
    return {"filename": m.group("file") or where, "line": int(m.group("line") or 0),
            "name": m.group("name")}


def allocations(events):
    """The allocations' async slices, in time order (a trace's file order
    where times tie: a segment's reservation before the block it serves)."""
    return sorted((e for e in events if e.get("ph") in ("b", "e") and "ts" in e
                   and e.get("name", "allocation") == "allocation"), key=lambda e: e["ts"])


def torch_block(addr, size, requested, state, frames):
    return {"address": addr, "size": size, "requested_size": requested, "state": state,
            "frames": frames}


def torch_segment(device, addr, size, blocks, expandable):
    """A segment of PyTorch's snapshot: `blocks` (address, size, frames) are
    the live ones inside it; the bytes between them are its cache."""
    tiled, at = [], addr
    for a, n, frames in sorted(blocks, key=lambda b: b[0]):
        n = min(n, addr + size - a)
        if a > at:
            tiled.append(torch_block(at, a - at, 0, "inactive", []))
        tiled.append(torch_block(a, n, n, "active_allocated", frames))
        at = a + n
    if at < addr + size:
        tiled.append(torch_block(at, addr + size - at, 0, "inactive", []))
    held = sum(b["size"] for b in tiled if b["state"] == "active_allocated")
    return {"address": addr, "total_size": size, "allocated_size": held,
            "active_size": held, "requested_size": held, "device": device, "stream": 0,
            "segment_type": "small" if size <= (2 << 20) else "large",
            "segment_pool_id": (0, 0), "is_expandable": expandable,
            "frames": tiled[0]["frames"] if len(tiled) == 1 else [], "blocks": tiled}


def mapped_runs(pages):
    """Maximal runs of mapped pages, from (address, bytes) mappings: the
    segments an expandable range shows as, as PyTorch's do."""
    runs = []
    for a, n in sorted(pages.items()):
        if runs and runs[-1][0] + runs[-1][1] == a:
            runs[-1][1] += n
        else:
            runs.append([a, n])
    return runs


def torch_snapshot(events):
    """The trace as a PyTorch memory snapshot: each device's allocations and
    frees (a free is requested and completed at once: the program's view)
    and the pool's segments reserved, released, mapped and unmapped, as
    trace entries; as the snapshot's state, the segments the pool held at
    the trace's end, the live blocks and the cache between them tiling
    each (a live block of no recorded segment, one of its own). Frames
    innermost first, as PyTorch's."""
    stacks = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "M" and e.get("name") == "cudalloc_stack":
            stacks[args.get("id")] = [torch_frame(f) for f in args.get("frames") or []]
    traces, live, segments, pages = {}, {}, {}, {}

    def entry(device, action, addr, size, ts, frames):
        traces.setdefault(device, []).append({
            "action": action, "addr": addr, "size": size, "stream": 0, "time_us": int(ts),
            "frames": frames, "compile_context": "", "user_metadata": ""})

    for e in sorted((e for e in events if "ts" in e and (
            e.get("ph") in ("b", "e") or e.get("name") in ("segment map", "segment unmap"))),
            key=lambda e: e["ts"]):
        args, name = e.get("args") or {}, e.get("name", "allocation")
        if name in ("segment map", "segment unmap"):
            device, addr, size = int(args.get("device", 0)), int(str(args.get("addr")), 0), \
                int(args.get("bytes", 0))
            mapped = pages.setdefault(device, {})
            page = 2 << 20
            for a in range(addr, addr + size, page):
                if name == "segment map":
                    mapped[a] = min(page, addr + size - a)
                else:
                    mapped.pop(a, None)
            entry(device, name.replace(" ", "_"), addr, size, e["ts"], [])
        elif name == "segment":
            key = (e.get("pid"), e.get("id"))
            if e["ph"] == "b":
                device, addr, size = (int(args.get("device", 0)), int(str(e.get("id")), 0),
                                      int(args.get("bytes", 0)))
                segments[key] = (device, addr, size)
                entry(device, "segment_alloc", addr, size, e["ts"], [])
            elif key in segments:
                device, addr, size = segments.pop(key)
                entry(device, "segment_free", addr, size, e["ts"], [])
        elif name == "allocation":
            key = (e.get("pid"), e.get("id"))
            if e["ph"] == "b":
                block = {"addr": int(str(e.get("id")), 0), "size": int(args.get("bytes", 0)),
                         "device": int(args.get("device", 0)),
                         "frames": stacks.get(args.get("stack"), [])}
                live[key] = block
                actions = ("alloc",)
            elif key in live:
                block = live.pop(key)
                actions = ("free_requested", "free_completed")
            else:
                continue
            for action in actions:
                entry(block["device"], action, block["addr"], block["size"], e["ts"],
                      block["frames"])
    held = [(d, a, n, False) for d, a, n in segments.values()]
    held += [(d, a, n, True) for d, mapped in pages.items() for a, n in mapped_runs(mapped)]
    held.sort()
    inside = {i: [] for i in range(len(held))}
    alone = []
    for b in sorted(live.values(), key=lambda b: (b["device"], b["addr"])):
        i = bisect.bisect_right(held, (b["device"], b["addr"], float("inf"), True)) - 1
        if i >= 0 and held[i][0] == b["device"] and b["addr"] < held[i][1] + held[i][2]:
            inside[i].append((b["addr"], b["size"], b["frames"]))
        else:
            alone.append(torch_segment(b["device"], b["addr"], b["size"],
                                       [(b["addr"], b["size"], b["frames"])], False))
    snap_segments = [torch_segment(d, a, n, inside[i], x) for i, (d, a, n, x) in enumerate(held)]
    snap_segments = sorted(snap_segments + alone, key=lambda s: (s["device"], s["address"]))
    devices = list(traces) + [s["device"] for s in snap_segments] + [0]
    return {"segments": snap_segments,
            "device_traces": [traces.get(d, []) for d in range(max(devices) + 1)],
            "allocator_settings": {"allocator": "cudalloc (from its trace_path)"},
            "external_annotations": []}


PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>cudalloc: %(title)s</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 16px; margin: 0 0 8px; }
#chart { border: 1px solid #ccc; }
#tip { position: absolute; display: none; background: #fffff0; border: 1px solid #999;
       padding: 6px 8px; font: 12px monospace; white-space: pre; pointer-events: none; }
#legend span { display: inline-block; margin-right: 14px; }
#legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
#cudalloc-status { color: #888; }
</style></head><body>
<h1>Device memory live over time, by allocation site: %(title)s</h1>
<canvas id="chart" width="1100" height="480"></canvas>
<div id="legend"></div>
<div id="tip"></div>
<pre id="cudalloc-status">loading</pre>
<script>
var errors = 0;
window.onerror = function () { errors++; };
var DATA = %(data)s;
(function () {
  var colors = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  var cv = document.getElementById("chart"), cx = cv.getContext("2d");
  var W = cv.width, H = cv.height, L = 80, R = 20, T = 20, B = 40;
  var t = DATA.times, n = t.length, sites = DATA.sites;
  var tmax = n ? Math.max(t[n - 1], 1e-6) : 1, ymax = Math.max(DATA.peak.bytes, 1);
  function X(s) { return L + (W - L - R) * s / tmax; }
  function Y(b) { return H - B - (H - T - B) * b / ymax; }
  function fmt(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < 4) { b /= 1024; i++; }
    return (i ? b.toFixed(1) : b) + " " + u[i];
  }
  var base = new Array(n).fill(0), bands = [];
  sites.forEach(function (s, k) {
    var top = s.values.map(function (v, i) { return base[i] + v; });
    cx.beginPath();
    for (var i = 0; i < n; i++) cx.lineTo(X(t[i]), Y(top[i]));
    for (var j = n - 1; j >= 0; j--) cx.lineTo(X(t[j]), Y(base[j]));
    cx.closePath();
    cx.fillStyle = colors[k %% colors.length];
    cx.fill();
    bands.push({site: s, lo: base.slice(), hi: top});
    base = top;
  });
  cx.strokeStyle = "#333"; cx.fillStyle = "#333";
  cx.beginPath(); cx.moveTo(L, T); cx.lineTo(L, H - B); cx.lineTo(W - R, H - B); cx.stroke();
  for (var g = 0; g <= 4; g++) {
    cx.fillText(fmt(ymax * g / 4), 4, Y(ymax * g / 4) + 4);
    cx.fillText((tmax * g / 4).toFixed(2) + " s", X(tmax * g / 4) - 12, H - B + 16);
  }
  cx.fillText("time since the first allocation" + (DATA.startup === null ? "" :
              ", which came " + DATA.startup.toFixed(2) + " s after the program started"),
              L, H - 6);
  cx.strokeStyle = "#c00"; cx.setLineDash([4, 3]);
  cx.beginPath(); cx.moveTo(X(DATA.peak.t), T); cx.lineTo(X(DATA.peak.t), H - B); cx.stroke();
  cx.setLineDash([]); cx.fillStyle = "#c00";
  cx.fillText("peak " + fmt(DATA.peak.bytes) + " at " + DATA.peak.t.toFixed(2) + " s",
              Math.min(X(DATA.peak.t) + 4, W - 200), T + 10);
  var legend = document.getElementById("legend");
  sites.forEach(function (s, k) {
    var e = document.createElement("span");
    e.innerHTML = '<i style="background:' + colors[k %% colors.length] + '"></i>';
    e.appendChild(document.createTextNode(s.name));
    legend.appendChild(e);
  });
  var tip = document.getElementById("tip");
  cv.addEventListener("mousemove", function (ev) {
    var r = cv.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
    var s = (px - L) / (W - L - R) * tmax, i = 0;
    while (i + 1 < n && t[i + 1] <= s) i++;
    if (i + 1 < n && t[i + 1] - s < s - t[i]) i++; /* the nearest sample */
    var b = ymax * (H - B - py) / (H - T - B), hit = null;
    bands.forEach(function (band) { if (b >= band.lo[i] && b < band.hi[i]) hit = band; });
    if (!hit || px < L) { tip.style.display = "none"; return; }
    tip.textContent = hit.site.name + "\\n" + fmt(hit.hi[i] - hit.lo[i]) + " live at " +
        t[i].toFixed(3) + " s\\n\\n" + (hit.site.frames.join("\\n") || "(no stack)");
    tip.style.left = (ev.pageX + 12) + "px"; tip.style.top = (ev.pageY + 12) + "px";
    tip.style.display = "block";
  });
  var status = "bands=" + bands.length + " points=" + n;
  if (location.hash === "#selftest" && n) {
    /* What a pointer over the middle of the tallest band at the peak shows. */
    var i = t.indexOf(DATA.peak.t), best = null;
    if (i < 0) i = n - 1;
    bands.forEach(function (band) {
      if (!best || band.hi[i] - band.lo[i] > best.hi[i] - best.lo[i]) best = band;
    });
    var r = cv.getBoundingClientRect();
    cv.dispatchEvent(new MouseEvent("mousemove", {
      clientX: r.left + X(t[i]), clientY: r.top + Y((best.lo[i] + best.hi[i]) / 2)}));
    status += " tip=" + JSON.stringify(tip.style.display === "block" ?
                                       tip.textContent.split("\\n")[0] : "");
  }
  document.getElementById("cudalloc-status").textContent = status + " errors=" + errors;
})();
</script></body></html>
"""


def write_snapshot(path, snap, replaced):
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    entries = sum(len(t) for t in snap["device_traces"])
    segs = snap["segments"]
    print("cudalloc view: %s%s: a PyTorch memory snapshot, %d trace entries; at the end "
          "%d segments, %d bytes reserved, %d in live blocks (open it at "
          "pytorch.org/memory_viz)" % (
              path, " (replaced)" if replaced else "", entries, len(segs),
              sum(s["total_size"] for s in segs), sum(s["allocated_size"] for s in segs)))
    return 0


def main(argv):
    ap = argparse.ArgumentParser(prog="cudalloc view", description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", help="the page (default mem.html)")
    ap.add_argument("--sites", type=int, default=8, help="sites drawn apart (default 8)")
    ap.add_argument("--torch-snapshot", metavar="OUT.pickle",
                    help="write a PyTorch memory snapshot instead of the page")
    ap.add_argument("--force", action="store_true",
                    help="write over the page or snapshot where the file exists")
    a = ap.parse_args(argv[1:])
    out = a.torch_snapshot or a.output or "mem.html"
    # Refused before the trace is read: a long trace costs time, a lost
    # page someone's work.
    replaced = os.path.lexists(out)
    if replaced and not a.force:
        print("cudalloc: %s exists: add --force to write over it" % out, file=sys.stderr)
        return 2
    try:
        events = load(a.trace)
        check_version(events, bool(a.torch_snapshot))
        if a.torch_snapshot:
            return write_snapshot(out, torch_snapshot(events), replaced)
        data = timeline(events, max(1, a.sites))
    except (OSError, ValueError) as e:
        print("cudalloc: %s: %s" % (a.trace, e), file=sys.stderr)
        return 1
    blob = json.dumps(data).replace("</", "<\\/")  # no early end of the script
    with open(out, "w", encoding="utf-8") as f:
        f.write(PAGE % {"title": html.escape(a.trace), "data": blob})
    print("cudalloc view: %s%s: %d site band(s), peak %d bytes at %.3f s" % (
        out, " (replaced)" if replaced else "", len(data["sites"]), data["peak"]["bytes"],
        data["peak"]["t"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
