"""The evaluation's data and arithmetic: settings, the runs of one evaluation, statistics over seeds,
the rows of its tables and the targets it checks (:mod:`evaluation.evaluate` runs it,
:mod:`evaluation.report` writes it). See :mod:`evaluation.evaluate` for what is measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from policy import PolicyConfig
from simulator.calibration import Calibration
from simulator.calibration import default as default_calibration
from simulator.engine import SimConfig
from simulator.policies import Overrides
from evaluation.sweep import RunSpec, split_workload
from traces.model import IdleTimeline

POLICIES = ("freetrain", "malletrain", "jpa", "milp-true", "oracle", "greedy")
# on a real finite stream every baseline runs at the default's admission (--admission and friends
# override presets), scored in work; freetrain also at fixed Pjmax (its own baseline), each of FIXED_PJMAX
REAL_POLICIES = ("malletrain", "freetrain", "greedy", "equal", "rigid-preemptible", "jpa", "milp-true")
FIXED_PJMAX = (10, 40, 100)
FIXED_PRIOR = "mean"  # freetrain's prior in the fixed-Pjmax sweep
DEFAULT = "malletrain"
HEADLINE_LOADS = (1.0, 1.5)  # the target: default >= best fixed-prior equal-admission baseline + TARGET_REAL_GAIN_PCT
SATURATION_LOAD = 2.0  # the target: gap to the bound <= TARGET_BOUND_GAP_PCT
TARGET_REAL_GAIN_PCT = 5.0
TARGET_BOUND_GAP_PCT = 5.0
SCARCE = "scarce"  # the scarce mix (simulator.philly.scarce_workload)
TARGET_SCARCE_OF_CEILING = 0.95  # scarce: the default's work over milp-true's, from each learning prior
TARGET_SATURATED_RATIO = 0.99  # saturated: the default's work over the best fixed-prior baseline's
MIN_SEEDS = 5
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
    flags: Overrides = field(default_factory=Overrides)  # the overrides the user gave: every preset honours them
    calibration: Calibration | None = None  # None: the shipped calibration
    fixed_pjmax: tuple[int, ...] = FIXED_PJMAX
    users: str = "workload"  # whose each job is, for fair share (SimConfig.users)

    @property
    def max_running(self) -> int:
        return self.policy_config.max_running

    @property
    def horizon_s(self) -> float:
        return self.policy_config.tfwd_s

    def sim_config(self) -> SimConfig:
        cal = self.calibration if self.calibration is not None else default_calibration()
        return SimConfig(start=self.start, end=self.end, min_interval_s=self.min_interval_s, calibration=cal,
                         users=self.users)


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


def is_real(workload: str) -> bool:
    """A real finite stream (``philly@X``, the ``scarce`` mix), not an endless generated one (a saturation case)."""
    return split_workload(workload)[0] in ("philly", "philly-done", "pollux-done", SCARCE)


def is_scarce(workload: str) -> bool:
    """The scarce mix: fewer jobs than nodes, the six models' curves (what learning is for)."""
    return split_workload(workload)[0] == SCARCE



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


# ---------------------------------------------------------------- real streams
# freetrain's priors a user can fix before the run (the population mean; linear from one small run);
# the headline compares the default with each, per seed
FIXED_PRIORS = ("mean", "linear")
REFERENCE = "oracle-reference"  # the true curves, free costs, no admission cap: a reference, not a bound
FIXED_PJMAX_PREFIX = "freetrain-fixed:"


def is_baseline(label: str) -> bool:
    """A simple baseline at the default's admission (equal admission): freetrain with any prior,
    greedy, equal, rigid-preemptible. The fixed-Pjmax rows run at their own admission: not these."""
    if label.startswith(FIXED_PJMAX_PREFIX):
        return False
    return label.startswith("freetrain:") or label in ("greedy", "equal", "rigid-preemptible")


def knows_the_curve(label: str) -> bool:
    """A baseline handed each job's own true curve (within noise): information the default never has."""
    return label.startswith("freetrain:noise")


def is_fixed_prior_baseline(label: str) -> bool:
    """An equal-admission baseline whose belief a user could configure before the run."""
    return is_baseline(label) and not knows_the_curve(label)


def best_baseline(runs: dict[str, dict[int, dict]],
                  among: Callable[[str], bool] = is_fixed_prior_baseline) -> str | None:
    """The label with the highest mean work over the seeds in this cell among ``among`` (by default
    the equal-admission baselines with a prior fixed before the run)."""
    base = [(statistics.fmean(work(s) for s in seeds.values()), label)
            for label, seeds in runs.items() if among(label)]
    return max(base)[1] if base else None


def best_fixed_pjmax(runs: dict[str, dict[int, dict]]) -> str | None:
    """The best freetrain at a fixed Pjmax: a baseline at its own admission, compared on its own."""
    return best_baseline(runs, lambda label: label.startswith(FIXED_PJMAX_PREFIX))


def best_reference(runs: dict[str, dict[int, dict]]) -> str | None:
    """The best equal-admission baseline handed each job's curve within noise (a labelled reference)."""
    return best_baseline(runs, lambda label: is_baseline(label) and knows_the_curve(label))


def _per_seed_pct(seeds: dict[int, dict], ref: dict[int, dict]) -> list[float]:
    return [_pct_over(work(seeds[k]), work(ref[k])) for k in sorted(seeds) if k in ref]


NO_SHARE = "malletrain-no-share"  # the default without fair share between users (a policy.PRESETS entry)


def fair_share_costs(ev: Evaluation, cell: Cell) -> dict[str, tuple[float, float]]:
    """What fair share between users costs in work, per starting belief of the default (``malletrain``,
    ``malletrain:linear``): its work over :data:`NO_SHARE`'s from the same belief, in %, mean and sd
    over the seeds both ran (negative: the shares cost work). Empty where ``NO_SHARE`` did not run."""
    runs = ev.by_label(cell)
    out: dict[str, tuple[float, float]] = {}
    for label in sorted(runs):
        if label == DEFAULT or label.startswith(DEFAULT + ":"):
            other = NO_SHARE + label[len(DEFAULT):]
            if other in runs:
                out[label] = mean_sd(_per_seed_pct(runs[label], runs[other]))
    return out


def comparisons(runs: dict[str, dict[int, dict]]) -> dict[str, str | None]:
    """What each row is compared with: name -> label in this cell (None: not replayed)."""
    out: dict[str, str | None] = {f"freetrain:{p}": (f"freetrain:{p}" if f"freetrain:{p}" in runs else None)
                                  for p in FIXED_PRIORS}
    out["best fixed-prior"] = best_baseline(runs)
    out["best fixed-Pjmax"] = best_fixed_pjmax(runs)
    out["reference"] = best_reference(runs)
    return out


def real_rows(ev: Evaluation, cell: Cell) -> list[dict]:
    """One row per label: work, share of offered work, vs the best fixed-prior equal-admission baseline
    (per seed), vs freetrain with each fixed prior, vs the best fixed-Pjmax freetrain and vs the reference
    given each job's curve within 20%; gap to the bound (min(offered, idle x best efficiency)), vs the
    oracle reference, what costs cost, completion and waits."""
    runs = ev.by_label(cell)
    against = comparisons(runs)
    best = against["best fixed-prior"]
    ref = runs.get(best, {}) if best else {}
    oracle = runs.get(REFERENCE, {})
    rows = []
    order = [DEFAULT] + sorted(label for label in runs if label != DEFAULT)
    for label in [lb for lb in order if lb in runs]:
        seeds = runs[label]
        ks = sorted(seeds)
        ss = [seeds[k] for k in ks]
        row: dict = {"policy": label, "seeds": ks, "best_baseline": label == best, "baseline": is_baseline(label),
                     "fixed_prior": is_fixed_prior_baseline(label), "compared_with": against}
        row["work"] = mean_sd([work(s) for s in ss])
        row["share_of_offered_pct"] = mean_sd([100.0 * s["work_share_of_offered"] for s in ss
                                               if s.get("work_share_of_offered") is not None])
        row["vs_best_baseline_pct"] = mean_sd(_per_seed_pct(seeds, ref))
        row["vs_best_baseline_min_pct"] = min(_per_seed_pct(seeds, ref), default=math.nan)
        row["vs_pct"] = {name: mean_sd(_per_seed_pct(seeds, runs[lb])) if lb else (math.nan, math.nan)
                         for name, lb in against.items()}
        row["gap_to_bound_pct"] = mean_sd([s.get("gap_to_bound_pct") for s in ss])
        row["above_bound"] = [k for k in ks if work(seeds[k]) > seeds[k]["bound_work_node_seconds"] * (1 + 1e-9)]
        row["vs_oracle_bound_pct"] = mean_sd(_per_seed_pct(seeds, oracle))
        row["lost_work_pct"] = mean_sd([100.0 * s.get("lost_work_node_seconds", 0.0) / max(work(s), 1e-9) for s in ss])
        for key in ("restarts", "preemptions", "rescales", "jobs_completed", "jobs_submitted", "jct_mean_seconds",
                    "jct_p95_seconds", "wait_mean_seconds", "wait_p95_seconds", "cpu_seconds", "held_fraction",
                    "slowdown_mean", "slowdown_p95", "slowdown_fairness_jain"):
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


def same_periods(row: dict, rows: list[dict], tolerance_pct: float = 0.5) -> bool:
    """Whether ``row``'s constrained periods are the best freetrain prior's (their share of time agrees)."""
    base = next((r for r in rows if r.get("best_prior")), None)
    if base is None or "constrained_time_pct" not in row:
        return True
    return abs(row["constrained_time_pct"][0] - base["constrained_time_pct"][0]) <= tolerance_pct
