"""Allocator speed: p50/p99 of `auto` at 100 jobs x 4,608 nodes, the time at
1,000 jobs x 10,624 nodes, and the node x job reference (HiGHS and CBC) against
`auto` and `milp` at 20 jobs x 256 nodes, with equal objectives, in one run.

    python benchmarks/bench_allocator.py [--quick] [--seed N]

Scalability curves come from the data directory's summit-scaling.csv (or
$MALLETRAIN_DATA / $MALLETRAIN_SHARED_DATA); synthetic concave curves if it is absent.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from allocator import Job, Plan, Problem, solve

UP_COST_S = 18.0
DOWN_COST_S = 12.0
HORIZON_S = 600.0
MAX_NODES = 64


def data_dir() -> Path:
    for var in ("MALLETRAIN_DATA", "MALLETRAIN_SHARED_DATA"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def load_curves() -> tuple[str, dict[str, dict[int, float]]]:
    """Model -> {nodes: samples/s} from summit-scaling.csv, else synthetic curves."""
    path = data_dir() / "summit-scaling.csv"
    if not path.exists():
        return "synthetic", {f"syn{a}": {n: 1000.0 * n**a for n in (1, 2, 4, 8, 16, 32, 64)} for a in (0.6, 0.7, 0.8, 0.9)}
    curves: dict[str, dict[int, float]] = {}
    with path.open() as fh:
        rows = csv.reader(line for line in fh if not line.startswith("#"))
        header = next(rows)
        for lineno, row in enumerate(rows, start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}:{lineno}: expected {len(header)} fields, got {row!r}")
            curves.setdefault(row[0], {})[int(row[1])] = float(row[2])
    return str(path), curves


def make_problem(rng: np.random.Generator, curves: dict[str, dict[int, float]], n_jobs: int, n_nodes: int) -> Problem:
    """Random current state: some jobs idle, the rest share a random part of the pool."""
    names = sorted(curves)
    running = rng.random(n_jobs) < rng.uniform(0.3, 0.9)
    used = int(rng.integers(n_nodes // 4, n_nodes + 1))
    share = rng.dirichlet(np.ones(max(1, int(running.sum())))) * used
    counts = np.zeros(n_jobs, np.int64)
    counts[running] = np.clip(np.floor(share), 1, MAX_NODES)[: int(running.sum())]
    while counts.sum() > n_nodes:
        counts[np.argmax(counts)] -= 1
    nodes = [f"n{i:05d}" for i in rng.permutation(n_nodes)]
    jobs, pos = [], 0
    for j in range(n_jobs):
        mine = tuple(nodes[pos : pos + int(counts[j])])
        pos += int(counts[j])
        curve = curves[names[int(rng.integers(len(names)))]]
        jobs.append(Job(f"job{j:04d}", 1, MAX_NODES, dict(curve), mine, UP_COST_S, DOWN_COST_S))
    return Problem(tuple(jobs), tuple(nodes[pos:]), HORIZON_S)


def timed_solve(problem: Problem, method: str = "auto") -> tuple[Plan, float, float]:
    """``solve(problem, method)`` with the wall and CPU seconds it took (the plan carries no clock reading)."""
    w0, c0 = time.perf_counter(), time.process_time()
    plan = solve(problem, method)
    return plan, time.perf_counter() - w0, time.process_time() - c0


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def bench_p99(rng: np.random.Generator, curves: dict[str, dict[int, float]], decisions: int) -> None:
    times, cpu = [], []
    for _ in range(decisions):
        problem = make_problem(rng, curves, 100, 4608)
        _, wall, cpu_s = timed_solve(problem)
        times.append(wall)
        cpu.append(cpu_s)
    print(f"auto, 100 jobs x 4,608 nodes, {decisions} decisions: "
          f"p50 {pct(times, 50) * 1e3:.1f} ms, p99 {pct(times, 99) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms wall "
          f"(target p99 <= 50 ms); CPU time p50 {pct(cpu, 50) * 1e3:.1f} ms, p99 {pct(cpu, 99) * 1e3:.1f} ms")


def bench_large(rng: np.random.Generator, curves: dict[str, dict[int, float]], decisions: int, check_dp: bool) -> None:
    times, cpu = [], []
    for i in range(decisions):
        problem = make_problem(rng, curves, 1000, 10624)
        plan, wall, cpu_s = timed_solve(problem)
        cpu.append(cpu_s)
        times.append(wall)
        if check_dp and i == 0:
            ref, ref_s, _ = timed_solve(problem, "dp")
            same = abs(ref.objective - plan.objective) <= 1e-9 * abs(ref.objective)
            print(f"  dp (no reduction) on the first: {ref_s:.2f} s, same objective: {same}")
    print(f"auto, 1,000 jobs x 10,624 nodes, {decisions} decisions: "
          f"median {statistics.median(times):.3f} s, max {max(times):.3f} s wall (target <= 1 s); "
          f"CPU time max {max(cpu):.3f} s")


REPEATS = {"auto": 21, "dp": 5}


def median_plan(problem: Problem, method: str) -> tuple[float, float]:
    """(median solve seconds over the method's repeats, objective)."""
    runs = [timed_solve(problem, method) for _ in range(REPEATS.get(method, 1))]
    return statistics.median(wall for _, wall, _ in runs), runs[0][0].objective


def bench_reference(
    rng: np.random.Generator, curves: dict[str, dict[int, float]], instances: int, with_cbc: bool
) -> None:
    methods = ["auto", "dp", "milp-highs", "milp-cbc", "node-binary-highs"] + (["node-binary-cbc"] if with_cbc else [])
    print(f"20 jobs x 256 nodes, {instances} instance(s); auto: median of {REPEATS['auto']} runs, dp of "
          f"{REPEATS['dp']}, the MILPs one run each:")
    for k in range(instances):
        problem = make_problem(rng, curves, 20, 256)
        results = {m: median_plan(problem, m) for m in methods}
        auto_s, auto_obj = results["auto"]
        for m, (secs, obj) in results.items():
            same = abs(obj - auto_obj) <= 1e-6 * abs(auto_obj)
            print(f"  #{k} {m:18s} {secs * 1e3:10.1f} ms  {secs / auto_s:8.0f} x auto  objective {obj:.9e}  same: {same}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions, skip node-binary CBC")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    source, curves = load_curves()
    print(f"curves: {source} ({len(curves)} models); horizon {HORIZON_S:.0f} s, up {UP_COST_S} s, down {DOWN_COST_S} s")
    bench_p99(rng, curves, 30 if args.quick else 200)
    bench_large(rng, curves, 3 if args.quick else 10, check_dp=not args.quick)
    bench_reference(rng, curves, instances=1 if args.quick else 3, with_cbc=not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
