#!/usr/bin/env python3
"""dev/jaeger's and dev/otelcol's program: a local trace receiver for the tests that assert the spans sharehost
exports over OTLP and their parent links. Two receivers, one way to run them (`up`, `down`, `status`, `build`):

  jaeger   Jaeger v2 all-in-one (`cmd/jaeger` of the Go module github.com/jaegertracing/jaeger) with in-memory storage:
           OTLP gRPC and HTTP in, the query API out (/api/v3/traces answers in OTLP JSON, /api/traces in Jaeger's).
  otelcol  A minimal OpenTelemetry Collector: the core OTLP receiver and the contrib file exporter, nothing else, so
           every span received lands as OTLP JSON lines in target/otelcol/spans.jsonl. About a third of Jaeger's cold
           build (no storage backends, no cloud SDKs, no UI server), with no query API: the file is what a test reads.

Both listen on 127.0.0.1 only, on the same OTLP ports by default (14317 gRPC, 14318 HTTP: away from the usual 4317/4318,
so a developer's own collector or Jaeger keeps running), so a test sends to one endpoint whichever receiver runs; the
two cannot run at once on the defaults. dev/traces.py waits for spans in either.

  * Each binary is built once with the local `go` (from the Go module proxy, every download checked against the Go
    checksum database) and kept OUTSIDE the repo, in $SHAREHOST_CACHE/<receiver>-<version>/bin, shared by all
    checkouts. Go's module and build caches are Go's own (GOMODCACHE, GOCACHE), so a CI cache of them works as it does
    for any Go build, and `go clean` clears them as usual.
  * The state (config, pid, log, the collector's spans file) lives INSIDE the checkout, in target/<receiver>. Nothing
    is kept across `down`: a test tells its spans apart by trace id or by a service name of its own.

Why Jaeger's `cmd/jaeger` (v2) and not `cmd/all-in-one` (v1), both in module v1.75.0: v1 prints its end-of-life notice
on every start and gets no more releases; v2 is the maintained Jaeger, and its one YAML config lists exactly the
listeners to open (OTLP in, the query API out) and no other, where v1 opens a dozen fixed ports (agent, collector,
admin, zipkin...) that each need a flag to move away from a developer's own Jaeger.

Standard library only: CI runs it on a fresh machine. Every wait waits for an event (a listener answering, a pid gone),
polled and bounded by a generous deadline, so a busy machine only makes a wait longer, never a failure.
"""

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REPO = DEV.parent
POLL_S = 0.2


class Die(Exception):
    """A failure that ends the command: printed as "dev/NAME: error: MSG" on stderr, exit status 1."""


def env(name, default):
    """A variable as bash's ${NAME:-default} reads it: unset and empty both mean the default."""
    return os.environ.get(name) or default


def env_int(name, default):
    value = env(name, str(default))
    if not re.fullmatch(r"[0-9]+", value):
        raise Die(f"{name} must be a whole number (got '{value}')")
    return int(value)


def parse_env_file(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def port_in_use(port, timeout=10):
    """Whether something accepts connections on 127.0.0.1:PORT (a connect that hangs counts: something listens)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except socket.timeout:
        return True
    except OSError:
        return False


def http_ok(method, url, body=None, headers=None, timeout=5):
    """Whether URL answers METHOD with a 2xx."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def otlp_http_ready(port):
    """The OTLP/HTTP receiver accepts an export (an empty one: it stores nothing)."""
    return http_ok("POST", f"http://127.0.0.1:{port}/v1/traces", body=b"{}",
                   headers={"Content-Type": "application/json"})


def wait_until(limit_s, check, poll_s=POLL_S):
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 >= limit_s:
            return False
        time.sleep(poll_s)
    return True


def pid_running_with(pid_file, needle):
    """The pid in PID_FILE if that process runs and its command line contains NEEDLE (guards against pid reuse and
    zombies, whose cmdline is empty, so nothing unrelated is ever signalled)."""
    try:
        text = Path(pid_file).read_text().strip()
    except OSError:
        return None
    if not re.fullmatch(r"[0-9]+", text):
        return None
    try:
        cmdline = Path(f"/proc/{text}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return int(text) if needle in cmdline else None


def tail(path, n=30):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return
    sys.stderr.write("".join(line + "\n" for line in lines))
    sys.stderr.flush()


# --- the receivers -------------------------------------------------------------------------------------------------


class Receiver:
    """What both receivers share: the cached build, the state dir, the process, the commands. A subclass says what to
    build, which ports it opens, its config and when it is ready."""

    name = ""           # the script (dev/NAME) and the state dir (target/NAME)
    title = ""          # for messages
    env_prefix = ""     # JAEGER / OTELCOL: the variables' prefix
    default_version = ""
    ports_spec = {}     # key -> (suffix of the variable after the prefix, default port)
    build_note = ""     # what a cold build costs, said before it starts

    def __init__(self):
        p = self.env_prefix
        self.version = env(f"{p}_VERSION", self.default_version).lstrip("v")
        cache_root = Path(env("SHAREHOST_CACHE", str(Path.home() / ".cache" / "sharehost")))
        self.cache = cache_root / f"{self.name}-{self.version}"
        self.binary = self.cache / "bin" / self.name
        self.state = Path(os.path.abspath(env(f"SHAREHOST_{p}_DIR", str(REPO / "target" / self.name))))
        self.marker = self.state / f".sharehost-{self.name}"  # only a directory that carries it is ever deleted
        self.config = self.state / "config.yaml"
        self.pid_file = self.state / f"{self.name}.pid"
        self.log = self.state / f"{self.name}.log"
        self.env_file = self.state / f"{self.name}.env"
        self.ports = {key: env_int(f"{p}_{suffix}", default) for key, (suffix, default) in self.ports_spec.items()}
        self.start_timeout = env_int(f"{p}_START_TIMEOUT", 90)
        self.stop_timeout = env_int(f"{p}_STOP_TIMEOUT", 20)

    def note(self, msg):
        print(f"dev/{self.name}: {msg}", flush=True)

    # --- to be said by each receiver ---

    def build_steps(self, src, out):
        """The commands that build the binary at OUT, run in the empty directory SRC."""
        raise NotImplementedError

    def config_yaml(self, ports):
        raise NotImplementedError

    def env_text(self, ports):
        raise NotImplementedError

    def ready(self, ports):
        raise NotImplementedError

    def where(self, ports):
        raise NotImplementedError

    def usage_lines(self):
        raise NotImplementedError

    # --- the binary ---

    def build(self):
        """The binary in the cache, built once per version; concurrent first builds wait for one another."""
        if self.binary.is_file() and os.access(self.binary, os.X_OK):
            return
        if shutil.which("go") is None:
            raise Die(f"go not found on PATH: building {self.title} {self.version} needs Go ({self.go_needed})")
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.binary.is_file():
                return
            src = self.cache / "src"
            build_log = self.cache / "build.log"
            self.note(f"building {self.title} {self.version} into {self.binary} (one time; {self.build_note}; "
                      f"log: {build_log}) ...")
            t0 = time.monotonic()
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir(parents=True)
            tmp = self.binary.with_name(f"{self.name}.{os.getpid()}")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            with open(build_log, "w") as out:
                for cmd in self.build_steps(src, tmp):
                    out.write(f"$ {' '.join(cmd)}\n")
                    out.flush()
                    rc = subprocess.call(cmd, cwd=src, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
                    if rc != 0:
                        tail(build_log)
                        tmp.unlink(missing_ok=True)
                        raise Die(f"'{' '.join(cmd)}' failed with status {rc} (log: {build_log})")
            os.replace(tmp, self.binary)
            size = self.binary.stat().st_size / 1e6
            self.note(f"built {self.title} {self.version} in {int(time.monotonic() - t0)}s ({size:.0f} MB)")

    # --- state ---

    def pid(self):
        return pid_running_with(self.pid_file, str(self.config))

    def pinned_ports(self):
        """The ports `up` used (the env file), else the environment's."""
        if not self.env_file.is_file():
            return self.ports
        values = parse_env_file(self.env_file.read_text(errors="replace"))
        ports = dict(self.ports)
        for key, (suffix, _) in self.ports_spec.items():
            value = values.get(f"{self.env_prefix}_{suffix}", "")
            if re.fullmatch(r"[0-9]+", value):
                ports[key] = int(value)
        return ports

    def wipe_state(self):
        if not os.path.lexists(self.state):
            return
        if not self.marker.is_file() and self.state.is_dir() and any(self.state.iterdir()):
            raise Die(f"refusing to delete {self.state}: it was not created by dev/{self.name} (no {self.marker})")
        if self.state.is_dir() and not self.state.is_symlink():
            shutil.rmtree(self.state, ignore_errors=True)
        else:
            self.state.unlink()

    def print_where(self, ports):
        for line in self.where(ports):
            print(line)
        print(f"env:       {self.env_file}")
        sys.stdout.flush()

    def stop(self, pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            return
        gone = lambda: self.pid() is None  # noqa: E731
        if not wait_until(self.stop_timeout, gone):
            self.note(f"{self.title} (pid {pid}) did not stop within {self.stop_timeout}s, sending SIGKILL")
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            if not wait_until(self.stop_timeout, gone):
                raise Die(f"{self.title} (pid {pid}) survived SIGKILL for {self.stop_timeout}s")

    # --- commands ---

    def usage(self):
        p = self.env_prefix
        variables = [f"{p}_{suffix} ({self.ports[key]})" for key, (suffix, _) in self.ports_spec.items()] + [
            f"{p}_START_TIMEOUT ({self.start_timeout} s to answer)",
            f"{p}_STOP_TIMEOUT ({self.stop_timeout} s from SIGTERM to SIGKILL)",
            f"{p}_VERSION ({self.version})",
            "SHAREHOST_CACHE (binary cache, default ~/.cache/sharehost)",
            f"SHAREHOST_{p}_DIR (state, default <repo>/target/{self.name});",
            "Go's own GOMODCACHE, GOCACHE, GOPROXY apply to the build.",
        ]
        env_text = textwrap.fill(", ".join(variables).replace(";,", ";"), width=116, initial_indent="env: ",
                                 subsequent_indent="     ", break_on_hyphens=False)
        return f"""usage: dev/{self.name} COMMAND

{self.usage_lines()}
  build    only build the binary into the cache (what `up` does first), e.g. while something else builds
  down     stop it and delete its state dir (every span it holds)
  status   print whether it runs; exit 0 if it does, 3 if not
  help     this text

{env_text}
"""

    def cmd_build(self, args):
        if args:
            raise Die(f"build takes no arguments (got {' '.join(args)})")
        self.build()
        print(self.binary)
        return 0

    def cmd_up(self, args):
        if args:
            raise Die(f"up takes no arguments (got {' '.join(args)})")
        pid = self.pid()
        if pid is not None:
            self.note(f"already running (pid {pid})")
            self.print_where(self.pinned_ports())
            return 0
        self.build()
        ports = self.ports
        if len(set(ports.values())) != len(ports):
            raise Die(f"the ports must differ (got {ports})")
        for key, (suffix, _) in self.ports_spec.items():
            if port_in_use(ports[key]):
                raise Die(
                    f"port 127.0.0.1:{ports[key]} is already in use (set {self.env_prefix}_{suffix} or free it; "
                    "dev/jaeger and dev/otelcol share their OTLP ports by default)"
                )
        t0 = time.monotonic()
        self.wipe_state()
        self.state.mkdir(parents=True, exist_ok=True)
        self.marker.touch()
        self.config.write_text(self.config_yaml(ports))
        # Its own session and SIGHUP ignored: the receiver outlives this call and its terminal.
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            with open(self.log, "ab") as out:
                proc = subprocess.Popen(
                    [str(self.binary), "--config", f"file:{self.config}"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )
        finally:
            signal.signal(signal.SIGHUP, previous)
        tmp = self.state / f"{self.name}.pid.{os.getpid()}"
        tmp.write_text(f"{proc.pid}\n")
        os.replace(tmp, self.pid_file)

        while not self.ready(ports):
            if proc.poll() is not None:
                tail(self.log)
                raise Die(f"{self.title} exited during startup with status {proc.returncode} (log: {self.log})")
            if time.monotonic() - t0 >= self.start_timeout:
                tail(self.log)
                self.stop(proc.pid)
                raise Die(f"{self.title} did not answer within {self.start_timeout}s (log: {self.log})")
            time.sleep(POLL_S)
        # Written once it answers: dev/traces.py takes a receiver whose env file exists for one that is up.
        self.env_file.write_text(self.env_text(ports))
        took = time.monotonic() - t0
        self.note(f"up in {took:.1f}s: {self.title} {self.version} (pid {proc.pid}), state {self.state}")
        self.print_where(ports)
        return 0

    def cmd_down(self, args):
        pid = self.pid()
        if pid is None:
            self.note("not running")
        else:
            ports = self.pinned_ports()
            self.stop(pid)
            # The next `up` checks these ports: wait until the dying process has closed them.
            wait_until(self.stop_timeout, lambda: not any(port_in_use(p, timeout=1) for p in ports.values()))
            self.note(f"stopped {self.title} (pid {pid})")
        self.wipe_state()
        return 0

    def cmd_status(self, args):
        pid = self.pid()
        if pid is None:
            print("not running")
            return 3
        print(f"running: pid {pid}, {self.title} {self.version}, state {self.state}")
        self.print_where(self.pinned_ports())
        return 0


class Jaeger(Receiver):
    name = "jaeger"
    title = "Jaeger"
    env_prefix = "JAEGER"
    # The one release the Go module proxy serves here as approved. The module's v1.x tags carry the v2 binary too.
    default_version = "1.75.0"
    module = "github.com/jaegertracing/jaeger"
    package = f"{module}/cmd/jaeger"
    go_needed = "1.24.6 or newer"
    ports_spec = {
        "otlp_grpc": ("OTLP_GRPC_PORT", 14317),
        "otlp_http": ("OTLP_HTTP_PORT", 14318),
        "query_http": ("QUERY_PORT", 16687),
        "query_grpc": ("QUERY_GRPC_PORT", 16688),
    }
    build_note = "from nothing cached: ~1.3 GB of modules and ~5 CPU-minutes of compiling"

    def build_steps(self, src, out):
        ldflags = f"-s -w -X {self.module}/internal/version.latestVersion=v{self.version}"
        return [
            ["go", "mod", "init", "sharehost-jaeger-build"],
            # A tool requirement, not `go install pkg@version`: Jaeger's go.mod has a replace directive, which
            # `go install` refuses. The dependencies are the ones Jaeger's go.mod selects (minimal version selection).
            ["go", "get", "-tool", f"{self.package}@v{self.version}"],
            ["go", "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(out), self.package],
        ]

    def config_yaml(self, ports, max_traces=100000):
        """OTLP in, memory storage, the query API out, and no other listener.

        No batch processor: a span is stored as soon as it is received, so a test waits only for its own exporter.
        The query service's own tracing is off, so the store holds only what was sent to it; the internal metrics are
        off too, as they would open a Prometheus port (8888) that a developer may be using."""
        return f"""# Written by dev/jaeger up.
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info

extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: {max_traces}
  jaeger_query:
    storage:
      traces: memstore
    enable_tracing: false
    http:
      endpoint: 127.0.0.1:{ports['query_http']}
    grpc:
      endpoint: 127.0.0.1:{ports['query_grpc']}

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{ports['otlp_grpc']}
      http:
        endpoint: 127.0.0.1:{ports['otlp_http']}

exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""

    def env_text(self, ports):
        return (
            f"JAEGER_VERSION={self.version}\n"
            f"JAEGER_OTLP_GRPC_PORT={ports['otlp_grpc']}\n"
            f"JAEGER_OTLP_HTTP_PORT={ports['otlp_http']}\n"
            f"JAEGER_QUERY_PORT={ports['query_http']}\n"
            f"JAEGER_QUERY_GRPC_PORT={ports['query_grpc']}\n"
            f"OTLP_GRPC_ENDPOINT=http://127.0.0.1:{ports['otlp_grpc']}\n"
            f"OTLP_HTTP_ENDPOINT=http://127.0.0.1:{ports['otlp_http']}\n"
            f"JAEGER_QUERY_URL=http://127.0.0.1:{ports['query_http']}\n"
        )

    def ready(self, ports):
        """The query API lists services, the OTLP/HTTP receiver accepts an export, the OTLP/gRPC port accepts
        connections (its server starts with the HTTP one; a gRPC call would need a client this script does not
        have)."""
        return (
            http_ok("GET", f"http://127.0.0.1:{ports['query_http']}/api/services")
            and otlp_http_ready(ports["otlp_http"])
            and port_in_use(ports["otlp_grpc"])
        )

    def where(self, ports):
        return [
            f"otlp grpc: http://127.0.0.1:{ports['otlp_grpc']}",
            f"otlp http: http://127.0.0.1:{ports['otlp_http']}  (POST /v1/traces)",
            f"query:     http://127.0.0.1:{ports['query_http']}  (/api/v3/traces/TRACE_ID, /api/traces?service=NAME)",
        ]

    def usage_lines(self):
        p = self.ports
        return f"""  up       start Jaeger {self.version} (v2 all-in-one, in-memory storage) on 127.0.0.1:
           OTLP gRPC :{p['otlp_grpc']}, OTLP HTTP :{p['otlp_http']}, the query API on http://127.0.0.1:{p['query_http']}
           (/api/v3/traces, /api/traces) and its gRPC on :{p['query_grpc']}; builds the binary first if it is not in
           the cache, and waits until each listener answers. Writes {self.env_file}
           (the endpoints) for tests to read. No-op if already running."""


# The collector's main: the core OTLP receiver and the contrib file exporter. Kept here rather than as a Go module in
# the repo, so that no go.mod sits in a Rust workspace for tools to find.
OTELCOL_MAIN_GO = """// Written by dev/otelcol: a minimal OpenTelemetry Collector, OTLP in, OTLP JSON lines out.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory()); err != nil {
		return f, err
	}
	return f, nil
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol", Description: "sharehost's test collector", Version: "VERSION"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// env: the collector's default scheme, which it requires among the providers.
				ProviderFactories: []confmap.ProviderFactory{envprovider.NewFactory(), fileprovider.NewFactory()},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
"""


class Otelcol(Receiver):
    name = "otelcol"
    title = "the OpenTelemetry Collector"
    env_prefix = "OTELCOL"
    # All collector modules at one release (core v0.161.0 goes with the core's v1.67.0 modules): v0.161.0 is the newest
    # release of the contrib file exporter that the Go module proxy serves here as approved.
    default_version = "0.161.0"
    go_needed = "1.26 or newer"
    ports_spec = {
        "otlp_grpc": ("OTLP_GRPC_PORT", 14317),
        "otlp_http": ("OTLP_HTTP_PORT", 14318),
    }
    build_note = "from nothing cached: ~0.45 GB of modules and ~1.5 CPU-minutes of compiling"

    @property
    def core_stable(self):
        """The core's v1.x version that goes with the v0.x release: they are released together, 94 minors apart."""
        major, minor, patch = (int(x) for x in self.version.split("."))
        return f"1.{minor - 94}.{patch}" if major == 0 and minor >= 94 else None

    def go_mod(self):
        stable = self.core_stable
        if stable is None:
            raise Die(f"OTELCOL_VERSION {self.version} is not a collector release this script can pair "
                      "(0.94.0 or newer)")
        v, s = f"v{self.version}", f"v{stable}"
        return f"""module sharehost-otelcol-build

go 1.26.0

require (
\tgithub.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter {v}
\tgo.opentelemetry.io/collector/component {s}
\tgo.opentelemetry.io/collector/confmap {s}
\tgo.opentelemetry.io/collector/confmap/provider/envprovider {s}
\tgo.opentelemetry.io/collector/confmap/provider/fileprovider {s}
\tgo.opentelemetry.io/collector/exporter {s}
\tgo.opentelemetry.io/collector/otelcol {v}
\tgo.opentelemetry.io/collector/receiver {s}
\tgo.opentelemetry.io/collector/receiver/otlpreceiver {v}
\tgo.opentelemetry.io/collector/service {v}
)
"""

    def build_steps(self, src, out):
        (src / "main.go").write_text(OTELCOL_MAIN_GO.replace("VERSION", self.version))
        (src / "go.mod").write_text(self.go_mod())
        # -mod=mod: go fills in the indirect requirements and go.sum as Minimal Version Selection picks them from the
        # pinned modules' go.mod files, fetching only the modules the build needs.
        return [["go", "build", "-mod=mod", "-trimpath", "-ldflags=-s -w", "-o", str(out), "."]]

    @property
    def spans_file(self):
        return self.state / "spans.jsonl"

    def config_yaml(self, ports):
        """OTLP in, every span to spans.jsonl (one ExportTraceServiceRequest as OTLP JSON a line), nothing else.

        flush_interval 100ms: the exporter buffers its writes, and a test waits for them (the default is 1 s).
        No batch processor: a request is written as it is received. Internal metrics off: they would open :8888."""
        return f"""# Written by dev/otelcol up.
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{ports['otlp_grpc']}
      http:
        endpoint: 127.0.0.1:{ports['otlp_http']}

exporters:
  file:
    path: {self.spans_file}
    format: json
    flush_interval: 100ms

service:
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [file]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
"""

    def env_text(self, ports):
        return (
            f"OTELCOL_VERSION={self.version}\n"
            f"OTELCOL_OTLP_GRPC_PORT={ports['otlp_grpc']}\n"
            f"OTELCOL_OTLP_HTTP_PORT={ports['otlp_http']}\n"
            f"OTLP_GRPC_ENDPOINT=http://127.0.0.1:{ports['otlp_grpc']}\n"
            f"OTLP_HTTP_ENDPOINT=http://127.0.0.1:{ports['otlp_http']}\n"
            f"OTELCOL_SPANS_FILE={self.spans_file}\n"
        )

    def ready(self, ports):
        return otlp_http_ready(ports["otlp_http"]) and port_in_use(ports["otlp_grpc"])

    def where(self, ports):
        return [
            f"otlp grpc: http://127.0.0.1:{ports['otlp_grpc']}",
            f"otlp http: http://127.0.0.1:{ports['otlp_http']}  (POST /v1/traces)",
            f"spans:     {self.spans_file}  (OTLP JSON, one export request a line)",
        ]

    def usage_lines(self):
        p = self.ports
        return f"""  up       start a minimal OpenTelemetry Collector {self.version} (OTLP receiver, file exporter) on
           127.0.0.1: OTLP gRPC :{p['otlp_grpc']}, OTLP HTTP :{p['otlp_http']}; every span received is appended to
           {self.spans_file} as OTLP JSON (one export request a line). Builds the binary first if it is
           not in the cache, and waits until both listeners answer. Writes {self.env_file} (the
           endpoints and the file) for tests to read. No-op if already running."""


RECEIVERS = {"jaeger": Jaeger, "otelcol": Otelcol}


def main(argv):
    """argv: the receiver (jaeger or otelcol), then the command and its arguments, as dev/jaeger and dev/otelcol pass
    them. Returns the exit status (0 ok, 1 an error, 2 a usage error, 3 from status: not running)."""
    if not argv or argv[0] not in RECEIVERS:
        print("usage: otel_harness.py jaeger|otelcol COMMAND (run it as dev/jaeger or dev/otelcol)", file=sys.stderr)
        return 2
    kind, rest = argv[0], argv[1:]
    cmd, args = (rest[0], rest[1:]) if rest else ("help", [])
    try:
        r = RECEIVERS[kind]()
        commands = {"up": r.cmd_up, "down": r.cmd_down, "status": r.cmd_status, "build": r.cmd_build}
        if cmd in ("help", "-h", "--help"):
            sys.stdout.write(r.usage())
            return 0
        if cmd not in commands:
            sys.stderr.write(r.usage())
            raise Die(f"unknown command: {cmd}")
        return commands[cmd](args)
    except Die as e:
        sys.stdout.flush()
        print(f"dev/{kind}: error: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
