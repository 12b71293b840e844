#!/usr/bin/env python3
"""dev/soak-ledger.py: the soak's lost-record ledger, kept outside the engine (run by dev/soak).

Why: the host's own counters cannot prove that nothing was lost; the topics can. The soak's producer writes the
decimal ids 0..N-1 as record values to the input topic; the ledger plugin emits each record's id to the output
topic, and the host produces only the emits of accepted records; a rejected record goes to the dead-letter topic
with its value. dev/soak reads the three topics back with plain Fetch (ConsoleConsumer, one value per line) and this
script compares them:

  produced   distinct ids in the input topic
  accepted   distinct ids in the output topic
  dead       distinct ids in the dead-letter topic
  duplicates output records beyond the first of their id (at-least-once redeliveries)
  lost       produced ids in neither the output nor the dead-letter topic
  foreign    ids in the output or dead-letter topic that were never produced

Usage: soak-ledger.py (IN.txt | --range N) OUT.txt DLQ.txt LEDGER.json
`--range N` stands for an input topic known to hold exactly the ids 0..N-1 once each (dev/soak passes it when the
producer sent N ids with no failed send and the topic's end offsets add up to N, which saves reading it back).
Prints one ledger line (and up to 20 lost ids); writes the figures to LEDGER.json; exits 1 if lost or foreign > 0
or a line is not a decimal id.
"""
import json
import sys

import numpy as np


def ids(path):
    """The ids of one read-back topic (one decimal per line), checked: a line that is not one fails the run."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    if not data.strip():
        return np.zeros(0, dtype=np.int64)
    values = np.array(data.split(), dtype=np.int64) if lines < 1_000_000 else np.fromstring(data, dtype=np.int64, sep="\n")
    if len(values) != lines or (len(values) and values.min() < 0):
        sys.exit(f"ledger: {path}: {lines} lines but {len(values)} non-negative decimal ids")
    return values


def main():
    args = sys.argv[1:]
    if len(args) == 5 and args[0] == "--range" and args[1].isdigit():
        inp = np.arange(int(args[1]), dtype=np.int64)
        args = args[2:]
    elif len(args) == 4:
        inp = ids(args[0])
        args = args[1:]
    else:
        sys.exit(__doc__)
    out, dlq = (ids(p) for p in args[0:2])
    size = 1 + max((int(a.max()) for a in (inp, out, dlq) if len(a)), default=0)
    c_in, c_out, c_dlq = (np.bincount(a, minlength=size) for a in (inp, out, dlq))
    produced = int((c_in > 0).sum())
    accepted = int((c_out > 0).sum())
    dead = int((c_dlq > 0).sum())
    duplicates = int(c_out.sum()) - accepted
    lost_ids = np.flatnonzero((c_in > 0) & (c_out == 0) & (c_dlq == 0))
    foreign = int(((c_in == 0) & ((c_out > 0) | (c_dlq > 0))).sum())
    figures = {
        "input_records": int(len(inp)),
        "produced": produced,
        "accepted": accepted,
        "dead_lettered": dead,
        "output_records": int(len(out)),
        "duplicates": duplicates,
        "lost": int(len(lost_ids)),
        "foreign": foreign,
        "lost_ids_first": [int(i) for i in lost_ids[:20]],
    }
    with open(args[2], "w") as f:
        json.dump(figures, f, indent=1)
    print(
        f"ledger: produced {produced} (input records {len(inp)}), accepted {accepted}, dead-lettered {dead}, "
        f"output records {len(out)}, duplicates {duplicates}, foreign {foreign}, lost {len(lost_ids)}"
    )
    if len(lost_ids):
        print("ledger: first lost ids: " + ", ".join(str(i) for i in lost_ids[:20]))
    if len(lost_ids) or foreign:
        print(f"ledger: {len(lost_ids)} records lost, {foreign} outputs of ids never produced")
        sys.exit(1)


if __name__ == "__main__":
    main()
