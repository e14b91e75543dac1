"""Accounting: the node-seconds each live job's workers held (``budget_node_hours``), kept in the
store so a restart goes on counting. A collaborator the daemon owns, with its own state. (Which
nodes are usable since when and the idle fragments they end are each trainer's
:class:`policy.Ledger`'s: see :mod:`malletrain.daemon.decide`.)"""

from __future__ import annotations

import json
from typing import Container, Iterable

from malletrain.daemon.records import NODE_SECONDS_KEY, JobRun
from malletrain.daemon.store import Store


class NodeAccounting:
    """Node-seconds per live job, kept in the store meta."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.node_seconds = self._load_node_seconds()  # what each live job has used (budget_node_hours)
        self._saved_node_seconds = dict(self.node_seconds)
        self._counted_at: float | None = None  # the last step counted (a gap while no daemon ran is not counted)

    def used_node_hours(self, job_id: str) -> float:
        """Node-hours the job's workers have held, as this daemon (and the ones before it) counted them."""
        return self.node_seconds.get(job_id, 0.0) / 3600.0

    def count(self, now: float, runs: Iterable[JobRun]) -> None:
        """Each live job's workers (members and joining ones) held their nodes since the last step."""
        last, self._counted_at = self._counted_at, now
        if last is None or now <= last:
            return
        for run in runs:
            if run.workers and not run.state.terminal:
                self.node_seconds[run.id] = self.node_seconds.get(run.id, 0.0) + len(run.workers) * (now - last)

    def _load_node_seconds(self) -> dict[str, float]:
        try:
            data = json.loads(self.store.get_meta(NODE_SECONDS_KEY) or "{}")
            return {str(k): float(v) for k, v in data.items() if float(v) >= 0}
        except (ValueError, TypeError, AttributeError) as exc:  # a bad record: start the count again, say so
            self.store.log_event("node_seconds_unreadable", error=str(exc))
            return {}

    def save(self, runs: Container[str]) -> None:
        """The live jobs' counts to the store meta (at most once a second, from the daemon's sampler)."""
        live = {k: v for k, v in self.node_seconds.items() if k in runs}
        self.node_seconds = {k: self.node_seconds[k] for k in live}
        if live != self._saved_node_seconds:
            self.store.set_meta(NODE_SECONDS_KEY, json.dumps(live, sort_keys=True))
            self._saved_node_seconds = live
