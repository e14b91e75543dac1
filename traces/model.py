"""One model for every log: an idle-node timeline.

At each time, which nodes the main scheduler leaves idle. Events are
"node becomes idle" (``idle=True``) and "node recalled" (``idle=False``).
Stored as numpy arrays so a week of Summit (423k changes) stays compact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np


class TraceError(ValueError):
    """A log that cannot be read; the message names the file (and line)."""


@dataclass(frozen=True)
class NodeEvent:
    time: float
    node: str
    idle: bool  # True: node becomes idle (usable); False: recalled by the main scheduler


@dataclass(frozen=True)
class EventBatch:
    """All node changes at one timestamp."""

    time: float
    became_idle: tuple[str, ...]
    recalled: tuple[str, ...]


@dataclass(frozen=True)
class IdleTimeline:
    """Idle nodes over ``[start, end]``.

    ``initial_idle`` are the nodes idle at ``start``; ``times``/``node_ids``/``idle``
    are parallel arrays of later changes, sorted by time (stable within a time),
    with ``node_ids`` indexing ``nodes``. Every event changes its node's state.
    """

    source: str
    format: str
    nodes: tuple[str, ...]
    start: float
    end: float
    initial_idle: frozenset[str]
    times: np.ndarray  # float64
    node_ids: np.ndarray  # int32
    idle: np.ndarray  # bool

    @property
    def n_events(self) -> int:
        return int(self.times.shape[0])

    def events(self) -> Iterator[NodeEvent]:
        names = self.nodes
        for t, i, s in zip(self.times.tolist(), self.node_ids.tolist(), self.idle.tolist()):
            yield NodeEvent(t, names[i], bool(s))

    def batches(self) -> Iterator[EventBatch]:
        """Changes grouped by timestamp, in time order."""
        names = self.nodes
        times = self.times
        if times.shape[0] == 0:
            return
        cuts = np.flatnonzero(np.diff(times)) + 1
        starts = np.concatenate(([0], cuts))
        stops = np.concatenate((cuts, [times.shape[0]]))
        ids = self.node_ids.tolist()
        idle = self.idle.tolist()
        for a, b in zip(starts.tolist(), stops.tolist()):
            up = tuple(names[ids[k]] for k in range(a, b) if idle[k])
            down = tuple(names[ids[k]] for k in range(a, b) if not idle[k])
            yield EventBatch(float(times[a]), up, down)

    def idle_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Step function of the number of idle nodes: (times, count after each time)."""
        delta = np.where(self.idle, 1, -1).astype(np.int64)
        counts = len(self.initial_idle) + np.cumsum(delta)
        t = np.concatenate(([self.start], self.times))
        c = np.concatenate(([len(self.initial_idle)], counts))
        return t, c

    def idle_node_seconds(self, start: float | None = None, end: float | None = None) -> float:
        """Integral of the idle-node count over ``[start, end]`` (defaults: whole span)."""
        lo = self.start if start is None else start
        hi = self.end if end is None else end
        t, c = self.idle_counts()
        t_next = np.concatenate((t[1:], [self.end]))
        a = np.clip(t, lo, hi)
        b = np.clip(t_next, lo, hi)
        return float(np.sum(c * (b - a)))
