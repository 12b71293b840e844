"""dev/bench's program: one table of sharehost against the broker's own delivery ceiling, against every other share
consumer, and with plugins that do work. Results go to docs/benchmarks.md ("One table").

One command, one run, one table. For each value size (100 B, 1 KiB) one topic is pre-filled with Apache's
ProducerPerformance (BENCH_RECORDS records spread exactly evenly over BENCH_PARTITIONS partitions) from a payload file
of valid JSON orders padded to exactly that size (so the plugin rows judge real orders; content does not change what
the other consumers do). Then every consumer kind reads the whole topic, every run in a fresh group (a share group
set to start from the earliest offset, or a fresh classic group):
  classic  Apache's classic ConsumerPerformance (a plain consumer group, Fetch, no share bookkeeping): the broker's
           delivery ceiling on this machine. Every row is also given as a ratio of it ("× classic").
  java     Apache's ShareConsumerPerformance (implicit acknowledgement, as the tool does it);
  krafka   krafka 0.28.1's share consumer (bench/peers/krafka, a release binary built here only when this kind is
           selected: ~15 min the first time), explicit accept per record, the accepts riding on the next ShareFetch;
  rdkafka  confluent-kafka-python 2.16.1's ShareConsumer (librdkafka's preview KIP-932 support; bench/peers/rdkafka,
           a venv under target/peers-venv made here), explicit ACCEPT per message, commit_async per poll;
  wasm     the real host: `sharehost run` (release), one pipeline whose component is target/guests/accept_all.wasm,
           every other setting at its default;
  native   the same manifest and the same pipeline code with a native accept-all handler in place of the Wasm call
           (host/examples/pipeline_bench.rs): wasm/native is the cost of the sandbox alone;
  wasm-fleet  `sharehost run` as wasm, but a fleet host (docs/fleet.md): the component signed with a key made for the
           run, `[trust]` and `[fleet]` in the manifest (the fleet's topics made at start, a status record every
           status interval, the deployments topic followed): wasm-fleet/wasm is what fleet mode costs the data path;
  wasm-splitter, wasm-fleet-splitter  a plugin that writes: target/guests/splitter.wasm, one output per record (two
           output topics made per run, BENCH_PARTITIONS each), on a plain host and on a fleet host; their rows add
           the mean time of an output write (write_ms, from the hosts' sharehost_write_seconds): a fleet host's writes
           must not wait behind its agent's long polls;
  wasm-eo-splitter  the splitter on a plain host with guarantee = "exactly-once": each batch's outputs and its
           settled record in one transaction (the group's settled log made and deleted per run): wasm-eo-splitter /
           wasm-splitter is what exactly-once costs;
  wasm-avro  `sharehost run` as wasm, on a topic of the same size whose values are Avro orders written by Confluent's
           serializer (dev/schema_records.py through dev/registry, 1000 distinct payloads written round-robin by
           `sharehost produce --compression none`, as ProducerPerformance writes the raw topic), decoded by the host
           ([pipeline.schema], the registry asked with its credentials): wasm-avro/wasm is what decoding costs;
  wasm-trace-1pct, wasm-trace-all  wasm with [telemetry] exporting to dev/otelcol, 1 % and every record sampled:
           against wasm (traces off) what traces cost. dev/registry and dev/otelcol are started for these kinds
           when they do not run (and stopped at the end); the collector writes every span it gets to its file
           (about 1 KB per record at wasm-trace-all: mind the disk with large BENCH_RECORDS);
  wasm-reader, native-reader        the same with target/guests/value_reader.wasm (reads every byte; rejects values
           not starting with `{` and ~1/16 by checksum) and its native twin (PIPELINE_BENCH_HANDLER=value-reader);
  wasm-validator, native-validator  the same with target/guests/order_validator.wasm (parses the JSON order) and its
           native twin (PIPELINE_BENCH_HANDLER=order-validator).
Apache's tools run with dev/kafka's tool command line and the JVM flags of Apache's own bin/kafka-*-perf-test.sh (full
JIT, G1, -Xmx256M) and the same fetch size (BENCH_JAVA_ARGS). sharehost processes do not stop by themselves: dev/bench
polls their admin endpoint (GET /pipelines, the per-version `accepted` + `rejected` counters: every judged record)
and SIGTERMs them (they drain) once the sum over all processes reaches the topic's record count. The other consumers
stop after a record count: one process gets all records; with P > 1 processes each gets (N/P - 500) (500 =
max.poll.records, the most a process can read past its quota in its last poll), so no process waits for records
another one took; those runs read all but at most 500 P records and their rate counts what they read.
After every share-group run the group is described with Apache's ShareGroupCommand: its lag must be 0 (everything
acknowledged); a run with a quota (P > 1) reports the fraction left. A run whose group is left with lag, and a peer
(krafka, rdkafka) that exits with an error, is a FAILED row (shown, never counted as fast, left out of the goals).

Columns: first record s = first record - launch of the first process (process start and group join); records/s =
records read / (last record - launch of the first process), the join included; steady = records / (last record -
first record). CPU s per million records = user+sys of all consumer processes over their whole life (start, JIT,
drain and close included) per 10^6 records; peak RSS = the largest peak RSS among the processes (/usr/bin/time -v);
broker CPU = the broker's CPU seconds during the run, per 10^6 records, and in brackets without what its JIT
compilers took meanwhile (broker_jit_s in the extra column; <row>.threads.txt has every thread). The first record of
a run is seen: for sharehost by polling its counters every 20 ms; for ShareConsumerPerformance at its first progress
line (within one poll); for the classic tool as its start time + its rebalance time (the assignment; the first Fetch
follows within one round trip: the tool prints nothing finer); the peers print it themselves. Below the table a goals block marks
each goal met or not with the measured ratio, then the machine, the commit and the exact command.

Needs: java 17+, cargo, python3 with venv, rustup's wasm32-wasip2 target (dev/build-guests adds it), /usr/bin/time
(package `time`). No root.

env: BENCH_RECORDS (3000000)   records per topic (a multiple of BENCH_PARTITIONS and of every process count); enough
                               that the steady phase of the fastest consumer lasts seconds, not one
     BENCH_SIZES ("100 1024")  value sizes in bytes (at least 80: a JSON order has to fit)
     BENCH_PARTITIONS (6)      partitions per topic (6: 2 per process with 3 processes, all on one leader)
     BENCH_KINDS ("classic java krafka rdkafka wasm native wasm-reader native-reader wasm-validator native-validator")
                               consumer kinds, of those (and wasm-fleet, wasm-splitter, wasm-fleet-splitter,
                               wasm-eo-splitter, wasm-avro, wasm-trace-1pct, wasm-trace-all)
     BENCH_PROCESSES ("1 3")   process counts of java, wasm, wasm-fleet and native
     BENCH_PEER_PROCESSES ("1")   process counts of classic, krafka and rdkafka
     BENCH_PLUGIN_PROCESSES ("1") process counts of the plugin work rows (wasm-reader ... native-validator)
     BENCH_WARMUP (2000000)    records of a warm-up topic, read by unmeasured sharehost runs (a fresh share group
                               each) until the broker's JIT compilers spend under a tenth of its CPU in one, at
                               most BENCH_WARMUP_ROUNDS (15) times (0: no warm-up). A fresh broker on 2 cores
                               compiles for about 45 s of share traffic; until then most of its CPU is the
                               JIT's, not the consumer's
     BENCH_ADMIN_PORT (31470)  first admin port of the sharehost processes (one per process); below the ephemeral
                               range (32768-60999 on Linux), where a connection's own port could take it
     BENCH_MANIFEST_EXTRA ("") extra lines for the [[pipeline]] table, e.g. "max_in_flight = 3000"
     BENCH_JAVA_ARGS ("--fetch-size 52428800")  extra flags of both Apache tools. ShareConsumerPerformance sets
                               fetch.max.bytes to 1 MiB unless told otherwise, which holds the Java client back at
                               1 KiB; by default it gets its own client default, 50 MiB, the MaxBytes sharehost sends;
                               ConsumerPerformance takes it as max.partition.fetch.bytes ("" for the tools' 1 MiB)
     BENCH_IDLE_TIMEOUT (90)   seconds without progress before a run counts as failed
     BENCH_PORT_WAIT (1200)    seconds to wait for a foreign broker to free the ports before giving up
     BENCH_PEERS_TARGET (target/peers-build)  CARGO_TARGET_DIR of the krafka peer's build (kept apart from the
                               workspace's: it is a workspace of its own)
     BENCH_RETABLE ("")        a run's directory (target/bench/<timestamp>): only render its table.md again from its
                               results.tsv and machine.txt with dev/bench_table.py (after a change to the table's
                               code), run nothing
     BENCH_JFR (0)             1: record a Java Flight Recorder profile of the broker during every row (jcmd, no
                               restart) into <row>.jfr, with its hottest methods in <row>.hot.txt
                               (every row, JFR or not, writes <row>.threads.txt: the broker's CPU by thread)
     BENCH_BROKER_CPUS ("")    a CPU list for taskset (e.g. "0"): the broker's threads are pinned to it for the
                               whole run, making the broker the slower side
     BENCH_PERF (0)            1: attach `perf record` (999 Hz, no call graph) to every sharehost process, into
                               <group>.<i>.perf.data, with its hottest symbols in <group>.<i>.perf.txt (the
                               row's figures then carry perf's own work)
     BENCH_DOCS (1; 0 with BENCH_RETABLE)  1: write the table, goals, machine, commit and command into
                               docs/benchmarks.md ("One table", between its markers), replacing the run there
     KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_SASL_SSL_PORT, SHAREHOST_KAFKA_DIR as for dev/kafka: a broker that
     this checkout already runs there is used as it is; otherwise one is started (and stopped at the end).
     CARGO_TARGET_DIR as for cargo.
Every row also reads the broker's own counts over JMX before and after it (an agent started in the running broker
with jcmd: requests by API, record acknowledgements by type, records written to __share_group_state) and adds the
difference to its extra column, e.g. "broker: ShareFetch=2035 ShareAcknowledge=12 state_records=4100".
Output: the table and the goals on stdout; every run's raw output in target/bench/<timestamp>/ (results.tsv,
table.md = the table + goals + machine + commit + command, logs, manifests, /usr/bin/time reports, the hosts' final
/metrics, the groups' ShareGroupCommand descriptions).

The program behind the entry point dev/bench (standard library only); its tests are dev/test_bench.py.
"""

import base64
import dataclasses
import filecmp
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_host  # noqa: E402
import bench_table  # noqa: E402
from bench_host import REPO, Die, Host, now_us  # noqa: E402

NAME = "bench"
KINDS = ("classic", "java", "krafka", "rdkafka", "wasm", "wasm-fleet", "native", "wasm-reader", "native-reader",
         "wasm-validator", "native-validator", "wasm-splitter", "wasm-fleet-splitter",
         "wasm-eo-splitter", "wasm-avro", "wasm-trace-1pct", "wasm-trace-all")
# The trace kinds' sampling rates ([telemetry] sample).
TRACE_SAMPLE = {"wasm-trace-1pct": 0.01, "wasm-trace-all": 1.0}
# The Avro topic's schema: the raw topic's order, its padding in `note`.
AVRO_ORDER = {"type": "record", "name": "BenchOrder", "namespace": "sharehost.bench", "fields": [
    {"name": "id", "type": "string"}, {"name": "sku", "type": "string"}, {"name": "quantity", "type": "int"},
    {"name": "price", "type": "double"}, {"name": "note", "type": "string"}]}
# Records per `sharehost produce` call filling the Avro topic (it holds a call's records in memory): a multiple of
# every partition count up to 10, so the round robin puts the same number on every partition.
AVRO_PRODUCE_CHUNK = 2520 * 40
# The kinds whose hosts are fleet hosts (a signed component, [trust] and [fleet] in the manifest).
FLEET_KINDS = ("wasm-fleet", "wasm-fleet-splitter")
# The splitter's outputs (examples/splitter): each run writes them to topics of its own, named after its group.
SPLITTER_OUTPUTS = ("urgent", "normal")
DEFAULT_KINDS = "classic java krafka rdkafka wasm native wasm-reader native-reader wasm-validator native-validator"
# The most records one process of the tools and peers reads past its quota in its last poll (max.poll.records: the
# default of ShareConsumerPerformance, ConsumerPerformance and krafka; librdkafka's share consumer returns at most as
# many per poll).
MAX_POLL = 500
# The tools give up after this long without a record; ShareConsumerPerformance also bounds the whole run with it (it
# interrupts its consumer threads once this much time has passed since they started), so it must exceed the run.
JAVA_TIMEOUT_MS = 600000
# What a tool or peer process may take beyond that before this program gives up on it.
PROCESS_GRACE_S = 300
# The JVM flags of Apache's bin/kafka-run-class.sh (KAFKA_JVM_PERFORMANCE_OPTS, default KAFKA_HEAP_OPTS). They come
# after dev/kafka's tool flags on the java command line, so they win (the last -XX/-Xmx setting counts).
JAVA_STOCK_FLAGS = ("-Xmx256M", "-XX:TieredStopAtLevel=4", "-XX:-UseSerialGC", "-XX:+UseG1GC",
                    "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
                    "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true")
DATE_FORMAT = "yyyy-MM-dd HH:mm:ss.SSSZ"
# The acknowledgements of a consumer that just closed may reach the share state a moment later: a lag above 0 is
# asked again, a second apart, for this long at most.
SHARE_LAG_WAIT_S = 60
# How long a sharehost process may take to drain and exit after SIGTERM.
DRAIN_LIMIT_S = 300
# The variables whose values make "the exact command" of a run.
COMMAND_VARS = re.compile(r"BENCH_[A-Z_]+|KAFKA_PORT|KAFKA_CONTROLLER_PORT|KAFKA_SASL_SSL_PORT|SHAREHOST_KAFKA_DIR"
                          r"|CARGO_TARGET_DIR")
KRAFKA_PEER = REPO / "bench" / "peers" / "krafka"
RDKAFKA_PEER = REPO / "bench" / "peers" / "rdkafka"
PEERS_VENV = REPO / "target" / "peers-venv"
RESULTS_HEADER = ("size", "processes", "kind", "records", "t0_us", "first_us", "last_us", "cpu_s", "rss_kb",
                  "broker_cpu_s", "load", "lag", "status", "extra")


def note(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


# --- settings --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    records: int
    sizes: list
    partitions: int
    processes: list
    peer_processes: list
    plugin_processes: list
    kinds: list
    warmup: int
    warmup_rounds: int
    admin_port: int
    manifest_extra: str
    java_args: list
    idle_timeout: int
    port_wait: int
    peers_target: Path
    docs: bool
    jfr: bool = False
    perf: bool = False
    broker_cpus: str = ""

    def kind_processes(self, kind):
        """The process counts KIND runs with."""
        if kind in ("java", "wasm", "wasm-fleet", "native"):
            return self.processes
        if kind in ("classic", "krafka", "rdkafka"):
            return self.peer_processes
        return self.plugin_processes

    def all_processes(self):
        return sorted({n for k in self.kinds for n in self.kind_processes(k)})

    def has(self, kind):
        return kind in self.kinds

    def quota(self, procs, records=None):
        """The records each process of a tool or peer reads (see the docstring)."""
        records = self.records if records is None else records
        return records // procs - MAX_POLL if procs > 1 else records


def env(environ, name, default):
    """A variable as the shell's ${NAME:-default} read it: unset and empty both mean the default."""
    return environ.get(name) or default


def whole(environ, name, default, positive=True):
    text = env(environ, name, str(default)).strip()
    if not re.fullmatch(r"[0-9]+", text) or (positive and int(text) == 0):
        kind = "a positive integer" if positive else "a non-negative integer"
        raise Die(f"{name} must be {kind} (got '{text}')")
    return int(text)


def counts(environ, name, default, what):
    out = []
    for word in env(environ, name, default).split():
        if not re.fullmatch(r"[1-9][0-9]*", word):
            raise Die(f"{name}: process count '{word}' of {what} is not a positive integer")
        out.append(int(word))
    return out


def config_from_env(environ):
    """The run's settings from the environment, each checked; Die names the variable that is wrong."""
    records = whole(environ, "BENCH_RECORDS", 3000000)
    partitions = whole(environ, "BENCH_PARTITIONS", 6)
    warmup = whole(environ, "BENCH_WARMUP", 2000000, positive=False)
    if records % partitions:
        raise Die(f"BENCH_RECORDS ({records}) must be a multiple of BENCH_PARTITIONS ({partitions})")
    sizes = []
    for word in env(environ, "BENCH_SIZES", "100 1024").split():
        if not word.isdigit() or int(word) < 80:
            raise Die(f"BENCH_SIZES: '{word}' is not a size of at least 80 bytes")
        sizes.append(int(word))
    kinds = env(environ, "BENCH_KINDS", DEFAULT_KINDS).split()
    for k in kinds:
        if k not in KINDS:
            raise Die(f"unknown consumer kind '{k}' in BENCH_KINDS")
    java_args = environ.get("BENCH_JAVA_ARGS")
    cfg = Config(
        records=records,
        sizes=sizes,
        partitions=partitions,
        processes=counts(environ, "BENCH_PROCESSES", "1 3", "java, wasm and native"),
        peer_processes=counts(environ, "BENCH_PEER_PROCESSES", "1", "classic, krafka and rdkafka"),
        plugin_processes=counts(environ, "BENCH_PLUGIN_PROCESSES", "1", "the plugin rows"),
        kinds=kinds,
        warmup=warmup,
        warmup_rounds=whole(environ, "BENCH_WARMUP_ROUNDS", 15),
        admin_port=whole(environ, "BENCH_ADMIN_PORT", 31470),
        manifest_extra=environ.get("BENCH_MANIFEST_EXTRA", ""),
        # Set but empty means no flags (the tools' own fetch size); unset means the default.
        java_args=("--fetch-size 52428800" if java_args is None else java_args).split(),
        idle_timeout=whole(environ, "BENCH_IDLE_TIMEOUT", 90),
        port_wait=whole(environ, "BENCH_PORT_WAIT", 1200, positive=False),
        peers_target=REPO / env(environ, "BENCH_PEERS_TARGET", str(REPO / "target" / "peers-build")),
        docs=env(environ, "BENCH_DOCS", "1") == "1",
        jfr=env(environ, "BENCH_JFR", "0") == "1",
        perf=env(environ, "BENCH_PERF", "0") == "1",
        broker_cpus=env(environ, "BENCH_BROKER_CPUS", ""),
    )
    if cfg.admin_port > 65535:
        raise Die(f"BENCH_ADMIN_PORT must be a port (got {cfg.admin_port})")
    for k in kinds:
        for n in cfg.kind_processes(k):
            if records % n:
                raise Die(f"BENCH_RECORDS ({records}) must be a multiple of every process count ({n})")
            if n > 1 and records // n <= MAX_POLL:
                raise Die(f"BENCH_RECORDS ({records}) is too small for {n} processes")
    return cfg


def command_line(environ):
    """The exact command, for the table: every variable dev/bench reads that is set, then dev/bench."""
    names = sorted(n for n in environ if COMMAND_VARS.fullmatch(n))
    return " ".join([f"{n}={bench_host.bash_quote(environ[n])}" for n in names] + ["dev/bench"])


# --- what the tools and peers print, and what they read --------------------------------------------------------------


def order_payloads(size):
    """1000 valid JSON orders (the shape of examples/order-validator, as host/benches/runtime.rs builds them), each
    padded with a `note` field to exactly SIZE bytes: ProducerPerformance's payload file, one a line."""
    lines = []
    for i in range(1000):
        head = f'{{"id":"o{i}","sku":"SKU-{i % 97}","quantity":{1 + i % 9},"price":{i % 50}.5,"note":"'
        pad = size - len(head) - 2
        note_ = "".join(chr(97 + (i * 7 + j * 5 + j // 3) % 26) for j in range(pad))
        lines.append(head + note_ + '"}')
    for line in lines:
        if len(line.encode()) != size:
            raise Die(f"payloads of {size} B came out another size")
    return lines


def avro_orders(size):
    """1000 orders of AVRO_ORDER (the raw topic's shape), each with a `note` of the length that makes its value in
    the registry's wire format (a zero byte, a 4-byte schema id, the Avro binary) exactly SIZE bytes."""
    def varint_len(n):
        return max(1, (n.bit_length() + 6) // 7)

    def string_len(text):
        return varint_len(2 * len(text)) + len(text)

    orders = []
    for i in range(1000):
        o = {"id": f"o{i}", "sku": f"SKU-{i % 97}", "quantity": 1 + i % 9, "price": i % 50 + 0.5}
        fixed = 5 + string_len(o["id"]) + string_len(o["sku"]) + varint_len(2 * o["quantity"]) + 8
        pad = next((n for n in range(size - fixed, -1, -1) if fixed + varint_len(2 * n) + n == size), None)
        if pad is None:
            raise Die(f"an Avro order cannot be made exactly {size} B")
        o["note"] = "".join(chr(97 + (i * 7 + j * 5 + j // 3) % 26) for j in range(pad))
        orders.append(o)
    return orders


def result_lines(text, fields, numeric):
    """The lines of a tool's output that split on ", " into FIELDS fields, with whole numbers in the NUMERIC ones
    (0-based)."""
    out = []
    for line in text.splitlines():
        f = line.split(", ")
        if len(f) == fields and all(re.fullmatch(r"[0-9]+", f[i]) for i in numeric):
            out.append(f)
    return out


def stopped_early(text):
    return any(line.startswith("WARNING: Exiting before consuming") for line in text.splitlines())


@dataclasses.dataclass
class ToolResult:
    """One tool or peer process's reading: records read, microseconds of its first record (None when it does not
    say) and its last, and what else it reported."""

    records: int
    first_us: object
    last_us: int
    join_ms: int = 0
    commit_failures: int = 0


def parse_share_perf(text, where):
    """ShareConsumerPerformance --show-detailed-stats: the final line is start, end, MB, MB/s, records, records/s,
    elapsed ms... with 7 fields whose 6th and 7th are whole numbers; progress lines end "for share consumer N". The
    first progress line marks the first records (within one poll)."""
    if stopped_early(text):
        raise Die(f"{where}: the tool stopped before its records")
    final = result_lines(text, 7, (5, 6))
    if not final:
        raise Die(f"no result line in {where}")
    line = final[-1]
    try:
        first = next((bench_host.epoch_us_of(f[1]) for f in (line.split(", ") for line in text.splitlines())
                      if len(f) == 7 and "for share consumer" in f[6]), None)
        return ToolResult(records=int(line[5]), first_us=first, last_us=bench_host.epoch_us_of(line[1]))
    except ValueError as e:
        raise Die(f"{where}: {e}") from None


def parse_consumer_perf(text, where):
    """ConsumerPerformance: start.time, end.time, MB, MB/s, records, records/s, rebalance.time.ms, fetch.time.ms,
    fetch MB/s, fetch records/s. The first record is taken as start + rebalance time (the assignment)."""
    if stopped_early(text):
        raise Die(f"{where}: the tool stopped before its records")
    final = result_lines(text, 10, (4,))
    if not final:
        raise Die(f"no result line in {where}")
    line = final[-1]
    try:
        start, end = bench_host.epoch_us_of(line[0]), bench_host.epoch_us_of(line[1])
        join = int(float(line[6]))
    except ValueError as e:
        raise Die(f"{where}: {e}") from None
    return ToolResult(records=int(line[4]), first_us=start + join * 1000, last_us=end, join_ms=join)


def parse_peer(text, where):
    """A peer's key=value lines: launch_us, first_us, last_us, records, commit_failures."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value.strip()

    def number(key):
        if not re.fullmatch(r"[0-9]+", values.get(key, "")):
            raise Die(f"no {key} in {where}")
        return int(values[key])

    return ToolResult(records=number("records"), first_us=number("first_us"), last_us=number("last_us"),
                      commit_failures=number("commit_failures"))


def parse_end_offsets(text, where):
    """GetOffsetShell's topic:partition:offset lines: the end offset of each partition."""
    offsets = []
    for line in text.splitlines():
        last = line.rsplit(":", 1)[-1].strip()
        if line.count(":") >= 2 and last.isdigit():
            offsets.append(int(last))
    if not offsets:
        raise Die(f"{where}: no topic:partition:offset lines")
    return offsets


def metric_sum(text, name, label=None):
    """The sum of every sample of metric NAME (with LABEL among its labels, when given) in a /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and (label is None or label in line.split("}")[0]):
            words = line.split()
            try:
                total += float(words[1])
            except (IndexError, ValueError):
                continue
    return total


def number_text(x):
    """A sum as awk prints it: a whole number without a point."""
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def next_gap_us(records, total, last_total, t, last_change):
    """How long the poller naps after seeing progress: about half the time the rest should take at the rate seen
    since the last change, 5 ms to 200 ms, so the N-th record is seen within a few ms without polling fast for the
    whole run."""
    gap = (records - total) * (t - last_change) // (total - last_total) // 2
    return max(5000, min(200000, gap))


def krafka_version(lock_text):
    """krafka's version in the peer's Cargo.lock."""
    lines = lock_text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line == 'name = "krafka"':
            words = lines[i + 1].split()
            return words[2].strip('"') if len(words) >= 3 else "?"
    return "?"


def output_topic(group, name):
    """The topic of the splitter's output NAME in a run of GROUP."""
    return f"{group}-{name}"


def splitter_outputs(extra, group):
    """EXTRA (the pipeline's raw TOML lines) followed by the splitter's [pipeline.outputs], each to a topic of GROUP's
    own (a subtable: after every plain key of the pipeline)."""
    lines = [extra.rstrip("\n"), "[pipeline.outputs]"] if extra.strip() else ["[pipeline.outputs]"]
    lines += [f"{name} = {bench_host.toml_string(output_topic(group, name))}" for name in SPLITTER_OUTPUTS]
    return "\n".join(lines) + "\n"


def fleet_manifest_head(key, host_id, group):
    """The [trust] and [fleet] tables of a fleet host of the run's own fleet."""
    return (f"[trust]\nkeys = [{bench_host.toml_string(key)}]\n\n[fleet]\nname = \"bench\"\n"
            f"host_id = {bench_host.toml_string(host_id)}\ntopic_prefix = {bench_host.toml_string(group + '.')}\n")


@dataclasses.dataclass
class Reading:
    """What every run measures (see the docstring's columns)."""

    read: int = 0
    t0: int = 0
    first: int = 0
    last: int = 0
    cpu_s: float = 0.0
    rss_kb: int = 0
    extra: str = ""
    failed: str = ""


def add_times(reading, reports):
    """CPU (sum) and peak RSS (the largest) over the /usr/bin/time reports of a run's processes."""
    reading.cpu_s = 0.0
    reading.rss_kb = 0
    for path in reports:
        r = bench_host.TimeReport.read(path)
        reading.cpu_s += r.cpu_s
        reading.rss_kb = max(reading.rss_kb, r.rss_kb)


def result_row(size, procs, kind, r, broker_s, load, lag, status):
    return "\t".join(map(str, (size, procs, kind, r.read, r.t0, r.first, r.last, f"{r.cpu_s:.2f}", r.rss_kb,
                               f"{broker_s:.2f}", load, lag, status, r.extra))) + "\n"


def broker_extra(delta):
    """The broker's counts of a row for its extra column: the share requests (and any produce, fetch, transaction
    requests beside them), acknowledgements by type, state records; "" when none were read."""
    if not delta:
        return ""
    shown = [f"{k.split('.', 1)[1]}={v}" for k, v in delta.items() if k.startswith("requests.") and v > 0
             and k.split(".", 1)[1] in BROKER_REQUESTS]
    shown += [f"ack_{k.split('.', 1)[1].lower()}={v}" for k, v in delta.items() if k.startswith("acks.")]
    if "state_records" in delta:
        shown.append(f"state_records={delta['state_records']}")
    return "broker: " + " ".join(shown)


# The warm-up ends with a round in which the broker's JIT compilers spent at most this share of its CPU.
JIT_SETTLED = 0.1

# The requests a row's extra column names (the others, metadata and heartbeats, are noise at this scale).
BROKER_REQUESTS = ("ShareFetch", "ShareAcknowledge", "ShareGroupHeartbeat", "Fetch", "Produce", "AddPartitionsToTxn",
                   "EndTxn", "InitProducerId", "ListOffsets", "OffsetCommit")


def perf_report(data, text):
    """Writes the hottest symbols of a `perf record` file DATA (self time, by shared object and symbol) to TEXT."""
    r = subprocess.run(["perf", "report", "-q", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,symbol",
                        "--percent-limit", "0.3"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if r.returncode != 0:
        note(f"perf report failed on {data}")
    # Each line is padded to the terminal's width with empty columns after the symbol.
    Path(text).write_text("".join(re.sub(r"(\s+-)*\s*$", "", line) + "\n" for line in r.stdout.splitlines()))


def join_extra(*parts):
    return " ".join(p for p in parts if p)


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except ValueError as e:
        raise Die(f"{path}: not JSON ({e})") from None


def sharehost_extra(poll_cpu, rejected, metrics):
    """The diagnostics of a sharehost row: what polling cost, records rejected, and from the hosts' final /metrics
    the acknowledgements refused, records released by the broker, share sessions reset, for a run that wrote
    outputs, their produce requests and the mean time of one (writes=, write_ms=), and for a traced run the spans
    ended and exported by then (spans_ended=, spans_exported=)."""
    acks_failed = metric_sum(metrics, "sharehost_acknowledged_offsets_total", 'result="failed"')
    text = (f"poller_cpu_s={poll_cpu:.2f} rejected={rejected} acks_failed={number_text(acks_failed)}"
            f" released_by_broker={number_text(metric_sum(metrics, 'sharehost_released_by_broker_total'))}"
            f" session_resets={number_text(metric_sum(metrics, 'sharehost_session_resets_total'))}")
    writes = metric_sum(metrics, "sharehost_write_seconds_count", 'kind="output"')
    if writes > 0:
        # The mean time of an output write (a produce request and its answer), over every host of the run.
        mean_ms = 1000 * metric_sum(metrics, "sharehost_write_seconds_sum", 'kind="output"') / writes
        text += f" writes={number_text(writes)} write_ms={mean_ms:.2f}"
    ended = metric_sum(metrics, "sharehost_trace_spans_total", 'outcome="ended"')
    if ended > 0:
        # When every record was judged: a span still queued then is sent later, or dropped if the queue was full.
        exported = metric_sum(metrics, "sharehost_trace_spans_total", 'outcome="exported"')
        text += f" spans_ended={number_text(ended)} spans_exported={number_text(exported)}"
    return text


def row_status(kind, group, lag, records, read, failed):
    """ok, or why the row failed: a share group left with lag beyond what a quota run leaves, no lag shown, a peer
    that exited with an error."""
    status = "ok"
    if kind != "classic":
        if lag == "-":
            status = f"failed: ShareGroupCommand shows no lag for the group (see {group}.describe)"
        elif lag > records - read:
            status = f"failed: lag {lag} after reading {read} of {records} (not acknowledged)"
    if failed:
        status = f"failed: {failed}"
    return status


# --- the run ---------------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, cfg, environ):
        self.cfg = cfg
        self.environ = environ
        self.out = REPO / "target" / "bench" / bench_host.utc_stamp()
        self.out.mkdir(parents=True, exist_ok=True)
        self.broker = None
        self.live = []  # the processes of the run in progress: a run that failed half-way leaves them to be stopped
        self.services = []  # dev/registry, dev/otelcol when this run started them

    # --- preparation ---

    def prepare(self):
        cfg = self.cfg
        if not os.access("/usr/bin/time", os.X_OK):
            raise Die("/usr/bin/time is needed for CPU and peak RSS (apt-get install time)")
        self.broker = bench_host.Broker(say=note)
        self.broker.attach(busy_wait_s=cfg.port_wait)
        if cfg.broker_cpus:
            # Every thread of the running broker (-a), so its share path is the slower side of a 2-core machine.
            if subprocess.call(["taskset", "-a", "-p", "-c", cfg.broker_cpus, str(self.broker.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) != 0:
                raise Die(f"taskset could not pin the broker (pid {self.broker.pid}) to CPUs {cfg.broker_cpus}")
        note("building sharehost and pipeline_bench (release), and the guests")
        built = bench_host.build_release(bins=("sharehost",), examples=("pipeline_bench",))
        self.sharehost, self.pipeline_bench = built["sharehost"], built["pipeline_bench"]
        self.guests = bench_host.build_guests(self.out / "build-guests.log",
                                              ("accept_all", "value_reader", "order_validator", "splitter"))
        self.fleet_components = {}
        if any(cfg.has(k) for k in FLEET_KINDS):
            # A key of this run's own signs the fleet host's components, as an operator's would.
            self.quiet([self.sharehost, "fleet", "keygen", self.out / "fleet-key"], "sharehost fleet keygen failed")
            for name in ("accept_all", "splitter"):
                signed = self.out / f"{name}.fleet.wasm"
                shutil.copy(self.guests[name], signed)
                self.quiet([self.sharehost, "fleet", "sign", signed, "--key",
                            self.out / "fleet-key" / "operator.key"], "sharehost fleet sign failed")
                self.fleet_components[name] = signed
            pub = (self.out / "fleet-key" / "operator.pub").read_text().splitlines()
            if not pub:
                raise Die(f"{self.out}/fleet-key/operator.pub is empty")
            self.fleet_key = pub[-1]
        if (cfg.has("native-reader") or cfg.has("native-validator")) and \
                "PIPELINE_BENCH_HANDLER" not in (REPO / "host/examples/pipeline_bench.rs").read_text():
            raise Die("host/examples/pipeline_bench.rs has no PIPELINE_BENCH_HANDLER: the native plugin rows need it")
        self.krafka_bin = cfg.peers_target / "release" / "krafka-share-bench"
        if cfg.has("krafka"):
            # --locked: exactly the committed Cargo.lock (krafka =0.28.1 and everything under it).
            note(f"building the krafka peer (release; about 15 min the first time, into {cfg.peers_target})")
            rc = subprocess.call(["cargo", "build", "--release", "--locked", "--quiet", "--manifest-path",
                                  str(KRAFKA_PEER / "Cargo.toml")], env=dict(os.environ,
                                                                            CARGO_TARGET_DIR=str(cfg.peers_target)))
            if rc != 0:
                raise Die("building bench/peers/krafka failed")
            if not os.access(self.krafka_bin, os.X_OK):
                raise Die(f"no {self.krafka_bin} after the build")
        if cfg.has("rdkafka"):
            self.rdkafka_venv()
        if cfg.has("wasm-avro"):
            status = self.service("registry")
            self.registry_url = next((line.split(": ", 1)[1] for line in status.splitlines()
                                      if line.startswith("url: ")), None)
            self.registry_password = next((line.rsplit("password: ", 1)[1] for line in status.splitlines()
                                           if "password: " in line), None)
            if not self.registry_url or not self.registry_password:
                raise Die(f"dev/registry status did not say its url and password:\n{status}")
        if any(cfg.has(k) for k in TRACE_SAMPLE):
            self.service("otelcol")
            self.collector = f"http://127.0.0.1:{os.environ.get('OTELCOL_OTLP_HTTP_PORT') or 14318}"

    def service(self, name):
        """dev/NAME (registry, otelcol) running: the one this checkout runs, or one started now and stopped at the
        end. Its `status` output."""
        tool = REPO / "dev" / name
        status = subprocess.run([str(tool), "status"], capture_output=True, text=True)
        if status.returncode != 0:
            note(f"starting dev/{name} (stopped at the end)")
            with open(self.out / f"{name}.log", "w") as log:
                if subprocess.call([str(tool), "up"], stdout=log, stderr=subprocess.STDOUT) != 0:
                    raise Die(f"dev/{name} up failed (see {self.out}/{name}.log)")
            self.services.append(tool)
            status = subprocess.run([str(tool), "status"], capture_output=True, text=True)
        return status.stdout

    def quiet(self, argv, failure):
        if subprocess.call(list(map(str, argv)), stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL) != 0:
            raise Die(failure)

    def rdkafka_venv(self):
        """The venv is made again whenever the pinned requirements change (a copy of them marks a finished
        install)."""
        req, mark = RDKAFKA_PEER / "requirements.txt", PEERS_VENV / "requirements.installed"
        if mark.is_file() and filecmp.cmp(req, mark, shallow=False):
            return
        note(f"installing the rdkafka peer's venv ({PEERS_VENV}: {' '.join(req.read_text().split())})")
        shutil.rmtree(PEERS_VENV, ignore_errors=True)
        if subprocess.call([sys.executable, "-m", "venv", str(PEERS_VENV)]) != 0:
            raise Die("python3 -m venv failed")
        if subprocess.call([str(PEERS_VENV / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                            "-r", str(req)]) != 0:
            raise Die(f"pip install -r {req} failed")
        shutil.copy(req, mark)

    def machine(self):
        cfg, environ = self.cfg, self.environ
        dirty = ""
        changed = bench_host.changed_files()
        if changed:
            mine = bench_host.changed_files("host", "bench", "dev/bench")
            dirty = (f" (dirty: {len(changed)} files differ from the commit; under host/, bench/ or dev/bench: "
                     f"{' '.join(mine) or 'none'})")
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, errors="replace")
        rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True, errors="replace")
        lines = [f"date: {bench_host.utc_stamp('%Y-%m-%dT%H:%M:%SZ')}", f"commit: {bench_host.commit()}{dirty}",
                 f"command: {command_line(environ)}", *bench_host.machine_lines(),
                 f"kafka: {self.broker.version} at {self.broker.bootstrap}",
                 f"java: {(java.stderr + java.stdout).splitlines()[0] if (java.stderr + java.stdout) else '?'}",
                 f"rustc: {rustc.stdout.strip()}"]
        if cfg.has("krafka"):
            lines.append(f"krafka: {krafka_version((KRAFKA_PEER / 'Cargo.lock').read_text())}")
        if cfg.has("rdkafka"):
            v = subprocess.run([str(PEERS_VENV / "bin" / "python"), "-c", "import confluent_kafka as c; "
                                "print(c.version(), 'librdkafka', c.libversion()[0])"],
                               capture_output=True, text=True)
            lines.append(f"confluent-kafka: {v.stdout.strip()}")
        if cfg.broker_cpus:
            lines.append(f"broker pinned to CPUs: {cfg.broker_cpus} (taskset)")
        lines.append(f"load at start: {bench_host.load_now(3)}")
        text = "\n".join(lines) + "\n"
        (self.out / "machine.txt").write_text(text)
        sys.stderr.write(text)

    # --- topics and groups ---

    def produce(self, topic, size, count):
        """A fresh topic filled by Apache's producer benchmark from the order payloads of SIZE. The round-robin
        partitioner puts exactly COUNT/PARTITIONS records on every partition, so every process of a run has the same
        share to read."""
        b, out = self.broker, self.out
        payloads = out / f"orders-{size}b.txt"
        if not payloads.is_file():
            payloads.write_text("\n".join(order_payloads(size)) + "\n")
        b.create_topic(topic, self.cfg.partitions, out / f"{topic}.create.log")
        rc, text = b.tool("org.apache.kafka.tools.ProducerPerformance", "--bootstrap-server", b.bootstrap, "--topic",
                          topic, "--num-records", count, "--payload-file", payloads, "--throughput", "-1",
                          "--command-property", "acks=1", "linger.ms=5", "batch.size=262144",
                          "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
                          log=out / f"{topic}.produce.log")
        if rc != 0:
            sys.stderr.write("\n".join(text.splitlines()[-20:]) + "\n")
            raise Die(f"producing to {topic} failed")
        self.check_filled(topic, size, count)

    def produce_avro(self, topic, size, count):
        """A fresh topic of COUNT Avro orders of SIZE bytes, in the registry's wire format: 1000 orders encoded by
        Confluent's serializer (which registers AVRO_ORDER under TOPIC-value), written round-robin without
        compression (as ProducerPerformance writes the raw topic) by `sharehost produce`, a chunk at a time."""
        b, out = self.broker, self.out
        schema = out / "bench-order.avsc"
        schema.write_text(json.dumps(AVRO_ORDER))
        encoded = subprocess.run(
            [sys.executable, str(REPO / "dev" / "schema_records.py"), "encode", "--registry", self.registry_url,
             "--registry-user-info", f"sharehost:{self.registry_password}", "--format", "avro", "--schema",
             str(schema), "--topic", topic],
            input="".join(json.dumps(o) + "\n" for o in avro_orders(size)), capture_output=True, text=True)
        if encoded.returncode != 0:
            raise Die(f"dev/schema_records.py encode: {encoded.stderr.strip()}")
        values = [json.loads(line)["value"]["base64"] for line in encoded.stdout.splitlines() if line.strip()]
        if len(values) != 1000 or any(len(base64.b64decode(v)) != size for v in values):
            raise Die(f"the Avro orders of {size} B came out another size or count")
        lines = [json.dumps({"value": {"base64": v}}) + "\n" for v in values]
        b.create_topic(topic, self.cfg.partitions, out / f"{topic}.create.log")
        written = 0
        with open(out / f"{topic}.produce.log", "w") as log:
            while written < count:
                n = min(AVRO_PRODUCE_CHUNK - AVRO_PRODUCE_CHUNK % self.cfg.partitions, count - written)
                text = "".join(lines[(written + i) % len(lines)] for i in range(n))
                done = subprocess.run([str(self.sharehost), "produce", topic, "--bootstrap", b.bootstrap,
                                       "--compression", "none"], input=text, text=True, stdout=log, stderr=log)
                if done.returncode != 0:
                    raise Die(f"sharehost produce to {topic} failed (see {out}/{topic}.produce.log)")
                written += n
        self.check_filled(topic, size, count)

    def check_filled(self, topic, size, count):
        """TOPIC holds COUNT records (its end offsets written to TOPIC.offsets)."""
        b, out = self.broker, self.out
        rc, text = b.tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", b.bootstrap, "--topic",
                          topic)
        if rc != 0:
            sys.stderr.write(text)
            raise Die(f"cannot read the end offsets of {topic}")
        (out / f"{topic}.offsets").write_text(text if text.endswith("\n") else text + "\n")
        offsets = parse_end_offsets(text, f"{topic}.offsets")
        if sum(offsets) != count:
            raise Die(f"{topic} holds {sum(offsets)} records, expected {count}")
        note(f"produced {count} records of {size} B to {topic}; per partition: {' '.join(map(str, offsets))} ")

    def fresh_group(self, group):
        self.broker.share_earliest(group, self.out / f"{group}.config.log")

    def share_lag(self, group, once):
        """The sum of the group's per-partition lag as ShareGroupCommand describes it ("-" when it shows none or a
        partition's lag is unknown). Asked again a second apart until 0 or SHARE_LAG_WAIT_S ("once": a run with
        quotas, whose lag stays above 0)."""
        t0 = time.monotonic()
        while True:
            _, text = self.broker.tool("org.apache.kafka.tools.consumer.group.ShareGroupCommand",
                                       "--bootstrap-server", self.broker.bootstrap, "--describe", "--group", group)
            (self.out / f"{group}.describe").write_text(text)
            lag = bench_host.share_group_lag(text, group)
            if lag == 0 or once or time.monotonic() - t0 >= SHARE_LAG_WAIT_S:
                return "-" if lag is None else lag
            time.sleep(1)

    # --- the consumers ---

    def start(self, argv, name, env=None):
        host = Host(argv, None, self.out / f"{name}.out", self.out / f"{name}.err", env=env,
                    time_report=self.out / f"{name}.time")
        self.live.append(host)
        return host

    def wait_all(self, procs, what):
        """The exit status of each process (each bounded by the tools' own timeout plus a grace)."""
        codes = []
        for p in procs:
            try:
                codes.append(p.proc.wait(timeout=JAVA_TIMEOUT_MS / 1000 + PROCESS_GRACE_S))
            except subprocess.TimeoutExpired:
                raise Die(f"{what}: a process still ran {JAVA_TIMEOUT_MS // 1000 + PROCESS_GRACE_S}s after its "
                          "start") from None
        self.live = []
        return codes

    def run_sharehost(self, kind, topic, group, procs, records):
        """wasm* = `sharehost run` with the kind's component, native* = pipeline_bench with the kind's native twin;
        the same manifest. Polls the counters until every record is judged, then SIGTERMs them all (they drain)."""
        cfg, out = self.cfg, self.out
        extra = cfg.manifest_extra
        if kind == "wasm-fleet":
            component, handler = self.fleet_components["accept_all"], "accept-all"
        elif kind.endswith("splitter"):
            fleet = kind in FLEET_KINDS
            component, handler = (self.fleet_components if fleet else self.guests)["splitter"], "splitter"
            if kind == "wasm-eo-splitter":
                extra = f'{extra.rstrip(chr(10))}\nguarantee = "exactly-once"\n'.lstrip("\n")
            extra = splitter_outputs(extra, group)
            for name in SPLITTER_OUTPUTS:
                self.broker.create_topic(output_topic(group, name), cfg.partitions, out / f"{group}.topics.log")
        elif kind.endswith("-reader"):
            component, handler = self.guests["value_reader"], "value-reader"
        elif kind.endswith("-validator"):
            component, handler = self.guests["order_validator"], "order-validator"
        else:
            component, handler = self.guests["accept_all"], "accept-all"
        env = {"PIPELINE_BENCH_HANDLER": handler}
        if kind == "wasm-avro":
            extra = (f'{extra.rstrip(chr(10))}\n[pipeline.schema]\nregistry = "{self.registry_url}"\nvalue = "avro"\n'
                     'username = "sharehost"\npassword = { env = "REGISTRY_PASSWORD" }\n').lstrip("\n")
            env["REGISTRY_PASSWORD"] = self.registry_password
        binary = [self.sharehost, "run"] if kind.startswith("wasm") else [self.pipeline_bench]
        ports = [cfg.admin_port + i for i in range(procs)]
        for i, port in enumerate(ports):
            if bench_host.port_in_use(port):
                raise Die(f"admin port {port} is taken (set BENCH_ADMIN_PORT)")
            head = fleet_manifest_head(self.fleet_key, f"bench-{i}", group) if kind in FLEET_KINDS else ""
            if kind in TRACE_SAMPLE:
                head = (f'[telemetry]\notlp_endpoint = "{self.collector}"\nsample = {TRACE_SAMPLE[kind]}\n'
                        f'service_name = "{group}"\n')
            text = bench_host.manifest(self.broker.bootstrap, port, [bench_host.Pipeline(
                "bench", [topic], group, str(component), extra)], before=head)
            (out / f"{group}.{i}.toml").write_text(text)
        r = Reading(t0=now_us())
        hosts = []
        for i, port in enumerate(ports):
            name = f"{group}.{i}"
            host = Host([*binary, out / f"{name}.toml"], port, out / f"{name}.out", out / f"{name}.err",
                        env=env, time_report=out / f"{name}.time")
            self.live.append(host)
            hosts.append(host)
        profilers = ([self.perf_attach(h, out / f"{group}.{i}.perf.data") for i, h in enumerate(hosts)]
                     if cfg.perf else [])
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        first = None
        last_total, last_change = 0, r.t0
        gap = 20000  # every 20 ms until the first record (its time is the start of the steady phase), then adaptive
        while True:
            total = sum(h.judged() or 0 for h in hosts)
            t = now_us()
            if total >= records:
                r.last = t
                first = t if first is None else first
                break
            if not all(h.running() for h in hosts):
                for h in hosts:
                    h.tail()
                raise Die(f"a {kind} process of {group} exited early")
            if first is None and total > 0:
                # The first records: the rate is measured from here (the group join before them is no rate).
                first, last_total, last_change = t, total, t
            elif total > last_total:
                gap = next_gap_us(records, total, last_total, t, last_change)
                last_total, last_change = total, t
            elif t - last_change > cfg.idle_timeout * 1_000_000:
                raise Die(f"{kind} in {group}: no progress for {cfg.idle_timeout}s at {total} of {records} records")
            time.sleep(gap / 1e6)
        r.first, r.read = first, total
        # What polling cost this process (it shares the machine with the consumers).
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        poll_cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
        # The final counters (acks confirmed or refused, sessions reset, records released by the broker), then drain.
        for i, h in enumerate(hosts):
            h.save(out / f"{group}.{i}")
        for i, p in enumerate(profilers):
            if p is not None:
                p.send_signal(signal.SIGINT)
                p.wait()
                perf_report(out / f"{group}.{i}.perf.data", out / f"{group}.{i}.perf.txt")
        for h in hosts:
            h.terminate()
        for h in hosts:
            if h.wait_exit(DRAIN_LIMIT_S, f"a {kind} process of {group}") != 0:
                raise Die(f"a {kind} process of {group} failed (see {out}/{group}.*.err)")
        self.live = []
        add_times(r, [out / f"{group}.{i}.time" for i in range(procs)])
        if kind.endswith("splitter"):
            # The outputs are the run's own: the broker's disk does not keep a copy of every run.
            for name in SPLITTER_OUTPUTS:
                self.broker.delete_topic(output_topic(group, name), out / f"{group}.topics.log")
            if kind == "wasm-eo-splitter":
                self.broker.delete_topic(f"sharehost-settled.{group}", out / f"{group}.topics.log")
        rejected = 0
        metrics = ""
        for i in range(procs):
            p = out / f"{group}.{i}.pipelines.json"
            if p.is_file():
                rejected += bench_host.judged_counts(read_json(p), p)[1]
            m = out / f"{group}.{i}.metrics"
            if m.is_file():
                metrics += m.read_text(errors="replace")
        r.extra = sharehost_extra(poll_cpu, rejected, metrics)
        return r

    def perf_attach(self, host, data):
        """`perf record` (999 Hz, no call graph) attached to HOST's process once it has one, into DATA; None when it
        exits before that."""
        while not host.host_pids():
            if not host.running():
                return None
            time.sleep(0.01)
        return subprocess.Popen(["perf", "record", "-q", "-F", "999", "-o", str(data), "-p",
                                 str(host.host_pids()[0])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def java_tool_argv(self, cls, topic, group, quota, detailed):
        b = self.broker
        args = ["--bootstrap-server", b.bootstrap, "--topic", topic, "--group", group, "--num-records", quota,
                "--timeout", JAVA_TIMEOUT_MS]
        if detailed:
            # Detailed stats print a progress line at the first poll that returns records once a reporting interval
            # has passed; the group join takes longer than that, so the first line marks the first records.
            args += ["--show-detailed-stats", "--reporting-interval", "1000"]
        args += ["--date-format", DATE_FORMAT, *self.cfg.java_args]
        return b.tool_cmd(cls, *args, jvm=JAVA_STOCK_FLAGS)

    def run_tool(self, kind, topic, group, procs):
        """java: ShareConsumerPerformance; classic: ConsumerPerformance in a fresh consumer group (it starts from the
        earliest offset unless told --from-latest)."""
        cls, parse = {"java": ("org.apache.kafka.tools.ShareConsumerPerformance", parse_share_perf),
                      "classic": ("org.apache.kafka.tools.ConsumerPerformance", parse_consumer_perf)}[kind]
        tool = cls.rsplit(".", 1)[1]
        quota = self.cfg.quota(procs)
        r = Reading(t0=now_us())
        procs_ = [self.start(self.java_tool_argv(cls, topic, group, quota, kind == "java"), f"{group}.{i}")
                  for i in range(procs)]
        if any(self.wait_all(procs_, f"{tool} in {group}")):
            raise Die(f"{tool} failed in {group} (see {self.out}/{group}.*.err)")
        results = [parse((self.out / f"{group}.{i}.out").read_text(errors="replace"), self.out / f"{group}.{i}.out")
                   for i in range(procs)]
        r.read = sum(x.records for x in results)
        r.last = max(x.last_us for x in results)
        firsts = [x.first_us for x in results if x.first_us is not None]
        r.first = min(firsts) if firsts else r.t0
        add_times(r, [self.out / f"{group}.{i}.time" for i in range(procs)])
        if r.read < quota * procs:
            raise Die(f"{tool} read {r.read} records in {group}, expected {quota * procs}")
        r.extra = f"quota={quota}" + (f" join_ms={results[-1].join_ms}" if kind == "classic" else "")
        return r

    def run_peer(self, kind, topic, group, procs):
        """krafka or rdkafka (bench/peers/): each process reads its quota, prints launch_us, first_us, last_us,
        records and commit_failures, and closes. A peer that does not work is a failed row, not the end of the
        whole run."""
        quota = self.cfg.quota(procs)
        cmd = peer_argv(kind, self.krafka_bin, self.broker.bootstrap, topic, group, quota)
        r = Reading(t0=now_us())
        procs_ = [self.start(cmd, f"{group}.{i}") for i in range(procs)]
        if any(self.wait_all(procs_, f"the {kind} peer in {group}")):
            r.failed = f"the {kind} peer exited with an error (see {group}.*.err)"
            for p in procs_:
                p.tail(5)
            r.first = r.last = r.t0
            r.extra = f"quota={quota}"
            add_times(r, [self.out / f"{group}.{i}.time" for i in range(procs)])
            return r
        results = [parse_peer((self.out / f"{group}.{i}.out").read_text(errors="replace"),
                              self.out / f"{group}.{i}.out") for i in range(procs)]
        r.read = sum(x.records for x in results)
        r.first = min(x.first_us for x in results)
        r.last = max(x.last_us for x in results)
        add_times(r, [self.out / f"{group}.{i}.time" for i in range(procs)])
        if r.read < quota * procs:
            raise Die(f"the {kind} peer read {r.read} records in {group}, expected {quota * procs}")
        r.extra = f"quota={quota} commit_failures={sum(x.commit_failures for x in results)}"
        return r

    def run_kind(self, kind, topic, group, procs, records):
        if kind in ("classic", "java"):
            return self.run_tool(kind, topic, group, procs)
        if kind in ("krafka", "rdkafka"):
            return self.run_peer(kind, topic, group, procs)
        return self.run_sharehost(kind, topic, group, procs, records)

    # --- the whole run ---

    def run(self):
        cfg, out = self.cfg, self.out
        self.prepare()
        self.machine()
        stamp = bench_host.utc_stamp("%H%M%S")
        # Warm-up, not measured: the first share group on a fresh broker creates the share-coordinator state topic
        # and runs the broker's share-fetch path cold, and its JIT compilers go on compiling that path for tens of
        # seconds of traffic (on 2 cores most of the broker's CPU): whichever rows came first would pay for that.
        if cfg.warmup > 0:
            self.warm_up(stamp)
        results = out / "results.tsv"
        results.write_text("\t".join(RESULTS_HEADER) + "\n")
        for size, runs in schedule(cfg):
            topic = f"bench-{size}b-{stamp}"
            self.produce(topic, size, cfg.records)
            avro_topic = None
            if any(kind == "wasm-avro" for _, kind in runs):
                avro_topic = f"bench-{size}b-avro-{stamp}"
                self.produce_avro(avro_topic, size, cfg.records)
            for procs, kind in runs:
                source = avro_topic if kind == "wasm-avro" else topic
                group = f"bench-{kind}-{size}b-{procs}p-{stamp}"
                if kind != "classic":
                    self.fresh_group(group)
                load = bench_host.load_now()
                note(f"{kind}, {procs} process(es): reading {source} in group {group} (load {load})")
                row = f"{kind}-{size}b-{procs}p"
                c0 = self.broker.counters()
                profiling = cfg.jfr and self.broker.profile_start(row)
                b0 = bench_host.cpu_ticks(self.broker.pid)
                threads0 = bench_host.thread_ticks(self.broker.pid)
                r = self.run_kind(kind, source, group, procs, cfg.records)
                broker_s = (bench_host.cpu_ticks(self.broker.pid) - b0) / bench_host.CLK_TCK
                jit_s = self.broker_threads(row, threads0, broker_s)
                if profiling:
                    self.hot_methods(row)
                r.extra = join_extra(r.extra, broker_extra(bench_host.counters_delta(c0, self.broker.counters())),
                                     f"broker_jit_s={jit_s:.2f}")
                # Did the share group really acknowledge what it read? A run with quotas leaves RECORDS - READ
                # behind at most.
                lag = "-"
                if kind != "classic":
                    lag = self.share_lag(group, once=procs > 1 and not kind.startswith(("wasm", "native")))
                status = row_status(kind, group, lag, cfg.records, r.read, r.failed)
                note(f"{kind}, {procs} process(es): {r.read} records, first after {(r.first - r.t0) // 1000} ms, all "
                     f"in {(r.last - r.t0) // 1000} ms ({(r.last - r.first) // 1000} ms from the first record), cpu "
                     f"{r.cpu_s:.2f}s, peak rss {r.rss_kb // 1024} MiB, broker cpu {broker_s:.2f}s, lag {lag}: "
                     f"{status}; {r.extra}")
                with open(results, "a") as f:
                    f.write(result_row(size, procs, kind, r, broker_s, load, lag, status))
            for t in (topic, avro_topic):
                if t is not None:
                    self.broker.delete_topic(t, out / f"{t}.create.log")
        with open(out / "machine.txt", "a") as f:
            f.write(f"load at end: {bench_host.load_now(3)}\n")
        table(out, cfg.docs)

    def warm_up(self, stamp):
        """Reads a warm-up topic through fresh share groups until a round's broker CPU is under JIT_SETTLED
        compilation, at most BENCH_WARMUP_ROUNDS rounds; each round's figures go to machine.txt."""
        cfg, out = self.cfg, self.out
        n = cfg.warmup - cfg.warmup % cfg.partitions
        topic = f"bench-warmup-{stamp}"
        self.produce(topic, 100, n)
        settled = False
        for round_ in range(1, cfg.warmup_rounds + 1):
            group = f"{topic}-{round_}"
            self.fresh_group(group)
            before = bench_host.thread_ticks(self.broker.pid)
            self.run_sharehost("wasm", topic, group, 1, n)
            spent = bench_host.thread_cpu(before, bench_host.thread_ticks(self.broker.pid), self.broker.threads())
            total, jit = sum(t for _, t in spent), sum(t for g, t in spent if "CompilerThread" in g)
            line = (f"warm-up round {round_}: {n} records, broker CPU {total:.2f} s, of which its JIT compilers "
                    f"{jit:.2f} s")
            note(line)
            with open(out / "machine.txt", "a") as f:
                f.write(line + "\n")
            if jit <= JIT_SETTLED * total:
                settled = True
                break
        if not settled:
            note(f"the broker's JIT compilers had not settled after {cfg.warmup_rounds} warm-up rounds: the rows' "
                 "broker CPU includes compilation (<row>.threads.txt shows how much)")
        self.broker.delete_topic(topic, out / f"{topic}.create.log")

    def broker_threads(self, row, before, broker_s):
        """Writes where the broker's CPU of ROW went, by thread (request handlers, network, share coordinator, GC,
        JIT compiler...), into <row>.threads.txt (a Java profile sees only the Java threads' Java frames); returns
        the seconds its JIT compilers took."""
        spent = bench_host.thread_cpu(before, bench_host.thread_ticks(self.broker.pid), self.broker.threads())
        lines = [f"broker CPU by thread during {row}: {broker_s:.2f} s in all (threads that ended meanwhile are "
                 "left out)", "", "thread (numbers as #)\tCPU s\t% of all"]
        lines += [f"{g}\t{t:.2f}\t{100 * t / max(broker_s, 1e-9):.1f}" for g, t in spent]
        (self.out / f"{row}.threads.txt").write_text("\n".join(lines) + "\n")
        return sum(t for g, t in spent if "CompilerThread" in g)

    def hot_methods(self, row):
        """Stops the broker's recording of ROW into <row>.jfr and writes its hottest methods to <row>.hot.txt."""
        jfr = self.out / f"{row}.jfr"
        if not self.broker.profile_stop(row, jfr):
            note(f"{row}: the broker's JFR recording could not be written")
            return
        printed = subprocess.run(["jfr", "print", "--json", "--stack-depth", "64", "--events", "jdk.ExecutionSample",
                                  str(jfr)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if printed.returncode != 0:
            note(f"{row}: jfr print failed on {jfr}")
            return
        hot, inclusive, samples = bench_host.hot_methods(printed.stdout)
        pct = lambda n: f"{100 * n / max(samples, 1):.1f}"  # noqa: E731
        lines = [f"{samples} execution samples of the broker's threads during {row}", "",
                 "by self time: method, self %, on-stack %"]
        lines += [f"{m}\t{pct(c)}\t{pct(t)}" for m, c, t in hot]
        lines += ["", "by time on the stack: method, on-stack %"]
        lines += [f"{m}\t{pct(t)}" for m, t in inclusive]
        (self.out / f"{row}.hot.txt").write_text("\n".join(lines) + "\n")

    def cleanup(self):
        for p in self.live:
            p.kill()
        self.live = []
        if self.broker is not None:
            self.broker.close()
        for tool in self.services:
            subprocess.call([str(tool), "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.services = []


def peer_argv(kind, krafka_bin, bootstrap, topic, group, quota):
    base = [str(krafka_bin)] if kind == "krafka" else [str(PEERS_VENV / "bin" / "python"),
                                                       str(RDKAFKA_PEER / "share_bench.py")]
    return [*base, bootstrap, topic, group, str(quota)]


def schedule(cfg):
    """The run's order: per size, the (processes, kind) runs on its topic. Who goes first rotates from one (size,
    processes) to the next: a run right after producing, or right after another consumer warmed the broker's caches,
    is measurably different."""
    combo = 0
    for size in cfg.sizes:
        runs = []
        for procs in cfg.all_processes():
            order = [k for k in cfg.kinds if procs in cfg.kind_processes(k)]
            if not order:
                continue
            shift = combo % len(order)
            combo += 1
            runs += [(procs, k) for k in order[shift:] + order[:shift]]
        yield size, runs


def table(run_dir, docs):
    """RUN_DIR/table.md from its results.tsv (and, with DOCS, docs/benchmarks.md's One table), then the table on
    stdout."""
    try:
        bench_table.render(run_dir)
        if docs:
            bench_table.write_docs(run_dir, REPO / "docs" / "benchmarks.md")
            note("table written to docs/benchmarks.md")
    except (bench_table.BadInput, OSError) as e:
        raise Die(str(e)) from None
    summary = f"\n{(run_dir / 'table.md').read_text()}\nraw results: {run_dir} (results.tsv, logs, manifests, time " \
              "reports, group descriptions)\n"
    (run_dir / "summary.txt").write_text(summary)
    sys.stdout.write(summary)


def retable(run_dir, docs):
    """BENCH_RETABLE: only render RUN_DIR's table again (e.g. after a change to the table's code), run nothing."""
    run_dir = Path(run_dir)
    if not ((run_dir / "results.tsv").is_file() and (run_dir / "machine.txt").is_file()):
        raise Die(f"no results.tsv and machine.txt in {run_dir}")
    try:
        bench_table.render(run_dir)
        sys.stdout.write((run_dir / "table.md").read_text())
        if docs:
            bench_table.write_docs(run_dir, REPO / "docs" / "benchmarks.md")
    except (bench_table.BadInput, OSError) as e:
        raise Die(str(e)) from None


def main(argv, environ=os.environ):
    if argv and argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(__doc__)
        return 0
    if argv:
        print(f"{NAME}: error: dev/bench takes no arguments (settings are environment variables; dev/bench --help)",
              file=sys.stderr)
        return 2

    # SIGTERM ends the run as Ctrl-C does: the consumers and an own broker are stopped on the way out.
    def body(on_exit):
        os.chdir(REPO)
        if environ.get("BENCH_RETABLE"):
            retable(environ["BENCH_RETABLE"], env(environ, "BENCH_DOCS", "0") == "1")
            return 0
        cfg = config_from_env(environ)
        bench = Bench(cfg, environ)
        on_exit(bench.cleanup)
        bench.run()
        return 0

    return bench_host.driver_main(NAME, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
