"""An evaluation written out: its Markdown tables, the JSON of every run, the charts and the printed
report (:mod:`evaluation.results` holds the rows and targets they show).
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

from evaluation.results import (
    DEFAULT, FIXED_PJMAX_PREFIX, NO_SHARE, PARTS, REFERENCE, Cell, EvalSettings, Evaluation, best_baseline,
    fair_share_costs, headline_cells, is_real, policy_rows, real_rows, tfwd_choice, tfwd_rows, work,
)
from evaluation.regimes import gap_line, gap_share, jct_line, regime
from evaluation.sweep import split_workload
from traces.data import without_data_dir
from traces.plots import pyplot_or_none


def real_table(ev: Evaluation, cell: Cell) -> list[str]:
    lines = [
        "| policy | admission | work (node-s) | share of offered | vs best fixed-prior baseline | vs freetrain:mean "
        "| vs freetrain:linear | gap to bound | vs oracle reference | lost to rollbacks | restarts | JCT mean h "
        "| JCT p95 h | slowdown mean | slowdown p95 | fairness (Jain, per model) | wait mean h | longest wait |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in real_rows(ev, cell):
        lines.append(
            f"| {r['policy']}{_tag(r)} | {r['admission']} | {ms(r['work'])} | {ms(r['share_of_offered_pct'], '.1f', '%')} "
            f"| {ms(r['vs_best_baseline_pct'], '+.1f', '%')} | {ms(r['vs_pct']['freetrain:mean'], '+.1f', '%')} "
            f"| {ms(r['vs_pct']['freetrain:linear'], '+.1f', '%')} | {ms(r['gap_to_bound_pct'], '.1f', '%')} "
            f"| {ms(r['vs_oracle_bound_pct'], '+.1f', '%')} | {ms(r['lost_work_pct'], '.1f', '%')} "
            f"| {ms(r['restarts'], '.0f')} | {_hours(r['jct_mean_seconds'])} | {_hours(r['jct_p95_seconds'])} "
            f"| {ms(r['slowdown_mean'], '.2f')} | {ms(r['slowdown_p95'], '.2f')} "
            f"| {ms(r['slowdown_fairness_jain'], '.2f')} "
            f"| {_hours(r['wait_mean_seconds'])} | {r['longest_waiting_model'] or '-'} |")
    return lines


def _tag(row: dict) -> str:
    """What a row is: the best fixed-prior baseline, the reference given each job's curve within 20%, a
    baseline at its own admission."""
    if row["best_baseline"]:
        return " (best fixed-prior baseline)"
    if row["policy"] == row["compared_with"].get("reference"):
        return " (reference: given each job's curve within 20%)"
    if row["policy"].startswith(FIXED_PJMAX_PREFIX):
        return " (own admission)"
    return ""


def headline_lines(ev: Evaluation, cell: Cell) -> list[str]:
    """The default against each comparison, per seed, in one line each (mean ± sd, worst seed)."""
    rows = {r["policy"]: r for r in real_rows(ev, cell)}
    mt = rows.get(DEFAULT)
    if mt is None:
        return []
    out = []
    for name, label in mt["compared_with"].items():
        if label is None:
            continue
        what = {"best fixed-prior": f"the best equal-admission baseline with a fixed prior ({label})",
                "best fixed-Pjmax": f"the best fixed-Pjmax freetrain ({label}, its own admission)",
                "reference": f"reference only: {label}, given each job's curve within 20%"}.get(name, label)
        out.append(f"{DEFAULT} vs {what}: {ms(mt['vs_pct'][name], '+.1f', '%')}")
    best = mt["compared_with"].get("best fixed-prior")
    jct = jct_line(ev, cell, best) if best is not None else None
    gap = gap_line(ev, cell)
    return out + [line for line in (jct, gap) if line is not None] + fair_share_lines(ev, cell)


def fair_share_lines(ev: Evaluation, cell: Cell) -> list[str]:
    """Fair share's cost in work, one line per starting belief (where ``malletrain-no-share`` ran beside)."""
    return [f"fair share's cost in work ({label} over {NO_SHARE}{label[len(DEFAULT):]}, per seed, "
            f"{len(ev.by_label(cell)[label])} seed(s)): {ms(cost, '+.2f', '%')}"
            for label, cost in fair_share_costs(ev, cell).items()]


def waits_table(ev: Evaluation, cell: Cell) -> list[str]:
    """Mean wait (submission to first nodes; never started: to the end) per model, hours: who starves."""
    rows = real_rows(ev, cell)
    models = sorted({m for r in rows for m in r["wait_by_model_seconds"]})
    lines = ["| policy | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
    for r in rows:
        w = r["wait_by_model_seconds"]
        lines.append(f"| {r['policy']} | " + " | ".join(f"{w[m] / 3600:.2f}" if m in w else "-" for m in models) + " |")
    return lines


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
            lines += [f"## {cell_title(cell, st)}: real stream, offered load {split_workload(cell[0])[1]:g}, "
                      f"{regime(ev, cell)}", ""]
            lines += [f"- {h}" for h in headline_lines(ev, cell)] + [""]
            lines += real_table(ev, cell) + ["", "Mean wait per model, hours (who starves):", ""]
            lines += waits_table(ev, cell) + [""]
            continue
        lines += [f"## {cell_title(cell, st)}" + ("" if st.n_jobs else ": endless stream (a saturation case)"), ""]
        shares = fair_share_lines(ev, cell)
        lines += ([f"- {h}" for h in shares] + [""] if shares else []) + cell_table(ev, cell) + [""]
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
    # The charts are named, not embedded: the command above writes them beside this page, and the
    # repository keeps the page without them (.gitignore), so the page must not link to a missing file.
    if real:
        lines += [f"Chart: `fig_real.png` beside this page, {CHART_REAL} (written by the command above).", ""]
    if len(real) < len(ev.cells()):
        lines += [f"Chart: `fig3_10.png` beside this page, {CHART_NAS} (written by the command above).", ""]
    return "\n".join(lines)


CHART_REAL = "work per policy over the best fixed-prior equal-admission baseline, per offered load"
CHART_NAS = "work per policy over freetrain's best prior, mean and sd over seeds"


REAL_METHOD = (
    "**Real streams** (`philly@X`: Philly arrivals and sizes on the Pollux curves, offered load X = the stream's "
    "work over the window's idle node-seconds). Costs charged from `{cal}` (pilot start, cold start, restart "
    "with rollback to the last checkpoint commit, rescale pauses). Every baseline runs at the default's "
    "admission (adaptive, same Pjmax floor and cap) and every policy optimises work, but `jpa` (the paper's "
    "policy, its own fixed admission unless `--admission` names one) and `freetrain-fixed:N` (freetrain at a "
    "fixed Pjmax N, N in {fixed}: a baseline at its own admission, compared on its own). **vs best fixed-prior "
    "baseline**: per seed, against the equal-admission baseline with the highest mean work among those a user "
    "could configure before the run (freetrain with the `mean`, `linear` or `other` prior, greedy, equal, "
    "rigid-preemptible); freetrain given each job's curve within 20% (`noise:20`) is a labelled reference, "
    "never the baseline. **gap to bound**: 1 − work / min(offered work, idle node-s × the best work per "
    "node-second any job's curve reaches), a bound no policy can beat. **oracle-reference**: the true curves, "
    "free rescales and starts, no admission cap: a reference, not a bound (its allocator decides over a "
    "horizon, so a policy may beat it). `milp-true` is the default with the true curves (what learning "
    "costs), not a ceiling. **lost to rollbacks**: work rolled back at stops, % of the work kept.")


def _jsonable(v: object) -> object:
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def write_evaluation(ev: Evaluation, out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "evaluation.md"
    md.write_text(without_data_dir(markdown(ev, command)))
    js = out / "evaluation.json"
    cells = [{"workload": c[0], "max_running": c[1], "max_nodes": c[2], "tfwd_s": c[3],
              "rows": [{k: _jsonable(v) for k, v in r.items()}
                       for r in (real_rows(ev, c) if is_real(c[0]) else policy_rows(ev, c))],
              "completion_gap": _gap_dict(ev, c),
              "fair_share_cost_pct": {k: _jsonable(v) for k, v in fair_share_costs(ev, c).items()}}
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
    js.write_text(without_data_dir(json.dumps(payload, indent=2, default=str)) + "\n")
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


def _gap_dict(ev: Evaluation, cell: Cell) -> dict[str, object] | None:
    """A real cell's completion time as the share of the gap closed (:func:`evaluation.regimes.gap_share`)."""
    g = gap_share(ev.by_label(cell)) if is_real(cell[0]) else None
    return {k: _jsonable(v) for k, v in g.as_dict().items()} if g is not None else None


def write_chart(ev: Evaluation, path: Path) -> Path | None:
    """MalleTrain Fig. 3.10 in work: per workload (headline cells) and part of the week, each policy's
    work over freetrain's best prior (mean, with the seeds' sd as error bars and every seed as a dot)."""
    plt = pyplot_or_none("malletrain evaluate: warning: matplotlib not installed; no chart")
    if plt is None:
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
    plt = pyplot_or_none("malletrain evaluate: warning: matplotlib not installed; no chart")
    if plt is None:
        return None
    cells = [c for c in ev.cells() if is_real(c[0])]
    width_in = 5.2 * len(cells)
    fig, axes = plt.subplots(1, len(cells), figsize=(width_in, 4.8), squeeze=False, sharey=True)
    tops = [1.0]  # the highest bar, error bar or dot of every panel: the axes are shared
    for ax, cell in zip(axes[0], cells):
        rows = real_rows(ev, cell)
        runs = ev.by_label(cell)
        best = best_baseline(runs)
        ref = runs.get(best, {}) if best else {}
        for i, r in enumerate(rows):
            m, sd = r["vs_best_baseline_pct"]
            colour = "#1b9e77" if r["policy"] == DEFAULT else "#d95f02" if r["best_baseline"] else \
                "#999999" if r["policy"] == REFERENCE else "#7570b3"
            ax.bar(i, 1.0 + m / 100.0, 0.7, yerr=sd / 100.0, capsize=2, color=colour, alpha=0.85, zorder=2)
            dots = [work(runs[r["policy"]][k]) / work(ref[k]) for k in r["seeds"] if k in ref and work(ref[k]) > 0]
            tops += dots + ([1.0 + (m + sd) / 100.0] if not math.isnan(m) else [])
            ax.plot([i] * len(dots), dots, "k.", ms=3, zorder=3)
        ax.axhline(1.0, color="grey", lw=0.8, zorder=1)
        ax.set_xticks(range(len(rows)), [r["policy"] for r in rows], rotation=55, ha="right", fontsize=7)
        ax.set_title(f"{cell[0]} (best fixed-prior baseline: {best})", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3, zorder=0)
    axes[0][0].set_ylim(0.0, max(tops) * 1.08)  # every bar, error bar and dot of every panel inside the axes
    axes[0][0].set_ylabel("work / best fixed-prior baseline's work")
    n = len(ev.settings.seeds)
    title = (f"Philly stream on {Path(ev.trace).name}: work relative to the best fixed-prior baseline, costs charged "
             f"(mean ± sd over {n} seed{'s' if n != 1 else ''}; dots: seeds)")
    if "SYNTHETIC" in ev.trace or "synthetic" in ev.trace.lower():
        title = "SYNTHETIC trace. " + title
    # a 9-point character is about 1/13 inch wide: a line holds what the figure's width does
    lines = textwrap.wrap(title, width=int(13 * width_in))
    fig.suptitle("\n".join(lines), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1.0 - (0.2 + 0.16 * len(lines)) / 4.8))  # the panels start below the title
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
            print(f"{cell_title(cell, ev.settings)} (real stream, {regime(ev, cell)}):", file=stream)
            for h in headline_lines(ev, cell):
                print(f"  {h}", file=stream)
            print(f"  {'policy':<28} {'work node-s':>20} {'of offered':>14} {'vs best fixed-prior':>20} "
                  f"{'gap to bound':>14} {'vs oracle ref.':>16} {'JCT mean h':>12} {'JCT p95 h':>12} "
                  f"{'slowdown':>12} {'fairness':>12}", file=stream)
            for r in real_rows(ev, cell):
                print(f"  {r['policy']:<28} {ms(r['work']):>20} {ms(r['share_of_offered_pct'], '.1f', '%'):>14} "
                      f"{ms(r['vs_best_baseline_pct'], '+.1f', '%'):>20} {ms(r['gap_to_bound_pct'], '.1f', '%'):>14} "
                      f"{ms(r['vs_oracle_bound_pct'], '+.1f', '%'):>16} {_hours(r['jct_mean_seconds']):>12} "
                      f"{_hours(r['jct_p95_seconds']):>12} {ms(r['slowdown_mean'], '.2f'):>12} "
                      f"{ms(r['slowdown_fairness_jain'], '.2f'):>12}", file=stream)
            continue
        print(f"{cell_title(cell, ev.settings)}:", file=stream)
        for h in fair_share_lines(ev, cell):
            print(f"  {h}", file=stream)
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
