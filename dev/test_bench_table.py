#!/usr/bin/env python3
"""Tests of dev/bench_table.py, run by dev/test (standard library only, no broker).

Fixtures in dev/testdata/bench-table/: per case a results.tsv and machine.txt as dev/bench leaves them, and the
table.md expected from them. The expected tables of `full`, `failed` and `short` were rendered by the awk code that
dev/bench embedded before the table writer became a program of its own (`short` is a real run's files), so they hold
the program to what the table always was; `quotas` (no one-process row) was rendered by the program.
docs-before.md is a docs file with text around the markers; <case>/docs-after.md is what `docs` makes of it.

Each test runs the program as dev/bench does (a subprocess in a scratch directory), so the command line, the files
it reads and writes and its exit codes are what is tested.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

DEV = pathlib.Path(__file__).resolve().parent
PROGRAM = DEV / "bench_table.py"
FIXTURES = DEV / "testdata" / "bench-table"
BEGIN = "<!-- dev/bench writes from here"
END = "<!-- dev/bench writes up to here -->"


def run(*args):
    return subprocess.run([sys.executable, str(PROGRAM), *map(str, args)], capture_output=True, text=True)


class BenchTable(unittest.TestCase):
    def setUp(self):
        self.scratch = pathlib.Path(tempfile.mkdtemp(prefix="bench-table-test."))
        self.addCleanup(shutil.rmtree, self.scratch)

    def run_dir(self, case):
        """A copy of the case's results.tsv and machine.txt, as a run directory of dev/bench holds them."""
        run_dir = self.scratch / case
        run_dir.mkdir()
        for name in ("results.tsv", "machine.txt"):
            shutil.copy(FIXTURES / case / name, run_dir / name)
        return run_dir

    def rendered(self, case):
        run_dir = self.run_dir(case)
        done = run("render", run_dir)
        self.assertEqual(done.returncode, 0, done.stderr)
        return run_dir

    def test_render_gives_the_expected_table_goals_and_machine_block(self):
        for case in ("full", "failed", "short", "quotas"):
            with self.subTest(case=case):
                run_dir = self.rendered(case)
                self.assertEqual((run_dir / "table.md").read_bytes(), (FIXTURES / case / "table.md").read_bytes())

    def test_failed_rows_are_struck_through_and_left_out_of_the_goals(self):
        table = (self.rendered("failed") / "table.md").read_text()
        self.assertIn("| ~~krafka 0.28.1 share consumer~~ |", table)
        self.assertIn("**FAILED**: the krafka peer exited with an error", table)
        self.assertIn("krafka 1p FAILED (not compared)", table)
        # The 1 KiB classic row is missing, so nothing at 1 KiB is given as a ratio of it.
        self.assertIn("- steady ≥ 1.0× classic at 1 KiB: no comparable rows", table)

    def render_rows(self, name, rows):
        """The table rendered from the short fixture's header, machine and ROWS (results.tsv lines)."""
        head = (FIXTURES / "short" / "results.tsv").read_text().splitlines()[0]
        run_dir = self.scratch / name
        run_dir.mkdir()
        shutil.copy(FIXTURES / "short" / "machine.txt", run_dir / "machine.txt")
        (run_dir / "results.tsv").write_text("\n".join([head] + rows) + "\n")
        done = run("render", run_dir)
        self.assertEqual(done.returncode, 0, done.stderr)
        return (run_dir / "table.md").read_text()

    def test_a_fleet_hosts_output_writes_are_held_to_a_plain_hosts_within_1_2x(self):
        row = ("100\t1\t{kind}\t300000\t1000000\t2000000\t3000000\t4.00\t30000\t3.00\t2.00\t0\tok\t"
               "poller_cpu_s=0.10 rejected=0 writes=120 write_ms={ms}")
        for fleet_ms, verdict, ratio in (("3.30", "met", "1.10"), ("452.00", "not met", "150.67")):
            with self.subTest(fleet_ms=fleet_ms):
                table = self.render_rows(f"writes-{verdict.replace(' ', '-')}",
                                         [row.format(kind="wasm-splitter", ms="3.00"),
                                          row.format(kind="wasm-fleet-splitter", ms=fleet_ms)])
                self.assertIn("| sharehost, Wasm splitter (one output per record) |", table)
                self.assertIn("| sharehost, Wasm splitter, fleet host |", table)
                self.assertIn(f"- fleet host's output write ≤ 1.2× a plain host's (Wasm splitter), every pair: "
                              f"**{verdict}**: highest {ratio}: {ratio} ({fleet_ms} ms against 3.00 ms, 100 B 1p)",
                              table)

    def test_the_broker_cpu_is_shown_without_its_jit_where_measured_and_held_to_one_second_per_million(self):
        row = ("100\t1\t{kind}\t2000000\t1000000\t2000000\t3000000\t1.00\t30000\t{broker}\t2.00\t0\tok\t"
               "poller_cpu_s=0.10 rejected=0{jit}")
        for broker, jit, cell, verdict in (("4.00", " broker_jit_s=2.40", "2.00 (0.80)", "met"),
                                           ("4.00", " broker_jit_s=0.50", "2.00 (1.75)", "not met"),
                                           ("4.00", "", "2.00", None)):
            with self.subTest(jit=jit):
                table = self.render_rows(f"jit-{cell.split()[-1].strip('()')}",
                                         [row.format(kind="wasm", broker=broker, jit=jit)])
                self.assertIn(f"| 29 | {cell} | yes (0) |", table)
                line = ("broker CPU ≤ 1.0 s per 1M records without its JIT (sharehost, 100 B, no writes, one kind of "
                        "verdict per producer batch), every row")
                if verdict is None:
                    self.assertNotIn(line, table)
                else:
                    self.assertIn(f"- {line}: **{verdict}**: highest {cell.split()[1].strip('()')} (", table)

    def test_a_plugin_that_rejects_scattered_records_is_shown_beside_the_broker_goal_not_held_to_it(self):
        row = ("100\t1\t{kind}\t2000000\t1000000\t2000000\t3000000\t1.00\t30000\t{broker}\t2.00\t0\tok\t"
               "poller_cpu_s=0.10 rejected=0 broker_jit_s=0.10")
        table = self.render_rows("jit-reader", [row.format(kind="wasm", broker="1.60"),
                                                row.format(kind="wasm-reader", broker="5.00")])
        self.assertIn("one kind of verdict per producer batch), every row: **met**: highest 0.75 (0.75 wasm 1p)", table)
        self.assertIn("where the plugin rejects scattered records (not a goal: the broker tracks such a producer "
                      "batch offset by offset): 2.45 wasm-reader 1p", table)

    def test_a_plugin_that_writes_is_not_held_to_the_brokers_read_cost(self):
        row = ("100\t1\twasm-splitter\t2000000\t1000000\t2000000\t3000000\t1.00\t30000\t8.00\t2.00\t0\tok\t"
               "poller_cpu_s=0.10 rejected=0 writes=120 write_ms=3.00 broker_jit_s=1.00")
        table = self.render_rows("jit-splitter", [row])
        self.assertIn("| 4.00 (3.50) |", table)
        self.assertNotIn("broker CPU ≤ 1.0 s per 1M", table)

    def test_exactly_once_is_held_to_four_fifths_of_at_least_once(self):
        row = ("100\t1\t{kind}\t300000\t1000000\t2000000\t{steady}\t4.00\t30000\t3.00\t2.00\t0\tok\t"
               "poller_cpu_s=0.10 rejected=0 writes=120 write_ms=3.00")
        for eo_steady, verdict, ratio in (("3111111", "met", "0.90"), ("4000000", "not met", "0.50")):
            with self.subTest(eo=eo_steady):
                table = self.render_rows(f"eo-{verdict.replace(' ', '-')}",
                                         [row.format(kind="wasm-splitter", steady="3000000"),
                                          row.format(kind="wasm-eo-splitter", steady=eo_steady)])
                self.assertIn("| sharehost, Wasm splitter, exactly-once |", table)
                self.assertIn(f"- exactly-once ≥ 0.8× at-least-once steady (Wasm splitter), every pair: "
                              f"**{verdict}**: lowest {ratio}", table)

    def test_docs_replaces_exactly_the_text_between_the_markers(self):
        before = (FIXTURES / "docs-before.md").read_text()
        for case in ("full", "short"):
            with self.subTest(case=case):
                run_dir = self.rendered(case)
                docs = self.scratch / f"docs-{case}.md"
                shutil.copy(FIXTURES / "docs-before.md", docs)
                done = run("docs", run_dir, docs)
                self.assertEqual(done.returncode, 0, done.stderr)
                after = docs.read_text()
                self.assertEqual(after, (FIXTURES / case / "docs-after.md").read_text())
                # Independently of the expected file: everything up to the end of the begin marker's line and
                # everything from the end marker on is byte for byte what it was.
                head = before[: before.index("\n", before.index(BEGIN)) + 1]
                tail = before[before.index(END):]
                self.assertTrue(after.startswith(head))
                self.assertTrue(after.endswith(tail))
                inside = after[len(head): len(after) - len(tail)]
                table = (run_dir / "table.md").read_text().split("\n\n    ")[0].rstrip()
                self.assertIn(table, inside)
                self.assertIn((run_dir / "machine.txt").read_text().rstrip(), inside)
                self.assertNotIn("| an | old | table |", inside)

    def test_docs_run_twice_gives_the_same_file(self):
        run_dir = self.rendered("short")
        docs = self.scratch / "docs.md"
        shutil.copy(FIXTURES / "docs-before.md", docs)
        self.assertEqual(run("docs", run_dir, docs).returncode, 0)
        once = docs.read_bytes()
        self.assertEqual(run("docs", run_dir, docs).returncode, 0)
        self.assertEqual(docs.read_bytes(), once)

    def test_docs_without_the_end_marker_is_refused_and_left_as_it_was(self):
        run_dir = self.rendered("short")
        docs = self.scratch / "docs.md"
        text = (FIXTURES / "docs-before.md").read_text().replace(END, "<!-- the end, misspelt -->")
        docs.write_text(text)
        done = run("docs", run_dir, docs)
        self.assertEqual(done.returncode, 1)
        self.assertIn(f"{docs}: the markers of the One table section are missing", done.stderr)
        self.assertEqual(docs.read_text(), text)

    def test_a_field_that_is_not_a_number_is_named_with_its_file_and_line(self):
        run_dir = self.run_dir("short")
        tsv = run_dir / "results.tsv"
        lines = tsv.read_text().split("\n")
        fields = lines[2].split("\t")
        fields[3] = "lots"
        lines[2] = "\t".join(fields)
        tsv.write_text("\n".join(lines))
        done = run("render", run_dir)
        self.assertEqual(done.returncode, 1)
        self.assertIn(f"{tsv}:3: field records is 'lots', not a number", done.stderr)
        self.assertFalse((run_dir / "table.md").exists())

    def test_a_row_with_too_few_fields_is_named(self):
        run_dir = self.run_dir("short")
        tsv = run_dir / "results.tsv"
        tsv.write_text(tsv.read_text() + "100\t1\twasm\n")
        done = run("render", run_dir)
        self.assertEqual(done.returncode, 1)
        self.assertIn(f"{tsv}:6: 3 fields, expected at least 13", done.stderr)

    def test_bench_retable_renders_a_run_again_with_the_program(self):
        run_dir = self.run_dir("full")
        # BENCH_DOCS unset: a retable leaves docs/benchmarks.md alone.
        env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
        env["BENCH_RETABLE"] = str(run_dir)
        done = subprocess.run([str(DEV / "bench")], env=env, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        expected = (FIXTURES / "full" / "table.md").read_text()
        self.assertEqual((run_dir / "table.md").read_text(), expected)
        self.assertEqual(done.stdout, expected)


if __name__ == "__main__":
    unittest.main(verbosity=2)
