"""gpu_check_test: the GPU check's own bookkeeping, without a GPU.

Why: scripts/gpu-check.sh runs the checks at once and each check runs its
cases at once (Check.together); the table must still list every row in the
order the code gives, a failed row must carry the last lines of the logs it
judged, a case that breaks must leave a failed row, not vanish, and a
check run again into the same OUT must judge only its own run's files. This
drives gpu_check.Check with short shell programs as the runs, in CI. With
the build folder, it also reads the configured checks (ctest's JSON): a
check that takes the device's free memory runs alone (on the H200 one run
beside the others made JAX's allocations fail), and ctest counts each
check's programs as the check runs them.

Usage: gpu_check_test.py [BUILD]   (prints "gpu_check_test: PASS" or fails)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
import gpu_check  # noqa: E402

NAME = "gpu_check_test"


def fail(why):
    print("%s: FAIL: %s" % (NAME, why), flush=True)
    sys.exit(1)


def new_check_args(out, jobs=1):
    return argparse.Namespace(root=out, lib=os.path.join(out, "no-library.so"), bin=out,
                              examples=out, out=out, jobs=jobs)


def new_check(out, jobs):
    return gpu_check.Check("demo", new_check_args(out, jobs))


def shell(check, row, script):
    return check.run(row, ["sh", "-c", script])


def rows_of(check):
    with open(check.results) as f:
        return [line.split("\t")[0] for line in f]


def tails_of(check):
    with open(check.tails) as f:
        return f.read()


def ordered_and_concurrent(out):
    """Cases that end in the reverse of their order, at once: rows in order,
    the whole taking about the longest case."""
    check = new_check(out, jobs=4)
    check.record("first", "-", "-", "-", "-", "PASS", "before the cases")

    def case(c, i, secs):
        run = shell(c, "case%d" % i, "sleep %s; echo case %d done" % (secs, i))
        c.record("case%d" % i, "-", "-", "-", "-", "PASS" if run.rc == 0 else "FAIL",
                 "%d" % run.rc)
        return i

    t0 = time.monotonic()
    got = check.each(case, enumerate((0.9, 0.6, 0.3, 0.0)))
    took = time.monotonic() - t0
    if got != [0, 1, 2, 3]:
        fail("each returned %s, want what each case returned, in order" % got)
    check.record("last", "-", "-", "-", "-", "PASS", "after the cases")
    want = ["first", "case0", "case1", "case2", "case3", "last"]
    if rows_of(check) != want:
        fail("rows %s, want %s" % (rows_of(check), want))
    if took > 1.7:
        fail("four cases of at most 0.9 s took %.1f s: not at once" % took)
    if check.failed or tails_of(check):
        fail("a passing check left failures: %d, %r" % (check.failed, tails_of(check)))


def failures_keep_their_logs(out):
    """A failed row keeps the tail of its own runs' logs, not another case's;
    a case that raises leaves a FAIL row with its traceback; a row given its
    logs keeps those."""
    check = new_check(out, jobs=2)

    def good():
        shell(check, "good", "echo all is well")
        check.record("good", "-", "-", "-", "-", "PASS", "")

    def bad():
        lines = "; ".join("echo bad line %d" % i for i in range(1, 31))
        shell(check, "bad_a", "echo first run of bad")
        shell(check, "bad_b", lines + "; exit 3")
        check.record("bad", "-", "-", "-", "-", "FAIL", "exit status 3")

    def broken():
        shell(check, "broken", "echo about to break")
        raise RuntimeError("the case broke")

    def nested():
        check.together(lambda: check.record("inner1", "-", "-", "-", "-", "PASS", ""),
                       lambda: check.record("inner2", "-", "-", "-", "-", "PASS", ""))

    if check.together(good, bad, broken, nested)[2] is not None:
        fail("a broken case returned something")
    run = shell(check, "compared", "echo compared run")
    check.record("compare", "-", "-", "-", "-", "FAIL", "differ", logs=[run.log])
    want = ["good", "bad", "demo", "inner1", "inner2", "compare"]
    if rows_of(check) != want:
        fail("rows %s, want %s" % (rows_of(check), want))
    if check.failed != 3:
        fail("%d failed rows counted, want 3" % check.failed)
    text = tails_of(check)
    for piece in ("### bad: FAIL", "logs/bad_a.log, last 2 lines:",
                  "logs/bad_b.log, last %d lines:" % gpu_check.TAIL_LINES, "bad line 30",
                  "### demo: FAIL", "RuntimeError: the case broke", "about to break",
                  "### compare: FAIL", "compared run"):
        if piece not in text:
            fail("the failures' tails lack %r:\n%s" % (piece, text))
    for stray in ("bad line %d\n" % (30 - gpu_check.TAIL_LINES), "all is well"):
        if stray in text:
            fail("the failures' tails hold %r, from outside the tail or another case" % stray)
    if text.index("### bad") > text.index("### demo") or \
            text.index("### demo") > text.index("### compare"):
        fail("the failures' tails are not in the rows' order")


def work_starts_empty(out):
    """A check run again into the same OUT must not judge what its last run
    left: its work folder starts empty (a rerun once found the last run's
    rank logs and ready files there, and failed rows that had passed), while
    another check's, which may be running beside it, is left alone. And no
    check writes its programs' files straight into OUT."""
    first = new_check(out, jobs=1)
    with open(os.path.join(first.work, "rank0.json"), "w") as f:
        f.write("{}")
    other = gpu_check.Check("other", new_check_args(out))
    with open(os.path.join(other.work, "kept"), "w") as f:
        f.write("mine")
    again = new_check(out, jobs=1)
    if again.work != first.work or not os.path.isdir(again.work):
        fail("work folders %s then %s" % (first.work, again.work))
    if os.listdir(again.work):
        fail("a check run again found its last run's files: %s" % os.listdir(again.work))
    if not os.path.exists(os.path.join(other.work, "kept")):
        fail("a check emptied another check's work folder")
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("gpu_") and name.endswith(".py") and name != "gpu_check.py" \
                and name != os.path.basename(__file__):
            with open(os.path.join(here, name)) as f:
                if "check.out" in f.read():
                    fail("%s writes into OUT itself, not its work folder" % name)


# The checks whose programs allocate what cudaMemGetInfo calls free, or count
# the free memory: anything beside them fails or misleads them.
FILLS_DEVICE = {
    "gpu_ipc_check": "ipc_check.cu allocates the free memory less a margin",
    "gpu_driver_facts": "driver_probe allocates free - 64 MiB, counts what a cuMemCreate takes",
}


def configured_checks(build):
    """Each GPU check as ctest will run it: RUN_SERIAL where it fills the
    device, PROCESSORS equal to the --jobs it is given."""
    out = subprocess.run(["ctest", "--show-only=json-v1", "-L", "^gpu$"], cwd=build,
                         capture_output=True, text=True, check=True).stdout
    tests = {t["name"]: t for t in json.loads(out)["tests"]}
    for name, why in FILLS_DEVICE.items():
        if name not in tests:
            fail("no check %s configured" % name)
    for name, test in tests.items():
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        cmd = test.get("command", [])
        jobs = int(cmd[cmd.index("--jobs") + 1]) if "--jobs" in cmd else 1
        if name in FILLS_DEVICE and props.get("RUN_SERIAL") is not True:
            fail("%s does not run alone, yet %s" % (name, FILLS_DEVICE[name]))
        if props.get("PROCESSORS", 1) != jobs:
            fail("%s runs %d programs at once but ctest counts %s"
                 % (name, jobs, props.get("PROCESSORS", 1)))


def main():
    for test in (ordered_and_concurrent, failures_keep_their_logs, work_starts_empty):
        with tempfile.TemporaryDirectory() as out:
            test(out)
    if len(sys.argv) > 1:
        configured_checks(sys.argv[1])
    print("%s: PASS" % NAME)


if __name__ == "__main__":
    main()
