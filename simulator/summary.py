"""A replay's numbers: the counters and node-second integrals the engine keeps (:class:`Tally`), what
the policy's decisions did (:class:`DecisionStats`), and the summary made of them at the end
(:func:`replay_summary`; its fields are the columns of ``summary.json``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from curves import throughput_at
from policy import Decision, EventKind, JobView, Policy, PolicyConfig, StopReason, View
from simulator.calibration import Calibration
from simulator.records import SimJob, SimJobState
from simulator.workload import Workload
from traces.model import IdleTimeline


@dataclass
class Tally:
    """What the engine counts and integrates over a replay."""

    idle_node_seconds: float = 0.0
    used_node_seconds: float = 0.0
    held_node_seconds: float = 0.0  # idle nodes a running pilot holds (used or free)
    start_paused_node_seconds: float = 0.0  # node-seconds held while (re)starting
    # per-interval split: [constrained, unconstrained] (unconstrained = the idle pool exceeds the
    # admitted jobs' summed max nodes, so no allocation could use every idle node)
    split_seconds: list[float] = field(default_factory=lambda: [0.0, 0.0])
    split_idle: list[float] = field(default_factory=lambda: [0.0, 0.0])
    split_used: list[float] = field(default_factory=lambda: [0.0, 0.0])
    split_work: list[float] = field(default_factory=lambda: [0.0, 0.0])
    excess_node_seconds: float = 0.0  # idle node-seconds above what the admitted jobs could absorb
    cold_starts: int = 0
    restarts: int = 0
    rescales: int = 0
    starts: int = 0
    stops: int = 0  # jobs a recall took below their min (stopped, re-queued)
    policy_stops: dict[StopReason, int] = field(default_factory=dict)  # jobs the policy ended, by reason
    preemptions: int = 0
    solver_calls: int = 0

    def split_summary(self) -> dict:
        """Constrained / unconstrained periods apart (see :meth:`simulator.engine.Simulator._integrate`)."""
        out: dict[str, float] = {}
        for k, part in enumerate(("constrained", "unconstrained")):
            out[f"{part}_seconds"] = self.split_seconds[k]
            out[f"idle_node_seconds_{part}"] = self.split_idle[k]
            out[f"used_node_seconds_{part}"] = self.split_used[k]
            out[f"work_node_seconds_{part}"] = self.split_work[k]
        idle = self.idle_node_seconds
        out["excess_idle_node_seconds"] = self.excess_node_seconds
        out["excess_idle_fraction"] = self.excess_node_seconds / idle if idle > 0 else 0.0
        return out


class DecisionStats:
    """What the policy did, from its decisions: events by kind, profiles (how long, how many counts,
    capped steps), nodes lent and returned, jobs that waited to be profiled, and how far its beliefs
    were from the true curves where it chose a count."""

    def __init__(self) -> None:
        self._profile_started: dict[str, float] = {}
        self.profile_seconds: list[float] = []
        self.profile_counts: list[int] = []
        self.profile_waits: set[str] = set()
        self.event_counts: dict[str, int] = {}
        self.lent_nodes = 0
        self.returned_nodes = 0
        self.capped_steps = 0
        self.belief_errors: dict[tuple[str, int], float] = {}

    def note(self, decision: Decision, t: float) -> None:
        counts = self.event_counts
        for ev in decision.events:
            counts[ev.kind.value] = counts.get(ev.kind.value, 0) + 1
            if ev.kind is EventKind.PROFILE_START:
                self._profile_started[ev.job] = t
            elif ev.kind in (EventKind.PROFILE_DONE, EventKind.PROFILE_ABORTED):
                started = self._profile_started.pop(ev.job, t)
                self.profile_seconds.append(t - started)
                self.profile_counts.append(len(ev.detail.get("measured", {})))  # type: ignore[arg-type]
                self.capped_steps += len(ev.detail.get("capped", ()))  # type: ignore[arg-type]
            elif ev.kind is EventKind.LENT:
                self.lent_nodes += int(ev.detail.get("nodes", 0))  # type: ignore[arg-type]
            elif ev.kind is EventKind.RETURNED:
                self.returned_nodes += int(ev.detail.get("nodes", 0))  # type: ignore[arg-type]
        for job_id, reason in decision.waiting.items():
            if reason.startswith("waiting to be profiled"):
                self.profile_waits.add(job_id)

    def note_beliefs(self, view: View, decision: Decision, jobs: Mapping[str, SimJob], policy: Policy) -> None:
        """scalability_error_pct: |believed - true| / true at every (job, count) the allocator chose,
        with the belief the policy held when it first chose that count (call for solved decisions)."""
        views: dict[str, JobView] | None = None  # made when a count is new (rarely, after the first decisions)
        for job_id, nodes in decision.assignment.items():
            n = len(nodes)
            key = (job_id, n)
            if n <= 0 or key in self.belief_errors or job_id in decision.profiling:
                continue
            if views is None:
                views = {j.id: j for j in view.jobs}
            if job_id not in views:
                continue
            true = throughput_at(jobs[job_id].spec.scaling, n)
            believed = throughput_at(policy.believed_curve(views[job_id]), n)
            self.belief_errors[key] = abs(believed - true) / true * 100.0 if true > 0 else 0.0

    def summary(self) -> dict:
        errs = self.belief_errors
        n = len(self.profile_seconds)
        return {
            "scalability_error_pct": sum(errs.values()) / len(errs) if errs else None,
            "profiles_done": self.event_counts.get("profile_done", 0),
            "profiles_aborted": self.event_counts.get("profile_aborted", 0), "profile_waits": len(self.profile_waits),
            "profile_seconds_mean": sum(self.profile_seconds) / n if n else None,
            "profile_counts_mean": sum(self.profile_counts) / n if n else None,
            "profile_capped_steps": self.capped_steps, "profile_lent_nodes": self.lent_nodes,
            "profile_returned_nodes": self.returned_nodes, "refinements": self.event_counts.get("refined", 0),
        }


def about_replay(policy_name: str, workload: Workload, timeline: IdleTimeline, start: float, end: float,
                 cfg: PolicyConfig, cal: Calibration) -> dict:
    """What a replay ran: policy, workload, trace, window, the knobs that decide and the costs charged."""
    return {
        "policy": policy_name, "workload": workload.name, "scaling_source": workload.scaling_source,
        "synthetic_scaling": workload.synthetic, "trace": timeline.source, "nodes_total": len(timeline.nodes),
        "start": start, "end": end, "span_seconds": end - start, "horizon_s": cfg.tfwd_s,
        # what ran (presets never silently win over an override)
        "admission": cfg.admission.value, "max_running": cfg.max_running, "admission_cap": cfg.admission_cap,
        "objective": cfg.objective.value, "calibration": cal.name, "calibration_values": cal.as_dict(),
        "policy_config": cfg.as_dict(),
    }


def replay_summary(about: dict, tally: Tally, stats: DecisionStats, jobs: list[SimJob], *, end: float,
                   finite: bool, drained: bool, start: float, decisions: int, decision_ms: list[float],
                   wall: float, cpu: float) -> dict:
    """The summary of a replay: ``about`` (what ran), then what it did. ``drained``: a finite workload
    whose every job left (its makespan is then known)."""
    completed = [j for j in jobs if j.state is SimJobState.DONE]
    makespan = None
    if drained and all(j.finished_at is not None for j in jobs) and completed:
        makespan = max(j.finished_at for j in completed) - start  # type: ignore[type-var]
    ms = sorted(decision_ms)
    idle = tally.idle_node_seconds
    used = tally.used_node_seconds
    paused = sum(j.paused_node_seconds for j in jobs)
    productive = used - paused
    summary = dict(about)
    summary.update({
        "idle_node_seconds": idle, "used_node_seconds": used, "used_fraction": used / idle if idle > 0 else 0.0,
        "held_node_seconds": tally.held_node_seconds,
        "held_fraction": tally.held_node_seconds / idle if idle > 0 else 0.0, "paused_node_seconds": paused,
        "productive_node_seconds": productive,
        "trained_node_seconds": productive,  # held by a job and not paused (the real replay's "trained")
        "productive_fraction": productive / idle if idle > 0 else 0.0,
        "samples_processed": sum(j.progress for j in jobs),
        # model-neutral work: each job's samples over its own 1-node rate (node-seconds at 1 node)
        "work_node_seconds": sum(j.progress / j.one_node_rate for j in jobs if j.one_node_rate > 0),
        "lost_work_node_seconds": sum(j.lost_samples / j.one_node_rate for j in jobs if j.one_node_rate > 0),
        "cold_starts": tally.cold_starts, "restarts": tally.restarts,
        "start_paused_node_seconds": tally.start_paused_node_seconds, "jobs_submitted": len(jobs),
        "jobs_completed": len(completed), "makespan_seconds": makespan, "rescales": tally.rescales,
        "starts": tally.starts, "stops": tally.stops,
        **{f"jobs_stopped_{reason.value}": tally.policy_stops.get(reason, 0) for reason in StopReason},
        "preemptions": tally.preemptions, "decisions": decisions, "policy_calls": len(decision_ms),
        "solver_calls": tally.solver_calls, "decision_ms_p50": percentile(ms, 0.50),
        "decision_ms_p99": percentile(ms, 0.99), "wall_seconds": wall, "cpu_seconds": cpu,
    })
    summary.update(bound_summary(jobs, idle, summary["work_node_seconds"], finite))
    summary.update(profiling_summary(jobs, used))
    summary.update(tally.split_summary())
    summary.update(completion_summary(jobs, end))
    summary.update(stats.summary())
    return summary


def completion_summary(jobs: list[SimJob], end: float) -> dict:
    """Job completion times (submission to finish, completed jobs) and waits (submission to first nodes; a job that
    never ran waits until the end of the replay), and who waits: the mean wait of the quarter of jobs with the lowest
    1-node rate (the slowest models) against the fastest quarter, and the model whose jobs wait longest on average."""
    jct = sorted(j.finished_at - j.submitted_at for j in jobs if j.finished_at is not None)
    waits = [(j.one_node_rate, _wait(j, end), j.spec.model) for j in jobs]
    by_rate = sorted(waits, key=lambda w: w[0])
    q = max(1, len(by_rate) // 4) if by_rate else 0
    per_model: dict[str, list[float]] = {}
    for _, w, model in waits:
        per_model.setdefault(model, []).append(w)
    starved = max(per_model.items(), key=lambda kv: (sum(kv[1]) / len(kv[1]), kv[0]), default=None)
    wait_values = sorted(w for _, w, _ in waits)
    return {
        "jct_mean_seconds": sum(jct) / len(jct) if jct else None,
        "jct_p95_seconds": percentile(jct, 0.95) if jct else None,
        "wait_mean_seconds": sum(wait_values) / len(wait_values) if wait_values else None,
        "wait_p95_seconds": percentile(wait_values, 0.95) if wait_values else None,
        "wait_slowest_quarter_seconds": sum(w for _, w, _ in by_rate[:q]) / q if q else None,
        "wait_fastest_quarter_seconds": sum(w for _, w, _ in by_rate[-q:]) / q if q else None,
        "wait_by_model_seconds": {m: sum(ws) / len(ws) for m, ws in sorted(per_model.items())},
        "longest_waiting_model": starved[0] if starved else None,
        "longest_waiting_model_seconds": sum(starved[1]) / len(starved[1]) if starved else None,
        **slowdown_summary(jobs),
    }


def slowdown_summary(jobs: list[SimJob]) -> dict:
    """Slowdown of each completed job: its completion time over the time it needs alone at its max on
    its true curve; mean, p95, the mean per model and Jain's fairness index over the models' means
    (1: every model slowed alike; 1/k: one model bears it all)."""
    per_model: dict[str, list[float]] = {}
    for j in jobs:
        fast = throughput_at(j.spec.scaling, j.spec.max_nodes)
        if j.finished_at is None or fast <= 0:
            continue
        per_model.setdefault(j.spec.model, []).append((j.finished_at - j.submitted_at) / (j.spec.samples / fast))
    values = sorted(v for vs in per_model.values() for v in vs)
    means = {m: sum(vs) / len(vs) for m, vs in sorted(per_model.items())}
    squares = sum(v * v for v in means.values())
    return {
        "slowdown_mean": sum(values) / len(values) if values else None,
        "slowdown_p95": percentile(values, 0.95) if values else None, "slowdown_by_model": means,
        "slowdown_fairness_jain": sum(means.values()) ** 2 / (len(means) * squares) if squares > 0 else None,
    }


def bound_summary(jobs: list[SimJob], idle: float, work: float, finite: bool) -> dict:
    """The work no policy can exceed: min(offered work, idle node-seconds x the best work per node-second
    any job's curve reaches), and this run's gap to it. An endless stream's offered work is unbounded
    (a saturation case): the bound is then the idle term alone."""
    offered = sum(j.spec.samples / j.one_node_rate for j in jobs if j.one_node_rate > 0)
    eff = max((_best_efficiency(j) for j in jobs), default=0.0)
    bound = min(offered, idle * eff) if finite else idle * eff
    return {
        "offered_work_node_seconds": offered if finite else None,
        "work_share_of_offered": work / offered if finite and offered > 0 else None, "best_efficiency": eff,
        "bound_work_node_seconds": bound, "gap_to_bound_pct": 100.0 * (1.0 - work / bound) if bound > 0 else None,
    }


def _best_efficiency(job: SimJob) -> float:
    """max over the job's curve points up to its max, and its max, of rate(n) / (n rate(1)): rate(n) / n
    of a piecewise-linear curve (through the origin below its first point) peaks at one of them."""
    r1 = job.one_node_rate
    if r1 <= 0:
        return 0.0
    top = job.spec.max_nodes  # the rate at its max too: it may lie between two points
    pts = [(n, v) for n, v in job.spec.scaling.items() if n <= top] + [(top, throughput_at(job.spec.scaling, top))]
    return max(v / (n * r1) for n, v in pts)


def _wait(job: SimJob, end: float) -> float:
    for t, _, n, _ in job.history:
        if n > 0:
            return t - job.submitted_at
    return end - job.submitted_at


def profiling_summary(jobs: list[SimJob], used_node_seconds: float) -> dict:
    """Profiling accounting over the jobs that profiled (zeros for a policy that never profiles)."""
    profiled = [j for j in jobs if j.profiled]
    node_s = sum(j.profiling_node_seconds for j in profiled)
    ups = [j.profiling_scale_ups for j in profiled]
    return {
        "profiled_jobs": len(profiled), "profiling_node_seconds": node_s,
        "profiling_paused_node_seconds": sum(j.profiling_paused_node_seconds for j in profiled),
        "profiling_lost_samples": sum(j.profiling_lost_samples for j in profiled),
        "profiling_fraction": node_s / used_node_seconds if used_node_seconds > 0 else 0.0,
        "profiling_scale_ups": sum(ups), "profiling_scale_ups_max_per_job": max(ups, default=0),
        "profiling_scale_ups_min_per_job": min(ups, default=0),
    }


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]
