"""Pure: what a driver observed, fed with events, and the :class:`~policy.model.View` built from it.

A driver (the simulator; the daemon, one ledger per trainer) tells the ledger what happened, in order, and keeps
no copy of its own of which node is ours since when or which job holds which; the events and the two rules
kept here once (:func:`below_min` with :func:`loss_outcome`, and :func:`interrupts`) are in docs/design.md
(the ledger). Times are the driver's, passed in; node order is the driver's, so a replay gets the same views.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from itertools import islice
from typing import Iterable, Mapping, Sequence

from policy.model import JobView, PolicyInputError, View, check_amount
from policy.state import FRAGMENTS_KEEP


class LedgerError(PolicyInputError):
    """An event the ledger cannot apply; the message names the job or node."""


def below_min(count: int, min_nodes: int) -> bool:
    """A job on ``count`` nodes cannot run when that is fewer than its ``min_nodes`` (0 always is)."""
    return count < min_nodes


def interrupts(before: Sequence[str], after: Sequence[str]) -> bool:
    """Whether a job going from nodes ``before`` to ``after`` is interrupted: any change of its node set (the same
    nodes in another order are none)."""
    return len(before) != len(after) or set(before) != set(after)


class LossOutcome(str, Enum):
    """What losing nodes does to the job that held them (:func:`loss_outcome`)."""

    UNCHANGED = "unchanged"  # it lost none of its nodes and still has its min
    SHRUNK = "shrunk"  # it runs on, on the nodes it kept (at least its min)
    SUSPENDED = "suspended"  # below its min: its other nodes are free, it waits for nodes again


def loss_outcome(lost: int, left: int, min_nodes: int) -> LossOutcome:
    """The outcome for a job that lost ``lost`` nodes and has ``left``: suspended below its min, else shrunk, or
    unchanged if it lost none."""
    if below_min(left, min_nodes):
        return LossOutcome.SUSPENDED
    return LossOutcome.SHRUNK if lost else LossOutcome.UNCHANGED


@dataclass(frozen=True)
class Loss:
    """What a recall (or a release) did to one job: the nodes it ``lost``, the count ``left``, its ``min_nodes`` and
    the ``outcome``; a suspended job's other nodes are free again, and it waits for nodes (:meth:`describe`)."""

    job: str
    lost: tuple[str, ...]
    outcome: LossOutcome
    left: int
    min_nodes: int

    @property
    def stopped(self) -> bool:
        """Whether the job is suspended (below its min): it runs on no node."""
        return self.outcome is LossOutcome.SUSPENDED

    def describe(self) -> str:
        """The outcome in words, with its figures (a suspended job's reason)."""
        if self.outcome is LossOutcome.SUSPENDED:
            return (f"below min_nodes: {self.left} node(s) left of the {self.min_nodes} it needs "
                    f"after losing {len(self.lost)}")
        return f"{self.outcome.value}: lost {len(self.lost)} node(s), runs on {self.left}"


@dataclass
class _Held:
    """One live job as the ledger keeps it: its nodes in the driver's order, when they last changed and its progress
    as last reported; ``shown`` is the job as the policy sees it, made again when read after its nodes or its
    progress moved (a job moved and progressed between two views is made once)."""

    shown: JobView
    nodes: list[str]
    work_left: float | None
    used_node_hours: float
    last_interrupted: float | None
    nodes_moved: bool = False  # its node set changed since ``shown`` was made

    def view(self) -> JobView:
        """The job as the policy sees it now."""
        s = self.shown
        if self.nodes_moved:
            s = self.shown = self._made(tuple(sorted(self.nodes)), self.last_interrupted)
            self.nodes_moved = False
        elif s.work_left != self.work_left or s.used_node_hours != self.used_node_hours:
            s = self.shown = self._made(s.nodes, s.last_interrupted)
        return s

    def moved(self, at: float) -> None:
        """Its node set changed at ``at``: an interruption."""
        self.last_interrupted = at
        self.nodes_moved = True

    def _made(self, nodes: tuple[str, ...], last_interrupted: float | None) -> JobView:
        # every field given, in JobView's order (not dataclasses.replace, 1.5x slower, nor by keyword, 1.25x: this
        # runs for each running job at each decision); test_ledger's test_every_field_of_a_job_is_carried, each
        # field set to a value of its own, fails if one is left out or two change places
        s = self.shown
        return JobView(s.id, s.min_nodes, s.max_nodes, nodes, s.order, last_interrupted, s.scaling, s.profile,
                       self.work_left, s.budget_node_hours, self.used_node_hours, s.deadline, s.user, s.group)


class Ledger:
    """What one driver observed (see the module doc for the events)."""

    def __init__(self) -> None:
        self._idle_since: dict[str, float] = {}  # every node ours (usable or pilot starting) -> since
        self._free: dict[str, float] = {}  # usable nodes no job holds -> idle since, in the order freed
        self._holder: dict[str, str] = {}  # usable node a job holds -> the job
        self._jobs: dict[str, _Held] = {}  # live jobs, in submission order
        self._fragments: list[float] = []  # lengths of idle fragments ended, not delivered yet
        self._recall_at: dict[str, float] = {}

    # ------------------------------------------------------------------ node events

    def idle(self, nodes: Iterable[str], since: float) -> tuple[str, ...]:
        """``nodes`` became idle at ``since`` (pilots submitted); returns those not already ours."""
        new = []
        for node in nodes:
            if node not in self._idle_since:
                self._idle_since[node] = since
                new.append(node)
        return tuple(new)

    def usable(self, nodes: Iterable[str], at: float) -> int:
        """``nodes`` can be given to jobs from ``at``; returns how many were not usable before."""
        n = 0
        for node in nodes:
            since = self._idle_since.setdefault(node, at)
            if node not in self._free and node not in self._holder:
                self._free[node] = since
                n += 1
        return n

    def lost(self, nodes: Iterable[str], at: float) -> list[Loss]:
        """``nodes`` were taken back at ``at`` (nodes not ours are ignored): what it did to each job hit, in order."""
        hit: dict[str, list[str]] = {}
        for node in nodes:
            since = self._idle_since.pop(node, None)
            if since is None:
                continue
            self._fragments.append(max(0.0, at - since))
            # the policy learns from the newest FRAGMENTS_KEEP alone: while no view is delivered (decisions
            # failing) the older ones are dropped here, so the ledger's memory stays bounded
            del self._fragments[:-FRAGMENTS_KEEP]
            self._recall_at.pop(node, None)
            if self._free.pop(node, None) is not None:
                continue
            job_id = self._holder.pop(node, None)
            if job_id is not None:
                self._jobs[job_id].nodes.remove(node)
                hit.setdefault(job_id, []).append(node)
        return [self._interrupted(job_id, tuple(lost), at) for job_id, lost in hit.items()]

    def recall_expected(self, times: Mapping[str, float]) -> None:
        """The known times nodes will be taken back (replaces the ones known before)."""
        self._recall_at = dict(times)

    # ------------------------------------------------------------------ job events

    def submitted(self, job: JobView) -> None:
        """A job arrived; it holds no node yet."""
        if job.id in self._jobs:
            raise LedgerError(f"job {job.id} is submitted twice")
        if job.nodes:
            raise LedgerError(f"job {job.id} is submitted on nodes {list(job.nodes)}: place it on them with placed()")
        self._jobs[job.id] = _Held(job, [], job.work_left, job.used_node_hours, job.last_interrupted)

    def placed(self, job_id: str, nodes: Sequence[str], at: float) -> bool:
        """The driver carried out a decision: ``job_id`` runs on ``nodes`` (in the driver's order) from ``at``.
        Returns whether that :func:`interrupts` it."""
        job = self._job(job_id)
        old = job.nodes
        if not interrupts(old, nodes):
            return False
        if len(set(nodes)) != len(nodes):
            raise LedgerError(f"job {job_id} is given a node twice")
        if len(nodes) > job.shown.max_nodes:
            raise LedgerError(f"job {job_id} is given {len(nodes)} nodes, more than its max {job.shown.max_nodes}")
        have = set(old)
        for node in nodes:
            if node not in have and node not in self._free:
                holder = self._holder.get(node)
                why = f"held by job {holder}" if holder is not None else "not a usable node of ours"
                raise LedgerError(f"job {job_id} given node {node!r}, {why}")
        self._release(job_id, nodes)
        for node in nodes:
            if node not in have:
                del self._free[node]
                self._holder[node] = job_id
        job.nodes = list(nodes)
        job.moved(at)
        return True

    def released(self, job_id: str, nodes: Iterable[str], at: float) -> Loss:
        """``job_id`` gave up ``nodes`` at ``at`` without a decision asking it (its worker there failed): they stay
        ours and free. Below its min the job is suspended (its other nodes free too); so is a job on no node."""
        job = self._job(job_id)
        gone = set(nodes)
        mine = job.nodes
        lost = tuple(n for n in mine if n in gone)
        if lost:
            self._release(job_id, [n for n in mine if n not in gone])
            return self._interrupted(job_id, lost, at)
        outcome = loss_outcome(0, len(mine), job.shown.min_nodes)
        if outcome is LossOutcome.SUSPENDED and mine:
            return self._interrupted(job_id, (), at)
        return Loss(job_id, (), outcome, len(mine), job.shown.min_nodes)

    def progressed(self, job_id: str, work_left: float) -> None:
        """``job_id`` still has ``work_left`` samples to train."""
        job = self._job(job_id)
        check_amount(job_id, "work_left", work_left)
        job.work_left = work_left

    def used(self, job_id: str, node_hours: float) -> None:
        """``job_id`` has held ``node_hours`` node-hours so far."""
        job = self._job(job_id)
        check_amount(job_id, "used_node_hours", node_hours)
        job.used_node_hours = node_hours

    def ended(self, job_id: str) -> None:
        """``job_id`` finished or was cancelled: its nodes are free, the ledger forgets it."""
        self._job(job_id)
        self._release(job_id, ())
        del self._jobs[job_id]

    def delivered(self, view: View) -> None:
        """The policy decided on ``view``: the idle fragments it carried are learned."""
        del self._fragments[: len(view.ended_fragments)]

    # ------------------------------------------------------------------ reading

    def job(self, job_id: str) -> JobView:
        """``job_id`` as the policy sees it."""
        return self._job(job_id).view()

    def nodes_of(self, job_id: str) -> tuple[str, ...]:
        """``job_id``'s nodes, in the driver's order."""
        return tuple(self._job(job_id).nodes)

    def count(self, job_id: str) -> int:
        """How many nodes ``job_id`` runs on."""
        return len(self._job(job_id).nodes)

    def holder(self, node: str) -> str | None:
        """The job running on ``node``, if any."""
        return self._holder.get(node)

    def idle_since(self, node: str) -> float | None:
        """Since when ``node`` is ours (None: it is not)."""
        return self._idle_since.get(node)

    def ours(self) -> tuple[str, ...]:
        """Every node ours (usable or with a pilot starting), in the order it became ours."""
        return tuple(self._idle_since)

    def live_jobs(self) -> tuple[str, ...]:
        """The live jobs' ids, in submission order."""
        return tuple(self._jobs)

    def is_live(self, job_id: str) -> bool:
        """Whether ``job_id`` was submitted and has not ended."""
        return job_id in self._jobs

    def is_usable(self, node: str) -> bool:
        return node in self._free or node in self._holder

    @property
    def n_idle(self) -> int:
        """Nodes ours, usable or with a pilot starting."""
        return len(self._idle_since)

    @property
    def n_usable(self) -> int:
        return len(self._free) + len(self._holder)

    @property
    def n_free(self) -> int:
        return len(self._free)

    def free_nodes(self) -> tuple[str, ...]:
        """Usable nodes no job runs on, in the order they became free."""
        return tuple(self._free)

    def view(self, now: float, jobs: Iterable[str] | None = None) -> View:
        """The view to decide on at ``now``: ``jobs`` (default: every live job, in submission order) and the free
        nodes cut to the first ones they could take (``View.n_free`` the real count); see docs/design.md."""
        shown = tuple(h.view() for h in (self._jobs.values() if jobs is None else map(self._job, jobs)))
        room = sum(j.max_nodes - len(j.nodes) for j in shown)
        pool = self._free
        if room >= len(pool):
            free, since = tuple(pool), dict(pool)
        else:
            free = tuple(islice(pool, room))
            since = {n: pool[n] for n in free}
        recall = {n: t for n, t in self._recall_at.items() if self.is_usable(n)} if self._recall_at else {}
        return View(now=now, free_nodes=free, n_free=len(pool), jobs=shown, idle_since=since,
                    recall_at=recall, ended_fragments=tuple(self._fragments))

    # ------------------------------------------------------------------ helpers

    def _job(self, job_id: str) -> _Held:
        job = self._jobs.get(job_id)
        if job is None:
            raise LedgerError(f"job {job_id} is not a live job of the ledger")
        return job

    def _interrupted(self, job_id: str, lost: tuple[str, ...], at: float) -> Loss:
        """``job_id`` just lost nodes at ``at`` (or is below its min): interrupted; below its min, suspended."""
        job = self._jobs[job_id]
        left, min_nodes = len(job.nodes), job.shown.min_nodes
        outcome = loss_outcome(len(lost), left, min_nodes)
        if outcome is LossOutcome.SUSPENDED:
            self._release(job_id, ())
        job.moved(at)
        return Loss(job_id, lost, outcome, left, min_nodes)

    def _release(self, job_id: str, keep: Sequence[str]) -> None:
        """``job_id``'s nodes not in ``keep`` go back to the free pool, in the job's order."""
        kept = set(keep)
        job = self._jobs[job_id]
        for node in job.nodes:
            if node not in kept:
                del self._holder[node]
                self._free[node] = self._idle_since[node]
        job.nodes = [n for n in job.nodes if n in kept]
