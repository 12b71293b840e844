#!/usr/bin/env python3
"""Tests of dev/build_warnings.py, run by dev/test (standard library only, no build).

Each test feeds the program cargo's JSON messages as `cargo build --message-format=json` writes them, on its
standard input as dev/test pipes them, and reads its exit status and output.
"""

import json
import pathlib
import subprocess
import sys
import unittest

PROGRAM = pathlib.Path(__file__).resolve().parent / "build_warnings.py"


def artifact(name, fresh=False):
    return {"reason": "compiler-artifact", "package_id": f"path+file:///repo#{name}@0.1.0", "fresh": fresh}


def diagnostic(level, text, code=None):
    return {
        "reason": "compiler-message",
        "package_id": "path+file:///repo/host/text#sharehost-text@0.1.0",
        "message": {"level": level, "code": code, "rendered": f"{level}: {text}\n  --> host/text/src/lib.rs:3:5\n"},
    }


def finished(success):
    return {"reason": "build-finished", "success": success}


def run(*messages, raw=()):
    lines = [json.dumps(m) for m in messages] + list(raw)
    return subprocess.run([sys.executable, str(PROGRAM)], input="\n".join(lines) + "\n", capture_output=True, text=True)


class Warnings(unittest.TestCase):
    def test_a_clean_build_passes(self):
        out = run(artifact("sharehost"), artifact("sharehost-text", fresh=True), finished(True))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, "")

    def test_a_lint_fails_the_build_and_is_shown_as_cargo_renders_it(self):
        out = run(diagnostic("warning", "used `unwrap()` on a `Result` value", {"code": "clippy::unwrap_used"}), finished(True))
        # 2, not 1: the tests are built, so dev/test runs them and fails at the end.
        self.assertEqual(out.returncode, 2)
        self.assertIn("warning: used `unwrap()` on a `Result` value\n  --> host/text/src/lib.rs:3:5", out.stdout)
        self.assertIn("1 warnings", out.stderr)

    def test_a_failed_build_fails_and_names_its_errors(self):
        out = run(diagnostic("error", "cannot find value `x`"), finished(False))
        self.assertEqual(out.returncode, 1)
        self.assertIn("error: cannot find value `x`", out.stdout)
        self.assertIn("the build failed (1 errors, 0 warnings)", out.stderr)

    def test_a_build_cut_short_fails(self):
        # cargo killed mid-way writes no build-finished message: that is no pass.
        out = run(artifact("sharehost"))
        self.assertEqual(out.returncode, 1)
        self.assertIn("without a build-finished message", out.stderr)

    def test_lines_that_are_not_json_are_shown_and_do_not_fail_a_clean_build(self):
        out = run(finished(True), raw=["a build script's stray line"])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("a build script's stray line", out.stdout)

    def test_notes_and_help_do_not_count_as_warnings(self):
        out = run(diagnostic("note", "something to know"), diagnostic("help", "try this"), finished(True))
        self.assertEqual(out.returncode, 0, out.stderr)


if __name__ == "__main__":
    unittest.main()
