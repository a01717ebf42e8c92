#!/usr/bin/env python3
"""The slowest tests of the last scripts/test.sh run, from nextest's JUnit report.

    scripts/slowest-tests.py [N] [JUNIT]   # default: 30, <repo>/target/nextest/default/junit.xml

Prints N lines `seconds  binary  test`, slowest first, then how many tests ran, passed and
failed, and their summed wall time. (nextest keeps its store, the report included, in the
repository's target/ even when cargo builds elsewhere; `--quick` writes target/nextest/quick/.)
"""
import os
import sys
import xml.etree.ElementTree as ET


def default_junit():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(repo, "target", "nextest", "default", "junit.xml")


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    path = sys.argv[2] if len(sys.argv) > 2 else default_junit()
    root = ET.parse(path).getroot()
    rows, failed = [], 0
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            t = float(case.get("time") or 0)
            rows.append((t, suite.get("name", ""), case.get("name", "")))
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
    rows.sort(reverse=True)
    for t, binary, name in rows[:n]:
        print(f"{t:8.1f} s  {binary:<24} {name}")
    total = sum(t for t, _, _ in rows)
    print(f"{len(rows)} tests, {len(rows) - failed} passed, {failed} failed; "
          f"summed wall time {total:.0f} s ({path})")


if __name__ == "__main__":
    main()
