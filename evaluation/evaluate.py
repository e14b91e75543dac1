"""The evaluation: policies x workloads x seeds on one trace, in model-neutral work.

    from evaluation.evaluate import evaluate
    from evaluation.report import write_evaluation
    from evaluation.results import EvalSettings
    ev = evaluate(timeline, scaling, EvalSettings(seeds=(0, 1, 2, 3, 4)))
    write_evaluation(ev, Path("docs/evaluation"), command="malletrain evaluate ...")

The headline metric is ``work_node_seconds`` (each job's samples over its own 1-node rate, so an
hour of any model at one node counts the same), a mean and sample sd over the seeds. ``freetrain``
runs with a panel of user priors (:data:`evaluation.results.PRIORS`). Regret is ``(milp-true -
policy) / milp-true`` in work, per seed. Constrained periods (the idle pool at most what the
admitted jobs can absorb) and unconstrained ones are reported apart, and the whole.
"""

from __future__ import annotations

from itertools import product
from typing import Callable

from evaluation.regimes import check_targets
from evaluation.results import (
    CEILING_PRIOR, FIXED_PRIOR, POLICIES, REAL_POLICIES, SWEEP_MAX_NODES, SWEEP_MAX_RUNNING, TFWD_CANDIDATES,
    TFWD_POLICIES, EvalSettings, Evaluation, is_real, is_scarce, trace_claims,
)
from evaluation.sweep import Replays, RunSpec, run_replays
from simulator.workload import ScalingSet
from traces.model import IdleTimeline


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


def real_specs(settings: EvalSettings, w: str, seed: int, pj: int | None, mn: int | None) -> list[RunSpec]:
    """The comparison on a real stream: every baseline at the default's admission, freetrain's
    prior panel, freetrain at fixed Pjmax (each of ``fixed_pjmax``), and the oracle reference."""
    from simulator.policies import BASELINES, LEARNING_PRIORS

    out: list[RunSpec] = []
    policies = [p for p in settings.policies if p != "oracle"] if settings.policies != POLICIES else list(REAL_POLICIES)
    scarce = is_scarce(w)
    for p in policies:
        priors = settings.priors if p == "freetrain" else \
            LEARNING_PRIORS if scarce and p not in BASELINES else ("mean",)
        out += [RunSpec(w, p, seed, prior=pr, max_running=pj, max_nodes=mn) for pr in priors]
    if not scarce:  # the scarce mix compares learning with milp-true; no fixed-Pjmax rows
        out += [RunSpec(w, "freetrain", seed, prior=FIXED_PRIOR, max_nodes=mn, fixed_pjmax=n)
                for n in settings.fixed_pjmax]
    out.append(RunSpec(w, "oracle", seed, max_running=pj, max_nodes=mn, bound=True))
    return out


def refuse_impossible(replays: Replays, specs: list[RunSpec]) -> None:
    """Resolve every replay's policy before any runs: a flag a preset cannot honour (e.g. ``--admission-cap``
    for a policy at fixed admission) is a ValueError naming both, raised before the first replay."""
    from simulator.policies import resolve_config

    for spec in specs:
        pcfg, _ = replays.config_for(spec)
        try:
            resolve_config(spec.policy, pcfg, replays.overrides_for(spec))
        except ValueError as exc:
            raise ValueError(f"{spec.label}: {exc}") from None


def evaluate(timeline: IdleTimeline, scaling: ScalingSet, settings: EvalSettings = EvalSettings(),
             on_done: Callable[[RunSpec, dict], None] | None = None) -> Evaluation:
    """Run every replay (Dask tasks; see :func:`evaluation.sweep.run_replays`) and check the targets."""
    replays = Replays(timeline, scaling, settings.policy_config, settings.sim_config(), settings.n_jobs,
                      settings.overrides, settings.flags)
    specs = run_specs(settings)
    refuse_impossible(replays, specs)
    runs = run_replays(replays, specs, workers=settings.workers, scheduler=settings.scheduler,
                       on_done=on_done)
    ev = Evaluation(settings, timeline.source, scaling.source, runs)
    ev.trace_claims = trace_claims(timeline, settings)
    ev.targets = check_targets(ev)
    return ev

