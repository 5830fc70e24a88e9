#!/usr/bin/env python3
"""layers_test.py SRC_DIR [ARCHITECTURE_MD]: the library's structure, checked
from its source.

docs/ARCHITECTURE.md draws the layers, and src/ holds one folder per layer:
the program reaches hooks/, hooks/ the policy/, the policy the registry/,
the registry the pool/, the pool its backend/, the backend the driver/.
Beside them, folders of side modules (support/, leaks/, timeline/, and the
folders of one module each: unwind/, symbolize/, pyframes/, report/, top/)
are called from anywhere and call only each other. A folder may hold
subfolders (policy/slot/): each is part of its folder's layer or side
group, with its own README. This test reads every file of SRC_DIR and
checks:

  1. every file lies in a folder named below or a subfolder of one (at most
     LOOSE_MAX files lie loose in src/), every folder and subfolder has a
     README.md that says what it owns and what it may call, and the
     diagram of ARCHITECTURE.md names exactly the folders there are (a
     subfolder by its path: policy/slot/);
  2. every #include "folder/file.h" goes down the layers (to a folder of a
     lower rank), into the file's own folder, or into a side folder; a side
     folder includes only side folders; a subfolder counts as its folder
     (policy/slot/ is the policy layer's, of its rank, and "policy/x.h" and
     "policy/slot/y.h" include each other freely);
  3. no include cycle between modules (a .c and its .h are one module; a
     folder whose main file includes its other .c files is one module);
  4. only support/dl.c and hooks/hooks.c call dlsym (every other look-up
     must not meet the library's own exported dlsym: dl.h);
  5. no file-static function name is defined in two files (a reader
     meeting ca__find should know which one is meant);
  6. only support/meta.c calls pthread_create: every thread of the library
     runs on a stack of meta memory, which the leak scan leaves out (meta.h);
  7. only support/meta_hash.h includes uthash.h: every table holds device
     addresses in the library's own memory and survives a host out of
     memory (uthash's default is exit(-1) in the program's process).

Prints one PASS line, or a FAIL line per problem; exit status 1 on failure.
"""
import os
import re
import sys

# Rank by layer: an include must go to a strictly lower rank, or stay in
# its folder.
LAYERS = {"hooks": 50, "policy": 40, "concerns": 35, "registry": 30, "pool": 20, "backend": 10, "driver": 0}
SIDE = {"support", "leaks", "timeline", "unwind", "symbolize", "pyframes", "report", "top"}
# Headers from outside src/: the public header and uthash.
OUTSIDE = {"cudalloc.h", "uthash.h"}
LOOSE_MAX = 3
DLSYM_ALLOWED = {"support/dl.c", "hooks/hooks.c"}
THREADS_ALLOWED = {"support/meta.c"}
UTHASH_ALLOWED = {"support/meta_hash.h"}


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


def one_unit_folders(texts):
    """Folders compiled as one unit: a .c of theirs includes another .c."""
    return {os.path.dirname(rel) for rel, text in texts.items()
            if "/" in rel and rel.endswith(".c")
            and re.search(r'^#include "[^"]+\.c"', text, re.M)}


def module(rel, units):
    folder = os.path.dirname(rel)
    return folder if folder in units else os.path.splitext(rel)[0]


def cycle(edges):
    """One include cycle among the modules, as a list, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def diagram_folders(markdown):
    """The folders the first drawing of ARCHITECTURE.md names (a subfolder
    by its path, policy/slot/)."""
    block = markdown.split("```", 2)[1]
    return set(re.findall(r"(?<![\w./])([a-z_]+(?:/[a-z_]+)*)/(?![\w.])", block))


def check_folders(src, arch, problems):
    folders = sorted(os.path.relpath(os.path.join(root, d), src).replace(os.sep, "/")
                     for root, dirs, _ in os.walk(src) for d in dirs)
    loose = sorted(f for f in os.listdir(src) if os.path.isfile(os.path.join(src, f)))
    if len(loose) > LOOSE_MAX:
        problems.append(f"{len(loose)} files loose in src/ (at most {LOOSE_MAX}): {', '.join(loose)}")
    for d in folders:
        if d.split("/")[0] not in LAYERS and d.split("/")[0] not in SIDE:
            problems.append(f"src/{d}/: in no layer and no side group (tests/layers_test.py)")
        readme = os.path.join(src, d, "README.md")
        if not os.path.exists(readme):
            problems.append(f"src/{d}/: no README.md saying what it owns and may call")
        elif "May call" not in open(readme, encoding="utf-8").read():
            problems.append(f"src/{d}/README.md: does not say what it may call ('May call ...')")
    if arch:
        with open(arch, encoding="utf-8") as f:
            drawn = diagram_folders(f.read())
        if drawn != set(folders):
            problems.append(f"the diagram of {os.path.basename(arch)} and src/ differ: "
                            f"drawn only {sorted(drawn - set(folders))}, "
                            f"in src/ only {sorted(set(folders) - drawn)}")
    return folders


def check_include(rel, inc, problems):
    folder = rel.split("/")[0]
    if inc in OUTSIDE:
        return None
    if "/" not in inc:
        problems.append(f"{rel}: includes '{inc}' without its folder")
        return None
    target = inc.split("/")[0]
    if target == folder:
        return target
    if target not in LAYERS and target not in SIDE:
        problems.append(f"{rel}: includes '{inc}', in no layer")
    elif folder in SIDE and target in LAYERS:
        problems.append(f"{rel}: side folder '{folder}' includes '{inc}' of a layer")
    elif folder in LAYERS and target in LAYERS and LAYERS[target] >= LAYERS[folder]:
        problems.append(f"{rel}: '{folder}' (rank {LAYERS[folder]}) includes '{inc}' "
                        f"(rank {LAYERS[target]}): not down the layers")
    return target


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    src = argv[1] if len(argv) > 1 else os.path.join(here, "..", "src")
    arch = argv[2] if len(argv) > 2 else os.path.join(here, "..", "docs", "ARCHITECTURE.md")
    problems = []
    folders = check_folders(src, arch if os.path.exists(arch) else None, problems)
    texts = {}
    for path in sources(src):
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, src).replace(os.sep, "/")] = f.read()
    units = one_unit_folders(texts)
    edges, statics = {}, {}
    for rel, text in texts.items():
        mod = module(rel, units)
        for inc in re.findall(r'^#include "([^"]+)"', text, re.M):
            if check_include(rel, inc, problems) is not None:
                to = module(inc, units)
                if to != mod:
                    edges.setdefault(mod, set()).add(to)
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
        if rel not in DLSYM_ALLOWED and re.search(r"(?<![\w.>])dlsym\s*\(", code):
            problems.append(f"{rel}: calls dlsym (use ca_dl_sym, support/dl.h)")
        if rel not in THREADS_ALLOWED and re.search(r"\bpthread_create\s*\(", code):
            problems.append(f"{rel}: calls pthread_create (use ca_meta_thread, support/meta.h)")
        if rel not in UTHASH_ALLOWED and re.search(r'^#include [<"]uthash\.h[>"]', text, re.M):
            problems.append(f"{rel}: includes uthash.h (include support/meta_hash.h)")
        if rel.endswith(".c"):
            for name in set(static_definitions(code)):
                statics.setdefault(name, []).append(rel)
    loop = cycle(edges)
    if loop:
        problems.append("include cycle: " + " -> ".join(loop))
    for name, files in sorted(statics.items()):
        if len(files) > 1:
            problems.append(f"static {name} is defined in {', '.join(sorted(files))}")
    if problems:
        for p in problems:
            print(f"FAIL layers: {p}")
        return 1
    print(f"PASS layers: {len(folders)} folders, each a layer or side group (or a subfolder of one) "
          f"with its README and in the diagram; every include goes down the layers, within its folder or to "
          f"a side folder; no include cycle among {len(set(edges) | {m for s in edges.values() for m in s})} "
          f"modules; dlsym only in support/dl.c and hooks/hooks.c; threads only from "
          f"support/meta.c; uthash only through support/meta_hash.h; {len(statics)} static names, each in one file")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
