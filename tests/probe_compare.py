#!/usr/bin/env python3
"""driver_probe without and with the library, answer by answer.

    probe_compare.py PLAIN POOLED [COMPATIBILITY_MD]

PLAIN and POOLED are driver_probe's output without and with the library
(tests/mockcuda/driver_probe.c; on the GPU machine, driver_probe_driver).
Every answer must be the same, save the documented differences: the rows of
the table under "## Answers a pooled block cannot give as the driver does"
in docs/COMPATIBILITY.md, each naming a question, the driver's answer and
the library's (`*`: any answer, where it depends on what the pool holds),
and why. A difference the table does not name, or names with
another answer, fails. Prints one PASS or FAIL line (and the failures);
exit 1 on failure. The GPU check (tests/gpu/gpu_identity.py) judges the
real driver's run with compare() alike.
"""

import os
import re
import sys

SECTION = "## Answers a pooled block cannot give as the driver does"
HERE = os.path.dirname(os.path.abspath(__file__))


def answers(text):
    """[(question, answer)] in order; a line without ': ' is its own question."""
    out = []
    for line in text.splitlines():
        q, sep, a = line.rpartition(": ")
        out.append((q, a) if sep else (line, ""))
    return out


def documented(markdown):
    """{question: (driver's answer, the library's)} from the section's table."""
    rows, inside = {}, False
    for line in markdown.splitlines():
        if line.startswith("## "):
            inside = line.strip() == SECTION
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not inside or len(cells) < 4 or not cells[0].startswith("`"):
            continue
        unquote = lambda c: re.sub(r"^`|`$", "", c)  # noqa: E731
        rows[unquote(cells[0])] = (unquote(cells[1]), unquote(cells[2]))
    return rows


def compare(plain, pooled, table):
    """(failures, number of answers, documented differences seen)."""
    want, got = answers(plain), answers(pooled)
    failures, seen = [], []
    if [q for q, _ in want] != [q for q, _ in got]:
        first = next((i for i, (a, b) in enumerate(zip(want, got)) if a[0] != b[0]),
                     min(len(want), len(got)))
        failures.append("the questions differ from line %d on (%d lines plain, %d pooled)"
                        % (first + 1, len(want), len(got)))
        return failures, len(want), seen
    for (q, a), (_, b) in zip(want, got):
        if a == b:
            continue
        doc = table.get(q)
        if doc is not None and doc[0] == a and doc[1] in (b, "*"):
            seen.append(q)
        else:
            failures.append("%s: driver %s, library %s%s" % (
                q, a, b, "" if q not in table else
                " (documented: driver %s, library %s)" % table[q]))
    return failures, len(want), seen


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    md = argv[3] if len(argv) == 4 else os.path.join(HERE, "..", "docs", "COMPATIBILITY.md")
    with open(argv[1]) as f:
        plain = f.read()
    with open(argv[2]) as f:
        pooled = f.read()
    with open(md) as f:
        table = documented(f.read())
    failures, n, seen = compare(plain, pooled, table)
    if failures:
        print("FAIL driver_probe_pool: %d answers differ from the driver's, undocumented:"
              % len(failures))
        for line in failures:
            print("  " + line)
        return 1
    print("PASS driver_probe_pool: %d answers, %d the same as the driver's, %d documented "
          "differences (docs/COMPATIBILITY.md)" % (n, n - len(seen), len(seen)))
    for q in seen:
        print("  documented: " + q)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
