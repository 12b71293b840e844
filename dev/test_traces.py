#!/usr/bin/env python3
"""Tests of dev/traces.py: standard library only, no receiver, no go.

Fixtures in dev/testdata/traces/: what a real Jaeger 1.75.0 (dev/jaeger) answered on
/api/v3/traces/{id}?raw_traces=true, and the lines a real collector 0.161.0 (dev/otelcol) wrote, for the same kind of
trace: a "process batch" span continuing the W3C traceparent
00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 (a remote parent, not in the trace) and its child "plugin
handle", sent with the Python SDK over OTLP.
"""

import http.server
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

DEV = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import traces  # noqa: E402

FIXTURES = DEV / "testdata" / "traces"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
REMOTE_PARENT = "00f067aa0ba902b7"


class Parsing(unittest.TestCase):
    def test_jaeger_v3_answer(self):
        body = json.loads((FIXTURES / "jaeger-v3-trace.json").read_text())
        spans = traces.dedup_sorted(traces.spans_of(body["result"]))
        self.assertEqual([s["name"] for s in spans], ["process batch", "plugin handle"])
        batch, record = spans
        self.assertEqual(batch["trace_id"], TRACE)
        self.assertEqual(batch["parent_span_id"], REMOTE_PARENT)
        self.assertEqual(record["parent_span_id"], batch["span_id"])
        self.assertEqual((batch["kind"], record["kind"]), ("CONSUMER", "INTERNAL"))
        self.assertEqual(batch["service"], "e2e-grpc")
        self.assertEqual(batch["scope"], "sharehost-e2e-check")
        self.assertEqual(batch["attributes"], {"messaging.batch.message_count": 1, "messaging.system": "kafka"})
        self.assertEqual(record["attributes"], {"messaging.kafka.offset": 42, "sharehost.plugin": "order-validator"})
        self.assertEqual(batch["status"], {"code": "UNSET", "message": ""})
        self.assertEqual(batch["links"], [])

    def test_collector_file_lines(self):
        spans = traces.FileSource(FIXTURES / "otelcol-file-exporter.jsonl").fetch(trace_id=TRACE)
        spans = traces.dedup_sorted(spans)
        self.assertEqual([s["name"] for s in spans], ["process batch", "plugin handle"])
        self.assertEqual(spans[0]["parent_span_id"], REMOTE_PARENT)
        self.assertEqual(spans[1]["parent_span_id"], spans[0]["span_id"])
        self.assertEqual(spans[1]["attributes"]["messaging.kafka.offset"], 42)

    def test_ids_in_hex_or_base64(self):
        self.assertEqual(traces.hex_id("00F067AA0BA902B7", 8), REMOTE_PARENT)
        self.assertEqual(traces.hex_id("APBnqgupArc=", 8), REMOTE_PARENT)
        self.assertIsNone(traces.hex_id("", 8))
        self.assertIsNone(traces.hex_id("0000000000000000", 8))
        with self.assertRaises(traces.Die):
            traces.hex_id("nothex!", 8)

    def test_values(self):
        kvs = [
            {"key": "s", "value": {"stringValue": "x"}},
            {"key": "i", "value": {"intValue": "9007199254740993"}},
            {"key": "d", "value": {"doubleValue": 0.5}},
            {"key": "b", "value": {"boolValue": True}},
            {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "two"}]}}},
            {"key": "m", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": False}}]}}},
            {"key": "e", "value": {}},
        ]
        self.assertEqual(traces.attributes(kvs), {
            "s": "x", "i": 9007199254740993, "d": 0.5, "b": True, "a": [1, "two"], "m": {"k": False}, "e": None,
        })

    def test_enums_as_numbers_or_names(self):
        self.assertEqual(traces.enum(4, traces.SPAN_KINDS, "SPAN_KIND_"), "PRODUCER")
        self.assertEqual(traces.enum("SPAN_KIND_CLIENT", traces.SPAN_KINDS, "SPAN_KIND_"), "CLIENT")
        self.assertEqual(traces.enum(None, traces.STATUS_CODES, "STATUS_CODE_"), "UNSET")
        self.assertEqual(traces.enum(2, traces.STATUS_CODES, "STATUS_CODE_"), "ERROR")

    def test_trace_id_argument(self):
        self.assertEqual(traces.normalise_trace_id("4BF92F3577B34DA6A3CE929D0E0E4736"), TRACE)
        self.assertEqual(traces.normalise_trace_id("abc"), "0" * 29 + "abc")
        for bad in ("", "0" * 32, "xyz", "1" * 33):
            with self.assertRaises(traces.Die):
                traces.normalise_trace_id(bad)

    def test_tree_shows_the_remote_parent(self):
        spans = traces.dedup_sorted(traces.FileSource(FIXTURES / "otelcol-file-exporter.jsonl").fetch(trace_id=TRACE))
        lines = traces.tree(spans).splitlines()
        self.assertTrue(lines[0].startswith("process batch [e2e-file] span "))
        self.assertTrue(lines[0].endswith(f"(parent {REMOTE_PARENT}, not here)"))
        self.assertTrue(lines[1].startswith("  plugin handle [e2e-file] span "))


class Source:
    """A receiver whose spans appear one fetch at a time."""

    def __init__(self, batches):
        self.batches = batches
        self.fetches = 0
        self.last_error = None

    def describe(self):
        return "stand-in"

    def fetch(self, trace_id=None, service=None):
        self.fetches += 1
        return [s for b in self.batches[: self.fetches] for s in b]


def span(span_id, parent=None, start=0):
    return {"trace_id": TRACE, "span_id": span_id, "parent_span_id": parent, "name": span_id,
            "start_unix_nano": start}


class Waiting(unittest.TestCase):
    def test_polls_until_enough_spans(self):
        source = Source([[], [span("b", "a", 2)], [span("b", "a", 2), span("a", None, 1)]])
        spans = traces.wait_for_spans(source, trace_id=TRACE, count=2, timeout_s=30, poll_s=0.01)
        self.assertEqual([s["span_id"] for s in spans], ["a", "b"])  # by start time, each once
        self.assertEqual(source.fetches, 3)

    def test_deadline_names_what_was_seen(self):
        source = Source([[span("a")]])
        with self.assertRaises(traces.Die) as cm:
            traces.wait_for_spans(source, trace_id=TRACE, count=3, timeout_s=0.05, poll_s=0.01)
        self.assertIn(f"trace {TRACE} has 1 span(s) of the 3 awaited after 0.05s (stand-in)", str(cm.exception))
        self.assertIn("a parent None a", str(cm.exception))


class Handler(http.server.BaseHTTPRequestHandler):
    """Jaeger's API v3 as far as dev/traces.py uses it: 404 for the first GETs of the trace, then the fixture."""

    misses = 2
    paths = []

    def do_GET(self):
        Handler.paths.append(self.path)
        if self.path == f"/api/v3/traces/{TRACE}?raw_traces=true" and Handler.misses <= 0:
            body, code = (FIXTURES / "jaeger-v3-trace.json").read_bytes(), 200
        else:
            Handler.misses -= 1
            body, code = b'{"error":{"httpCode":404,"message":"No traces found"}}', 404
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class AgainstAnHttpServer(unittest.TestCase):
    def setUp(self):
        Handler.misses, Handler.paths = 2, []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def tearDown(self):
        self.server.shutdown()
        self.server.server_close()

    def test_cli_waits_through_404s(self):
        out = subprocess.run(
            [sys.executable, str(DEV / "traces.py"), "wait", "--trace-id", TRACE.upper(), "--spans", "2",
             "--timeout", "60", "--query-url", self.url],
            capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        spans = json.loads(out.stdout)
        self.assertEqual([(s["name"], s["parent_span_id"]) for s in spans],
                         [("process batch", REMOTE_PARENT), ("plugin handle", spans[0]["span_id"])])

    def test_service_search_asks_for_a_window(self):
        source = traces.JaegerSource(self.url, since_s=600)
        self.assertEqual(source.fetch(service="orders svc"), [])
        path = Handler.paths[-1]
        self.assertTrue(path.startswith("/api/v3/traces?query.service_name=orders+svc&query.start_time_min="), path)
        self.assertIn("query.num_traces=1000", path)
        self.assertIn("query.raw_traces=true", path)
        self.assertIsNone(source.last_error)  # a 404 is "not yet", not an error

    def test_unreachable_is_remembered(self):
        source = traces.JaegerSource("http://127.0.0.1:1", since_s=600)
        self.assertEqual(source.fetch(trace_id=TRACE), [])
        self.assertIn("Connection refused", source.last_error)


class FileSource(unittest.TestCase):
    def test_skips_a_line_still_being_written_and_filters(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "spans.jsonl"
            self.assertEqual(traces.FileSource(path).fetch(trace_id=TRACE), [])  # not written yet
            lines = (FIXTURES / "otelcol-file-exporter.jsonl").read_text().splitlines()
            path.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])
            self.assertEqual(len(traces.FileSource(path).fetch(trace_id=TRACE)), 1)
            self.assertEqual(len(traces.FileSource(path).fetch(service="e2e-file")), 1)
            self.assertEqual(traces.FileSource(path).fetch(trace_id="1" * 32), [])


class DefaultSource(unittest.TestCase):
    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp())
        self.jaeger, self.otelcol = self.tmp / "jaeger", self.tmp / "otelcol"
        self.env = {"SHAREHOST_JAEGER_DIR": str(self.jaeger), "SHAREHOST_OTELCOL_DIR": str(self.otelcol),
                    "JAEGER_QUERY_URL": "", "OTELCOL_SPANS_FILE": ""}

    def tearDown(self):
        import shutil
        shutil.rmtree(self.tmp)

    def source(self, **extra):
        with mock.patch.dict(os.environ, {**self.env, **extra}):
            return traces.default_source(3600)

    def test_none_up(self):
        with self.assertRaises(traces.Die) as cm:
            self.source()
        self.assertIn("no trace receiver is up in this checkout (run dev/otelcol up or dev/jaeger up)", str(cm.exception))

    def test_the_one_up(self):
        self.jaeger.mkdir()
        (self.jaeger / "jaeger.env").write_text("JAEGER_QUERY_URL=http://127.0.0.1:26687\n")
        self.assertEqual(self.source().url, "http://127.0.0.1:26687")
        self.otelcol.mkdir()
        (self.otelcol / "otelcol.env").write_text(f"OTELCOL_SPANS_FILE={self.otelcol}/spans.jsonl\n")
        with self.assertRaises(traces.Die) as cm:
            self.source()
        self.assertIn("pass --query-url or --otlp-file", str(cm.exception))
        (self.jaeger / "jaeger.env").unlink()
        self.assertEqual(self.source().path, self.otelcol / "spans.jsonl")

    def test_environment_first(self):
        self.assertEqual(self.source(JAEGER_QUERY_URL="http://x:1").url, "http://x:1")
        self.assertEqual(str(self.source(OTELCOL_SPANS_FILE="/f").path), "/f")


if __name__ == "__main__":
    unittest.main()
