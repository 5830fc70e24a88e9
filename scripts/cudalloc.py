"""cudalloc from Python: the library's public API (include/cudalloc.h)
without writing ctypes, and without building anything.

The library is preloaded into the process (LD_PRELOAD=.../libcudalloc.so);
this module finds its functions among the process's symbols. Where it is
not loaded, every call does nothing and says so by its result (loaded()
is False, stats() and version() are None), so a script can call them
unconditionally:

    import sys; sys.path.insert(0, "<cudalloc>/scripts")
    import cudalloc
    for step in range(steps):
        train_step()
        cudalloc.mark()            # growth_report:1 snapshots here
    cudalloc.report()              # the live device allocations, now
    print(cudalloc.stats(0))       # device 0's pool statistics, a dict

`python3 -m cudalloc` (with scripts/ on PYTHONPATH, or from scripts/) says
whether the library is loaded in that interpreter and which version.
Standard library only; Python 3.6 and later.
"""

import ctypes
import sys

__all__ = ["loaded", "version", "stats", "report", "print_stats", "mark",
           "empty_cache", "CudallocDeviceStats"]


class CudallocStat(ctypes.Structure):
    """cudalloc_stat: one quantity now, at its highest, and summed."""
    _fields_ = [
        ("current", ctypes.c_uint64),
        ("peak", ctypes.c_uint64),
        ("total", ctypes.c_uint64),
    ]


class CudallocDeviceStats(ctypes.Structure):
    """cudalloc_device_stats, field by field (ctypes applies C's alignment:
    4 bytes of padding after the leading int). A test in every CI run
    (stats_layout) holds its size and offsets to the C compiler's."""
    _fields_ = [
        ("device", ctypes.c_int),
        ("requested_bytes", CudallocStat),
        ("allocated_bytes", CudallocStat),
        ("reserved_bytes", CudallocStat),
        ("blocks", CudallocStat),
        ("segments", CudallocStat),
        ("allocs", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
        ("cache_hits", ctypes.c_uint64),
        ("backend_allocs", ctypes.c_uint64),
        ("backend_frees", ctypes.c_uint64),
        ("oom_retries", ctypes.c_uint64),
        ("gc_segments_released", ctypes.c_uint64),
        ("failed_allocs", ctypes.c_uint64),
        ("free_cached_bytes", ctypes.c_uint64),
        ("pending_free_bytes", ctypes.c_uint64),
        ("largest_free_block", ctypes.c_uint64),
        ("fragmentation", ctypes.c_double),
    ]


def _function(name, restype, argtypes):
    """The library's function `name`, or None when it is not loaded."""
    fn = getattr(ctypes.CDLL(None), name, None)  # preloads included
    if fn is not None:
        fn.restype, fn.argtypes = restype, argtypes
    return fn


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
    pool and -1 when it has none yet; None when the library is not loaded."""
    fn = _function("cudalloc_get_stats", ctypes.c_int,
                   [ctypes.c_int, ctypes.POINTER(CudallocDeviceStats), ctypes.c_size_t])
    if fn is None:
        return None
    s = CudallocDeviceStats()
    out = {"rc": fn(device, ctypes.byref(s), ctypes.sizeof(s))}
    for name, ctype in CudallocDeviceStats._fields_:
        value = getattr(s, name)
        if ctype is CudallocStat:
            value = {"current": value.current, "peak": value.peak, "total": value.total}
        out[name] = value
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


def empty_cache():
    """Gives every fully free cached segment back to the driver; the bytes
    given back, or None when the library is not loaded."""
    fn = _function("cudalloc_empty_cache", ctypes.c_uint64, [])
    return fn() if fn else None


if __name__ == "__main__":
    if loaded():
        print("cudalloc %s is loaded in this process" % version())
    else:
        print("cudalloc is not loaded in this process: run with "
              "LD_PRELOAD=<build>/libcudalloc.so")
