#!/usr/bin/env python3
"""Tests of dev/bench_host.py, run by dev/test (standard library only, no broker, no build).

The parsers are tested on fixtures of real output in dev/testdata/bench-host/ (a /usr/bin/time -v report, a
ShareGroupCommand describe); a host is played by a small Python process that serves GET /pipelines and /metrics the
way `sharehost run` does and drains on SIGTERM, so starting, waiting, polling and stopping are tested for real.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from pathlib import Path

DEV = Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import bench_host  # noqa: E402
from bench_host import Die  # noqa: E402

FIXTURES = DEV / "testdata" / "bench-host"

# A stand-in for `sharehost run`: an admin endpoint on argv[1] whose accepted counter grows by argv[2] per request
# (after argv[3] requests that answer 503, as a host still starting does), a "drained" line on SIGTERM, exit argv[4];
# a POST answers 409 with what it was sent (its content type, then its body).
FAKE_HOST = textwrap.dedent("""
    import http.server, json, signal, sys
    port, step, not_ready, code = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    state = {"n": 0, "asked": 0}
    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def do_GET(self):
            state["asked"] += 1
            if state["asked"] <= not_ready:
                self.send_response(503); self.end_headers(); return
            if self.path == "/pipelines":
                state["n"] += step
                body = json.dumps([{"name": "bench", "versions": {"v1": {"accepted": state["n"], "rejected": 1},
                                                                   "v0": {"accepted": 5, "rejected": 0}}}]).encode()
            else:
                body = b"sharehost_session_resets_total{pipeline=\\"bench\\"} 0\\n"
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def do_POST(self):
            sent = self.rfile.read(int(self.headers["content-length"]))
            body = f"{self.path} {self.headers['content-type']} ".encode() + sent
            self.send_response(409); self.send_header("content-length", str(len(body))); self.end_headers()
            self.wfile.write(body)
    server = http.server.HTTPServer(("127.0.0.1", port), H)
    def term(*a):
        print("drained", flush=True)
        sys.exit(code)
    signal.signal(signal.SIGTERM, term)
    server.serve_forever()
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Parsers(unittest.TestCase):
    def test_time_report(self):
        r = bench_host.TimeReport.read(FIXTURES / "time-v.txt")
        self.assertAlmostEqual(r.cpu_s, 0.19 + 0.06)
        self.assertEqual(r.rss_kb, 36004)

    def test_time_report_names_the_file_when_cut_short(self):
        with self.assertRaisesRegex(Die, "cut.time: not a /usr/bin/time -v report"):
            bench_host.TimeReport.parse("\tUser time (seconds): 1.5\n", "cut.time")
        with self.assertRaisesRegex(Die, "cannot read the time report"):
            bench_host.TimeReport.read(FIXTURES / "no-such-file")

    def test_proc_stat_with_a_name_holding_spaces_and_parentheses(self):
        line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 17 0 0 20 0 9 0 123 0 0"
        self.assertEqual(bench_host.parse_stat(line, "stat"), 267)
        with self.assertRaisesRegex(Die, "stat: not a /proc stat line"):
            bench_host.parse_stat("4242 (x) S 1", "stat")

    def test_proc_of_this_process(self):
        self.assertGreaterEqual(bench_host.cpu_ticks(os.getpid()), 0)
        self.assertGreater(bench_host.status_kb(os.getpid(), "VmHWM"), 0)
        self.assertEqual(bench_host.cpu_ticks(2**22 + 7, if_gone=-1), -1)
        with self.assertRaisesRegex(Die, "is gone"):
            bench_host.cpu_ticks(2**22 + 7)
        with self.assertRaisesRegex(Die, "no VmNope in kB"):
            bench_host.status_kb(os.getpid(), "VmNope")

    def test_a_process_gone_or_a_zombie_has_no_rss_when_asked_so(self):
        self.assertEqual(bench_host.status_kb(2**22 + 7, "VmRSS", if_gone=""), "")
        with self.assertRaisesRegex(Die, "is gone"):
            bench_host.status_kb(2**22 + 7, "VmRSS")
        child = subprocess.Popen(["true"])  # not reaped until wait(): a zombie once it ended
        try:
            deadline = time.monotonic() + 60
            while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                self.assertLess(time.monotonic(), deadline, "the child never became a zombie")
                time.sleep(0.01)
            self.assertEqual(bench_host.status_kb(child.pid, "VmRSS", if_gone=""), "")
            with self.assertRaisesRegex(Die, "no VmRSS in kB"):
                bench_host.status_kb(child.pid, "VmRSS")
        finally:
            child.wait()

    def test_topic_count_sums_the_end_offsets(self):
        text = (DEV / "testdata" / "soak" / "offsets.txt").read_text()
        self.assertEqual(bench_host.topic_count(text), 61000)
        self.assertEqual(bench_host.topic_count("t:0:5\n[2026-12-04] WARN something (x)\nt:1:7\n"), 12)
        self.assertEqual(bench_host.topic_count(""), 0)
        # a topic's name holds no colon, so the last two fields are the partition and the offset
        self.assertEqual(bench_host.topic_count("soak-20261204-120000-out:3:1000\n"), 1000)

    def test_thread_cpu_of_this_process(self):
        comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
        main = bench_host.parse_stat(Path(f"/proc/{os.getpid()}/task/{os.getpid()}/stat").read_text(), "stat")
        self.assertGreaterEqual(bench_host.thread_cpu_seconds(os.getpid(), comm), main / bench_host.CLK_TCK)
        self.assertEqual(bench_host.thread_cpu_seconds(os.getpid(), "no-such-thread"), 0)

    def test_share_group_lag(self):
        text = (FIXTURES / "describe.txt").read_text()
        self.assertEqual(bench_host.share_group_lag(text, "bench-java-100b-1p-115806"), 0)
        self.assertIsNone(bench_host.share_group_lag(text, "another-group"))
        unknown = "GROUP TOPIC PARTITION START-OFFSET LAG\ng t 0 - -\n"
        self.assertIsNone(bench_host.share_group_lag(unknown, "g"))
        self.assertEqual(bench_host.share_group_lag("g t 0 5 7\ng t 1 9 3\n", "g"), 10)

    def test_judged_counts(self):
        status = [{"versions": {"a": {"accepted": 3, "rejected": 1}, "b": {"accepted": 4, "rejected": 0}}},
                  {"versions": {}}]
        self.assertEqual(bench_host.judged_counts(status), (7, 1))
        with self.assertRaisesRegex(Die, "x.json: not a list of pipelines"):
            bench_host.judged_counts([{"versions": {"a": {"accepted": 3}}}], "x.json")
        with self.assertRaisesRegex(Die, "not a list of pipelines"):
            bench_host.judged_counts({"error": "no"})

    def test_judged_counts_of_a_real_host(self):
        status = json.loads((DEV / "testdata" / "bench-http" / "pipelines.json").read_text())
        self.assertEqual(bench_host.judged_counts(status), (1600, 0))

    def test_a_real_host_s_time_report(self):
        report = bench_host.TimeReport.read(DEV / "testdata" / "bench-http" / "sharehost.time")
        self.assertEqual((f"{report.cpu_s:.2f}", report.rss_kb), ("0.58", 27428))

    def test_epoch_us_of_the_tools_dates(self):
        self.assertEqual(bench_host.epoch_us_of("2026-05-01 09:13:06.123+0000"), 1777626786123000)
        self.assertEqual(bench_host.epoch_us_of("2026-05-01 11:13:06.123+0200"), 1777626786123000)
        with self.assertRaises(ValueError):
            bench_host.epoch_us_of("yesterday")

    def test_bash_quote_reads_as_printf_q(self):
        cases = {"100 1024": r"100\ 1024", "a=b": "a=b", "": "''", "x,y:z@%+~^": r"x\,y:z@%+~\^", 'a"b': r'a\"b',
                 "~x": r"\~x", "a~": "a~", "#a": r"\#a", "/w/t-1/x_y.z": "/w/t-1/x_y.z"}
        for text, quoted in cases.items():
            self.assertEqual(bench_host.bash_quote(text), quoted, text)
        # and the shell reads each back as it was
        for text in cases:
            out = subprocess.run(["bash", "-c", f"printf %s {bench_host.bash_quote(text)}"], capture_output=True,
                                 text=True).stdout
            self.assertEqual(out, text)


class BrokerCounts(unittest.TestCase):
    def test_jmx_counts_by_request_ack_type_and_state_records(self):
        text = "\n".join([
            "Trying to connect to JMX url: service:jmx:rmi:///jndi/rmi://127.0.0.1:1/jmxrmi",
            "time\t1796452018162",
            "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=ShareFetch,version=1:Count\t5",
            "kafka.network:type=RequestMetrics,name=RequestsPerSec,request=ShareFetch,version=2:Count\t7",
            "kafka.server:type=ShareGroupMetrics,name=RecordAcknowledgementsPerSec,ackType=Accept:Count\t1000",
            "kafka.server:type=ShareGroupMetrics,name=RecordAcknowledgementsPerSec,ackType=Accept:MeanRate\t3.5",
            "kafka.log:type=Log,name=LogEndOffset,topic=__share_group_state,partition=0:Value\t10",
            "kafka.log:type=Log,name=LogEndOffset,topic=__share_group_state,partition=1:Value\t5",
            "kafka.log:type=Log,name=LogEndOffset,topic=other,partition=0:Value\t99",
            "not a line\tx",
        ])
        self.assertEqual(bench_host.parse_jmx(text),
                         {"requests.ShareFetch": 12, "acks.Accept": 1000, "state_records": 15})

    def test_the_port_of_a_jmx_agent_already_running_is_read_off_its_status(self):
        status = ("5593:\nAgent: enabled\n\nConnection Type: remote\nProtocol       : rmi\n"
                  "Properties     :\n  com.sun.management.jmxremote.rmi.port = 35035\n"
                  "  com.sun.management.jmxremote.ssl = false\n  com.sun.management.jmxremote.port = 35035\n")
        self.assertEqual(bench_host.parse_agent_port(status), 35035)
        self.assertEqual(bench_host.parse_agent_port("5593:\nAgent: disabled\n"), 0)

    def test_delta_counts_new_counters_from_zero_and_drops_zeros(self):
        self.assertEqual(bench_host.counters_delta({"a": 5, "b": 2}, {"a": 9, "b": 2, "c": 3}), {"a": 4, "c": 3})

    def test_thread_dump_names_each_native_thread(self):
        text = "\n".join([
            "12345:",
            '"data-plane-kafka-request-handler-0" #52 daemon prio=5 os_prio=0 cpu=1.2ms elapsed=3s '
            'tid=0x00007f00000000ab nid=0x3039 waiting on condition  [0x00007f]',
            "   java.lang.Thread.State: WAITING (parking)",
            '"GC Thread#1" os_prio=0 cpu=5ms elapsed=9s tid=0x00007f00000000cd nid=0x2f runnable',
            '"C2 CompilerThread0" #7 daemon prio=9 os_prio=0 cpu=1s elapsed=9s tid=0x1 nid=47 waiting',
            '"no nid here" #8 daemon',
        ])
        self.assertEqual(bench_host.parse_thread_dump(text), {
            0x3039: "data-plane-kafka-request-handler-0", 0x2f: "GC Thread#1", 47: "C2 CompilerThread0"})

    def test_thread_cpu_adds_a_pool_up_and_counts_new_threads_from_zero(self):
        names = {1: "kafka-request-handler-0", 2: "kafka-request-handler-1", 3: "GC Thread#0"}
        before = {1: 100, 2: 50, 3: 10, 9: 7}
        after = {1: 150, 2: 70, 3: 10, 4: 30}
        self.assertEqual(bench_host.thread_cpu(before, after, names, hz=10),
                         [("kafka-request-handler-#", 7.0), ("thread #", 3.0)])

    def test_thread_ticks_reads_this_process(self):
        ticks = bench_host.thread_ticks(os.getpid())
        self.assertIn(threading.get_native_id(), ticks)
        self.assertEqual(bench_host.thread_ticks(2 ** 22 + 1), {})

    def test_hot_methods_rank_self_samples_and_count_each_stack_once(self):
        def sample(*frames):
            return {"values": {"stackTrace": {"frames": [
                {"method": {"type": {"name": c}, "name": m}} for c, m in frames]}}}
        doc = {"recording": {"events": [
            sample(("A", "leaf"), ("B", "mid"), ("B", "mid")),
            sample(("A", "leaf"), ("pkg/C", "top")),
            sample(("B", "mid")),
            {"values": {"stackTrace": None}},
        ]}}
        hot, inclusive, samples = bench_host.hot_methods(json.dumps(doc))
        self.assertEqual(samples, 4)
        self.assertEqual(hot, [("A.leaf", 2, 2), ("B.mid", 1, 2)])
        self.assertEqual(inclusive, [("A.leaf", 2), ("B.mid", 2), ("pkg.C.top", 1)])


class Manifests(unittest.TestCase):
    def test_one_pipeline(self):
        pipe = bench_host.Pipeline("bench", ["t"], "g", "/x/accept_all.wasm", "max_in_flight = 3")
        text = bench_host.manifest("127.0.0.1:19092", 39470, [pipe])
        self.assertEqual(text, textwrap.dedent("""\
            [cluster]
            bootstrap = "127.0.0.1:19092"
            client_id = "sharehost-bench"

            [admin]
            listen = "127.0.0.1:39470"

            [[pipeline]]
            name = "bench"
            topics = ["t"]
            group = "g"
            component = "/x/accept_all.wasm"
            max_in_flight = 3
            """))

    def test_before_after_admin_and_many_pipelines(self):
        pipes = [bench_host.Pipeline(f"p{i}", [f"t-{i}"], f"t-{i}-g", "c.wasm", "x = 1") for i in range(2)]
        text = bench_host.manifest("b:1", 1, pipes, client_id="c", before="[trust]\nkeys = [\"k\"]\n",
                                   after_admin="[runtime]\nfuel = 2")
        self.assertTrue(text.startswith('[trust]\nkeys = ["k"]\n\n[cluster]\n'))
        self.assertIn('listen = "127.0.0.1:1"\n\n[runtime]\nfuel = 2\n\n[[pipeline]]\nname = "p0"', text)
        self.assertIn('x = 1\n\n[[pipeline]]\nname = "p1"\ntopics = ["t-1"]\ngroup = "t-1-g"', text)
        self.assertTrue(text.endswith("x = 1\n"))

    def test_no_client_id_leaves_the_host_s_default(self):
        text = bench_host.manifest("127.0.0.1:9092", 39500, [], client_id=None)
        self.assertEqual(text, '[cluster]\nbootstrap = "127.0.0.1:9092"\n\n[admin]\nlisten = "127.0.0.1:39500"\n')

    def test_strings_are_escaped(self):
        self.assertEqual(bench_host.toml_string('a"b\\c\n'), '"a\\"b\\\\c\\u000a"')


# A driver's main over driver_main: argv[1] says what its body does after registering two clean-ups (the first of
# which fails): "ok" (exit 7), "die", or "wait" (say "ready", then sleep until a signal ends it).
DRIVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import bench_host
    def body(on_exit):
        def failing():
            raise bench_host.Die("broker still there")
        on_exit(failing)
        on_exit(lambda: print("second clean-up", flush=True))
        if sys.argv[1] == "die":
            raise bench_host.Die("no topic")
        if sys.argv[1] == "wait":
            print("ready", flush=True)
            time.sleep(600)
        return 7
    sys.exit(bench_host.driver_main("dev/x", body))
""")


class DriverMain(unittest.TestCase):
    def run_driver(self, what):
        return subprocess.run([sys.executable, "-c", DRIVER, what, str(DEV)], capture_output=True, text=True,
                              timeout=60)

    def test_the_body_s_status_and_every_clean_up_the_last_first(self):
        run = self.run_driver("ok")
        self.assertEqual((run.returncode, run.stdout, run.stderr),
                         (7, "second clean-up\n", "dev/x: error while stopping: broker still there\n"))

    def test_a_die_is_an_error_and_status_1(self):
        run = self.run_driver("die")
        self.assertEqual((run.returncode, run.stdout), (1, "second clean-up\n"))
        self.assertEqual(run.stderr, "dev/x: error: no topic\ndev/x: error while stopping: broker still there\n")

    def test_sigterm_ends_the_run_as_ctrl_c_does(self):
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, "wait", str(DEV)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(proc.stdout.readline(), "ready\n")  # the handler is set before the body runs
            proc.terminate()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
        self.assertEqual((proc.returncode, out), (130, "second clean-up\n"))
        self.assertEqual(err, "dev/x: interrupted\ndev/x: error while stopping: broker still there\n")


class Hosts(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="bench-host-test."))
        self.script = self.dir / "fake_host.py"
        self.script.write_text(FAKE_HOST)

    def tearDown(self):
        for h in getattr(self, "hosts", []):
            h.kill()
        for f in self.dir.iterdir():
            f.unlink()
        self.dir.rmdir()

    def host(self, step=10, not_ready=0, code=0, timed=False):
        port = free_port()
        h = bench_host.Host([sys.executable, self.script, port, step, not_ready, code], port, self.dir / "out",
                            self.dir / "err", time_report=self.dir / "time" if timed else None)
        self.hosts = getattr(self, "hosts", []) + [h]
        return h

    def test_ready_judged_saved_and_stopped(self):
        h = self.host(not_ready=2)
        h.wait_ready(60)
        # The fake's counter grows by 10 per answer (wait_ready's was the first): accepted + rejected over both versions
        self.assertEqual(h.judged(), 20 + 1 + 5)
        t, n = h.wait_judged(100, idle_s=30, poll_s=0.01)
        self.assertGreaterEqual(t, bench_host.now_us() - 60_000_000)
        self.assertGreaterEqual(n, 100)
        h.save(self.dir / "final")
        self.assertEqual(json.loads((self.dir / "final.pipelines.json").read_text())[0]["name"], "bench")
        self.assertIn("sharehost_session_resets_total", (self.dir / "final.metrics").read_text())
        self.assertEqual(h.stop(60), 0)
        self.assertIn("drained", (self.dir / "out").read_text())
        self.assertIsNone(h.judged())

    def test_a_post_s_answer_is_read_whatever_its_status(self):
        h = self.host()
        h.wait_ready(60)
        self.assertEqual(bench_host.admin_post(h.admin_port, "/pipelines/p/swap", {"path": "/b.wasm"}),
                         (409, b'/pipelines/p/swap application/json {"path": "/b.wasm"}'))
        self.assertEqual(bench_host.admin_post(h.admin_port, "/__reset"), (409, b"/__reset None "))
        h.stop(60)
        self.assertEqual(bench_host.admin_post(h.admin_port, "/__reset", timeout=2), (None, b""))

    def test_under_usr_bin_time_the_host_gets_the_signal_and_the_report_is_written(self):
        if not os.access("/usr/bin/time", os.X_OK):
            self.skipTest("no /usr/bin/time")
        h = self.host(code=3, timed=True)
        h.wait_ready(60)
        self.assertNotEqual(h.host_pids(), [h.pid])
        self.assertEqual(h.stop(60), 3)
        report = bench_host.TimeReport.read(self.dir / "time")
        self.assertGreater(report.rss_kb, 0)

    def test_a_host_that_exits_fails_the_waits(self):
        port = free_port()
        h = bench_host.Host([sys.executable, "-c", "import sys; print('bad manifest', file=sys.stderr); sys.exit(1)"],
                            port, self.dir / "out", self.dir / "err")
        self.hosts = [h]
        with self.assertRaisesRegex(Die, "exited before its admin endpoint answered"):
            h.wait_ready(60)
        with self.assertRaisesRegex(Die, "the host exited"):
            h.wait_judged(1, idle_s=60)

    def test_no_progress_is_a_failure_after_the_idle_limit(self):
        h = self.host(step=0)
        h.wait_ready(60)
        t0 = time.monotonic()
        with self.assertRaisesRegex(Die, "no progress for 0.3s at 6 of 100 records"):
            h.wait_judged(100, idle_s=0.3, poll_s=0.01)
        self.assertLess(time.monotonic() - t0, 30)

    def test_an_endpoint_that_never_answers_is_an_upper_bound(self):
        port = free_port()
        h = bench_host.Host([sys.executable, "-c", "import time; time.sleep(600)"], port, self.dir / "out")
        self.hosts = [h]
        with self.assertRaisesRegex(Die, f"port {port} did not answer within 0.5s"):
            h.wait_ready(0.5)
        h.kill()
        self.assertFalse(h.running())


if __name__ == "__main__":
    unittest.main()
