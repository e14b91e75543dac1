"""Discrete-event replay of idle-node timelines with elastic training jobs.

    from simulator import simulate
    result = simulate(timeline, policy="malletrain", workload="nas")
    result.summary["samples_processed"]

The simulator drives the real allocator (``allocator.solve``) through small
policy objects (see :mod:`simulator.policies`); its clock is injected.
"""

from __future__ import annotations

from simulator.clock import EventQueue, Priority, SimClock
from simulator.engine import DecisionRow, JobState, PolicyError, SimConfig, SimJob, SimResult, Simulator
from simulator.policies import POLICIES, JobView, Policy, PolicyContext, SimView, make_policy
from simulator.workload import JobSpec, ScalingSet, Workload, WorkloadError, find_scaling, make_workload
from traces.model import IdleTimeline

__all__ = [
    "DecisionRow", "EventQueue", "IdleTimeline", "JobSpec", "JobState", "JobView", "POLICIES", "Policy",
    "PolicyContext", "PolicyError", "Priority", "ScalingSet", "SimClock", "SimConfig", "SimJob", "SimResult", "SimView",
    "Simulator", "Workload", "WorkloadError", "find_scaling", "make_policy", "make_workload", "simulate",
]


def simulate(
    timeline: IdleTimeline,
    policy: str | Policy = "malletrain",
    workload: str = "nas",
    *,
    scaling: ScalingSet | None = None,
    seed: int = 0,
    n_jobs: int | None = None,
    config: SimConfig = SimConfig(),
    progress=None,  # type: ignore[no-untyped-def]
    freetrain_model: str = "mean",
) -> SimResult:
    """Replay ``timeline`` with a named (or given) policy and workload; returns the result.

    A named policy gets a :class:`PolicyContext` with the workload's model curves, ``seed``
    and ``freetrain_model`` (``mean`` | ``linear`` | ``noise:X``).
    """
    curves = scaling if scaling is not None else find_scaling()
    wl = make_workload(workload, curves, seed=seed, n_jobs=n_jobs)
    if isinstance(policy, str):
        pol = make_policy(policy, PolicyContext(wl.models, seed, freetrain_model))
    else:
        pol = policy
    result = Simulator(timeline, wl, pol, config, progress=progress).run()
    result.summary["seed"] = seed
    if getattr(pol, "name", "") == "freetrain":
        result.summary["freetrain_model"] = pol.model.label  # type: ignore[attr-defined]
    return result
