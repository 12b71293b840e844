#!/usr/bin/env python3
"""Tests of dev/bench_swap.py, run by dev/test (standard library only, no broker, no build).

The settings, the versions it makes (a custom section appended), the swap plan, the counters it reads and the table
it writes from stalls.tsv (dev/testdata/bench-swap/stalls.tsv: a real run's). The swapping itself is tested against a
stand-in host that serves GET /pipelines and POST /pipelines/bench/swap the way `sharehost run` does.
"""

import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

DEV = Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import bench_host  # noqa: E402
import bench_swap  # noqa: E402
from bench_host import Die  # noqa: E402

FIXTURES = DEV / "testdata" / "bench-swap"

# A host whose active version becomes the swapped-to path's name and has judged a batch at the second look after a
# swap; it accepts 1000 records per look.
FAKE_HOST = textwrap.dedent("""
    import http.server, json, os, sys
    port = int(sys.argv[1])
    state = {"active": "a", "looks": 0, "accepted": 0, "versions": {"a": 1}}
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            state["looks"] += 1
            state["accepted"] += 1000
            if state["looks"] >= 2:
                state["versions"][state["active"]] = 1
            versions = {v: {"accepted": state["accepted"] if v == state["active"] else 0, "batches": b}
                        for v, b in state["versions"].items()}
            body = json.dumps([{"name": "bench", "active_version": state["active"], "versions": versions,
                                "last_swap_stall_ms": 1.25}]).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def do_POST(self):
            path = json.loads(self.rfile.read(int(self.headers["content-length"])))["path"]
            state["active"] = os.path.basename(path)
            state["versions"][state["active"]] = 0
            state["looks"] = 0
            body = json.dumps({"active_version": state["active"]}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


class Settings(unittest.TestCase):
    def test_defaults_and_errors(self):
        self.assertEqual(bench_swap.config_from_env({}), (6000000, 10, 31480))
        self.assertEqual(bench_swap.config_from_env({"BENCH_SWAP_RECORDS": "600000", "BENCH_SWAP_COUNT": "2",
                                                     "BENCH_SWAP_ADMIN_PORT": "39471"}), (600000, 2, 39471))
        for environ, message in [({"BENCH_SWAP_RECORDS": "7"}, "BENCH_SWAP_RECORDS must be a positive multiple of 6"),
                                 ({"BENCH_SWAP_RECORDS": "0"}, "positive multiple of 6"),
                                 ({"BENCH_SWAP_COUNT": "x"}, "BENCH_SWAP_COUNT must be a positive integer"),
                                 ({"BENCH_SWAP_ADMIN_PORT": "99999"}, "BENCH_SWAP_ADMIN_PORT must be a port")]:
            with self.subTest(environ=environ), self.assertRaisesRegex(Die, message):
                bench_swap.config_from_env(environ)


class Versions(unittest.TestCase):
    def test_a_custom_section_is_appended(self):
        wasm = b"\0asm\x0d\0\x01\0"
        out = bench_swap.with_section(wasm, "sharehost-bench-swap-b")
        self.assertTrue(out.startswith(wasm))
        tail = out[len(wasm):]
        # section id 0 (custom), size, name length, name, payload "x"
        self.assertEqual(tail, bytes([0, 24, 22]) + b"sharehost-bench-swap-b" + b"x")
        with self.assertRaises(ValueError):
            bench_swap.with_section(wasm, "n" * 127)

    def test_plan(self):
        plan = bench_swap.swap_plan(3, "A", "B", Path("/o"))
        self.assertEqual(plan, [("cached", 1, "B"), ("cached", 2, "A"), ("cached", 3, "B"),
                                ("uncached", 1, Path("/o/u1.wasm")), ("uncached", 2, Path("/o/u2.wasm")),
                                ("uncached", 3, Path("/o/u3.wasm"))])

    def test_accepted(self):
        self.assertEqual(bench_swap.accepted([{"versions": {"a": {"accepted": 4}, "b": {"accepted": 5}}}]), 9)
        with self.assertRaisesRegex(Die, "no pipeline with per-version accepted counters"):
            bench_swap.accepted([])


class Table(unittest.TestCase):
    def test_from_a_real_run(self):
        with open(FIXTURES / "stalls.tsv", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        self.assertEqual(bench_swap.stall_table(rows, 600000, 600000, 0), (FIXTURES / "table.md").read_text())

    def test_goal_not_met_and_bad_rows(self):
        rows = [{"case": "cached", "stall_ms": "7.5", "swap_ms": "3"},
                {"case": "uncached", "stall_ms": "90", "swap_ms": "80"}]
        self.assertIn("goal: cached stall ≤ 5 ms: not met (longest 7.50 ms)", bench_swap.stall_table(rows, 1, 1, 0))
        with self.assertRaisesRegex(Die, "stalls.tsv: a cached row without a number"):
            bench_swap.stall_table([{"case": "cached", "stall_ms": "None", "swap_ms": "1"}], 1, 1, 0)
        with self.assertRaisesRegex(Die, "stalls.tsv: no uncached swaps"):
            bench_swap.stall_table(rows[:1], 1, 1, 0)


class Swapping(unittest.TestCase):
    def test_against_a_stand_in_host(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            (d / "fake.py").write_text(FAKE_HOST)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            host = bench_host.Host([sys.executable, d / "fake.py", port], port, d / "host.log")
            self.addCleanup(host.kill)
            host.wait_ready(60)
            plan = bench_swap.swap_plan(2, d / "a", d / "b", d)
            bench_swap.Swapper(host, 10**9).run(plan, d / "stalls.tsv")
            with open(d / "stalls.tsv", newline="") as f:
                rows = list(csv.DictReader(f, delimiter="\t"))
            self.assertEqual([(r["case"], r["swap"], r["stall_ms"]) for r in rows],
                             [("cached", "1", "1.25"), ("cached", "2", "1.25"), ("uncached", "1", "1.25"),
                              ("uncached", "2", "1.25")])
            with self.assertRaisesRegex(Die, "the topic ran dry during swap 1 \\(cached\\)"):
                bench_swap.Swapper(host, 1).run(plan, d / "stalls2.tsv")


class Entry(unittest.TestCase):
    def test_a_bad_setting_is_one_clear_line(self):
        env = dict(os.environ, BENCH_SWAP_COUNT="0")
        out = subprocess.run([str(DEV / "bench-swap")], capture_output=True, text=True, env=env)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, "bench-swap: error: BENCH_SWAP_COUNT must be a positive integer (got '0')\n")


if __name__ == "__main__":
    unittest.main()
