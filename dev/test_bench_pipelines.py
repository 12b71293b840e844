#!/usr/bin/env python3
"""Tests of dev/bench_pipelines.py, run by dev/test (standard library only, no broker, no build).

The settings and their errors, the command the table records, the topic names, the manifest of N pipelines, the
allocator summary, the rates, and the table: dev/testdata/bench-pipelines/table.md is what the shell script's awk
made of results.tsv and machine.txt beside it (the figures of the docs' run, and a row without a burst), so the
program is held to the table the script always wrote.
"""

import csv
import os
import subprocess
import sys
import unittest
from pathlib import Path

DEV = Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import bench_pipelines as bp  # noqa: E402
from bench_host import Die  # noqa: E402

FIXTURES = DEV / "testdata" / "bench-pipelines"


class Settings(unittest.TestCase):
    def test_defaults(self):
        cfg = bp.config_from_env({})
        self.assertEqual(cfg.counts, [1, 10, 100])
        self.assertEqual((cfg.idle_seconds, cfg.settle, cfg.warm, cfg.rate, cfg.load_seconds, cfg.burst, cfg.size,
                          cfg.timeout, cfg.admin_port), (60, 10, 10, 2000, 60, 100000, 100, 180, 31480))
        self.assertEqual((cfg.manifest_extra, cfg.pipeline_extra), ("", ""))

    def test_errors(self):
        for environ, message in [({"BP_COUNTS": "1 0"}, "BP_COUNTS: '0' is not a positive integer"),
                                 ({"BP_RATE": "fast"}, r"BP_RATE must be a non-negative integer \(got 'fast'\)"),
                                 ({"BP_WARM": "0"}, "BP_WARM, BP_RATE, BP_LOAD_SECONDS and BP_IDLE_SECONDS must be"),
                                 ({"BP_ADMIN_PORT": "0"}, "BP_ADMIN_PORT must be a port")]:
            with self.subTest(environ=environ), self.assertRaisesRegex(Die, message):
                bp.config_from_env(environ)
        self.assertEqual(bp.config_from_env({"BP_BURST": "0"}).burst, 0)

    def test_command_line(self):
        self.assertEqual(bp.command_line({"BP_COUNTS": "1 10", "BP_TIMEOUT": "5", "BP_SIZE": "", "KAFKA_PORT": "1"}),
                         "BP_COUNTS=1\\ 10 dev/bench-pipelines")


class Pieces(unittest.TestCase):
    def test_topic_prefix(self):
        self.assertEqual(bp.topic_prefix(10, "20260501T091306Z"), "bp10-20260501t091306z")
        self.assertEqual(bp.topic_prefix(1, "a_B.c"), "bp1-abc")

    def test_manifest(self):
        cfg = bp.config_from_env({"BP_MANIFEST_EXTRA": "[runtime]\nepoch_tick_ms = 10",
                                  "BP_PIPELINE_EXTRA": "max_in_flight = 100"})
        text = bp.pipelines_manifest(cfg, "127.0.0.1:19092", "bp2-x", 2, "/g/accept_all.wasm")
        self.assertIn('client_id = "sharehost-bench-pipelines"', text)
        self.assertIn('listen = "127.0.0.1:31480"\n\n[runtime]\nepoch_tick_ms = 10\n\n[[pipeline]]', text)
        self.assertIn('[[pipeline]]\nname = "p1"\ntopics = ["bp2-x-1"]\ngroup = "bp2-x-1-g"\n'
                      'component = "/g/accept_all.wasm"\nmax_in_flight = 100\n', text)
        self.assertEqual(text.count("[[pipeline]]"), 2)

    def test_allocators(self):
        status = [{"allocator": "pooling"}, {"allocator": "on-demand"}, {"allocator": "pooling"}]
        self.assertEqual(bp.allocators(status), "on-demand×1,pooling×2")
        with self.assertRaisesRegex(Die, "a pipeline without an allocator"):
            bp.allocators([{"name": "p0"}])

    def test_rates(self):
        self.assertEqual(bp.pct(0.6, 60), "1.00")
        self.assertEqual(bp.secs(1_000_000, 3_500_000), "2.50")
        self.assertEqual(bp.rate(120000, "58.96"), "2035")
        self.assertEqual(bp.rate(100, "0.00"), "-")


class Table(unittest.TestCase):
    def rows(self):
        with open(FIXTURES / "results.tsv", newline="") as f:
            return list(csv.DictReader(f, delimiter="\t"))

    def test_the_table_the_script_wrote(self):
        text = bp.table(self.rows(), 2000, "1.47", 60, (FIXTURES / "machine.txt").read_text())
        self.assertEqual(text, (FIXTURES / "table.md").read_text())

    def test_a_bad_field_is_named(self):
        rows = self.rows()
        rows[1]["idle_cpu_pct"] = "n/a"
        with self.assertRaisesRegex(Die, "field idle_cpu_pct of the 10-pipeline row is 'n/a', not a number"):
            bp.table(rows, 2000, "1.47", 60, "")

    def test_goals_not_met(self):
        rows = [r for r in self.rows() if r["pipelines"] == "100"]
        rows[0].update(idle_cpu_pct="2.50", peak_rss_kb="300000")
        text = bp.table(rows, 2000, "1.47", 60, "")
        self.assertIn("- idle CPU of 100 idle pipelines < 2 % of one core: NOT met (2.50 %)", text)
        self.assertIn("- RSS of 100 pipelines < 256 MiB: NOT met (peak 293.0 MiB, idle 51.0 MiB)", text)


class Entry(unittest.TestCase):
    def test_a_bad_setting_is_one_clear_line(self):
        env = dict(os.environ, BP_COUNTS="ten")
        out = subprocess.run([str(DEV / "bench-pipelines")], capture_output=True, text=True, env=env)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, "bench-pipelines: error: BP_COUNTS: 'ten' is not a positive integer\n")


if __name__ == "__main__":
    unittest.main()
