"""Decide: trainers and the decide step: one policy per trainer (``[[trainers]]``), each deciding on its
own view (its held usable nodes, its live jobs) and the monitor's evidence; a decision becomes each
job's nodes in its trainer's ledger. The policy states, one per trainer, are saved in the store after every decision that
changed one, so a restart resumes profiles, lender debts and learned curves."""

from __future__ import annotations

import json
import pwd
import time
from pathlib import Path
from typing import Mapping

from malletrain.daemon.config import DEFAULT_TRAINER, DaemonConfig, node_trainer
from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.records import POLICY_STATE_KEY, STOPPED, STORE_FILE, DaemonError, JobRun, Trainer
from malletrain.daemon.records import submission_order
from malletrain.daemon.state import JobTable, Plan, log
from malletrain.daemon.jobspec import JobState
from malletrain.daemon.metrics import Metrics
from malletrain.daemon.monitor import Monitor
from malletrain.daemon.scavenging import Scavenging
from malletrain.daemon.store import Store
from malletrain.daemon.sweepfile import stream_of
from policy import Decision, JobEvidence, JobView, Loss, Policy, PolicyState, PolicyStateError, Stop, View
from policy import PolicyInputError, evidence_from, interrupts, unplaced_reasons


def read_policy_states(text: str, first: str) -> dict[str, PolicyState]:
    """The saved policy states by trainer name. A single state (saved before trainers existed,
    recognised by its ``version`` number) is ``first``'s."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PolicyStateError(f"saved policy states are not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyStateError("saved policy states are not a JSON object")
    if isinstance(data.get("version"), int):
        return {first: PolicyState.from_json(text)}
    out = {}
    for name, value in data.items():
        if not isinstance(value, dict):
            raise PolicyStateError(f"the saved policy state of trainer {name!r} is not a JSON object")
        try:
            out[name] = PolicyState.from_json(json.dumps(value))
        except PolicyStateError as exc:
            raise PolicyStateError(f"trainer {name!r}: {exc}") from None
    return out


def policy_states_json(trainers: dict[str, Trainer]) -> str:
    """Every trainer's policy state, one JSON object keyed by trainer name (each state's own order kept)."""
    return "{" + ", ".join(f"{json.dumps(name)}: {t.policy.state.to_json()}" for name, t in trainers.items()) + "}"


def load_trainers(cfg: DaemonConfig, store: Store, state_dir: Path) -> tuple[dict[str, Trainer], str | None]:
    """One policy per trainer with the state the last daemon saved for it (a state saved before trainers
    existed is the first trainer's; one of a trainer no longer configured is dropped, with an event)."""
    configs = cfg.trainer_list()
    names = [t.name for t in configs]
    saved = store.get_meta(POLICY_STATE_KEY)
    try:
        states = read_policy_states(saved, DEFAULT_TRAINER if DEFAULT_TRAINER in names else names[0]) \
            if saved is not None else {}
    except PolicyStateError as exc:
        raise DaemonError(f"{state_dir / STORE_FILE}: {exc}") from None
    for name in sorted(set(states) - set(names)):
        store.log_event("policy_state_dropped", trainer=name)
    return {t.name: Trainer(t, Policy(t.policy, states.get(t.name))) for t in configs}, saved


class Decide:
    """The decide step: every trainer's ledger learns what was observed, its policy decides, the decision is
    placed in the ledger, and :meth:`plan` is what act carries out. It calls no other part of the daemon."""

    def __init__(self, table: JobTable, store: Store, monitor: Monitor, metrics: Metrics, scav: Scavenging,
                 accounting: NodeAccounting, saved_policy_state: str | None) -> None:
        self.table = table
        self.store = store
        self.monitor = monitor
        self.metrics = metrics
        self.scav = scav
        self.accounting = accounting
        self._saved_policy_state = saved_policy_state
        self._node_owner: dict[str, str | None] = {}  # node -> its trainer (memo of node_trainer)

    @property
    def trainers(self) -> dict[str, Trainer]:
        return self.table.trainers

    @property
    def profiling(self) -> frozenset[str]:
        """Jobs every trainer's last decision profiles."""
        return frozenset().union(*(t.profiling for t in self.trainers.values()))

    def plan(self) -> Plan:
        """Each live job's nodes as its trainer's ledger has them, for act to carry out."""
        nodes: dict[str, tuple[str, ...]] = {}
        for rid, run in self.table.runs.items():
            if not run.state.terminal:
                ledger = self.table.trainer_of(run).ledger
                nodes[rid] = ledger.nodes_of(rid) if ledger.is_live(rid) else ()
        return Plan(nodes, self.profiling)

    def node_trainer(self, node: str) -> str | None:
        """The trainer ``node`` belongs to (None: no trainer's patterns take it)."""
        if node not in self._node_owner:
            self._node_owner[node] = node_trainer([t.config for t in self.trainers.values()], node)
        return self._node_owner[node]

    def view(self, now: float, trainer: str | None = None) -> View:
        """What one trainer's policy decides on (default: the first's): its ledger's view as the last
        :meth:`feed_ledgers` left it. A getter: it feeds nothing."""
        t = self.trainers[trainer or next(iter(self.trainers))]
        return t.ledger.view(now, sorted(t.ledger.live_jobs()))

    def feed_ledgers(self, now: float) -> bool:
        """Every trainer's ledger learns what this step observed: the one path of a lost node is the usable set's
        difference (observe's events only wake the loop), so a loss however learnt is fed once. Returns whether a
        node was lost or became usable: that alone asks for a decision (a returning node is usable once its
        pilot runs and its agent is connected, which may be a step after the agent's event)."""
        usable = self._usable_by_trainer()
        moved = False
        for t in self.trainers.values():
            moved |= self._feed_ledger(t, now, usable[t.name])
        return moved

    def _usable_by_trainer(self) -> dict[str, set[str]]:
        usable = self.scav.usable()
        only = next(iter(self.trainers.values()))
        if len(self.trainers) == 1 and only.config.nodes is None:  # one trainer without patterns takes all
            return {only.name: usable}
        out: dict[str, set[str]] = {name: set() for name in self.trainers}
        for node in usable:
            name = self.node_trainer(node)
            if name in out:
                out[name].add(node)
        return out

    def _feed_ledger(self, t: Trainer, now: float, usable: set[str]) -> bool:
        """``t``'s ledger as events: nodes no longer usable lost, new ones usable from ``now``, jobs ended or
        submitted, each live job's progress and node-hours. The jobs' nodes are the ledger's own."""
        ledger = t.ledger
        ours = set(ledger.ours())  # (set operations: 4,608 nodes every step)
        if gone := ours - usable:
            self._note_losses(ledger.lost(sorted(gone), now))
        if new := usable - ours:
            ledger.usable(sorted(new), now)
        ledger.recall_expected({n: at for n, at in self.scav.recall_times().items() if n in usable})
        runs = {run.id: run for run in sorted(self.table.runs.values(), key=lambda r: r.id)
                if run.phase.live and self.table.trainer_name(run.spec) == t.name}
        for job_id in ledger.live_jobs():
            if job_id not in runs:
                ledger.ended(job_id)
        for run in runs.values():
            if not ledger.is_live(run.id):
                ledger.submitted(self._job_view(run))
            spec = run.spec
            if spec.samples is not None:
                ledger.progressed(run.id, float(max(0, spec.samples - run.last_progress)))
            ledger.used(run.id, self.accounting.used_node_hours(run.id))
        return bool(gone or new)

    def nodes_of(self, job_id: str) -> tuple[str, ...]:
        """The nodes ``job_id`` runs on, as its trainer's ledger has them (the one record act reads):
        what the last decision gave it, less what it lost since; () for a job not live."""
        run = self.table.runs.get(job_id)
        if run is None:
            return ()
        ledger = self.table.trainer_of(run).ledger
        return ledger.nodes_of(job_id) if ledger.is_live(job_id) else ()

    def _placed(self, job_id: str, nodes: list[str]) -> None:
        """A job placed on nodes runs again: the Loss that stopped it no longer says why it has none."""
        run = self.table.runs.get(job_id)
        if run is not None and nodes:
            run.suspended_by = None

    def _note_losses(self, losses: list[Loss]) -> None:
        """What the ledger decided a loss does to each job: one it suspended (below its min) is marked
        for act, which stops its workers and says why (:meth:`policy.Loss.describe`)."""
        for loss in losses:
            run = self.table.runs.get(loss.job)
            if run is not None and loss.stopped:
                run.suspended_by = loss

    def adopt_nodes(self, run: JobRun, left_on: tuple[str, ...], now: float) -> bool:
        """An adopted job is placed on its ``left_on`` nodes that are usable and no other job's; those whose
        workers did not come back are released. Returns whether that stopped it (below its min)."""
        ledger = self.table.trainer_of(run).ledger
        if not ledger.is_live(run.id):
            return False  # ending (e.g. cancelled while adoption was open): act ends it
        nodes = [n for n in dict.fromkeys(left_on) if ledger.is_usable(n) and ledger.holder(n) is None]
        ledger.placed(run.id, nodes, now)
        self._placed(run.id, nodes)
        return ledger.released(run.id, [n for n in nodes if n not in run.workers], now).stopped

    def give_up_node(self, run: JobRun, node: str, now: float) -> None:
        """``run`` no longer runs on ``node`` (its worker there failed): the node stays ours and free,
        and the job is stopped if that leaves it below its min (:meth:`policy.Ledger.released`)."""
        ledger = self.table.trainer_of(run).ledger
        if ledger.is_live(run.id):
            self._note_losses([ledger.released(run.id, [node], now)])

    def _job_view(self, run: JobRun) -> JobView:
        """A new job as its trainer's ledger is told of it (no nodes yet)."""
        spec = run.spec
        return JobView(run.id, spec.min_nodes, spec.max_nodes, (), order=submission_order(run.id),
                       scaling=dict(spec.scaling) if spec.scaling else None, profile=bool(spec.profile),
                       work_left=None if spec.samples is None else float(max(0, spec.samples - run.last_progress)),
                       budget_node_hours=spec.budget_node_hours, used_node_hours=self.accounting.used_node_hours(run.id),
                       deadline=spec.deadline, user=user_name(run.owner[0]), group=stream_of(spec))

    def evidence(self, trainer: str | None = None) -> dict[str, JobEvidence]:
        """What the monitor measured, per live job of ``trainer`` (default: the first): rates per count
        and the rescale pauses."""
        name = trainer or next(iter(self.trainers))
        out: dict[str, JobEvidence] = {}
        for run in self.table.runs.values():
            stats = self.monitor.jobs.get(run.id)
            if stats is not None and not run.state.terminal and self.table.trainer_name(run.spec) == name:
                out[run.id] = evidence_from(stats.throughput.estimates(), run.rescales)
        return out

    def decide(self, now: float) -> float | None:
        """Each trainer's policy decides on its own view; every decision is placed in its trainer's
        ledger. Returns the earliest time a policy asked to decide again (None: no such request)."""
        if self.table.stopped_profiles:
            self._restart_stopped_profiles()
        wakes = [wake for trainer in self.trainers.values()
                 if (wake := self._decide_trainer(trainer, now)) is not None]
        self._save_policy_states()
        return min(wakes, default=None)

    def _decide_trainer(self, trainer: Trainer, now: float) -> float | None:
        t0 = time.perf_counter()
        try:
            view = self.view(now, trainer.name)
            decision = trainer.policy.decide(view, self.evidence(trainer.name))
            self.metrics.observe_decision(time.perf_counter() - t0)
        except PolicyInputError as exc:  # a bug of ours, not a reason to stop: log it, try again later
            log.error("policy of trainer %s refused the view: %s", trainer.name, exc)
            self.store.log_event("decide_error", error=str(exc), trainer=trainer.name)
            return None
        trainer.ledger.delivered(view)  # the policy has learned the idle fragments it carried
        trainer.last_decision = decision
        trainer.profiling = frozenset(decision.profiling)
        return self._apply_decision(decision, now, trainer.name,
                                    {**unplaced_reasons(view, decision), **decision.waiting})

    def _save_policy_states(self) -> None:
        state = policy_states_json(self.trainers)
        if state != self._saved_policy_state:
            self.store.set_meta(POLICY_STATE_KEY, state)
            self._saved_policy_state = state

    def _apply_decision(self, decision: Decision, now: float, trainer: str,
                        waiting: Mapping[str, str] | None = None) -> float | None:
        """``trainer``'s decision: its jobs' nodes (placed in its ledger), waiting reasons (``waiting``;
        default the decision's) and the policy's events. Returns when the policy asks to decide again."""
        for ev in decision.events:
            detail = {k: v for k, v in ev.detail.items()}
            self.store.log_event(ev.kind.value, ev.job, **detail)  # measured points: the policy state keeps them
        ledger = self.trainers[trainer].ledger
        moved: dict[str, list[str]] = {}
        for job_id in ledger.live_jobs():
            old, new = ledger.nodes_of(job_id), decision.nodes_of(job_id)
            if interrupts(old, new):  # a permutation of the same nodes is no change
                self.store.log_event("plan", job_id, nodes=list(new), before=list(old))
                keep, had = set(new), set(old)
                moved[job_id] = [n for n in old if n in keep] + [n for n in new if n not in had]
        for job_id, nodes in moved.items():  # first every job gives up what it lost, then takes what it gained
            kept = set(nodes)
            ledger.placed(job_id, [n for n in ledger.nodes_of(job_id) if n in kept], now)
        for job_id, nodes in moved.items():
            ledger.placed(job_id, nodes, now)
            self._placed(job_id, nodes)
        for job in self.table.runs.values():
            if not job.state.terminal and self.table.trainer_name(job.spec) == trainer:
                job.waiting = (decision.waiting if waiting is None else waiting).get(job.id, "")
        for job_id, why in decision.stop.items():
            run = self.table.runs.get(job_id)
            if run is not None and not run.state.terminal and self.table.trainer_name(run.spec) == trainer:
                run.end(*self._stop_reason(run, why))
        return decision.wake_at

    def _stop_reason(self, run: JobRun, why: Stop) -> tuple[JobState, str]:
        """The state and message of a job the policy stops: CANCELLED (a limit its user set, not a broken
        job: FAILED keeps meaning that), with the policy's reason and figures (:meth:`policy.Stop.describe`)."""
        return JobState.CANCELLED, why.describe()

    def _restart_stopped_profiles(self) -> None:
        """Profiles that a clean stop interrupted start over (``PolicyState.restart_profile`` says why)."""
        for job in self.table.stopped_profiles:
            run = self.table.runs.get(job)
            if run is None:
                continue
            count = self.table.trainer_of(run).policy.state.restart_profile(job)
            if count is not None:
                self.store.log_event("profile_restarted", job, reason=STOPPED, count=count)
        self.table.stopped_profiles = []


def user_name(uid: int | None) -> str:
    """Whose a job is, for fair share (:attr:`policy.JobView.user`): the submitter's login name, ``uid N``
    when the system has no name for it, ``""`` for a job stored before submitters were recorded."""
    if uid is None:
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"
