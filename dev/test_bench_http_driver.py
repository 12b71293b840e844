#!/usr/bin/env python3
"""Tests of dev/bench_http_driver.py (dev/bench-http's program), run by dev/test: standard library only, no broker,
no build, no HTTP server.

Fixtures in dev/testdata/bench-http/: results.tsv, languages.tsv and emit.tsv (made up, with a missing rate, a zero
rate and a "?" from the server) and the table.md, languages-table.md and emit-table.md that the bash dev/bench-http's
awk programs made of them; the three manifests its heredocs wrote on fixed values. From a real small run
(BENCH_HTTP_RECORDS=2000 BENCH_HTTP_CONCURRENCY="1 2" BENCH_HTTP_BATCH=8 BENCH_HTTP_REPEAT=1 BENCH_HTTP_SECONDS=2,
all three parts): its run-*.tsv and run-*table.md (which the awk programs also make of them), a host's
/usr/bin/time -v report (sharehost.time), its GET /pipelines answer, bench-http-native's line and the server's stats.
"""

import os
import pathlib
import subprocess
import sys
import unittest

DEV = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import bench_http_driver as bh  # noqa: E402

FIXTURES = DEV / "testdata" / "bench-http"


class SettingsFromEnv(unittest.TestCase):
    def test_the_defaults(self):
        s = bh.settings_from_env({})
        self.assertEqual((s.parts, s.records, s.concurrency, s.batches, s.repeat), (["http", "emit"], 20000,
                                                                                    [1, 2, 4], [1, 8, 32], 2))
        self.assertEqual((s.seconds, s.delay_ms, s.native_modes, s.partitions), (8, 20, ["free", "batched", "nopool"],
                                                                                  2))
        self.assertEqual((s.emit_records, s.lang_records, s.lang_concurrency, s.lang_batches), (1000000, 20000, [2],
                                                                                                [8, 32]))
        self.assertEqual((s.admin_port, s.manifest_extra, s.idle_timeout, s.build), (31480, "", 60, True))

    def test_native_modes_unset_are_all_set_and_empty_are_none(self):
        self.assertEqual(bh.settings_from_env({"BENCH_HTTP_NATIVE": ""}).native_modes, [])
        self.assertEqual(bh.settings_from_env({"BENCH_HTTP_NATIVE": "nopool free"}).native_modes, ["nopool", "free"])
        with self.assertRaisesRegex(bh.Die, "unknown native mode 'fast' in BENCH_HTTP_NATIVE"):
            bh.settings_from_env({"BENCH_HTTP_NATIVE": "free fast"})

    def test_parts(self):
        self.assertEqual(bh.settings_from_env({"BENCH_HTTP_PARTS": "languages"}).parts, ["languages"])
        with self.assertRaisesRegex(bh.Die, "unknown part 'all' in BENCH_HTTP_PARTS"):
            bh.settings_from_env({"BENCH_HTTP_PARTS": "all"})

    def test_numbers_and_lists_name_what_is_wrong(self):
        with self.assertRaisesRegex(bh.Die, r"^BENCH_HTTP_RECORDS must be a positive integer \(got '0'\)$"):
            bh.settings_from_env({"BENCH_HTTP_RECORDS": "0"})
        with self.assertRaisesRegex(bh.Die, r"^BENCH_HTTP_BATCH \(x\) must be a positive integer \(got 'x'\)$"):
            bh.settings_from_env({"BENCH_HTTP_BATCH": "1 x 32"})
        for name in ("BENCH_HTTP_REPEAT", "BENCH_HTTP_SECONDS", "BENCH_HTTP_DELAY_MS", "BENCH_HTTP_PARTITIONS",
                     "BENCH_HTTP_EMIT_RECORDS", "BENCH_HTTP_IDLE_TIMEOUT", "BENCH_HTTP_LANG_RECORDS",
                     "BENCH_HTTP_ADMIN_PORT", "BENCH_HTTP_CONCURRENCY", "BENCH_HTTP_LANG_CONCURRENCY",
                     "BENCH_HTTP_LANG_BATCH"):
            with self.assertRaisesRegex(bh.Die, name):
                bh.settings_from_env({name: "-1"})
        with self.assertRaisesRegex(bh.Die, "BENCH_HTTP_ADMIN_PORT must be a port number"):
            bh.settings_from_env({"BENCH_HTTP_ADMIN_PORT": "99999"})

    def test_records_per_run(self):
        self.assertEqual(bh.records_per_run(1, 1, 20, 8, 20000), 400)
        self.assertEqual(bh.records_per_run(1, 1, 1000, 1, 20000), 200)  # at least 200
        self.assertEqual(bh.records_per_run(4, 32, 20, 8, 20000), 20000)  # at most the topic
        self.assertEqual(bh.records_per_run(2, 8, 20, 8, 20000), 6400)


class Manifests(unittest.TestCase):
    """Byte for byte what the bash dev/bench-http's heredocs wrote."""

    def test_http(self):
        self.assertEqual(bh.http_manifest("127.0.0.1:19192", 39571, "bench-http-120000", "g-1",
                                          "/g/fixture_http_fetch.wasm", 2, 8, "http://127.0.0.1:41234",
                                          "max_in_flight = 500"), (FIXTURES / "http.toml").read_text())

    def test_languages(self):
        self.assertEqual(bh.languages_manifest("127.0.0.1:19192", 39571, "enricher_py", "bench-http-orders-120000",
                                               "g-1", "/repo/target/guests/enricher_py.wasm", 2, 8,
                                               "http://127.0.0.1:41234", "g-1-out", "max_in_flight = 500"),
                         (FIXTURES / "languages.toml").read_text())

    def test_emit(self):
        self.assertEqual(bh.emit_manifest("127.0.0.1:19192", 39571, "bench-http-emit-120000", "g-1",
                                          "/g/fixture_actor.wasm", "g-1-out", "max_in_flight = 500"),
                         (FIXTURES / "emit.toml").read_text())

    def test_payloads_are_the_ones_bash_printed(self):
        orders = subprocess.run(
            ["bash", "-c", """for ((k = 0; k < 5000; k++)); do printf '{"id":"o%d","sku":"S-%d","quantity":1}\\n' \
"$k" "$k"; done"""], capture_output=True, text=True).stdout
        self.assertEqual(bh.orders_payload(), orders)
        emit, plain = bh.emit_payloads()
        self.assertEqual(emit, "emit:valid:" + "x" * 89 + "\n")
        self.assertEqual(len(emit) - 1, 100)
        self.assertEqual(plain, "plain-" + "y" * 94 + "\n")
        self.assertEqual(len(plain) - 1, 100)


class ToolOutput(unittest.TestCase):
    def test_the_server_s_stats(self):
        self.assertEqual(bh.server_fields((FIXTURES / "server.txt").read_text()), ("8", "2000"))
        self.assertEqual(bh.server_fields("requests=400 max_in_flight=16 in_flight=0"), ("16", "400"))
        self.assertEqual(bh.server_fields("requests=? max_in_flight=?"), ("?", "?"))

    def test_the_native_line(self):
        self.assertEqual(bh.native_result((FIXTURES / "native.out").read_text()), ("370.7", "2.155"))
        line = ("requests=6400 in_flight=16 mode=free pool=true wall_ms=8021.4 steady_ms=8001.2 records_per_s=797.9 "
                "steady_records_per_s=799.8\n")
        self.assertEqual(bh.native_result(line), ("799.8", "8.001"))
        with self.assertRaisesRegex(bh.Die, "no steady rate"):
            bh.native_result("error: connection refused")

    def test_the_poll_gap(self):
        # 1000 left at 100 per 10 ms: 100 ms to go, poll again in 50 ms
        self.assertEqual(bh.next_gap_us(2000, 1000, 10000, 0, 900), 50000)
        self.assertEqual(bh.next_gap_us(2000, 1999, 10000, 0, 1000), 5000)  # at least 5 ms
        self.assertEqual(bh.next_gap_us(10**9, 1, 10**6, 0, 0), 200000)  # at most 200 ms


class Tables(unittest.TestCase):
    """The tables are what the bash script's awk programs printed from the same rows."""

    def test_http(self):
        rows = bh.read_tsv(FIXTURES / "results.tsv")
        self.assertEqual(bh.http_table(rows, 20), (FIXTURES / "table.md").read_text())

    def test_languages(self):
        rows = bh.read_tsv(FIXTURES / "languages.tsv")
        self.assertEqual(bh.languages_table(rows, 20), (FIXTURES / "languages-table.md").read_text())

    def test_emit(self):
        rows = bh.read_tsv(FIXTURES / "emit.tsv")
        self.assertEqual(bh.emit_table(rows), (FIXTURES / "emit-table.md").read_text())

    def test_the_real_run_s_tables(self):
        for tsv, table, render in (("run-results.tsv", "run-table.md", lambda r: bh.http_table(r, 20)),
                                   ("run-languages.tsv", "run-languages-table.md", lambda r: bh.languages_table(r, 20)),
                                   ("run-emit.tsv", "run-emit-table.md", bh.emit_table)):
            self.assertEqual(render(bh.read_tsv(FIXTURES / tsv)), (FIXTURES / table).read_text(), tsv)

    def test_a_table_without_native_modes(self):
        rows = [r for r in bh.read_tsv(FIXTURES / "results.tsv") if r[3] == "sharehost"]
        table = bh.http_table(rows, 20).splitlines()
        self.assertEqual(table[0].count("records/s |"), 3)  # ideal, sharehost, native free
        self.assertEqual(table[2], "| 1 | 1 | 1 | 50 | 50 / 49 | 0 / 0 | - / - | 526 / 503 | 1 / 1 |")

    def test_awk_s_numbers(self):
        self.assertEqual([bh.num(v) for v in ("12.5", "?", "", "3x", " 7", ".5", "1e3")],
                         [12.5, 0.0, 0.0, 3.0, 7.0, 0.5, 1000.0])


class Entry(unittest.TestCase):
    def test_help_and_a_bad_argument(self):
        run = subprocess.run([str(DEV / "bench-http"), "help"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0)
        self.assertIn("BENCH_HTTP_PARTS", run.stdout)
        run = subprocess.run([str(DEV / "bench-http"), "now"], capture_output=True, text=True)
        self.assertEqual((run.returncode, run.stderr), (1, "bench-http: error: unknown argument: now "
                                                            "(dev/bench-http help)\n"))

    def test_a_bad_setting_is_refused_before_anything_starts(self):
        env = dict(os.environ, BENCH_HTTP_PARTS="http emmit")
        run = subprocess.run([str(DEV / "bench-http")], capture_output=True, text=True, env=env)
        self.assertEqual((run.returncode, run.stderr), (1, "bench-http: error: unknown part 'emmit' in "
                                                            "BENCH_HTTP_PARTS\n"))


if __name__ == "__main__":
    unittest.main()
