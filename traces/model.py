"""One model for every log: an idle-node timeline.

At each time, which nodes the main scheduler leaves idle. Events are
"node becomes idle" (``idle=True``) and "node recalled" (``idle=False``).
Stored as numpy arrays so a week of Summit (423k changes) stays compact.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator, Sequence

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
    notes: tuple[str, ...] = ()  # reader remarks (skipped jobs, clamping); never affects the data

    @classmethod
    def from_arrays(
        cls,
        *,
        source: str,
        format: str,
        nodes: Sequence[str],
        start: float,
        end: float,
        initial_idle: np.ndarray,
        times: np.ndarray,
        node_ids: np.ndarray,
        idle: np.ndarray,
        notes: Sequence[str] = (),
    ) -> IdleTimeline:
        """Build a timeline from raw per-node state reports, normalised.

        ``initial_idle`` is a bool mask over ``nodes``. Reports are sorted by time
        (stable); those at or before ``start`` fold into the initial state, those
        after ``end`` are dropped, several reports of one node at one time keep
        the last, and reports that do not change their node's state are dropped,
        so every kept event is a real change.
        """
        names = tuple(nodes)
        mask = np.asarray(initial_idle, dtype=bool).copy()
        t = np.asarray(times, dtype=np.float64)
        ids = np.asarray(node_ids, dtype=np.int64)
        st = np.asarray(idle, dtype=bool)
        _check_arrays(names, mask, t, ids, st, start, end)
        order = np.argsort(t, kind="stable")
        t, ids, st = t[order], ids[order], st[order]
        early = t <= start
        if early.any():
            _apply_last(mask, ids[early], st[early])
        keep = (t > start) & (t <= end)
        t, ids, st = t[keep], ids[keep], st[keep]
        sel = _real_changes(mask, t, ids, st)
        return cls(
            source=source,
            format=format,
            nodes=names,
            start=float(start),
            end=float(end),
            initial_idle=frozenset(names[i] for i in np.flatnonzero(mask).tolist()),
            times=t[sel],
            node_ids=ids[sel].astype(np.int32),
            idle=st[sel],
            notes=tuple(notes),
        )

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def span(self) -> float:
        return self.end - self.start

    def initial_mask(self) -> np.ndarray:
        """Bool mask over ``nodes``: idle at ``start``."""
        mask = np.zeros(len(self.nodes), dtype=bool)
        if self.initial_idle:
            index = {name: i for i, name in enumerate(self.nodes)}
            mask[[index[name] for name in self.initial_idle]] = True
        return mask

    def idle_mask_at(self, t: float) -> np.ndarray:
        """Bool mask over ``nodes``: idle just after every change at time ``t``."""
        mask = self.initial_mask()
        n = int(np.searchsorted(self.times, t, side="right"))
        if n:
            _apply_last(mask, self.node_ids[:n], self.idle[:n])
        return mask

    def idle_at(self, t: float) -> frozenset[str]:
        """Names of the nodes idle just after every change at time ``t``."""
        names = self.nodes
        return frozenset(names[i] for i in np.flatnonzero(self.idle_mask_at(t)).tolist())

    def window(self, start: float, end: float) -> IdleTimeline:
        """The part in ``[start, end]``, re-based: nodes idle at ``start`` become ``initial_idle``.

        Changes at exactly ``start`` are part of the initial state; changes at
        ``end`` are kept. ``nodes`` (and so ``node_ids``) are unchanged.
        """
        if not (self.start <= start <= end <= self.end):
            raise ValueError(
                f"window [{start}, {end}] is not inside the timeline of {self.source} "
                f"[{self.start}, {self.end}]"
            )
        lo = int(np.searchsorted(self.times, start, side="right"))
        hi = int(np.searchsorted(self.times, end, side="right"))
        mask = self.idle_mask_at(start)
        return replace(
            self,
            start=float(start),
            end=float(end),
            initial_idle=frozenset(self.nodes[i] for i in np.flatnonzero(mask).tolist()),
            times=self.times[lo:hi].copy(),
            node_ids=self.node_ids[lo:hi].copy(),
            idle=self.idle[lo:hi].copy(),
        )

    def shifted(self, offset: float) -> IdleTimeline:
        """The same timeline with every time moved by ``offset`` seconds."""
        return replace(
            self, start=self.start + offset, end=self.end + offset, times=self.times + offset
        )

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


def _check_arrays(
    names: tuple[str, ...],
    mask: np.ndarray,
    t: np.ndarray,
    ids: np.ndarray,
    st: np.ndarray,
    start: float,
    end: float,
) -> None:
    if len(set(names)) != len(names):
        raise ValueError("node names are not unique")
    if mask.shape != (len(names),):
        raise ValueError(f"initial_idle has shape {mask.shape}, expected ({len(names)},)")
    if not (t.shape == ids.shape == st.shape and t.ndim == 1):
        raise ValueError(f"times/node_ids/idle shapes differ: {t.shape}, {ids.shape}, {st.shape}")
    if not (np.isfinite(start) and np.isfinite(end) and start <= end):
        raise ValueError(f"bad span [{start}, {end}]")
    if t.size and not np.all(np.isfinite(t)):
        raise ValueError("times contain NaN or infinity")
    if ids.size and (ids.min() < 0 or ids.max() >= len(names)):
        raise ValueError(f"node_ids outside [0, {len(names)})")


def _apply_last(mask: np.ndarray, ids: np.ndarray, st: np.ndarray) -> None:
    """Set ``mask[node]`` to each node's last reported state in ``(ids, st)``."""
    rev = ids[::-1]
    uniq, first_in_rev = np.unique(rev, return_index=True)
    mask[uniq] = st[::-1][first_in_rev]


def _real_changes(mask: np.ndarray, t: np.ndarray, ids: np.ndarray, st: np.ndarray) -> np.ndarray:
    """Indices (time order) of the reports that change their node's state."""
    n = t.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    by_node = np.argsort(ids, kind="stable")  # time order kept within a node
    i2, t2, s2 = ids[by_node], t[by_node], st[by_node]
    last_at_time = np.ones(n, dtype=bool)
    last_at_time[:-1] = ~((i2[1:] == i2[:-1]) & (t2[1:] == t2[:-1]))
    by_node, i2, s2 = by_node[last_at_time], i2[last_at_time], s2[last_at_time]
    prev = np.empty_like(s2)
    prev[1:] = s2[:-1]
    first = np.ones(i2.shape[0], dtype=bool)
    first[1:] = i2[1:] != i2[:-1]
    prev[first] = mask[i2[first]]
    return np.sort(by_node[s2 != prev])
