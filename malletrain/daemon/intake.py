"""Intake: a job read from the store becomes one this daemon runs (its reports taken by the monitor),
or is refused because it names a trainer this daemon does not have. Used by observe (new jobs) and
adoption (the jobs the last daemon left); it calls no other part of the daemon."""

from __future__ import annotations

from typing import Callable

from malletrain.daemon.state import JobTable, log
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.logs import about
from malletrain.daemon.monitor import Monitor
from malletrain.daemon.store import Store, StoreError


class JobIntake:
    """Registers the jobs the daemon takes and refuses those it cannot run."""

    def __init__(self, table: JobTable, store: Store, monitor: Monitor, job_secret: Callable[[str], str]) -> None:
        self.table = table
        self.store = store
        self.monitor = monitor
        self.job_secret = job_secret

    def register(self, job_id: str) -> None:
        """The monitor takes this job's reports, signed with its secret, and no more progress than
        its max_nodes could train."""
        rec = self.store.get(job_id)
        self.monitor.register(job_id, self.job_secret(job_id), max_nodes=rec.spec.max_nodes if rec else None)

    def refused(self, job_id: str, spec: JobSpec) -> bool:
        """A job that reached the store without the daemon (CLI, no daemon running) naming a trainer
        this daemon does not have: FAILED, with the reason."""
        why = self.table.unknown_trainer(spec)
        if why is None:
            return False
        try:
            self.store.set_state(job_id, JobState.FAILED, why)
            self.store.set_nodes(job_id, [])  # workers an earlier daemon ran for it: stopped as nobody's
        except StoreError as exc:  # e.g. cancelled a moment ago
            log.warning("%s", exc, extra=about(job=job_id))
        self.store.log_event("trainer_unknown", job_id, trainer=spec.trainer)
        return True
