"""Reads libcudalloc's pool statistics from inside a Python process, and
judges them.

Shared by the Python GPU checks (torch_cnn.py, cupy_check.py, jax_check.py,
torch_ipc.py, cupy_ipc.py).
Why: when the library is only preloaded, the Python program itself is the one
place that can ask the pool what it served, the way any user program would:
through the package cudalloc, the library's Python helper, which reads them
as the library writes them (cudalloc_get_stats_json).

Standard library only.
"""

import sys
import traceback

from cudalloc import stats as get_stats


def pooled_line(stats):
    """The line the GPU checks parse (same as the C checks print)."""
    if stats is None:
        return "pooled: none (cudalloc_get_stats not found: library not loaded)"
    return ("pooled: allocs=%d backend_allocs=%d cache_hits=%d "
            "(frees=%d backend_frees=%d segments=%d reserved=%d failed=%d "
            "rc=%d)" % (stats["allocs"], stats["backend_allocs"],
                        stats["cache_hits"], stats["frees"],
                        stats["backend_frees"], stats["segments"]["current"],
                        stats["reserved_bytes"]["current"],
                        stats["failed_allocs"], stats["rc"]))


def judge(stats, expect, min_allocs=100):
    """Why `stats` does not meet `expect` ("plain", "pooled", "passthrough"
    or "any"), or None when it does. "pooled": the library is loaded, the
    pool served more than `min_allocs` allocations and asked the driver for
    fewer than a tenth as many."""
    if expect == "any":
        return None
    if expect == "plain":
        return None if stats is None else (
            "cudalloc_get_stats found, but the library should be absent")
    if stats is None:
        return "cudalloc_get_stats not found, but the library should be preloaded"
    if expect == "passthrough":
        if stats["allocs"] or stats["backend_allocs"]:
            return "enabled:0 should pool nothing, yet allocs=%d" % stats["allocs"]
        return None
    if expect == "pooled":
        if stats["rc"] != 0:
            return "no pool for the device (rc=%d): nothing was pooled" % stats["rc"]
        if stats["allocs"] <= min_allocs:
            return "only %d allocations pooled, expected more than %d" % (
                stats["allocs"], min_allocs)
        if stats["backend_allocs"] * 10 >= stats["allocs"]:
            return "backend_allocs=%d is not below 10%% of allocs=%d" % (
                stats["backend_allocs"], stats["allocs"])
        if stats["failed_allocs"]:
            return "failed_allocs=%d, expected none" % stats["failed_allocs"]
        return None
    raise ValueError("unknown expectation %r" % expect)


def fail(name, why):
    """Prints the check's FAIL verdict line and exits 1."""
    print("%s: FAIL: %s" % (name, why), flush=True)
    sys.exit(1)


def failer(name):
    """A one-argument fail(why) for the check called `name`."""
    return lambda why: fail(name, why)


def expect_parser(doc):
    """The checks' argument parser: the description from the docstring's
    first line and --expect plain|pooled|any (default any)."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--expect", default="any",
                    choices=["plain", "pooled", "any"])
    return ap


def child_answer(proc, outbox, timeout, fail):
    """The value a child process put in `outbox` as ("sums", value), within
    `timeout` seconds; a hang or an ("error", why) kills the child and
    fails the check (the IPC checks: torch_ipc.py, cupy_ipc.py)."""
    import queue
    try:
        kind, value = outbox.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        fail("no answer from the child within %d s (a hang)" % timeout)
    if kind != "sums":
        proc.kill()
        fail("the child failed: %s" % value)
    return value


def run_guarded(name, fn, what="exception"):
    """fn() with any exception (not SystemExit) reported as the check's FAIL
    verdict, after its traceback."""
    try:
        return fn()
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        fail(name, "%s: %s" % (what, sys.exc_info()[1]))


def conclude(name, stats, expect, min_allocs=100):
    """Judges `stats` against `expect`: the FAIL verdict, or "NAME: PASS"."""
    why = judge(stats, expect, min_allocs=min_allocs)
    if why:
        fail(name, why)
    print("%s: PASS" % name, flush=True)


def report_and_conclude(name, expect, min_allocs=100):
    """Reads device 0's statistics, prints the pooled line, then concludes."""
    stats = get_stats(0)
    print(pooled_line(stats), flush=True)
    conclude(name, stats, expect, min_allocs=min_allocs)


def check_main(name, doc, run):
    """main() of a check with only --expect: parses it, runs run() (an
    exception is the FAIL verdict), then prints and judges the statistics."""
    args = expect_parser(doc).parse_args()
    run_guarded(name, run)
    report_and_conclude(name, args.expect, min_allocs=100)
