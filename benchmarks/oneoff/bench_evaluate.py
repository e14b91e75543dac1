"""The evaluation's speed and its malletrain-vs-freetrain gap, on the Summit week.

    python benchmarks/oneoff/bench_evaluate.py                 # the evaluation (as `malletrain evaluate`), timed
    python benchmarks/oneoff/bench_evaluate.py --investigate   # where malletrain's gap to freetrain comes from

Default mode runs every replay of ``malletrain evaluate`` for ``--seeds`` seeds
(default 1: NAS and HPO under freetrain with its four priors, malletrain, jpa,
milp-true, oracle, greedy) on a Dask LocalCluster of ``--workers`` processes,
prints each replay's wall/CPU seconds (target: each well under 60 s) and the
tables and targets.

``--investigate`` replays NAS (or ``--workload``) with JPA variants (the paper's
profile-every-job MalleTrain, preset ``jpa``) against
freetrain on the same window (default: the whole week). Each variant is one change
of the shared :class:`policy.PolicyConfig` (the daemon's defaults otherwise), or of
the simulated monitor's record noise (:class:`simulator.SimConfig`): Tfwd
60/120/300 s (``tfwd_s``; freetrain at the same Tfwd), the profiling hold rule
(``profile_rel_ci`` 2%/5%/10%, ``profile_time_cap_s`` 60 s), the counts profiled
(``profile_counts``: JPA default 1,2,4,...,64; ``sparse`` 1,8,64; ``top`` 16,32,64),
record noise 0/3/10% (``SimConfig.record_noise``). For each it prints model-neutral
work (and samples), the gap to freetrain in work, used and paused node-seconds, the
profiling node-seconds and the mean profile length.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import traces
from evaluation.evaluate import evaluate
from evaluation.report import print_report
from evaluation.results import EvalSettings
from policy import PolicyConfig
from simulator import SimConfig, find_scaling, simulate
from simulator.monitor import RECORD_NOISE
from traces.data import find_data

TRACE = "summit-2021-02-10_17.nodes.csv.gz"
TARGET_S = 60.0


@dataclass(frozen=True)
class Variant:
    """A named policy with some :class:`PolicyConfig` fields changed (the rest: the daemon's defaults)
    and the simulated monitor's record noise."""

    label: str
    policy: str  # malletrain | freetrain
    knobs: dict = field(default_factory=dict)  # PolicyConfig fields
    record_noise: float = RECORD_NOISE  # SimConfig.record_noise

    @property
    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(**self.knobs)


VARIANTS = (
    Variant("freetrain (mean), Tfwd 120", "freetrain"),
    Variant("malletrain (daemon default)", "malletrain"),
    Variant("jpa as evaluated", "jpa"),
    Variant("freetrain (mean), Tfwd 60", "freetrain", {"tfwd_s": 60.0}),
    Variant("jpa, Tfwd 60", "jpa", {"tfwd_s": 60.0}),
    Variant("freetrain (mean), Tfwd 300", "freetrain", {"tfwd_s": 300.0}),
    Variant("jpa, Tfwd 300", "jpa", {"tfwd_s": 300.0}),
    Variant("jpa, rel CI 2%", "jpa", {"profile_rel_ci": 0.02}),
    Variant("jpa, rel CI 10%", "jpa", {"profile_rel_ci": 0.10}),
    Variant("jpa, time cap 60 s", "jpa", {"profile_time_cap_s": 60.0}),
    Variant("jpa, counts 1,8,64", "jpa", {"profile_counts": "sparse"}),
    Variant("jpa, counts 16,32,64", "jpa", {"profile_counts": "top"}),
    Variant("jpa, record noise 0%", "jpa", record_noise=0.0),
    Variant("jpa, record noise 10%", "jpa", record_noise=0.10),
)

_STATE: dict = {}


def _init(timeline, scaling, end, workload) -> None:  # type: ignore[no-untyped-def]
    _STATE.update(timeline=timeline, scaling=scaling, end=end, workload=workload)


def _run_variant(v: Variant) -> tuple[Variant, dict]:
    config = SimConfig(end=_STATE["end"], record_noise=v.record_noise)
    res = simulate(_STATE["timeline"], v.policy, _STATE["workload"], scaling=_STATE["scaling"], seed=0,
                   config=config, policy_config=v.policy_config)
    return v, res.summary


def investigate(timeline, scaling, end, workers: int, workload: str = "nas") -> None:  # type: ignore[no-untyped-def]
    if workers <= 1:
        _init(timeline, scaling, end, workload)
        results = [_run_variant(v) for v in VARIANTS]
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                                 initargs=(timeline, scaling, end, workload)) as pool:
            results = list(pool.map(_run_variant, VARIANTS))
    base = {v.policy_config.tfwd_s: s["work_node_seconds"] for v, s in results if v.policy == "freetrain"}
    print(f"{'variant':<32} {'work node-s':>11} {'samples':>10} {'vs freetrain':>12} {'used node-s':>11} "
          f"{'paused node-s':>13} {'profiling node-s':>16} {'profile s':>9} {'wall s':>6}")
    for v, s in results:
        gap = 100.0 * (s["work_node_seconds"] / base[v.policy_config.tfwd_s] - 1.0)
        prof = s.get("profile_seconds_mean")
        print(f"{v.label:<32} {s['work_node_seconds']:>11.4g} {s['samples_processed']:>10.4g} {gap:>+11.1f}% "
              f"{s['used_node_seconds']:>11.4g} "
              f"{s['paused_node_seconds']:>13.4g} {s['profiling_node_seconds']:>16.4g} "
              f"{(f'{prof:.0f}' if prof else '-'):>9} {s['wall_seconds']:>6.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--investigate", action="store_true")
    ap.add_argument("--days", type=float, help="replay only the first D days (default: the whole week)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--workload", default="nas", help="--investigate's stream (default: nas)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds of the timed evaluation (default: 1)")
    args = ap.parse_args()
    path = find_data(TRACE)
    if path is None:
        print(f"bench_evaluate: {TRACE} not found (set MALLETRAIN_DATA)", file=sys.stderr)
        return 2
    timeline = traces.read(path)
    scaling = find_scaling()
    end = None if args.days is None else timeline.start + args.days * 86400.0
    pcfg = PolicyConfig()
    print(f"trace {path.name}, scaling {scaling.source}, seed 0, Pjmax {pcfg.max_running}, "
          f"Tfwd {pcfg.tfwd_s:g} s, {args.workers} workers")
    if args.investigate:
        investigate(timeline, scaling, end, args.workers, args.workload)
        return 0
    t0 = time.perf_counter()
    walls: list[tuple[str, float, float]] = []

    def done(spec, summary) -> None:  # type: ignore[no-untyped-def]
        walls.append((f"{spec.workload}/{spec.label}", summary["wall_seconds"], summary["cpu_seconds"]))
        print(f"  {walls[-1][0]:<28} wall {summary['wall_seconds']:6.1f} s  cpu {summary['cpu_seconds']:6.1f} s  "
              f"decisions {summary['decisions']:,}", flush=True)

    ev = evaluate(timeline, scaling, EvalSettings(end=end, workers=args.workers, seeds=tuple(range(args.seeds))),
                  on_done=done)
    total = time.perf_counter() - t0
    print_report(ev)
    worst = max(w for _, w, _ in walls)
    worst_cpu = max(c for _, _, c in walls)
    print(f"{len(walls)} replays in {total:.0f} s wall; slowest replay {worst:.1f} s wall, {worst_cpu:.1f} s CPU "
          f"(target <= {TARGET_S:.0f} s): {'OK' if worst_cpu <= TARGET_S else 'OVER'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
