"""Profiler figures: estimator ingest speed, scalability-model error on Summit, inverse vs ascending profiling.

    python benchmarks/bench_profiler.py [--short]

1. Records/s through ``ThroughputEstimator.add`` and ``RescaleCostEstimator.add``
   (the daemon's monitor may ingest 50k records/s), against a bare loop that
   only appends each record to a list (the floor any per-record work pays).
2. Leave-one-out error of the scalability model on the 7 Summit ImageNet
   curves (``summit-scaling.csv``), against the Amdahl-like strong-scaling form
   ``a + b/n + c*log2(n)`` and against piecewise-linear interpolation (what the
   allocator does with raw points); and the error of predicting 32 and 64
   nodes from a profile that stopped at 16.
3. Scale-ups and seconds of profiling 1..64 nodes in inverse vs ascending
   order with the Summit rescale costs (18 s up, 12 s down).

The last line: both estimators' ingest rate against the bare loop, and the model's mean error against
piecewise-linear interpolation. ``--short``: 20,000 records instead of 200,000, best of 1 (the model and
the order are the same: they take a second).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from curves import throughput_at
from harness import add_short, last_line
from profiler.estimators import RescaleCostEstimator, ThroughputEstimator
from profiler.jpa import default_counts, profile_cost
from profiler.records import Record, Segment, synthesize
from profiler.scalability import leave_one_out_errors, model_error, parse_scaling_table

REPO = Path(__file__).resolve().parent.parent


def data_file(name: str) -> Path:
    base = Path(os.environ.get("MALLETRAIN_DATA", REPO.parent / "shared" / "data"))
    path = base / name
    if not path.exists():
        sys.exit(f"missing real data file {path} (set MALLETRAIN_DATA)")
    return path


def _best_rate(fn, records: list[Record], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(records)
        best = min(best, time.perf_counter() - t0)
    return len(records) / best


def _bare(records: list[Record]) -> None:
    sink: list[Record] = []
    for r in records:
        sink.append(r)


def _throughput(records: list[Record]) -> None:
    est = ThroughputEstimator()
    for r in records:
        est.add(r)
    est.rates()


def _rescale(records: list[Record]) -> None:
    est = RescaleCostEstimator()
    for r in records:
        est.add(r)
    est.flush()


def _both(records: list[Record]) -> None:
    a, b = ThroughputEstimator(), RescaleCostEstimator()
    for r in records:
        a.add(r)
        b.add(r)


def bench_ingest(segments: int, repeats: int) -> tuple[float, float]:
    """Prints the ingest rates; returns (bare loop, both estimators) in records/s."""
    segs = [Segment(2 ** (i % 6), 2000, 0.01, 256, pause_before_s=15.0, warmup_steps=2) for i in range(segments)]
    records = synthesize(segs, noise=0.05, seed=1)
    bare = _best_rate(_bare, records, repeats)
    print(f"1. estimator ingest, {len(records):,} records with {len(segs) - 1} rescales (best of {repeats})")
    print(f"   bare list.append loop (baseline)     {bare:12,.0f} records/s")
    for name, fn in (("ThroughputEstimator.add", _throughput), ("RescaleCostEstimator.add", _rescale),
                     ("both estimators", _both)):
        rate = _best_rate(fn, records, repeats)
        print(f"   {name:36s} {rate:12,.0f} records/s  ({rate / 50_000:.1f}x the 50k/s target, "
              f"{bare / rate:.1f}x slower than the bare loop)")
    return bare, rate


def _strong_scaling_loo(points: dict[int, float]) -> list[float]:
    """LOO error of tau = a + b/n + c*log2(n) (nonneg, all subsets), the form the brief suggested."""
    import itertools

    def fit(pts: dict[int, float]):
        ns = np.array(sorted(pts), float)
        tau = np.array([1 / pts[int(n)] for n in ns])
        x = np.array([np.ones_like(ns), 1 / ns, np.log2(ns)]).T / tau[:, None]
        y = np.ones(len(ns))
        best = None
        for k in (1, 2, 3):
            for s in itertools.combinations(range(3), k):
                c, *_ = np.linalg.lstsq(x[:, s], y, rcond=None)
                if (c < 0).any() or (0 not in s and 1 not in s):
                    continue
                r = float(np.sum((x[:, s] @ c - y) ** 2))
                if best is None or r < best[0] - 1e-12:
                    full = np.zeros(3)
                    full[list(s)] = c
                    best = (r, full)
        a, b, c = best[1]
        return lambda n: 1 / (a + b / n + c * np.log2(n))

    ns = sorted(points)
    out = []
    for h in ns[1:-1]:
        f = fit({n: v for n, v in points.items() if n != h})
        out.append(abs(f(h) - points[h]) / points[h] * 100)
    return out


def bench_model() -> tuple[float, float]:
    """Prints the model's errors; returns (ours, piecewise-linear), mean %."""
    path = data_file("summit-scaling.csv")
    table = {m: p for m, p in parse_scaling_table(path.read_text(), str(path)).items() if m != "shufflenet-hpo"}
    print(f"\n2. scalability model error on {path.name} ({len(table)} models, each interior count held back)")
    print(f"   {'model':12s} {'ours %':>8s} {'a+b/n+c*log2n %':>16s} {'piecewise-linear %':>19s} {'32,64 from <=16 %':>18s}")
    ours_all: list[float] = []
    strong_all: list[float] = []
    interp_all: list[float] = []
    extrap_all: list[float] = []
    for name, pts in table.items():
        ours = list(leave_one_out_errors(pts).values())
        strong = _strong_scaling_loo(pts)
        ns = sorted(pts)
        interp = [abs(throughput_at({n: v for n, v in pts.items() if n != h}, h) - pts[h]) / pts[h] * 100
                  for h in ns[1:-1]]
        extrap = model_error({n: v for n, v in pts.items() if n <= 16}, {32: pts[32], 64: pts[64]})
        ours_all += ours
        strong_all += strong
        interp_all += interp
        extrap_all.append(extrap)
        print(f"   {name:12s} {statistics.mean(ours):8.2f} {statistics.mean(strong):16.2f} "
              f"{statistics.mean(interp):19.2f} {extrap:18.2f}")
    print(f"   {'MEAN':12s} {statistics.mean(ours_all):8.2f} {statistics.mean(strong_all):16.2f} "
          f"{statistics.mean(interp_all):19.2f} {statistics.mean(extrap_all):18.2f}")
    print(f"   {'MAX':12s} {max(ours_all):8.2f} {max(strong_all):16.2f} {max(interp_all):19.2f} {max(extrap_all):18.2f}")
    return statistics.mean(ours_all), statistics.mean(interp_all)


def bench_order() -> None:
    counts = default_counts(1, 64)
    print(f"\n3. profiling counts {counts}, scale-up 18 s, scale-down 12 s (Summit)")
    print(f"   {'hold s':>6s} {'order':10s} {'scale-ups':>9s} {'scale-downs':>11s} {'seconds':>8s} {'node-hours':>10s}")
    for hold in (30.0, 60.0, 120.0):
        for order in ("inverse", "ascending"):
            c = profile_cost(order, counts, 18.0, 12.0, hold)  # type: ignore[arg-type]
            print(f"   {hold:6.0f} {order:10s} {c.scale_ups:9d} {c.scale_downs:11d} {c.seconds:8.0f} "
                  f"{c.node_seconds / 3600:10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_short(ap, "20,000 records, best of 1")
    args = ap.parse_args()
    bare, both = bench_ingest(10 if args.short else 100, 1 if args.short else 3)
    ours, interp = bench_model()
    bench_order()
    last_line(f"profiler: both estimators ingest {both:,.0f} records/s ({bare / both:.1f}x slower than the bare "
              f"loop, baseline); model error mean {ours:.2f}% (piecewise-linear, baseline: {interp:.2f}%)")


if __name__ == "__main__":
    main()
