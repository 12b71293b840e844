#!/usr/bin/env python3
"""Tests of dev/timings.py, run by dev/test (standard library only, no broker).

Each test writes a marks file (and a JUnit report as cargo-nextest writes it) into a scratch directory and runs the
program as .ci/run does, so the command line, what it reads and what it prints are what is tested.
"""

import pathlib
import subprocess
import sys
import tempfile
import textwrap
import unittest

PROGRAM = pathlib.Path(__file__).resolve().parent / "timings.py"

JUNIT = textwrap.dedent(
    """\
    <?xml version="1.0" encoding="UTF-8"?>
    <testsuites name="nextest-run" tests="4" failures="1" errors="0" time="95.0">
        <testsuite name="sharehost::e2e" tests="2" disabled="0" errors="0" failures="1">
            <testcase name="judges_every_record" classname="sharehost::e2e" time="40.5"></testcase>
            <testcase name="drains" classname="sharehost::e2e" time="9.5">
                <failure type="test failure">boom</failure>
            </testcase>
        </testsuite>
        <testsuite name="sharehost-runtime" tests="2" disabled="0" errors="0" failures="0">
            <testcase name="loads" classname="sharehost-runtime" time="1.0"></testcase>
            <testcase name="traps" classname="sharehost-runtime" time="44.0"></testcase>
        </testsuite>
    </testsuites>
    """
)


def run(*args):
    return subprocess.run([sys.executable, str(PROGRAM), *map(str, args)], capture_output=True, text=True)


class Timings(unittest.TestCase):
    def setUp(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="timings-test-"))

    def marks(self, text):
        path = self.dir / "marks.tsv"
        path.write_text(textwrap.dedent(text))
        return path

    def test_steps_last_until_the_next_mark_of_their_own_script(self):
        # dev/image runs beside dev/test: its build overlaps two of dev/test's steps.
        marks = self.marks(
            """\
            1000.0\tdev/test\tbuilding guest components
            1005.0\tdev/image\tbuilding the static binary
            1060.0\tdev/test\ttests
            1300.0\tdev/image\t-
            1600.5\tdev/test\t-
            """
        )
        out = run(marks)
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]
        self.assertEqual(rows[1], "| 0:00 | 60 | dev/test | building guest components |")
        self.assertEqual(rows[2], "| 0:05 | 295 | dev/image | building the static binary |")
        self.assertEqual(rows[3], "| 1:00 | 540 | dev/test | tests |")
        self.assertIn("the whole run (10:00)", out.stdout)
        self.assertIn("**600**", out.stdout)

    def test_a_step_cut_by_a_failed_run_says_so(self):
        marks = self.marks("10\tdev/test\tformatting and lints\n")
        out = run(marks)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| 0:00 | (cut) | dev/test | formatting and lints |", out.stdout)

    def test_lines_that_do_not_parse_are_skipped(self):
        marks = self.marks("garbage\nnot-a-time\tdev/test\tx\n5\tdev/test\tok\n7\tdev/test\t-\n")
        out = run(marks)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| 0:00 | 2 | dev/test | ok |", out.stdout)
        self.assertNotIn("| x |", out.stdout)

    def test_test_binaries_are_added_up_and_the_slowest_named(self):
        marks = self.marks("0\tdev/test\ttests\n100\tdev/test\t-\n")
        junit = self.dir / "junit.xml"
        junit.write_text(JUNIT)
        missing = self.dir / "none.xml"
        out = run(marks, junit, missing)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| sharehost::e2e | 2 (1 failed) | 50 | judges_every_record (40) |", out.stdout)
        self.assertIn("| sharehost-runtime | 2 | 45 | traps (44) |", out.stdout)
        self.assertIn("| **all** | 4 | 95 | |", out.stdout)
        slowest = out.stdout[out.stdout.index("| slowest tests") :].splitlines()
        self.assertEqual(slowest[2], "| sharehost-runtime traps | 44 |")
        # A binary is listed by its tests' total, largest first.
        self.assertLess(out.stdout.index("sharehost::e2e |"), out.stdout.index("sharehost-runtime |"))

    def test_a_broken_report_is_named_and_the_steps_still_print(self):
        marks = self.marks("0\tdev/test\ttests\n3\tdev/test\t-\n")
        junit = self.dir / "junit.xml"
        junit.write_text("<testsuites><testsuite")
        out = run(marks, junit)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("junit.xml: not read", out.stdout)
        self.assertIn("| dev/test | tests |", out.stdout)

    def test_no_marks_file_is_an_error_naming_it(self):
        out = run(self.dir / "absent.tsv")
        self.assertEqual(out.returncode, 1)
        self.assertIn("absent.tsv", out.stderr)


if __name__ == "__main__":
    unittest.main()
