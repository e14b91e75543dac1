"""Speed of the trace readers on the real logs, and of the synthetic generator.

Prints, for each log in the data directory ($MALLETRAIN_DATA or the default): best-of-N wall time
of ``traces.read``; for the Summit node-state CSV also the same work done the
obvious way (``csv.DictReader`` rows -> ``NodeEvent`` objects -> a dict of node
states, no numpy) as the baseline, and the ratio. Then the time to fit the
fragment and burst models and to generate the embedded SYNTHETIC summit-like
week, and that week's KS distances to the real Summit week: fragment lengths
(goal <= 0.05) and idle-pool size over time (goal <= 0.10), for seed 0 and
over ``--seeds`` seeds, bursty and independent-node models.

    python benchmarks/bench_traces.py [--repeat N] [--seeds N] [--short]

The last line: the Summit read against its baseline, and the bursty synthetic week's KS distances (seed 0).
``--short``: best of 1, one seed (a missing log is said and left out, as in a full run).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import time
from pathlib import Path
from typing import Callable

import numpy as np
from harness import add_short, last_line

import traces
from traces import NodeEvent, synthetic
from traces.bursts import idle_pool_ks
from traces.data import find_data
from traces.stats import fragment_lengths, trace_stats

LOGS = ("summit-2021-02-10_17.nodes.csv.gz", "KTH-SP2-1996-2.1-cln.swf.gz", "cirrus-2024Q1-sacct.csv.gz")


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, float, object]:
    """Best wall time, best CPU time of this process (robust when the machine is shared), result."""
    wall, cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall = min(wall, time.perf_counter() - w0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu, result


def naive_nodes_csv(path: Path) -> tuple[int, int]:
    """Baseline: one Python object per row, a dict of node states, events that change a state."""
    with gzip.open(path, "rt") as fh:
        rows = csv.DictReader(line for line in fh if not line.startswith("#"))
        state: dict[str, bool] = {}
        events: list[NodeEvent] = []
        for row in rows:
            ev = NodeEvent(float(row["time"]), row["node"], row["idle"] == "1")
            if state.get(ev.node, False) != ev.idle:
                events.append(ev)
            state[ev.node] = ev.idle
    return len(state), len(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5, help="seeds for the KS spread of the synthetic week")
    add_short(parser, "best of 1, one seed")
    args = parser.parse_args()
    if args.short:
        args.repeat, args.seeds = 1, 1
    summit = None
    read_line = "the Summit log not found (set MALLETRAIN_DATA)"
    ks_line = "no KS (no Summit log)"
    for name in LOGS:
        path = find_data(name)
        if path is None:
            print(f"{name}: not found (set MALLETRAIN_DATA)")
            continue
        wall, cpu, tl = best_of(args.repeat, lambda: traces.read(path))
        assert isinstance(tl, traces.IdleTimeline)
        print(f"read {name}: {wall:.2f} s wall, {cpu:.2f} s cpu "
              f"({tl.format}, {tl.n_nodes} nodes, {tl.n_events} events)")
        if tl.format == "nodes-csv":
            b_wall, b_cpu, _ = best_of(args.repeat, lambda: naive_nodes_csv(path))
            print(f"  baseline per-row DictReader+NodeEvent: {b_wall:.2f} s wall, {b_cpu:.2f} s cpu "
                  f"-> traces.read is {b_wall / wall:.1f}x faster (wall), {b_cpu / cpu:.1f}x (cpu)")
            read_line = (f"read the Summit week in {wall:.2f} s, {b_wall / wall:.1f}x faster than the per-row "
                         f"baseline (wall)")
            f_wall, f_cpu, _ = best_of(args.repeat, lambda: synthetic.fit_fragments(tl))
            print(f"fit_fragments(summit): {f_wall:.2f} s wall, {f_cpu:.2f} s cpu")
            f_wall, f_cpu, _ = best_of(args.repeat, lambda: synthetic.fit_bursts(tl, synthetic.SUMMIT))
            print(f"fit_bursts(summit): {f_wall:.2f} s wall, {f_cpu:.2f} s cpu")
            summit = tl
    for bursty in (True, False):
        what = "bursty" if bursty else "independent nodes"
        g_wall, g_cpu, syn = best_of(args.repeat, lambda: synthetic.summit_like(bursty=bursty))
        assert isinstance(syn, traces.IdleTimeline)
        print(f"summit_like({what}; 4608 nodes, 7 days, SYNTHETIC): {g_wall:.2f} s wall, {g_cpu:.2f} s cpu "
              f"({syn.n_events} events, peak {trace_stats(syn).peak_idle} idle nodes)")
        if summit is not None:
            ks = print_ks(summit, bursty, args.seeds)
            if bursty:
                ks_line = f"bursty synthetic week KS (seed 0): fragments {ks[0]:.3f}, idle pool {ks[1]:.3f}"
    last_line(f"traces: {read_line}; {ks_line}")


def print_ks(real: traces.IdleTimeline, bursty: bool, seeds: int) -> tuple[float, float]:
    """KS distances of the SYNTHETIC week to the real one: seed 0, then mean and range over seeds."""
    real_fragments = fragment_lengths(real)
    rows = []
    for seed in range(seeds):
        syn = synthetic.summit_like(seed=seed, bursty=bursty)
        rows.append((synthetic.ks_distance(fragment_lengths(syn), real_fragments), idle_pool_ks(syn, real)))
    ks = np.array(rows)
    for k, (name, goal) in enumerate((("fragment lengths", 0.05), ("idle-pool size over time", 0.10))):
        col = ks[:, k]
        print(f"  KS {name} vs Summit: seed 0 {col[0]:.3f}; {seeds} seeds mean {col.mean():.3f} "
              f"[{col.min():.3f}, {col.max():.3f}], {int(np.sum(col <= goal))}/{seeds} within goal {goal}")
    return float(ks[0, 0]), float(ks[0, 1])


if __name__ == "__main__":
    main()
