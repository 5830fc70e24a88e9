#!/usr/bin/env python3
"""py_slot_test.py [CHECK...]: the Python helper's framework plug-ins,
cudalloc.torch.use() and cudalloc.cupy.use(), in front of the mock driver,
with the library loaded only through them (nothing preloaded).

No GPU and neither framework here: each check puts a stand-in package on
the path that does what the framework does with the slot (PyTorch's
CUDAPluggableAllocator loads the .so with ctypes and calls the two named
functions with size, device and stream; CuPy calls the allocator function
and drops the memory's owner when it frees). Checked: the slot is the
library's pair, a block freed on a stream comes back on that stream at
once, another stream gets other memory while the first has the block, the
library's API (loaded, stats, report) reaches the plugged library, and the
block left unfreed is reported (at exit under PyTorch's stand-in; CuPy's
frees its blocks as Python exits, so report() lists the live one).
"""
import os
import re
import subprocess
import sys
import tempfile

from leak_report_test import MOCK_DIR, PRELOAD, CheckFailed, expect, main

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "scripts", "python")  # the package `cudalloc`

TORCH_STANDIN = r'''
import ctypes, types
calls = []
class CUDAPluggableAllocator(object):
    def __init__(self, path, alloc_name, free_name):
        lib = ctypes.CDLL(path)
        self.alloc = getattr(lib, alloc_name)
        self.alloc.restype = ctypes.c_void_p
        self.alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        self.free = getattr(lib, free_name)
        self.free.restype = None
        self.free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        calls.append(("allocator", path, alloc_name, free_name))
def change_current_allocator(a):
    calls.append(("current", a))
def _refusing(name):
    def fn(*args):
        raise RuntimeError("CUDAPluggableAllocator does not yet support " + name)
    return fn
_C = types.SimpleNamespace(
    _cuda_memorySnapshot=_refusing("getSnapshot"),
    _cuda_record_memory_history=_refusing("recordHistory"),
    _cuda_memoryStats=_refusing("getDeviceStats"),
    _cuda_resetPeakMemoryStats=_refusing("resetPeakStats"),
    _cuda_resetAccumulatedMemoryStats=_refusing("resetAccumulatedStats"),
    _cuda_emptyCache=lambda: calls.append(("emptyCache",)))
class Tensor(object):
    def record_stream(self, stream):
        calls.append(("record_stream_dropped",))
class _Stream(object):
    def __init__(self, handle):
        self.cuda_stream, self.device = handle, types.SimpleNamespace(index=0)
class _Graph(object):
    def capture_begin(self, pool=None, capture_error_mode="global"):
        calls.append(("capture_begin",))
    def capture_end(self):
        calls.append(("capture_end",))
    def reset(self):
        calls.append(("reset",))
# torch.cuda.memory's history and snapshot functions, as PyTorch 2.11 has
# them: each calls torch._C at the call.
import pickle, sys as _sys
def _record_memory_history(enabled="all", context="all", stacks="all",
                           max_entries=_sys.maxsize, device=None):
    _C._cuda_record_memory_history(enabled, context, stacks, max_entries, False,
                                   False, False)
def _snapshot(device=None):
    return _C._cuda_memorySnapshot(None)
def memory_snapshot(mempool_id=None):
    return _C._cuda_memorySnapshot(mempool_id)["segments"]
def _dump_snapshot(filename="dump_snapshot.pickle"):
    s = _snapshot()
    with open(filename, "wb") as f:
        pickle.dump(s, f)
cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=change_current_allocator,
    _record_memory_history=_record_memory_history, _snapshot=_snapshot,
    memory_snapshot=memory_snapshot, _dump_snapshot=_dump_snapshot),
    graphs=types.SimpleNamespace(CUDAGraph=_Graph), current_stream=lambda: _current[0])
_current = [None]
'''

CUPY_STANDIN = r'''
import types
state = {"stream": 0, "allocator": None}
class OutOfMemoryError(Exception):
    pass
class UnownedMemory(object):
    def __init__(self, ptr, size, owner, device_id):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id
class MemoryPointer(object):
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset
class Device(object):
    id = 0
class Stream(object):
    @property
    def ptr(self):
        return state["stream"]
def get_current_stream():
    return Stream()
def set_allocator(fn):
    state["allocator"] = fn
cuda = types.SimpleNamespace(Device=Device, get_current_stream=get_current_stream,
    set_allocator=set_allocator, memory=types.SimpleNamespace(
        OutOfMemoryError=OutOfMemoryError, UnownedMemory=UnownedMemory,
        MemoryPointer=MemoryPointer))
'''

# A context and two streams of the mock, as the framework would have.
PROLOGUE = r'''
import ctypes, gc, sys
import cudalloc
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
s1, s2 = ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuStreamCreate(ctypes.byref(s1), 0) == 0
assert cuda.cuStreamCreate(ctypes.byref(s2), 0) == 0
print("loaded_before=%d" % cudalloc.loaded())
'''

TORCH_PROGRAM = PROLOGUE + r'''
import torch
a = cudalloc.torch.use()
print("slot=%s,%s" % (torch.calls[0][2], torch.calls[0][3]))
print("current=%d" % (torch.calls[1][1] is a))
p = a.alloc(1 << 20, 0, s1)
q = a.alloc(1 << 20, 0, s2)  # holds the rest of the segment
a.free(p, 1 << 20, 0, s1)
r = a.alloc(1 << 20, 0, s1)
print("same_stream=%d" % (r == p))
print("loaded=%d allocs=%d" % (cudalloc.loaded(), cudalloc.stats(0)["allocs"]))
# PyTorch's memory functions read torch._C: the library's figures answer.
big = a.alloc(64 << 20, 0, s1)
m = torch._C._cuda_memoryStats(0)
print("allocated_now=%d" % m["allocated_bytes"]["all"]["current"])
print("reserved_now=%d" % m["reserved_bytes"]["all"]["current"])
a.free(big, 64 << 20, 0, s1)
torch._C._cuda_resetPeakMemoryStats(0)
m = torch._C._cuda_memoryStats(0)
print("peak_after_reset=%d" % m["allocated_bytes"]["all"]["peak"])
torch._C._cuda_emptyCache()
m = torch._C._cuda_memoryStats(0)
print("reserved_after_empty=%d" % m["reserved_bytes"]["all"]["current"])
print("empty_passed_on=%d" % (("emptyCache",) in torch.calls))
torch._C._cuda_resetAccumulatedMemoryStats(0)
m = torch._C._cuda_memoryStats(0)
print("allocated_total_after_reset=%d" % m["allocated_bytes"]["all"]["allocated"])
print("keys=%s" % ",".join(sorted(k for k in m if not isinstance(m[k], dict))))
# What memory_summary() reads: a StatArray's three pools, or a Stat alone.
shape = {k: sorted(v) for k, v in m.items() if isinstance(v, dict)}
print("arrays=%s" % ",".join(sorted(k for k, v in shape.items() if v == ["all", "large_pool", "small_pool"])))
print("stats=%s" % ",".join(sorted(k for k, v in shape.items() if v == ["allocated", "current", "freed", "peak"])))
# record_stream reaches the library: the block's free then waits on s2.
class Storage(object):
    def data_ptr(self):
        return q
class Dev(object):
    index = 0
class T(torch.Tensor):
    is_cuda = True
    device = Dev()
    def untyped_storage(self):
        return Storage()
class S(object):
    cuda_stream = s2.value
T().record_stream(S())
# A graph's capture keeps its blocks from everyone else until reset().
torch._current[0] = torch._Stream(s2.value)
g = torch.cuda.graphs.CUDAGraph()
g.capture_begin()
held = a.alloc(8 << 20, 0, s2)
a.free(held, 8 << 20, 0, s2)
g.capture_end()
again = a.alloc(8 << 20, 0, s2)
print("graph_kept=%d" % (again != held))
a.free(again, 8 << 20, 0, s2)
live = cudalloc.stats(0)["blocks"]["current"]
g.reset()
print("graph_released=%d" % (cudalloc.stats(0)["blocks"]["current"] == live - 1))
print("graph_calls=%s" % ",".join(c[0] for c in torch.calls if c[0] in
                                  ("capture_begin", "capture_end", "reset")))
a.free(q, 1 << 20, 0, s1)  # r stays: reported at exit
'''

# PyTorch's documented recipe for memory snapshots, through the slot.
HISTORY_PROGRAM = PROLOGUE + r'''
import os, pickle, torch
a = cudalloc.torch.use()
try:
    torch.cuda.memory.memory_snapshot()
    print("before=answered")
except RuntimeError as e:
    print("before=%s" % e)
torch.cuda.memory._record_memory_history(max_entries=100000)
blocks = [a.alloc(n << 20, 0, s1) for n in (1, 4, 32)]
for p, n in zip(blocks, (1, 4, 32)):
    a.free(p, n << 20, 0, s1)
kept = a.alloc(2 << 20, 0, s1)
torch.cuda.memory._dump_snapshot(sys.argv[1])
torch.cuda.memory._record_memory_history(enabled=None)
after = a.alloc(8 << 20, 0, s1)  # history off: in the segments, no entry
segments = torch.cuda.memory.memory_snapshot()
with open(sys.argv[1], "rb") as f:
    snap = pickle.load(f)
entries = snap["device_traces"][0]
print("actions=%s" % ",".join(sorted(set(e["action"] for e in entries))))
print("allocs=%s" % ",".join(str(e["size"] >> 20) for e in entries if e["action"] == "alloc"))
held = lambda segs: sorted(b["size"] >> 20 for s in segs for b in s["blocks"]
                           if b["state"] == "active_allocated")
print("held=%s" % ",".join(map(str, held(snap["segments"]))))
print("cached=%d" % (sum(s["total_size"] for s in snap["segments"]) >
                     sum(s["allocated_size"] for s in snap["segments"])))
print("reserved_matches=%d" % (sum(s["total_size"] for s in snap["segments"]) ==
                               cudalloc.stats(0)["reserved_bytes"]["current"]))
print("held_later=%s" % ",".join(map(str, held(segments))))
'''

CUPY_PROGRAM = PROLOGUE + r'''
import cupy
cupy.state["stream"] = s1.value
fn = cudalloc.cupy.use()
print("installed=%d" % (cupy.state["allocator"] is fn))
p = fn(1 << 20)
q_holder = fn(1 << 20)
first = p.ptr
del p
gc.collect()
r = fn(1 << 20)
print("same_stream=%d" % (r.ptr == first))
cupy.state["stream"] = s2.value
other = fn(64 << 10)
print("other_stream_ok=%d" % (other.ptr != 0))
print("loaded=%d allocs=%d" % (cudalloc.loaded(), cudalloc.stats(0)["allocs"]))
try:
    fn(64 << 30)
    print("oom=none")
except cupy.cuda.memory.OutOfMemoryError:
    print("oom=raised")
del q_holder, other
gc.collect()
print("reported=%d" % cudalloc.report())  # r is live: listed
'''


def run_program(tmp, name, standin, program, args=()):
    pkg = os.path.join(tmp, name)
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(standin)
    parts = PRELOAD.split(":")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_")}
    env.update(LD_LIBRARY_PATH=MOCK_DIR, CUDALLOC_LIBRARY=parts[-1],
               CUDALLOC_CONF="leak_scan:0", PYTHONPATH=tmp + os.pathsep + PACKAGE,
               PYTHONDONTWRITEBYTECODE="1", ASAN_OPTIONS="detect_leaks=0")
    env.pop("LD_PRELOAD", None)
    if len(parts) > 1:  # a sanitizer's runtime must still come first
        env["LD_PRELOAD"] = ":".join(parts[:-1])
    proc = subprocess.run([sys.executable, "-c", program] + list(args), env=env,
                          capture_output=True, text=True, timeout=60)

    class R:
        pass
    r = R()
    r.rc, r.out, r.err = proc.returncode, proc.stdout, proc.stderr
    r.kv = dict(l.split("=", 1) for l in r.out.splitlines() if "=" in l)
    r.describe = lambda: "  exit status %d\n  --- stdout\n%s\n  --- stderr\n%s" % (
        r.rc, r.out, r.err[-3000:])
    if r.rc != 0:
        raise CheckFailed("exit status %d" % r.rc, [r])
    return r


def common(r):
    expect(r.kv.get("loaded_before") == "0", "the library was in the process before use()", r)
    expect(r.kv.get("same_stream") == "1", "a block freed on a stream did not come back on it", r)
    expect(r.kv.get("loaded", "").startswith("1 allocs="), "the helper's API missed the plugged library", r)


def check_torch(tmp):
    """cudalloc.torch.use(): PyTorch's slot holds the library's pair."""
    r = run_program(tmp, "torch", TORCH_STANDIN, TORCH_PROGRAM)
    expect(r.kv.get("slot") == "cudalloc_stream_malloc,cudalloc_stream_free",
           "the slot names %s" % r.kv.get("slot"), r)
    expect(r.kv.get("current") == "1", "change_current_allocator was not called with it", r)
    common(r)
    expect("SUMMARY: 1048576 bytes leaked in 1 allocations" in r.err,
           "the block left unfreed is not in the report at exit", r)
    live = 2 << 20  # q and r
    expect(r.kv.get("allocated_now") == str(live + (64 << 20)),
           "torch.cuda.memory_allocated's figure: %s, want %d" % (r.kv.get("allocated_now"),
                                                                  live + (64 << 20)), r)
    expect(int(r.kv.get("reserved_now", 0)) >= live + (64 << 20), "reserved below allocated", r)
    expect(r.kv.get("peak_after_reset") == str(live),
           "the peak after reset_peak_memory_stats: %s, want %d" % (r.kv.get("peak_after_reset"), live), r)
    expect(int(r.kv.get("reserved_after_empty", 1 << 40)) < int(r.kv.get("reserved_now", 0)) - (32 << 20),
           "torch.cuda.empty_cache() gave nothing back", r)
    expect(r.kv.get("empty_passed_on") == "1", "PyTorch's own empty_cache was not called", r)
    expect(r.kv.get("allocated_total_after_reset") == "0",
           "reset_accumulated_memory_stats left %s" % r.kv.get("allocated_total_after_reset"), r)
    expect(r.kv.get("keys") == "max_split_size,num_alloc_retries,num_device_alloc,"
           "num_device_free,num_ooms,num_sync_all_streams", "the flat keys: %s" % r.kv.get("keys"), r)
    expect(r.kv.get("arrays") == "active,active_bytes,allocated_bytes,allocation,inactive_split,"
           "inactive_split_bytes,requested_bytes,reserved_bytes,segment",
           "the per-pool figures: %s" % r.kv.get("arrays"), r)
    expect(r.kv.get("stats") == "oversize_allocations,oversize_segments",
           "the single figures: %s" % r.kv.get("stats"), r)
    expect(r.kv.get("graph_kept") == "1", "a block the graph holds was handed out again", r)
    expect(r.kv.get("graph_released") == "1", "reset() did not give the graph's block back", r)
    expect(r.kv.get("graph_calls") == "capture_begin,capture_end,reset",
           "PyTorch's own graph calls: %s" % r.kv.get("graph_calls"), r)
    return ("slot %s, same-stream reuse, reported at exit, memory functions answered, "
            "a graph's blocks kept until reset()" % r.kv["slot"])


def check_history(tmp):
    """PyTorch's memory history and snapshot through the slot, by its own
    recipe (_record_memory_history, run, _dump_snapshot, history off),
    which PyTorch implements for its own allocator only: the snapshot holds
    the pool's segments (their bytes the pool's reserved ones), the live
    blocks and the cache between them, every allocation and free made while
    history was on and none after it; memory_snapshot() after it has the
    later block; before any history, one line says what to do."""
    out = os.path.join(tmp, "snapshot.pickle")
    r = run_program(tmp, "torch", TORCH_STANDIN, HISTORY_PROGRAM, [out])
    expect("_record_memory_history" in r.kv.get("before", ""),
           "memory_snapshot() before any history said %r" % r.kv.get("before"), r)
    expect(r.kv.get("actions") == "alloc,free_completed,free_requested,segment_alloc",
           "the entries' actions: %s" % r.kv.get("actions"), r)
    expect(r.kv.get("allocs") == "1,4,32,2", "the entries' allocations (MiB): %s, want "
           "1,4,32,2 (none before or after the history)" % r.kv.get("allocs"), r)
    expect(r.kv.get("held") == "2", "the live blocks (MiB): %s, want 2" % r.kv.get("held"), r)
    expect(r.kv.get("cached") == "1" and r.kv.get("reserved_matches") == "1",
           "the segments hold no cache, or not the pool's reserved bytes", r)
    expect(r.kv.get("held_later") == "2,8",
           "memory_snapshot() after the history: %s, want 2,8" % r.kv.get("held_later"), r)
    return ("_dump_snapshot: %s; live %s MiB; memory_snapshot() later %s MiB" % (
        r.kv["actions"], r.kv["held"], r.kv["held_later"]))


def check_cupy(tmp):
    """cudalloc.cupy.use(): CuPy's allocator, its current stream each time."""
    r = run_program(tmp, "cupy", CUPY_STANDIN, CUPY_PROGRAM)
    expect(r.kv.get("installed") == "1", "set_allocator was not given the allocator", r)
    expect(r.kv.get("other_stream_ok") == "1", "an allocation on a second stream failed", r)
    expect(r.kv.get("oom") == "raised" and "(the allocator slot)" in r.err,
           "64 GiB of the mock's 1: %s" % r.kv.get("oom"), r)
    common(r)
    expect(r.kv.get("reported") == "1" and re.search(
        r"^cudalloc: 1048576 bytes [a-z ]+ in 1 allocation", r.err, re.M),
        "cudalloc.report() did not list the live block", r)
    return "allocator installed, same-stream reuse, the live block in report()"


CHECKS = {"torch": check_torch, "history": check_history, "cupy": check_cupy}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "py_slot"))
