#!/usr/bin/env python3
"""dev/soak-plot.py: draws dev/soak's samples as one PNG and applies the soak's RSS rule (run by dev/soak).

Why: a soak is judged by its curves (memory, descriptors, in-flight, throughput over time, around every swap and
the broker restart), and by one rule that a script can check:

  RSS rule: warm-up W = min(5 min, run length / 6); baseline = the largest RSS sampled in the last minute of the
  warm-up (t in (W - 60 s, W]); the run fails if any sample after W exceeds baseline * (1 + GROWTH/100).

Usage: soak-plot.py SAMPLES.csv EVENTS.csv OUT.png RSS.json --minutes M [--growth-pct 10] [--title T]
SAMPLES.csv: t_s, rss_kib, fds, in_flight, accepted_total, records_per_s, host_cpu_pct, load1, event (dev/soak).
EVENTS.csv: t_s, event (swaps are drawn green, broker stop/up red).
Prints the RSS figures, writes them (and fds, records/s, load) to RSS.json; exits 1 if the rule fails.
Needs matplotlib (dev/soak-requirements.txt, in target/soak-venv).
"""
import argparse
import csv
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def column(rows, name, conv=float):
    """(t, value) pairs of one column, leaving out samples where it is empty (the admin endpoint did not answer)."""
    return [(r["t_s"], conv(r[name])) for r in rows if r[name] != ""]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("events")
    ap.add_argument("png")
    ap.add_argument("json")
    ap.add_argument("--minutes", type=float, required=True)
    ap.add_argument("--growth-pct", type=float, default=10.0)
    ap.add_argument("--title", default="sharehost soak")
    a = ap.parse_args()

    with open(a.samples, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["t_s"] = float(r["t_s"])
    with open(a.events, newline="") as f:
        events = [(float(r["t_s"]), r["event"]) for r in csv.DictReader(f)]
    rss = column(rows, "rss_kib")
    if not rss:
        sys.exit("rss: no samples")

    warmup = min(300.0, a.minutes * 60 / 6)
    window = [v for t, v in rss if warmup - 60 < t <= warmup]
    later = [(t, v) for t, v in rss if t > warmup]
    if not window or not later:
        sys.exit(f"rss: no samples in the baseline window ({warmup - 60:.0f}, {warmup:.0f}] s or after it")
    base = max(window)
    base_avg = sum(window) / len(window)
    limit = base * (1 + a.growth_pct / 100)
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
        "fds_min": min(fds),
        "fds_max": max(fds),
        "records_per_s_mean": round(sum(rps) / len(rps)) if rps else None,
        "records_per_s_min": min(rps) if rps else None,
        "records_per_s_max": max(rps) if rps else None,
        "host_cpu_pct_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
        "load1_mean": round(sum(load) / len(load), 2) if load else None,
        "samples": len(rows),
    }
    # What each swap and the broker restart did to RSS: the last sample before the next such event (or the end)
    # minus the last sample before this one; events less than 5 s apart count as one. A one-time step that stays,
    # or growth that comes back with every event, tells a warm-up from a leak.
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
    figures["rss_steps"] = steps
    with open(a.json, "w") as f:
        json.dump(figures, f, indent=1)

    panels = [
        ("rss_kib", "RSS (MiB)", 1 / 1024),
        ("fds", "open fds", 1),
        ("in_flight", "in-flight records", 1),
        ("records_per_s", "records/s (accepted)", 1),
        ("host_cpu_pct", "host CPU (% of a core)", 1),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 13), sharex=True)
    for ax, (name, label, scale) in zip(axes, panels):
        pts = column(rows, name)
        ax.plot([t / 60 for t, _ in pts], [v * scale for _, v in pts], lw=1.2, color="tab:blue", marker=".", ms=3)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        for t, what in events:
            if what.startswith("swap"):
                ax.axvline(t / 60, color="tab:green", ls=":", lw=1)
            elif what.startswith("broker: stop-broker") or what.startswith("broker: up"):
                ax.axvline(t / 60, color="tab:red", ls="--", lw=1)
    ax0 = axes[0]
    ax0.axvspan(0, warmup / 60, color="0.9", zorder=0, label=f"warm-up ({warmup / 60:.2g} min)")
    ax0.axhline(base / 1024, color="tab:orange", lw=1, label=f"baseline {base / 1024:.1f} MiB")
    ax0.axhline(limit / 1024, color="tab:red", lw=1, label=f"limit +{a.growth_pct:g} % ({limit / 1024:.1f} MiB)")
    ax0.set_ylim(0, max(limit, v_max) / 1024 * 1.15)
    ax0.plot([], [], color="tab:green", ls=":", label="hot swap")
    ax0.plot([], [], color="tab:red", ls="--", label="broker stop / up")
    ax0.legend(loc="lower right", fontsize=8, ncol=3)
    axes[-1].set_xlabel("minutes since the producer started")
    fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.png, dpi=90)

    ok = v_max <= limit
    print(
        f"rss: baseline {base / 1024:.1f} MiB (max of ({warmup - 60:.0f}, {warmup:.0f}] s; avg {base_avg / 1024:.1f}), "
        f"largest after it {v_max / 1024:.1f} MiB at {t_max / 60:.1f} min ({figures['growth_max_pct']:+.1f} %), "
        f"end {end / 1024:.1f} MiB ({figures['growth_end_pct']:+.1f} %), limit +{a.growth_pct:g} %: "
        + ("ok" if ok else "EXCEEDED")
    )
    print(
        f"samples {len(rows)}: fds {min(fds):.0f}-{max(fds):.0f}, records/s mean {figures['records_per_s_mean']} "
        f"(min {figures['records_per_s_min']}, max {figures['records_per_s_max']}), host CPU mean "
        f"{figures['host_cpu_pct_mean']} %, 1-min load mean {figures['load1_mean']}"
    )
    if steps:
        print(
            "rss steps at events: "
            + ", ".join(f"{s['event']} at {s['t_s'] / 60:.1f} min {s['rss_step_kib'] / 1024:+.2f} MiB" for s in steps)
        )
    if not ok:
        print(f"rss: grew {figures['growth_max_pct']:+.1f} % over the warm-up baseline (limit {a.growth_pct:g} %)")
        sys.exit(1)


if __name__ == "__main__":
    main()
