"""The replay's jobs: every job submitted, the admitted ones and the queue, and how a job is made. A job is made when it
arrives (or is drawn from an endless stream): the policy's submission rule and the replay's caps shape its spec, the
simulated monitor measures it if the policy reads measurements, and the ledger learns of it. The queue is kept in
submission order; which queued jobs the policy is shown, and in which order, is the policy's."""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Callable

from policy import JobView, Ledger, PolicyConfig
from simulator.calibration import Calibration
from simulator.jobs import TORCHRUN
from simulator.modelsizes import checkpoint_mb
from simulator.monitor import SimJobMonitor
from simulator.policies import SimPolicy
from simulator.records import SimConfig, SimJob
from simulator.workload import JobSpec

MonitorFactory = Callable[[str, JobSpec], SimJobMonitor]


class Fleet:
    """Every job of one replay: ``jobs`` by id, the ``admitted`` ones (the policy's order), the ``queue``."""

    def __init__(self, ledger: Ledger, sim_policy: SimPolicy, config: SimConfig, cal: Calibration, start: float,
                 seed: int, monitor_factory: MonitorFactory | None) -> None:
        self._ledger = ledger
        self._sim_policy = sim_policy
        self._config = config
        self._cal = cal
        self._start = start
        self._seed = seed
        self._monitor_factory = monitor_factory  # a test's scripted monitor instead of SimJobMonitor
        pcfg: PolicyConfig = sim_policy.config
        self._pcfg = pcfg
        # the simulated monitor measures rates if the policy learns or profiles, costs if it reads them
        self._want_rates = pcfg.learn or pcfg.profiling.value != "never"
        self._want_costs = pcfg.rescale_costs.value == "measured" and pcfg.allocation.value == "milp"
        self.jobs: dict[str, SimJob] = {}
        self.queue: list[SimJob] = []  # submitted, not admitted, in submission order
        self.admitted: list[SimJob] = []  # read at every event; changed by admit() and drop_admitted()
        self._capacity: int | None = None  # absorb_capacity() of the admitted list (None: not known)

    def admit(self, jobs: list[SimJob]) -> None:
        """The jobs holding a slot from now on, in the policy's order."""
        self.admitted = jobs
        self._capacity = None

    def absorb_capacity(self) -> int:
        """Nodes the admitted jobs could hold at once: the sum of their max nodes (kept: asked at every
        event; the admitted list changes only at decisions, completions, cancels)."""
        if self._capacity is None:
            self._capacity = sum(j.spec.max_nodes for j in self.admitted)
        return self._capacity

    def drop_admitted(self, job: SimJob) -> None:
        """``job`` holds its slot no more (it finished, was cancelled or stopped)."""
        remove_job(self.admitted, job)
        self._capacity = None

    def requeue(self, job: SimJob) -> None:
        """``job`` lost its slot: it waits again, at its place in submission order."""
        bisect.insort(self.queue, job, key=lambda j: j.order)

    def submit(self, spec: JobSpec, t: float) -> SimJob:
        """A job arrives at ``t``: made, measured if the policy reads measurements, known to the ledger."""
        if self._sim_policy.submission is not None:
            spec = self._sim_policy.submission(spec)
        cap = self._config.max_nodes
        if cap is not None and spec.max_nodes > cap:
            spec = replace(spec, max_nodes=max(cap, spec.min_nodes))
        pause = self._rescale_pause(spec)
        if pause is not None and (spec.up_cost_s, spec.down_cost_s) != (pause, pause):
            spec = replace(spec, up_cost_s=pause, down_cost_s=pause)
        job = SimJob(id=f"j{len(self.jobs):05d}", spec=spec, submitted_at=t, order=len(self.jobs), last_update=t,
                     user_curve=self._sim_policy.user_curve(spec))
        if self._monitor_factory is not None:
            job.monitor = self._monitor_factory(job.id, spec)
        elif self._want_rates or self._want_costs:
            job.monitor = SimJobMonitor(job.id, spec.scaling, seed=self._seed, noise=self._config.record_noise,
                                        rel_ci=self._pcfg.profile_rel_ci, rates=self._want_rates,
                                        costs=self._want_costs)
        self.jobs[job.id] = job
        deadline = None if spec.deadline is None else self._start + spec.deadline
        self._ledger.submitted(JobView(id=job.id, min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, order=job.order,
                                       scaling=job.user_curve, profile=False, work_left=job.work_left,
                                       budget_node_hours=spec.budget_node_hours, deadline=deadline,
                                       user=job.id if self._config.users == "job" else spec.user, group=spec.group))
        return job

    def _rescale_pause(self, spec: JobSpec) -> float | None:
        """What a change of size costs ``spec`` (None: its own costs): an in-process job pauses for the
        calibrated pause plus the broadcast of its state; a torchrun job restarts every worker (the
        calibrated restart, warm or cold: :meth:`Calibration.torchrun_change_s`, plus the load of its
        checkpoint; :mod:`simulator.modelsizes` gives the MB)."""
        cal = self._cal
        mb = checkpoint_mb(spec.model)
        if spec.launcher == TORCHRUN and not cal.is_free:  # every change of size restarts its workers
            return cal.torchrun_change_s(spec.warm_ranks) + cal.load_s(mb)
        return None if cal.rescale_pause_s is None else cal.rescale_pause_s + cal.broadcast_s(mb)


def remove_job(jobs: list[SimJob], job: SimJob) -> None:
    """``jobs.remove(job)``, by identity: list.remove compares ``job`` with each job before it, and
    SimJob's dataclass ``==`` compares every field."""
    for i, other in enumerate(jobs):
        if other is job:
            del jobs[i]
            return
    raise ValueError(f"job {job.id} is not in the list")
