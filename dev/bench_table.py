#!/usr/bin/env python3
"""dev/bench_table.py: the one table of dev/bench, from a run's results.tsv and machine.txt.

    dev/bench_table.py render RUN_DIR        RUN_DIR/table.md: the table, the goals, the machine block
    dev/bench_table.py docs RUN_DIR DOCS     RUN_DIR/table.md's table and goals, with the run's date, load
                                             range, machine, commit and command, into DOCS between the markers
                                             of its "One table" section; nothing outside them changes

dev/bench calls both after a run (docs only with BENCH_DOCS=1) and `render` alone for BENCH_RETABLE. A program of
its own so that the table can be tested without a broker (dev/test_bench_table.py, fixtures in
dev/testdata/bench-table/) and changed without running a benchmark.

results.tsv has a header line, then one row per run: size, processes, kind, records, t0_us, first_us, last_us,
cpu_s, rss_kb, broker_cpu_s, load, lag, status, extra (see dev/bench.py's docstring for what each means). Columns of the
table: first record s = first_us - t0_us; wall s = last_us - t0_us; records/s = records / wall (the join included);
steady = records / (last_us - first_us); "× classic" divides by the classic consumer's row of the same size at one
process; CPU and broker CPU per 10^6 records (the broker's also without its JIT compilers' seconds, in brackets,
when the extra column has broker_jit_s); peak RSS in MiB. A row whose status is not "ok" is struck through,
compared with nothing and left out of the goals.

Standard library only: it runs wherever dev/bench runs, with no venv to set up.
"""

import csv
import math
import os
import pathlib
import sys
import tempfile

# The table's row order within a size and process count, and each kind's name in the table.
KINDS = ("classic", "java", "krafka", "rdkafka", "wasm", "wasm-fleet", "native", "wasm-avro", "wasm-trace-1pct",
         "wasm-trace-all", "wasm-reader", "native-reader", "wasm-validator", "native-validator", "wasm-splitter",
         "wasm-fleet-splitter", "wasm-eo-splitter")
NAMES = {
    "wasm": "sharehost, Wasm accept-all",
    "wasm-fleet": "sharehost, Wasm accept-all, fleet host",
    "wasm-avro": "sharehost, Wasm accept-all, Avro values decoded",
    "wasm-trace-1pct": "sharehost, Wasm accept-all, traces 1 % sampled",
    "wasm-trace-all": "sharehost, Wasm accept-all, traces 100 % sampled",
    "native": "sharehost, native accept-all",
    "wasm-reader": "sharehost, Wasm value-reader",
    "native-reader": "sharehost, native value-reader",
    "wasm-validator": "sharehost, Wasm order-validator",
    "native-validator": "sharehost, native order-validator",
    "wasm-splitter": "sharehost, Wasm splitter (one output per record)",
    "wasm-fleet-splitter": "sharehost, Wasm splitter, fleet host",
    "wasm-eo-splitter": "sharehost, Wasm splitter, exactly-once",
    "java": "Apache ShareConsumerPerformance",
    "classic": "Apache classic ConsumerPerformance (ceiling)",
    "krafka": "krafka 0.28.1 share consumer",
    "rdkafka": "confluent-kafka-python 2.16.1 ShareConsumer",
}
# Each Wasm kind's native twin: the same pipeline with the plugin's work done natively.
TWIN = {"wasm": "native", "wasm-reader": "native-reader", "wasm-validator": "native-validator"}
PEERS = ("java", "krafka", "rdkafka")
COLUMNS = ("size", "processes", "kind", "records", "t0_us", "first_us", "last_us", "cpu_s", "rss_kb",
           "broker_cpu_s", "load", "lag", "status")
HEADER = ("| value | processes | consumer | records | first record s | wall s | records/s | × classic "
          "| steady records/s | × classic (steady) | Wasm / native (records/s / steady) | CPU s per 1M records "
          "| peak RSS MiB per process | broker CPU s per 1M (without its JIT) | acknowledged (lag after) | load |")
ALIGN = "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|"
BEGIN = "<!-- dev/bench writes from here"
END = "<!-- dev/bench writes up to here -->"


class BadInput(Exception):
    """Input the table cannot be made from; the message names the file and the line or field."""


class Row:
    """One run of results.tsv, with the figures the table shows derived once."""

    def __init__(self, path, line, fields):
        def number(col, convert=float):
            text = fields[COLUMNS.index(col)]
            try:
                return convert(text)
            except ValueError:
                raise BadInput(f"{path}:{line}: field {col} is '{text}', not a number") from None

        self.size = number("size", int)
        self.procs = number("processes", int)
        self.kind = fields[2]
        self.records = number("records", int)
        t0, first, last = number("t0_us", int), number("first_us", int), number("last_us", int)
        self.status = fields[12]
        self.ok = self.status == "ok"
        self.load = fields[10]
        self.lag = None if fields[11] == "-" else number("lag", int)
        if self.ok and self.kind != "classic" and self.lag is None:
            raise BadInput(f"{path}:{line}: a share-group run with status ok has no lag")
        self.key = (self.size, self.procs, self.kind)
        self.wall = (last - t0) / 1e6
        steady_s = (last - first) / 1e6
        self.rate = self.records / self.wall if self.wall > 0 else 0
        self.steady = self.records / steady_s if steady_s > 0 else 0
        self.first = (first - t0) / 1e6
        per_million = self.records / 1e6
        self.cpu = f"{number('cpu_s') / per_million:.2f}" if self.records > 0 else "-"
        self.rss_mib = number("rss_kb") / 1024
        # The diagnostics after the columns: words KEY=VALUE (dev/bench's sharehost_extra).
        extra = fields[len(COLUMNS)] if len(fields) > len(COLUMNS) else ""
        self.extra = dict(w.split("=", 1) for w in extra.split() if "=" in w)
        # The broker's CPU with and without what its JIT compilers took meanwhile (a warm broker's cost per record;
        # compilation is paid once in a broker's life), when the run measured that.
        broker_s = number("broker_cpu_s")
        try:
            jit_s = float(self.extra["broker_jit_s"])
        except (KeyError, ValueError):
            jit_s = None
        self.broker_warm = (broker_s - jit_s) / per_million if jit_s is not None and self.records > 0 else None
        self.broker = "-" if self.records <= 0 else f"{broker_s / per_million:.2f}" + (
            "" if self.broker_warm is None else f" ({self.broker_warm:.2f})")

    def write_ms(self):
        """The mean time of an output write in ms, or None when the run wrote nothing (or did not say)."""
        try:
            return float(self.extra["write_ms"])
        except (KeyError, ValueError):
            return None


def read_rows(path):
    """The rows of results.tsv in file order (the order they ran in)."""
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for n, text in enumerate(lines[1:], start=2):
        fields = text.split("\t")
        if len(fields) < len(COLUMNS):
            raise BadInput(f"{path}:{n}: {len(fields)} fields, expected at least {len(COLUMNS)} ({', '.join(COLUMNS)})")
        rows.append(Row(path, n, fields))
    return rows


def thousands(x):
    """The integer part of x with commas: 1234567.8 -> 1,234,567."""
    return f"{int(x):,}"


def size_name(size):
    return "1 KiB" if size == 1024 else f"{size} B"


def ratio(a, b):
    return f"{a / b:.2f}" if a > 0 and b > 0 else "-"


def div(a, b):
    """a / b, and inf (or nan) for b == 0 as C would give: a goal over a degenerate row still renders, and says so."""
    if b != 0:
        return a / b
    return math.nan if a == 0 else math.copysign(math.inf, a)


def goal(text, met, detail):
    return f"- {text}: **{'met' if met else 'not met'}**: {detail}"


def render_body(rows):
    """The table and the goals, one string per line."""
    # A later row with the same size, processes and kind stands for the key (as the table shows one row per key).
    by_key = {r.key: r for r in rows}
    ok = {k: r.ok for k, r in by_key.items()}
    sizes = list(dict.fromkeys(r.size for r in rows))
    procs = sorted(set(r.procs for r in rows))
    # The records of the first ok one-process row: what a quota run's lag is a fraction of.
    total = next((r.records for r in rows if r.ok and r.procs == 1), 0)

    out = [HEADER, ALIGN]
    for size in sizes:
        for p in procs:
            for kind in KINDS:
                r = by_key.get((size, p, kind))
                if r is None:
                    continue
                classic = by_key.get((size, 1, "classic"))
                if classic is not None and not classic.ok:
                    classic = None
                wn = "-"
                twin = by_key.get((size, p, TWIN.get(kind)))
                if kind in TWIN and twin is not None and twin.ok and r.ok:
                    wn = f"{ratio(r.rate, twin.rate)} / {ratio(r.steady, twin.steady)}"
                if kind == "classic":
                    acked = "- (classic group)"
                elif not r.ok:
                    acked = "**FAILED**: " + r.status.removeprefix("failed: ")
                elif r.lag == 0:
                    acked = "yes (0)"
                elif total == 0:
                    # No one-process row read the whole topic: the lag cannot be given as a share of it.
                    acked = f"yes; {thousands(r.lag)} left by the quotas"
                else:
                    acked = f"yes; {thousands(r.lag)} left by the quotas ({100 * r.lag / total:.3f}%)"
                bad = not r.ok
                name = NAMES.get(kind, "")
                vs_classic = bad or classic is None
                out.append(
                    f"| {size_name(size)} | {p} | {f'~~{name}~~' if bad else name} | {thousands(r.records)} "
                    f"| {r.first:.2f} | {r.wall:.2f} | {thousands(r.rate)} "
                    f"| {'-' if vs_classic else ratio(r.rate, classic.rate)} | {thousands(r.steady)} "
                    f"| {'-' if vs_classic else ratio(r.steady, classic.steady)} | {wn} | {r.cpu} | {r.rss_mib:.0f} "
                    f"| {r.broker} | {acked} | {r.load} |")

    out += ["", "Goals, from the rows above (failed rows left out):", ""]
    # 1. Time to first record, every sharehost row.
    worst, where = -1.0, ""
    for r in rows:
        first = by_key[r.key].first
        if r.kind.startswith(("wasm", "native")) and ok[r.key] and first > worst:
            worst, where = first, f"{size_name(r.size)} {r.procs}p {r.kind}"
    if worst < 0:
        out.append("- time to first record ≤ 1 s (sharehost): no sharehost row")
    else:
        out.append(goal("time to first record ≤ 1 s (sharehost)", worst <= 1, f"slowest {worst:.2f} s ({where})"))
    # 2. records/s including the join ≥ 3× every share peer: Wasm accept-all against each peer at the same size and
    #    process count.
    for size in sizes:
        lo, detail = None, []
        for r in rows:
            if r.size != size or r.kind not in PEERS:
                continue
            wasm = by_key.get((r.size, r.procs, "wasm"))
            if wasm is None or not wasm.ok:
                continue
            peer = by_key[r.key]
            if not peer.ok:
                detail.append(f"{r.kind} {r.procs}p FAILED (not compared)")
                continue
            x = div(wasm.rate, peer.rate)
            detail.append(f"{x:.2f}× {r.kind} {r.procs}p")
            lo = x if lo is None or x < lo else lo
        text = f"records/s incl. join ≥ 3× every share peer at {size_name(size)}"
        if lo is None:
            out.append(f"- {text}: no comparable rows" + (f" ({'; '.join(detail)})" if detail else ""))
        else:
            out.append(goal(text, lo >= 3, "; ".join(detail)))
    # 3. steady ≥ 0.6× classic at 100 B, ≥ 1.0× at any other size: Wasm accept-all against the classic consumer, both
    #    one process.
    for size in sizes:
        wasm, classic = by_key.get((size, 1, "wasm")), by_key.get((size, 1, "classic"))
        need = 0.6 if size == 100 else 1.0
        if wasm is None or classic is None or not wasm.ok or not classic.ok:
            out.append(f"- steady ≥ {need:.1f}× classic at {size_name(size)}: no comparable rows")
            continue
        x = div(wasm.steady, classic.steady)
        out.append(goal(f"steady ≥ {need:.1f}× classic at {size_name(size)} (1 process each)", x >= need, f"{x:.2f}×"))
    # 4. Wasm ≥ 0.9× native steady for accept-all and the value reader, ≥ 0.8× for the order validator (whose guest
    #    parses JSON in Wasm), every pair.
    for kinds, need in ((("wasm", "wasm-reader"), 0.9), (("wasm-validator",), 0.8)):
        lo, detail = None, []
        for r in rows:
            if r.kind not in kinds:
                continue
            wasm, native = by_key[r.key], by_key.get((r.size, r.procs, TWIN[r.kind]))
            if native is None or not native.ok or not wasm.ok:
                continue
            x = div(wasm.steady, native.steady)
            detail.append(f"{x:.2f} {r.kind} {size_name(r.size)} {r.procs}p")
            lo = x if lo is None or x < lo else lo
        text = f"Wasm ≥ {need}× native steady ({', '.join(kinds)})"
        if lo is None:
            out.append(f"- {text}: no Wasm/native pair")
        else:
            out.append(goal(f"{text}, every pair", lo >= need, f"lowest {lo:.2f} ({'; '.join(detail)})"))
    # 5. A fleet host judges as fast as a plain one (within the runs' noise, taken as 10 %), every pair.
    lo, detail = steady_pairs(rows, by_key, "wasm-fleet", "wasm", "CPU")
    if lo is not None:
        out.append(goal("fleet host ≥ 0.9× plain host steady (Wasm accept-all), every pair", lo >= 0.9,
                        f"lowest {lo:.2f} ({'; '.join(detail)})"))
    # 6. A fleet host's output writes take no longer than a plain host's (within 1.2×), every splitter pair: its
    #    writes do not wait behind the fleet agent's long polls.
    hi, detail = None, []
    for r in rows:
        if r.kind != "wasm-fleet-splitter":
            continue
        fleet, plain = by_key[r.key], by_key.get((r.size, r.procs, "wasm-splitter"))
        if plain is None or not plain.ok or not fleet.ok or fleet.write_ms() is None or plain.write_ms() is None:
            continue
        x = div(fleet.write_ms(), plain.write_ms())
        detail.append(f"{x:.2f} ({fleet.write_ms():.2f} ms against {plain.write_ms():.2f} ms, {size_name(r.size)} "
                      f"{r.procs}p)")
        hi = x if hi is None or x > hi else hi
    if hi is not None:
        out.append(goal("fleet host's output write ≤ 1.2× a plain host's (Wasm splitter), every pair", hi <= 1.2,
                        f"highest {hi:.2f}: {'; '.join(detail)}"))
    # 7. Exactly-once costs at most a fifth of at-least-once's rate with a plugin that writes, every pair: the
    #    transactions and the settled records ride on the writes the batches make anyway.
    lo, detail = steady_pairs(rows, by_key, "wasm-eo-splitter", "wasm-splitter", "host CPU")
    if lo is not None:
        out.append(goal("exactly-once ≥ 0.8× at-least-once steady (Wasm splitter), every pair", lo >= 0.8,
                        f"lowest {lo:.2f} ({'; '.join(detail)})"))
    # What schema decoding and traces cost, against the same plugin on raw values with traces off (not goals: the
    #    price of a feature a pipeline turns on).
    for kind, what in (("wasm-avro", "Avro values decoded"), ("wasm-trace-1pct", "traces, 1 % sampled"),
                       ("wasm-trace-all", "traces, every record sampled")):
        _, detail = steady_pairs(rows, by_key, kind, "wasm", "host CPU")
        if detail:
            out.append(f"- {what}, against Wasm accept-all on raw values with traces off: {'; '.join(detail)}")
    # 8. The broker's CPU per 1M records at 100 B, without its JIT compilers, ≤ 1.0 s for every sharehost row that
    #    measured it, writes nothing (a splitter's broker also appends an output per record) and gives each
    #    producer batch verdicts of one kind: the value reader rejects about 1 in 16 records, scattered, and a
    #    batch with two kinds of verdict is tracked by the broker offset by offset whatever the client does (its
    #    rows are shown on a line of their own, not held to the goal); 9. the host's own CPU per 1M records at
    #    100 B ≤ 0.5 s for Wasm accept-all.
    hi, detail, mixed = None, [], []
    for r in rows:
        if r.size != 100 or not r.kind.startswith(("wasm", "native")) or "splitter" in r.kind or not r.ok \
                or r.broker_warm is None:
            continue
        if r.kind.endswith("-reader"):
            mixed.append(f"{r.broker_warm:.2f} {r.kind} {r.procs}p")
            continue
        detail.append(f"{r.broker_warm:.2f} {r.kind} {r.procs}p")
        hi = r.broker_warm if hi is None or r.broker_warm > hi else hi
    if hi is not None:
        out.append(goal("broker CPU ≤ 1.0 s per 1M records without its JIT (sharehost, 100 B, no writes, one kind "
                        "of verdict per producer batch), every row", hi <= 1.0,
                        f"highest {hi:.2f} ({'; '.join(detail)})"))
    if mixed:
        out.append("- broker CPU per 1M records without its JIT where the plugin rejects scattered records (not a "
                   "goal: the broker tracks such a producer batch offset by offset): " + "; ".join(mixed))
    for r in rows:
        if r.size == 100 and r.kind == "wasm" and r.ok and r.records > 0:
            out.append(goal(f"host CPU ≤ 0.5 s per 1M records (Wasm accept-all, 100 B, {r.procs}p)",
                            float(r.cpu) <= 0.5, f"{r.cpu} s"))
    return out


def steady_pairs(rows, by_key, kind, base, cpu_name):
    """The lowest steady rate of KIND over BASE at the same size and process count, and one line per pair (the
    ratio, and CPU_NAME's ratio beside it); (None, []) when no pair of good rows exists."""
    lo, detail = None, []
    for r in rows:
        if r.kind != kind:
            continue
        this, other = by_key[r.key], by_key.get((r.size, r.procs, base))
        if other is None or not other.ok or not this.ok:
            continue
        x = div(this.steady, other.steady)
        cpu = div(float(this.cpu), float(other.cpu))
        detail.append(f"{x:.2f} steady, {cpu:.2f} {cpu_name}, {size_name(r.size)} {r.procs}p")
        lo = x if lo is None or x < lo else lo
    return lo, detail


def indent(text):
    """Every line of text behind four spaces (a Markdown code block), the last line's ending kept as it was."""
    if text == "":
        return ""
    lines = text.split("\n")
    end = ""
    if text.endswith("\n"):
        lines.pop()
        end = "\n"
    return "\n".join("    " + line for line in lines) + end


def render(run):
    """RUN/table.md from RUN/results.tsv and RUN/machine.txt."""
    body = render_body(read_rows(run / "results.tsv"))
    machine = (run / "machine.txt").read_text(encoding="utf-8")
    write_atomically(run / "table.md", "\n".join(body) + "\n\n" + indent(machine))


def write_docs(run, docs):
    """RUN/table.md's table and goals, the run's date and load range, and its machine block into DOCS, between the
    begin marker's line and the end marker; the text before and after them is kept byte for byte."""
    text = docs.read_text(encoding="utf-8")
    begin_at = text.find(BEGIN)
    end_at = text.find(END, begin_at) if begin_at >= 0 else -1
    if begin_at < 0 or end_at < 0:
        raise BadInput(f"{docs}: the markers of the One table section are missing")
    newline = text.find("\n", begin_at)
    if newline < 0 or newline > end_at:
        raise BadInput(f"{docs}: the begin marker's line runs into the end marker")
    machine = (run / "machine.txt").read_text(encoding="utf-8")
    date = next((line.split(": ", 1)[1] for line in machine.splitlines() if line.startswith("date: ")), "?")
    with open(run / "results.tsv", newline="", encoding="utf-8") as f:
        loads = [float(r["load"]) for r in csv.DictReader(f, delimiter="\t") if r.get("load")]
    load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"
    body = (run / "table.md").read_text(encoding="utf-8").split("\n\n    ")[0].rstrip()
    block = (f"{text[begin_at:newline]}\n### Table (run of {date.replace('T', ' ').rstrip('Z')} UTC, 1-minute load "
             f"{load} during the runs)\n\n{body}\n\nMachine, commit and command as the script recorded them:\n\n```\n"
             f"{machine.rstrip()}\n```\n")
    write_atomically(docs, text[:begin_at] + block + text[end_at:])


def write_atomically(path, text):
    """A reader (or an interrupted run) sees the old file or the new one, never half of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, os.stat(path).st_mode & 0o777 if path.exists() else 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv):
    usage = "usage: dev/bench_table.py render RUN_DIR | dev/bench_table.py docs RUN_DIR DOCS_FILE"
    try:
        if len(argv) == 2 and argv[0] == "render":
            render(pathlib.Path(argv[1]))
        elif len(argv) == 3 and argv[0] == "docs":
            write_docs(pathlib.Path(argv[1]), pathlib.Path(argv[2]))
        else:
            print(usage, file=sys.stderr)
            return 2
    except (BadInput, OSError) as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
