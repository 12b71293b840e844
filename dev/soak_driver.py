#!/usr/bin/env python3
"""dev/soak's program: the soak run (results go to docs/benchmarks.md, "Soak").

One release host (`sharehost run`, one pipeline) under a steady load for SOAK_MINUTES, with a hot swap every
SOAK_SWAP_EVERY minutes and a broker restart half-way; every SOAK_SAMPLE_EVERY seconds it samples the host's RSS,
open file descriptors, in-flight records and records/s into a CSV, draws them as a PNG, and checks two things at the
end:
  * nothing lost: every id produced to the input topic was accepted or dead-lettered, by a ledger kept OUTSIDE the
    engine (phase 4);
  * no memory growth: the RSS rule (phase 5).
Not part of the test command: it takes SOAK_MINUTES plus about 3 minutes.

Phases:
  1. peak: unless SOAK_RATE is given, a topic is pre-filled with SOAK_PEAK_RECORDS ids and one host (the same
     manifest as the soak) reads it in a fresh share group; peak = records / (last accept - first accept), from the
     admin endpoint's per-version `accepted` counters polled every 0.5 s. The soak rate is SOAK_LOAD_PCT % of it.
     This is the host's peak with the soak's plugin and nothing else running; during the soak the producer shares
     the cores with it and the broker.
  2. soak: Apache's ProducerPerformance (--payload-monotonic, so record values are the decimal ids 0..N-1,
     --throughput RATE, acks=all, idempotent, delivery.timeout.ms 10 min so a broker restart costs it nothing)
     writes RATE*SOAK_MINUTES*60 ids to a fresh topic (SOAK_PARTITIONS partitions); one host reads it. The plugin is
     the fault suite's ledger (tests/fixtures/guests/ledger, target/guests/fixture_ledger.wasm) with `emit-to`: each
     record emits its id to the output topic before its verdict (accept), and the host produces only the emits of
     accepted records. Swaps (POST /pipelines/soak/swap) alternate between that component (A) and a copy of it with
     one custom section appended (B: the same code, another content hash), at every SOAK_SWAP_EVERY minutes before
     the end; each must answer 200 with a new active version. B is put into the precompiled cache first by
     `sharehost check` (SOAK_PRECOMPILE=0: not; then the first swap compiles inside the host, which leaves a
     one-time RSS step of ~13 MiB). At SOAK_RESTART_AT (after that tick's swap, if any) the broker is stopped
     (`dev/kafka stop-broker`, SIGTERM, data kept) and started again (`dev/kafka start-broker`): the host must
     reconnect by itself. Recovery = broker back up -> the host's next accepted record (polled every 0.5 s);
     outage = stop issued -> that record.
  3. drain: after the producer ends, wait until the host has judged every produced record (accepted plus
     dead-lettered >= records in the input topic, in_flight 0, counters still for 10 s; at most SOAK_DRAIN_TIMEOUT
     s), then SIGTERM it (it drains).
  4. ledger: the output and dead-letter topics are read back with Apache's ConsoleConsumer (plain Fetch), and the
     input topic too unless it provably holds exactly the ids 0..N-1 (the producer sent N with no failed send,
     idempotent, and the end offsets add up to N; SOAK_READ_INPUT=1 reads it anyway). The ledger counts produced
     (distinct ids in the input topic), accepted (distinct ids in the output topic), dead-lettered, duplicates
     (output records beyond the first per id: at-least-once redeliveries, mostly around the broker restart),
     lost = produced - (accepted or dead-lettered), and foreign outputs (ids never produced). FAIL if lost > 0 or
     foreign > 0. `dev/soak ledger` runs it alone on topics kept with SOAK_KEEP_TOPICS=1.
  5. RSS rule and plot: warm-up W = min(5 min, SOAK_MINUTES/6); baseline = the largest RSS sampled in the last
     minute of the warm-up (t in (W-60 s, W]); FAIL if any later sample exceeds baseline * (1 +
     SOAK_RSS_GROWTH_PCT/100). dev/soak-plot.py draws soak.png from the samples and the rule's figures.
Exit 0 only if every swap succeeded, the host never died, the producer reported no error, nothing was lost and the
RSS rule holds; otherwise 1 with each reason on stderr and in summary.txt.

Broker: a broker this checkout runs with the same KAFKA_*/SHAREHOST_KAFKA_DIR is used (and restarted half-way: it
is this checkout's, so the soak may); otherwise one is started with `dev/kafka up` and removed with `dev/kafka
down` at the end. A port held by anything else (another checkout's broker, which the soak must not restart) is an
error. Defaults keep clear of dev/bench (9092), the fault suite (29092) and dev/chaos (25092), and below the
kernel's ephemeral ports (32768 and up), where the restarted broker could find its port taken.

Needs: java 17+, cargo, python3 with venv (matplotlib and its dependencies are pinned in dev/soak-requirements.txt
and installed into target/soak-venv on first use). No root.

env: SOAK_MINUTES (30)          length of the loaded phase
     SOAK_SWAP_EVERY (5)        minutes between hot swaps (swaps at every multiple before the end)
     SOAK_RESTART_AT (SOAK_MINUTES/2)  minute of the broker restart ("" or "none": no restart)
     SOAK_RATE ("")             records/s to produce; empty: SOAK_LOAD_PCT % of the measured peak
     SOAK_LOAD_PCT (50)         share of the peak to produce at
     SOAK_PEAK_RECORDS (300000) records of the peak measurement
     SOAK_PARTITIONS (6)        partitions of the input and output topics
     SOAK_SAMPLE_EVERY (10)     seconds between samples
     SOAK_RSS_GROWTH_PCT (10)   allowed RSS growth over the warm-up baseline
     SOAK_DRAIN_TIMEOUT (180)   seconds to wait for the host to catch up after the producer ends
     SOAK_ADMIN_PORT (27470)    the host's admin port
     SOAK_MANIFEST_EXTRA ("")   extra lines for the [[pipeline]] table, e.g. "max_in_flight = 3000"
     SOAK_PRECOMPILE (1)        0: do not put component B into the precompiled cache before the soak
     SOAK_READ_INPUT (0)        1: read the input topic back even when the producer's count proves its content
     SOAK_KEEP_TOPICS (0)       1: keep the read-back topics (out.txt, ...) after a passing ledger
     KAFKA_PORT (27092), KAFKA_CONTROLLER_PORT (27093), KAFKA_SASL_SSL_PORT (27094),
     SHAREHOST_KAFKA_DIR (target/kafka-soak)  as for dev/kafka
     CARGO_TARGET_DIR as for cargo; SHAREHOST_LOG for the host (default: info, the plugin's own log lines left out).
Output: target/soak/<UTC stamp>/: samples.csv (t_s, rss_kib, fds, in_flight, accepted_total, records_per_s,
host_cpu_pct, load1, event), soak.png, summary.txt (every figure, the verdict), ledger.json, rss.json, host.log,
producer.log, peak-host.log, events.log/events.csv, manifest.toml, the two components, final-pipelines.json and
final-metrics.txt (the host's last GET /pipelines and /metrics), the topics read back (out.txt, dlq.txt, in.txt;
deleted after a passing ledger unless SOAK_KEEP_TOPICS=1).

Usage: dev/soak                 the run, configured by the environment above
       dev/soak ledger (IN.txt | --range N) OUT.txt DLQ.txt LEDGER.json
                                the ledger alone on topics read back (one decimal id per line)
       dev/soak help            this text

Standard library only (the plot runs in its own venv); its tests are dev/test_soak_driver.py.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REPO = DEV.parent
sys.path.insert(0, str(DEV))
import bench_host  # noqa: E402
import kafka_harness as kh  # noqa: E402

NAME = "dev/soak"
KAFKA = DEV / "kafka"
# How long a host may take to answer on its admin endpoint after its start (it compiles or maps its component first).
START_WAIT_S = 120
# How long a host may take to drain and exit after SIGTERM.
STOP_WAIT_S = 60
# The drain's counters must stay still this long before the host is stopped.
DRAIN_STILL_S = 10
# Upper bounds of the waits: the peak's read, the producer's end after the soak, the host's recovery after the restart.
PEAK_WAIT_S = 300
PRODUCER_WAIT_S = 300
RECOVERY_WAIT_S = 300
POLL_S = 0.5

# A failure that ends the run: "dev/soak: error: MSG" on stderr, exit status 1.
Die = bench_host.Die


def note(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


def now_ms():
    return int(time.monotonic() * 1000)


# --- settings ------------------------------------------------------------------------------------------------------


@dataclass
class Settings:
    minutes: int = 30
    swap_every: int = 5
    restart_s: int | None = 900
    rate: int | None = None
    load_pct: int = 50
    peak_records: int = 300000
    partitions: int = 6
    sample_every: int = 10
    rss_growth_pct: int = 10
    drain_timeout: int = 180
    admin_port: int = 27470
    manifest_extra: str = ""
    precompile: bool = True
    read_input: bool = False
    keep_topics: bool = False

    @property
    def duration_s(self):
        return self.minutes * 60

    def swap_times(self):
        """Seconds since the producer's start at which a swap is due: every SOAK_SWAP_EVERY minutes before the end."""
        step = self.swap_every * 60
        return list(range(step, self.duration_s, step))


def positive(environ, name, default):
    value = environ.get(name) or str(default)
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise Die(f"{name} must be a positive whole number (got '{value}')")
    return int(value)


def parse_restart(value, minutes):
    """SOAK_RESTART_AT: None when unset (half time, in seconds, so an odd SOAK_MINUTES still restarts exactly
    half-way), "" or "none" for no restart, whole minutes, or "Ns" for seconds. Returns seconds or None."""
    if value is None:
        return minutes * 60 // 2
    if value in ("", "none"):
        return None
    if re.fullmatch(r"[0-9]+s", value):
        seconds = int(value[:-1])
    elif re.fullmatch(r"[0-9]+", value):
        seconds = int(value) * 60
    else:
        raise Die(f"SOAK_RESTART_AT must be a whole number of minutes or none (got '{value}')")
    if seconds > minutes * 60:
        raise Die(f"SOAK_RESTART_AT ({value}) is after the soak's end (SOAK_MINUTES={minutes})")
    return seconds


def flag(environ, name, default):
    value = environ.get(name) or default
    if value not in ("0", "1"):
        raise Die(f"{name} must be 0 or 1 (got '{value}')")
    return value == "1"


def settings_from_env(environ):
    s = Settings(
        minutes=positive(environ, "SOAK_MINUTES", 30),
        swap_every=positive(environ, "SOAK_SWAP_EVERY", 5),
        load_pct=positive(environ, "SOAK_LOAD_PCT", 50),
        peak_records=positive(environ, "SOAK_PEAK_RECORDS", 300000),
        partitions=positive(environ, "SOAK_PARTITIONS", 6),
        sample_every=positive(environ, "SOAK_SAMPLE_EVERY", 10),
        rss_growth_pct=positive(environ, "SOAK_RSS_GROWTH_PCT", 10),
        drain_timeout=positive(environ, "SOAK_DRAIN_TIMEOUT", 180),
        admin_port=positive(environ, "SOAK_ADMIN_PORT", 27470),
        manifest_extra=environ.get("SOAK_MANIFEST_EXTRA", ""),
        precompile=flag(environ, "SOAK_PRECOMPILE", "1"),
        read_input=flag(environ, "SOAK_READ_INPUT", "0"),
        keep_topics=flag(environ, "SOAK_KEEP_TOPICS", "0"),
    )
    if environ.get("SOAK_RATE"):
        s.rate = positive(environ, "SOAK_RATE", 0)
    if s.admin_port > 65535:
        raise Die(f"SOAK_ADMIN_PORT must be a port number (got {s.admin_port})")
    s.restart_s = parse_restart(environ.get("SOAK_RESTART_AT"), s.minutes)
    return s


# --- files the run writes ------------------------------------------------------------------------------------------


def manifest_text(bootstrap, admin_port, topic, group, component, extra=""):
    """The soak's manifest: one pipeline "soak" reading TOPIC in GROUP, its emits to TOPIC-out, dead letters to
    TOPIC-dlq; EXTRA is SOAK_MANIFEST_EXTRA, lines of the [[pipeline]] table. No client_id: the host's default."""
    q = bench_host.toml_string
    lines = (f'config = {{ emit-to = "ids" }}\ndead_letter_topic = {q(topic + "-dlq")}\n{extra}\n\n'
             f'[pipeline.outputs]\nids = {q(topic + "-out")}')
    return bench_host.manifest(bootstrap, admin_port, [bench_host.Pipeline("soak", [topic], group, str(component),
                                                                           lines)], client_id=None)


def leb128(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def with_custom_section(wasm, name, payload):
    """WASM with one custom section (id 0) appended: the same code, another content hash."""
    body = leb128(len(name)) + name + payload
    return wasm + b"\x00" + leb128(len(body)) + body


def make_component_b(a_path, b_path):
    Path(b_path).write_bytes(with_custom_section(Path(a_path).read_bytes(), b"sharehost-soak-version", b"b"))


# --- what the tools and the host print -----------------------------------------------------------------------------


def producer_report(log_text):
    """(the last "N records sent, ..." line of ProducerPerformance's output or "", whether a send failed for good).
    Retried sends are logged as WARN (a broker restart causes some); a send that failed for good is an ERROR line or
    a stack trace from the tool's callback."""
    last = ""
    failed = False
    for line in log_text.splitlines():
        if "records sent" in line:
            last = line
        if re.match(r"\[[^]]*\] (WARN|INFO)", line):
            continue
        if re.search(r"error|exception", line, re.IGNORECASE):
            failed = True
    return last, failed


def input_is_range(records, in_count, last_line, failed):
    """Whether the input topic provably holds exactly the ids 0..RECORDS-1 once each: the producer sent them all
    with no failed send (idempotent, so no retry duplicates) and the end offsets add up to RECORDS."""
    return not failed and in_count == records and last_line.startswith(f"{records} records sent")


@dataclass
class Status:
    accepted: int
    dead_lettered: int
    in_flight: int
    active_version: str


def pipeline_status(body):
    """The soak pipeline's counters from GET /pipelines (accepted summed over its versions, a map of content hash to
    counters), or None when the answer is not what the host gives."""
    try:
        p = json.loads(body)[0]
        return Status(
            accepted=bench_host.judged_counts([p])[0],
            dead_lettered=int(p["dead_lettered"]),
            in_flight=int(p["in_flight"]),
            active_version=str(p["active_version"]),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, Die):
        return None


def peak_rate(first_ms, first_n, last_ms, last_n):
    """Records/s between the first poll that saw an accepted record and the one that saw them all."""
    if first_ms is None or last_ms is None or last_ms <= first_ms:
        return None
    return (last_n - first_n) * 1000 // (last_ms - first_ms)


class DrainWatch:
    """The drain's stop condition: the host has judged every record in the input topic (accepted plus dead-lettered
    reach its count), holds none in flight, and its counters have not moved for DRAIN_STILL_S."""

    def __init__(self, in_count, still_s=DRAIN_STILL_S):
        self.in_count = in_count
        self.still_ms = still_s * 1000
        self.last = None
        self.since = None

    def drained(self, status, t_ms):
        if status is None:
            return False
        cur = (status.accepted, status.dead_lettered)
        if cur != self.last:
            self.last, self.since = cur, t_ms
        return (
            status.accepted + status.dead_lettered >= self.in_count
            and status.in_flight == 0
            and t_ms - self.since >= self.still_ms
        )


# --- /proc (the rest is bench_host's) --------------------------------------------------------------------------


def proc_fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# --- the ledger ----------------------------------------------------------------------------------------------------

IN, OUT, DLQ = 1, 2, 4
# An id this far past the ids seen so far is kept apart instead of growing the table to it (a stray huge value must
# not allocate gigabytes).
DENSE_SLACK = 1 << 20


class Ledger:
    """Which topics each id was seen in: one byte per id, IN | OUT | DLQ bits, so that every figure is a count of
    byte values (done in C by bytearray.count) and 40 million ids take 40 MB."""

    def __init__(self):
        self.dense = bytearray()
        self.far = {}
        self.records = {IN: 0, OUT: 0, DLQ: 0}

    @classmethod
    def with_range(cls, n):
        """An input topic known to hold exactly the ids 0..N-1 once each."""
        ledger = cls()
        ledger.dense = bytearray(b"\x01") * n
        ledger.records[IN] = n
        return ledger

    def add(self, bit, ids):
        dense, far = self.dense, self.far
        n = 0
        for i in ids:
            n += 1
            if i < len(dense):
                dense[i] |= bit
            elif i < 2 * len(dense) + DENSE_SLACK:
                dense.extend(bytes(max(i + 1, 2 * len(dense)) - len(dense)))
                dense[i] |= bit
            else:
                far[i] = far.get(i, 0) | bit
        self.records[bit] += n

    def figures(self):
        counts = [self.dense.count(v) for v in range(8)]
        for v in self.far.values():
            counts[v] += 1
        # ids never seen anywhere are the zero bytes of the table: not counted
        produced = sum(c for v, c in enumerate(counts) if v & IN)
        accepted = sum(c for v, c in enumerate(counts) if v & OUT)
        dead = sum(c for v, c in enumerate(counts) if v & DLQ)
        lost = counts[IN]
        foreign = counts[OUT] + counts[DLQ] + counts[OUT | DLQ]
        first_lost = []
        pos = self.dense.find(IN)
        while pos >= 0 and len(first_lost) < 20:
            first_lost.append(pos)
            pos = self.dense.find(IN, pos + 1)
        first_lost += sorted(i for i, v in self.far.items() if v == IN)[: 20 - len(first_lost)]
        return {
            "input_records": self.records[IN],
            "produced": produced,
            "accepted": accepted,
            "dead_lettered": dead,
            "output_records": self.records[OUT],
            "duplicates": self.records[OUT] - accepted,
            "lost": lost,
            "foreign": foreign,
            "lost_ids_first": first_lost,
        }


def read_ids(path):
    """The ids of one read-back topic, one decimal per line; a line that is not one fails the run, naming it. A file
    of nothing but whitespace holds no ids."""
    blank = None
    seen = False
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip(b"\r\n")
            if line.isdigit():
                seen = True
                yield int(line)
            elif not line.strip():
                blank = blank or number
            else:
                raise Die(f"ledger: {path}: line {number} is not a non-negative decimal id: {line[:40]!r}")
    if blank and seen:
        raise Die(f"ledger: {path}: line {blank} is empty, not a decimal id")


def ledger_lines(figures):
    """What the ledger prints, and whether it passes (nothing lost, nothing foreign)."""
    f = figures
    lines = [
        f"ledger: produced {f['produced']} (input records {f['input_records']}), accepted {f['accepted']}, "
        f"dead-lettered {f['dead_lettered']}, output records {f['output_records']}, duplicates {f['duplicates']}, "
        f"foreign {f['foreign']}, lost {f['lost']}"
    ]
    if f["lost"]:
        lines.append("ledger: first lost ids: " + ", ".join(str(i) for i in f["lost_ids_first"]))
    ok = not f["lost"] and not f["foreign"]
    if not ok:
        lines.append(f"ledger: {f['lost']} records lost, {f['foreign']} outputs of ids never produced")
    return lines, ok


def run_ledger(input_spec, out_path, dlq_path, json_path):
    """INPUT_SPEC: a path, or an int N for the ids 0..N-1. Writes JSON_PATH; returns (lines, ok)."""
    if isinstance(input_spec, int):
        ledger = Ledger.with_range(input_spec)
    else:
        ledger = Ledger()
        ledger.add(IN, read_ids(input_spec))
    ledger.add(OUT, read_ids(out_path))
    ledger.add(DLQ, read_ids(dlq_path))
    figures = ledger.figures()
    with open(json_path, "w") as f:
        json.dump(figures, f, indent=1)
    return ledger_lines(figures)


# --- the RSS rule --------------------------------------------------------------------------------------------------


def read_samples(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for number, r in enumerate(rows, 2):
        try:
            r["t_s"] = float(r["t_s"])
        except (KeyError, TypeError, ValueError):
            raise Die(f"{path}: line {number}: no number in t_s") from None
    return rows


def read_events(path):
    events = []
    with open(path, newline="") as f:
        for number, r in enumerate(csv.DictReader(f), 2):
            try:
                events.append((float(r["t_s"]), r["event"]))
            except (KeyError, TypeError, ValueError):
                raise Die(f"{path}: line {number}: not t_s,event") from None
    return events


def column(rows, name):
    """(t, value) pairs of one column, leaving out samples where it is empty (the admin endpoint did not answer)."""
    out = []
    for r in rows:
        value = r.get(name)
        if value not in ("", None):
            out.append((r["t_s"], float(value)))
    return out


def rss_steps(events, rss):
    """What each swap and the broker restart did to RSS: the last sample before the next such event (or the end)
    minus the last sample before this one; events less than 5 s apart count as one. A one-time step that stays, or
    growth that comes back with every event, tells a warm-up from a leak."""
    marks = []
    for t, what in events:
        if what.startswith("swap"):
            label = what.split(" (")[0]
        elif what.startswith("broker: stop-broker"):
            label = "broker restart"
        else:
            continue
        if marks and t - marks[-1][0] < 5:
            marks[-1] = (marks[-1][0], marks[-1][1] + " + " + label)
        else:
            marks.append((t, label))
    steps = []
    for i, (t, label) in enumerate(marks):
        until = marks[i + 1][0] if i + 1 < len(marks) else float("inf")
        before = [v for ts, v in rss if ts <= t]
        period = [v for ts, v in rss if t < ts <= until]
        if before and period:
            steps.append({"t_s": t, "event": label, "rss_step_kib": period[-1] - before[-1]})
    return steps


def rss_rule(rows, events, minutes, growth_pct):
    """The RSS rule on the samples: (figures for rss.json, the lines it prints, whether it holds). Raises Die with
    an "rss: ..." message when there is nothing to judge."""
    rss = column(rows, "rss_kib")
    if not rss:
        raise Die("rss: no samples")
    warmup = min(300.0, minutes * 60 / 6)
    window = [v for t, v in rss if warmup - 60 < t <= warmup]
    later = [(t, v) for t, v in rss if t > warmup]
    if not window or not later:
        raise Die(f"rss: no samples in the baseline window ({warmup - 60:.0f}, {warmup:.0f}] s or after it")
    base = max(window)
    base_avg = sum(window) / len(window)
    limit = base * (1 + growth_pct / 100)
    t_max, v_max = max(later, key=lambda p: p[1])
    end = rss[-1][1]
    fds = [v for _, v in column(rows, "fds")]
    rps = [v for _, v in column(rows, "records_per_s")]
    load = [v for _, v in column(rows, "load1")]
    cpu = [v for _, v in column(rows, "host_cpu_pct")]
    figures = {
        "warmup_s": warmup,
        "baseline_rss_kib": base,
        "baseline_avg_rss_kib": round(base_avg),
        "limit_rss_kib": round(limit),
        "max_rss_after_warmup_kib": v_max,
        "max_rss_after_warmup_t_s": t_max,
        "end_rss_kib": end,
        "growth_max_pct": round((v_max / base - 1) * 100, 2),
        "growth_end_pct": round((end / base - 1) * 100, 2),
        "fds_min": min(fds) if fds else None,
        "fds_max": max(fds) if fds else None,
        "records_per_s_mean": round(sum(rps) / len(rps)) if rps else None,
        "records_per_s_min": min(rps) if rps else None,
        "records_per_s_max": max(rps) if rps else None,
        "host_cpu_pct_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
        "load1_mean": round(sum(load) / len(load), 2) if load else None,
        "samples": len(rows),
        "growth_pct": growth_pct,
    }
    steps = rss_steps(events, rss)
    figures["rss_steps"] = steps
    ok = v_max <= limit
    lines = [
        f"rss: baseline {base / 1024:.1f} MiB (max of ({warmup - 60:.0f}, {warmup:.0f}] s; avg {base_avg / 1024:.1f}), "
        f"largest after it {v_max / 1024:.1f} MiB at {t_max / 60:.1f} min ({figures['growth_max_pct']:+.1f} %), "
        f"end {end / 1024:.1f} MiB ({figures['growth_end_pct']:+.1f} %), limit +{growth_pct:g} %: "
        + ("ok" if ok else "EXCEEDED"),
        f"samples {len(rows)}: fds {figures['fds_min'] or 0:.0f}-{figures['fds_max'] or 0:.0f}, records/s mean "
        f"{figures['records_per_s_mean']} (min {figures['records_per_s_min']}, max {figures['records_per_s_max']}), "
        f"host CPU mean {figures['host_cpu_pct_mean']} %, 1-min load mean {figures['load1_mean']}",
    ]
    if steps:
        lines.append(
            "rss steps at events: "
            + ", ".join(f"{s['event']} at {s['t_s'] / 60:.1f} min {s['rss_step_kib'] / 1024:+.2f} MiB" for s in steps)
        )
    if not ok:
        lines.append(f"rss: grew {figures['growth_max_pct']:+.1f} % over the warm-up baseline (limit {growth_pct:g} %)")
    return figures, lines, ok


def fds_line(rows):
    """The summary's fds and load line, over the samples that have an RSS (the host answered /proc)."""
    fds, loads = [], []
    for r in rows:
        if r.get("rss_kib") in ("", None):
            continue
        fds.append(int(r["fds"] or 0))
        loads.append(float(r["load1"] or 0))
    if not fds:
        return None
    return (
        f"fds: min {min(fds)}, max {max(fds)}; mean 1-min load {sum(loads) / len(fds):.2f} over {len(fds)} samples"
    )


# --- the run's event log -------------------------------------------------------------------------------------------


class Events:
    """Every event goes to stderr and events.log; once the soak runs (start() was called), also to events.csv, as
    seconds since its start. The restart's thread logs here too, and the sampling loop takes what it left
    (take_pending) for its next row."""

    def __init__(self, out):
        self.log = out / "events.log"
        self.csv = out / "events.csv"
        self.t0 = None
        self.lock = threading.Lock()
        self.pending = []

    def start(self, t0_ms):
        self.t0 = t0_ms
        self.csv.write_text("t_s,event\n")

    def __call__(self, text):
        with self.lock:
            line = f"{bench_host.utc_stamp('%H:%M:%S')} {text}"
            print(line, file=sys.stderr, flush=True)
            with open(self.log, "a") as f:
                f.write(line + "\n")
            if self.t0 is not None:
                t = now_ms() - self.t0
                with open(self.csv, "a") as f:
                    f.write(f"{t // 1000}.{t % 1000:03d},\"{text.replace(chr(34), chr(39))}\"\n")

    def mark(self, text):
        """TEXT goes into the event column of the next sample's row."""
        with self.lock:
            self.pending.append(text)

    def take_pending(self):
        with self.lock:
            text = "; ".join(self.pending)
            self.pending = []
            return text


# --- the run -------------------------------------------------------------------------------------------------------


class Soak:
    def __init__(self, settings):
        self.s = settings
        # The soak's own broker defaults (dev/kafka and the host's tools read them from the environment); empty is
        # unset, as in bash.
        for name, default in (("KAFKA_PORT", "27092"), ("KAFKA_CONTROLLER_PORT", "27093"),
                              ("KAFKA_SASL_SSL_PORT", "27094"),
                              ("SHAREHOST_KAFKA_DIR", str(REPO / "target" / "kafka-soak"))):
            if not os.environ.get(name):
                os.environ[name] = default
        for name in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "KAFKA_SASL_SSL_PORT"):
            kh.env_int(name, 0)  # a port that is not a number is refused here, naming it
        self.port = int(os.environ["KAFKA_PORT"])
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.host_bin = None  # build() sets it
        self.venv = REPO / "target" / "soak-venv"
        self.stamp = bench_host.utc_stamp("%Y%m%d-%H%M%S")
        self.out = REPO / "target" / "soak" / self.stamp
        self.out.mkdir(parents=True, exist_ok=True)
        self.event = Events(self.out)
        self.failures = []
        self.broker = None
        self.host = None  # the bench_host.Host running now
        self.producer = None
        self.restart_thread = None
        self.restart_proc = None
        self.stopping = threading.Event()

    # --- tools ---

    def kafka(self, *args, log):
        """dev/kafka ARGS (the restart's stop-broker and start-broker, which cleanup() may have to stop), its output
        appended to LOG; its exit status."""
        with open(log, "a") as f:
            self.restart_proc = subprocess.Popen([str(KAFKA), *args], stdout=f, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL)
            return self.restart_proc.wait()

    def tool(self, *args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL):
        return subprocess.run(self.broker.tool_cmd(*args), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
                              text=True, errors="replace")

    def topic_count(self, topic):
        out = self.tool("org.apache.kafka.tools.GetOffsetShell", "--bootstrap-server", self.bootstrap, "--topic", topic)
        return bench_host.topic_count(out.stdout)

    def producer_cmd(self, topic, records, throughput):
        return self.broker.tool_cmd(
            "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", records,
            "--payload-monotonic", "--throughput", throughput, "--command-property",
            f"bootstrap.servers={self.bootstrap}", "acks=all", "enable.idempotence=true", "linger.ms=5",
            "delivery.timeout.ms=600000",
        )

    def make_topics(self, topic, group):
        for name, partitions in ((topic, self.s.partitions), (f"{topic}-out", self.s.partitions), (f"{topic}-dlq", 1)):
            self.broker.create_topic(name, partitions, log=None)
        self.broker.share_earliest(group, log=None)

    def write_manifest(self, path, topic, group, component):
        path.write_text(manifest_text(self.bootstrap, self.s.admin_port, topic, group, component,
                                      self.s.manifest_extra))

    # --- setup ---

    def build(self):
        for tool in ("java", "cargo", "python3"):
            if shutil.which(tool) is None:
                raise Die(f"{tool} is missing")
        note(f"output in {self.out}")
        note("building the release host and the guest components")
        self.host_bin = bench_host.build_release(("sharehost",))["sharehost"]
        # dev/build-guests always writes to target/guests of the checkout, whatever CARGO_TARGET_DIR says.
        comp = bench_host.GUESTS / "fixture_ledger.wasm"
        if not comp.is_file():
            bench_host.build_guests(None, ("fixture_ledger",))
        self.ensure_venv()
        self.comp_a = self.out / "ledger-a.wasm"
        self.comp_b = self.out / "ledger-b.wasm"
        shutil.copyfile(comp, self.comp_a)
        make_component_b(self.comp_a, self.comp_b)

    def ensure_venv(self):
        """The plotting venv, (re)installed when dev/soak-requirements.txt differs from the copy it was made from."""
        req = DEV / "soak-requirements.txt"
        stamp = self.venv / "requirements.txt"
        if stamp.is_file() and stamp.read_bytes() == req.read_bytes():
            return
        note(f"installing the plotting venv (dev/soak-requirements.txt) into {self.venv}")
        shutil.rmtree(self.venv, ignore_errors=True)
        if subprocess.call([sys.executable, "-m", "venv", str(self.venv)], stdout=sys.stderr) != 0:
            raise Die(f"python3 -m venv {self.venv} failed (is python3-venv installed?)")
        rc = subprocess.call([str(self.venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                              "--no-deps", "-r", str(req)], stdout=sys.stderr)
        if rc != 0:
            raise Die(f"installing dev/soak-requirements.txt into {self.venv} failed")
        shutil.copyfile(req, stamp)

    def attach_broker(self):
        """This checkout's running broker, or one started here (removed at the end). A stopped broker's kept state is
        refused (`up` would wipe it), and so is a port held by anything else."""
        self.broker = bench_host.Broker(say=note)
        self.broker.attach(
            busy_msg="port {port} is in use by something this checkout does not run (the soak restarts its broker, "
                     "so it needs its own)",
            running_note=f"using this checkout's running broker ({self.broker.harness.state}); it will be restarted "
                         "half-way")

    # --- the host ---

    def start_host(self, manifest, log):
        """`sharehost run MANIFEST`, its output in LOG, once its admin endpoint answers."""
        env = {
            "SHAREHOST_STATE_DIR": str(self.out / "state"),
            # Plugin log lines (the ledger logs every id it judges) are left out: warnings and errors stay.
            "SHAREHOST_LOG": os.environ.get("SHAREHOST_LOG") or "info,sharehost_runtime::log=warn",
        }
        self.host = bench_host.Host([self.host_bin, "run", manifest], self.s.admin_port, log, env=env)
        self.host.wait_ready(START_WAIT_S)

    def status(self):
        body = bench_host.admin_get(self.s.admin_port, "/pipelines", timeout=3)
        return None if body is None else pipeline_status(body)

    def stop_host(self):
        """SIGTERM (the host drains); whether it exited within STOP_WAIT_S (else it is killed)."""
        host, self.host = self.host, None
        if host is None:
            return True
        try:
            host.stop(STOP_WAIT_S)
        except Die:
            return False
        return True

    # --- phases ---

    def measure_peak(self):
        s = self.s
        topic = f"soak-peak-{self.stamp}"
        self.make_topics(topic, topic)
        note(f"peak: pre-filling {topic} with {s.peak_records} ids")
        with open(self.out / "peak-producer.log", "w") as f:
            rc = subprocess.call(self.producer_cmd(topic, s.peak_records, -1), stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        if rc != 0:
            raise Die(f"the peak pre-fill failed (see {self.out / 'peak-producer.log'})")
        manifest = self.out / "peak-manifest.toml"
        self.write_manifest(manifest, topic, topic, self.comp_a)
        log = self.out / "peak-host.log"
        self.start_host(manifest, log)
        first_ms = first_n = last_ms = None
        n = 0
        t0 = now_ms()
        while now_ms() - t0 < PEAK_WAIT_S * 1000:
            if not self.host.running():
                raise Die(f"the peak host exited (see {log})")
            st = self.status()
            n = st.accepted if st else n
            if first_ms is None and n > 0:
                first_ms, first_n = now_ms(), n
            if n >= s.peak_records:
                last_ms = now_ms()
                break
            time.sleep(POLL_S)
        self.stop_host()
        peak = peak_rate(first_ms, first_n, last_ms, n)
        if peak is None:
            raise Die(f"the peak host did not read {s.peak_records} records in {PEAK_WAIT_S // 60} min (see {log})")
        rate = peak * s.load_pct // 100
        if rate <= 0:
            raise Die(f"measured peak {peak} records/s is too small")
        self.event(f"peak {peak} records/s (steady, {s.peak_records} records, ledger plugin with emits); soak rate "
                   f"{rate} records/s ({s.load_pct} %)")
        return peak, rate

    def restart_broker(self):
        """Stops and starts the broker beside the sampling loop, and times the host's recovery into restart.txt."""
        out = self.out
        log = out / "restart.log"
        t_stop = now_ms()
        self.event.mark("broker stop")
        self.event("broker: stop-broker (SIGTERM, data kept)")
        if self.kafka("stop-broker", log=log) != 0:
            (out / "restart.txt").write_text("stop-broker failed\n")
            return
        self.event(f"broker: stopped after {now_ms() - t_stop} ms; start-broker")
        if self.stopping.is_set() or self.kafka("start-broker", log=log) != 0:
            (out / "restart.txt").write_text("start-broker failed\n")
            return
        t_up = now_ms()
        self.event.mark("broker up")
        st = self.status()
        acc0 = st.accepted if st else 0
        self.event(f"broker: up again {t_up - t_stop} ms after the stop (accepted so far {acc0})")
        while now_ms() - t_up < RECOVERY_WAIT_S * 1000 and not self.stopping.is_set():
            st = self.status()
            if st and st.accepted > acc0:
                t_first = now_ms()
                (out / "restart.txt").write_text(
                    f"stop_to_up_ms={t_up - t_stop} recovery_ms={t_first - t_up} outage_ms={t_first - t_stop}\n"
                )
                self.event(f"broker: the host accepts again {t_first - t_up} ms after the broker is up "
                           f"({t_first - t_stop} ms after the stop)")
                return
            time.sleep(POLL_S)
        (out / "restart.txt").write_text(f"no progress within {RECOVERY_WAIT_S} s of the restart\n")

    def swap(self, component, label):
        t0 = now_ms()
        code, body = bench_host.admin_post(self.s.admin_port, "/pipelines/soak/swap", {"path": str(component)},
                                           timeout=60)
        body = body.decode(errors="replace")
        self.swaps += 1
        try:
            ver = json.loads(body).get("active_version") or ""
        except (ValueError, AttributeError):
            ver = ""
        if code == 200 and ver and ver != self.version:
            self.swaps_ok += 1
            self.event(f"swap {self.swaps} to {label} ({ver[:12]}): 200 in {now_ms() - t0} ms")
            self.version = ver
        else:
            self.failures.append(f"swap {self.swaps} to {label} failed: HTTP {code} {body}")
            self.event(f"swap {self.swaps} to {label} FAILED: HTTP {code} {body}")
        self.event.mark(f"swap {self.swaps} {label}")

    def soak(self, rate):
        s = self.s
        self.topic = topic = f"soak-{self.stamp}"
        group = f"soak-{self.stamp}"
        self.records = records = rate * s.duration_s
        self.make_topics(topic, group)
        self.write_manifest(self.out / "manifest.toml", topic, group, self.comp_a)
        if s.precompile:
            # Like an operator who validates a build before rolling it out: `sharehost check` (its own process) puts
            # B into the precompiled cache that the host's swaps map from. Without it the first swap to B compiles
            # inside the host, which leaves ~13 MiB more RSS for good: a one-time step that the RSS rule would count
            # as growth.
            self.write_manifest(self.out / "manifest-b.toml", topic, group, self.comp_b)
            if subprocess.call([str(self.host_bin), "check", str(self.out / "manifest-b.toml")],
                               stdout=sys.stderr) != 0:
                raise Die("sharehost check of component B failed")
        self.start_host(self.out / "manifest.toml", self.out / "host.log")
        st = self.status()
        if st is None:
            raise Die(f"the host does not answer GET /pipelines (see {self.out / 'host.log'})")
        self.version = st.active_version
        self.event(f"host pid {self.host.pid} on {topic} (group {group}), version A {self.version[:12]}; producing "
                   f"{records} ids at {rate}/s for {s.minutes} min")
        with open(self.out / "producer.log", "w") as f:
            self.producer = subprocess.Popen(self.producer_cmd(topic, records, rate), stdout=f,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t0 = now_ms()
        self.event.start(t0)
        self.event("producer started")
        self.swaps = self.swaps_ok = 0
        self.sample_loop(t0)

    def sample_loop(self, t0):
        s = self.s
        pid = self.host.pid
        csv_path = self.out / "samples.csv"
        with open(csv_path, "w", newline="") as f:
            csv.writer(f).writerow(["t_s", "rss_kib", "fds", "in_flight", "accepted_total", "records_per_s",
                                    "host_cpu_pct", "load1", "event"])
        prev_ms, prev_cpu = t0, max(bench_host.cpu_ticks(pid, if_gone=0), 0)
        prev_acc, prev_acc_ms = 0, t0
        swaps_due = s.swap_times()
        next_is_b = True
        restart_due = s.restart_s
        for k in range(1, s.duration_s // s.sample_every + 1):
            wait = t0 + k * s.sample_every * 1000 - now_ms()
            if wait > 0:
                time.sleep(wait / 1000)
            if not self.host.running():
                self.failures.append(f"the host died at t={k * s.sample_every} s (see {self.out / 'host.log'})")
                self.event("host died")
                break
            now = now_ms()
            rss = bench_host.status_kb(pid, "VmRSS", if_gone="")
            fds = proc_fds(pid)
            st = self.status()
            cpu = bench_host.cpu_ticks(pid, if_gone=-1)
            rps = ""
            if st:
                rps = (st.accepted - prev_acc) * 1000 // max(now - prev_acc_ms, 1)
                prev_acc, prev_acc_ms = st.accepted, now
            cpu_pct = ""
            if cpu >= 0:
                cpu_pct = (cpu - prev_cpu) * 100 * 1000 // bench_host.CLK_TCK // max(now - prev_ms, 1)
                prev_cpu = cpu
            prev_ms = now
            load = bench_host.load_now()
            row = [(now - t0) // 1000, rss, "" if fds is None else fds,
                   st.in_flight if st else "", st.accepted if st else "", rps, cpu_pct, load,
                   self.event.take_pending()]
            with open(csv_path, "a", newline="") as f:
                csv.writer(f).writerow(row)
            el = k * s.sample_every
            if el % 60 == 0:
                note(f"t={el // 60} min: RSS {row[1]} KiB, fds {row[2]}, in-flight {row[3]}, {rps} records/s, host "
                     f"CPU {cpu_pct} %, load {load}")
            # Events of this tick are logged in the next sample's row (they happen after this one). A due time that
            # falls between two ticks is served at the later one.
            while swaps_due and el >= swaps_due[0]:
                swaps_due.pop(0)
                if next_is_b:
                    self.swap(self.comp_b, "B")
                else:
                    self.swap(self.comp_a, "A")
                next_is_b = not next_is_b
            if restart_due is not None and el >= restart_due:
                restart_due = None
                self.restart_thread = threading.Thread(target=self.restart_broker, daemon=True)
                self.restart_thread.start()

    def drain(self):
        s = self.s
        if self.restart_thread is not None:
            self.restart_thread.join()
            self.restart_thread = None
        note("waiting for the producer to finish")
        try:
            rc = self.producer.wait(PRODUCER_WAIT_S)
        except subprocess.TimeoutExpired:
            self.failures.append(f"the producer had not finished {PRODUCER_WAIT_S // 60} min after the soak's end")
            self.producer.terminate()
            rc = self.producer.wait()
        self.producer = None
        if rc != 0:
            self.failures.append(f"the producer exited with {rc} (see {self.out / 'producer.log'})")
        self.produced_line, self.producer_failed = producer_report(
            (self.out / "producer.log").read_text(errors="replace"))
        if self.producer_failed:
            self.failures.append(f"the producer reported failed sends (see {self.out / 'producer.log'})")
        self.in_count = self.topic_count(self.topic)
        self.event(f"producer done: {self.produced_line}; input topic holds {self.in_count} records")
        watch = DrainWatch(self.in_count)
        t0 = now_ms()
        st = None
        drained = False
        while now_ms() - t0 < s.drain_timeout * 1000:
            cur = self.status()
            st = cur or st
            if watch.drained(cur, now_ms()):
                drained = True
                break
            if not self.host.running():
                break  # the sampling loop has said so already
            time.sleep(1)
        if st:
            self.event(f"drain: accepted {st.accepted}, dead-lettered {st.dead_lettered}, in-flight {st.in_flight} "
                       f"after {(now_ms() - t0) // 1000} s")
        else:
            self.event(f"drain: the host did not answer for {(now_ms() - t0) // 1000} s")
        if not drained:
            self.failures.append(
                f"the host had not judged every produced record {s.drain_timeout} s after the producer ended")
        for path, name in (("/pipelines", "final-pipelines.json"), ("/metrics", "final-metrics.txt")):
            (self.out / name).write_bytes(bench_host.admin_get(self.s.admin_port, path, timeout=3) or b"")
        if not self.stop_host():
            self.failures.append(f"the host did not stop within {STOP_WAIT_S} s of SIGTERM")
        lines = (self.out / "host.log").read_text(errors="replace").splitlines()
        self.event(f"host stopped: {lines[-1] if lines else ''}")

    def read_topic(self, topic, path):
        count = self.topic_count(topic)
        if count == 0:
            path.write_text("")
            return
        with open(path, "w") as f, open(self.out / "readback.log", "a") as errors:
            self.tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", self.bootstrap,
                      "--topic", topic, "--from-beginning", "--max-messages", str(count), "--timeout-ms", "60000",
                      stdout=f, stderr=errors)

    def check_ledger(self):
        out = self.out
        if not self.s.read_input and input_is_range(self.records, self.in_count, self.produced_line,
                                                    self.producer_failed):
            input_spec = self.records
            note(f"reading the output and dead-letter topics back (plain Fetch); the input topic holds ids "
                 f"0..{self.records - 1}")
        else:
            note("reading the input, output and dead-letter topics back (plain Fetch)")
            input_spec = out / "in.txt"
            self.read_topic(self.topic, input_spec)
        self.read_topic(f"{self.topic}-out", out / "out.txt")
        self.read_topic(f"{self.topic}-dlq", out / "dlq.txt")
        try:
            lines, ok = run_ledger(input_spec, out / "out.txt", out / "dlq.txt", out / "ledger.json")
        except (Die, OSError) as e:
            lines, ok = [str(e)], False
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        (out / "ledger.txt").write_text("".join(line + "\n" for line in lines))
        if not ok:
            self.failures.append(f"ledger: {lines[-1]}")
        elif not self.s.keep_topics:
            for name in ("in.txt", "out.txt", "dlq.txt"):
                (out / name).unlink(missing_ok=True)

    def check_rss(self, rate):
        out = self.out
        s = self.s
        rows = read_samples(out / "samples.csv")
        events = read_events(out / "events.csv")
        try:
            figures, lines, ok = rss_rule(rows, events, s.minutes, s.rss_growth_pct)
            (out / "rss.json").write_text(json.dumps(figures, indent=1))
        except Die as e:
            figures, lines, ok = None, [str(e)], False
        restart = "none" if s.restart_s is None else s.restart_s
        title = (f"sharehost soak {self.stamp}: {rate} records/s, swap every {s.swap_every} min, broker restart at "
                 f"{restart} s")
        if figures is not None:
            plot = subprocess.run(
                [str(self.venv / "bin" / "python"), str(DEV / "soak-plot.py"), str(out / "samples.csv"),
                 str(out / "events.csv"), str(out / "soak.png"), str(out / "rss.json"), "--title", title],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            )
            if plot.returncode != 0:
                sys.stderr.write(plot.stdout)
                self.failures.append(f"plot: dev/soak-plot.py failed: {(plot.stdout.strip().splitlines() or [''])[-1]}")
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        (out / "rss.txt").write_text("".join(line + "\n" for line in lines))
        if not ok:
            self.failures.append(f"RSS: {lines[-1]}")
        return rows

    def summary(self, peak, rate, rows):
        s = self.s
        out = self.out
        commit = bench_host.commit()
        uname = os.uname()
        lines = [
            f"{NAME} {self.stamp} (commit {commit}, {os.cpu_count()} cores, {uname.sysname} {uname.release})",
            f"command: SOAK_MINUTES={s.minutes} SOAK_SWAP_EVERY={s.swap_every} "
            + (f"SOAK_RATE={s.rate} " if s.rate else "") + NAME,
        ]
        if peak is not None:
            lines.append(f"peak: {peak} records/s (steady, the soak's plugin, nothing else loaded); rate: {rate} "
                         f"records/s ({s.load_pct} %)")
        else:
            lines.append(f"peak: not measured; rate: {rate} records/s (SOAK_RATE)")
        lines.append(f"producer: {self.produced_line}")
        lines.append(f"swaps: {self.swaps_ok} of {self.swaps} succeeded")
        restart = out / "restart.txt"
        lines.append(f"broker restart: {restart.read_text().strip() if restart.is_file() else 'none'}")
        for name in ("ledger.txt", "rss.txt"):
            path = out / name
            if path.is_file():
                lines += path.read_text().splitlines()
        fds = fds_line(rows)
        if fds:
            lines.append(fds)
        if self.failures:
            lines.append("FAIL:")
            lines += [f"  - {f}" for f in self.failures]
        else:
            lines.append("PASS")
        text = "".join(line + "\n" for line in lines)
        (out / "summary.txt").write_text(text)
        sys.stdout.write(text)
        sys.stdout.flush()
        for f in self.failures:
            print(f"soak: FAIL: {f}", file=sys.stderr)
        return 1 if self.failures else 0

    def run(self):
        self.build()
        self.attach_broker()
        if self.s.rate is None:
            peak, rate = self.measure_peak()
        else:
            peak, rate = None, self.s.rate
            self.event(f"soak rate {rate} records/s (SOAK_RATE)")
        self.soak(rate)
        self.drain()
        self.check_ledger()
        rows = self.check_rss(rate)
        return self.summary(peak, rate, rows)

    def cleanup(self):
        """What the run started, stopped: the restart's dev/kafka call, the producer, the host, then the broker if
        this run started it (dev/kafka down also deletes its data)."""
        self.stopping.set()
        if self.restart_proc is not None and self.restart_proc.poll() is None:
            self.restart_proc.terminate()
        if self.restart_thread is not None:
            self.restart_thread.join(STOP_WAIT_S)
        if self.producer is not None and self.producer.poll() is None:
            self.producer.terminate()
            self.producer.wait()
        self.stop_host()
        if self.broker is not None:
            self.broker.close()


def ledger_main(args):
    """dev/soak ledger (IN.txt | --range N) OUT.txt DLQ.txt LEDGER.json"""
    if len(args) == 5 and args[0] == "--range" and args[1].isdigit():
        spec, rest = int(args[1]), args[2:]
    elif len(args) == 4:
        spec, rest = args[0], args[1:]
    else:
        raise Die("usage: dev/soak ledger (IN.txt | --range N) OUT.txt DLQ.txt LEDGER.json")
    try:
        lines, ok = run_ledger(spec, *rest)
    except OSError as e:
        raise Die(f"ledger: {e}") from None
    print("\n".join(lines))
    return 0 if ok else 1


def main(argv):
    if argv and argv[0] in ("help", "-h", "--help"):
        print(__doc__)
        return 0

    def body(on_exit):
        if argv and argv[0] == "ledger":
            return ledger_main(argv[1:])
        if argv:
            raise Die(f"unknown argument: {argv[0]} (dev/soak help)")
        soak = Soak(settings_from_env(os.environ))
        on_exit(soak.cleanup)
        return soak.run()

    return bench_host.driver_main(NAME, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
