"""dev/bench-pipelines' program: many pipelines in one host (results go to docs/benchmarks.md, "Many pipelines").

A host that runs one pipeline per tenant or per topic must stay cheap when most of them are idle. For each pipeline
count (1, 10, 100) this runs ONE `sharehost run` (release) whose manifest has that many pipelines, each with its own
topic (one partition) and its own share group, all running target/guests/accept_all.wasm, every other setting at its
default. Per count:
  1. topics and groups: bench/pipelines/ManyTopics.java creates the topics in one CreateTopics request and sets
     share.auto.offset.reset=earliest on every group in one IncrementalAlterConfigs request (one JVM start, not one
     per topic), then puts BP_WARM records in every topic;
  2. join and drain: the host starts; `join s` is the time until every pipeline has judged its BP_WARM records (all
     members joined, assigned and fetching). The allocator every pipeline got (GET /pipelines `allocator`) is kept;
  3. idle: after BP_SETTLE s, the host's user+sys CPU over BP_IDLE_SECONDS with no record flowing, as % of one core
     (/proc/PID/stat; the epoch ticker thread's share beside it), the broker's CPU over the same window (and, once
     before the first host, over a window with no host at all), and the host's RSS (/proc/PID/status VmRSS) at the
     end of that window ("idle RSS");
  4. load: BP_RATE records/s in total, spread round-robin over every topic, for BP_LOAD_SECONDS (one producer);
     records/s = records judged / (first record judged → last record judged), total and per pipeline; the host's CPU
     over the same window as % of one core; `drain s` = last record produced → last record judged;
  5. burst: BP_BURST records in total (spread evenly) produced as fast as one producer goes while the host reads;
     burst records/s = records judged after the first one / (first → last record judged): the host's read rate of
     a backlog that builds faster than it reads, with the producer on the same cores (an upper bound of records/s
     per pipeline at that pipeline count, not a tuned peak);
  6. peak RSS = VmHWM at the end, then SIGTERM (the host drains and leaves).
Polling is GET /pipelines (the per-version `accepted` counters), 4 times a second at most.

Needs: java 17+ (dev/kafka), cargo, rustup's wasm32-wasip2 target (dev/build-guests adds it). No root.

env: BP_COUNTS ("1 10 100")   pipeline counts, one host each
     BP_IDLE_SECONDS (60)      idle window
     BP_SETTLE (10)            seconds between the last warm-up record and the idle window
     BP_WARM (10)              records per topic before the host starts (proof that every pipeline joined)
     BP_RATE (2000)            records/s in total during the load phase
     BP_LOAD_SECONDS (60)      length of the load phase
     BP_BURST (100000)         records in total in the burst phase (0: no burst)
     BP_SIZE (100)             value size in bytes
     BP_TIMEOUT (180)          seconds without progress before a phase counts as failed
     BP_ADMIN_PORT (31480)     the host's admin port
     BP_MANIFEST_EXTRA ("")    extra lines for the top of the manifest (e.g. a [runtime] table)
     BP_PIPELINE_EXTRA ("")    extra lines for every [[pipeline]] table
     KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_SASL_SSL_PORT, SHAREHOST_KAFKA_DIR as for dev/kafka: a broker that
     this checkout already runs there is used as it is; otherwise one is started (and stopped at the end).
     CARGO_TARGET_DIR as for cargo.
Output: the table on stdout; everything in target/bench-pipelines/<timestamp>/ (results.tsv, table.md, machine.txt,
each host's manifest, log, /pipelines and /metrics at the end of the idle window and at the end).

The program behind the entry point dev/bench-pipelines (standard library only); its tests are
dev/test_bench_pipelines.py.
"""

import collections
import csv
import dataclasses
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_host  # noqa: E402
from bench_host import REPO, Die, Host, now_us  # noqa: E402

NAME = "bench-pipelines"
TOPICS_TOOL = REPO / "bench" / "pipelines" / "ManyTopics.java"
COMMAND_VARS = ("BP_COUNTS", "BP_IDLE_SECONDS", "BP_SETTLE", "BP_WARM", "BP_RATE", "BP_LOAD_SECONDS", "BP_BURST",
                "BP_SIZE", "BP_MANIFEST_EXTRA", "BP_PIPELINE_EXTRA")
RESULTS = ("pipelines", "join_s", "allocator", "idle_rss_kb", "idle_cpu_pct", "idle_load", "load_records", "load_s",
           "load_rps", "load_cpu_pct", "drain_s", "load_load", "burst_records", "burst_s", "burst_rps", "burst_load",
           "load_rss_kb", "peak_rss_kb", "idle_epoch_pct", "idle_broker_pct")
# What a producer may take beyond its own length before this program gives up on it.
PRODUCER_GRACE_S = 600
# The host's drain after SIGTERM.
DRAIN_LIMIT_S = 300
POLL_S = 0.25


def note(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Config:
    counts: list
    idle_seconds: int
    settle: int
    warm: int
    rate: int
    load_seconds: int
    burst: int
    size: int
    timeout: int
    admin_port: int
    manifest_extra: str
    pipeline_extra: str


def config_from_env(environ):
    def whole(name, default):
        text = environ.get(name) or str(default)
        if not re.fullmatch(r"[0-9]+", text):
            raise Die(f"{name} must be a non-negative integer (got '{text}')")
        return int(text)

    counts = []
    for word in (environ.get("BP_COUNTS") or "1 10 100").split():
        if not re.fullmatch(r"[1-9][0-9]*", word):
            raise Die(f"BP_COUNTS: '{word}' is not a positive integer")
        counts.append(int(word))
    cfg = Config(counts=counts, idle_seconds=whole("BP_IDLE_SECONDS", 60), settle=whole("BP_SETTLE", 10),
                 warm=whole("BP_WARM", 10), rate=whole("BP_RATE", 2000), load_seconds=whole("BP_LOAD_SECONDS", 60),
                 burst=whole("BP_BURST", 100000), size=whole("BP_SIZE", 100), timeout=whole("BP_TIMEOUT", 180),
                 admin_port=whole("BP_ADMIN_PORT", 31480), manifest_extra=environ.get("BP_MANIFEST_EXTRA", ""),
                 pipeline_extra=environ.get("BP_PIPELINE_EXTRA", ""))
    if not (cfg.warm and cfg.rate and cfg.load_seconds and cfg.idle_seconds):
        raise Die("BP_WARM, BP_RATE, BP_LOAD_SECONDS and BP_IDLE_SECONDS must be > 0")
    if not 0 < cfg.admin_port < 65536:
        raise Die(f"BP_ADMIN_PORT must be a port (got {cfg.admin_port})")
    return cfg


def command_line(environ):
    """The command as the table records it: the BP_ settings that are set, then dev/bench-pipelines."""
    words = [f"{v}={bench_host.bash_quote(environ[v])}" for v in COMMAND_VARS if environ.get(v)]
    return " ".join(words + ["dev/bench-pipelines"])


def topic_prefix(n, run):
    """The topics' and groups' prefix of one count: lower case letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]", "", f"bp{n}-{run.lower()}")


def pipelines_manifest(cfg, bootstrap, prefix, n, component):
    """N pipelines: pipeline i reads topic PREFIX-i in group PREFIX-i-g."""
    pipes = [bench_host.Pipeline(f"p{i}", [f"{prefix}-{i}"], f"{prefix}-{i}-g", str(component), cfg.pipeline_extra)
             for i in range(n)]
    return bench_host.manifest(bootstrap, cfg.admin_port, pipes, client_id="sharehost-bench-pipelines",
                               after_admin=cfg.manifest_extra)


def allocators(status):
    """Which allocator the pipelines got, as "name×count" by name ("pooling×9,on-demand×1")."""
    try:
        names = collections.Counter(p["allocator"] for p in status)
    except (TypeError, KeyError) as e:
        raise Die(f"GET /pipelines: a pipeline without an allocator ({e!r})") from None
    return ",".join(f"{name}×{count}" for name, count in sorted(names.items()))


def pct(seconds, window_s):
    """CPU SECONDS over WINDOW_S as % of one core."""
    return f"{100 * seconds / window_s:.2f}"


def secs(a_us, b_us):
    return f"{(b_us - a_us) / 1e6:.2f}"


def rate(records, seconds_text):
    """Records per second over a window written with two decimals; "-" when it rounds to nothing."""
    s = float(seconds_text)
    return f"{records / s:.0f}" if s > 0 else "-"


def table(rows, rate_per_s, broker_alone, idle_seconds, machine):
    """table.md from results.tsv's rows: one line per pipeline count, the goals of the 100-pipeline row, the
    machine."""

    def f(row, key):
        try:
            return float(row[key])
        except (KeyError, TypeError, ValueError):
            raise Die(f"results.tsv: field {key} of the {row.get('pipelines', '?')}-pipeline row is "
                      f"'{row.get(key)}', not a number") from None

    lines = [f"| pipelines | allocator | idle RSS MiB | RSS after load MiB | peak RSS MiB | join + drain s "
             f"| host idle CPU % of one core ({idle_seconds}s) | broker CPU % meanwhile (+ over the broker alone, {broker_alone} %) | "
             "load: records/s total (per pipeline), host CPU | burst records/s total (per pipeline) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n = int(f(r, "pipelines"))
        burst_per = "-" if r["burst_rps"] == "-" else f"{f(r, 'burst_rps') / n:.1f}"
        lines.append(
            f"| {n} | {r['allocator']} | {f(r, 'idle_rss_kb') / 1024:.1f} | {f(r, 'load_rss_kb') / 1024:.1f} | "
            f"{f(r, 'peak_rss_kb') / 1024:.1f} | {r['join_s']} | {f(r, 'idle_cpu_pct'):.2f} (ticker "
            f"{f(r, 'idle_epoch_pct'):.2f}; load {r['idle_load']}) | {f(r, 'idle_broker_pct'):.2f} "
            f"(+{f(r, 'idle_broker_pct') - float(broker_alone):.2f}) | {rate_per_s}/s: {r['load_rps']} "
            f"({f(r, 'load_rps') / n:.1f} per pipeline), CPU {r['load_cpu_pct']} % (load {r['load_load']}) | "
            f"{r['burst_rps']} ({burst_per} per pipeline, load {r['burst_load']}) |")
    lines.append("")
    for r in rows:
        if int(f(r, "pipelines")) == 100:
            idle = f(r, "idle_cpu_pct")
            lines.append(f"- idle CPU of 100 idle pipelines < 2 % of one core: {'met' if idle < 2 else 'NOT met'} "
                         f"({idle:.2f} %)")
            peak, idle_rss = f(r, "peak_rss_kb"), f(r, "idle_rss_kb")
            lines.append(f"- RSS of 100 pipelines < 256 MiB: {'met' if peak < 262144 else 'NOT met'} (peak "
                         f"{peak / 1024:.1f} MiB, idle {idle_rss / 1024:.1f} MiB)")
    lines.append("")
    return "\n".join(lines) + "\n" + "".join(f"    {line}\n" for line in machine.splitlines())


class Run:
    def __init__(self, cfg, environ):
        self.cfg = cfg
        self.environ = environ
        self.run_stamp = bench_host.utc_stamp()
        self.out = REPO / "target" / "bench-pipelines" / self.run_stamp
        self.out.mkdir(parents=True, exist_ok=True)
        self.broker = self.host = self.producer = None

    def topics_tool(self, *args, log, background=False):
        argv = self.broker.tool_cmd(str(TOPICS_TOOL), *args)
        if background:
            with open(log, "wb") as out:
                return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        with open(log, "wb") as out:
            rc = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return rc

    def wait_producer(self, log, limit_s, what):
        try:
            rc = self.producer.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise Die(f"{what} still ran {limit_s}s after its start (see {log})") from None
        self.producer = None
        if rc != 0:
            sys.stderr.write(log.read_text(errors="replace"))
            raise Die(f"{what} failed")

    def broker_s(self):
        return bench_host.cpu_seconds(self.broker.pid)

    def run(self):
        cfg, out = self.cfg, self.out
        self.broker = bench_host.Broker(say=note)
        self.broker.attach(busy_msg="port {port} is taken by a process that is not this checkout's broker")
        note("building sharehost (release) and the guests")
        sharehost = bench_host.build_release()["sharehost"]
        component = bench_host.build_guests(out / "build-guests.log", ("accept_all",))["accept_all"]
        if bench_host.port_in_use(cfg.admin_port):
            raise Die(f"admin port {cfg.admin_port} is taken (set BP_ADMIN_PORT)")

        dirty = ""
        changed = bench_host.changed_files()
        if changed:
            dirty = (f" (dirty: {len(changed)} files differ from the commit, {len(bench_host.changed_files('host'))} "
                     "of them under host/)")
        machine = "\n".join([f"date: {bench_host.utc_stamp('%Y-%m-%dT%H:%M:%SZ')}",
                             f"commit: {bench_host.commit()}{dirty}", f"command: {command_line(self.environ)}",
                             *bench_host.machine_lines(), f"kafka: {self.broker.version} at {self.broker.bootstrap}",
                             f"load at start: {bench_host.load_now(3)}"]) + "\n"
        (out / "machine.txt").write_text(machine)
        sys.stderr.write(machine)

        # The broker's own idle CPU with no host running, over the same window: what the idle pipelines add is the
        # difference.
        b0 = self.broker_s()
        time.sleep(cfg.idle_seconds)
        broker_alone = pct(self.broker_s() - b0, cfg.idle_seconds)
        note(f"the broker alone: {broker_alone} % of one core (load {bench_host.load_now()})")

        results = out / "results.tsv"
        results.write_text("\t".join(RESULTS) + "\n")
        for n in cfg.counts:
            row = self.one_count(n, sharehost, component)
            with open(results, "a") as f:
                f.write("\t".join(str(row[k]) for k in RESULTS) + "\n")
        with open(out / "machine.txt", "a") as f:
            f.write(f"load at end: {bench_host.load_now(3)}\n")
        with open(results, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        text = table(rows, cfg.rate, broker_alone, cfg.idle_seconds, (out / "machine.txt").read_text())
        (out / "table.md").write_text(text)
        sys.stdout.write(text)
        note(f"raw results in {out}")

    def one_count(self, n, sharehost, component):
        cfg, out, b = self.cfg, self.out, self.broker
        row = {"pipelines": n}
        prefix = topic_prefix(n, self.run_stamp)
        note(f"{n} pipeline(s): topics and groups {prefix}-*")
        for what, args, log in (("create the topics", ("create", b.bootstrap, prefix, n, "g"), out / f"{n}.create.log"),
                                ("fill the topics", ("fill", b.bootstrap, prefix, n, cfg.warm, cfg.size),
                                 out / f"{n}.fill.log")):
            if self.topics_tool(*args, log=log) != 0:
                sys.stderr.write(log.read_text(errors="replace"))
                raise Die(f"cannot {what}")
        (out / f"{n}.toml").write_text(pipelines_manifest(cfg, b.bootstrap, prefix, n, component))

        # 2. join and drain
        t0 = now_us()
        self.host = host = Host([sharehost, "run", out / f"{n}.toml"], cfg.admin_port, out / f"{n}.log")
        done, _ = host.wait_judged(n * cfg.warm, cfg.timeout, f"the join of {n} pipelines", POLL_S)
        row["join_s"] = secs(t0, done)
        row["allocator"] = allocators(host.status() or [])
        note(f"{n} pipeline(s): joined and drained in {row['join_s']}s; allocator {row['allocator']}")

        # 3. idle
        time.sleep(cfg.settle)
        pid = host.pid
        c0, e0, b0 = bench_host.cpu_seconds(pid), bench_host.thread_cpu_seconds(pid, "sharehost-epoch"), self.broker_s()
        time.sleep(cfg.idle_seconds)
        c1, e1, b1 = bench_host.cpu_seconds(pid), bench_host.thread_cpu_seconds(pid, "sharehost-epoch"), self.broker_s()
        row["idle_load"] = bench_host.load_now()
        row["idle_cpu_pct"] = pct(c1 - c0, cfg.idle_seconds)
        row["idle_epoch_pct"] = pct(e1 - e0, cfg.idle_seconds)
        row["idle_broker_pct"] = pct(b1 - b0, cfg.idle_seconds)
        row["idle_rss_kb"] = bench_host.status_kb(pid, "VmRSS")
        body = bench_host.admin_get(cfg.admin_port, "/metrics")
        if body is not None:
            (out / f"{n}.idle.metrics").write_bytes(body)
        note(f"{n} pipeline(s): idle CPU {row['idle_cpu_pct']} % of one core (epoch ticker {row['idle_epoch_pct']} %), "
             f"broker {row['idle_broker_pct']} %, RSS {row['idle_rss_kb'] // 1024} MiB (load {row['idle_load']})")

        # 4. load
        base = host.judged()
        if base is None:
            raise Die("no /pipelines")
        sent = cfg.rate * cfg.load_seconds
        log = out / f"{n}.produce.log"
        self.producer = self.topics_tool("produce", b.bootstrap, prefix, n, cfg.rate, cfg.load_seconds, cfg.size,
                                         log=log, background=True)
        # The window starts at the first record judged (the producer's JVM start is no part of the host's rate).
        t0, first = host.wait_judged(base + 1, cfg.timeout, "the load phase", POLL_S)
        c0 = bench_host.cpu_seconds(pid)
        self.wait_producer(log, cfg.load_seconds + PRODUCER_GRACE_S, "the producer")
        t_end = now_us()
        done, _ = host.wait_judged(base + sent, cfg.timeout, "the load phase", POLL_S)
        c1 = bench_host.cpu_seconds(pid)
        row["load_load"] = bench_host.load_now()
        row["load_records"] = sent
        row["load_s"] = secs(t0, done)
        row["load_rps"] = rate(base + sent - first, row["load_s"])
        row["load_cpu_pct"] = pct(c1 - c0, float(row["load_s"])) if float(row["load_s"]) > 0 else "-"
        row["drain_s"] = secs(t_end, done)
        row["load_rss_kb"] = bench_host.status_kb(pid, "VmRSS")
        note(f"{n} pipeline(s): {sent} records at {cfg.rate}/s: {row['load_rps']} records/s, host CPU "
             f"{row['load_cpu_pct']} %, drained {row['drain_s']}s after the producer (load {row['load_load']})")

        # 5. burst
        row.update(burst_records=0, burst_s=0, burst_rps=0, burst_load="-")
        if cfg.burst > 0:
            per = -(-cfg.burst // n)
            row["burst_records"] = burst_n = per * n
            base = host.judged()
            if base is None:
                raise Die("no /pipelines")
            log = out / f"{n}.burst.log"
            self.producer = self.topics_tool("fill", b.bootstrap, prefix, n, per, cfg.size, log=log, background=True)
            t0, first = host.wait_judged(base + 1, cfg.timeout, "the burst", POLL_S)
            done, _ = host.wait_judged(base + burst_n, cfg.timeout, "the burst", POLL_S)
            self.wait_producer(log, PRODUCER_GRACE_S, "the burst producer")
            row["burst_load"] = bench_host.load_now()
            row["burst_s"] = secs(t0, done)
            # "-": the whole burst was judged between two polls (make BP_BURST bigger).
            row["burst_rps"] = rate(base + burst_n - first, row["burst_s"])
            note(f"{n} pipeline(s): burst of {burst_n} records read at {row['burst_rps']} records/s (load "
                 f"{row['burst_load']})")

        # 6. the end
        row["peak_rss_kb"] = bench_host.status_kb(pid, "VmHWM")
        host.save(out / f"{n}")
        if host.stop(DRAIN_LIMIT_S, f"the host of {n} pipelines") != 0:
            raise Die(f"the host of {n} pipelines failed at SIGTERM (see {out}/{n}.log)")
        self.host = None
        return row

    def cleanup(self):
        if self.producer is not None and self.producer.poll() is None:
            self.producer.terminate()
            try:
                self.producer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.producer.kill()
        if self.host is not None:
            self.host.kill()
        if self.broker is not None:
            self.broker.close()


def main(argv, environ=os.environ):
    if argv:
        sys.stdout.write(__doc__)
        return 0 if argv[0] in ("-h", "--help", "help") else 2

    def body(on_exit):
        os.chdir(REPO)
        run = Run(config_from_env(environ), environ)
        on_exit(run.cleanup)
        run.run()
        return 0

    return bench_host.driver_main(NAME, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
