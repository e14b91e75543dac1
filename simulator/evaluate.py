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
from simulator.engine import SimConfig
from simulator.sweep import Replays, RunSpec, run_replays
from simulator.workload import ScalingSet
from traces.model import IdleTimeline

POLICIES = ("freetrain", "malletrain", "jpa", "milp-true", "oracle", "greedy")
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

    @property
    def max_running(self) -> int:
        return self.policy_config.max_running

    @property
    def horizon_s(self) -> float:
        return self.policy_config.tfwd_s

    def sim_config(self) -> SimConfig:
        return SimConfig(start=self.start, end=self.end, min_interval_s=self.min_interval_s)


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
        for p in settings.policies:
            priors = settings.priors + ((CEILING_PRIOR,) if CEILING_PRIOR not in settings.priors else ()) \
                if p == "freetrain" else ("mean",)
            specs += [RunSpec(w, p, seed, prior=pr, max_running=pj, max_nodes=mn) for pr in priors]
    return specs


def evaluate(
    timeline: IdleTimeline,
    scaling: ScalingSet,
    settings: EvalSettings = EvalSettings(),
    on_done: Callable[[RunSpec, dict], None] | None = None,
) -> Evaluation:
    """Run every replay (Dask tasks; see :func:`simulator.sweep.run_replays`) and check the targets."""
    replays = Replays(timeline, scaling, settings.policy_config, settings.sim_config(), settings.n_jobs)
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
    for w, cell in headline_cells(ev).items():
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
    if claims:
        share = claims["node_seconds_while_above_pct"]
        out.append(Target(
            f"trace: >= {TARGET_ABOVE_SHARE_PCT:g}% of idle node-seconds come while the pool exceeds "
            f"Pjmax x 64 = {claims['capacity_nodes']} nodes",
            f"{share:.1f}% (by time: {claims['time_above_pct']:.1f}%; beyond the {claims['capacity_nodes']} "
            f"no policy can use: {claims['node_seconds_beyond_pct']:.1f}%)",
            share >= TARGET_ABOVE_SHARE_PCT))
    return out


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
    for cell in ev.cells():
        lines += [f"## {cell_title(cell, st)}", ""] + cell_table(ev, cell) + [""]
        if st.n_jobs or not st.sweep:
            lines += completion_table(ev, cell) + [""]
    claims = ev.trace_claims
    if claims:
        lines += [f"Idle pool above Pjmax x 64 = {claims['capacity_nodes']} nodes: {claims['time_above_pct']:.1f}% "
                  f"of the time, {claims['node_seconds_while_above_pct']:.1f}% of the idle node-seconds; "
                  f"{claims['node_seconds_beyond_pct']:.1f}% of the idle node-seconds lie beyond it (no policy "
                  "with these jobs can use them).", ""]
    if ev.targets:
        lines += ["Targets:", ""]
        lines += [f"- {'PASS' if t.passed else 'FAIL'}: {t.name} ({t.value})" for t in ev.targets]
        lines += [""]
    lines += ["![work per policy over freetrain's best prior, mean and sd over seeds](fig3_10.png)", ""]
    return "\n".join(lines)


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
              "rows": [{k: _jsonable(v) for k, v in r.items()} for r in policy_rows(ev, c)]}
             for c in ev.cells()] if not ev.settings.tfwd_sweep else []
    payload = {
        "command": command,
        "settings": {**asdict(ev.settings), "policy_config": ev.settings.policy_config.as_dict()},
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
        fig = write_chart(ev, out / "fig3_10.png")
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
