#!/usr/bin/env python3
"""py_helper_test.py [CHECK...]: the Python helper (the package cudalloc), in
front of the mock driver.

A Python program reaches the mock libcuda.so.1 through ctypes, as a
framework's native code would, keeps one 1 MiB block per "step" and marks
each step through the helper; it asks the helper for the statistics and
the report of live allocations, then frees everything. Checked: under the
library every helper call reaches it (stats, mark, report, empty_cache),
and growth_report:1 names the growing site at exit, over exactly the marked
steps, down to keep_step's Python line; without the library every call
does nothing and says so.
"""
import os
import re
import subprocess
import sys

from leak_report_test import MOCK_DIR, PRELOAD, CheckFailed, expect, main

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "scripts", "python")  # the package `cudalloc`
STEPS = 20

PROGRAM = r'''
import ctypes, json, sys
import cudalloc
steps = int(sys.argv[1])
print("loaded=%d version=%s" % (cudalloc.loaded(), cudalloc.version()))
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
kept = []

def keep_step():
    p = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(p), 1 << 20) == 0
    kept.append(p.value)

for _ in range(steps):
    keep_step()
    print("marked=%d" % cudalloc.mark())
s = cudalloc.stats(0)
print("stats=%s" % json.dumps(s and {k: s[k] for k in ("rc", "allocs", "blocks")}))
print("reported=%d" % cudalloc.report())
for p in kept:
    assert cuda.cuMemFree_v2(ctypes.c_uint64(p)) == 0
print("emptied=%s" % cudalloc.empty_cache())
'''


class PyRun:
    def __init__(self, conf, preload, proc):
        self.conf, self.preload = conf, preload
        self.rc, self.out, self.err = proc.returncode, proc.stdout, proc.stderr
        self.kv = dict(l.split("=", 1) for l in self.out.splitlines() if "=" in l)

    def describe(self):
        text = [f"  run: python3 (helper program)  preload={self.preload}  "
                f"CUDALLOC_CONF='{self.conf}'  exit status {self.rc}"]
        for name, body in (("stdout", self.out), ("stderr", self.err)):
            text.append(f"  --- {name}")
            text.extend("  | " + l for l in body.splitlines()[-60:])
        return "\n".join(text)


def run_py(conf, preload=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_")}
    env.update(LD_LIBRARY_PATH=MOCK_DIR, CUDALLOC_CONF=conf, PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=PACKAGE)
    if preload:
        env["LD_PRELOAD"] = PRELOAD
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(STEPS)], env=env,
                          capture_output=True, text=True, timeout=60)
    r = PyRun(conf, preload, proc)
    if r.rc != 0:
        raise CheckFailed(f"exit status {r.rc}", [r])
    return r


def check_preloaded(tmp):
    """Every helper call reaches the library; the growth at exit is the
    kept blocks', over the STEPS marks."""
    r = run_py("growth_report:1")
    expect(r.kv.get("loaded", "").startswith("1 version=0."), f"loaded line {r.kv.get('loaded')}", r)
    expect(r.out.count("marked=1") == STEPS, "mark() did not reach the library every step", r)
    expect(f'"allocs": {STEPS}' in r.kv.get("stats", "") and '"rc": 0' in r.kv["stats"],
           f"stats {r.kv.get('stats')}, want {STEPS} allocations in device 0's pool", r)
    expect(r.kv.get("reported") == "1" and re.search(
        rf"^cudalloc: {STEPS << 20} bytes still reachable in {STEPS} allocation\(s\)", r.err, re.M),
        f"report() did not print the {STEPS} live blocks", r)
    expect(r.kv.get("emptied", "None").isdigit(), f"empty_cache() gave {r.kv.get('emptied')}", r)
    growth = re.search(r"^cudalloc: \+\S+ \S+ \((\d+) bytes\), .* over (\d+) consecutive snapshots",
                       r.err, re.M)
    expect(growth and int(growth.group(1)) == (STEPS - 1) << 20 and int(growth.group(2)) == STEPS,
           f"growth at exit: {growth and growth.group(0)}; want {STEPS - 1} MiB over {STEPS} snapshots", r)
    if (3, 9) <= sys.version_info[:2] <= (3, 13):  # Python frames (py_frames_test.py)
        expect(re.search(r"^cudalloc:     #\d+ in keep_step <string>:\d+ \(Python\)$", r.err, re.M),
               "the growing site's stack does not show keep_step's Python line", r)
    return growth.group(0)[len("cudalloc: "):][:90]


def check_absent(tmp):
    """Without the library: loaded() False, the others do nothing."""
    r = run_py("", preload=False)
    expect(r.kv.get("loaded") == "0 version=None" and r.out.count("marked=0") == STEPS
           and r.kv.get("stats") == "null" and r.kv.get("reported") == "0"
           and r.kv.get("emptied") == "None" and r.err == "",
           "the helper did something without the library", r)
    return "loaded() False, stats() None, report()/mark() False, silent"


CHECKS = {"preloaded": check_preloaded, "absent": check_absent}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "py_helper"))
