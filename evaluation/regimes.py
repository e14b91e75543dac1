"""The real streams' targets, by regime: **scarce** (fewer jobs than nodes: learning, in work against
``milp-true``), **unsaturated** (every policy finishes every job on every seed: completion time) and
**saturated** (jobs remain: work), each against the baselines a user could have configured before the
run (:func:`evaluation.results.best_baseline`), over >= MIN_SEEDS seeds; and the bound that holds
(no policy above min(offered, idle x best efficiency) on any seed). :mod:`evaluation.results` holds
the rows; :mod:`evaluation.evaluate` runs the replays.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from evaluation.results import (
    DEFAULT, FIXED_PJMAX_PREFIX, knows_the_curve, TARGET_ABOVE_SHARE_PCT, TARGET_GAIN_PCT, TARGET_REGRET_PCT,
    headline_cells, policy_rows, HEADLINE_LOADS, MIN_SEEDS, SATURATION_LOAD, TARGET_BOUND_GAP_PCT,
    TARGET_REAL_GAIN_PCT, TARGET_SATURATED_RATIO, TARGET_SCARCE_OF_CEILING, Cell, Evaluation, Target,
    is_fixed_prior_baseline, is_real, is_scarce, real_rows, work,
)
from evaluation.sweep import split_workload

TARGET_JCT_RATIO = 0.85  # unsaturated: the default's mean JCT over the best fixed-prior baseline's
SCARCE, UNSATURATED, SATURATED = "scarce", "unsaturated", "saturated"


def regime(ev: Evaluation, cell: Cell) -> str:
    """``scarce`` (the scarce mix), ``unsaturated`` (the default finished every job on every seed) or
    ``saturated``."""
    if is_scarce(cell[0]):
        return SCARCE
    mine = ev.by_label(cell).get(DEFAULT, {})
    return UNSATURATED if mine and all(_finished_all(s) for s in mine.values()) else SATURATED


def _finished_all(summary: dict) -> bool:
    done = summary.get("jobs_completed")
    return done is not None and done == summary.get("jobs_submitted") and bool(summary.get("jct_mean_seconds"))


def best_jct_baseline(runs: dict[str, dict[int, dict]]) -> str | None:
    """The fixed-prior equal-admission baseline with the lowest mean JCT over the seeds, among those that
    finished every job on every seed (a JCT over the jobs that finished compares nothing else)."""
    base = [(statistics.fmean(s["jct_mean_seconds"] for s in seeds.values()), label)
            for label, seeds in runs.items() if is_fixed_prior_baseline(label)
            and all(_finished_all(s) for s in seeds.values())]
    return min(base)[1] if base else None


def jct_ratios(runs: dict[str, dict[int, dict]], mine: str, base: str) -> tuple[float, float, int] | None:
    """``mine``'s mean and p95 JCT over ``base``'s, means of the per-seed ratios over the seeds on which both
    finished every job (a JCT over the jobs that finished compares nothing else), and how many seeds
    that is; None when there is no such seed."""
    a, b = runs.get(mine, {}), runs.get(base, {})
    ks = [k for k in sorted(a) if k in b and _finished_all(a[k]) and _finished_all(b[k])]
    if not ks:
        return None
    mean = statistics.fmean(a[k]["jct_mean_seconds"] / b[k]["jct_mean_seconds"] for k in ks)
    p95 = statistics.fmean(a[k]["jct_p95_seconds"] / b[k]["jct_p95_seconds"] for k in ks)
    return mean, p95, len(ks)


def jct_line(ev: Evaluation, cell: Cell, base: str) -> str | None:
    """The default's and ``milp-true``'s completion time against ``base`` (a fixed-prior baseline), on the
    seeds each finished every job with it: reported in every real cell, the unsaturated target's figure
    where the cell is unsaturated."""
    runs = ev.by_label(cell)
    parts = []
    for label in (DEFAULT, "milp-true"):
        got = jct_ratios(runs, label, base) if label in runs else None
        if got is not None:
            parts.append(f"{label} {got[0]:.3f}x, p95 {got[1]:.3f}x ({got[2]} seeds)")
    return f"mean JCT vs {base}, seeds on which both finished every job: " + "; ".join(parts) if parts else None


WAIT_DOMINATED = 0.95
"""A cell where ``milp-true``'s mean JCT is above this share of the best baseline's is wait-dominated:
jobs wait for the main queue's nodes whatever a policy believes, so the cell says nothing about learning
and its gap share is not scored."""


def _user_configured(label: str) -> bool:
    """A baseline a user could configure before the run: freetrain with a fixed prior (at the default's
    admission or at a fixed Pjmax), greedy, equal, rigid-preemptible; never one handed each job's curve."""
    return is_fixed_prior_baseline(label) or label.startswith(FIXED_PJMAX_PREFIX)


@dataclass(frozen=True)
class GapShare:
    """A cell's completion time as the share of the gap closed (:func:`gap_share`); JCTs in seconds, each
    the mean over ``seeds``."""

    baseline: str
    seeds: tuple[int, ...]
    baseline_jct_s: float
    default_jct_s: float
    milp_true_jct_s: float
    baseline_p95_s: float
    default_p95_s: float
    milp_true_p95_s: float
    reference: str | None = None
    reference_jct_s: float | None = None

    @property
    def wait_dominated(self) -> bool:
        """``milp-true`` within WAIT_DOMINATED of the baseline: the cell measures waiting, not learning."""
        return self.milp_true_jct_s > WAIT_DOMINATED * self.baseline_jct_s

    @property
    def share(self) -> float | None:
        """``(B - D) / (B - M)`` (None when ``M`` is not below ``B``)."""
        gap = self.baseline_jct_s - self.milp_true_jct_s
        return (self.baseline_jct_s - self.default_jct_s) / gap if gap > 0 else None

    @property
    def tail(self) -> float:
        """The default's p95 JCT over ``milp-true``'s."""
        return self.default_p95_s / self.milp_true_p95_s if self.milp_true_p95_s > 0 else math.inf

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "wait_dominated": self.wait_dominated, "share": self.share,
                "p95_vs_milp_true": self.tail}


def gap_share(runs: dict[str, dict[int, dict]]) -> GapShare | None:
    """Completion time as the share of the gap closed: ``(B - D) / (B - M)`` with ``B`` the mean JCT of the
    best baseline a user could configure before the run, ``D`` the default's and ``M`` ``milp-true``'s, each
    the mean over the seeds on which the default and ``milp-true`` finished every job (``B``: the lowest
    mean JCT there among the baselines that finished every job on those seeds too); the p95 JCTs beside
    them. The reference handed each job's curve (``freetrain:noise:*``) is reported beside ``B``, never as
    ``B``. None when a policy is missing or no seed is common."""
    if DEFAULT not in runs or "milp-true" not in runs:
        return None
    d, m = runs[DEFAULT], runs["milp-true"]
    ks = tuple(k for k in sorted(d) if k in m and _finished_all(d[k]) and _finished_all(m[k]))
    if not ks:
        return None

    def finished_on_all(x: dict[int, dict]) -> bool:
        return all(k in x and _finished_all(x[k]) for k in ks)

    cands = [(statistics.fmean(seeds[k]["jct_mean_seconds"] for k in ks), label)
             for label, seeds in runs.items() if _user_configured(label) and finished_on_all(seeds)]
    if not cands:
        return None
    base = min(cands)[1]
    b = runs[base]

    def mean_of(x: dict[int, dict], key: str) -> float:
        return statistics.fmean(x[k][key] for k in ks)

    ref = next((label for label in sorted(runs) if knows_the_curve(label) and finished_on_all(runs[label])), None)
    return GapShare(base, ks, *(mean_of(x, "jct_mean_seconds") for x in (b, d, m)),
                    *(mean_of(x, "jct_p95_seconds") for x in (b, d, m)),
                    ref, mean_of(runs[ref], "jct_mean_seconds") if ref is not None else None)


def gap_line(ev: Evaluation, cell: Cell) -> str | None:
    """:func:`gap_share` of a cell in one line (None where it cannot be worked out)."""
    g = gap_share(ev.by_label(cell))
    if g is None:
        return None
    h = 3600.0
    head = (f"completion time, share of the gap closed (B = {g.baseline}, the best baseline a user could "
            f"configure; M = milp-true; {len(g.seeds)} seeds on which all finished every job): ")
    figs = (f"mean JCT B {g.baseline_jct_s / h:.3f} h, default {g.default_jct_s / h:.3f} h, "
            f"M {g.milp_true_jct_s / h:.3f} h; p95 B {g.baseline_p95_s / h:.3f} h, "
            f"default {g.default_p95_s / h:.3f} h, M {g.milp_true_p95_s / h:.3f} h "
            f"(default's p95 {g.tail:.3f}x M's)")
    if g.reference is not None and g.reference_jct_s is not None:
        figs += f"; reference {g.reference} {g.reference_jct_s / h:.3f} h"
    if g.wait_dominated:
        verdict = (f"**wait-dominated, not scored** (M is {g.milp_true_jct_s / g.baseline_jct_s:.3f}x B, "
                   f"> {WAIT_DOMINATED:g}: jobs wait whatever a policy believes)")
    else:
        verdict = f"**{100 * (g.share or 0.0):.0f}% of the gap**"
    return head + verdict + "; " + figs


def jct_target(ev: Evaluation, cell: Cell) -> Target:
    """Unsaturated: the default's mean JCT <= TARGET_JCT_RATIO x the best fixed-prior baseline's (lowest mean
    JCT), its p95 no worse, as means over >= MIN_SEEDS seeds of per-seed ratios."""
    runs = ev.by_label(cell)
    best = best_jct_baseline(runs)
    mine = runs.get(DEFAULT, {})
    name = (f"{cell[0]} (unsaturated): {DEFAULT}'s mean JCT <= {TARGET_JCT_RATIO:g}x the best equal-admission "
            f"baseline with a fixed prior ({best}), p95 no worse, mean over >= {MIN_SEEDS} seeds")
    if best is None or not mine:
        return Target(name, "not replayed", False)
    ref = runs[best]
    ks = [k for k in sorted(mine) if k in ref]
    mean = statistics.fmean(mine[k]["jct_mean_seconds"] / ref[k]["jct_mean_seconds"] for k in ks)
    p95 = statistics.fmean(mine[k]["jct_p95_seconds"] / ref[k]["jct_p95_seconds"] for k in ks)
    value = f"mean JCT {mean:.3f}x, p95 {p95:.3f}x ({len(ks)} seeds)"
    return Target(name, value, mean <= TARGET_JCT_RATIO and p95 <= 1.0 and len(ks) >= MIN_SEEDS)


def real_targets(ev: Evaluation) -> list[Target]:
    """The targets on the real streams, by :func:`regime`: scarce, learning against milp-true; unsaturated,
    completion time; saturated, work against the best equal-admission baseline with a prior fixed before
    the run (>= TARGET_SATURATED_RATIO; + TARGET_REAL_GAIN_PCT at the headline loads) and, at the
    saturation load, the gap to the bound; the bound holds (no policy above min(offered, idle x
    best efficiency) on any seed). What the default does against freetrain with each fixed prior, the best
    fixed-Pjmax freetrain (its own admission) and the reference handed each job's curve within 20% is
    reported beside them, not as a target."""
    out: list[Target] = []
    held: list[str] = []
    for cell in ev.cells():
        if not is_real(cell[0]):
            continue
        kind = regime(ev, cell)
        if kind != SATURATED:
            out.append(scarce_target(ev, cell) if kind == SCARCE else jct_target(ev, cell))
            held += [f"{cell[0]} {r['policy']} above min(offered, idle x eff) on seed(s) {r['above_bound']}"
                     for r in real_rows(ev, cell) if r["above_bound"]]
            continue
        load = split_workload(cell[0])[1]
        rows = {r["policy"]: r for r in real_rows(ev, cell)}
        mt = rows.get(DEFAULT)
        best = next((r for r in rows.values() if r["best_baseline"]), None)
        n = len(ev.settings.seeds)
        if mt is not None and best is not None and load in HEADLINE_LOADS:
            gain = mt["vs_best_baseline_pct"][0]
            out.append(Target(
                f"{cell[0]}: {DEFAULT} >= the best equal-admission baseline with a fixed prior ({best['policy']}) + "
                f"{TARGET_REAL_GAIN_PCT:g}% in work, mean over >= {MIN_SEEDS} seeds, costs charged",
                f"{gain:+.1f}% (worst seed {mt['vs_best_baseline_min_pct']:+.1f}%; {n} seeds; "
                f"{_beside(mt)})",
                gain >= TARGET_REAL_GAIN_PCT and n >= MIN_SEEDS))
        if mt is not None and best is not None:
            ratio = 1.0 + mt["vs_best_baseline_pct"][0] / 100.0
            out.append(Target(
                f"{cell[0]} (saturated): {DEFAULT}'s work >= {TARGET_SATURATED_RATIO:g}x the best equal-admission "
                f"baseline with a fixed prior ({best['policy']}), mean over >= {MIN_SEEDS} seeds",
                f"{ratio:.3f}x ({n} seeds; {_beside(mt)})", ratio >= TARGET_SATURATED_RATIO and n >= MIN_SEEDS))
        if mt is not None and load == SATURATION_LOAD:
            gap = mt["gap_to_bound_pct"][0]
            out.append(Target(f"{cell[0]}: {DEFAULT}'s gap to the bound min(offered work, idle node-s x best "
                              f"per-node efficiency) <= {TARGET_BOUND_GAP_PCT:g}%",
                              f"{gap:.1f}% (vs the oracle reference {mt['vs_oracle_bound_pct'][0]:+.1f}%)",
                              gap <= TARGET_BOUND_GAP_PCT))
        for r in rows.values():
            if r["above_bound"]:
                held.append(f"{cell[0]} {r['policy']} above min(offered, idle x eff) on seed(s) {r['above_bound']}")
    if any(is_real(c[0]) for c in ev.cells()):
        out.append(Target("bounds hold: no policy above min(offered, idle x best efficiency) on any seed",
                          "; ".join(held) if held else "held everywhere", not held))
    return out


def learning_ratios(ev: Evaluation, cell: Cell) -> dict[str, list[float]]:
    """Per learning prior, the default's work over milp-true's, per seed (the seeds both ran)."""
    from simulator.policies import LEARNING_PRIORS

    runs = ev.by_label(cell)
    ceiling = runs.get("milp-true", {})
    out: dict[str, list[float]] = {}
    for prior in LEARNING_PRIORS:
        mine = runs.get(DEFAULT if prior == "mean" else f"{DEFAULT}:{prior}", {})
        out[prior] = [work(mine[k]) / work(ceiling[k]) for k in sorted(mine) if k in ceiling and work(ceiling[k]) > 0]
    return out


def scarce_target(ev: Evaluation, cell: Cell) -> Target:
    """Scarce mix: from every learning prior, the default reaches TARGET_SCARCE_OF_CEILING of milp-true's
    work, mean over >= MIN_SEEDS seeds (a prior not replayed fails it)."""
    ratios = learning_ratios(ev, cell)
    means = {p: statistics.fmean(r) if r else math.nan for p, r in ratios.items()}
    value = "; ".join(f"from {p}: {m:.3f}x (worst seed {min(ratios[p]):.3f}x, {len(ratios[p])} seeds)"
                      if ratios[p] else f"from {p}: not replayed" for p, m in means.items())
    passed = all(len(r) >= MIN_SEEDS and means[p] >= TARGET_SCARCE_OF_CEILING for p, r in ratios.items())
    return Target(f"{cell[0]}: {DEFAULT} reaches >= {TARGET_SCARCE_OF_CEILING:g}x milp-true's work from the mean "
                  f"and from a linear belief, mean over >= {MIN_SEEDS} seeds", value, passed)


def _beside(row: dict) -> str:
    """The default against the other comparisons, for a target's value: vs each fixed prior, the best
    fixed-Pjmax freetrain and the reference given each job's curve within 20%."""
    parts = []
    for name, label in row["compared_with"].items():
        if label is None or name == "best fixed-prior":
            continue
        what = {"best fixed-Pjmax": f"{label} (own admission)",
                "reference": f"{label} (given each job's curve within 20%)"}.get(name, label)
        parts.append(f"vs {what} {row['vs_pct'][name][0]:+.1f}%")
    return ", ".join(parts) if parts else "no other comparison replayed"


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
