"""Summary figures of an idle-node timeline, and its idle fragments.

A fragment is one maximal idle period of one node: from becoming idle to
being recalled. Fragments cut by the start or end of the timeline are
censored (their true length is unknown); they are left out unless asked for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from traces.model import IdleTimeline

PERCENTILES = (10, 50, 90, 99)


@dataclass(frozen=True)
class TraceStats:
    """Figures of one timeline; lengths in seconds, ``nan`` when there are no fragments."""

    nodes: int
    span_s: float
    mean_idle: float  # time-weighted mean number of idle nodes
    peak_idle: int
    idle_fraction: float  # mean_idle / nodes
    fragments: int  # complete fragments (not cut by the span)
    fragment_p10_s: float
    fragment_p50_s: float
    fragment_p90_s: float
    fragment_p99_s: float
    events_per_hour: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def fragment_lengths(tl: IdleTimeline, *, censored: bool = False) -> np.ndarray:
    """Lengths (s) of the idle fragments, in node then time order (``censored``: those cut by the
    span too, measured from ``start`` or to ``end``)."""
    order = np.argsort(tl.node_ids, kind="stable")
    ids, t, st = tl.node_ids[order], tl.times[order], tl.idle[order]
    same_next = np.zeros(ids.shape[0], dtype=bool)
    same_next[:-1] = ids[1:] == ids[:-1]
    # Events alternate per node, so an idle event followed by one of the same node ends a fragment.
    opened = np.flatnonzero(st & same_next)
    lengths = t[opened + 1] - t[opened]
    if not censored:
        return lengths
    first = np.ones(ids.shape[0], dtype=bool)
    first[1:] = ~same_next[:-1]
    head = t[first & ~st] - tl.start  # idle at start, first event recalls
    tail = tl.end - t[st & ~same_next]  # becomes idle, never recalled
    mask = tl.initial_mask()
    quiet = np.ones(tl.n_nodes, dtype=bool)
    quiet[ids] = False
    whole = np.full(int(np.count_nonzero(mask & quiet)), tl.span)
    return np.concatenate((lengths, head, tail, whole))


def trace_stats(tl: IdleTimeline) -> TraceStats:
    span = tl.span
    mean_idle = tl.idle_node_seconds() / span if span > 0 else float(len(tl.initial_idle))
    _, counts = tl.idle_counts()
    frags = fragment_lengths(tl)
    pct = np.percentile(frags, PERCENTILES) if frags.size else np.full(len(PERCENTILES), np.nan)
    return TraceStats(
        nodes=tl.n_nodes,
        span_s=float(span),
        mean_idle=float(mean_idle),
        peak_idle=int(counts.max()),
        idle_fraction=float(mean_idle / tl.n_nodes) if tl.n_nodes else 0.0,
        fragments=int(frags.size),
        fragment_p10_s=float(pct[0]),
        fragment_p50_s=float(pct[1]),
        fragment_p90_s=float(pct[2]),
        fragment_p99_s=float(pct[3]),
        events_per_hour=float(tl.n_events / (span / 3600)) if span > 0 else 0.0,
    )
