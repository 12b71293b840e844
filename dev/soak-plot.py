#!/usr/bin/env python3
"""dev/soak-plot.py: draws dev/soak's samples as one PNG (run by dev/soak in target/soak-venv).

A soak is judged by its curves (memory, descriptors, in-flight, throughput and host CPU over time, around every swap
and the broker restart) and by the RSS rule, which dev/soak_driver.py applies; this draws the curves, the warm-up,
the baseline and the limit from the rule's figures.

Usage: soak-plot.py SAMPLES.csv EVENTS.csv OUT.png RSS.json [--title T]
SAMPLES.csv: t_s, rss_kib, fds, in_flight, accepted_total, records_per_s, host_cpu_pct, load1, event (dev/soak).
EVENTS.csv: t_s, event (swaps are drawn green, broker stop/up red). RSS.json: the rule's figures (dev/soak).
Needs matplotlib (dev/soak-requirements.txt).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_driver import Die, column, read_events, read_samples  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("events")
    ap.add_argument("png")
    ap.add_argument("json")
    ap.add_argument("--title", default="sharehost soak")
    a = ap.parse_args()

    try:
        rows = read_samples(a.samples)
        events = read_events(a.events)
    except (Die, OSError) as e:
        sys.exit(f"plot: {e}")
    try:
        with open(a.json) as f:
            figures = json.load(f)
        warmup = float(figures["warmup_s"])
        base = float(figures["baseline_rss_kib"])
        limit = float(figures["limit_rss_kib"])
        v_max = float(figures["max_rss_after_warmup_kib"])
        growth_pct = float(figures["growth_pct"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot: {a.json}: not the RSS rule's figures ({e})")

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
    ax0.axhline(limit / 1024, color="tab:red", lw=1, label=f"limit +{growth_pct:g} % ({limit / 1024:.1f} MiB)")
    ax0.set_ylim(0, max(limit, v_max) / 1024 * 1.15)
    ax0.plot([], [], color="tab:green", ls=":", label="hot swap")
    ax0.plot([], [], color="tab:red", ls="--", label="broker stop / up")
    ax0.legend(loc="lower right", fontsize=8, ncol=3)
    axes[-1].set_xlabel("minutes since the producer started")
    fig.suptitle(a.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(a.png, dpi=90)


if __name__ == "__main__":
    main()
