"""A replay window restricted to some nodes of a log (``malletrain simulate --nodes``), the
window a real replay (``benchmarks/bench_real_replay.py``) maps onto the Slurm test cluster."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from traces.model import IdleTimeline


def busiest_idle_nodes(timeline: IdleTimeline, count: int, start: float, end: float) -> tuple[str, ...]:
    """The ``count`` nodes with the most idle node-seconds in ``[start, end]`` (ties: node order)."""
    tl = timeline.window(start, end)
    idle_s = np.zeros(len(tl.nodes))
    state = tl.initial_mask()
    since = np.full(len(tl.nodes), start)
    for t, i, up in zip(tl.times.tolist(), tl.node_ids.tolist(), tl.idle.tolist()):
        if up and not state[i]:
            since[i] = t
        elif not up and state[i]:
            idle_s[i] += t - since[i]
        state[i] = up
    idle_s[state] += end - since[state]
    order = sorted(range(len(tl.nodes)), key=lambda i: (-idle_s[i], i))
    return tuple(tl.nodes[i] for i in order[:count])


def restrict(timeline: IdleTimeline, nodes: int | Sequence[str], start: float | None = None,
             end: float | None = None) -> IdleTimeline:
    """``timeline`` over ``[start, end]`` with only ``nodes`` (a count: :func:`busiest_idle_nodes`)."""
    lo = timeline.start if start is None else start
    hi = timeline.end if end is None else end
    if isinstance(nodes, int):
        if nodes < 1:
            raise ValueError(f"--nodes must be >= 1, got {nodes}")
        names = busiest_idle_nodes(timeline, nodes, lo, hi)
    else:
        names = tuple(nodes)
        unknown = [n for n in names if n not in set(timeline.nodes)]
        if unknown:
            raise ValueError(f"--nodes: {', '.join(unknown[:5])} not in {timeline.source}")
    tl = timeline.window(lo, hi)
    index = {n: i for i, n in enumerate(tl.nodes)}
    keep_ids = np.array([index[n] for n in names], dtype=np.int64)
    new_id = np.full(len(tl.nodes), -1, dtype=np.int64)
    new_id[keep_ids] = np.arange(len(names))
    sel = new_id[tl.node_ids] >= 0
    mask = tl.initial_mask()[keep_ids]
    return IdleTimeline.from_arrays(source=f"{timeline.source} ({len(names)} nodes)", format=tl.format,
                                    nodes=names, start=lo, end=hi, initial_idle=mask, times=tl.times[sel],
                                    node_ids=new_id[tl.node_ids[sel]], idle=tl.idle[sel], notes=tl.notes)
