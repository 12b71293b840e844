#!/usr/bin/env python3
"""Tests of dev/bench.py, run by dev/test (standard library only, no broker, no build, no peer).

The settings and their errors, the payloads, the quotas and the run order, the command lines of the tools and the
peers, and the parsing of what they print, on fixtures in dev/testdata/bench/: share-perf.out and consumer-perf.out
are ShareConsumerPerformance's and ConsumerPerformance's output from a real run, offsets.txt GetOffsetShell's,
metrics.txt a host's final /metrics; krafka.out and rdkafka.out are what the peers print (bench/peers/), which this
suite never runs (they take a long build and a venv).
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

DEV = Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import bench  # noqa: E402
from bench_host import Die  # noqa: E402

FIXTURES = DEV / "testdata" / "bench"


def fixture(name):
    return (FIXTURES / name).read_text()


def epoch(stamp):
    return bench.bench_host.epoch_us_of(stamp)


class Settings(unittest.TestCase):
    def test_defaults(self):
        cfg = bench.config_from_env({})
        self.assertEqual(cfg.records, 3000000)
        self.assertEqual(cfg.sizes, [100, 1024])
        self.assertEqual(cfg.partitions, 6)
        self.assertEqual(cfg.kinds, bench.DEFAULT_KINDS.split())
        self.assertEqual((cfg.processes, cfg.peer_processes, cfg.plugin_processes), ([1, 3], [1], [1]))
        self.assertEqual((cfg.warmup, cfg.warmup_rounds), (2000000, 15))
        self.assertEqual(cfg.admin_port, 31470)
        self.assertEqual(cfg.java_args, ["--fetch-size", "52428800"])
        self.assertEqual((cfg.idle_timeout, cfg.port_wait), (90, 1200))
        self.assertEqual(cfg.peers_target, bench.REPO / "target" / "peers-build")
        self.assertTrue(cfg.docs)
        self.assertEqual((cfg.jfr, cfg.perf, cfg.broker_cpus), (False, False, ""))
        self.assertEqual(cfg.all_processes(), [1, 3])

    def test_values(self):
        cfg = bench.config_from_env({
            "BENCH_RECORDS": "60000", "BENCH_SIZES": "100", "BENCH_KINDS": "classic java wasm native",
            "BENCH_PROCESSES": "1", "BENCH_WARMUP": "0", "BENCH_DOCS": "0", "BENCH_JAVA_ARGS": "",
            "BENCH_MANIFEST_EXTRA": "max_in_flight = 3000", "BENCH_PEERS_TARGET": "/tmp/peers",
            "BENCH_JFR": "1", "BENCH_PERF": "1", "BENCH_BROKER_CPUS": "0", "BENCH_WARMUP_ROUNDS": "3"})
        self.assertEqual((cfg.jfr, cfg.perf, cfg.broker_cpus, cfg.warmup_rounds), (True, True, "0", 3))
        self.assertEqual((cfg.records, cfg.sizes, cfg.warmup, cfg.docs), (60000, [100], 0, False))
        self.assertEqual(cfg.java_args, [])  # set but empty: the tools' own fetch size
        self.assertEqual(cfg.manifest_extra, "max_in_flight = 3000")
        self.assertEqual(cfg.peers_target, Path("/tmp/peers"))
        self.assertEqual(cfg.all_processes(), [1])
        # An empty variable means its default, as ${NAME:-default} did.
        self.assertEqual(bench.config_from_env({"BENCH_RECORDS": "", "BENCH_SIZES": ""}).sizes, [100, 1024])

    def test_errors_name_the_variable(self):
        cases = [
            ({"BENCH_RECORDS": "0"}, "BENCH_RECORDS must be a positive integer"),
            ({"BENCH_RECORDS": "1e6"}, r"BENCH_RECORDS must be a positive integer \(got '1e6'\)"),
            ({"BENCH_PARTITIONS": "x"}, "BENCH_PARTITIONS must be a positive integer"),
            ({"BENCH_WARMUP": "-1"}, "BENCH_WARMUP must be a non-negative integer"),
            ({"BENCH_RECORDS": "7"}, r"BENCH_RECORDS \(7\) must be a multiple of BENCH_PARTITIONS \(6\)"),
            ({"BENCH_SIZES": "100 79"}, "BENCH_SIZES: '79' is not a size of at least 80 bytes"),
            ({"BENCH_SIZES": "1k"}, "BENCH_SIZES: '1k' is not a size"),
            ({"BENCH_KINDS": "wasm kafka"}, "unknown consumer kind 'kafka' in BENCH_KINDS"),
            ({"BENCH_PROCESSES": "1 0"}, "BENCH_PROCESSES: process count '0'"),
            ({"BENCH_RECORDS": "1002", "BENCH_PROCESSES": "1 4", "BENCH_PARTITIONS": "1"},
             r"must be a multiple of every process count \(4\)"),
            ({"BENCH_RECORDS": "600", "BENCH_PROCESSES": "3"}, r"BENCH_RECORDS \(600\) is too small for 3 processes"),
            ({"BENCH_ADMIN_PORT": "70000"}, "BENCH_ADMIN_PORT must be a port"),
        ]
        for environ, message in cases:
            with self.subTest(environ=environ), self.assertRaisesRegex(Die, message):
                bench.config_from_env(environ)

    def test_process_counts_of_each_kind(self):
        cfg = bench.config_from_env({"BENCH_PROCESSES": "1 3", "BENCH_PEER_PROCESSES": "2",
                                     "BENCH_PLUGIN_PROCESSES": "1"})
        self.assertEqual(cfg.kind_processes("wasm-fleet"), [1, 3])
        self.assertEqual(cfg.kind_processes("rdkafka"), [2])
        self.assertEqual(cfg.kind_processes("native-validator"), [1])
        self.assertEqual(cfg.kind_processes("wasm-fleet-splitter"), [1])
        self.assertEqual(cfg.all_processes(), [1, 2, 3])

    def test_quotas(self):
        cfg = bench.config_from_env({"BENCH_RECORDS": "60000"})
        self.assertEqual(cfg.quota(1), 60000)
        self.assertEqual(cfg.quota(3), 60000 // 3 - 500)

    def test_command_line(self):
        environ = {"BENCH_SIZES": "100 1024", "KAFKA_PORT": "19092", "CARGO_TARGET_DIR": "/work/wt-target",
                   "BENCH_JAVA_ARGS": "", "HOME": "/root", "BENCH_X": "a\"b", "KAFKA_VERSION": "4.4.0"}
        self.assertEqual(bench.command_line(environ),
                         "BENCH_JAVA_ARGS='' BENCH_SIZES=100\\ 1024 BENCH_X=a\\\"b CARGO_TARGET_DIR=/work/wt-target "
                         "KAFKA_PORT=19092 dev/bench")


class RunOrder(unittest.TestCase):
    def test_who_goes_first_rotates(self):
        cfg = bench.config_from_env({"BENCH_KINDS": "classic java wasm", "BENCH_PROCESSES": "1 3",
                                     "BENCH_SIZES": "100 1024"})
        plan = [(size, runs) for size, runs in bench.schedule(cfg)]
        self.assertEqual(plan, [
            (100, [(1, "classic"), (1, "java"), (1, "wasm"), (3, "wasm"), (3, "java")]),
            (1024, [(1, "wasm"), (1, "classic"), (1, "java"), (3, "wasm"), (3, "java")]),
        ])

    def test_poll_gap(self):
        # 1000 records in 10 ms since the last change, 99,000 to go: about half of 990 ms, capped at 200 ms
        self.assertEqual(bench.next_gap_us(100000, 1000, 0, 10000, 0), 200000)
        self.assertEqual(bench.next_gap_us(100000, 90000, 80000, 10000, 0), 5000)
        self.assertEqual(bench.next_gap_us(100000, 99000, 98000, 100000, 0), 50000)


class Payloads(unittest.TestCase):
    def test_orders_of_exactly_the_size(self):
        for size in (80, 100, 1024):
            lines = bench.order_payloads(size)
            self.assertEqual(len(lines), 1000)
            for line in lines:
                self.assertEqual(len(line.encode()), size)
                order = json.loads(line)
                self.assertEqual(set(order), {"id", "sku", "quantity", "price", "note"})
        self.assertTrue(bench.order_payloads(100)[0].startswith('{"id":"o0","sku":"SKU-0","quantity":1,"price":0.5,'
                                                                 '"note":"afkqv'))

    def test_the_same_as_the_awk_program_made(self):
        # The payload file of a run of the shell script it replaced (100 B), kept to hold the content the same.
        self.assertEqual("\n".join(bench.order_payloads(100)) + "\n", fixture("orders-100b.txt"))


class ToolOutput(unittest.TestCase):
    def test_share_consumer_performance(self):
        r = bench.parse_share_perf(fixture("share-perf.out"), "share-perf.out")
        self.assertEqual(r.records, 60000)
        # the first progress line's end marks the first records; the final line's end the last
        self.assertEqual(r.first_us, epoch("2026-12-04 11:58:36.344+0000"))
        self.assertEqual(r.last_us, epoch("2026-12-04 11:58:38.107+0000"))

    def test_consumer_performance(self):
        r = bench.parse_consumer_perf(fixture("consumer-perf.out"), "consumer-perf.out")
        self.assertEqual(r.records, 60000)
        self.assertEqual(r.join_ms, 2977)
        # start + the rebalance time
        self.assertEqual(r.first_us, epoch("2026-12-04 11:58:17.873+0000") + 2977000)
        self.assertEqual(r.last_us, epoch("2026-12-04 11:58:21.848+0000"))

    def test_a_tool_that_stopped_early_or_printed_nothing(self):
        early = "WARNING: Exiting before consuming the expected number of records: timeout (600000 ms) exceeded.\n"
        for parse in (bench.parse_share_perf, bench.parse_consumer_perf):
            with self.assertRaisesRegex(Die, "x.out: the tool stopped before its records"):
                parse(early, "x.out")
            with self.assertRaisesRegex(Die, "no result line in x.out"):
                parse("Exception in thread main\n", "x.out")
        bad_date = "yesterday, today, 1, 1, 1, 60000, 5\n"
        with self.assertRaisesRegex(Die, "x.out: not a yyyy-MM-dd"):
            bench.parse_share_perf(bad_date, "x.out")

    def test_peers(self):
        for name in ("krafka.out", "rdkafka.out"):
            r = bench.parse_peer(fixture(name), name)
            self.assertEqual(r.records, 60000)
            self.assertLess(r.first_us, r.last_us)
        self.assertEqual(bench.parse_peer(fixture("rdkafka.out"), "x").commit_failures, 2)
        with self.assertRaisesRegex(Die, "no last_us in p.out"):
            bench.parse_peer("launch_us=1\nfirst_us=2\nrecords=3\ncommit_failures=0\n", "p.out")
        with self.assertRaisesRegex(Die, "no records in p.out"):
            bench.parse_peer("first_us=2\nlast_us=3\nrecords=-\ncommit_failures=0\n", "p.out")

    def test_peer_command_lines(self):
        self.assertEqual(bench.peer_argv("krafka", "/t/release/krafka-share-bench", "127.0.0.1:19092", "t", "g", 20),
                         ["/t/release/krafka-share-bench", "127.0.0.1:19092", "t", "g", "20"])
        argv = bench.peer_argv("rdkafka", "-", "b:1", "t", "g", 5)
        self.assertEqual(argv, [str(bench.PEERS_VENV / "bin" / "python"), str(bench.RDKAFKA_PEER / "share_bench.py"),
                                "b:1", "t", "g", "5"])

    def test_tool_command_lines(self):
        class FakeBroker:
            bootstrap = "127.0.0.1:19092"

            def tool_cmd(self, cls, *args, jvm=()):
                return ["java", "-Xmx512m", *jvm, cls, *map(str, args)]

        b = bench.Bench.__new__(bench.Bench)
        b.cfg = bench.config_from_env({})
        b.broker = FakeBroker()
        argv = b.java_tool_argv("org.apache.kafka.tools.ShareConsumerPerformance", "t", "g", 100, True)
        self.assertEqual(argv[:2], ["java", "-Xmx512m"])
        # Apache's perf-test flags come after dev/kafka's, so they win
        self.assertEqual(argv[2:2 + len(bench.JAVA_STOCK_FLAGS)], list(bench.JAVA_STOCK_FLAGS))
        self.assertEqual(argv[2 + len(bench.JAVA_STOCK_FLAGS):], [
            "org.apache.kafka.tools.ShareConsumerPerformance", "--bootstrap-server", "127.0.0.1:19092", "--topic", "t",
            "--group", "g", "--num-records", "100", "--timeout", "600000", "--show-detailed-stats",
            "--reporting-interval", "1000", "--date-format", "yyyy-MM-dd HH:mm:ss.SSSZ", "--fetch-size", "52428800"])
        argv = b.java_tool_argv("org.apache.kafka.tools.ConsumerPerformance", "t", "g", 100, False)
        self.assertNotIn("--show-detailed-stats", argv)

    def test_end_offsets(self):
        self.assertEqual(sum(bench.parse_end_offsets(fixture("offsets.txt"), "o")), 60000)
        with self.assertRaisesRegex(Die, "o: no topic:partition:offset lines"):
            bench.parse_end_offsets("Error: topic not found\n", "o")

    def test_metrics(self):
        text = fixture("metrics.txt")
        extra = bench.sharehost_extra(0.123, 4, text)
        self.assertEqual(extra, "poller_cpu_s=0.12 rejected=4 acks_failed=0 released_by_broker=0 session_resets=0")
        sample = ('sharehost_acknowledged_offsets_total{pipeline="bench",result="failed"} 3\n'
                  'sharehost_acknowledged_offsets_total{pipeline="bench",result="accepted"} 99\n'
                  '# HELP sharehost_session_resets_total x\nsharehost_session_resets_total{pipeline="b"} 1.5\n')
        self.assertEqual(bench.metric_sum(sample, "sharehost_acknowledged_offsets_total", 'result="failed"'), 3)
        self.assertEqual(bench.number_text(bench.metric_sum(sample, "sharehost_session_resets_total")), "1.5")
        self.assertEqual(bench.number_text(bench.metric_sum(sample, "sharehost_released_by_broker_total")), "0")

    def test_the_mean_output_write_of_a_run_that_writes(self):
        # Two hosts' histograms: the mean is over every write of both; dead letters are another kind.
        sample = ('sharehost_write_seconds_sum{pipeline="bench",kind="output"} 0.3\n'
                  'sharehost_write_seconds_count{pipeline="bench",kind="output"} 100\n'
                  'sharehost_write_seconds_sum{pipeline="bench",kind="output"} 0.1\n'
                  'sharehost_write_seconds_count{pipeline="bench",kind="output"} 100\n'
                  'sharehost_write_seconds_sum{pipeline="bench",kind="dead_letter"} 50\n'
                  'sharehost_write_seconds_count{pipeline="bench",kind="dead_letter"} 1\n')
        self.assertTrue(bench.sharehost_extra(0, 0, sample).endswith(" writes=200 write_ms=2.00"))

    def test_a_traced_run_says_its_spans_ended_and_exported(self):
        sample = ('sharehost_trace_spans_total{outcome="ended"} 606162\n'
                  'sharehost_trace_spans_total{outcome="exported"} 195397\n'
                  'sharehost_trace_spans_total{outcome="failed"} 0\n')
        self.assertTrue(bench.sharehost_extra(0, 0, sample).endswith(
            " spans_ended=606162 spans_exported=195397"))

    def test_avro_orders_are_framed_to_the_exact_size(self):
        # The wire format's length by hand: a zero byte, a 4-byte id, then each field (strings are a zigzag varint
        # length and the bytes, an int a zigzag varint, a double 8 bytes).
        def varint(n):
            return 1 if n < 128 else 2 if n < 16384 else 3

        for size in (100, 1024):
            for o in bench.avro_orders(size)[:50]:
                n = 5 + 8 + varint(2 * o["quantity"]) + sum(
                    varint(2 * len(o[f])) + len(o[f]) for f in ("id", "sku", "note"))
                self.assertEqual(n, size, o)

    def test_krafka_version_from_the_lock(self):
        self.assertEqual(bench.krafka_version((bench.KRAFKA_PEER / "Cargo.lock").read_text()), "0.28.1")
        self.assertEqual(bench.krafka_version("nothing"), "?")


class Rows(unittest.TestCase):
    def test_broker_extra(self):
        self.assertEqual(bench.broker_extra({}), "")
        delta = {"acks.Accept": 3000, "requests.Metadata": 4, "requests.ShareAcknowledge": 12,
                 "requests.ShareFetch": 2035, "state_records": 4100}
        self.assertEqual(bench.broker_extra(delta),
                         "broker: ShareAcknowledge=12 ShareFetch=2035 ack_accept=3000 state_records=4100")
        self.assertEqual(bench.join_extra("quota=1", "", "broker: x=1"), "quota=1 broker: x=1")

    def test_status(self):
        self.assertEqual(bench.row_status("classic", "g", "-", 100, 100, ""), "ok")
        self.assertEqual(bench.row_status("wasm", "g", 0, 100, 100, ""), "ok")
        self.assertEqual(bench.row_status("java", "g", 1000, 60000, 59000, ""), "ok")  # a quota run
        self.assertEqual(bench.row_status("java", "g", 1001, 60000, 59000, ""),
                         "failed: lag 1001 after reading 59000 of 60000 (not acknowledged)")
        self.assertEqual(bench.row_status("wasm", "g", "-", 100, 100, ""),
                         "failed: ShareGroupCommand shows no lag for the group (see g.describe)")
        self.assertEqual(bench.row_status("krafka", "g", 0, 100, 0, "the krafka peer exited with an error"),
                         "failed: the krafka peer exited with an error")

    def test_result_row(self):
        r = bench.Reading(read=60000, t0=1, first=2, last=3, cpu_s=1.234, rss_kb=2048, extra="quota=60000")
        self.assertEqual(bench.result_row(100, 1, "java", r, 0.5, "2.01", 0, "ok"),
                         "100\t1\tjava\t60000\t1\t2\t3\t1.23\t2048\t0.50\t2.01\t0\tok\tquota=60000\n")

    def test_fleet_manifest(self):
        head = bench.fleet_manifest_head("ed25519:abc", "bench-0", "g")
        self.assertEqual(head, '[trust]\nkeys = ["ed25519:abc"]\n\n[fleet]\nname = "bench"\nhost_id = "bench-0"\n'
                               'topic_prefix = "g."\n')

    def test_splitter_outputs_follow_the_pipelines_own_keys(self):
        self.assertEqual(bench.splitter_outputs("max_in_flight = 3000\n", "g"),
                         'max_in_flight = 3000\n[pipeline.outputs]\nurgent = "g-urgent"\nnormal = "g-normal"\n')
        self.assertEqual(bench.splitter_outputs("", "g"), '[pipeline.outputs]\nurgent = "g-urgent"\nnormal = "g-normal"\n')


class FakeBroker:
    """Kafka tools that print a fixture instead of talking to a broker."""

    bootstrap = "127.0.0.1:19092"
    pid = os.getpid()

    def __init__(self, prints=None, describes=()):
        self.prints = prints
        self.describes = list(describes)

    def tool_cmd(self, cls, *args, jvm=()):
        return [sys.executable, "-c", "import sys; sys.stdout.write(open(sys.argv[1]).read())", str(self.prints)]

    def tool(self, cls, *args, log=None):
        return 0, self.describes.pop(0)


class Runs(unittest.TestCase):
    """The tool and peer runs with stand-ins for the tools and peers, under the real /usr/bin/time."""

    def setUp(self):
        if not os.access("/usr/bin/time", os.X_OK):
            self.skipTest("no /usr/bin/time")
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def bench(self, environ, broker):
        b = bench.Bench.__new__(bench.Bench)
        b.cfg = bench.config_from_env(environ)
        b.environ = environ
        b.out = Path(self.dir.name)
        b.broker = broker
        b.live = []
        return b

    def test_share_consumer_performance_in_two_processes(self):
        b = self.bench({"BENCH_RECORDS": "60000"}, FakeBroker(prints=FIXTURES / "share-perf.out"))
        r = b.run_tool("java", "t", "g", 2)
        self.assertEqual(r.read, 120000)  # each stand-in prints the whole fixture: 60000
        self.assertEqual(r.first, epoch("2026-12-04 11:58:36.344+0000"))
        self.assertEqual(r.extra, "quota=29500")
        self.assertGreater(r.rss_kb, 0)
        self.assertTrue((Path(self.dir.name) / "g.1.time").is_file())

    def test_a_tool_that_read_too_little(self):
        b = self.bench({"BENCH_RECORDS": "120000"}, FakeBroker(prints=FIXTURES / "consumer-perf.out"))
        with self.assertRaisesRegex(Die, "ConsumerPerformance read 60000 records in g, expected 120000"):
            b.run_tool("classic", "t", "g", 1)

    def peer(self, script):
        path = Path(self.dir.name) / "peer"
        path.write_text(f"#!{sys.executable}\n{script}")
        path.chmod(0o755)
        return path

    def test_a_peer(self):
        b = self.bench({"BENCH_RECORDS": "60000"}, FakeBroker())
        b.krafka_bin = self.peer(f"import sys; sys.stdout.write(open({str(FIXTURES / 'krafka.out')!r}).read())")
        r = b.run_peer("krafka", "t", "g", 1)
        self.assertEqual((r.read, r.failed), (60000, ""))
        self.assertEqual(r.extra, "quota=60000 commit_failures=0")

    def test_a_peer_that_fails_is_a_failed_row(self):
        b = self.bench({"BENCH_RECORDS": "60000"}, FakeBroker())
        b.krafka_bin = self.peer("import sys; print('no share groups here', file=sys.stderr); sys.exit(1)")
        shown = io.StringIO()
        with contextlib.redirect_stderr(shown):
            r = b.run_peer("krafka", "t", "g", 1)
        self.assertEqual(shown.getvalue(), "no share groups here\n")  # the tail of its stderr
        self.assertEqual(r.failed, "the krafka peer exited with an error (see g.*.err)")
        self.assertEqual((r.read, r.first, r.last), (0, r.t0, r.t0))
        self.assertEqual(bench.row_status("krafka", "g", 60000, 60000, 0, r.failed),
                         "failed: the krafka peer exited with an error (see g.*.err)")

    def test_share_lag_asks_again_until_zero_or_once(self):
        lagging = (FIXTURES / "../bench-host/describe.txt").read_text().replace(" 0\n", " 7\n", 1)
        done = (FIXTURES / "../bench-host/describe.txt").read_text()
        group = "bench-java-100b-1p-115806"
        b = self.bench({}, FakeBroker(describes=[lagging, done]))
        self.assertEqual(b.share_lag(group, once=False), 0)
        b = self.bench({}, FakeBroker(describes=[lagging]))
        self.assertEqual(b.share_lag(group, once=True), 7)
        b = self.bench({}, FakeBroker(describes=["Group bench-x does not exist.\n"]))
        self.assertEqual(b.share_lag("bench-x", once=True), "-")


class Entry(unittest.TestCase):
    """dev/bench as a user runs it, for what needs no broker."""

    def run_bench(self, *args, **environ):
        env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
        env.update(environ)
        return subprocess.run([str(DEV / "bench"), *args], capture_output=True, text=True, env=env)

    def test_a_bad_setting_is_one_clear_line(self):
        out = self.run_bench(BENCH_KINDS="wasm nope")
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, "bench: error: unknown consumer kind 'nope' in BENCH_KINDS\n")

    def test_help_and_arguments(self):
        out = self.run_bench("--help")
        self.assertEqual(out.returncode, 0)
        self.assertIn("BENCH_RETABLE", out.stdout)
        self.assertEqual(self.run_bench("x").returncode, 2)

    def test_retable(self):
        with tempfile.TemporaryDirectory() as d:
            for f in ("results.tsv", "machine.txt"):
                (Path(d) / f).write_bytes((DEV / "testdata" / "bench-table" / "short" / f).read_bytes())
            out = self.run_bench(BENCH_RETABLE=d)
            self.assertEqual(out.returncode, 0, out.stderr)
            expected = (DEV / "testdata" / "bench-table" / "short" / "table.md").read_text()
            self.assertEqual(out.stdout, expected)
            self.assertEqual((Path(d) / "table.md").read_text(), expected)
        out = self.run_bench(BENCH_RETABLE="/nonexistent/run")
        self.assertEqual(out.returncode, 1)
        self.assertIn("no results.tsv and machine.txt in /nonexistent/run", out.stderr)


if __name__ == "__main__":
    unittest.main()
