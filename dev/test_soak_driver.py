#!/usr/bin/env python3
"""Tests of dev/soak_driver.py (dev/soak's program), run by dev/test: standard library only, no broker, no build.

Fixtures in dev/testdata/soak/: the manifests the bash dev/soak wrote (its write_manifest, run on fixed values), and
what a real small soak left (SOAK_MINUTES=2 SOAK_SWAP_EVERY=1, the broker restarted at 60 s): ProducerPerformance's
log (with the retries around the restart), the host's last GET /pipelines answer (two versions after the swap),
samples.csv and events.csv; GetOffsetShell's output for a topic of 6 partitions.
"""

import collections
import json
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import unittest

DEV = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import soak_driver as sd  # noqa: E402

FIXTURES = DEV / "testdata" / "soak"


class Scratch(unittest.TestCase):
    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="soak-test-"))

    def tearDown(self):
        subprocess.run(["rm", "-rf", str(self.tmp)], check=True)

    def write(self, name, text):
        path = self.tmp / name
        path.write_text(text)
        return path


# --- settings ------------------------------------------------------------------------------------------------------


class SettingsFromEnv(unittest.TestCase):
    def test_the_defaults_are_the_30_minute_soak(self):
        s = sd.settings_from_env({})
        self.assertEqual((s.minutes, s.swap_every, s.restart_s, s.rate, s.load_pct), (30, 5, 900, None, 50))
        self.assertEqual((s.peak_records, s.partitions, s.sample_every, s.rss_growth_pct), (300000, 6, 10, 10))
        self.assertEqual((s.drain_timeout, s.admin_port, s.manifest_extra), (180, 27470, ""))
        self.assertEqual((s.precompile, s.read_input, s.keep_topics), (True, False, False))
        self.assertEqual(s.swap_times(), [300, 600, 900, 1200, 1500])

    def test_empty_means_the_default_as_in_bash(self):
        s = sd.settings_from_env({"SOAK_MINUTES": "", "SOAK_RATE": "", "SOAK_PRECOMPILE": ""})
        self.assertEqual((s.minutes, s.rate, s.precompile), (30, None, True))

    def test_a_short_run_swaps_every_minute_before_its_end(self):
        s = sd.settings_from_env({"SOAK_MINUTES": "2", "SOAK_SWAP_EVERY": "1", "SOAK_RATE": "500"})
        self.assertEqual((s.duration_s, s.swap_times(), s.restart_s, s.rate), (120, [60], 60, 500))

    def test_numbers_must_be_positive_whole_numbers_and_the_error_names_the_variable(self):
        for name in ("SOAK_MINUTES", "SOAK_SWAP_EVERY", "SOAK_RATE", "SOAK_LOAD_PCT", "SOAK_PEAK_RECORDS",
                     "SOAK_PARTITIONS", "SOAK_SAMPLE_EVERY", "SOAK_RSS_GROWTH_PCT", "SOAK_DRAIN_TIMEOUT",
                     "SOAK_ADMIN_PORT"):
            for bad in ("0", "-3", "1.5", "ten", "07"):
                with self.assertRaises(sd.Die, msg=f"{name}={bad}") as e:
                    sd.settings_from_env({name: bad})
                self.assertIn(name, str(e.exception))
                self.assertIn(f"'{bad}'", str(e.exception))

    def test_the_admin_port_must_be_a_port(self):
        with self.assertRaisesRegex(sd.Die, "SOAK_ADMIN_PORT"):
            sd.settings_from_env({"SOAK_ADMIN_PORT": "70000"})

    def test_switches_are_0_or_1(self):
        s = sd.settings_from_env({"SOAK_PRECOMPILE": "0", "SOAK_READ_INPUT": "1", "SOAK_KEEP_TOPICS": "1"})
        self.assertEqual((s.precompile, s.read_input, s.keep_topics), (False, True, True))
        with self.assertRaisesRegex(sd.Die, "SOAK_KEEP_TOPICS must be 0 or 1 \\(got 'yes'\\)"):
            sd.settings_from_env({"SOAK_KEEP_TOPICS": "yes"})


class RestartAt(unittest.TestCase):
    def test_unset_is_half_time_in_seconds_so_an_odd_run_restarts_exactly_half_way(self):
        self.assertEqual(sd.parse_restart(None, 30), 900)
        self.assertEqual(sd.parse_restart(None, 3), 90)

    def test_empty_or_none_is_no_restart(self):
        self.assertIsNone(sd.parse_restart("", 30))
        self.assertIsNone(sd.parse_restart("none", 30))
        self.assertIsNone(sd.settings_from_env({"SOAK_RESTART_AT": ""}).restart_s)

    def test_minutes_or_seconds(self):
        self.assertEqual(sd.parse_restart("7", 30), 420)
        self.assertEqual(sd.parse_restart("45s", 30), 45)
        self.assertEqual(sd.parse_restart("30", 30), 1800)

    def test_anything_else_or_after_the_end_is_refused(self):
        for bad in ("x", "1.5", "-1", "5m"):
            with self.assertRaisesRegex(sd.Die, "SOAK_RESTART_AT"):
                sd.parse_restart(bad, 30)
        with self.assertRaisesRegex(sd.Die, "after the soak's end"):
            sd.parse_restart("31", 30)


# --- files the run writes ------------------------------------------------------------------------------------------


class Manifest(unittest.TestCase):
    """The manifest is byte for byte what the bash dev/soak's write_manifest wrote."""

    def test_without_extra_lines(self):
        text = sd.manifest_text("127.0.0.1:19192", 39570, "soak-20261204-120000", "soak-20261204-120000",
                                "/out/ledger-a.wasm")
        self.assertEqual(text, (FIXTURES / "manifest.toml").read_text())

    def test_with_extra_lines_and_component_b(self):
        text = sd.manifest_text("127.0.0.1:19192", 39570, "soak-t", "soak-g", "/out/ledger-b.wasm",
                                "max_in_flight = 3000")
        self.assertEqual(text, (FIXTURES / "manifest-b-extra.toml").read_text())

    def test_it_is_toml_with_the_soak_pipeline(self):
        import tomllib

        doc = tomllib.loads(sd.manifest_text("127.0.0.1:1", 2, "t", "g", "/c.wasm", "max_in_flight = 3000"))
        p = doc["pipeline"][0]
        self.assertEqual((p["name"], p["topics"], p["dead_letter_topic"], p["outputs"]), ("soak", ["t"], "t-dlq",
                                                                                          {"ids": "t-out"}))
        self.assertEqual((p["config"], p["max_in_flight"]), ({"emit-to": "ids"}, 3000))


class ComponentB(Scratch):
    def test_leb128(self):
        self.assertEqual([sd.leb128(n) for n in (0, 1, 127, 128, 300, 624485)],
                         [b"\x00", b"\x01", b"\x7f", b"\x80\x01", b"\xac\x02", b"\xe5\x8e\x26"])

    def test_b_is_a_with_one_custom_section_as_the_bash_soak_appended_it(self):
        a = self.tmp / "a.wasm"
        a.write_bytes(b"\x00asm\x01\x00\x00\x00")
        sd.make_component_b(a, self.tmp / "b.wasm")
        self.assertEqual((self.tmp / "b.wasm").read_bytes(),
                         b"\x00asm\x01\x00\x00\x00" + b"\x00\x18\x16sharehost-soak-version" + b"b")

    def test_a_long_section_gets_a_multi_byte_size(self):
        out = sd.with_custom_section(b"", b"n" * 200, b"")
        self.assertEqual(out[:3], b"\x00\xca\x01")  # 202: the name's two-byte length, then the name
        self.assertEqual(out[3:5], b"\xc8\x01")  # the name's length, 200


# --- what the tools and the host print -----------------------------------------------------------------------------


class ToolOutput(unittest.TestCase):
    def test_the_producer_log_of_a_real_soak(self):
        log = (FIXTURES / "producer.log").read_text()
        last, failed = sd.producer_report(log)
        self.assertRegex(last, r"^[0-9]+ records sent, .* records/sec")
        self.assertFalse(failed, "its retries around the broker restart are WARN lines")
        self.assertIn("NotLeaderOrFollowerException", log)
        records = int(last.split()[0])
        self.assertTrue(sd.input_is_range(records, records, last, failed))

    def test_retries_logged_as_warn_are_not_failed_sends(self):
        log = ("[2026-12-04 12:00:01,000] WARN [Producer clientId=x] Got error produce response ... "
               "NetworkException (org.apache.kafka.clients.producer.internals.Sender)\n"
               "100 records sent, 10.0 records/sec (0.00 MB/sec), 1.0 ms avg latency, 2.0 ms max latency.\n")
        self.assertEqual(sd.producer_report(log), (log.splitlines()[1], False))

    def test_an_error_line_or_a_stack_trace_is_a_failed_send(self):
        for line in ("[2026-12-04 12:00:01,000] ERROR Error when sending message (x)",
                     "org.apache.kafka.common.errors.TimeoutException: Expiring 5 record(s)",
                     "\tat org.apache.kafka.tools.ProducerPerformance$PerfCallback.onCompletion(Exception)"):
            self.assertTrue(sd.producer_report(f"{line}\n100 records sent, 1 records/sec\n")[1], line)

    def test_the_input_is_read_back_unless_the_producer_proves_its_content(self):
        line = "600 records sent, 5.0 records/sec (0.00 MB/sec), 1.0 ms avg latency, 2.0 ms max latency."
        self.assertTrue(sd.input_is_range(600, 600, line, False))
        self.assertFalse(sd.input_is_range(600, 600, line, True))  # a failed send
        self.assertFalse(sd.input_is_range(600, 601, line, False))  # more records than sent
        self.assertFalse(sd.input_is_range(6000, 6000, line, False))  # the last line is a progress window's
        self.assertFalse(sd.input_is_range(600, 600, "", False))  # no summary line

    def test_the_pipelines_answer_of_a_real_host(self):
        body = (FIXTURES / "pipelines.json").read_text()
        st = sd.pipeline_status(body)
        doc = json.loads(body)[0]
        self.assertEqual(st.accepted, sum(v["accepted"] for v in doc["versions"].values()))
        self.assertEqual((st.dead_lettered, st.in_flight, st.active_version),
                         (doc["dead_lettered"], doc["in_flight"], doc["active_version"]))
        self.assertGreater(len(doc["versions"]), 1, "the fixture is from after a swap")

    def test_an_answer_that_is_not_the_host_s_is_none(self):
        for body in ("", "not json", "[]", "{}", '[{"versions": 3}]', '[{"versions": {}, "dead_lettered": "x"}]',
                     '[{"versions": [{"accepted": 1}], "dead_lettered": 0, "in_flight": 0, "active_version": "a"}]'):
            self.assertIsNone(sd.pipeline_status(body), body)

    def test_peak_rate(self):
        self.assertEqual(sd.peak_rate(1000, 500, 3000, 100500), 50000)
        self.assertIsNone(sd.peak_rate(None, 0, None, 0))  # nothing accepted
        self.assertIsNone(sd.peak_rate(1000, 10, None, 10))  # not all read
        self.assertIsNone(sd.peak_rate(1000, 10, 1000, 10))  # first and last in one poll


class Proc(unittest.TestCase):
    def test_open_fds(self):
        self.assertGreater(sd.proc_fds(os.getpid()), 2)
        self.assertIsNone(sd.proc_fds(2**22 + 1))


# --- the drain -----------------------------------------------------------------------------------------------------


def st(acc, dead=0, in_flight=0):
    return sd.Status(acc, dead, in_flight, "v")


class Drain(unittest.TestCase):
    def test_drained_once_every_record_is_judged_none_in_flight_and_the_counters_still_for_10_s(self):
        w = sd.DrainWatch(1000)
        self.assertFalse(w.drained(st(990, 10), 0))
        self.assertFalse(w.drained(st(990, 10), 9999))
        self.assertTrue(w.drained(st(990, 10), 10000))

    def test_moving_counters_start_the_stillness_again(self):
        w = sd.DrainWatch(1000)
        self.assertFalse(w.drained(st(1000), 0))
        self.assertFalse(w.drained(st(1001), 9000))  # a redelivery's duplicate judged
        self.assertFalse(w.drained(st(1001), 18000))
        self.assertTrue(w.drained(st(1001), 19000))

    def test_records_in_flight_or_not_yet_judged_keep_it_waiting(self):
        w = sd.DrainWatch(1000)
        self.assertFalse(w.drained(st(1000, 0, 3), 0))
        self.assertFalse(w.drained(st(1000, 0, 3), 60000))
        w = sd.DrainWatch(1000)
        self.assertFalse(w.drained(st(999), 0))
        self.assertFalse(w.drained(st(999), 60000))

    def test_a_poll_without_an_answer_neither_drains_nor_restarts_the_stillness(self):
        w = sd.DrainWatch(10)
        self.assertFalse(w.drained(st(10), 0))
        self.assertFalse(w.drained(None, 10000))
        self.assertTrue(w.drained(st(10), 10000))


# --- the ledger ----------------------------------------------------------------------------------------------------


def reference(inp, out, dlq):
    """The ledger's figures the slow, obvious way."""
    c_in, c_out, c_dlq = collections.Counter(inp), collections.Counter(out), collections.Counter(dlq)
    lost = sorted(i for i in c_in if i not in c_out and i not in c_dlq)
    return {
        "input_records": len(inp),
        "produced": len(c_in),
        "accepted": len(c_out),
        "dead_lettered": len(c_dlq),
        "output_records": len(out),
        "duplicates": len(out) - len(c_out),
        "lost": len(lost),
        "foreign": len((set(c_out) | set(c_dlq)) - set(c_in)),
        "lost_ids_first": lost[:20],
    }


def ledger(inp, out, dlq):
    lg = sd.Ledger.with_range(inp) if isinstance(inp, int) else sd.Ledger()
    if not isinstance(inp, int):
        lg.add(sd.IN, inp)
    lg.add(sd.OUT, out)
    lg.add(sd.DLQ, dlq)
    return lg.figures()


class LedgerArithmetic(unittest.TestCase):
    def test_everything_accepted_once(self):
        f = ledger(1000, range(1000), [])
        self.assertEqual((f["produced"], f["accepted"], f["duplicates"], f["lost"], f["foreign"]),
                         (1000, 1000, 0, 0, 0))

    def test_redeliveries_are_duplicates_not_extra_accepted(self):
        f = ledger(100, list(range(100)) + [5, 5, 7], [])
        self.assertEqual((f["accepted"], f["output_records"], f["duplicates"], f["lost"]), (100, 103, 3, 0))

    def test_dead_lettered_ids_are_judged_not_lost(self):
        f = ledger(10, [0, 1, 2, 3, 4], [5, 6, 7, 8, 9])
        self.assertEqual((f["accepted"], f["dead_lettered"], f["lost"]), (5, 5, 0))

    def test_lost_ids_are_counted_and_the_first_20_listed(self):
        f = ledger(100, range(0, 100, 3), [1])
        want = [i for i in range(100) if i % 3 and i != 1]
        self.assertEqual((f["lost"], f["lost_ids_first"]), (len(want), want[:20]))

    def test_outputs_of_ids_never_produced_are_foreign(self):
        f = ledger(10, list(range(10)) + [10, 11, 11], [12, 10])
        self.assertEqual((f["foreign"], f["accepted"], f["dead_lettered"]), (3, 12, 2))

    def test_a_huge_stray_id_is_foreign_without_a_table_that_large(self):
        lg = sd.Ledger.with_range(10)
        lg.add(sd.OUT, [*range(10), 10**15])
        f = lg.figures()
        self.assertEqual((f["foreign"], f["accepted"], f["lost"]), (1, 11, 0))
        self.assertLess(len(lg.dense), 1 << 22)

    def test_an_input_read_back_with_repeats_and_gaps(self):
        inp = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
        self.assertEqual(ledger(inp, [1, 2, 3, 9, 9], [4]), reference(inp, [1, 2, 3, 9, 9], [4]))

    def test_random_ledgers_agree_with_the_obvious_count(self):
        rnd = random.Random(34)
        for _ in range(50):
            n = rnd.randrange(0, 3000)
            inp = [rnd.randrange(0, n + 1) for _ in range(n)] if rnd.random() < 0.5 else list(range(n))
            out = [rnd.randrange(0, n + 50) for _ in range(rnd.randrange(0, 2 * n + 1))]
            dlq = [rnd.randrange(0, n + 50) for _ in range(rnd.randrange(0, 20))]
            if rnd.random() < 0.2:
                out.append(rnd.randrange(10**9, 10**12))
            self.assertEqual(ledger(inp, out, dlq), reference(inp, out, dlq))
            if inp == list(range(n)):
                self.assertEqual(ledger(n, out, dlq), reference(inp, out, dlq))

    def test_its_lines_as_dev_soak_ledger_printed_them(self):
        lines, ok = sd.ledger_lines(ledger(5, [0, 1, 1], [2]))
        self.assertFalse(ok)
        self.assertEqual(lines, [
            "ledger: produced 5 (input records 5), accepted 2, dead-lettered 1, output records 3, duplicates 1, "
            "foreign 0, lost 2",
            "ledger: first lost ids: 3, 4",
            "ledger: 2 records lost, 0 outputs of ids never produced",
        ])
        lines, ok = sd.ledger_lines(ledger(2, [0, 1], []))
        self.assertTrue(ok)
        self.assertEqual(len(lines), 1)
        lines, ok = sd.ledger_lines(ledger(2, [0, 1, 2], []))
        self.assertEqual((ok, lines[-1]), (False, "ledger: 0 records lost, 1 outputs of ids never produced"))


class LedgerFiles(Scratch):
    def test_a_read_back_topic_is_one_decimal_id_per_line(self):
        self.assertEqual(list(sd.read_ids(self.write("out.txt", "3\n1\n2\n"))), [3, 1, 2])
        self.assertEqual(list(sd.read_ids(self.write("nl.txt", "3\n1"))), [3, 1])
        self.assertEqual(list(sd.read_ids(self.write("crlf.txt", "3\r\n1\r\n"))), [3, 1])

    def test_an_empty_topic_holds_no_ids(self):
        self.assertEqual(list(sd.read_ids(self.write("e.txt", ""))), [])
        self.assertEqual(list(sd.read_ids(self.write("ws.txt", "\n \n"))), [])

    def test_a_line_that_is_not_an_id_fails_naming_the_file_and_line(self):
        path = self.write("bad.txt", "1\n2\nhello\n")
        with self.assertRaisesRegex(sd.Die, f"{path}: line 3 is not a non-negative decimal id: b'hello'"):
            list(sd.read_ids(path))
        for bad in ("-1\n", "1.0\n", "+1\n", " 1\n", "1 2\n"):
            with self.assertRaises(sd.Die, msg=bad):
                list(sd.read_ids(self.write("bad.txt", bad)))
        with self.assertRaisesRegex(sd.Die, "line 2 is empty"):
            list(sd.read_ids(self.write("gap.txt", "1\n\n2\n")))

    def test_run_ledger_writes_the_figures(self):
        out, dlq = self.write("out.txt", "0\n1\n1\n"), self.write("dlq.txt", "2\n")
        lines, ok = sd.run_ledger(3, out, dlq, self.tmp / "ledger.json")
        self.assertTrue(ok)
        figures = json.loads((self.tmp / "ledger.json").read_text())
        self.assertEqual((figures["produced"], figures["duplicates"], figures["lost"]), (3, 1, 0))
        lines, ok = sd.run_ledger(self.write("in.txt", "0\n1\n2\n3\n"), out, dlq, self.tmp / "ledger.json")
        self.assertEqual((ok, json.loads((self.tmp / "ledger.json").read_text())["lost_ids_first"]), (False, [3]))

    def test_the_ledger_command(self):
        out, dlq = self.write("out.txt", "0\n1\n"), self.write("dlq.txt", "")
        run = subprocess.run([str(DEV / "soak"), "ledger", "--range", "2", out, dlq, self.tmp / "l.json"],
                             capture_output=True, text=True)
        self.assertEqual((run.returncode, run.stdout.count("\n")), (0, 1), run.stderr)
        run = subprocess.run([str(DEV / "soak"), "ledger", "--range", "3", out, dlq, self.tmp / "l.json"],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("1 records lost", run.stdout)
        run = subprocess.run([str(DEV / "soak"), "ledger", out], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("usage: dev/soak ledger", run.stderr)
        run = subprocess.run([str(DEV / "soak"), "ledger", "--range", "3", self.tmp / "none", dlq,
                              self.tmp / "l.json"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("No such file", run.stderr)
        self.assertNotIn("Traceback", run.stderr)


# --- the RSS rule --------------------------------------------------------------------------------------------------


def rows(pairs, **cols):
    """Sample rows as read_samples gives them: (t, rss) pairs, rss None for a sample the host did not answer."""
    out = []
    for t, rss in pairs:
        r = {"t_s": float(t), "rss_kib": "" if rss is None else str(rss), "fds": "16", "in_flight": "0",
             "records_per_s": "100", "host_cpu_pct": "5", "load1": "1.00", "event": ""}
        r.update(cols)
        out.append(r)
    return out


class RssRule(unittest.TestCase):
    def test_the_warm_up_is_five_minutes_or_a_sixth_of_the_run(self):
        for minutes, warmup in ((30, 300), (60, 300), (12, 120), (2, 20)):
            samples = rows([(t, 1000) for t in range(10, minutes * 60 + 1, 10)])
            figures, _, ok = sd.rss_rule(samples, [], minutes, 10)
            self.assertEqual((figures["warmup_s"], ok), (warmup, True))

    def test_the_baseline_is_the_largest_sample_of_the_warm_up_s_last_minute(self):
        # 30 min: window (240, 300]; 240 itself is outside, 300 inside
        samples = rows([(230, 5000), (240, 4000), (250, 1000), (300, 1100), (310, 1200), (1800, 1000)])
        figures, _, _ = sd.rss_rule(samples, [], 30, 10)
        self.assertEqual((figures["baseline_rss_kib"], figures["baseline_avg_rss_kib"]), (1100, 1050))
        self.assertEqual(figures["limit_rss_kib"], 1210)

    def test_a_later_sample_above_the_limit_fails_one_at_it_passes(self):
        samples = rows([(250, 1000), (300, 1000), (600, 1100), (900, 1050)])
        figures, lines, ok = sd.rss_rule(samples, [], 30, 10)
        self.assertTrue(ok)
        self.assertEqual((figures["max_rss_after_warmup_kib"], figures["growth_max_pct"]), (1100, 10.0))
        samples = rows([(250, 1000), (300, 1000), (600, 1101), (900, 1050)])
        figures, lines, ok = sd.rss_rule(samples, [], 30, 10)
        self.assertFalse(ok)
        self.assertIn("EXCEEDED", lines[0])
        self.assertEqual(lines[-1], "rss: grew +10.1 % over the warm-up baseline (limit 10 %)")
        self.assertEqual((figures["max_rss_after_warmup_t_s"], figures["end_rss_kib"], figures["growth_end_pct"]),
                         (600, 1050, 5.0))

    def test_the_growth_allowed_is_the_setting(self):
        samples = rows([(300, 1000), (600, 1150)])
        self.assertFalse(sd.rss_rule(samples, [], 30, 10)[2])
        self.assertTrue(sd.rss_rule(samples, [], 30, 20)[2])

    def test_samples_without_an_rss_are_left_out(self):
        samples = rows([(300, 1000), (310, None), (600, 1050)])
        figures, _, ok = sd.rss_rule(samples, [], 30, 10)
        self.assertEqual((ok, figures["samples"], figures["end_rss_kib"]), (True, 3, 1050))

    def test_nothing_to_judge_is_an_error_naming_what_is_missing(self):
        with self.assertRaisesRegex(sd.Die, "^rss: no samples$"):
            sd.rss_rule(rows([(10, None)]), [], 30, 10)
        with self.assertRaisesRegex(sd.Die, r"baseline window \(240, 300\] s or after it"):
            sd.rss_rule(rows([(100, 1000), (600, 1000)]), [], 30, 10)
        with self.assertRaisesRegex(sd.Die, "or after it"):
            sd.rss_rule(rows([(300, 1000)]), [], 30, 10)

    def test_its_lines(self):
        samples = rows([(250, 20480), (300, 24576), (600, 25600), (900, 25088)])
        _, lines, ok = sd.rss_rule(samples, [(600.5, "swap 1 to B (abc): 200 in 12 ms")], 30, 10)
        self.assertEqual(lines, [
            "rss: baseline 24.0 MiB (max of (240, 300] s; avg 22.0), largest after it 25.0 MiB at 10.0 min (+4.2 %), "
            "end 24.5 MiB (+2.1 %), limit +10 %: ok",
            "samples 4: fds 16-16, records/s mean 100 (min 100.0, max 100.0), host CPU mean 5.0 %, 1-min load mean 1.0",
            "rss steps at events: swap 1 to B at 10.0 min -0.50 MiB",
        ])


class RssSteps(unittest.TestCase):
    def test_each_swap_and_the_restart_until_the_next_one(self):
        rss = [(60, 100), (120, 110), (180, 150), (240, 151), (300, 151)]
        events = [(0.0, "producer started"), (61.0, "swap 1 to B (aaa): 200 in 5 ms"),
                  (181.0, "broker: stop-broker (SIGTERM, data kept)"), (185.0, "broker: up again 4000 ms")]
        self.assertEqual(sd.rss_steps(events, rss), [
            {"t_s": 61.0, "event": "swap 1 to B", "rss_step_kib": 50},
            {"t_s": 181.0, "event": "broker restart", "rss_step_kib": 1},
        ])

    def test_events_less_than_5_s_apart_count_as_one(self):
        rss = [(60, 100), (120, 110)]
        events = [(61.0, "swap 1 to A (x): 200 in 5 ms"), (63.0, "broker: stop-broker (SIGTERM, data kept)")]
        self.assertEqual(sd.rss_steps(events, rss), [{"t_s": 61.0, "event": "swap 1 to A + broker restart",
                                                      "rss_step_kib": 10}])

    def test_an_event_with_no_sample_before_or_after_has_no_step(self):
        self.assertEqual(sd.rss_steps([(5.0, "swap 1 to B (x)")], [(10, 100)]), [])
        self.assertEqual(sd.rss_steps([(50.0, "swap 1 to B (x)")], [(10, 100)]), [])


class RealRun(unittest.TestCase):
    """The samples and events of a real small soak read back, judged and summed up."""

    def test_the_fixture_run(self):
        samples = sd.read_samples(FIXTURES / "samples.csv")
        events = sd.read_events(FIXTURES / "events.csv")
        figures, lines, ok = sd.rss_rule(samples, events, 2, 10)
        self.assertEqual((figures["warmup_s"], figures["samples"]), (20, 12))
        self.assertEqual([s["event"] for s in figures["rss_steps"]], ["swap 1 to B + broker restart"])
        # a 20-s warm-up is too short for the rule to hold: the run failed it, as it printed
        self.assertEqual((figures["baseline_rss_kib"], figures["max_rss_after_warmup_kib"], ok), (26200, 30800, False))
        self.assertEqual(lines[-1], "rss: grew +17.6 % over the warm-up baseline (limit 10 %)")
        self.assertEqual(lines[2], "rss steps at events: swap 1 to B + broker restart at 1.0 min +3.99 MiB")
        self.assertEqual(sd.fds_line(samples), "fds: min 19, max 20; mean 1-min load 4.96 over 12 samples")
        self.assertIn("swap 1 B", [r["event"] for r in samples][6])

    def test_bad_csv_is_an_error_naming_the_file_and_line(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv") as f:
            f.write("t_s,rss_kib\n10,100\nten,100\n")
            f.flush()
            with self.assertRaisesRegex(sd.Die, f"{f.name}: line 3"):
                sd.read_samples(f.name)
        with tempfile.NamedTemporaryFile("w", suffix=".csv") as f:
            f.write("t_s,what\n10,x\n")
            f.flush()
            with self.assertRaisesRegex(sd.Die, f"{f.name}: line 2"):
                sd.read_events(f.name)


class Summary(unittest.TestCase):
    def test_fds_line_over_the_samples_with_an_rss(self):
        samples = rows([(10, 1000), (20, None), (30, 1000)])
        samples[0]["fds"], samples[1]["fds"], samples[2]["fds"] = "15", "99", "16"
        samples[0]["load1"], samples[2]["load1"] = "1.00", "2.00"
        self.assertEqual(sd.fds_line(samples), "fds: min 15, max 16; mean 1-min load 1.50 over 2 samples")
        self.assertIsNone(sd.fds_line(rows([(10, None)])))


class Entry(unittest.TestCase):
    def test_help_and_a_bad_argument(self):
        run = subprocess.run([str(DEV / "soak"), "help"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0)
        self.assertIn("SOAK_MINUTES (30)", run.stdout)
        run = subprocess.run([str(DEV / "soak"), "--bogus"], capture_output=True, text=True)
        self.assertEqual((run.returncode, run.stderr),
                         (1, "dev/soak: error: unknown argument: --bogus (dev/soak help)\n"))

    def test_a_bad_setting_is_refused_before_anything_starts(self):
        env = dict(os.environ, SOAK_SWAP_EVERY="x")
        run = subprocess.run([str(DEV / "soak")], capture_output=True, text=True, env=env)
        self.assertEqual((run.returncode, run.stderr),
                         (1, "dev/soak: error: SOAK_SWAP_EVERY must be a positive whole number (got 'x')\n"))


if __name__ == "__main__":
    unittest.main()
