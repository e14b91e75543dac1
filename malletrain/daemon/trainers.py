"""Trainers and the decide step: one policy per trainer (``[[trainers]]``), each deciding on its
own view (its held usable nodes, its live jobs) and the monitor's evidence; a decision becomes each
job's target. The policy states, one per trainer, are saved in the store after every decision that
changed one, so a restart resumes profiles, lender debts and learned curves."""

from __future__ import annotations

import json
import time

from malletrain.config import DEFAULT_TRAINER, node_trainer
from malletrain.daemon.base import DaemonBase, log
from malletrain.daemon.records import POLICY_STATE_KEY, STOPPED, STORE_FILE, DaemonError, JobRun, Trainer
from malletrain.daemon.records import submission_order
from malletrain.jobspec import JobSpec, JobState
from malletrain.scavenging import view_extras
from policy import Decision, EventKind, JobEvidence, JobView, Policy, PolicyState, PolicyStateError, View
from policy import PolicyInputError, evidence_from, interrupts


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



class Trainers(DaemonBase):
    """The decide step and the trainers it runs."""

    def _load_trainers(self) -> tuple[dict[str, Trainer], str | None]:
        """One policy per trainer, each with the state the last daemon saved for it (profiles, debts,
        learned curves); a single state saved before trainers existed is the ``default`` (or first)
        trainer's. The state of a trainer no longer configured is dropped (an event says so)."""
        configs = self.cfg.trainer_list()
        names = [t.name for t in configs]
        saved = self.store.get_meta(POLICY_STATE_KEY)
        try:
            states = read_policy_states(saved, DEFAULT_TRAINER if DEFAULT_TRAINER in names else names[0]) \
                if saved is not None else {}
        except PolicyStateError as exc:
            raise DaemonError(f"{self.state_dir / STORE_FILE}: {exc}") from None
        for name in sorted(set(states) - set(names)):
            self.store.log_event("policy_state_dropped", trainer=name)
        return {t.name: Trainer(t, Policy(t.policy, states.get(t.name))) for t in configs}, saved

    @property
    def policy(self) -> Policy:
        """The first trainer's policy (the only one of a config without ``[[trainers]]``)."""
        return next(iter(self.trainers.values())).policy

    @property
    def last_decision(self) -> Decision | None:
        """The first trainer's last decision (each trainer's: ``trainers[name].last_decision``)."""
        return next(iter(self.trainers.values())).last_decision

    @property
    def _profiling(self) -> frozenset[str]:
        """Jobs every trainer's last decision profiles."""
        return frozenset().union(*(t.profiling for t in self.trainers.values()))

    def trainer_name(self, spec: JobSpec) -> str:
        """The trainer a job names, or the first one (which need not exist: see :meth:`unknown_trainer`)."""
        return spec.trainer or next(iter(self.trainers))

    def unknown_trainer(self, spec: JobSpec) -> str | None:
        """Why this daemon cannot run the job (it names a trainer the daemon does not have), or None."""
        if spec.trainer is None or spec.trainer in self.trainers:
            return None
        return f"no trainer {spec.trainer!r} in this daemon (its trainers: {', '.join(self.trainers)})"

    def _trainer_of(self, run: JobRun) -> Trainer:
        return self.trainers[self.trainer_name(run.spec)]

    def node_trainer(self, node: str) -> str | None:
        """The trainer ``node`` belongs to (None: no trainer's patterns take it)."""
        if node not in self._node_owner:
            self._node_owner[node] = node_trainer([t.config for t in self.trainers.values()], node)
        return self._node_owner[node]

    def view(self, now: float, trainer: str | None = None) -> View:
        """What one trainer's policy decides on (default: the first trainer's): its held usable
        nodes, its live jobs (the daemon's targets)."""
        name = trainer or next(iter(self.trainers))
        usable = {n for n in self.usable_nodes() if self.node_trainer(n) == name}
        jobs = []
        taken: set[str] = set()
        for run in sorted(self.runs.values(), key=lambda r: r.id):
            if run.state.terminal or run.ending is not None or self.trainer_name(run.spec) != name:
                continue
            nodes = tuple(n for n in run.target if n in usable and n not in taken)[: run.spec.max_nodes]
            taken.update(nodes)
            spec = run.spec
            jobs.append(JobView(run.id, spec.min_nodes, spec.max_nodes, nodes, order=submission_order(run.id),
                                last_interrupted=run.last_interrupted,
                                scaling=dict(spec.scaling) if spec.scaling else None,
                                profile=bool(spec.profile),
                                work_left=None if spec.samples is None else float(max(0, spec.samples - run.last_progress)),
                                budget_node_hours=spec.budget_node_hours,
                                used_node_hours=self.used_node_hours(run.id),
                                deadline=spec.deadline))
        free = tuple(sorted(usable - taken))
        return View(now, free, tuple(jobs),
                    idle_since={n: self.accounting.idle_since[n] for n in free if n in self.accounting.idle_since},
                    ended_fragments=tuple(self.accounting.ended_fragments.get(name, ())),
                    **view_extras(View, {n: t for n, t in self.scav.recall_times().items() if n in usable}))

    def evidence(self, trainer: str | None = None) -> dict[str, JobEvidence]:
        """What the monitor measured, per live job of ``trainer`` (default: the first): rates per count
        and the rescale pauses."""
        name = trainer or next(iter(self.trainers))
        out: dict[str, JobEvidence] = {}
        for run in self.runs.values():
            stats = self.monitor.jobs.get(run.id)
            if stats is not None and not run.state.terminal and self.trainer_name(run.spec) == name:
                out[run.id] = evidence_from(stats.throughput.estimates(), run.rescales)
        return out

    def _decide(self, now: float) -> None:
        """Each trainer's policy decides on its own view; every decision is carried out."""
        if self._stopped_profiles:
            self._restart_stopped_profiles()
        for trainer in self.trainers.values():
            self._decide_trainer(trainer, now)
        self._save_policy_states()

    def _decide_trainer(self, trainer: Trainer, now: float) -> None:
        t0 = time.perf_counter()
        try:
            decision = trainer.policy.decide(self.view(now, trainer.name), self.evidence(trainer.name))
            self.metrics.observe_decision(time.perf_counter() - t0)
        except PolicyInputError as exc:  # a bug of ours, not a reason to stop: log it, try again later
            log.error("policy of trainer %s refused the view: %s", trainer.name, exc)
            self.store.log_event("decide_error", error=str(exc), trainer=trainer.name)
            return
        self.accounting.fragments_learned(trainer.name)  # the policy has learned them
        trainer.last_decision = decision
        trainer.profiling = frozenset(decision.profiling)
        self._apply_decision(decision, now, trainer.name)

    def _save_policy_states(self) -> None:
        state = policy_states_json(self.trainers)
        if state != self._saved_policy_state:
            self.store.set_meta(POLICY_STATE_KEY, state)
            self._saved_policy_state = state

    def _apply_decision(self, decision: Decision, now: float, trainer: str) -> None:
        """``trainer``'s decision: its jobs' targets, waiting reasons and the policy's events."""
        for ev in decision.events:
            detail = {k: v for k, v in ev.detail.items()}
            self.store.log_event(ev.kind.value, ev.job, **detail)  # measured points: the policy state keeps them
            if ev.kind is EventKind.LENT and ev.job in self.runs:
                self.runs[ev.job].last_interrupted = now
        for run in self.runs.values():
            if run.state.terminal or self.trainer_name(run.spec) != trainer:
                continue
            new = list(decision.nodes_of(run.id))
            if interrupts(run.target, new):  # a permutation of the same nodes is no change
                self.store.log_event("plan", run.id, nodes=new, before=run.target)
                run.last_interrupted = now  # as the simulator counts it: any change of nodes (lender order)
                run.target = [n for n in run.target if n in set(new)] + [n for n in new if n not in set(run.target)]
            run.waiting = decision.waiting.get(run.id, "")
        for job_id, why in decision.stop.items():
            run = self.runs.get(job_id)
            if run is not None and not run.state.terminal and self.trainer_name(run.spec) == trainer:
                self._end(run, *self._stop_reason(run, why))
        if decision.wake_at is not None:
            self._next_decide = min(self._next_decide, decision.wake_at)

    def _stop_reason(self, run: JobRun, why: str) -> tuple[JobState, str]:
        """The state and message of a job the policy stops (``Decision.stop``).

        CANCELLED, not FAILED: the job did nothing wrong; it reached a limit its user set, which
        is the user cancelling it at that point, decided in advance. FAILED stays what the
        job's own command did (``max_failures`` and alerting on FAILED keep meaning a broken job),
        and COMPLETED would claim it trained what it was asked to. The message says it was the
        budget and by how much, so ``malletrain status`` tells it apart from a user's cancel.
        """
        budget = run.spec.budget_node_hours
        if budget is not None and "budget" in why:
            return JobState.CANCELLED, f"over budget: used {self.used_node_hours(run.id):.4g} of {budget:.4g} node-hours"
        return JobState.CANCELLED, f"stopped by the policy: {why}"

    def _restart_stopped_profiles(self) -> None:
        """Profiles that a clean stop interrupted start over (``PolicyState.restart_profile`` says why)."""
        for job in self._stopped_profiles:
            run = self.runs.get(job)
            if run is None:
                continue
            count = self._trainer_of(run).policy.state.restart_profile(job)
            if count is not None:
                self.store.log_event("profile_restarted", job, reason=STOPPED, count=count)
        self._stopped_profiles = []
