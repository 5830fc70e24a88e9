"""cudalloc from Python: the library's public API (include/cudalloc.h)
without writing ctypes.

Installed with `pip install .` (the package, the `cudalloc` command, and the
built libcudalloc.so and cudalloc-top inside it), or, from a source tree,
with scripts/python on PYTHONPATH. The library is preloaded into the process
(`cudalloc run`, or LD_PRELOAD=.../libcudalloc.so); this module finds its
functions among the process's symbols. Where it is not loaded, every call
does nothing and says so by its result (loaded() is False, stats() and
version() are None), so a script can call them unconditionally:

    import cudalloc
    for step in range(steps):
        train_step()
        cudalloc.mark()            # growth_report:1 snapshots here
    cudalloc.report()              # the live device allocations, now
    print(cudalloc.stats(0))       # device 0's pool statistics, a dict

Or, without preloading anything, plug the library into a framework's own
allocator slot, first thing, before the framework allocates device memory:

    cudalloc.torch.use()    # PyTorch's CUDAPluggableAllocator
    cudalloc.cupy.use()     # CuPy's set_allocator

Both hand each allocation's stream to the library, which then reuses freed
blocks in stream order without fences (docs/COMPATIBILITY.md says what of
PyTorch works through the slot). The library is CUDALLOC_LIBRARY, else the
preloaded one, else the one inside this package (pip), else the one
installed beside it (P/share/cudalloc/python/cudalloc -> P/lib), else the
source tree's build/.

`python3 -m cudalloc` says whether the library is loaded in that interpreter
and which version; `python3 -m cudalloc run|top|view ...` is the `cudalloc`
command. Standard library only; Python 3.6 and later.
"""

import ctypes
import json
import os
import sys
import tempfile
import time

__all__ = ["loaded", "version", "stats", "report", "print_stats", "mark",
           "empty_cache", "reset_peak_stats", "library_path", "torch", "cupy"]


# The library as loaded for a framework's slot (RTLD_LOCAL, as the
# frameworks load it: its functions are not among the process's symbols).
_plugged = None


def _function(name, restype, argtypes):
    """The library's function `name`, or None when it is not loaded."""
    fn = getattr(_plugged, name, None) if _plugged else None
    if fn is None:
        fn = getattr(ctypes.CDLL(None), name, None)  # preloads included
    if fn is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


def _preloaded_path():
    """The path of a libcudalloc.so mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libcudalloc.so"):
                    return path
    except OSError:
        pass
    return None


def library_path():
    """The libcudalloc.so a framework's slot loads: CUDALLOC_LIBRARY, else
    the one already in the process, else the one inside this package (a
    wheel's), else the one installed beside it (P/share/cudalloc/python/
    cudalloc -> P/lib), else the source tree's build/."""
    env = os.environ.get("CUDALLOC_LIBRARY")
    if env:
        return env
    found = _preloaded_path()
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("lib", "../../../../lib", "../../../../lib64", "../../../build"):
        path = os.path.normpath(os.path.join(here, rel, "libcudalloc.so"))
        if os.path.exists(path):
            return path
    raise FileNotFoundError("libcudalloc.so not found beside %s; set CUDALLOC_LIBRARY" % here)


def _plug(path):
    """Loads the library for a slot (once); its path."""
    global _plugged
    path = path or library_path()
    if _plugged is None:
        _plugged = ctypes.CDLL(path)
    return path


def _pytorch_stats(device):
    """`device`'s statistics under the names and nesting of PyTorch's
    torch.cuda.memory_stats_as_nested_dict(). The library keeps no split
    between a small and a large pool: their rows are all zeros, "all" holds
    the figures. Active bytes are the allocated ones; inactive splits and
    oversize blocks are not counted (0)."""
    s = stats(device) or {}
    zero = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}

    def triple(name, counted=None):
        t = s.get(name) or {"current": 0, "peak": 0, "total": 0}
        total = t["total"] if counted is None else counted
        return {"all": {"current": t["current"], "peak": t["peak"],
                        "allocated": total, "freed": total - t["current"]},
                "small_pool": dict(zero), "large_pool": dict(zero)}

    out = {
        "allocated_bytes": triple("allocated_bytes"),
        "requested_bytes": triple("requested_bytes"),
        "reserved_bytes": triple("reserved_bytes"),
        "active_bytes": triple("allocated_bytes"),
        "inactive_split_bytes": triple(None),
        "allocation": triple("blocks"),
        "active": triple("blocks"),
        "inactive_split": triple(None),
        "segment": triple("segments", s.get("backend_allocs", 0)),
        "oversize_allocations": dict(zero),
        "oversize_segments": dict(zero),
        "num_alloc_retries": s.get("oom_retries", 0),
        "num_ooms": s.get("failed_allocs", 0),
        "num_sync_all_streams": 0,
        "num_device_alloc": s.get("backend_allocs", 0),
        "num_device_free": s.get("backend_frees", 0),
        "max_split_size": -1,
    }
    return _less_accumulated(device, out)


# Totals at the last reset_accumulated_memory_stats(), per device: PyTorch
# counts "allocated" and "freed" from there; the library from its start.
_accumulated = {}


def _less_accumulated(device, out):
    base = _accumulated.get(device)
    if base is None:
        return out
    for name, value in out.items():
        if isinstance(value, dict):
            for key in ("allocated", "freed"):
                value.get("all", value)[key] -= base[name].get("all", base[name])[key]
        elif name in ("num_alloc_retries", "num_ooms", "num_device_alloc",
                      "num_device_free"):
            out[name] -= base[name]
    return out


def _reset_accumulated(device):
    _accumulated.pop(device, None)
    _accumulated[device] = _pytorch_stats(device)


def _reset_peaks(device):
    fn = _function("cudalloc_reset_peak_stats", None, [ctypes.c_int])
    if fn:
        fn(-1 if device is None else device)


def _follow_graphs(_torch):
    """Tells the library of each CUDA graph PyTorch captures (CUDAGraph's
    capture_begin, capture_end, reset, and its collection), so that the
    blocks a graph was given serve no one else while it lives: the private
    pool that PyTorch 2.11 lets no plug-in keep from Python."""
    import weakref
    graph_class = getattr(getattr(_torch.cuda, "graphs", None), "CUDAGraph", None)
    if graph_class is None:
        return
    c_int, vp = ctypes.c_int, ctypes.c_void_p
    begin = _function("cudalloc_graph_begin", c_int, [c_int, vp])
    end = _function("cudalloc_graph_end", None, [c_int])
    release = _function("cudalloc_graph_release", None, [c_int])
    orig_begin, orig_end = graph_class.capture_begin, graph_class.capture_end
    orig_reset = getattr(graph_class, "reset", None)

    def capture_begin(self, *args, **kwargs):
        orig_begin(self, *args, **kwargs)
        stream = _torch.cuda.current_stream()
        number = begin(stream.device.index, stream.cuda_stream)
        if not number:
            raise RuntimeError("cudalloc: no more CUDA graphs can be held: "
                               "reset() one before capturing another")
        self._cudalloc_graph = weakref.finalize(self, release, number)
        self._cudalloc_number = number

    def capture_end(self):
        try:
            orig_end(self)
        finally:
            end(getattr(self, "_cudalloc_number", 0))

    def reset(self):
        if orig_reset is not None:
            orig_reset(self)
        done = getattr(self, "_cudalloc_graph", None)
        if done is not None:
            done()

    graph_class.capture_begin = capture_begin
    graph_class.capture_end = capture_end
    graph_class.reset = reset


class _Torch(object):
    """PyTorch's allocator slot (torch.cuda.memory.CUDAPluggableAllocator)."""

    @staticmethod
    def use(path=None):
        """Makes the library PyTorch's CUDA allocator: PyTorch hands it each
        tensor's size, device and stream, from any thread. Call it before
        PyTorch allocates device memory (PyTorch refuses to swap an
        allocator in use). PyTorch's memory functions (memory_allocated,
        memory_reserved, memory_stats, memory_summary, the max_ and reset_
        ones, and torch.accelerator's) then answer from the library's
        figures, empty_cache() gives its cache back, and
        tensor.record_stream(s) reaches it, and each CUDA graph captured
        keeps its blocks while it lives (see docs/COMPATIBILITY.md).
        Returns the CUDAPluggableAllocator."""
        import torch as _torch
        path = _plug(path)
        alloc = _torch.cuda.memory.CUDAPluggableAllocator(
            path, "cudalloc_stream_malloc", "cudalloc_stream_free")
        _torch.cuda.memory.change_current_allocator(alloc)
        _Torch._answer_for(_torch)
        return alloc

    @staticmethod
    def memory_stats(device=0):
        """`device`'s figures as torch.cuda.memory_stats_as_nested_dict()
        gives them under PyTorch's own allocator."""
        return _pytorch_stats(device)

    @staticmethod
    def _answer_for(_torch):
        """Puts the library behind what PyTorch's pluggable interface
        lacks: the functions torch.cuda.memory and torch.accelerator call
        (looked up on torch._C at each call), Tensor.record_stream, and the
        graphs' private pools."""
        C = _torch._C
        empty_orig = {n: getattr(C, n) for n in ("_cuda_emptyCache",
                                                 "_accelerator_emptyCache")
                      if hasattr(C, n)}

        def emptying(name):
            def empty(*args):
                empty_orig[name](*args)
                empty_cache()
            return empty
        answers = {
            "_cuda_memoryStats": _pytorch_stats,
            "_accelerator_getDeviceStats": _pytorch_stats,
            "_cuda_resetPeakMemoryStats": _reset_peaks,
            "_accelerator_resetPeakStats": _reset_peaks,
            "_cuda_resetAccumulatedMemoryStats": _reset_accumulated,
            "_accelerator_resetAccumulatedStats": _reset_accumulated,
        }
        answers.update((n, emptying(n)) for n in empty_orig)
        for name, fn in answers.items():
            if hasattr(C, name):
                setattr(C, name, fn)
        record = _function("cudalloc_record_stream", None,
                           [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p])
        record_orig = _torch.Tensor.record_stream

        def record_stream(tensor, stream):
            record_orig(tensor, stream)
            if tensor.is_cuda:
                record(tensor.untyped_storage().data_ptr(),
                       tensor.device.index, stream.cuda_stream)
        _torch.Tensor.record_stream = record_stream
        _follow_graphs(_torch)
        for name, fn in (("_cuda_record_memory_history", _record_history),
                         ("_cuda_record_memory_history_legacy", _record_history_legacy),
                         ("_cuda_memorySnapshot", _memory_snapshot)):
            if hasattr(C, name):
                setattr(C, name, fn)


# PyTorch's memory history and snapshots through the slot, which PyTorch
# implements for its own allocator only: the history is the library's
# timeline (cudalloc_trace_start into a file of this process's), the
# snapshot is that timeline read back as PyTorch's (cudalloc.view): the
# pool's segments, their live blocks and cache, and the trace entries
# recorded while history was on. Turned off, history stops showing in the
# entries; the timeline goes on being written (each allocation's event,
# into the file) so that the segments stay exact.
_history = {"since_us": None, "until_us": None, "max_entries": None}


def _trace_file():
    fn = _function("cudalloc_trace_file", ctypes.c_char_p, [])
    path = fn() if fn else None
    return path.decode() if path else None


def _history_switch(enabled, max_entries):
    """Turns the history on (starting the timeline where none is written)
    or off, now."""
    now = time.monotonic_ns() // 1000
    if not enabled:
        if _history["since_us"] is not None and _history["until_us"] is None:
            _history["until_us"] = now
        return
    if _trace_file() is None:
        path = os.path.join(tempfile.gettempdir(), "cudalloc-history.%d.json" % os.getpid())
        start = _function("cudalloc_trace_start", ctypes.c_int, [ctypes.c_char_p])
        if start is None or start(path.encode()) != 0:
            raise RuntimeError("cudalloc: memory history needs the library's timeline, which "
                               "cannot be written at %s (its line above says why)" % path)
    _history.update(since_us=now, until_us=None, max_entries=max_entries)


def _record_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                    *args, **kwargs):
    """torch._C._cuda_record_memory_history: `enabled` None stops it."""
    _history_switch(enabled, max_entries)


def _record_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                           *args, **kwargs):
    """torch._C._cuda_record_memory_history_legacy (enabled a bool)."""
    _history_switch(enabled, trace_alloc_max_entries)


def _memory_snapshot(*args, **kwargs):
    """torch._C._cuda_memorySnapshot: the dict torch.cuda.memory._snapshot()
    returns, _dump_snapshot pickles and memory_snapshot() takes the
    segments of."""
    path = _trace_file()
    if path is None:
        raise RuntimeError("cudalloc: a snapshot through the slot is read from the library's "
                           "timeline: call torch.cuda.memory._record_memory_history() first "
                           "(or run with CUDALLOC_CONF=trace_path:FILE)")
    _function("cudalloc_trace_flush", None, [])()
    from cudalloc import view
    snap = view.torch_snapshot(view.load_live(path))
    since, until = _history["since_us"], _history["until_us"]
    keep = _history["max_entries"] or sys.maxsize
    for device, entries in enumerate(snap["device_traces"]):
        if since is None:
            entries = []
        else:
            entries = [e for e in entries if e["time_us"] >= since and
                       (until is None or e["time_us"] <= until)]
        snap["device_traces"][device] = entries[-keep:]
    return snap


class _Freeing(object):
    """Owns one block handed to CuPy: gives it back on CuPy's release."""

    def __init__(self, free, ptr, size, device, stream):
        self._args = (free, ptr, size, device, stream)

    def __del__(self):
        free, ptr, size, device, stream = self._args
        free(ptr, size, device, stream)


class _Cupy(object):
    """CuPy's allocator slot (cupy.cuda.set_allocator)."""

    @staticmethod
    def use(path=None):
        """Makes the library CuPy's allocator, with CuPy's current stream at
        each allocation (its C-function slot carries none). A request the
        device cannot hold raises CuPy's OutOfMemoryError, after the
        library's one line. CuPy's own pool figures are the library's:
        stats(device) (used_bytes: allocated_bytes, total_bytes:
        reserved_bytes), empty_cache() for free_all_blocks(). Returns the
        allocator function."""
        import cupy as _cupy
        _plug(path)
        vp, size_t, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        malloc = _function("cudalloc_stream_try_malloc", vp, [size_t, c_int, vp])
        free = _function("cudalloc_stream_free", None, [vp, size_t, c_int, vp])
        memory = _cupy.cuda.memory

        def allocate(size):
            device = _cupy.cuda.Device().id
            stream = _cupy.cuda.get_current_stream().ptr
            ptr = malloc(size, device, stream) if size else None
            if size and not ptr:
                raise memory.OutOfMemoryError(size, 0)
            owner = _Freeing(free, ptr, size, device, stream) if ptr else None
            return memory.MemoryPointer(
                memory.UnownedMemory(ptr or 0, size, owner, device), 0)

        _cupy.cuda.set_allocator(allocate)
        return allocate


torch = _Torch()
cupy = _Cupy()


def loaded():
    """Whether libcudalloc is loaded in this process."""
    return _function("cudalloc_version", ctypes.c_char_p, []) is not None


def version():
    """The library's version ("0.1.0"), or None when it is not loaded."""
    fn = _function("cudalloc_version", ctypes.c_char_p, [])
    return fn().decode() if fn else None


def stats(device=0):
    """Device `device`'s pool statistics as a dict (byte and block counts as
    {"current", "peak", "total"} dicts), with "rc" 0 when the device has a
    pool and -1 when it has none yet; None when the library is not loaded.
    The library writes them as JSON (cudalloc_get_stats_json), so this
    module holds no copy of the C struct's layout."""
    fn = _function("cudalloc_get_stats_json", ctypes.c_int,
                   [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                    ctypes.POINTER(ctypes.c_size_t)])
    if fn is None:
        return None
    needed = ctypes.c_size_t(2048)
    while True:
        buf = ctypes.create_string_buffer(needed.value)
        rc = fn(device, buf, len(buf), ctypes.byref(needed))
        if needed.value <= len(buf):
            break
    out = {"rc": rc}
    out.update(json.loads(buf.value.decode()))
    return out


def _call(name):
    """Calls the library's void function `name`; whether it was loaded. The
    library writes with C, so Python's buffered output goes first."""
    fn = _function(name, None, [])
    if fn is None:
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    fn()
    return True


def report():
    """Prints the live device allocations, grouped by where they were made
    (the leak report at exit prints the same), to the library's log.
    Returns whether the library is loaded."""
    return _call("cudalloc_print_report")


def print_stats():
    """Prints each device's memory summary to the library's log."""
    return _call("cudalloc_print_stats")


def mark():
    """Marks a point of the run, the end of a training step say: under
    growth_report:1, live memory by site is snapshotted at each mark, and
    from the first mark on only at marks."""
    return _call("cudalloc_mark")


def reset_peak_stats(device=-1):
    """Starts every peak of `device`'s statistics (every device's for -1)
    again from its current figure."""
    _reset_peaks(device)


def empty_cache():
    """Gives every fully free cached segment back to the driver; the bytes
    given back, or None when the library is not loaded."""
    fn = _function("cudalloc_empty_cache", ctypes.c_uint64, [])
    return fn() if fn else None
