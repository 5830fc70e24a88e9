#!/usr/bin/env python3
"""layers_test.py SRC_DIR: the library's structure, checked from its source.

docs/ARCHITECTURE.md draws the layers: the program reaches the hooks, the
hooks the policy, the policy the registry, the registry the pool, the pool
its backend, the backend the driver. Side modules (settings, output, locks,
the stack depot, the report, ...) are called from anywhere and call only
other side modules. This test reads every file of SRC_DIR and checks:

  1. every module (a .c and its .h share a name; a folder of src/ is one
     module)
     is placed below, in a layer or among the side modules;
  2. every #include "..." goes down the layers (to a module of a lower
     rank) or to a side module, and a side module includes only side
     modules: so there is no cycle;
  3. only dl.c and hooks.c call dlsym (every other look-up must not meet
     the library's own exported dlsym: dl.h);
  4. no file-static function name is defined in two files (a reader
     meeting ca__find should know which one is meant);
  5. only meta.c calls pthread_create: every thread of the library runs
     on a stack of meta memory, which the leak scan leaves out (meta.h).

Prints one PASS line, or a FAIL line per problem; exit status 1 on failure.
"""
import os
import re
import sys

# Rank by layer (tens) and within a layer (units): an include must go to a
# strictly lower rank.
LAYERED = {
    "hooks": 50, "api": 50,                      # how the program reaches us
    "slot": 44, "intercept": 43, "pointer": 42, "ranges": 42, "lifecycle": 42,  # the policy
    "registry": 30,                              # pools per context
    "pool": 20,                                  # CUDA-free
    "backend_cuda": 14, "marks": 13, "streams": 12, "capture": 11,  # backend
    "driver": 1, "driver_api": 0,                # the real driver
}
SIDE = {
    "cudalloc", "backend", "budget", "config", "log", "lock", "lazy", "fork",
    "dl", "grow", "stats", "track", "stacks", "unwind", "symbolize", "report",
    "reader", "uthash", "sites", "recorded", "addrmap", "graphs", "pyframes", "depot", "meta", "reach", "publish", "trace",
    "top",  # the cudalloc-top program: it reads publish.h, nothing else of ours
}


def module_of(path, src):
    """A file's module: its folder under src/, or its name without the
    extension (a .c and its .h are one module)."""
    rel = os.path.relpath(path, src)
    if os.sep in rel:
        return rel.split(os.sep)[0]
    return os.path.splitext(rel)[0]


def sources(src):
    for root, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                yield os.path.join(root, f)


def static_definitions(code):
    """Names of the file-static functions `code` defines (not declares)."""
    for m in re.finditer(r"^static [^=;(]*?\b(ca__\w+)\(", code, re.M):
        rest = code[m.end():]
        brace, semi = rest.find("{"), rest.find(";")
        if brace >= 0 and (semi < 0 or brace < semi):
            yield m.group(1)


def main(argv):
    src = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    problems = []
    statics = {}
    for path in sources(src):
        mod = module_of(path, src)
        rel = os.path.relpath(path, src)
        if mod not in LAYERED and mod not in SIDE:
            problems.append(f"{rel}: module '{mod}' is in no layer (tests/layers_test.py)")
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
            target = inc.split("/")[0] if "/" in inc else os.path.splitext(inc)[0]
            if target == mod:
                continue
            if target not in LAYERED and target not in SIDE:
                problems.append(f"{rel}: includes '{inc}', in no layer")
            elif mod in SIDE and target in LAYERED:
                problems.append(f"{rel}: side module '{mod}' includes '{inc}' of a layer")
            elif mod in LAYERED and target in LAYERED and LAYERED[target] >= LAYERED[mod]:
                problems.append(f"{rel}: '{mod}' (rank {LAYERED[mod]}) includes '{inc}' "
                                f"(rank {LAYERED[target]}): not down the layers")
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
        if mod not in ("dl", "hooks") and re.search(r"(?<![\w.>])dlsym\s*\(", code):
            problems.append(f"{rel}: calls dlsym (use ca_dl_sym, dl.h)")
        if mod != "meta" and re.search(r"\bpthread_create\s*\(", code):
            problems.append(f"{rel}: calls pthread_create (use ca_meta_thread, meta.h)")
        if path.endswith(".c"):
            for name in set(static_definitions(code)):
                statics.setdefault(name, []).append(rel)
    for name, files in sorted(statics.items()):
        if len(files) > 1:
            problems.append(f"static {name} is defined in {', '.join(sorted(files))}")
    if problems:
        for p in problems:
            print(f"FAIL layers: {p}")
        return 1
    print(f"PASS layers: every include goes down the layers or to a side module; "
          f"dlsym only in dl.c and hooks.c; threads only from meta.c; {len(statics)} static names, each in one file")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
