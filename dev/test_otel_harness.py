#!/usr/bin/env python3
"""Tests of dev/otel_harness.py (dev/jaeger's and dev/otelcol's program): standard library only, no go, no receiver.

The commands run as their callers run them (dev/jaeger, dev/otelcol, in a scratch cache and state dir, on free ports)
against a stand-in binary put where the build would put it: a Python script that reads the config it is given and
answers HTTP on every endpoint in it, which is all `up` waits for. What a real build and a real receiver do was checked
by hand (the numbers and the end-to-end run are in the change that added these files); CI does not build Go.
"""

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

DEV = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DEV))
import otel_harness as oh  # noqa: E402

STANDIN = """#!/usr/bin/env python3
import http.server, os, re, sys, threading
if os.environ.get("STANDIN_FAIL"):
    print("stand-in: refusing to start", flush=True)
    sys.exit(3)
config = sys.argv[sys.argv.index("--config") + 1].removeprefix("file:")
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    do_GET = do_POST = answer
    def log_message(self, *a): pass
servers = [http.server.ThreadingHTTPServer(("127.0.0.1", int(p)), H)
           for p in re.findall(r"endpoint: 127\\.0\\.0\\.1:([0-9]+)", open(config).read())]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
"""


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Scratch(unittest.TestCase):
    """A scratch cache with a stand-in binary for both receivers, scratch state dirs, free ports."""

    def setUp(self):
        self.tmp = pathlib.Path(tempfile.mkdtemp())
        self.cache = self.tmp / "cache"
        for name, version in (("jaeger", oh.Jaeger.default_version), ("otelcol", oh.Otelcol.default_version)):
            binary = self.cache / f"{name}-{version}" / "bin" / name
            binary.parent.mkdir(parents=True)
            binary.write_text(STANDIN)
            binary.chmod(0o755)
        g, h, q, qg = free_ports(4)
        self.env = {
            **os.environ,
            "SHAREHOST_CACHE": str(self.cache),
            "SHAREHOST_JAEGER_DIR": str(self.tmp / "jaeger"),
            "SHAREHOST_OTELCOL_DIR": str(self.tmp / "otelcol"),
            "JAEGER_OTLP_GRPC_PORT": str(g), "JAEGER_OTLP_HTTP_PORT": str(h),
            "JAEGER_QUERY_PORT": str(q), "JAEGER_QUERY_GRPC_PORT": str(qg),
            "OTELCOL_OTLP_GRPC_PORT": str(g), "OTELCOL_OTLP_HTTP_PORT": str(h),
            "JAEGER_START_TIMEOUT": "60", "OTELCOL_START_TIMEOUT": "60",
        }
        self.ports = (g, h, q, qg)

    def tearDown(self):
        for name in ("jaeger", "otelcol"):
            self.run_cmd(name, "down")
        shutil.rmtree(self.tmp)

    def run_cmd(self, name, *args, extra=None):
        return subprocess.run([str(DEV / name), *args], env={**self.env, **(extra or {})}, capture_output=True,
                              text=True, timeout=120)


class Commands(Scratch):
    def test_jaeger_up_status_down(self):
        g, h, q, qg = self.ports
        out = self.run_cmd("jaeger", "up")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout, r"dev/jaeger: up in [0-9.]+s: Jaeger 1\.75\.0 \(pid [0-9]+\)")
        self.assertIn(f"query:     http://127.0.0.1:{q}  (/api/v3/traces/TRACE_ID, /api/traces?service=NAME)", out.stdout)
        state = self.tmp / "jaeger"
        env_file = oh.parse_env_file((state / "jaeger.env").read_text())
        self.assertEqual(env_file["JAEGER_QUERY_URL"], f"http://127.0.0.1:{q}")
        self.assertEqual(env_file["OTLP_HTTP_ENDPOINT"], f"http://127.0.0.1:{h}")
        self.assertEqual(env_file["OTLP_GRPC_ENDPOINT"], f"http://127.0.0.1:{g}")

        again = self.run_cmd("jaeger", "up")
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("dev/jaeger: already running (pid", again.stdout)

        status = self.run_cmd("jaeger", "status", extra={"JAEGER_QUERY_PORT": "1"})  # the pinned ports win
        self.assertEqual(status.returncode, 0)
        self.assertIn(f"http://127.0.0.1:{q}", status.stdout)

        down = self.run_cmd("jaeger", "down")
        self.assertEqual(down.returncode, 0, down.stderr)
        self.assertIn("dev/jaeger: stopped Jaeger (pid", down.stdout)
        self.assertFalse(state.exists())
        self.assertFalse(oh.port_in_use(q))
        status = self.run_cmd("jaeger", "status")
        self.assertEqual((status.returncode, status.stdout), (3, "not running\n"))

    def test_otelcol_up_writes_where_the_spans_go(self):
        out = self.run_cmd("otelcol", "up")
        self.assertEqual(out.returncode, 0, out.stderr)
        state = self.tmp / "otelcol"
        self.assertEqual(oh.parse_env_file((state / "otelcol.env").read_text())["OTELCOL_SPANS_FILE"],
                         str(state / "spans.jsonl"))
        self.assertIn(f"path: {state / 'spans.jsonl'}", (state / "config.yaml").read_text())

    def test_the_receivers_share_the_otlp_ports(self):
        self.assertEqual(self.run_cmd("otelcol", "up").returncode, 0)
        out = self.run_cmd("jaeger", "up")
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"port 127.0.0.1:{self.ports[0]} is already in use (set JAEGER_OTLP_GRPC_PORT or free it; "
                      "dev/jaeger and dev/otelcol share their OTLP ports by default)", out.stderr)

    def test_a_receiver_that_dies_at_start(self):
        out = self.run_cmd("jaeger", "up", extra={"STANDIN_FAIL": "1"})
        self.assertEqual(out.returncode, 1)
        self.assertIn("stand-in: refusing to start", out.stderr)  # the log's tail
        self.assertIn("dev/jaeger: error: Jaeger exited during startup with status 3 (log: ", out.stderr)
        self.assertFalse((self.tmp / "jaeger" / "jaeger.env").exists())  # dev/traces.py must not take it for up

    def test_down_refuses_a_directory_it_did_not_make(self):
        state = self.tmp / "jaeger"
        state.mkdir()
        (state / "notes.txt").write_text("keep me")
        out = self.run_cmd("jaeger", "down")
        self.assertEqual(out.returncode, 1)
        self.assertIn(f"refusing to delete {state}: it was not created by dev/jaeger", out.stderr)
        self.assertTrue((state / "notes.txt").is_file())

    def test_build_without_go_says_so(self):
        shutil.rmtree(self.cache)
        out = subprocess.run([sys.executable, str(DEV / "otel_harness.py"), "otelcol", "build"],
                             env={**self.env, "PATH": "/nonexistent"}, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1)
        self.assertEqual(out.stderr, "dev/otelcol: error: go not found on PATH: building the OpenTelemetry Collector "
                                     "0.161.0 needs Go (1.26 or newer)\n")

    def test_bad_port_and_unknown_command(self):
        out = self.run_cmd("jaeger", "up", extra={"JAEGER_QUERY_PORT": "x"})
        self.assertEqual((out.returncode, out.stderr), (1, "dev/jaeger: error: JAEGER_QUERY_PORT must be a whole number "
                                                           "(got 'x')\n"))
        out = self.run_cmd("otelcol", "frobnicate")
        self.assertEqual(out.returncode, 1)
        self.assertIn("dev/otelcol: error: unknown command: frobnicate", out.stderr)
        self.assertEqual(self.run_cmd("jaeger", "help").returncode, 0)


class Rendering(unittest.TestCase):
    def test_each_config_opens_only_its_ports_on_loopback(self):
        for cls, ports in ((oh.Jaeger, {"otlp_grpc": 1, "otlp_http": 2, "query_http": 3, "query_grpc": 4}),
                           (oh.Otelcol, {"otlp_grpc": 1, "otlp_http": 2})):
            text = cls().config_yaml(ports)
            endpoints = [line.split()[-1] for line in text.splitlines() if "endpoint:" in line]
            self.assertEqual(sorted(endpoints), [f"127.0.0.1:{p}" for p in sorted(ports.values())], cls.name)
            self.assertIn("level: none", text)  # no internal metrics port
            self.assertNotIn("batch", text)  # spans stored as received

    def test_collector_modules_at_one_release(self):
        r = oh.Otelcol()
        self.assertEqual(r.core_stable, "1.67.0")
        r.version = "0.165.0"
        self.assertEqual(r.core_stable, "1.71.0")
        r.version = "0.139.0"  # what Jaeger 1.75.0 builds with: v0.139.0 beside v1.45.0
        self.assertEqual(r.core_stable, "1.45.0")
        r.version = "0.161.0"
        mod = r.go_mod()
        self.assertIn("\tgithub.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter v0.161.0\n", mod)
        self.assertIn("\tgo.opentelemetry.io/collector/receiver/otlpreceiver v0.161.0\n", mod)
        self.assertIn("\tgo.opentelemetry.io/collector/confmap/provider/envprovider v1.67.0\n", mod)

    def test_jaeger_is_built_as_a_tool_of_a_scratch_module(self):
        steps = oh.Jaeger().build_steps(pathlib.Path("/src"), pathlib.Path("/out"))
        self.assertEqual(steps[1], ["go", "get", "-tool", "github.com/jaegertracing/jaeger/cmd/jaeger@v1.75.0"])
        self.assertEqual(steps[2][-3:], ["-o", "/out", "github.com/jaegertracing/jaeger/cmd/jaeger"])


if __name__ == "__main__":
    unittest.main()
