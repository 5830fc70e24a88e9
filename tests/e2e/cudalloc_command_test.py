#!/usr/bin/env python3
"""cudalloc_command_test.py [CHECK...]: the `cudalloc` command (scripts/cudalloc).

`cudalloc run` in front of the mock driver: the program's exit status and
death by signal come back unchanged, leak_exitcode works, the leak report
appears (in --log's file when asked), an LD_PRELOAD and a CUDALLOC_CONF
already set are kept, a Python program gets its report too; the usage
messages and --version. The library is named by CUDALLOC_LIBRARY (the
build's); finding it beside an installed command is install_test's.
"""
import os
import re
import subprocess
import sys

from leak_report_test import MOCK_DIR, PRELOAD, PROG, CheckFailed, expect, main

HERE = os.path.dirname(os.path.abspath(__file__))
COMMAND = os.path.join(HERE, "..", "..", "scripts", "cudalloc")
LIB = PRELOAD.split(":")[-1]


class CmdRun:
    def __init__(self, args, proc):
        self.args, self.rc, self.out, self.err = args, proc.returncode, proc.stdout, proc.stderr

    def describe(self):
        return "\n".join([f"  run: cudalloc {' '.join(self.args)}  exit status {self.rc}",
                          "  --- stdout"] + ["  | " + l for l in self.out.splitlines()[-20:]] +
                         ["  --- stderr"] + ["  | " + l for l in self.err.splitlines()[-30:]])


def cudalloc(*args, env_add=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("E2E_") and k not in ("LD_PRELOAD", "CUDALLOC_CONF")}
    env.update(LD_LIBRARY_PATH=MOCK_DIR, CUDALLOC_LIBRARY=LIB, PYTHONDONTWRITEBYTECODE="1")
    env.update(env_add or {})
    proc = subprocess.run([COMMAND, *args], env=env, capture_output=True, text=True, timeout=120)
    return CmdRun(args, proc)


def check_status(tmp):
    """The program's exit status, and its death by a signal, are cudalloc's."""
    r = cudalloc("run", "--", "sh", "-c", "exit 7")
    expect(r.rc == 7, "exit status not passed through", r)
    s = cudalloc("run", "--", "sh", "-c", "kill -TERM $$")
    expect(s.rc == -15, f"a program killed by SIGTERM came back as {s.rc}", s)
    missing = os.path.join(tmp, "no-such-program")
    m = cudalloc("run", "--", missing)
    expect(m.rc == 127 and m.err == f"cudalloc: {missing}: no such file or directory\n",
           f"a missing program gave {m.rc}, want 127 as the shell, and one line", m)
    n = cudalloc("run", "--", "no-such-program-on-path")
    expect(n.rc == 127 and n.err == "cudalloc: no-such-program-on-path: command not found\n",
           f"a program not on PATH gave {n.rc}", n)
    x = cudalloc("run", "--", tmp)
    expect(x.rc == 126 and x.err == f"cudalloc: {tmp}: is a directory\n",
           f"a folder as the program gave {x.rc}", x)
    return "7 as 7, SIGTERM as SIGTERM, a missing program 127, a folder 126, each one line"


def check_report(tmp):
    """--conf reaches the library: the report with stacks, leak_exitcode."""
    r = cudalloc("run", "--conf", "backtrace_depth:16", "--conf=leak_exitcode:23", "--", PROG, "leaks")
    expect(r.rc == 23, f"exit status {r.rc}, want leak_exitcode 23", r)
    expect(re.search(r"^cudalloc: +#0 .* in leak_big ", r.err, re.M)
           and "preloaded=1" in r.out, "no report naming leak_big", r)
    return "leak_exitcode 23, frames shown"


def check_log(tmp):
    """--log FILE: the report in the file, nothing on stderr."""
    log = os.path.join(tmp, "run.%p.log")
    r = cudalloc("run", "--log", log, "--", PROG, "leaks")
    files = [f for f in os.listdir(tmp) if f.startswith("run.")]
    text = open(os.path.join(tmp, files[0])).read() if len(files) == 1 else ""
    expect(r.rc == 0 and r.err == "" and "SUMMARY: 2101248 bytes leaked" in text,
           f"stderr {r.err!r}, log files {files}", r)
    bad = cudalloc("run", "--log", os.path.join(tmp, "a,b"), "--", "true")
    expect(bad.rc == 2 and "may not contain ','" in bad.err, "a log path with ',' was taken", bad)
    return f"report in {files[0]}"


def check_environment(tmp):
    """An LD_PRELOAD and a CUDALLOC_CONF already set are kept, ours first."""
    r = cudalloc("run", "--conf", "leak_exitcode:23", "--", "sh", "-c",
                 'printf "%s|%s" "$LD_PRELOAD" "$CUDALLOC_CONF"',
                 env_add={"LD_PRELOAD": "libm.so.6", "CUDALLOC_CONF": "backtrace_depth:8"})
    expect(r.out == f"{LIB}:libm.so.6|backtrace_depth:8,leak_exitcode:23",
           f"the program saw {r.out!r}", r)
    twice = cudalloc("run", "--", "sh", "-c", 'printf "%s" "$LD_PRELOAD"', env_add={"LD_PRELOAD": LIB})
    expect(twice.out == LIB, f"the library preloaded twice: {twice.out!r}", twice)
    return r.out


def check_python(tmp):
    """A Python program, run as `cudalloc run -- python3 script`."""
    r = cudalloc("run", "--conf", "backtrace_depth:16,report_reachable:1", "--", sys.executable,
                 os.path.join(HERE, "py_alloc.py"), "leak")
    expect(r.rc == 0 and "8388608 bytes still reachable in 8 allocation(s)" in r.err,
           "no report of the 8 kept blocks", r)
    if (3, 9) <= sys.version_info[:2] <= (3, 13):
        expect("in keep_step " in r.err, "no Python frame in the report", r)
    return "the report, with its Python frames"


def check_usage(tmp):
    """--help reads like a man page; mistakes are one line and status 2."""
    h = cudalloc("--help")
    expect(h.rc == 0 and all(w in h.out for w in ("SYNOPSIS", "cudalloc run", "EXIT STATUS")),
           "--help", h)
    expect(cudalloc("run", "--help").out == h.out, "run --help differs from --help", h)
    v = cudalloc("--version")
    expect(v.rc == 0 and re.match(r"^cudalloc \d+\.\d+\.\d+ \(/", v.out), f"--version: {v.out!r}", v)
    for args, word in ((("frobnicate",), "unknown command"), (("run",), "no program"),
                       (("run", "--bogus", "true"), "unknown option"), ((), "SYNOPSIS")):
        u = cudalloc(*args)
        expect(u.rc == 2 and word in u.err, f"cudalloc {' '.join(args)}: {u.rc} {u.err!r}", u)
    missing = cudalloc("--version", env_add={"CUDALLOC_LIBRARY": os.path.join(tmp, "none.so")})
    expect(missing.rc == 2 and "CUDALLOC_LIBRARY" in missing.err, "a missing library", missing)
    return v.out.strip()


def check_top_tree(tmp):
    """From a source tree, cudalloc top finds cudalloc-top in any build
    folder beside it (build*/); where none holds it, one line says how to
    build it."""
    import shutil
    tree = os.path.join(tmp, "tree")
    os.makedirs(os.path.join(tree, "scripts"))
    os.makedirs(os.path.join(tree, "build-gpu"))
    shutil.copy(COMMAND, os.path.join(tree, "scripts", "cudalloc"))
    cmd = [os.path.join(tree, "scripts", "cudalloc"), "top", "--once"]
    env = {**os.environ, "CUDALLOC_TOP": ""}
    none = CmdRun(cmd[1:], subprocess.run(cmd, capture_output=True, text=True, env=env))
    expect(none.rc == 2 and "cmake --build build --target cudalloc-top" in none.err
           and none.err.count("\n") == 1, f"no viewer: {none.rc} {none.err!r}", none)
    viewer = os.path.join(tree, "build-gpu", "cudalloc-top")
    with open(viewer, "w") as f:
        f.write("#!/bin/sh\necho viewer ran with \"$*\"\n")
    os.chmod(viewer, 0o755)
    found = CmdRun(cmd[1:], subprocess.run(cmd, capture_output=True, text=True, env=env))
    expect(found.rc == 0 and found.out == "viewer ran with --once\n",
           f"build-gpu/cudalloc-top not run: {found.rc} {found.out!r}", found)
    return "build-gpu/cudalloc-top found; without one, the line says how to build it"


CHECKS = {"top_tree": check_top_tree, "status": check_status, "report": check_report, "log": check_log,
          "environment": check_environment, "python": check_python, "usage": check_usage}

if __name__ == "__main__":
    sys.exit(main(sys.argv, CHECKS, "cudalloc_command"))
