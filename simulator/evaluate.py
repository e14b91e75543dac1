"""The evaluation: policies x workloads x seeds on one trace, in model-neutral work.

    from simulator.evaluate import EvalSettings, evaluate, write_evaluation
    ev = evaluate(timeline, scaling, EvalSettings(seeds=(0, 1, 2, 3, 4)))
    write_evaluation(ev, Path("docs/evaluation"), command="malletrain evaluate ...")

The headline metric is ``work_node_seconds`` (each job's samples over its own 1-node rate, so an
hour of DenseNet and an hour of AlexNet at one node count the same); samples stay a column.
Every number is a mean and a sample standard deviation over the seeds. ``freetrain`` runs with a
panel of user priors (:data:`PRIORS`); the headline compares with its best prior and shows its
worst. Regret is ``(milp-true - policy) / milp-true`` in work, per seed: every cost of learning.
Constrained periods (the idle pool is at most what the admitted jobs can absorb at their max
nodes) and unconstrained ones are reported apart, as well as the whole. Replays are Dask tasks
(:mod:`simulator.sweep`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from policy import PolicyConfig
from simulator.calibration import Calibration
from simulator.calibration import default as default_calibration
from simulator.engine import SimConfig
from simulator.policies import Overrides
from simulator.sweep import Replays, RunSpec, run_replays, split_workload
from simulator.workload import ScalingSet
from traces.model import IdleTimeline

POLICIES = ("freetrain", "malletrain", "jpa", "milp-true", "oracle", "greedy")
# issue 18: on a real finite stream every baseline runs at the default's admission (--admission
# and friends override presets), scored in work; freetrain also at fixed Pjmax, best of FIXED_PJMAX
REAL_POLICIES = ("malletrain", "freetrain", "greedy", "equal", "rigid-preemptible", "jpa", "milp-true")
FIXED_PJMAX = (10, 40, 100)
FIXED_PRIOR = "mean"  # freetrain's prior in the fixed-Pjmax sweep
DEFAULT = "malletrain"
REAL_WORKLOADS = ("philly@1", "philly@1.5", "philly@2")
HEADLINE_LOADS = (1.0, 1.5)  # the target: default >= best equal-admission baseline + TARGET_REAL_GAIN_PCT
SATURATION_LOAD = 2.0  # the target: gap to the bound <= TARGET_BOUND_GAP_PCT
TARGET_REAL_GAIN_PCT = 5.0
TARGET_BOUND_GAP_PCT = 5.0
MIN_SEEDS = 5
BOUND_TOLERANCE_PCT = 0.5  # a policy above the oracle bound by more than this (mean over seeds) is a bug
PRIORS = ("linear", "mean", "other", "noise:20")  # freetrain's user curves (simulator.policies)
# freetrain given the true curves: the ceiling of the policies that admit a fixed Pjmax (freetrain,
# jpa, greedy), as milp-true is the ceiling of the daemon's default (adaptive admission)
CEILING_PRIOR = "noise:0"
WORKLOADS = ("nas", "hpo")
SEEDS = (0, 1, 2, 3, 4)
SWEEP_MAX_RUNNING = (3, 10, 40)
SWEEP_MAX_NODES = (16, 64)
TFWD_CANDIDATES = (30.0, 60.0, 120.0, 300.0, 900.0)
TFWD_POLICIES = ("milp-true", "malletrain")
TARGET_GAIN_PCT = 20.0  # the paper: malletrain >= freetrain + 20% on NAS
TARGET_REGRET_PCT = 3.0  # learning (profiling included, in full) costs at most 3% of milp-true's work
TARGET_ABOVE_SHARE_PCT = 50.0  # most idle node-seconds come while the pool exceeds Pjmax x max nodes
PARTS = ("whole", "constrained", "unconstrained")


@dataclass(frozen=True)
class EvalSettings:
    seeds: tuple[int, ...] = SEEDS
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)  # the daemon's defaults
    start: float | None = None
    end: float | None = None
    min_interval_s: float = 0.0
    workers: int = 2
    scheduler: str | None = None
    workloads: tuple[str, ...] = WORKLOADS
    policies: tuple[str, ...] = POLICIES
    priors: tuple[str, ...] = PRIORS
    n_jobs: int | None = None  # a finite job list per replay; None: endless streams
    sweep: bool = False  # the grid Pjmax {3, 10, 40} x max nodes {16, 64}
    tfwd_sweep: bool = False  # Tfwd candidates x TFWD_POLICIES instead of the policy comparison
    # what wins over every preset (the default's admission for every baseline, all scored in work)
    overrides: Overrides = field(default_factory=lambda: Overrides(objective="work"))
    calibration: Calibration | None = None  # None: the shipped calibration
    fixed_pjmax: tuple[int, ...] = FIXED_PJMAX

    @property
    def max_running(self) -> int:
        return self.policy_config.max_running

    @property
    def horizon_s(self) -> float:
        return self.policy_config.tfwd_s

    def sim_config(self) -> SimConfig:
        cal = self.calibration if self.calibration is not None else default_calibration()
        return SimConfig(start=self.start, end=self.end, min_interval_s=self.min_interval_s, calibration=cal)


@dataclass(frozen=True)
class Target:
    name: str
    value: str
    passed: bool


Cell = tuple[str, "int | None", "int | None", "float | None"]  # workload, Pjmax, max nodes, Tfwd


@dataclass
class Evaluation:
    settings: EvalSettings
    trace: str
    scaling_source: str
    runs: list[tuple[RunSpec, dict]]
    trace_claims: dict = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def cells(self) -> list[Cell]:
        out: list[Cell] = []
        for spec, _ in self.runs:
            if spec.cell not in out:
                out.append(spec.cell)
        return out

    def by_label(self, cell: Cell) -> dict[str, dict[int, dict]]:
        """label -> seed -> summary, for one cell."""
        out: dict[str, dict[int, dict]] = {}
        for spec, s in self.runs:
            if spec.cell == cell:
                out.setdefault(spec.label, {})[spec.seed] = s
        return out


def run_specs(settings: EvalSettings) -> list[RunSpec]:
    if settings.tfwd_sweep:
        return [RunSpec(w, p, seed, tfwd_s=tf) for w in settings.workloads for tf in TFWD_CANDIDATES
                for p in TFWD_POLICIES for seed in settings.seeds]
    grid: list[tuple[int | None, int | None]] = [(None, None)]
    if settings.sweep:
        grid = list(product(SWEEP_MAX_RUNNING, SWEEP_MAX_NODES))
    specs: list[RunSpec] = []
    for w, (pj, mn), seed in product(settings.workloads, grid, settings.seeds):
        if is_real(w):
            specs += real_specs(settings, w, seed, pj, mn)
            continue
        for p in settings.policies:
            priors = settings.priors + ((CEILING_PRIOR,) if CEILING_PRIOR not in settings.priors else ()) \
                if p == "freetrain" else ("mean",)
            specs += [RunSpec(w, p, seed, prior=pr, max_running=pj, max_nodes=mn) for pr in priors]
    return specs


def is_real(workload: str) -> bool:
    """A real finite stream (``philly@X``), not an endless generated one (a saturation case)."""
    return split_workload(workload)[0] == "philly"


def real_specs(settings: EvalSettings, w: str, seed: int, pj: int | None, mn: int | None) -> list[RunSpec]:
    """The issue-18 comparison on a real stream: every baseline at the default's admission, freetrain's
    prior panel, freetrain at fixed Pjmax (each of ``fixed_pjmax``), and the oracle bound."""
    out: list[RunSpec] = []
    policies = [p for p in settings.policies if p != "oracle"] if settings.policies != POLICIES else list(REAL_POLICIES)
    for p in policies:
        priors = settings.priors if p == "freetrain" else ("mean",)
        out += [RunSpec(w, p, seed, prior=pr, max_running=pj, max_nodes=mn) for pr in priors]
    out += [RunSpec(w, "freetrain", seed, prior=FIXED_PRIOR, max_nodes=mn, fixed_pjmax=n) for n in settings.fixed_pjmax]
    out.append(RunSpec(w, "oracle", seed, max_running=pj, max_nodes=mn, bound=True))
    return out


def evaluate(
    timeline: IdleTimeline,
    scaling: ScalingSet,
    settings: EvalSettings = EvalSettings(),
    on_done: Callable[[RunSpec, dict], None] | None = None,
) -> Evaluation:
    """Run every replay (Dask tasks; see :func:`simulator.sweep.run_replays`) and check the targets."""
    replays = Replays(timeline, scaling, settings.policy_config, settings.sim_config(), settings.n_jobs,
                      settings.overrides)
    runs = run_replays(replays, run_specs(settings), workers=settings.workers, scheduler=settings.scheduler,
                       on_done=on_done)
    ev = Evaluation(settings, timeline.source, scaling.source, runs)
    ev.trace_claims = trace_claims(timeline, settings)
    ev.targets = check_targets(ev)
    return ev


# ---------------------------------------------------------------- statistics


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; NaN for none)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return float("nan"), float("nan")
    return statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0


def work(s: dict, part: str = "whole") -> float:
    return s["work_node_seconds"] if part == "whole" else s[f"work_node_seconds_{part}"]


def _pct_over(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0) if b > 0 else float("nan")


def freetrain_priors(runs: dict[str, dict[int, dict]], panel: Sequence[str] = PRIORS) -> list[tuple[str, float]]:
    """freetrain's priors of the panel in this cell, best first, by mean work over the seeds."""
    labels = {f"freetrain:{p}" for p in panel}
    priors = [(label, statistics.fmean(work(s) for s in seeds.values()))
              for label, seeds in runs.items() if label in labels]
    return sorted(priors, key=lambda p: -p[1])


def policy_rows(ev: Evaluation, cell: Cell) -> list[dict]:
    """One row per policy label: work (whole / constrained / unconstrained), vs freetrain's best prior,
    regret vs milp-true, samples, profiling, completion times; each a (mean, sd) over the seeds."""
    runs = ev.by_label(cell)
    priors = freetrain_priors(runs, ev.settings.priors)
    best = runs[priors[0][0]] if priors else {}
    rows = []
    for label in _ordered_labels(runs, priors):
        seeds = runs[label]
        ss = [seeds[k] for k in sorted(seeds)]
        ceiling_label = ceiling_for(runs, ss[0])
        ceiling = runs.get(ceiling_label, {})
        row: dict = {"policy": label, "seeds": sorted(seeds), "regret_against": ceiling_label,
                     "best_prior": bool(priors) and label == priors[0][0],
                     "worst_prior": len(priors) > 1 and label == priors[-1][0]}
        for part in PARTS:
            row[f"work_{part}"] = mean_sd([work(s, part) for s in ss])
            row[f"vs_best_freetrain_{part}_pct"] = mean_sd(
                [_pct_over(work(seeds[k], part), work(best[k], part)) for k in sorted(seeds) if k in best])
            row[f"regret_{part}_pct"] = mean_sd(
                [-_pct_over(work(seeds[k], part), work(ceiling[k], part)) for k in sorted(seeds) if k in ceiling])
        row["constrained_time_pct"] = mean_sd([100.0 * s["constrained_seconds"] / s["span_seconds"] for s in ss])
        row["samples"] = mean_sd([s["samples_processed"] for s in ss])
        row["productive_fraction"] = mean_sd([s["productive_fraction"] for s in ss])
        row["used_fraction"] = mean_sd([s["used_fraction"] for s in ss])
        row["profiling_pct"] = mean_sd([100.0 * s["profiling_fraction"] for s in ss])
        row["profiled_jobs"] = mean_sd([s["profiled_jobs"] for s in ss])
        row["belief_error_pct"] = mean_sd([s.get("scalability_error_pct") for s in ss])
        for key in ("makespan_seconds", "jct_mean_seconds", "jct_p95_seconds", "wait_slowest_quarter_seconds",
                    "wait_fastest_quarter_seconds"):
            row[key] = mean_sd([s.get(key) for s in ss])
        row["jobs_completed"] = mean_sd([s["jobs_completed"] for s in ss])
        row["cpu_seconds"] = mean_sd([s.get("cpu_seconds", s["wall_seconds"]) for s in ss])
        row["replayed_as"] = ss[0].get("replayed_as")
        rows.append(row)
    for row in rows:  # a period comparison holds only over the same periods (see same_periods)
        row["same_periods"] = same_periods(row, rows)
        if not row["same_periods"]:
            for part in PARTS[1:]:
                row[f"vs_best_freetrain_{part}_pct"] = (math.nan, math.nan)
    return rows


def ceiling_for(runs: dict[str, dict[int, dict]], summary: dict) -> str:
    """The same policy given the true curves: ``milp-true`` for a policy that admits as milp-true does,
    else freetrain with the true curve (fixed Pjmax) when it was replayed."""
    ref = next(iter(runs.get("milp-true", {}).values()), None)
    fixed = f"freetrain:{CEILING_PRIOR}"
    admission = summary.get("policy_config", {}).get("admission")
    if ref is not None and admission == ref.get("policy_config", {}).get("admission"):
        return "milp-true"
    return fixed if fixed in runs else "milp-true"


def _ordered_labels(runs: dict, priors: list[tuple[str, float]]) -> list[str]:
    order = [p for p, _ in priors]
    for p in POLICIES + ("equal",):
        if p in runs and p not in order:
            order.append(p)
    return order + [label for label in runs if label not in order]


def trace_claims(timeline: IdleTimeline, settings: EvalSettings) -> dict:
    """How much of the window's idle pool lies above Pjmax x max nodes, by time and by node-seconds."""
    start = timeline.start if settings.start is None else settings.start
    end = timeline.end if settings.end is None else settings.end
    t, c = timeline.idle_counts()
    t = np.asarray(t, dtype=float)
    c = np.asarray(c, dtype=float)
    lo = np.clip(t, start, end)
    hi = np.clip(np.append(t[1:], timeline.end), start, end)
    dt = hi - lo
    # the count in force at `start` comes from the last change before it (clipping keeps it)
    cap = settings.max_running * 64
    idle_ns = float((c * dt).sum())
    above = c > cap
    return {
        "capacity_nodes": cap,
        "idle_node_seconds": idle_ns,
        "time_above_pct": 100.0 * float(dt[above].sum()) / float(dt.sum()) if dt.sum() > 0 else 0.0,
        "node_seconds_while_above_pct": 100.0 * float((c * dt)[above].sum()) / idle_ns if idle_ns else 0.0,
        "node_seconds_beyond_pct": 100.0 * float((np.maximum(0.0, c - cap) * dt).sum()) / idle_ns if idle_ns else 0.0,
    }


def headline_cells(ev: Evaluation) -> dict[str, Cell]:
    """Per workload, the cell at the base Pjmax and 64 nodes per job (in a sweep), else its first."""
    out: dict[str, Cell] = {}
    base = ev.settings.max_running
    for cell in ev.cells():
        w, pj, mn, _ = cell
        if pj in (None, base) and mn in (None, 64):
            out[w] = cell
    for cell in ev.cells():
        out.setdefault(cell[0], cell)
    return out


def check_targets(ev: Evaluation) -> list[Target]:
    """Targets that can fail, on the headline cell of each workload (:func:`headline_cells`)."""
    out: list[Target] = []
    if ev.settings.tfwd_sweep:
        return out
    out += real_targets(ev)
    for w, cell in headline_cells(ev).items():
        if is_real(w):
            continue
        rows = {r["policy"]: r for r in policy_rows(ev, cell)}
        best = next((r for r in rows.values() if r["best_prior"]), None)
        for name in ("jpa", "malletrain"):  # the paper's MalleTrain, then the daemon's default
            mt = rows.get(name)
            if w != "nas" or mt is None or best is None:
                continue
            gain = mt["vs_best_freetrain_whole_pct"][0]
            inside = mt["vs_best_freetrain_constrained_pct"][0]
            periods = (f"constrained periods: {inside:+.1f}%" if mt["same_periods"] else
                       "its admitted jobs absorb another pool: no period comparison")
            out.append(Target(f"NAS: {name} >= freetrain (best prior, {best['policy']}) + "
                              f"{TARGET_GAIN_PCT:g}% in work, mean over seeds", f"{gain:+.1f}% ({periods})",
                              gain >= TARGET_GAIN_PCT))
        for name in ("malletrain", "jpa"):
            r = rows.get(name)
            if r is None or "milp-true" not in rows:
                continue
            if name == "jpa" and r.get("replayed_as") == "malletrain" and "malletrain" in rows:
                continue  # the same replays: one target
            regret = r["regret_whole_pct"][0]
            out.append(Target(f"{w.upper()}: {name}'s learning cost (regret vs {r['regret_against']} in work, "
                              f"profiling counted in full) <= {TARGET_REGRET_PCT:g}%", f"{regret:.1f}%",
                              regret <= TARGET_REGRET_PCT))
    claims = ev.trace_claims
    if claims and not all(is_real(c[0]) for c in ev.cells()):
        share = claims["node_seconds_while_above_pct"]
        out.append(Target(
            f"trace: >= {TARGET_ABOVE_SHARE_PCT:g}% of idle node-seconds come while the pool exceeds "
            f"Pjmax x 64 = {claims['capacity_nodes']} nodes",
            f"{share:.1f}% (by time: {claims['time_above_pct']:.1f}%; beyond the {claims['capacity_nodes']} "
            f"no policy can use: {claims['node_seconds_beyond_pct']:.1f}%)",
            share >= TARGET_ABOVE_SHARE_PCT))
    return out


# ---------------------------------------------------------------- real streams (issue 18)


def is_baseline(label: str) -> bool:
    """The simple baselines the default is compared with (all at its admission, but the fixed-Pjmax ones)."""
    return label.startswith("freetrain") or label in ("greedy", "equal", "rigid-preemptible")


def best_baseline(runs: dict[str, dict[int, dict]]) -> str | None:
    """The baseline label with the highest mean work over the seeds in this cell."""
    base = [(statistics.fmean(work(s) for s in seeds.values()), label)
            for label, seeds in runs.items() if is_baseline(label)]
    return max(base)[1] if base else None


def real_rows(ev: Evaluation, cell: Cell) -> list[dict]:
    """One row per label: work, share of offered work, vs the best baseline (per seed), gap to the bound
    (min(offered, idle x best efficiency)) and to the oracle bound, what costs cost, completion and waits."""
    runs = ev.by_label(cell)
    best = best_baseline(runs)
    ref = runs.get(best, {}) if best else {}
    oracle = runs.get("oracle-bound", {})
    rows = []
    order = [DEFAULT] + sorted(label for label in runs if label != DEFAULT)
    for label in [lb for lb in order if lb in runs]:
        seeds = runs[label]
        ks = sorted(seeds)
        ss = [seeds[k] for k in ks]
        row: dict = {"policy": label, "seeds": ks, "best_baseline": label == best, "baseline": is_baseline(label)}
        row["work"] = mean_sd([work(s) for s in ss])
        row["share_of_offered_pct"] = mean_sd([100.0 * s["work_share_of_offered"] for s in ss
                                               if s.get("work_share_of_offered") is not None])
        row["vs_best_baseline_pct"] = mean_sd([_pct_over(work(seeds[k]), work(ref[k])) for k in ks if k in ref])
        row["vs_best_baseline_min_pct"] = min((_pct_over(work(seeds[k]), work(ref[k])) for k in ks if k in ref),
                                              default=math.nan)
        row["gap_to_bound_pct"] = mean_sd([s.get("gap_to_bound_pct") for s in ss])
        row["above_bound"] = [k for k in ks if work(seeds[k]) > seeds[k]["bound_work_node_seconds"] * (1 + 1e-9)]
        row["vs_oracle_bound_pct"] = mean_sd([_pct_over(work(seeds[k]), work(oracle[k])) for k in ks if k in oracle])
        row["lost_work_pct"] = mean_sd([100.0 * s.get("lost_work_node_seconds", 0.0) / max(work(s), 1e-9) for s in ss])
        for key in ("restarts", "preemptions", "rescales", "jobs_completed", "jobs_submitted", "jct_mean_seconds",
                    "wait_mean_seconds", "wait_p95_seconds", "cpu_seconds", "held_fraction"):
            row[key] = mean_sd([s.get(key) for s in ss])
        row["longest_waiting_model"] = _mode([s.get("longest_waiting_model") for s in ss])
        row["wait_by_model_seconds"] = _mean_by_key([s.get("wait_by_model_seconds") or {} for s in ss])
        row["admission"] = ss[0].get("admission")
        row["calibration"] = ss[0].get("calibration")
        rows.append(row)
    return rows


def _mode(values: list) -> object:
    vals = [v for v in values if v is not None]
    return max(sorted(set(vals)), key=vals.count) if vals else None


def _mean_by_key(dicts: list[dict]) -> dict[str, float]:
    keys = sorted({k for d in dicts for k in d})
    return {k: statistics.fmean(d[k] for d in dicts if k in d) for k in keys}


def real_targets(ev: Evaluation) -> list[Target]:
    """Issue 18's targets on the real streams: the default against the best equal-admission baseline at
    the headline loads (>= MIN_SEEDS seeds), its gap to the bound at the saturation load, and bounds
    that hold (no policy above min(offered, idle x best efficiency) on any seed, none above the oracle
    bound on the mean)."""
    out: list[Target] = []
    held: list[str] = []
    for cell in ev.cells():
        if not is_real(cell[0]):
            continue
        load = split_workload(cell[0])[1]
        rows = {r["policy"]: r for r in real_rows(ev, cell)}
        mt = rows.get(DEFAULT)
        best = next((r for r in rows.values() if r["best_baseline"]), None)
        n = len(ev.settings.seeds)
        if mt is not None and best is not None and load in HEADLINE_LOADS:
            gain = mt["vs_best_baseline_pct"][0]
            out.append(Target(
                f"{cell[0]}: {DEFAULT} >= the best equal-admission baseline ({best['policy']}) + "
                f"{TARGET_REAL_GAIN_PCT:g}% in work, mean over >= {MIN_SEEDS} seeds, costs charged",
                f"{gain:+.1f}% (worst seed {mt['vs_best_baseline_min_pct']:+.1f}%; {n} seeds)",
                gain >= TARGET_REAL_GAIN_PCT and n >= MIN_SEEDS))
        if mt is not None and load == SATURATION_LOAD:
            gap = mt["gap_to_bound_pct"][0]
            out.append(Target(f"{cell[0]}: {DEFAULT}'s gap to the bound min(offered work, idle node-s x best "
                              f"per-node efficiency) <= {TARGET_BOUND_GAP_PCT:g}%",
                              f"{gap:.1f}% (vs the oracle bound {mt['vs_oracle_bound_pct'][0]:+.1f}%)",
                              gap <= TARGET_BOUND_GAP_PCT))
        for r in rows.values():
            if r["above_bound"]:
                held.append(f"{cell[0]} {r['policy']} above min(offered, idle x eff) on seed(s) {r['above_bound']}")
            beat = r["vs_oracle_bound_pct"][0]
            if r["policy"] != "oracle-bound" and not math.isnan(beat) and beat > BOUND_TOLERANCE_PCT:
                held.append(f"{cell[0]} {r['policy']} {beat:+.1f}% over the oracle bound")
    if any(is_real(c[0]) for c in ev.cells()):
        out.append(Target("bounds hold: no policy above min(offered, idle x best efficiency) on any seed, none "
                          f"more than {BOUND_TOLERANCE_PCT:g}% above the oracle bound (free costs, no cap) on the mean",
                          "; ".join(held) if held else "held everywhere", not held))
    return out


def real_table(ev: Evaluation, cell: Cell) -> list[str]:
    lines = [
        "| policy | admission | work (node-s) | share of offered | vs best baseline | gap to bound | vs oracle bound "
        "| lost to rollbacks | restarts | JCT mean h | wait mean h | longest wait |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in real_rows(ev, cell):
        tag = " (best baseline)" if r["best_baseline"] else ""
        lines.append(
            f"| {r['policy']}{tag} | {r['admission']} | {ms(r['work'])} | {ms(r['share_of_offered_pct'], '.1f', '%')} "
            f"| {ms(r['vs_best_baseline_pct'], '+.1f', '%')} | {ms(r['gap_to_bound_pct'], '.1f', '%')} "
            f"| {ms(r['vs_oracle_bound_pct'], '+.1f', '%')} | {ms(r['lost_work_pct'], '.1f', '%')} "
            f"| {ms(r['restarts'], '.0f')} | {_hours(r['jct_mean_seconds'])} | {_hours(r['wait_mean_seconds'])} "
            f"| {r['longest_waiting_model'] or '-'} |")
    return lines


def waits_table(ev: Evaluation, cell: Cell) -> list[str]:
    """Mean wait (submission to first nodes; never started: to the end) per model, hours: who starves."""
    rows = real_rows(ev, cell)
    models = sorted({m for r in rows for m in r["wait_by_model_seconds"]})
    lines = ["| policy | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
    for r in rows:
        w = r["wait_by_model_seconds"]
        lines.append(f"| {r['policy']} | " + " | ".join(f"{w[m] / 3600:.2f}" if m in w else "-" for m in models) + " |")
    return lines


def tfwd_rows(ev: Evaluation) -> list[dict]:
    """Per workload, Tfwd and policy: work mean and sd over seeds, and the share of the best Tfwd."""
    rows: list[dict] = []
    for cell in ev.cells():
        for label, seeds in ev.by_label(cell).items():
            m, sd = mean_sd([work(s) for s in seeds.values()])
            rows.append({"workload": cell[0], "tfwd_s": cell[3], "policy": label, "work": (m, sd)})
    for w, p in {(r["workload"], r["policy"]) for r in rows}:
        mine = [r for r in rows if r["workload"] == w and r["policy"] == p]
        top = max(r["work"][0] for r in mine)
        for r in mine:
            r["of_best_pct"] = 100.0 * r["work"][0] / top if top > 0 else float("nan")
    return rows


def tfwd_choice(rows: list[dict]) -> float | None:
    """The Tfwd with the highest mean share of each (workload, policy)'s best work."""
    shares: dict[float, list[float]] = {}
    for r in rows:
        shares.setdefault(r["tfwd_s"], []).append(r["of_best_pct"])
    if not shares:
        return None
    return max(shares, key=lambda tf: (statistics.fmean(shares[tf]), -tf))


# ---------------------------------------------------------------- outputs


def ms(v: tuple[float, float], spec: str = ".3g", suffix: str = "") -> str:
    m, sd = v
    if m is None or math.isnan(m):
        return "-"
    return f"{format(m, spec)} ± {format(sd, spec.lstrip('+'))}{suffix}"


def _hours(v: tuple[float, float]) -> str:
    m, sd = v
    return "-" if math.isnan(m) else f"{m / 3600:.2f} ± {sd / 3600:.2f}"


def cell_title(cell: Cell, settings: EvalSettings) -> str:
    w, pj, mn, tf = cell
    return (f"{w.upper()}, Pjmax {pj if pj is not None else settings.max_running}, max nodes "
            f"{mn if mn is not None else 'stream (64)'}" + (f", Tfwd {tf:g} s" if tf is not None else ""))


def cell_table(ev: Evaluation, cell: Cell) -> list[str]:
    lines = [
        "| policy | work (node-s) | vs freetrain best | regret vs milp-true | constrained: work | vs best "
        "| unconstrained: work | vs best | samples | profiling | CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in policy_rows(ev, cell):
        tag = " (best prior)" if r["best_prior"] else " (worst prior)" if r["worst_prior"] else ""
        same = f" (= {r['replayed_as']})" if r.get("replayed_as") else ""
        lines.append(
            f"| {r['policy']}{tag}{same} | {ms(r['work_whole'])} | {ms(r['vs_best_freetrain_whole_pct'], '+.1f', '%')} "
            f"| {ms(r['regret_whole_pct'], '.1f', '%')}{_against(r)} | {ms(r['work_constrained'])} "
            f"| {ms(r['vs_best_freetrain_constrained_pct'], '+.1f', '%')} | {ms(r['work_unconstrained'])} "
            f"| {ms(r['vs_best_freetrain_unconstrained_pct'], '+.1f', '%')} | {ms(r['samples'])} "
            f"| {ms(r['profiling_pct'], '.2f', '%')} | {ms(r['cpu_seconds'], '.0f')} |")
    return lines


def _against(row: dict) -> str:
    return "" if row["regret_against"] == "milp-true" else f" (vs {row['regret_against']})"


def completion_table(ev: Evaluation, cell: Cell) -> list[str]:
    lines = [
        "| policy | jobs completed | makespan h | JCT mean h | JCT p95 h | wait, slowest quarter h "
        "| wait, fastest quarter h | constrained time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in policy_rows(ev, cell):
        lines.append(
            f"| {r['policy']} | {ms(r['jobs_completed'], '.0f')} | {_hours(r['makespan_seconds'])} "
            f"| {_hours(r['jct_mean_seconds'])} | {_hours(r['jct_p95_seconds'])} "
            f"| {_hours(r['wait_slowest_quarter_seconds'])} | {_hours(r['wait_fastest_quarter_seconds'])} "
            f"| {ms(r['constrained_time_pct'], '.1f', '%')} |")
    return lines


def markdown(ev: Evaluation, command: str) -> str:
    st = ev.settings
    lines = [
        "# Evaluation: policies x workloads x seeds, in model-neutral work",
        "",
        f"Generated by `{command}`.",
        "",
        f"Trace `{ev.trace}`; scaling `{ev.scaling_source}`; seeds {', '.join(map(str, st.seeds))}; "
        f"Pjmax {st.max_running}; Tfwd {st.horizon_s:g} s; "
        + (f"a finite list of {st.n_jobs} jobs per replay. " if st.n_jobs else "endless job streams. ")
        + "Every policy is the daemon's `policy.Policy` (a preset), fed measured rates and rescale pauses. "
        "**work** = each job's samples over its own 1-node rate (node-seconds at one node, model-neutral); "
        "every cell is mean ± sample sd over the seeds. **vs freetrain best**: per seed, against freetrain "
        "with its best prior of the panel (linear from the 1-node rate, the population mean, another model's "
        "curve, the true curve ± 20%); **regret** = (ceiling − policy) / ceiling in work, per seed, where the "
        "ceiling is the same policy given the true curves: milp-true for the daemon's default (adaptive "
        "admission), freetrain:noise:0 (the true curve, fixed Pjmax) for freetrain, jpa and greedy "
        "(every cost of learning, profiling in full). **Constrained** periods: the idle pool is at most what "
        "the admitted jobs can absorb at their max nodes; **unconstrained**: it exceeds that. A policy whose "
        "admitted jobs absorb another pool (adaptive admission admits more jobs as the pool grows) has other "
        "periods: its per-period columns show its own work, and '-' where a comparison with freetrain's "
        "periods would not be like for like. Profiling: node-seconds held while profiling, % of used.",
        "",
    ]
    if st.tfwd_sweep:
        rows = tfwd_rows(ev)
        lines += ["| workload | Tfwd s | policy | work (node-s) | % of its best Tfwd |", "|---|---:|---|---:|---:|"]
        for r in sorted(rows, key=lambda r: (r["workload"], r["policy"], r["tfwd_s"])):
            lines.append(f"| {r['workload']} | {r['tfwd_s']:g} | {r['policy']} | {ms(r['work'])} "
                         f"| {r['of_best_pct']:.2f}% |")
        choice = tfwd_choice(rows)
        lines += ["", f"Chosen Tfwd (highest mean share of the best): **{choice:g} s**" if choice else "", ""]
        return "\n".join(lines)
    real = [c for c in ev.cells() if is_real(c[0])]
    if real:
        lines += [REAL_METHOD.format(cal=ev.runs[0][1].get("calibration"), fixed=", ".join(map(str, st.fixed_pjmax))),
                  ""]
    for cell in ev.cells():
        if is_real(cell[0]):
            lines += [f"## {cell_title(cell, st)}: real stream, offered load {split_workload(cell[0])[1]:g}", ""]
            lines += real_table(ev, cell) + ["", "Mean wait per model, hours (who starves):", ""]
            lines += waits_table(ev, cell) + [""]
            continue
        lines += [f"## {cell_title(cell, st)}" + ("" if st.n_jobs else ": endless stream (a saturation case)"), ""]
        lines += cell_table(ev, cell) + [""]
        if st.n_jobs or not st.sweep:
            lines += completion_table(ev, cell) + [""]
    claims = ev.trace_claims
    if claims and len(real) < len(ev.cells()):
        lines += [f"Idle pool above Pjmax x 64 = {claims['capacity_nodes']} nodes: {claims['time_above_pct']:.1f}% "
                  f"of the time, {claims['node_seconds_while_above_pct']:.1f}% of the idle node-seconds; "
                  f"{claims['node_seconds_beyond_pct']:.1f}% of the idle node-seconds lie beyond it (no policy "
                  "with these jobs can use them).", ""]
    if ev.targets:
        lines += ["Targets:", ""]
        lines += [f"- {'PASS' if t.passed else 'FAIL'}: {t.name} ({t.value})" for t in ev.targets]
        lines += [""]
    if real:
        lines += ["![work per policy over the best equal-admission baseline, per offered load](fig_real.png)", ""]
    if len(real) < len(ev.cells()):
        lines += ["![work per policy over freetrain's best prior, mean and sd over seeds](fig3_10.png)", ""]
    return "\n".join(lines)


REAL_METHOD = (
    "**Real streams** (`philly@X`: Philly arrivals and sizes on the Pollux curves, offered load X = the stream's "
    "work over the window's idle node-seconds). Costs charged from `{cal}` (pilot start, cold start, restart "
    "with rollback to the last checkpoint commit, rescale pauses). Every baseline runs at the default's "
    "admission (adaptive, same Pjmax floor and cap) and every policy optimises work, but `jpa` (the paper's "
    "policy, its own fixed admission) and `freetrain-fixed:N` (freetrain at a fixed Pjmax N, N in {fixed}). "
    "**vs best baseline**: per seed, against the baseline with the highest mean work (freetrain with any prior "
    "of the panel or at any fixed Pjmax, greedy, equal, rigid-preemptible). **gap to bound**: 1 − work / "
    "min(offered work, idle node-s × the best work per node-second any job's curve reaches), a bound no policy "
    "can beat. **oracle-bound**: the true curves, free rescales and starts, no admission cap: a reference, not "
    "a guarantee. `milp-true` is the default with the true curves (what learning costs), not a ceiling. "
    "**lost to rollbacks**: work rolled back at stops, % of the work kept.")


def _jsonable(v: object) -> object:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def write_evaluation(ev: Evaluation, out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "evaluation.md"
    md.write_text(markdown(ev, command))
    js = out / "evaluation.json"
    cells = [{"workload": c[0], "max_running": c[1], "max_nodes": c[2], "tfwd_s": c[3],
              "rows": [{k: _jsonable(v) for k, v in r.items()}
                       for r in (real_rows(ev, c) if is_real(c[0]) else policy_rows(ev, c))]}
             for c in ev.cells()] if not ev.settings.tfwd_sweep else []
    payload = {
        "command": command,
        "settings": {**asdict(ev.settings), "policy_config": ev.settings.policy_config.as_dict(),
                     "calibration": ev.settings.sim_config().calibration.as_dict()},
        "trace": ev.trace,
        "scaling": ev.scaling_source,
        "cells": cells,
        "tfwd": [{k: _jsonable(v) for k, v in r.items()} for r in tfwd_rows(ev)] if ev.settings.tfwd_sweep else [],
        "trace_claims": ev.trace_claims,
        "targets": [asdict(t) for t in ev.targets],
        "runs": [{"spec": asdict(spec), "summary": s} for spec, s in ev.runs],
    }
    js.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    written = [md, js]
    if not ev.settings.tfwd_sweep:
        if not all(is_real(c[0]) for c in ev.cells()):
            fig = write_chart(ev, out / "fig3_10.png")
            if fig is not None:
                written.append(fig)
        if any(is_real(c[0]) for c in ev.cells()):
            fig = write_real_chart(ev, out / "fig_real.png")
            if fig is not None:
                written.append(fig)
    return written


def same_periods(row: dict, rows: list[dict], tolerance_pct: float = 0.5) -> bool:
    """Whether ``row``'s constrained periods are the best freetrain prior's (their share of time agrees)."""
    base = next((r for r in rows if r.get("best_prior")), None)
    if base is None or "constrained_time_pct" not in row:
        return True
    return abs(row["constrained_time_pct"][0] - base["constrained_time_pct"][0]) <= tolerance_pct


def write_chart(ev: Evaluation, path: Path) -> Path | None:
    """MalleTrain Fig. 3.10 in work: per workload (headline cells) and part of the week, each policy's
    work over freetrain's best prior (mean, with the seeds' sd as error bars and every seed as a dot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("malletrain evaluate: warning: matplotlib not installed; no chart", file=sys.stderr)
        return None
    headline = headline_cells(ev)
    if not headline:
        return None
    fig, axes = plt.subplots(1, len(headline), figsize=(6.5 * len(headline), 4.6), squeeze=False)
    partial = False
    for ax, (w, cell) in zip(axes[0], headline.items()):
        rows = [r for r in policy_rows(ev, cell) if not r["policy"].startswith("freetrain:") or r["best_prior"]
                or r["worst_prior"]]
        labels = [r["policy"] + (" (best)" if r["best_prior"] else " (worst)" if r["worst_prior"] else "")
                  for r in rows]
        width = 0.8 / len(PARTS)
        colours = ("#444444", "#d95f02", "#1b9e77")
        same = [r["same_periods"] for r in rows]
        for k, part in enumerate(PARTS):
            xs = [i + (k - 1) * width for i in range(len(rows))]
            # a period bar compares the same periods only: a policy whose admitted jobs absorb a
            # different pool (adaptive admission) has other periods, and gets the whole bar alone
            means = [1.0 + r[f"vs_best_freetrain_{part}_pct"][0] / 100.0 if part == "whole" or ok else math.nan
                     for r, ok in zip(rows, same)]
            sds = [r[f"vs_best_freetrain_{part}_pct"][1] / 100.0 if part == "whole" or ok else 0.0
                   for r, ok in zip(rows, same)]
            ax.bar(xs, means, width, yerr=sds, capsize=2, color=colours[k], alpha=0.8, label=part)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("work / freetrain (best prior)'s work")
        ax.set_ylim(0.0, None)  # bars from zero: their lengths are the ratios
        partial = partial or not all(same)
        n = len(ev.settings.seeds)
        ax.set_title(f"{cell_title(cell, ev.settings)}\nmean ± sd over {n} seed{'s' if n != 1 else ''}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    top = 0.89 if partial else 0.93  # below a two-line title
    fig.legend(handles, [f"{n} period" if n != "whole" else "whole replay" for n in names], loc="upper center",
               ncols=3, fontsize=8, bbox_to_anchor=(0.5, top))
    title = "Model-neutral work relative to FreeTrain with its best prior (Fig. 3.10, in work)"
    if partial:
        title += ("\nperiod bars only where the periods are freetrain's (under adaptive admission every period "
                  "is constrained)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, top - 0.03))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_real_chart(ev: Evaluation, path: Path) -> Path | None:
    """Per real-stream cell (offered load), each policy's work over the best equal-admission baseline's:
    mean with the seeds' sd, every seed a dot; the legend sits outside the axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("malletrain evaluate: warning: matplotlib not installed; no chart", file=sys.stderr)
        return None
    cells = [c for c in ev.cells() if is_real(c[0])]
    fig, axes = plt.subplots(1, len(cells), figsize=(5.2 * len(cells), 4.8), squeeze=False, sharey=True)
    for ax, cell in zip(axes[0], cells):
        rows = real_rows(ev, cell)
        runs = ev.by_label(cell)
        best = best_baseline(runs)
        ref = runs.get(best, {}) if best else {}
        tops = [1.0]
        for i, r in enumerate(rows):
            m, sd = r["vs_best_baseline_pct"]
            colour = "#1b9e77" if r["policy"] == DEFAULT else "#d95f02" if r["best_baseline"] else \
                "#999999" if r["policy"] == "oracle-bound" else "#7570b3"
            ax.bar(i, 1.0 + m / 100.0, 0.7, yerr=sd / 100.0, capsize=2, color=colour, alpha=0.85, zorder=2)
            dots = [work(runs[r["policy"]][k]) / work(ref[k]) for k in r["seeds"] if k in ref and work(ref[k]) > 0]
            tops += dots + ([1.0 + (m + sd) / 100.0] if not math.isnan(m) else [])
            ax.plot([i] * len(dots), dots, "k.", ms=3, zorder=3)
        ax.axhline(1.0, color="grey", lw=0.8, zorder=1)
        ax.set_xticks(range(len(rows)), [r["policy"] for r in rows], rotation=55, ha="right", fontsize=7)
        ax.set_title(f"offered load {split_workload(cell[0])[1]:g} (best baseline: {best})", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3, zorder=0)
        ax.set_ylim(0.0, max(tops) * 1.08)  # every bar, error bar and dot inside the axes
    axes[0][0].set_ylabel("work / best equal-admission baseline's work")
    n = len(ev.settings.seeds)
    title = (f"Philly stream on {Path(ev.trace).name}: work relative to the best simple baseline, costs charged "
             f"(mean ± sd over {n} seed{'s' if n != 1 else ''}; dots: seeds)")
    if "SYNTHETIC" in ev.trace or "synthetic" in ev.trace.lower():
        title = "SYNTHETIC trace. " + title
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_report(ev: Evaluation, stream=None) -> None:  # type: ignore[no-untyped-def]
    """The tables and PASS/FAIL per target as plain text (stdout by default)."""
    stream = sys.stdout if stream is None else stream
    if ev.settings.tfwd_sweep:
        rows = tfwd_rows(ev)
        for r in sorted(rows, key=lambda r: (r["workload"], r["policy"], r["tfwd_s"])):
            print(f"  {r['workload']:<9} Tfwd {r['tfwd_s']:>5g} s  {r['policy']:<11} work {ms(r['work'])}  "
                  f"{r['of_best_pct']:6.2f}% of its best", file=stream)
        choice = tfwd_choice(rows)
        if choice is not None:
            print(f"chosen Tfwd: {choice:g} s", file=stream)
        return
    for cell in ev.cells():
        if is_real(cell[0]):
            print(f"{cell_title(cell, ev.settings)} (real stream):", file=stream)
            print(f"  {'policy':<22} {'work node-s':>20} {'of offered':>14} {'vs best baseline':>17} "
                  f"{'gap to bound':>14} {'vs oracle bound':>16}", file=stream)
            for r in real_rows(ev, cell):
                print(f"  {r['policy']:<22} {ms(r['work']):>20} {ms(r['share_of_offered_pct'], '.1f', '%'):>14} "
                      f"{ms(r['vs_best_baseline_pct'], '+.1f', '%'):>17} {ms(r['gap_to_bound_pct'], '.1f', '%'):>14} "
                      f"{ms(r['vs_oracle_bound_pct'], '+.1f', '%'):>16}", file=stream)
            continue
        print(f"{cell_title(cell, ev.settings)}:", file=stream)
        print(f"  {'policy':<22} {'work node-s':>20} {'vs freetrain best':>18} {'regret':>15} "
              f"{'constrained vs best':>20} {'unconstr. vs best':>18} {'samples':>20}", file=stream)
        for r in policy_rows(ev, cell):
            print(f"  {r['policy']:<22} {ms(r['work_whole']):>20} {ms(r['vs_best_freetrain_whole_pct'], '+.1f', '%'):>18} "
                  f"{ms(r['regret_whole_pct'], '.1f', '%'):>15} "
                  f"{ms(r['vs_best_freetrain_constrained_pct'], '+.1f', '%'):>20} "
                  f"{ms(r['vs_best_freetrain_unconstrained_pct'], '+.1f', '%'):>18} {ms(r['samples']):>20}",
                  file=stream)
    for t in ev.targets:
        print(f"{'PASS' if t.passed else 'FAIL'}: {t.name} ({t.value})", file=stream)
