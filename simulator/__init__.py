"""Discrete-event replay of idle-node timelines with elastic training jobs.

    from simulator import simulate
    result = simulate(timeline, policy="malletrain", workload="nas")
    result.summary["samples_processed"]

The simulator drives the daemon's own policy (:class:`policy.Policy`, never a copy) with what a
job monitor would have measured; named policies are presets of :class:`policy.PolicyConfig`
plus the ground truth only the simulator has (:mod:`simulator.policies`). Its clock is injected.
"""

from __future__ import annotations

from dataclasses import replace

from policy import PolicyConfig
from simulator.calibration import Calibration, CalibrationError
from simulator.calibration import default as default_calibration
from simulator.clock import EventQueue, Priority, SimClock
from simulator.engine import DecisionRow, PolicyError, SimConfig, SimJob, SimJobState, SimResult, Simulator
from simulator.policies import POLICIES, Overrides, PolicyContext, SimPolicy, make_policy
from simulator.jobs import StreamWindow
from simulator.workload import OFFERED_STREAMS, JobSpec, ScalingSet, Workload, WorkloadError, find_scaling, make_workload
from traces.model import IdleTimeline

__all__ = [
    "Calibration", "CalibrationError", "DecisionRow", "EventQueue", "IdleTimeline", "JobSpec", "Overrides", "POLICIES",
    "PolicyConfig", "PolicyContext", "PolicyError", "Priority", "ScalingSet", "SimClock", "SimConfig", "SimJob",
    "SimJobState", "SimPolicy", "SimResult", "Simulator", "Workload", "WorkloadError", "find_scaling", "make_policy",
    "make_workload", "simulate"
]


def simulate(
    timeline: IdleTimeline, policy: str | SimPolicy = "malletrain", workload: str = "nas", *,
    scaling: ScalingSet | None = None, seed: int = 0, n_jobs: int | None = None, config: SimConfig = SimConfig(),
    progress=None,  # type: ignore[no-untyped-def]
    freetrain_model: str = "mean", policy_config: PolicyConfig | None = None, keep_decisions: bool = False,
    overrides: Overrides | None = None, offered_load: float = 1.0, learning_prior: str = "mean",
) -> SimResult:
    """Replay ``timeline`` with a named (or given) policy and workload; returns the result. A named policy is the preset
    of that name on ``policy_config`` (default: the daemon's defaults), given a :class:`PolicyContext` with the
    workload's model curves, ``seed``, ``freetrain_model`` (``mean`` | ``linear`` | ``noise:X``) and ``learning_prior``
    (``mean`` | ``linear``); ``overrides`` win over the preset. The ``philly`` workload offers ``offered_load`` x the
    window's idle node-seconds of work. Costs: ``config.calibration``, else the shipped calibration
    (:func:`simulator.calibration.default`)."""
    if config.calibration is None:  # costs are charged unless a calibration (e.g. free()) is named
        config = replace(config, calibration=default_calibration())
    curves = scaling if scaling is not None else find_scaling()
    start = timeline.start if config.start is None else config.start
    end = timeline.end if config.end is None else config.end
    window = StreamWindow(end - start, timeline.idle_node_seconds(start, end), offered_load)
    wl = make_workload(workload, curves, seed=seed, n_jobs=n_jobs, window=window)
    if isinstance(policy, str):
        ctx = PolicyContext(wl.models, seed, freetrain_model, learning_prior)
        pol = make_policy(policy, ctx, policy_config, overrides)
    else:
        pol = policy
    result = Simulator(timeline, wl, pol, config, progress=progress, seed=seed, keep_decisions=keep_decisions).run()
    result.summary["seed"] = seed
    result.summary["offered_load"] = offered_load if workload in OFFERED_STREAMS else None
    if pol.name == "freetrain":
        result.summary["freetrain_model"] = pol.label
    return result
