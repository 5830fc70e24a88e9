#!/usr/bin/env python3
"""torch_snapshot_read.py SNAPSHOT FRAME: PyTorch's own readers of a memory
snapshot (torch.cuda._memory_viz) on the one `cudalloc view --torch-snapshot`
wrote: the statistics (`stats`), the trace in Python's words (`trace`), and
the folded stacks behind the `segments` and `memory` flame graphs (their
command-line forms fetch flamegraph.pl from the web to draw them, which the
GPU machine cannot reach, so the stacks are taken as they are). Each must run
without error, and the memory stacks must hold FRAME ("file:line:function",
as _memory_viz names a frame). Prints one PASS or FAIL line.
"""
import pickle
import sys

from torch.cuda import _memory_viz as viz


def main(argv):
    path, frame = argv[1], argv[2]
    with open(path, "rb") as f:
        snap = pickle.load(f)
    problems = []
    stats = viz.segsum(snap)
    if "total_reserved" not in stats:
        problems.append("stats printed no total_reserved")
    trace = viz.trace(snap)
    entries = sum(len(t) for t in snap["device_traces"])
    if "%d entries" % entries not in trace:
        problems.append("trace does not count its %d entries" % entries)
    folded = viz.segments(snap, format_flamegraph=str)
    memory = viz.memory(snap, format_flamegraph=str)
    if not folded.strip() or not memory.strip():
        problems.append("no segments or memory stacks")
    if frame not in memory:
        problems.append("the memory stacks never name %s" % frame)
    lines = len(memory.splitlines())
    if problems:
        print("torch_snapshot: FAIL " + "; ".join(problems))
        return 1
    print("torch_snapshot: PASS stats, trace (%d entries), segments and memory "
          "(%d stacks) read; %s named" % (entries, lines, frame))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
