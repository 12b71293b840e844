#!/usr/bin/env python3
"""dev/bench_formats.py: what schema-encoded records and traces cost the host, as host CPU per million records and
as ratios to the same run without them.

Runs release `sharehost run` (the image's static binary, or --bin) with the accept-all plugin on one topic of N
records, once per case, alternated over --rounds, and reads the host's CPU from /proc when every record is judged:

  raw         100 B values as they are (the baseline)
  avro        the same orders written by Confluent's Avro serializer, decoded by the host ([pipeline.schema])
  trace-0     raw, [telemetry] on with sample = 0 (spans made, none kept: the price of the machinery)
  trace-1pct  raw, sample = 0.01
  trace-all   raw, sample = 1 (every record's span exported to dev/otelcol)

Needs the broker (dev/kafka up), the registry (dev/registry up) and the collector (dev/otelcol up); the Avro
records come from dev/schema_records.py. Prints one line per run and a table of medians; the host's CPU is the
process's utime + stime at the moment the last record is judged, less what it used before the first (its start).

Usage: python3 dev/bench_formats.py [--records N] [--rounds R] [--bin PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEV = Path(os.path.abspath(os.path.dirname(__file__)))
REPO = DEV.parent
sys.path.insert(0, str(DEV))
import bench_host  # noqa: E402  (dev/ is not a package)

REGISTRY = "http://127.0.0.1:18081/apis/ccompat/v7"
COLLECTOR = "http://127.0.0.1:14318"
CASES = ("raw", "avro", "trace-0", "trace-1pct", "trace-all")


def sharehost(bin_path, *args, stdin=None):
    """Runs a sharehost subcommand; its stdout, or Die with its stderr."""
    out = subprocess.run([str(bin_path), *args], input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        raise bench_host.Die(f"sharehost {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def orders(n):
    """N orders of about 100 bytes as JSON."""
    return [{"id": f"o-{i:08d}", "amount": float(i % 997) + 0.5, "customer": f"customer-{i % 131:04d}",
             "quantity": i % 7} for i in range(n)]


def write_inputs(work, n):
    """The two input files in `sharehost produce`'s format: raw JSON values and Avro-encoded ones."""
    docs = orders(n)
    raw = work / "raw.jsonl"
    raw.write_text("".join(json.dumps({"key": d["id"], "value": json.dumps(d)}) + "\n" for d in docs))
    avro = work / "avro.jsonl"
    encoded = subprocess.run(
        [sys.executable, str(DEV / "schema_records.py"), "encode", "--registry", REGISTRY, "--format", "avro",
         "--schema", str(REPO / "tests/fixtures/schemas/order.avsc"), "--topic", "bench-formats-avro",
         "--key-field", "id"],
        input="".join(json.dumps(d) + "\n" for d in docs), capture_output=True, text=True)
    if encoded.returncode != 0:
        raise bench_host.Die(f"dev/schema_records.py encode: {encoded.stderr.strip()}")
    avro.write_text(encoded.stdout)
    return raw, avro


def one_run(bin_path, case, topic, n, work, stamp):
    """Runs one case to the last record judged; the host's CPU seconds."""
    group = f"bench-formats-{case}-{stamp}"
    extra = 'start = "earliest"\n'
    before = ""
    if case == "avro":
        extra += f'[pipeline.schema]\nregistry = "{REGISTRY}"\nvalue = "avro"\n'
    if case.startswith("trace"):
        sample = {"trace-0": 0.0, "trace-1pct": 0.01, "trace-all": 1.0}[case]
        before = f'[telemetry]\notlp_endpoint = "{COLLECTOR}"\nsample = {sample}\nservice_name = "{group}"\n'
    port = 29500 + CASES.index(case)
    text = bench_host.manifest("127.0.0.1:9092", port, [bench_host.Pipeline(
        name="bench", topics=[topic], group=group, component=str(REPO / "target/guests/accept_all.wasm"),
        extra=extra)], before=before)
    manifest = work / f"{case}.toml"
    manifest.write_text(text)
    host = bench_host.Host([str(bin_path), "run", str(manifest)], port, work / f"{case}-{stamp}.log")
    try:
        host.wait_ready(120)
        start = bench_host.cpu_seconds(host.pid)
        host.wait_judged(n, idle_s=120)
        used = bench_host.cpu_seconds(host.pid) - start
    finally:
        host.stop()
    return used


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bin", default=str(REPO / "target/x86_64-unknown-linux-musl/image/sharehost"))
    a = p.parse_args(argv)
    bin_path = Path(a.bin)
    work = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    stamp = time.strftime("%H%M%S")
    raw_file, avro_file = write_inputs(work, a.records)
    results = {c: [] for c in CASES}
    for r in range(a.rounds):
        for case in CASES:
            topic = f"bench-formats-{case}-{stamp}-{r}"
            sharehost(bin_path, "create-topics", topic, "--partitions", "3", "--bootstrap", "127.0.0.1:9092")
            source = avro_file if case == "avro" else raw_file
            sharehost(bin_path, "produce", topic, "--bootstrap", "127.0.0.1:9092", "--input", str(source))
            used = one_run(bin_path, case, topic, a.records, work, f"{stamp}-{r}")
            per_million = used * 1_000_000 / a.records
            results[case].append(per_million)
            print(f"round {r + 1} {case}: {per_million:.2f} host CPU s per 1M records", flush=True)
    base = statistics.median(results["raw"])
    print(f"\n| case | host CPU s per 1M (median of {a.rounds}) | against raw |\n|---|---:|---:|")
    for case in CASES:
        m = statistics.median(results[case])
        print(f"| {case} | {m:.2f} | {m / base:.2f}x |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except bench_host.Die as e:
        print(f"dev/bench_formats.py: error: {e}", file=sys.stderr)
        sys.exit(1)
