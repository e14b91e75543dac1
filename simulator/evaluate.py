"""The evaluation: NAS and HPO workloads under freetrain, malletrain, greedy and oracle on one trace.

    from simulator.evaluate import EvalSettings, evaluate, write_evaluation
    ev = evaluate(timeline, scaling, EvalSettings(seed=0))
    write_evaluation(ev, Path("docs/evaluation"), command="malletrain evaluate ...")

Every replay uses the same trace window, seed, Pjmax and Tfwd. Samples processed
are compared with ``freetrain`` (the MILP on the default user curve: the mean of
the workload's model curves) and with ``oracle`` (true curves, free rescales).
A second table sweeps freetrain's error model ``noise:X`` on NAS. Replays run
in ``workers`` forked processes (each replay is single-threaded).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from policy import PolicyConfig
from simulator import SimConfig, simulate
from simulator.workload import ScalingSet
from traces.model import IdleTimeline

POLICIES = ("freetrain", "malletrain", "greedy", "oracle")
WORKLOADS = ("nas", "hpo")
NOISE_SWEEP = (0.0, 10.0, 20.0, 40.0)
TARGET_GAIN_PCT = 20.0  # malletrain >= freetrain + 20% on NAS
TARGET_OVERHEAD_PCT = 3.0  # profiling node-seconds <= 3% of used node-seconds


@dataclass(frozen=True)
class RunSpec:
    workload: str
    policy: str
    freetrain_model: str = "mean"

    @property
    def label(self) -> str:
        return self.policy if self.freetrain_model == "mean" or self.policy != "freetrain" else \
            f"freetrain {self.freetrain_model}"


@dataclass(frozen=True)
class EvalSettings:
    seed: int = 0
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)  # the daemon's defaults
    start: float | None = None
    end: float | None = None
    min_interval_s: float = 0.0
    workers: int = 2
    sweep: bool = True
    workloads: tuple[str, ...] = WORKLOADS

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


@dataclass
class Evaluation:
    settings: EvalSettings
    trace: str
    scaling_source: str
    summaries: dict[str, dict[str, dict]]  # workload -> label -> summary
    targets: list[Target] = field(default_factory=list)


def run_specs(settings: EvalSettings) -> list[RunSpec]:
    specs = [RunSpec(w, p) for w in settings.workloads for p in POLICIES]
    if settings.sweep and "nas" in settings.workloads:
        specs += [RunSpec("nas", "freetrain", f"noise:{x:g}") for x in NOISE_SWEEP]
    # slowest first, so two workers finish together
    return sorted(specs, key=lambda s: (s.policy not in ("malletrain", "oracle"), s.workload != "nas"))


_STATE: dict[str, object] = {}


def _init(timeline: IdleTimeline, scaling: ScalingSet, settings: EvalSettings) -> None:
    _STATE.update(timeline=timeline, scaling=scaling, settings=settings)


def _run(spec: RunSpec) -> tuple[RunSpec, dict]:
    settings: EvalSettings = _STATE["settings"]  # type: ignore[assignment]
    res = simulate(_STATE["timeline"], spec.policy, spec.workload, scaling=_STATE["scaling"],  # type: ignore[arg-type]
                   seed=settings.seed, config=settings.sim_config(), freetrain_model=spec.freetrain_model,
                   policy_config=settings.policy_config)
    return spec, res.summary


def evaluate(
    timeline: IdleTimeline,
    scaling: ScalingSet,
    settings: EvalSettings = EvalSettings(),
    on_done: Callable[[RunSpec, dict], None] | None = None,
) -> Evaluation:
    """Run every replay (in ``settings.workers`` forked processes when > 1) and check the targets."""
    specs = run_specs(settings)
    results: list[tuple[RunSpec, dict]] = []
    if settings.workers <= 1:
        _init(timeline, scaling, settings)
        for spec in specs:
            results.append(_run(spec))
            if on_done:
                on_done(*results[-1])
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(settings.workers, mp_context=ctx, initializer=_init,
                                 initargs=(timeline, scaling, settings)) as pool:
            for spec, summary in pool.map(_run, specs):
                results.append((spec, summary))
                if on_done:
                    on_done(spec, summary)
    summaries: dict[str, dict[str, dict]] = {}
    for spec, summary in results:
        summaries.setdefault(spec.workload, {})[spec.label] = summary
    ev = Evaluation(settings, timeline.source, scaling.source, summaries)
    ev.targets = check_targets(ev)
    return ev


# ---------------------------------------------------------------- figures


def _pct_over(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0) if b > 0 else float("nan")


def policy_rows(ev: Evaluation, workload: str) -> list[dict]:
    """One row per policy: samples, % over freetrain, % of oracle, profiling overhead, ..."""
    runs = ev.summaries.get(workload, {})
    free = runs.get("freetrain", {}).get("samples_processed", 0.0)
    oracle = runs.get("oracle", {}).get("samples_processed", 0.0)
    rows = []
    for label in POLICIES:
        s = runs.get(label)
        if s is None:
            continue
        used = s["used_node_seconds"]
        rows.append({
            "policy": label,
            "samples": s["samples_processed"],
            "over_freetrain_pct": _pct_over(s["samples_processed"], free),
            "of_oracle_pct": 100.0 * s["samples_processed"] / oracle if oracle > 0 else float("nan"),
            "profiling_overhead_pct": 100.0 * s["profiling_node_seconds"] / used if used > 0 else 0.0,
            "profiling_paused_pct": 100.0 * s["profiling_paused_node_seconds"] / used if used > 0 else 0.0,
            "profiled_jobs": s["profiled_jobs"],
            "scale_ups_per_profiled_job": (s["profiling_scale_ups"] / s["profiled_jobs"]) if s["profiled_jobs"] else None,
            "scalability_error_pct": s.get("scalability_error_pct"),
            "used_fraction": s["used_fraction"],
            "paused_node_seconds": s["paused_node_seconds"],
            "rescales": s["rescales"],
            "jobs_completed": s["jobs_completed"],
            "wall_seconds": s["wall_seconds"],
            "cpu_seconds": s.get("cpu_seconds", s["wall_seconds"]),
        })
    return rows


def sweep_rows(ev: Evaluation) -> list[dict]:
    runs = ev.summaries.get("nas", {})
    free = runs.get("freetrain", {}).get("samples_processed", 0.0)
    oracle = runs.get("oracle", {}).get("samples_processed", 0.0)
    mt = runs.get("malletrain", {}).get("samples_processed", 0.0)
    rows = []
    for x in NOISE_SWEEP:
        s = runs.get(f"freetrain noise:{x:g}")
        if s is None:
            continue
        rows.append({
            "noise_pct": x,
            "samples": s["samples_processed"],
            "over_freetrain_mean_pct": _pct_over(s["samples_processed"], free),
            "of_oracle_pct": 100.0 * s["samples_processed"] / oracle if oracle > 0 else float("nan"),
            "malletrain_over_it_pct": _pct_over(mt, s["samples_processed"]),
            "scalability_error_pct": s.get("scalability_error_pct"),
        })
    return rows


def check_targets(ev: Evaluation) -> list[Target]:
    out: list[Target] = []
    nas = {r["policy"]: r for r in policy_rows(ev, "nas")}
    if "malletrain" in nas and "freetrain" in nas:
        gain = nas["malletrain"]["over_freetrain_pct"]
        out.append(Target(f"NAS: malletrain >= freetrain + {TARGET_GAIN_PCT:g}%", f"{gain:+.1f}%",
                          gain >= TARGET_GAIN_PCT))
    for w in ev.summaries:
        mt = {r["policy"]: r for r in policy_rows(ev, w)}.get("malletrain")
        if mt is None:
            continue
        pct = mt["profiling_overhead_pct"]
        out.append(Target(f"{w.upper()}: profiling node-seconds <= {TARGET_OVERHEAD_PCT:g}% of used",
                          f"{pct:.2f}%", pct <= TARGET_OVERHEAD_PCT))
        s = ev.summaries[w]["malletrain"]
        ok = s["profiled_jobs"] > 0 and s["profiling_scale_ups_min_per_job"] == s["profiling_scale_ups_max_per_job"] == 1
        out.append(Target(f"{w.upper()}: one scale-up per profiled job (inverse order)",
                          f"{s['profiling_scale_ups']} scale-ups / {s['profiled_jobs']} profiled jobs "
                          f"(min {s['profiling_scale_ups_min_per_job']}, max {s['profiling_scale_ups_max_per_job']})",
                          ok))
    return out


# ---------------------------------------------------------------- outputs


def _g(v: object, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return f"{v:,}" if isinstance(v, int) else str(v)


def markdown(ev: Evaluation, command: str) -> str:
    st = ev.settings
    lines = [
        "# Evaluation: malletrain vs freetrain, greedy and oracle",
        "",
        f"Generated by `{command}`.",
        "",
        f"Trace `{ev.trace}`; scaling `{ev.scaling_source}`; seed {st.seed}; Pjmax {st.max_running}; "
        f"Tfwd {st.horizon_s:g} s; every policy is the daemon's `policy.Policy` with its defaults "
        "(`malletrain` = `profiling = \"always\"`), fed measured rates and rescale pauses. Endless job "
        "streams (1-64 nodes, 18 s up / 12 s down; job lengths and curves per workload: "
        "`python benchmarks/bench_workloads.py`). freetrain's user curve: the mean of the workload's "
        "model curves (for nas and stress: of a seeded sample of the stream). "
        "Profiling overhead: every node-second a job holds while it is profiled (it trains meanwhile), "
        "as % of all used node-seconds; the part lost to the profile's rescale pauses in brackets. "
        "Belief error: mean |believed - true| / true at the counts the allocator chose. "
        "CPU s: one replay's CPU time (the machine is shared; wall time is noisier).",
        "",
        "| workload | policy | samples | vs freetrain | % of oracle | profiling overhead | profiled jobs "
        "| scale-ups / profiled job | belief error | rescales | CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in ev.summaries:
        for r in policy_rows(ev, w):
            lines.append(
                f"| {w.upper()} | {r['policy']} | {r['samples']:.4g} | {r['over_freetrain_pct']:+.1f}% "
                f"| {r['of_oracle_pct']:.1f}% | {r['profiling_overhead_pct']:.2f}% ({r['profiling_paused_pct']:.2f}%) "
                f"| {r['profiled_jobs']:,} | {_g(r['scale_ups_per_profiled_job'], '.2f')} "
                f"| {_g(r['scalability_error_pct'])}{'%' if r['scalability_error_pct'] is not None else ''} "
                f"| {r['rescales']:,} | {r['cpu_seconds']:.1f} |"
            )
    sweep = sweep_rows(ev)
    if sweep:
        lines += [
            "",
            "freetrain with the true curve times U(1 - X%, 1 + X%) per point (`--freetrain-model noise:X`), NAS:",
            "",
            "| noise X | samples | vs freetrain (mean) | % of oracle | malletrain vs it | belief error |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sweep:
            lines.append(
                f"| {r['noise_pct']:g}% | {r['samples']:.4g} | {r['over_freetrain_mean_pct']:+.1f}% "
                f"| {r['of_oracle_pct']:.1f}% | {r['malletrain_over_it_pct']:+.1f}% "
                f"| {_g(r['scalability_error_pct'])}% |"
            )
    lines += ["", "Targets:", ""]
    lines += [f"- {'PASS' if t.passed else 'FAIL'}: {t.name} ({t.value})" for t in ev.targets]
    lines += ["", "![samples processed per policy, normalised to freetrain](fig3_10.png)", ""]
    return "\n".join(lines)


def write_evaluation(ev: Evaluation, out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "evaluation.md"
    md.write_text(markdown(ev, command))
    js = out / "evaluation.json"
    payload = {
        "command": command,
        "settings": {**asdict(ev.settings), "policy_config": ev.settings.policy_config.as_dict()},
        "trace": ev.trace,
        "scaling": ev.scaling_source,
        "policies": {w: policy_rows(ev, w) for w in ev.summaries},
        "freetrain_noise_sweep": sweep_rows(ev),
        "targets": [asdict(t) for t in ev.targets],
        "summaries": ev.summaries,
    }
    js.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    written = [md, js]
    fig = write_chart(ev, out / "fig3_10.png")
    if fig is not None:
        written.append(fig)
    return written


def write_chart(ev: Evaluation, path: Path) -> Path | None:
    """Grouped bars (MalleTrain Fig. 3.10): samples per policy, per workload, normalised to freetrain."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("malletrain evaluate: warning: matplotlib not installed; no chart", file=sys.stderr)
        return None
    workloads = list(ev.summaries)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(POLICIES)
    for k, policy in enumerate(POLICIES):
        xs, ys = [], []
        for i, w in enumerate(workloads):
            row = {r["policy"]: r for r in policy_rows(ev, w)}.get(policy)
            if row is not None:
                xs.append(i + (k - (len(POLICIES) - 1) / 2) * width)
                ys.append(1.0 + row["over_freetrain_pct"] / 100.0)
        bars = ax.bar(xs, ys, width, label=policy)
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)
    ax.set_xticks(range(len(workloads)), [w.upper() for w in workloads])
    ax.set_ylabel("samples processed / freetrain's")
    ax.axhline(1.0, color="grey", lw=0.6)
    lo = min((1.0 + r["over_freetrain_pct"] / 100.0) for w in workloads for r in policy_rows(ev, w))
    hi = max((1.0 + r["over_freetrain_pct"] / 100.0) for w in workloads for r in policy_rows(ev, w))
    ax.set_ylim(max(0.0, lo - 0.1), hi + 0.05)
    ax.set_title(f"Samples processed / freetrain's (axis from {max(0.0, lo - 0.1):.2f})", fontsize=10)
    ax.legend(loc="upper center", fontsize=8, ncols=len(POLICIES), bbox_to_anchor=(0.5, -0.08))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_report(ev: Evaluation, stream=None) -> None:  # type: ignore[no-untyped-def]
    """The tables and PASS/FAIL per target as plain text (stdout by default)."""
    stream = sys.stdout if stream is None else stream
    for w in ev.summaries:
        print(f"{w.upper()}:", file=stream)
        print(f"  {'policy':<12} {'samples':>11} {'vs freetrain':>12} {'% of oracle':>11} {'profiling':>9} {'CPU s':>7}",
              file=stream)
        for r in policy_rows(ev, w):
            print(f"  {r['policy']:<12} {r['samples']:>11.4g} {r['over_freetrain_pct']:>+11.1f}% "
                  f"{r['of_oracle_pct']:>10.1f}% {r['profiling_overhead_pct']:>8.2f}% {r['cpu_seconds']:>7.1f}",
                  file=stream)
    sweep = sweep_rows(ev)
    if sweep:
        print("NAS freetrain noise sweep:", file=stream)
        for r in sweep:
            print(f"  noise {r['noise_pct']:>4g}%  samples {r['samples']:.4g}  vs freetrain(mean) "
                  f"{r['over_freetrain_mean_pct']:+.1f}%  malletrain vs it {r['malletrain_over_it_pct']:+.1f}%",
                  file=stream)
    for t in ev.targets:
        print(f"{'PASS' if t.passed else 'FAIL'}: {t.name} ({t.value})", file=stream)

