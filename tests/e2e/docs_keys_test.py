#!/usr/bin/env python3
"""docs_keys_test.py: the documentation's CUDALLOC_CONF tables say what the
library says of itself.

Runs e2e_leaks with libcudalloc.so preloaded and CUDALLOC_CONF=help:1 (the
library prints its key table), and checks README.md's table (every key, in
the library's order, with the library's own default and accepted text) and
docs/LEAKS.md's table of report keys (each a key of the library's, with its
default). The meaning columns are the documents' own words.

Environment: as leak_report_test.py (set by tests/e2e/CMakeLists.txt), and
CUDALLOC_SOURCE_DIR, the source tree. Prints one PASS or FAIL line.
"""
import os
import re
import subprocess
import sys

PREFIX = "cudalloc:   "


def library_keys():
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.environ["E2E_MOCK_DIR"]
    env["LD_PRELOAD"] = os.environ["E2E_PRELOAD"]
    env["CUDALLOC_CONF"] = "help:1,leak_report:0"
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    run = subprocess.run([os.environ["E2E_LEAKS_PROG"], "clean"], env=env,
                         capture_output=True, text=True, timeout=60)
    keys = []
    for line in run.stderr.splitlines():
        if line.startswith(PREFIX):
            name, default, accepted, _ = re.split(r"\s{2,}", line[len(PREFIX):], maxsplit=3)
            keys.append((name, default, accepted))
    return keys, run


def doc_rows(path):
    """(key, cells) of each table row naming a key in backquotes."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^\| `([a-z_]+)` \|(.*)\|\s*$", line)
            if m:
                rows.append((m.group(1), [c.strip() for c in m.group(2).split("|")]))
    return rows


def main():
    src = os.environ["CUDALLOC_SOURCE_DIR"]
    keys, run = library_keys()
    if len(keys) < 10:
        print(f"FAIL docs_keys: help:1 printed {len(keys)} keys:\n{run.stderr}")
        return 1
    problems = []
    readme = doc_rows(os.path.join(src, "README.md"))
    table = [(k, c[0], c[1]) for k, c in readme]
    if [k for k, _, _ in table] != [k for k, _, _ in keys]:
        problems.append(f"README.md lists {[k for k, _, _ in table]}, the library "
                        f"{[k for k, _, _ in keys]}")
    for (k, d, a), (lk, ld, la) in zip(table, keys):
        if k == lk and (d, a) != (ld, la):
            problems.append(f"README.md says {k}: default '{d}', accepted '{a}'; "
                            f"the library: '{ld}', '{la}'")
    defaults = {k: d for k, d, _ in keys}
    for k, cells in doc_rows(os.path.join(src, "docs", "LEAKS.md")):
        if k not in defaults:
            problems.append(f"docs/LEAKS.md names {k}, which the library does not know")
        elif cells[0] != defaults[k]:
            problems.append(f"docs/LEAKS.md says {k} defaults to '{cells[0]}'; "
                            f"the library: '{defaults[k]}'")
    if problems:
        print("FAIL docs_keys: " + "; ".join(problems))
        return 1
    print(f"PASS docs_keys: README.md's {len(table)} keys and docs/LEAKS.md's report keys "
          "agree with help:1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
