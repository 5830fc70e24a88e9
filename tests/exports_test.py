#!/usr/bin/env python3
"""exports_test.py LIBRARY SRC_DIR INCLUDE_DIR: libcudalloc.so's exported
ABI is exactly the hooked driver functions (src/driver/driver_api.h), dlsym, and
the public API (include/cudalloc.h): nothing meant for tests, nothing left
over. Reads the dynamic symbol table with nm. Prints one PASS or FAIL line.
"""
import re
import subprocess
import sys


def main(argv):
    lib, src, inc = argv[1], argv[2], argv[3]
    api = open(f"{src}/driver/driver_api.h", encoding="utf-8").read()
    hooked_list = api[api.index("#define CA_DRIVER_HOOKED"):api.index("#define CA_DRIVER_USED")]
    want = set(re.findall(r"X\((cu\w+),", hooked_list)) | {"dlsym"}
    header = open(f"{inc}/cudalloc.h", encoding="utf-8").read()
    want |= set(re.findall(r"CUDALLOC_API [^;(]*?\b(cudalloc_\w+)\(", header))
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    if nm.returncode != 0:
        print(f"FAIL exports: nm failed: {nm.stderr.strip()}")
        return 1
    have = {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[1:2] == ["T"]}
    extra, missing = sorted(have - want), sorted(want - have)
    if extra or missing:
        print(f"FAIL exports: exported but not ours to export: {extra}; expected but missing: {missing}")
        return 1
    print(f"PASS exports: {len(have)} functions exported, exactly the hooked driver functions, "
          "dlsym and the public API")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
