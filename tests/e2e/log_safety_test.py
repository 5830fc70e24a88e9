#!/usr/bin/env python3
"""log_safety_test.py [CHECK...]: the library writes only where it was asked.

Runs tests/e2e/e2e_leaks (through leak_report_test.py's runner) with
libcudalloc.so preloaded and checks that its output never hangs the program,
never lands in a file the program or another user owns, never follows a
planted symbolic link, and never changes the exit status:

  refused_paths  log_path naming a FIFO with no reader, a directory, a
                 symbolic link in a sticky world-writable directory,
                 /dev/full, a missing directory, another user's file (as
                 root) or a read-only file (as any other user): one line
                 says why, the report goes to stderr, nothing blocks, the
                 link's target is untouched
  private_file   the log file is created readable by its owner only
  fd_reused      a daemon-like program closes the log's descriptor and opens
                 its own data file under the same number: the data file
                 keeps exactly the program's bytes, the report goes to the
                 log file, opened again
  stderr_taken   stderr closed and reopened as the program's data file:
                 nothing is written into it (the report goes to log_path
                 when one is set)
  stderr_log     stderr re-pointed at a log of the program's own, opened to
                 append: the report goes there
  stdout         log_path:stdout sends the report to stdout
  sigpipe        stderr a pipe whose reader is gone: the exit status is the
                 program's (0, or leak_exitcode's), never death by SIGPIPE
  suppressions   suppressions naming a FIFO or a missing file: one line,
                 no hang; a file of many bad lines, with control bytes: five
                 named, escaped, the rest counted (text and JSON)
  settings       CUDALLOC_CONF as people write it: leak_report:off and
                 stats:yes work; memory_limit_mb:1 is refused in one line
                 naming what works, and allocations are served; a fraction
                 whose double rounds to 1 is accepted; a too-long path says
                 the limit; a flood of bad items stops after five, escaped

Environment: as leak_report_test.py (set by tests/e2e/CMakeLists.txt).
Each check prints one PASS or FAIL line; exit status 1 when any failed.
"""
import json
import os
import stat
import sys

import leak_report_test as lr

from leak_report_test import CheckFailed, expect, lines_of, one_report, read_file, run

FULL_SUMMARY = f"SUMMARY: {lr.LEAKED_BYTES} bytes leaked in {lr.LEAKED_COUNT} allocations"
ONE_MIB_SUMMARY = "SUMMARY: 1048576 bytes leaked in 1 allocations"
DATA = "program data\n"
HANG_S = 20  # nothing here may take this long: a run that does hung


def refusal(path, why):
    return f"log_path: cannot write to '{path}': {why}; writing to stderr instead"


def expect_report_on_stderr(r, other_lines, summary=FULL_SUMMARY):
    rep, other = one_report(r, lines_of(r, r.err), r.pid)
    expect(other == other_lines, f"lines outside the report {other}, want {other_lines}", r)
    expect(rep["summary"] == summary, f"summary '{rep['summary']}', want '{summary}'", r)


def check_refused_paths(tmp):
    shared = os.path.join(tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)  # like /tmp: world-writable, sticky
    victim = os.path.join(tmp, "victim")
    with open(victim, "w") as f:
        f.write("victim\n")
    cases = []

    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    cases.append(("FIFO", fifo, "not a regular file (a FIFO with no reader)", None))
    directory = os.path.join(tmp, "dir")
    os.mkdir(directory)
    cases.append(("directory", directory, "Is a directory", None))
    link = os.path.join(shared, "x.log")
    os.symlink(victim, link)
    cases.append(("symlink", link, "it is a symbolic link, which is not followed", victim))
    cases.append(("/dev/full", "/dev/full",
                  "not a regular file (a FIFO, a device, a socket or a directory)", None))
    cases.append(("missing directory", os.path.join(tmp, "nowhere", "x.log"),
                  "No such file or directory", None))
    theirs = os.path.join(tmp, "theirs.log")
    with open(theirs, "w") as f:
        f.write("victim\n")
    if os.geteuid() == 0:
        os.chown(theirs, 65534, 65534)  # nobody's
        os.chmod(theirs, 0o666)
        cases.append(("another user's file", theirs, "it belongs to another user", theirs))
    else:
        os.chmod(theirs, 0o400)
        cases.append(("read-only file", theirs, "Permission denied", theirs))
    for name, path, why, untouched in cases:
        r = run("leaks", f"log_path:{path}", timeout=HANG_S)
        try:
            expect_report_on_stderr(r, [refusal(path, why)])
        except CheckFailed as e:
            raise CheckFailed(f"{name}: {e.reason}", e.runs)
        if untouched:
            expect(read_file(r, untouched) == "victim\n", f"{name}: {untouched} was written to", r)
    return f"{len(cases)} paths refused with one line each: " + ", ".join(c[0] for c in cases)


def check_private_file(tmp):
    old = os.umask(0)  # whatever the mode is, it is the library's choice
    try:
        r = run("leaks", f"log_path:{tmp}/run.%p.log")
    finally:
        os.umask(old)
    path = os.path.join(tmp, f"run.{r.pid}.log")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    expect(mode == 0o600, f"{path} was created with mode {mode:o}, want 600", r)
    one_report(r, lines_of(r, read_file(r, path), path), r.pid)
    return "created 0600 under umask 0"


def check_fd_reused(tmp):
    data = os.path.join(tmp, "data")
    r = run("daemon", f"log_path:{tmp}/run.%p.log,verbose:1", data)
    log_fd, data_fd = r.integer("log_fd"), r.integer("data_fd")
    expect(log_fd == data_fd, f"the data file got descriptor {data_fd}, the log had {log_fd}: "
           "the case is not made", r)
    expect(read_file(r, data) == DATA, "the program's data file holds more than its data", r)
    log = os.path.join(tmp, f"run.{r.pid}.log")
    lines = lines_of(r, read_file(r, log), log)
    rep, other = one_report(r, lines, r.pid)
    expect(other and other[0].startswith("out of memory on device 0")
           and other[-2].startswith("what would help:"),
           f"log lines outside the report: {other}, want the out-of-memory report", r)
    expect(rep["summary"] == ONE_MIB_SUMMARY, f"summary '{rep['summary']}'", r)
    expect(r.err == "", "the library wrote to stderr", r)
    return f"descriptor {data_fd} reused: data file untouched, report in the log"


def check_stderr_taken(tmp):
    data = os.path.join(tmp, "data")
    r = run("stderrfile", "", data)
    expect(read_file(r, data) == DATA, "the report went into the file the program opened as fd 2", r)
    r = run("stderrfile", f"log_path:{tmp}/run.%p.log", data)
    expect(read_file(r, data) == DATA, "with log_path, fd 2's data file was written to", r)
    log = os.path.join(tmp, f"run.{r.pid}.log")
    rep, _ = one_report(r, lines_of(r, read_file(r, log), log), r.pid)
    expect(rep["summary"] == ONE_MIB_SUMMARY, f"summary '{rep['summary']}'", r)
    return "fd 2's data file untouched; with log_path the report is in the log"


def check_stderr_log(tmp):
    log = os.path.join(tmp, "own.log")
    r = run("stderrlog", "", log)
    rep, other = one_report(r, lines_of(r, read_file(r, log), log), r.pid)
    expect(not other and rep["summary"] == ONE_MIB_SUMMARY,
           f"the program's own log holds {other} and '{rep['summary']}'", r)
    return "the report follows stderr into the program's own log"


def check_stdout(tmp):
    r = run("leaks", "log_path:stdout")
    expect(r.err == "", "the library wrote to stderr with log_path:stdout", r)
    ours = "\n".join(line for line in r.out.splitlines() if line.startswith(lr.PREFIX))
    rep, other = one_report(r, lines_of(r, ours, "stdout"), r.pid)
    expect(not other and rep["summary"] == FULL_SUMMARY, f"stdout: {other}, '{rep['summary']}'", r)
    return "the report on stdout, nothing on stderr"


def run_into_dead_pipe(conf, expect_rc):
    read_end, write_end = os.pipe()
    os.close(read_end)  # a `| head` that is done, a log collector that died
    try:
        return run("leaks", conf, expect_rc=expect_rc, stderr=write_end, timeout=HANG_S)
    finally:
        os.close(write_end)


def check_sigpipe(tmp):
    run_into_dead_pipe("", 0)
    run_into_dead_pipe("report_format:json", 0)
    run_into_dead_pipe("leak_exitcode:23", 23)
    # The line refusing a log_path goes to stderr too, before any report.
    run_into_dead_pipe("log_path:/dev/full", 0)
    return ("exit status 0 (23 with leak_exitcode:23) with stderr a closed pipe, "
            "a refused log_path's line included")


def check_suppressions(tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    missing = os.path.join(tmp, "missing.supp")
    for path, why in [(fifo, "not a regular file (a FIFO, a device, a socket or a directory)"),
                      (missing, "No such file or directory")]:
        r = run("leaks", f"suppressions:{path}", timeout=HANG_S)
        expect_report_on_stderr(r, [f"suppressions: cannot read '{path}': {why}; no leak is suppressed"])
    flood = os.path.join(tmp, "flood.supp")
    with open(flood, "w") as f:
        f.write("\x1b[31mred\n" + "".join(f"bad line {i}\n" for i in range(11)) + "leak:leak_small\n")
    r = run("leaks", f"suppressions:{flood},backtrace_depth:16", timeout=HANG_S)
    expect("\x1b" not in r.err, "a raw escape byte from the file reached stderr", r)
    rep, other = one_report(r, lines_of(r, r.err), r.pid)
    want = [f"suppressions: {flood}:1: '\\x1b[31mred' ignored (expected leak:<pattern>)"]
    want += [f"suppressions: {flood}:{n}: 'bad line {n - 2}' ignored (expected leak:<pattern>)"
             for n in range(2, 6)]
    want += [f"suppressions: {flood}: ... and 7 more bad lines ignored"]
    expect(other == want, f"warnings {other}, want {want}", r)
    expect("4096 bytes in 1 allocations suppressed" in rep["summary"],
           f"the good rule after the flood was not applied: '{rep['summary']}'", r)
    r = run("leaks", f"suppressions:{flood},report_format:json", timeout=HANG_S)
    docs = [json.loads(line) for line in r.err.splitlines()]
    warnings = [d["message"] for d in docs if d.get("event") == "warning"]
    expect(len(warnings) == 6 and warnings[0].startswith(f"suppressions: {flood}:1: '\x1b[31mred'"),
           f"JSON warnings {warnings}", r)
    return "FIFO and missing file refused in one line each; 5 of 12 bad lines named, escaped"


def conf_lines(r):
    """The library's lines outside its report: what it said of the settings."""
    _, other = one_report(r, lines_of(r, r.err), r.pid)
    return other


def check_settings(tmp):
    r = run("leaks", "leak_report:off")
    expect(r.err == "", "leak_report:off printed something", r)
    r = run("clean", "leak_report:NO,stats:yes")
    expect("memory summary" in r.err and "no device memory leaks" not in r.err,
           "leak_report:NO,stats:yes did not turn the report off and the summary on", r)
    r = run("leaks", "memory_limit_mb:1")
    want = ["CUDALLOC_CONF: memory_limit_mb:1 is out of range (accepted: 0 (no limit) or an integer "
            "number of MiB >= 2); memory_limit_mb stays 0 (no limit)"]
    expect(conf_lines(r) == want, f"said {conf_lines(r)}, want {want}", r)
    r = run("leaks", "garbage_collection_threshold:0.99999999999999999999")
    expect(conf_lines(r) == [], f"a fraction in (0,1) was refused: {conf_lines(r)}", r)
    r = run("leaks", "log_path:/" + "a" * 600)
    said = conf_lines(r)
    expect(len(said) == 1 and "is too long (601 bytes; at most 511)" in said[0],
           f"a 601-byte path: {said}", r)
    flood = ",".join(f"bad{i}" for i in range(20)) + ",verbose:[2J"
    r = run("leaks", "verbose:[2J," + flood)
    said = conf_lines(r)
    expect("" not in r.err, "a raw escape byte of CUDALLOC_CONF reached stderr", r)
    expect(len(said) == 6 and said[0].startswith("CUDALLOC_CONF: verbose:\\x1b[2J is not a decimal number")
           and said[5] == "CUDALLOC_CONF: ... and 17 more bad items, ignored like those",
           f"22 bad items: {said}", r)
    return "off/yes/NO accepted; limit 1 refused; 0.999...9 accepted; length and flood said"


CHECKS = {
    "refused_paths": check_refused_paths,
    "private_file": check_private_file,
    "fd_reused": check_fd_reused,
    "stderr_taken": check_stderr_taken,
    "stderr_log": check_stderr_log,
    "stdout": check_stdout,
    "sigpipe": check_sigpipe,
    "suppressions": check_suppressions,
    "settings": check_settings,
}

if __name__ == "__main__":
    sys.exit(lr.main(sys.argv, CHECKS, "log_safety"))
