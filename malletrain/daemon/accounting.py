"""Accounting: the node-seconds each live job's workers held (``budget_node_hours``) and the idle
fragments of usable nodes (node valuation). A collaborator the daemon owns, with its own state."""

from __future__ import annotations

import json
from typing import Callable, Container, Iterable

from malletrain.daemon.records import NODE_SECONDS_KEY, JobRun
from malletrain.store import Store


class NodeAccounting:
    """Node-seconds per live job, kept in the store meta, and since when each usable node is ours."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.node_seconds = self._load_node_seconds()  # what each live job has used (budget_node_hours)
        self._saved_node_seconds = dict(self.node_seconds)
        self._counted_at: float | None = None  # the last step counted (a gap while no daemon ran is not counted)
        self.idle_since: dict[str, float] = {}  # usable node -> since when (node valuation)
        self.ended_fragments: dict[str | None, list[float]] = {}  # trainer -> idle fragments ended since

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

    def track_idle(self, now: float, usable: set[str], node_trainer: Callable[[str], str | None]) -> None:
        """Since when each usable node is ours; a node that went ends an idle fragment of that length."""
        for node in sorted(self.idle_since.keys() - usable):  # (set operations: 4,608 nodes each step)
            frags = self.ended_fragments.setdefault(node_trainer(node), [])
            frags.append(max(0.0, now - self.idle_since.pop(node)))
            del frags[:-1024]  # a policy that never decides (stale looks) keeps only the newest
        for node in usable - self.idle_since.keys():
            self.idle_since[node] = now

    def fragments_learned(self, trainer: str) -> None:
        """``trainer``'s policy has decided with the fragments that ended: they are not given again."""
        self.ended_fragments.pop(trainer, None)
