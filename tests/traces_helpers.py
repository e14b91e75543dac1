"""Checks shared by the traces tests."""

from __future__ import annotations

import functools

import numpy as np

import traces
from traces import IdleTimeline


def assert_alternating(tl: IdleTimeline) -> None:
    """Every event changes its node's state: no node becomes idle (or is recalled) twice in a row."""
    assert np.all(np.diff(tl.times) >= 0), "events not sorted by time"
    assert np.all((tl.times > tl.start) & (tl.times <= tl.end)), "event outside (start, end]"
    order = np.argsort(tl.node_ids, kind="stable")
    ids, st = tl.node_ids[order], tl.idle[order]
    same = ids[1:] == ids[:-1]
    assert not np.any(same & (st[1:] == st[:-1])), "a node changed to the state it was in"
    first = np.ones(ids.shape[0], dtype=bool)
    first[1:] = ~same
    mask = tl.initial_mask()
    assert np.all(st[first] != mask[ids[first]]), "a node's first event repeats its initial state"


# Each real log is parsed once per test session, whichever module asks first.
read_cached = functools.lru_cache(maxsize=None)(traces.read)
