#!/usr/bin/env python3
"""dev/bench-http's program: the benchmark of plugins that act (results go to docs/benchmarks.md, "Plugins that act").

Part "http" (HTTP-bound pipeline vs the native ceiling). A slow HTTP server on loopback (bench/http's
bench-http-server: every answer after BENCH_HTTP_DELAY_MS, 20 ms; it counts the requests and the most it had in
flight) and one topic pre-filled with BENCH_HTTP_RECORDS records whose value is the server's URL
(http://127.0.0.1:PORT/price/A-1; Apache's ProducerPerformance with a one-line payload file). Then, for every cell of
the grid concurrency C (BENCH_HTTP_CONCURRENCY) x batch size B (BENCH_HTTP_BATCH), BENCH_HTTP_REPEAT times:
  sharehost  `sharehost run` (release) with one pipeline: component target/guests/fixture_http_fetch.wasm (it issues
             all requests of a batch at once and waits for all, reading each body; accept on 2xx), concurrency = C,
             batch_size = B, allowed_outbound_hosts = ["http://127.0.0.1:PORT"], http_max_concurrent = C x B (so the
             host's cap never holds a request back), in a fresh share group from the earliest offset; every other
             setting at its default;
  native     bench/http's bench-http-native (reqwest, tokio): the same GETs with C x B requests in flight:
               free     C x B in flight at all times (the ceiling the goal is measured against),
               batched  C workers of B requests each, a worker starting its next B only when all B are done (the
                        shape of a plugin batch without the host),
               nopool   like free, but a new TCP connection per request (as the host's wasi:http sends do).
Each run reads M = min(BENCH_HTTP_RECORDS, max(200, C x B x (1000 / delay) x BENCH_HTTP_SECONDS)) records: about
BENCH_HTTP_SECONDS of steady work at the ceiling, and at most the topic. sharehost processes do not stop by
themselves: the admin endpoint is polled (GET /pipelines, the per-version `accepted` counters) and the host gets
SIGTERM (it drains) once M records are accepted; a rejected record (e.g. a request the host refused) fails the run.

Rates: steady records/s = records judged between the first poll that saw any and the one that saw M, over that time
(the group join and the first batch are not in it); native: (M - 1) / (first response .. last response). Ratio =
sharehost steady / native free steady of the same cell and repetition. Host CPU = user+sys of the host over its
steady span (from /proc/PID/stat at the first and the last poll), per 1,000 records judged in it. The server's most
requests in flight are shown beside C x B.

Part "languages" (optional): the cost of HTTP calls from Python and JavaScript against Rust. The same slow server
(20 ms) and one topic of BENCH_HTTP_LANG_RECORDS JSON orders ({"id":"oN","sku":"S-N","quantity":1}, N one of 5,000,
so nearly every record of a batch is a request of its own), read by `sharehost run` with the enricher in each
language (target/guests/enricher.wasm, enricher_py.wasm, enricher_js.wasm: every distinct SKU of a batch asked at
once; each priced order emitted to an output topic and accepted), concurrency C (BENCH_HTTP_LANG_CONCURRENCY) and
batch_size B (BENCH_HTTP_LANG_BATCH), http_max_concurrent = C x B, memory_limit_mib 64, BENCH_HTTP_REPEAT times,
M = min(records, C x B x (1000 / delay) x BENCH_HTTP_SECONDS) records per run. Table: steady records/s per
language, the ratio to Rust, host CPU per 1k.

Part "emit" (end to end): a 1-partition topic of BENCH_HTTP_EMIT_RECORDS records of 100 B read by `sharehost run`
with target/guests/fixture_actor.wasm and an output `valid` mapped to a fresh topic: values `emit:valid:TEXT` (89 B
emitted per record, produced acks=all before the record's Accept) vs plain 100 B values (accepted, nothing emitted);
records/s each, BENCH_HTTP_REPEAT times, and the output topic's record count checked. (The runtime side of an emit,
ns per emit without the broker, is in host/benches/runtime.rs.)

Needs: java 17+, cargo, rustup's wasm32-wasip2 target (dev/build-guests adds it), /usr/bin/time (package `time`).
No root. Network: loopback only.

env: BENCH_HTTP_PARTS ("http emit")       which parts to run (also "languages")
     BENCH_HTTP_RECORDS (20000)           records in the HTTP topic (the most one run reads)
     BENCH_HTTP_CONCURRENCY ("1 2 4")     pipeline `concurrency` values
     BENCH_HTTP_BATCH ("1 8 32")          pipeline `batch_size` values (= requests in flight per batch)
     BENCH_HTTP_REPEAT (2)                runs per cell (the table shows each, then the spread)
     BENCH_HTTP_SECONDS (8)               steady seconds per run at the ceiling (see M above)
     BENCH_HTTP_DELAY_MS (20)             the server's delay per answer
     BENCH_HTTP_NATIVE ("free batched nopool")  native modes run beside each sharehost run ("": none)
     BENCH_HTTP_PARTITIONS (2)            partitions of the HTTP topic
     BENCH_HTTP_EMIT_RECORDS (1000000)    records per emit run (part "emit")
     BENCH_HTTP_LANG_RECORDS (20000)      orders in the topic of part "languages"
     BENCH_HTTP_LANG_CONCURRENCY ("2")    pipeline `concurrency` values of part "languages"
     BENCH_HTTP_LANG_BATCH ("8 32")       pipeline `batch_size` values of part "languages"
     BENCH_HTTP_ADMIN_PORT (31480)        admin port of the sharehost process
     BENCH_HTTP_MANIFEST_EXTRA ("")       extra lines for the [[pipeline]] table of every run
     BENCH_HTTP_IDLE_TIMEOUT (60)         seconds without progress before a run counts as failed
     BENCH_HTTP_BUILD (1)                 0: use the binaries and guests already built (no cargo, no build-guests)
     KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_SASL_SSL_PORT, SHAREHOST_KAFKA_DIR as for dev/kafka: a broker that this
     checkout already runs there is used as it is (and never stopped); otherwise one is started and stopped at the
     end. CARGO_TARGET_DIR as for cargo (bench/http is built there too, as its own workspace).
Output: the tables on stdout; raw output in target/bench-http/<timestamp>/ (results.tsv, emit.tsv, table.md,
machine.txt, per-run logs, manifests, /usr/bin/time reports, the hosts' final /metrics, the server's stats).

Standard library only; its tests are dev/test_bench_http_driver.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REPO = DEV.parent
sys.path.insert(0, str(DEV))
import bench_host  # noqa: E402

NAME = "bench-http"
PARTS = ("http", "emit", "languages")
NATIVE_MODES = ("free", "batched", "nopool")
ENRICHERS = ("enricher", "enricher_py", "enricher_js")
# How long the HTTP server may take to say where it listens.
SERVER_START_S = 120


# A failure that ends the run: "bench-http: error: MSG" on stderr, exit status 1.
Die = bench_host.Die


def note(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


def mono_us():
    """Microseconds on the monotonic clock: a run's spans, which a step of the wall clock must not bend (bench_host's
    now_us is the wall clock, for times compared with the Kafka tools' dates)."""
    return time.monotonic_ns() // 1000


# --- settings ------------------------------------------------------------------------------------------------------


def posint(name, value):
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise Die(f"{name} must be a positive integer (got '{value}')")
    return int(value)


def posints(name, value):
    """A list of positive integers separated by blanks; each bad one is named."""
    return [posint(f"{name} ({v})", v) for v in value.split()]


@dataclass
class Settings:
    parts: list = field(default_factory=lambda: ["http", "emit"])
    records: int = 20000
    concurrency: list = field(default_factory=lambda: [1, 2, 4])
    batches: list = field(default_factory=lambda: [1, 8, 32])
    repeat: int = 2
    seconds: int = 8
    delay_ms: int = 20
    native_modes: list = field(default_factory=lambda: list(NATIVE_MODES))
    partitions: int = 2
    emit_records: int = 1000000
    lang_records: int = 20000
    lang_concurrency: list = field(default_factory=lambda: [2])
    lang_batches: list = field(default_factory=lambda: [8, 32])
    admin_port: int = 31480
    manifest_extra: str = ""
    idle_timeout: int = 60
    build: bool = True


def settings_from_env(environ):
    def get(name, default):
        return environ.get(name) or default

    s = Settings(
        records=posint("BENCH_HTTP_RECORDS", get("BENCH_HTTP_RECORDS", "20000")),
        repeat=posint("BENCH_HTTP_REPEAT", get("BENCH_HTTP_REPEAT", "2")),
        seconds=posint("BENCH_HTTP_SECONDS", get("BENCH_HTTP_SECONDS", "8")),
        delay_ms=posint("BENCH_HTTP_DELAY_MS", get("BENCH_HTTP_DELAY_MS", "20")),
        partitions=posint("BENCH_HTTP_PARTITIONS", get("BENCH_HTTP_PARTITIONS", "2")),
        emit_records=posint("BENCH_HTTP_EMIT_RECORDS", get("BENCH_HTTP_EMIT_RECORDS", "1000000")),
        idle_timeout=posint("BENCH_HTTP_IDLE_TIMEOUT", get("BENCH_HTTP_IDLE_TIMEOUT", "60")),
        lang_records=posint("BENCH_HTTP_LANG_RECORDS", get("BENCH_HTTP_LANG_RECORDS", "20000")),
        lang_concurrency=posints("BENCH_HTTP_LANG_CONCURRENCY", get("BENCH_HTTP_LANG_CONCURRENCY", "2")),
        lang_batches=posints("BENCH_HTTP_LANG_BATCH", get("BENCH_HTTP_LANG_BATCH", "8 32")),
        concurrency=posints("BENCH_HTTP_CONCURRENCY", get("BENCH_HTTP_CONCURRENCY", "1 2 4")),
        batches=posints("BENCH_HTTP_BATCH", get("BENCH_HTTP_BATCH", "1 8 32")),
        admin_port=posint("BENCH_HTTP_ADMIN_PORT", get("BENCH_HTTP_ADMIN_PORT", "31480")),
        manifest_extra=environ.get("BENCH_HTTP_MANIFEST_EXTRA", ""),
        build=get("BENCH_HTTP_BUILD", "1") == "1",
    )
    # Unset: every mode; set and empty: none.
    native = environ.get("BENCH_HTTP_NATIVE")
    s.native_modes = list(NATIVE_MODES) if native is None else native.split()
    for m in s.native_modes:
        if m not in NATIVE_MODES:
            raise Die(f"unknown native mode '{m}' in BENCH_HTTP_NATIVE")
    s.parts = get("BENCH_HTTP_PARTS", "http emit").split()
    for p in s.parts:
        if p not in PARTS:
            raise Die(f"unknown part '{p}' in BENCH_HTTP_PARTS")
    if s.admin_port > 65535:
        raise Die(f"BENCH_HTTP_ADMIN_PORT must be a port number (got {s.admin_port})")
    return s


def records_per_run(c, b, delay_ms, seconds, most):
    """M: about SECONDS of steady work at the ceiling (C x B requests every DELAY_MS), at least 200, at most MOST."""
    m = c * b * 1000 * seconds // delay_ms
    return min(max(m, 200), most)


# --- manifests -----------------------------------------------------------------------------------------------------


def http_manifest(bootstrap, admin_port, topic, group, component, c, b, server_url, extra=""):
    return f"""[cluster]
bootstrap = "{bootstrap}"
client_id = "sharehost-bench-http"

[admin]
listen = "127.0.0.1:{admin_port}"

[[pipeline]]
name = "bench-http"
topics = ["{topic}"]
group = "{group}"
component = "{component}"
concurrency = {c}
batch_size = {b}
allowed_outbound_hosts = ["{server_url}"]
http_max_concurrent = {c * b}
{extra}
"""


def languages_manifest(bootstrap, admin_port, enricher, topic, group, component, c, b, server_url, out_topic,
                       extra=""):
    return f"""[cluster]
bootstrap = "{bootstrap}"
client_id = "sharehost-bench-http"

[admin]
listen = "127.0.0.1:{admin_port}"

[[pipeline]]
name = "bench-{enricher}"
topics = ["{topic}"]
group = "{group}"
component = "{component}"
concurrency = {c}
batch_size = {b}
memory_limit_mib = 64
config = {{ pricing-url = "{server_url}" }}
allowed_outbound_hosts = ["{server_url}"]
http_max_concurrent = {c * b}
outputs = {{ enriched = "{out_topic}" }}
{extra}
"""


def emit_manifest(bootstrap, admin_port, topic, group, component, out_topic, extra=""):
    return f"""[cluster]
bootstrap = "{bootstrap}"
client_id = "sharehost-bench-http"

[admin]
listen = "127.0.0.1:{admin_port}"

[[pipeline]]
name = "bench-emit"
topics = ["{topic}"]
group = "{group}"
component = "{component}"
outputs = {{ valid = "{out_topic}" }}
{extra}
"""


def orders_payload():
    """The languages part's 5,000 orders, one a line (ProducerPerformance picks a line per record)."""
    return "".join(f'{{"id":"o{k}","sku":"S-{k}","quantity":1}}\n' for k in range(5000))


def emit_payloads():
    """(emit, plain): `emit:valid:` + 89 B, and 100 B that emit nothing."""
    return f"emit:valid:{'x' * 89}\n", f"plain-{'y' * 94}\n"


# --- what the tools print ------------------------------------------------------------------------------------------


def server_fields(stats):
    """(max_in_flight, requests) from the server's `requests=N max_in_flight=M in_flight=K` ("?" when absent)."""
    smax = re.search(r"max_in_flight=([0-9?]*)", stats)
    sreq = re.match(r"requests=([0-9?]*)", stats)
    return (smax.group(1) if smax else ""), (sreq.group(1) if sreq else "")


def native_result(line):
    """(steady records/s as printed, steady seconds "%.3f") from bench-http-native's one line."""
    rate = re.search(r"steady_records_per_s=([0-9.]*)", line)
    ms = re.search(r"steady_ms=([0-9.]*)", line)
    if not rate or not ms or not rate.group(1) or not ms.group(1):
        raise Die(f"bench-http-native printed no steady rate: {line.strip()[:200]!r}")
    return rate.group(1), f"{float(ms.group(1)) / 1000:.3f}"


def next_gap_us(count, acc, t, last_change, last_total):
    """The poll's next pause: about half the time the rest should take at the rate seen since the last change, between
    5 ms and 200 ms."""
    gap = (count - acc) * (t - last_change) // (acc - last_total) // 2
    return max(5000, min(200000, gap))


# --- the tables ----------------------------------------------------------------------------------------------------


def read_tsv(path):
    lines = Path(path).read_text().splitlines()
    return [line.split("\t") for line in lines[1:] if line]


def num(value):
    """A field as awk reads it: its leading number, 0 when it has none."""
    m = re.match(r"\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", value or "")
    return float(m.group(0)) if m else 0.0


def f0(x):
    return f"{x:.0f}"


def http_table(rows, delay):
    """table.md of part "http" from results.tsv's rows: per cell, each repetition's rate (sharehost, native modes),
    the ratio to native free, CPU per 1k, the server's most in flight."""
    cells, kinds = [], []
    rate, cpu, recs, smax = {}, {}, {}, {}
    reps = 0
    for r in rows:
        rep, c, b, kind = r[0], r[1], r[2], r[3]
        cell = (c, b)
        if cell not in cells:
            cells.append(cell)
        if kind != "sharehost" and kind not in kinds:
            kinds.append(kind)
        rate[cell, kind, rep] = r[6]
        reps = max(reps, int(num(rep)))
        if kind == "sharehost":
            cpu[cell, rep], recs[cell, rep], smax[cell, rep] = r[7], r[4], r[8]
    others = [k for k in kinds if k != "native-free"]
    hdr = "| C | B | C×B | ideal records/s | sharehost records/s | native free records/s |"
    sep = "|---:|---:|---:|---:|---:|---:|"
    for k in others:
        hdr += f" {k} records/s |"
        sep += "---:|"
    hdr += " sharehost / native free | host CPU ms per 1k records (steady) | server max in flight |"
    sep += "---:|---:|---|"
    out = [hdr, sep]
    reps_ = [str(i) for i in range(1, reps + 1)]
    for cell in cells:
        c, b = cell
        k = int(num(c)) * int(num(b))
        parts = [f"| {c} | {b} | {k} | {f0(k * 1000 / delay)}"]
        for kind in ["sharehost", "native-free", *others]:
            parts.append(" / ".join(f0(num(rate.get((cell, kind, i), ""))) for i in reps_))
        ratios = []
        for i in reps_:
            n = num(rate.get((cell, "native-free", i), ""))
            ratios.append(f"{num(rate.get((cell, 'sharehost', i), '')) / n:.2f}" if n > 0 else "-")
        parts.append(" / ".join(ratios))
        parts.append(" / ".join(f0(1e6 * num(cpu.get((cell, i), "")) / (num(recs.get((cell, i), "")) or 1))
                                for i in reps_))
        parts.append(" / ".join(smax.get((cell, i), "") for i in reps_))
        out.append(" | ".join(parts) + " |")
    return "".join(line + "\n" for line in out)


def languages_table(rows, delay):
    """languages-table.md: steady records/s per language, the ratios to Rust, host CPU per 1k."""
    cells = []
    rate, cpu, recs = {}, {}, {}
    reps = 0
    for r in rows:
        cell = (r[1], r[2])
        if cell not in cells:
            cells.append(cell)
        key = (cell, r[3], r[0])
        rate[key], cpu[key], recs[key] = num(r[6]), num(r[7]), num(r[4])
        reps = max(reps, int(num(r[0])))
    reps_ = [str(i) for i in range(1, reps + 1)]
    out = [
        "| C | B | ideal records/s | Rust records/s | Python records/s | JavaScript records/s | Python / Rust | "
        "JavaScript / Rust | host CPU ms per 1k records (Rust ; Python ; JavaScript) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for cell in cells:
        c, b = cell
        parts = [f"| {c} | {b} | {f0(num(c) * num(b) * 1000 / delay)}"]
        for lang in ENRICHERS:
            parts.append(" / ".join(f0(rate.get((cell, lang, i), 0.0)) for i in reps_))
        for lang in ENRICHERS[1:]:
            ratios = []
            for i in reps_:
                base = rate.get((cell, "enricher", i), 0.0)
                ratios.append(f"{rate.get((cell, lang, i), 0.0) / base:.2f}" if base > 0 else "-")
            parts.append(" / ".join(ratios))
        parts.append(" ; ".join(
            " / ".join(f0(1e6 * cpu.get((cell, lang, i), 0.0) / (recs.get((cell, lang, i), 0.0) or 1))
                       for i in reps_)
            for lang in ENRICHERS))
        out.append(" | ".join(parts) + " |")
    return "".join(line + "\n" for line in out)


def emit_table(rows):
    """emit-table.md: steady records/s, host CPU µs per record and output records, emit against plain."""
    r, c, o = {}, {}, {}
    for row in rows:
        kind = row[1]
        r.setdefault(kind, []).append(f0(num(row[4])))
        c.setdefault(kind, []).append(f"{1e6 * num(row[5]) / (num(row[2]) if num(row[2]) > 0 else 1):.1f}")
        o.setdefault(kind, []).append(row[6])

    def j(d, kind):
        return " / ".join(d.get(kind, []))

    return (
        "| values | steady records/s | host CPU µs per record | records in the output topic |\n"
        "|---|---:|---:|---:|\n"
        f"| `emit:valid:` + 89 B (one 89 B emit each) | {j(r, 'emit')} | {j(c, 'emit')} | {j(o, 'emit')} |\n"
        f"| plain 100 B (accept, no emit) | {j(r, 'plain')} | {j(c, 'plain')} | {j(o, 'plain')} |\n"
    )


# --- processes -----------------------------------------------------------------------------------------------------


@dataclass
class HostRun:
    rate: str  # steady records/s, "%.1f"
    judged: int
    secs: str  # steady seconds, "%.3f"
    wall: str
    steady_cpu: str
    cpu: str  # user+sys over the host's life (from /usr/bin/time)


class Bench:
    def __init__(self, settings):
        self.s = settings
        self.out = REPO / "target" / "bench-http" / bench_host.utc_stamp()
        self.out.mkdir(parents=True, exist_ok=True)
        self.stamp = bench_host.utc_stamp("%H%M%S")
        self.target = bench_host.target_dir()
        self.sharehost = self.target / "release" / "sharehost"
        self.server_bin = self.target / "release" / "bench-http-server"
        self.native_bin = self.target / "release" / "bench-http-native"
        self.guests = bench_host.GUESTS
        self.broker = None
        self.server = None
        self.server_url = ""
        self.server_port = None
        self.host = None  # the run in progress

    # --- broker and tools ---

    def attach_broker(self):
        """The broker this checkout runs is used as it is and never stopped; otherwise one is started here and
        removed at the end. A stopped broker's kept state, or a port held by something else, is refused."""
        self.broker = bench_host.Broker(say=note)
        self.broker.attach(
            busy_msg="port {port} is taken by a broker that is not this checkout's; not touching it (see dev/bench)",
            stopped_msg="a stopped broker's state is kept in this checkout; resume it (dev/kafka start-broker) or "
                        "remove it (dev/kafka down)")
        self.bootstrap = self.broker.bootstrap

    def count(self, topic):
        rc, out = self.broker.tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", self.bootstrap,
                                   "--topic", topic)
        if rc != 0:
            sys.stderr.write(out)
            raise Die(f"cannot read the end offsets of {topic}")
        return bench_host.topic_count(out)

    def create_topic(self, topic, partitions):
        self.broker.create_topic(topic, partitions, log=self.out / f"{topic}.create.log")

    def delete_topic(self, topic):
        self.broker.delete_topic(topic, log=self.out / f"{topic}.create.log")

    def fresh_group(self, group):
        """share.auto.offset.reset=earliest, set before the first member joins."""
        self.broker.share_earliest(group, log=self.out / f"{group}.config.log")

    def produce_payload(self, topic, partitions, count, payload):
        """A fresh topic of COUNT records, each value a line of the PAYLOAD file."""
        self.create_topic(topic, partitions)
        rc, out = self.broker.tool(
            "org.apache.kafka.tools.ProducerPerformance", "--bootstrap-server", self.bootstrap, "--topic", topic,
            "--num-records", count, "--payload-file", payload, "--throughput", "-1", "--command-property", "acks=1",
            "linger.ms=5", "batch.size=262144",
            "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
            log=self.out / f"{topic}.produce.log")
        if rc != 0:
            sys.stderr.write("".join(out.splitlines(True)[-20:]))
            raise Die(f"producing to {topic} failed")
        total = self.count(topic)
        if total != count:
            raise Die(f"{topic} holds {total} records, expected {count}")
        note(f"produced {count} records to {topic} ({partitions} partition(s))")

    # --- programs ---

    def build(self):
        if not Path("/usr/bin/time").is_file():
            raise Die("/usr/bin/time is needed for CPU times (apt-get install time)")
        if self.s.build:
            note("building sharehost (release), bench/http (release) and the guests")
            bench_host.build_release(("sharehost",))
            # bench/http is a workspace of its own.
            cmd = ["cargo", "build", "--release", "--quiet", "--manifest-path",
                   str(REPO / "bench" / "http" / "Cargo.toml"), "--target-dir", str(self.target)]
            if subprocess.call(cmd, cwd=REPO, stdin=subprocess.DEVNULL) != 0:
                raise Die(f"{' '.join(cmd[:3])} failed")
            bench_host.build_guests(self.out / "build-guests.log")
        for f in (self.sharehost, self.server_bin, self.native_bin):
            if not os.access(f, os.X_OK):
                raise Die(f"no {f} (build it, or run with BENCH_HTTP_BUILD=1)")
        for g in ("fixture_http_fetch", "fixture_actor", *ENRICHERS):
            if not (self.guests / f"{g}.wasm").is_file():
                raise Die(f"no target/guests/{g}.wasm (dev/build-guests)")

    def machine(self):
        dirty = bench_host.changed_files("host", "bench", "dev/bench-http", "dev/bench_http_driver.py")
        rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
        lines = [
            f"date: {bench_host.utc_stamp('%Y-%m-%dT%H:%M:%SZ')}",
            f"commit: {bench_host.commit()}{' (host/, bench/ or dev/bench-http modified)' if dirty else ''}",
            *bench_host.machine_lines(),
            f"kafka: {self.broker.version} at {self.bootstrap}",
            f"rustc: {rustc}",
            f"load at start: {bench_host.load_now(3)}",
        ]
        text = "".join(line + "\n" for line in lines)
        (self.out / "machine.txt").write_text(text)
        sys.stderr.write(text)

    def start_server(self, name):
        """bench-http-server, waited for until it says where it listens."""
        out, err = self.out / f"{name}.out", self.out / f"{name}.err"
        with open(out, "w") as o, open(err, "w") as e:
            self.server = subprocess.Popen([str(self.server_bin), "--delay-ms", str(self.s.delay_ms)], stdout=o,
                                           stderr=e, stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        while True:
            m = re.search(r"^listening on (http://127\.0\.0\.1:([0-9]+))$", out.read_text(errors="replace"),
                          re.MULTILINE)
            if m:
                self.server_url, self.server_port = m.group(1), int(m.group(2))
                break
            if self.server.poll() is not None:
                sys.stderr.write(err.read_text(errors="replace"))
                raise Die("the HTTP server did not start")
            if time.monotonic() - t0 >= SERVER_START_S:
                raise Die("the HTTP server did not say where it listens")
            time.sleep(0.05)

    def stop_server(self):
        if self.server is not None:
            if self.server.poll() is None:
                self.server.terminate()
            self.server.wait()
            self.server = None

    def server_stats(self):
        body = bench_host.admin_get(self.server_port, "/__stats")
        return body.decode(errors="replace").strip() if body is not None else "requests=? max_in_flight=?"

    def server_reset(self):
        if bench_host.admin_post(self.server_port, "/__reset")[0] != 200:
            raise Die("the HTTP server does not answer")

    def run_sharehost(self, name, manifest, count):
        """`sharehost run MANIFEST` (under /usr/bin/time) until COUNT records are accepted, then SIGTERM (it
        drains)."""
        s = self.s
        if bench_host.port_in_use(s.admin_port):
            raise Die(f"admin port {s.admin_port} is taken (set BENCH_HTTP_ADMIN_PORT)")
        err = self.out / f"{name}.err"
        t0 = mono_us()
        self.host = host = bench_host.Host([self.sharehost, "run", manifest], s.admin_port, self.out / f"{name}.out",
                                           err, time_report=self.out / f"{name}.time")
        first_acc = first_t = pid = None
        c0 = c1 = 0
        last_total, last_change, gap = 0, t0, 20000
        acc = None
        t = t0
        while True:
            status = host.status()
            t = mono_us()
            if status is not None:
                acc, rej = bench_host.judged_counts(status, f"{name}: GET /pipelines")
                if rej > 0:
                    host.tail(5)
                    raise Die(f"{name}: {rej} record(s) rejected (a refused or failed request?); see {err}")
                if acc >= count:
                    if pid is not None:
                        c1 = bench_host.cpu_ticks(pid, if_gone=0)
                    break
                if first_acc is None and acc > 0:
                    pids = host.host_pids()
                    pid = pids[0] if len(pids) == 1 else None
                    c0 = bench_host.cpu_ticks(pid, if_gone=0) if pid is not None else 0
                    first_acc, first_t, last_total, last_change = acc, t, acc, t
                elif acc > last_total:
                    gap = next_gap_us(count, acc, t, last_change, last_total)
                    last_total, last_change = acc, t
            if not host.running():
                host.tail(20)
                raise Die(f"{name}: sharehost exited early")
            if t - last_change > s.idle_timeout * 1000000:
                raise Die(f"{name}: no progress for {s.idle_timeout}s at {'?' if acc is None else acc} of {count} "
                          "records")
            time.sleep(gap / 1e6)
        if first_acc is None:
            first_acc, first_t = 0, t0
        judged_n = acc - first_acc
        secs = (t - first_t) / 1e6
        run = HostRun(
            rate=f"{judged_n / secs if secs > 0 else 0:.1f}",
            judged=judged_n,
            secs=f"{secs:.3f}",
            wall=f"{(t - t0) / 1e6:.2f}",
            steady_cpu=f"{(c1 - c0) / bench_host.CLK_TCK if c1 > c0 else 0:.2f}",
            cpu="",
        )
        host.save(self.out / name)
        if host.stop(what=name) != 0:
            raise Die(f"{name}: sharehost failed (see {err})")
        self.host = None
        run.cpu = f"{bench_host.TimeReport.read(self.out / f'{name}.time').cpu_s:.2f}"
        return run

    def run_native(self, mode, url, m, k, b, name):
        args = ["--url", url, "--requests", str(m), "--in-flight", str(k)]
        if mode == "batched":
            args += ["--mode", "batched", "--batch", str(b)]
        elif mode == "nopool":
            args += ["--no-pool"]
        out, err = self.out / f"{name}.out", self.out / f"{name}.err"
        with open(out, "w") as o, open(err, "w") as e:
            rc = subprocess.call(["/usr/bin/time", "-v", "-o", str(self.out / f"{name}.time"), str(self.native_bin),
                                  *args], stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        if rc != 0:
            sys.stderr.write(err.read_text(errors="replace"))
            raise Die(f"{name} failed")
        rate, secs = native_result(out.read_text(errors="replace"))
        return rate, secs, f"{bench_host.TimeReport.read(self.out / f'{name}.time').cpu_s:.2f}"

    # --- parts ---

    def part_http(self):
        s = self.s
        self.start_server("server")
        url = f"{self.server_url}/price/A-1"
        note(f"HTTP server at {self.server_url}, {s.delay_ms} ms per answer")
        (self.out / "payload.txt").write_text(url + "\n")
        topic = f"bench-http-{self.stamp}"
        self.produce_payload(topic, s.partitions, s.records, self.out / "payload.txt")
        results = self.out / "results.tsv"
        results.write_text("rep\tconcurrency\tbatch\tkind\trecords\tsteady_s\trecords_per_s\tsteady_cpu_s\t"
                           "server_max_in_flight\tserver_requests\tload\tlife_cpu_s\n")
        for rep in range(1, s.repeat + 1):
            for c in s.concurrency:
                for b in s.batches:
                    k = c * b
                    m = records_per_run(c, b, s.delay_ms, s.seconds, s.records)
                    load = bench_host.load_now()
                    group = f"bench-http-c{c}-b{b}-r{rep}-{self.stamp}"
                    self.fresh_group(group)
                    manifest = self.out / f"{group}.toml"
                    manifest.write_text(http_manifest(self.bootstrap, s.admin_port, topic, group,
                                                      self.guests / "fixture_http_fetch.wasm", c, b, self.server_url,
                                                      s.manifest_extra))
                    self.server_reset()
                    note(f"sharehost C={c} B={b} rep {rep}: {m} records (load {load})")
                    run = self.run_sharehost(group, manifest, m)
                    stats = self.server_stats()
                    (self.out / f"{group}.server").write_text(stats + "\n")
                    smax, sreq = server_fields(stats)
                    note(f"  sharehost: {run.rate} records/s steady ({run.judged} in {run.secs}s; {run.wall}s from "
                         f"launch), host cpu {run.steady_cpu}s steady ({run.cpu}s in all), server: {stats}")
                    with open(results, "a") as f:
                        f.write("\t".join(str(x) for x in (rep, c, b, "sharehost", run.judged, run.secs, run.rate,
                                                           run.steady_cpu, smax, sreq, load, run.cpu)) + "\n")
                    for mode in s.native_modes:
                        self.server_reset()
                        name = f"native-{mode}-c{c}-b{b}-r{rep}"
                        rate, secs, cpu = self.run_native(mode, url, m, k, b, name)
                        stats = self.server_stats()
                        smax, sreq = server_fields(stats)
                        note(f"  native {mode}: {rate} records/s steady, cpu {cpu}s, server: {stats}")
                        with open(results, "a") as f:
                            f.write("\t".join(str(x) for x in (rep, c, b, f"native-{mode}", m, secs, rate, cpu, smax,
                                                               sreq, load, cpu)) + "\n")
        self.delete_topic(topic)
        self.stop_server()
        (self.out / "table.md").write_text(http_table(read_tsv(results), s.delay_ms))

    def part_languages(self):
        s = self.s
        self.start_server("server-languages")
        note(f"HTTP server at {self.server_url}, {s.delay_ms} ms per answer (part languages)")
        (self.out / "orders.txt").write_text(orders_payload())
        topic = f"bench-http-orders-{self.stamp}"
        self.produce_payload(topic, s.partitions, s.lang_records, self.out / "orders.txt")
        results = self.out / "languages.tsv"
        results.write_text("rep\tconcurrency\tbatch\tlanguage\trecords\tsteady_s\trecords_per_s\tsteady_cpu_s\t"
                           "server_max_in_flight\tload\n")
        for rep in range(1, s.repeat + 1):
            for c in s.lang_concurrency:
                for b in s.lang_batches:
                    m = records_per_run(c, b, s.delay_ms, s.seconds, s.lang_records)
                    for e in ENRICHERS:
                        load = bench_host.load_now()
                        group = f"bench-http-{e}-c{c}-b{b}-r{rep}-{self.stamp}"
                        out_topic = f"{group}-out"
                        self.create_topic(out_topic, 1)
                        self.fresh_group(group)
                        manifest = self.out / f"{group}.toml"
                        manifest.write_text(languages_manifest(self.bootstrap, s.admin_port, e, topic, group,
                                                               self.guests / f"{e}.wasm", c, b, self.server_url,
                                                               out_topic, s.manifest_extra))
                        self.server_reset()
                        note(f"{e} C={c} B={b} rep {rep}: {m} records (load {load})")
                        run = self.run_sharehost(group, manifest, m)
                        stats = self.server_stats()
                        smax, _ = server_fields(stats)
                        note(f"  {e}: {run.rate} records/s steady ({run.judged} in {run.secs}s), host cpu "
                             f"{run.steady_cpu}s steady, server: {stats}")
                        with open(results, "a") as f:
                            f.write("\t".join(str(x) for x in (rep, c, b, e, run.judged, run.secs, run.rate,
                                                               run.steady_cpu, smax, load)) + "\n")
                        self.delete_topic(out_topic)
        self.delete_topic(topic)
        self.stop_server()
        (self.out / "languages-table.md").write_text(languages_table(read_tsv(results), s.delay_ms))

    def part_emit(self):
        s = self.s
        emit, plain = emit_payloads()
        (self.out / "emit-payload.txt").write_text(emit)
        (self.out / "plain-payload.txt").write_text(plain)
        results = self.out / "emit.tsv"
        results.write_text("rep\tkind\trecords\tsteady_s\trecords_per_s\tsteady_cpu_s\toutputs\tload\n")
        for kind in ("emit", "plain"):
            self.produce_payload(f"bench-http-{kind}-{self.stamp}", 1, s.emit_records,
                                 self.out / f"{kind}-payload.txt")
        for rep in range(1, s.repeat + 1):
            for kind in ("emit", "plain"):
                topic = f"bench-http-{kind}-{self.stamp}"
                group = f"bench-http-{kind}-r{rep}-{self.stamp}"
                out_topic = f"{group}-out"
                self.create_topic(out_topic, 1)
                self.fresh_group(group)
                manifest = self.out / f"{group}.toml"
                manifest.write_text(emit_manifest(self.bootstrap, s.admin_port, topic, group,
                                                  self.guests / "fixture_actor.wasm", out_topic, s.manifest_extra))
                load = bench_host.load_now()
                note(f"emit end to end: {kind} rep {rep}, {s.emit_records} records (load {load})")
                run = self.run_sharehost(group, manifest, s.emit_records)
                outputs = self.count(out_topic)
                note(f"  {kind}: {run.rate} records/s steady ({run.judged} in {run.secs}s), host cpu "
                     f"{run.steady_cpu}s steady ({run.cpu}s in all), {outputs} records in {out_topic}")
                if kind == "emit" and outputs < s.emit_records:
                    raise Die(f"{out_topic} holds {outputs} records, fewer than the {s.emit_records} accepted")
                with open(results, "a") as f:
                    f.write("\t".join(str(x) for x in (rep, kind, run.judged, run.secs, run.rate, run.steady_cpu,
                                                       outputs, load)) + "\n")
                self.delete_topic(out_topic)
        for kind in ("emit", "plain"):
            self.delete_topic(f"bench-http-{kind}-{self.stamp}")
        (self.out / "emit-table.md").write_text(emit_table(read_tsv(results)))

    def summary(self):
        s = self.s
        out = self.out
        with open(out / "machine.txt", "a") as f:
            f.write(f"load at end: {bench_host.load_now(3)}\n")
        text = "\n" + (out / "machine.txt").read_text()
        if (out / "table.md").is_file():
            text += (f"\nHTTP-bound pipeline (server delay {s.delay_ms} ms; per cell: repetitions separated by /):\n\n"
                     + (out / "table.md").read_text())
        if (out / "languages-table.md").is_file():
            text += (f"\nThe enricher in three languages (server delay {s.delay_ms} ms; per cell: repetitions "
                     "separated by /):\n\n" + (out / "languages-table.md").read_text())
        if (out / "emit-table.md").is_file():
            extra = f" plus: {s.manifest_extra}" if s.manifest_extra else ""
            text += (f"\nEmit end to end ({s.emit_records} records per run; pipeline settings at their "
                     f"defaults{extra}):\n\n" + (out / "emit-table.md").read_text())
        text += f"\nraw results: {out}\n"
        (out / "summary.txt").write_text(text)
        sys.stdout.write(text)
        sys.stdout.flush()

    def run(self):
        self.attach_broker()
        self.build()
        self.machine()
        if "http" in self.s.parts:
            self.part_http()
        if "languages" in self.s.parts:
            self.part_languages()
        if "emit" in self.s.parts:
            self.part_emit()
        self.summary()
        return 0

    def cleanup(self):
        """The run in progress and the server, then the broker if this run started it (dev/kafka down)."""
        if self.host is not None:
            self.host.kill()
        self.stop_server()
        if self.broker is not None:
            self.broker.close()


def main(argv):
    if argv and argv[0] in ("help", "-h", "--help"):
        print(__doc__)
        return 0

    def body(on_exit):
        if argv:
            raise Die(f"unknown argument: {argv[0]} (dev/bench-http help)")
        bench = Bench(settings_from_env(os.environ))
        on_exit(bench.cleanup)
        return bench.run()

    return bench_host.driver_main(NAME, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
