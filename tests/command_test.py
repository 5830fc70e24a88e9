#!/usr/bin/env python3
"""command_test.py CHECK: the cudalloc command (scripts/cudalloc) where a
newcomer goes wrong, each answered in one line starting "cudalloc: ".

  view_force   cudalloc view writes over no existing file, the default
               mem.html included, unless --force says so
  run_missing  cudalloc run -- PROGRAM that cannot be run: the shell's
               status (127 not found, 126 not executable), judged before
               exec as the shell would, following PATH
  top_library  from a source tree, cudalloc top runs the cudalloc-top built
               beside the library it found (CUDALLOC_LIBRARY's build
               folder), and where there is none names the build to make

Environment (set by tests/CMakeLists.txt): CUDALLOC_COMMAND, the command;
CUDALLOC_LIBRARY, the built library. No GPU, no mock driver. Prints one PASS
or FAIL line.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

COMMAND = os.environ["CUDALLOC_COMMAND"]


class Failed(Exception):
    pass


def expect(ok, why):
    if not ok:
        raise Failed(why)


def cudalloc(*args, cwd=None, command=COMMAND, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("CUDALLOC_TOP", "LD_PRELOAD")}
    full.update(env)
    return subprocess.run([command, *args], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=60)


def said(r):
    return f"exit {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr!r}"


def one_line(r, status, text):
    """Exit status `status`, nothing on stdout, and exactly `text` on stderr."""
    expect(r.returncode == status and r.stdout == "" and r.stderr == f"cudalloc: {text}\n",
           f"want exit {status} and 'cudalloc: {text}'; got {said(r)}")


def program(path, mode=0o755):
    with open(path, "w") as f:
        f.write("#!/bin/sh\necho \"$0 ran with $*\"\n")
    os.chmod(path, mode)
    return path


def check_view_force(tmp):
    trace = os.path.join(tmp, "t.json")
    with open(trace, "w") as f:  # one 1 MiB allocation, freed
        json.dump([{"name": "cudalloc_trace", "ph": "M", "pid": 1, "args": {"version": 2}},
                   {"ph": "b", "id": "0x1", "pid": 1, "ts": 0, "args": {"bytes": 1 << 20}},
                   {"ph": "e", "id": "0x1", "pid": 1, "ts": 10}], f)
    first = cudalloc("view", trace, cwd=tmp)
    expect(first.returncode == 0 and os.path.getsize(os.path.join(tmp, "mem.html")) > 0,
           f"no mem.html made where there was none: {said(first)}")
    for args, out in ((["view", trace], "mem.html"),
                      (["view", trace, "-o", "mine.html"], "mine.html"),
                      (["view", "--torch-snapshot", "mine.pickle", trace], "mine.pickle")):
        path = os.path.join(tmp, out)
        with open(path, "w") as f:
            f.write("mine")
        one_line(cudalloc(*args, cwd=tmp), 2, f"{out} exists: add --force to write over it")
        expect(open(path).read() == "mine", f"cudalloc {' '.join(args)} wrote over {out}")
        forced = cudalloc(*args, "--force", cwd=tmp)
        expect(forced.returncode == 0 and f"{out} (replaced)" in forced.stdout and
               os.path.getsize(path) > len("mine"), f"--force over {out}: {said(forced)}")
    helped = cudalloc("view", "--help")
    expect("--force" in helped.stdout, "cudalloc view --help says nothing of --force")
    return "mem.html, -o and --torch-snapshot files kept, one line naming --force; replaced with it"


def check_run_missing(tmp):
    one_line(cudalloc("run", "--", "no-such-program"), 127, "no-such-program: command not found")
    gone = os.path.join(tmp, "gone")
    one_line(cudalloc("run", "--", gone), 127, f"{gone}: no such file or directory")
    one_line(cudalloc("run", "--", tmp), 126, f"{tmp}: is a directory")
    first, second = os.path.join(tmp, "first"), os.path.join(tmp, "second")
    os.makedirs(first)
    os.makedirs(second)
    plain = program(os.path.join(first, "tool"), 0o644)
    one_line(cudalloc("run", "--", plain), 126, f"{plain}: not executable (permission denied)")
    path = f"{first}:{os.environ['PATH']}"
    one_line(cudalloc("run", "--", "tool", PATH=path), 126,
             "tool: not executable (permission denied)")
    # As the shell: an executable later on PATH wins over a file that is not.
    program(os.path.join(second, "tool"))
    ran = cudalloc("run", "--", "tool", "x", PATH=f"{first}:{second}:{os.environ['PATH']}")
    expect(ran.returncode == 0 and ran.stdout == f"{second}/tool ran with x\n",
           f"the executable tool later on PATH: {said(ran)}")
    # A folder named so on PATH is passed over, as the shell does.
    os.makedirs(os.path.join(first, "dir-tool"))
    one_line(cudalloc("run", "--", "dir-tool", PATH=path), 127, "dir-tool: command not found")
    # An empty PATH entry is the current folder.
    here = cudalloc("run", "--", "tool", cwd=second, PATH=f"/nonexistent::{os.environ['PATH']}")
    expect(here.returncode == 0 and here.stdout.endswith("tool ran with \n"),
           f"tool in the current folder through an empty PATH entry: {said(here)}")
    return "127 not found, 126 not executable or a folder, PATH followed as the shell does"


def check_top_library(tmp):
    tree = os.path.join(tmp, "tree")
    os.makedirs(os.path.join(tree, "scripts"))
    os.makedirs(os.path.join(tree, "build"))
    command = shutil.copy(COMMAND, os.path.join(tree, "scripts", "cudalloc"))
    program(os.path.join(tree, "build", "cudalloc-top"))  # another build's viewer
    elsewhere = os.path.join(tmp, "build-mine")
    os.makedirs(elsewhere)
    lib = os.path.join(elsewhere, "libcudalloc.so")
    open(lib, "w").close()
    open(os.path.join(elsewhere, "CMakeCache.txt"), "w").close()
    viewer = program(os.path.join(elsewhere, "cudalloc-top"))
    ran = cudalloc("top", "--once", command=command, CUDALLOC_LIBRARY=lib)
    expect(ran.returncode == 0 and ran.stdout == f"{viewer} ran with --once\n",
           f"not the viewer beside CUDALLOC_LIBRARY: {said(ran)}")
    os.remove(viewer)
    os.remove(os.path.join(tree, "build", "cudalloc-top"))
    none = cudalloc("top", "--once", command=command, CUDALLOC_LIBRARY=lib)
    expect(none.returncode == 2 and none.stdout == "" and none.stderr.count("\n") == 1 and
           none.stderr.startswith("cudalloc: ") and
           f"(cmake --build {elsewhere} --target cudalloc-top)" in none.stderr,
           f"no viewer anywhere: {said(none)}")
    return "the viewer beside CUDALLOC_LIBRARY run; without one, the line names its build"


CHECKS = {"view_force": check_view_force, "run_missing": check_run_missing,
          "top_library": check_top_library}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) == 2 else ""
    if name not in CHECKS:
        sys.exit(f"usage: command_test.py {'|'.join(CHECKS)}")
    tmp = tempfile.mkdtemp(prefix=f"command_{name}.")
    try:
        print(f"PASS command {name}: {CHECKS[name](tmp)}")
    except Failed as e:
        print(f"FAIL command {name}: {e}")
        sys.exit(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
