"""dev/bench-swap's program: how long a hot swap stalls a pipeline under load (results go to docs/benchmarks.md,
"Hot-swap stall").

One `sharehost run` (release) reads a pre-filled topic with target/guests/accept_all.wasm while this program swaps its
plugin through the admin endpoint (POST /pipelines/bench/swap), one swap at a time:
  cached    BENCH_SWAP_COUNT swaps alternating between two versions that are both in the precompiled cache (A, and
            B = A plus one custom section: the same code, another content hash), put there by `sharehost check`
            before the run: a swap maps the compiled code and instantiates;
  uncached  BENCH_SWAP_COUNT swaps, each to a version never seen before (A plus a custom section unique to the
            swap), so the host compiles it during the swap (on a blocking thread, beside the judging).
For each swap the host reports last_swap_stall_ms in GET /pipelines: the longest gap between two judged batches from
the last batch before the swap was asked for to the first batch the new version judged. The program waits for that
batch before the next swap, and fails when the topic ran dry before the last swap (a stall is only meaningful while
records flow). At the end the pipeline must have accepted exactly the records produced (lost 0, none twice), and
ShareGroupCommand must show the group's lag at 0.

Goal: the longest cached stall ≤ 5 ms, nothing lost.

Needs: java 17+, cargo, rustup's wasm32-wasip2 target (dev/build-guests adds it). No root.
env: BENCH_SWAP_RECORDS (6000000)  records of 100 B (6 partitions) in the topic: enough that judging goes on through
                                   every swap
     BENCH_SWAP_COUNT (10)         swaps per case
     BENCH_SWAP_ADMIN_PORT (31480) the host's admin port
     KAFKA_PORT, KAFKA_CONTROLLER_PORT, KAFKA_SASL_SSL_PORT, SHAREHOST_KAFKA_DIR as for dev/kafka: a broker this
     checkout already runs there is used as it is; otherwise one is started and stopped at the end.
     CARGO_TARGET_DIR as for cargo.
Output: the table on stdout; raw output in target/bench-swap/<timestamp>/ (host log, manifests, stalls.tsv, the final
/pipelines and /metrics).

The program behind the entry point dev/bench-swap (standard library only); its tests are dev/test_bench_swap.py.
"""

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_host  # noqa: E402
from bench_host import REPO, Die, Host  # noqa: E402

NAME = "bench-swap"
# The host has joined and judges (this many records accepted) before the first swap.
JUDGING_BEFORE_SWAPS = 50000
# A host that does not get somewhere within this long (joined and judging, the new version's first batch, the drain)
# is stuck.
HOST_WAIT_S = 600
# How often the swapper looks at the counters while it waits for a new version's first batch.
SWAP_POLL_S = 0.002
CACHED_GOAL_MS = 5.0


def note(msg):
    print(f"{NAME}: {msg}", file=sys.stderr, flush=True)


def config_from_env(environ):
    """(records, swaps per case, admin port); Die names the variable that is wrong."""
    records = environ.get("BENCH_SWAP_RECORDS") or "6000000"
    count = environ.get("BENCH_SWAP_COUNT") or "10"
    port = environ.get("BENCH_SWAP_ADMIN_PORT") or "31480"
    if not records.isdigit() or int(records) == 0 or int(records) % 6:
        raise Die(f"BENCH_SWAP_RECORDS must be a positive multiple of 6 (got '{records}')")
    if not count.isdigit() or int(count) == 0:
        raise Die(f"BENCH_SWAP_COUNT must be a positive integer (got '{count}')")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise Die(f"BENCH_SWAP_ADMIN_PORT must be a port (got '{port}')")
    return int(records), int(count), int(port)


def with_section(wasm, name):
    """WASM with one custom section NAME appended (payload "x"): the same code, another content hash."""
    name_bytes = name.encode()
    body = bytes([len(name_bytes)]) + name_bytes + b"x"
    if len(body) >= 128:
        raise ValueError(f"custom section name '{name}' is too long for a one-byte size")
    return wasm + bytes([0, len(body)]) + body


def swap_plan(count, a, b, out):
    """(case, swap number, component) of every swap: COUNT cached ones alternating B and A, then COUNT to versions
    never seen before."""
    plan = [("cached", i, b if i % 2 else a) for i in range(1, count + 1)]
    plan += [("uncached", i, out / f"u{i}.wasm") for i in range(1, count + 1)]
    return plan


def accepted(status):
    """The first pipeline's accepted records, summed over its versions."""
    try:
        return sum(int(c["accepted"]) for c in status[0]["versions"].values())
    except (TypeError, KeyError, IndexError, ValueError, AttributeError) as e:
        raise Die(f"GET /pipelines: no pipeline with per-version accepted counters ({e!r})") from None


def stall_table(rows, produced, accepted_n, lag):
    """The table, the records line and the goal from stalls.tsv's rows."""
    lines = ["| case | swaps | stall ms: min | median | max | swap request ms: median | max |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    worst = {}
    for case in ("cached", "uncached"):
        try:
            ms = sorted(float(r["stall_ms"]) for r in rows if r["case"] == case)
            took = sorted(float(r["swap_ms"]) for r in rows if r["case"] == case)
        except (KeyError, TypeError, ValueError) as e:
            raise Die(f"stalls.tsv: a {case} row without a number ({e!r})") from None
        if not ms:
            raise Die(f"stalls.tsv: no {case} swaps")
        worst[case] = ms[-1]
        lines.append(f"| {case} | {len(ms)} | {ms[0]:.2f} | {statistics.median(ms):.2f} | {ms[-1]:.2f} "
                     f"| {statistics.median(took):.1f} | {took[-1]:.1f} |")
    lines.append("")
    lines.append(f"records: produced {produced}, accepted {accepted_n}, group lag after the run {lag}")
    met = "met" if worst["cached"] <= CACHED_GOAL_MS else "not met"
    lines.append(f"goal: cached stall ≤ 5 ms: {met} (longest {worst['cached']:.2f} ms)")
    return "\n".join(lines) + "\n"


class Swapper:
    """One host and its admin endpoint: every swap, and the wait for the new version's first judged batch."""

    def __init__(self, host, records):
        self.host = host
        self.records = records

    def pipeline(self):
        status = self.host.status(timeout=10)
        if not status:
            raise Die("the host's admin endpoint did not answer GET /pipelines")
        return status[0]

    def swap(self, path):
        """POST /pipelines/bench/swap to PATH: the new active version. OSError, ValueError or KeyError when the host
        did not answer 200 with one."""
        status, body = bench_host.admin_post(self.host.admin_port, "/pipelines/bench/swap", {"path": str(path)},
                                             timeout=120)
        if status != 200:
            raise OSError(f"HTTP {status} {body.decode(errors='replace')[:200]}")
        return json.loads(body)["active_version"]

    def run(self, plan, tsv_path):
        with open(tsv_path, "w") as tsv:
            tsv.write("case\tswap\tstall_ms\tswap_ms\taccepted_at_swap\n")
            for case, i, path in plan:
                before = accepted([self.pipeline()])
                t0 = time.monotonic()
                try:
                    new = self.swap(path)
                except (OSError, ValueError, KeyError) as e:
                    raise Die(f"swap {i} ({case}) to {path}: {e}") from None
                took = (time.monotonic() - t0) * 1e3
                # Until the new version judged its first batch.
                deadline = time.monotonic() + HOST_WAIT_S
                while True:
                    p = self.pipeline()
                    if p.get("active_version") == new and p.get("versions", {}).get(new, {}).get("batches", 0) > 0:
                        break
                    if not self.host.running():
                        raise Die(f"swap {i} ({case}): the host exited")
                    if time.monotonic() > deadline:
                        raise Die(f"swap {i} ({case}): the new version judged no batch within {HOST_WAIT_S} s")
                    time.sleep(SWAP_POLL_S)
                if accepted([p]) >= self.records:
                    raise Die(f"the topic ran dry during swap {i} ({case}): raise BENCH_SWAP_RECORDS")
                tsv.write(f"{case}\t{i}\t{p.get('last_swap_stall_ms')}\t{took:.1f}\t{before}\n")


def wait_accepted(host, target, what):
    """Until the host accepted TARGET records; Dies when it exits first or after HOST_WAIT_S."""
    t0 = time.monotonic()
    while True:
        status = host.status()
        if status is not None and accepted(status) >= target:
            return
        if not host.running():
            host.tail()
            raise Die(f"the host exited {what}")
        if time.monotonic() - t0 >= HOST_WAIT_S:
            raise Die(f"the host had not accepted {target} records {HOST_WAIT_S}s {what} (see {host.stderr_path})")
        time.sleep(bench_host.POLL_S)


def run(environ):
    records, count, admin_port = config_from_env(environ)
    stamp = bench_host.utc_stamp("%Y%m%d-%H%M%S")
    out = REPO / "target" / "bench-swap" / stamp
    out.mkdir(parents=True, exist_ok=True)
    broker = host = None
    try:
        note("building the host (release) and the guests")
        sharehost = bench_host.build_release()["sharehost"]
        accept_all = bench_host.build_guests(out / "build-guests.log", ("accept_all",))["accept_all"]
        broker = bench_host.Broker(say=note)
        broker.attach(log=out / "broker.log")
        env = {"SHAREHOST_CACHE_DIR": str(out / "cache")}
        a, b = out / "a.wasm", out / "b.wasm"
        shutil.copy(accept_all, a)
        b.write_bytes(with_section(a.read_bytes(), "sharehost-bench-swap-b"))

        topic = group = f"bench-swap-{stamp}"
        broker.create_topic(topic, 6, out / "create.log")
        broker.share_earliest(group, out / "group.log")
        note(f"producing {records} records of 100 B to {topic}")
        rc, text = broker.tool("org.apache.kafka.tools.ProducerPerformance", "--bootstrap-server", broker.bootstrap,
                               "--topic", topic, "--num-records", records, "--record-size", "100", "--throughput", "-1",
                               "--command-property", "acks=1", "linger.ms=5", "batch.size=262144",
                               "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
                               log=out / "produce.log")
        if rc != 0:
            sys.stderr.write("\n".join(text.splitlines()[-20:]) + "\n")
            raise Die("producing failed")

        def manifest(path, component):
            path.write_text(bench_host.manifest(broker.bootstrap, admin_port,
                                                [bench_host.Pipeline("bench", [topic], group, str(component))],
                                                client_id="sharehost-bench-swap"))

        manifest(out / "b.toml", b)
        with open(out / "check-b.log", "wb") as log:
            if subprocess.call([str(sharehost), "check", str(out / "b.toml")], stdout=log, stderr=subprocess.STDOUT,
                               env=dict(os.environ, **env)) != 0:
                sys.stderr.write((out / "check-b.log").read_text(errors="replace"))
                raise Die("check of B failed")
        manifest(out / "run.toml", a)
        if bench_host.port_in_use(admin_port):
            raise Die(f"admin port {admin_port} is taken (set BENCH_SWAP_ADMIN_PORT)")
        host = Host([sharehost, "run", out / "run.toml"], admin_port, out / "host.log", env=env)
        wait_accepted(host, JUDGING_BEFORE_SWAPS, "after its start")

        for i in range(1, count + 1):
            (out / f"u{i}.wasm").write_bytes(with_section(a.read_bytes(), f"sharehost-bench-swap-u{i}-{stamp}"))
        note(f"swapping: {count} cached, then {count} uncached")
        Swapper(host, records).run(swap_plan(count, a, b, out), out / "stalls.tsv")

        note("draining")
        wait_accepted(host, records, "after the last swap")
        for path, name in (("/pipelines", "pipelines.json"), ("/metrics", "metrics.txt")):
            body = bench_host.admin_get(admin_port, path)
            if body is None:
                raise Die(f"GET {path} did not answer after the drain")
            (out / name).write_bytes(body)
        if host.stop(HOST_WAIT_S) != 0:
            raise Die(f"the host failed on SIGTERM (see {out}/host.log)")
        host = None
        accepted_n = accepted(json.loads((out / "pipelines.json").read_text()))
        if accepted_n != records:
            raise Die(f"accepted {accepted_n} of {records} records")

        _, text = broker.tool("org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--bootstrap-server",
                              broker.bootstrap, "--describe", "--group", group)
        (out / "lag.txt").write_text(text)
        lag = bench_host.share_group_lag(text, group)
        with open(out / "stalls.tsv", newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        table = stall_table(rows, records, accepted_n, "unknown" if lag is None else lag)
        (out / "table.md").write_text(table)
        sys.stdout.write(table)
        note(f"raw output: {out.relative_to(REPO)}")
    finally:
        if host is not None:
            host.kill()
        if broker is not None:
            broker.close()


def main(argv, environ=os.environ):
    if argv:
        sys.stdout.write(__doc__)
        return 0 if argv[0] in ("-h", "--help", "help") else 2

    def body(on_exit):
        os.chdir(REPO)
        run(environ)
        return 0

    return bench_host.driver_main(NAME, body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
