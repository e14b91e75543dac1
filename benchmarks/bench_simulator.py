"""Simulator speed and quality on the whole Summit week (target: <= 60 s per replay).

    python benchmarks/bench_simulator.py [--policies malletrain,oracle] [--workload nas] [--days D] [--seed N]
                                         [--max-running N] [--tfwd S] [--short]

Replays the data directory's summit-2021-02-10_17.nodes.csv.gz ($MALLETRAIN_DATA or the default)
with an endless job stream (default: nas) under the daemon's policy defaults
(:class:`policy.PolicyConfig`: Pjmax 10, Tfwd 120 s unless given), once per
policy, and prints for each: wall and CPU seconds, decisions, policy calls,
solves (the policy answers a problem identical to the last no-op one without
solving), decision ms p50/p99, used and idle node-seconds, samples processed,
and the ratio of samples to `oracle`'s (measured in the same run). ``--short``: the first day
(the target is for the whole week: the last line says so).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import traces
from harness import add_short, last_line
from policy import PolicyConfig
from simulator import POLICIES, SimConfig, find_scaling, simulate
from traces.data import find_data

TRACE = "summit-2021-02-10_17.nodes.csv.gz"
TARGET_S = 60.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="malletrain,oracle", help=f"comma list of {', '.join(POLICIES)}")
    ap.add_argument("--workload", default="nas", help="nas, hpo, stress, imagenet7 or a job file (default: nas)")
    ap.add_argument("--days", type=float, help="replay only the first D days (default: the whole week)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-running", type=int, help="Pjmax (default: PolicyConfig's)")
    ap.add_argument("--tfwd", type=float, help="Tfwd in seconds (default: PolicyConfig's)")
    add_short(ap, "the first day (--days 1)")
    args = ap.parse_args()
    if args.short:
        args.days = 1.0
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        ap.error(f"--policies {args.policies!r}: unknown {', '.join(unknown) or 'empty'}; choose from {', '.join(POLICIES)}")
    pcfg = PolicyConfig()
    if args.max_running is not None:
        pcfg = replace(pcfg, max_running=args.max_running)
    if args.tfwd is not None:
        pcfg = replace(pcfg, tfwd_s=args.tfwd)
    path = find_data(TRACE)
    if path is None:
        print(f"bench_simulator: {TRACE} not found (set MALLETRAIN_DATA)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    timeline = traces.read(path)
    read_s = time.perf_counter() - t0
    scaling = find_scaling()
    end = None if args.days is None else timeline.start + args.days * 86400.0
    config = SimConfig(end=end)
    print(f"trace {path.name}: {timeline.n_events:,} changes, {len(timeline.nodes):,} nodes, read in {read_s:.1f} s")
    print(f"workload {args.workload} (seed {args.seed}), Pjmax {pcfg.max_running}, Tfwd {pcfg.tfwd_s:g} s, "
          f"scaling {scaling.source}")
    header = ("policy", "wall_s", "cpu_s", "decisions", "calls", "solves", "ms_p50", "ms_p99", "used_node_s",
              "idle_node_s", "used/idle", "samples", "vs_oracle")
    print("  ".join(f"{h:>12}" for h in header))
    summaries = []
    for name in names:
        summaries.append(simulate(timeline, name, args.workload, scaling=scaling, seed=args.seed, config=config,
                                  policy_config=pcfg).summary)
    oracle = next((s for s in summaries if s["policy"] == "oracle"), None)
    for s in summaries:
        ratio = s["samples_processed"] / oracle["samples_processed"] if oracle else float("nan")
        cells = (s["policy"], f"{s['wall_seconds']:.1f}", f"{s['cpu_seconds']:.1f}", f"{s['decisions']:,}",
                 f"{s['policy_calls']:,}", f"{s['solver_calls']:,}", f"{s['decision_ms_p50']:.2f}",
                 f"{s['decision_ms_p99']:.2f}", f"{s['used_node_seconds']:.4g}", f"{s['idle_node_seconds']:.4g}",
                 f"{s['used_fraction']:.3f}", f"{s['samples_processed']:.4g}", f"{ratio:.3f}")
        print("  ".join(f"{c:>12}" for c in cells))
    worst = max(s["wall_seconds"] for s in summaries)
    cpu = max(s["cpu_seconds"] for s in summaries)
    verdict = "OK" if worst <= TARGET_S else "OVER"
    span = "the whole week" if args.days is None else f"{args.days:g} day(s)"
    last_line(f"slowest replay of {span} {worst:.1f} s wall, {cpu:.1f} s CPU (target <= {TARGET_S:.0f} s wall a week): {verdict}"
          + ("  [wall > CPU: the machine is shared; re-run when idle]" if worst > 1.3 * cpu else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
