#!/usr/bin/env python3
"""Where a run of .ci/run spent its time: the table printed at its end (docs/reliability.md keeps one).

Usage: dev/timings.py MARKS [JUNIT...]

MARKS is the file the dev/ scripts append a line "EPOCH<TAB>SCRIPT<TAB>STEP" to at every step when
SHAREHOST_TIMINGS names it (dev/lib.sh, timing_mark). A script's steps follow each other, so a step lasts until the
next mark of the same script; the mark "-" ends the script's last step. Scripts may run side by side (the image's
build runs beside the tests): each is its own lane, and the table gives each step's start from the run's first mark.

Each JUNIT is a JUnit report of cargo-nextest (target/nextest/<profile>/junit.xml): the table of test binaries
(tests, the seconds their tests took added up, the slowest) and the slowest tests follow the steps. A report that
is missing is skipped: a run that failed before its tests has none.

Standard library only: CI runs it before anything is installed for Python.
"""

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def read_marks(path):
    """[(epoch, script, step)] in file order; lines that do not parse are skipped, never fatal."""
    marks = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                continue
            try:
                marks.append((float(parts[0]), parts[1], parts[2]))
            except ValueError:
                continue
    return marks


def steps(marks):
    """[(start, seconds or None, script, step)] by start; None: the step never ended (the run was cut)."""
    by_lane = defaultdict(list)
    for epoch, script, step in marks:
        by_lane[script].append((epoch, step))
    out = []
    for script, lane in by_lane.items():
        lane.sort(key=lambda m: m[0])
        for i, (epoch, step) in enumerate(lane):
            if step == "-":
                continue
            end = lane[i + 1][0] if i + 1 < len(lane) else None
            out.append((epoch, None if end is None else end - epoch, script, step))
    out.sort(key=lambda s: s[0])
    return out


def clock(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def steps_table(marks):
    rows = steps(marks)
    if not rows:
        return "no steps were marked\n"
    t0 = min(m[0] for m in marks)
    t1 = max(m[0] for m in marks)
    lines = [
        "| starts | took (s) | script | step |",
        "|---:|---:|---|---|",
    ]
    for start, took, script, step in rows:
        took_s = "(cut)" if took is None else f"{took:.0f}"
        lines.append(f"| {clock(start - t0)} | {took_s} | {script} | {step} |")
    lines.append(f"| | **{t1 - t0:.0f}** | | the whole run ({clock(t1 - t0)}) |")
    return "\n".join(lines) + "\n"


def read_junit(path):
    """[(binary, test, seconds, outcome)] from a nextest JUnit report."""
    cases = []
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        binary = suite.get("name", "?")
        for case in suite.iter("testcase"):
            try:
                seconds = float(case.get("time", "0"))
            except ValueError:
                seconds = 0.0
            outcome = "passed"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "FAILED"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            cases.append((binary, case.get("name", "?"), seconds, outcome))
    return cases


def tests_tables(cases, slowest=15):
    per = defaultdict(list)
    for binary, name, seconds, outcome in cases:
        per[binary].append((seconds, name, outcome))
    lines = [
        "| test binary | tests | their seconds added up | slowest test (s) |",
        "|---|---:|---:|---|",
    ]
    for binary, tests in sorted(per.items(), key=lambda kv: -sum(t[0] for t in kv[1])):
        top = max(tests)
        failed = sum(1 for t in tests if t[2] == "FAILED")
        count = f"{len(tests)}" + (f" ({failed} failed)" if failed else "")
        lines.append(f"| {binary} | {count} | {sum(t[0] for t in tests):.0f} | {top[1]} ({top[0]:.0f}) |")
    total = sum(c[2] for c in cases)
    lines.append(f"| **all** | {len(cases)} | {total:.0f} | |")
    lines += ["", "| slowest tests | s |", "|---|---:|"]
    for binary, name, seconds, _ in sorted(cases, key=lambda c: -c[2])[:slowest]:
        lines.append(f"| {binary} {name} | {seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        marks = read_marks(argv[1])
    except OSError as e:
        print(f"dev/timings.py: {argv[1]}: {e.strerror}", file=sys.stderr)
        return 1
    out = [steps_table(marks)]
    cases = []
    for path in argv[2:]:
        try:
            cases += read_junit(path)
        except FileNotFoundError:
            continue
        except (OSError, ET.ParseError) as e:
            out.append(f"{path}: not read ({e})\n")
    if cases:
        out.append(tests_tables(cases))
    print("\n".join(out), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
