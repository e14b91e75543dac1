"""Real training: the daemon's default policy against the paper's (jpa), from the jobs' own reports.

    .venv/bin/python benchmarks/bench_demo_policies.py                 # 3 runs each, 150 s, torch jobs
    .venv/bin/python benchmarks/bench_demo_policies.py --runs 1 --duration 30 --runtime toy
    .venv/bin/python benchmarks/bench_demo_policies.py --short    # the quick mode CI runs: 1 run of 20 s each, toy

Runs ``malletrain demo --policy P`` (local backend, the synthetic trace, the same seed and jobs
every run) ``--runs`` times per policy, alternating which goes first, and reads each run's
``report.json``: the samples every job trained (its own reports to the monitor) and the rates it
measured per node count. Work, as in the evaluation, is model-neutral: a job's samples over its
1-node rate, the median of the 1-node rates measured over all runs (a job never measured at one
node is left out, and said). Prints work per run, mean ± sd per policy, and the default's gain over
jpa; exits 1 when the default does less work than jpa (the simulator's ordering does not hold). A
``--short`` run is too short for the verdict to mean much: it checks the path, not the ordering.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from harness import add_short, last_line

POLICIES = ("malletrain", "jpa")


def run_demo(policy: str, out: Path, duration: float, runtime: str) -> dict:
    cmd = [sys.executable, "-m", "malletrain", "demo", "--quiet", "--policy", policy, "--duration", f"{duration:g}",
           "--runtime", runtime, "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 600)
    if res.returncode != 0:
        raise SystemExit(f"bench_demo_policies: {' '.join(cmd)} exited {res.returncode}:\n{res.stderr[-2000:]}")
    return json.loads((out / "report.json").read_text())


def one_node_rates(reports: list[dict]) -> dict[str, float]:
    """Per job name, the median 1-node rate measured over every run."""
    seen: dict[str, list[float]] = {}
    for rep in reports:
        for j in rep["jobs"]:
            r1 = j["scaling_measured"].get("1")
            if r1:
                seen.setdefault(j["name"], []).append(float(r1))
    return {name: statistics.median(v) for name, v in seen.items()}


def work(report: dict, r1: dict[str, float]) -> float:
    return sum(j["samples"] / r1[j["name"]] for j in report["jobs"] if j["name"] in r1)


def mean_sd(xs: list[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):,.0f} ± {sd:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per policy (default 3)")
    ap.add_argument("--duration", type=float, default=150.0, help="seconds per run (default 150)")
    ap.add_argument("--runtime", choices=("torch", "horovod", "toy"), default="torch")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-demo"))
    add_short(ap, "one run of 20 s per policy, toy runtime (no torch workers)")
    args = ap.parse_args()
    if args.short:
        args.runs, args.duration, args.runtime = 1, 20.0, "toy"
    if args.runs < 1:
        ap.error(f"--runs must be >= 1, got {args.runs}")
    reports: dict[str, list[dict]] = {p: [] for p in POLICIES}
    for k in range(args.runs):
        for policy in (POLICIES if k % 2 == 0 else POLICIES[::-1]):  # neither always runs first
            rep = run_demo(policy, args.out / f"{policy}-{k}", args.duration, args.runtime)
            reports[policy].append(rep)
            print(f"run {k} {policy}: " + ", ".join(f"{j['name']} {j['samples']:,} samples"
                                                   for j in rep["jobs"]), flush=True)
    r1 = one_node_rates([r for reps in reports.values() for r in reps])
    names = sorted({j["name"] for reps in reports.values() for r in reps for j in r["jobs"]})
    missing = [n for n in names if n not in r1]
    print("1-node rates measured (median over runs): "
          + ", ".join(f"{n} {r1[n]:,.0f}/s" for n in names if n in r1)
          + (f"; never measured at 1 node, left out of work: {', '.join(missing)}" if missing else ""))
    works = {p: [work(r, r1) for r in reps] for p, reps in reports.items()}
    samples = {p: [float(sum(j["samples"] for j in r["jobs"])) for r in reps] for p, reps in reports.items()}
    for p in POLICIES:
        print(f"{p:>10}: work {mean_sd(works[p])} node-s at 1 node, samples {mean_sd(samples[p])} "
              f"({args.runs} runs of {args.duration:g} s, {args.runtime})")
    gain = 100.0 * (statistics.mean(works["malletrain"]) / statistics.mean(works["jpa"]) - 1.0)
    ok = gain >= 0.0
    last_line(f"{'PASS' if ok else 'FAIL'}  default vs jpa in work, real training: {gain:+.1f}% "
          f"(the simulator's ordering, default >= jpa, {'holds' if ok else 'does not hold'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
