"""Exact fast path: unconstrained shortcut, Lagrangian reduction, then the DP.

1. If every job's own best count fits in the pool together, that is optimal.
2. Otherwise relax the capacity with a multiplier ``lam >= 0``:
   ``U(lam) = lam*C + sum_j max_k (v_j[k] - lam*k)`` bounds the optimum from
   above for every ``lam``; bisection finds the ``lam`` where the relaxed demand
   crosses ``C`` (on floats, from each row's concave envelope, its ends checked
   on the array). Its feasible side, greedily filled, is an incumbent ``I``.
3. Fixing job ``j`` at count ``k`` lowers the bound by the reduced cost
   ``rc_jk = max_k' (v_j[k'] - lam*k') - (v_j[k] - lam*k)``; if
   ``U - rc_jk < I`` no optimal plan uses ``k`` for ``j``, so it is dropped.
   Jobs with one choice left are fixed; the rest go to the exact DP with each
   job's smallest surviving count taken off the capacity first.

Every step only removes choices that provably cannot be optimal, so the result
is the exact optimum (cross-checked against the MILP, the node x job reference
and brute force in the tests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import itemgetter
from typing import Callable

import numpy as np

from allocator.dp import Item, solve_items
from allocator.values import Envelope, Tables

_BISECT_STEPS = 60
_BISECT_REL = 1e-7  # the bound is valid for any multiplier; this only tightens it (a looser one
# keeps a few more choices for the DP; 1e-10 cost ~10 more bisection steps for nothing the DP noticed)


@dataclass(frozen=True)
class Padded:
    """All jobs' choices in one (jobs x choices) array; missing choices are -inf."""

    counts: np.ndarray  # int64 (J, K), padded with 0
    values: np.ndarray  # float64 (J, K), padded with -inf

    def relaxed(self, lam: float) -> np.ndarray:
        return self.values - lam * self.counts

    def choice(self, lam: float) -> np.ndarray:
        """Each job's best index under ``lam`` (ties: the smaller count)."""
        best: np.ndarray = self.relaxed(lam).argmax(axis=1)
        return best

    def demand(self, idx: np.ndarray) -> int:
        return int(self.counts[np.arange(idx.size), idx].sum())


@dataclass(frozen=True)
class Side:
    """One multiplier's relaxed values, each row's best choice (ties: the smaller count), its value
    and the total demand: computed once and read by the bracket, the incumbent and the bound."""

    lam: float
    relaxed: np.ndarray  # values - lam * counts
    idx: np.ndarray  # each row's best index
    rowmax: np.ndarray  # each row's best relaxed value
    chosen: np.ndarray  # each row's chosen count
    demand: int  # the chosen counts' sum

    def bound(self, capacity: int) -> float:
        """The Lagrangian bound ``lam * capacity + sum of the row maxima`` at this multiplier."""
        return float(self.lam * capacity + self.rowmax.sum())


def side_at(pad: Padded, lam: float, rows: np.ndarray | None = None) -> Side:
    """The :class:`Side` of ``pad`` at multiplier ``lam``."""
    if rows is None:
        rows = np.arange(pad.counts.shape[0])
    relaxed = pad.relaxed(lam)
    idx = relaxed.argmax(axis=1)
    chosen = pad.counts[rows, idx]
    return Side(lam, relaxed, idx, relaxed[rows, idx], chosen, int(chosen.sum()))


def sides_at(pad: Padded, lo: float, hi: float, rows: np.ndarray) -> tuple[Side, Side]:
    """``(side_at(pad, lo), side_at(pad, hi))`` from one (2, jobs, choices) array: the same
    element-wise operations, half the numpy calls."""
    relaxed = pad.values - np.array([lo, hi])[:, None, None] * pad.counts
    idx = relaxed.argmax(axis=2)
    rowmax = relaxed[np.arange(2)[:, None], rows, idx]  # each side's row maxima
    chosen = pad.counts[rows, idx]
    demand = chosen.sum(axis=1).tolist()
    return (Side(lo, relaxed[0], idx[0], rowmax[0], chosen[0], demand[0]),
            Side(hi, relaxed[1], idx[1], rowmax[1], chosen[1], demand[1]))


def solve_fast(tables: Tables, capacity: int) -> list[int]:
    """Chosen index into each job's table; exact optimum of the multiple-choice knapsack."""
    if not len(tables):
        return []
    rows = np.arange(len(tables))
    # each row's first best count needs no more than its preferred best (the current count, when it
    # ties, is above the first): when the first ones overflow, so do the preferred (most decisions)
    if int(tables.counts[rows, tables.values.argmax(axis=1)].sum()) <= capacity:
        picks = tables.preferred_best()
        if int(tables.counts[rows, picks].sum()) <= capacity:
            chosen: list[int] = picks.tolist()
            return chosen
    pad = Padded(tables.counts, tables.values)
    # the finite mask is computed once here and shared by both sides
    finite = np.isfinite(pad.values)
    lo, hi = _bracket_sides(pad, capacity, tables.envelopes, rows, finite)
    incumbent, inc_value = _incumbent(pad, capacity, lo, hi, rows)
    bound_hi, bound_lo = hi.bound(capacity), lo.bound(capacity)
    side, bound = (hi, bound_hi) if bound_hi <= bound_lo else (lo, bound_lo)
    # fixing (job, choice) lowers the bound at the side's multiplier by this much (its reduced cost)
    reduced = side.rowmax[:, None] - side.relaxed
    tol = 1e-9 * max(1.0, abs(bound), float(np.abs(pad.values[finite]).max(initial=0.0)))
    # Keep every choice within the proven gap (the incumbent always survives).
    keep = finite & (reduced <= bound - inc_value + tol)
    keep[rows, incumbent] = True
    final = _solve_reduced(tables, keep, capacity)
    if final is None:  # pragma: no cover - the incumbent is feasible and kept
        raise AssertionError("reduced problem lost the incumbent")
    return final


def solve_full_dp(tables: Tables, capacity: int) -> list[int]:
    """The plain vectorised DP over all allowed counts (no reduction)."""
    items = [Item(t.counts.tolist(), t.values.tolist(), t.preference().tolist()) for t in tables.all()]
    picks, _ = solve_items(items, capacity)
    return picks


def _bracket(pad: Padded, capacity: int, envelopes: tuple[Envelope, ...] | None = None) -> tuple[float, float]:
    """``lo`` with demand > capacity, ``hi`` with demand <= capacity, close together, by bisection.

    With the rows' ``envelopes`` the demand at a multiplier is known without the array: it exceeds
    the capacity exactly below one multiplier (:func:`_threshold`), so the bisection runs on floats
    alone and its ends are checked on the array once; where they disagree (rounding at a tie), the
    bisection runs on the array."""
    lo, hi = _bracket_sides(pad, capacity, envelopes)
    return lo.lam, hi.lam


def _bracket_sides(pad: Padded, capacity: int, envelopes: tuple[Envelope, ...] | None,
                   rows: np.ndarray | None = None, finite: np.ndarray | None = None) -> tuple[Side, Side]:
    """:func:`_bracket`, with what the array says at both ends."""
    start = _all_idle_multiplier(pad, finite)
    if envelopes is not None:
        over = _threshold(envelopes, capacity)
        lo, hi = _bisect(start, over.__gt__)  # lam < over, without a Python frame per step
        if rows is None:
            rows = np.arange(pad.counts.shape[0])
        lo_side, hi_side = sides_at(pad, lo, hi, rows)
        if hi_side.demand <= capacity and (lo == 0.0 or lo_side.demand > capacity):
            return lo_side, hi_side
    lo, hi = _bisect(start, lambda lam: pad.demand(pad.choice(lam)) > capacity)
    return side_at(pad, lo, rows), side_at(pad, hi, rows)


def _bisect(start: float, over: Callable[[float], bool]) -> tuple[float, float]:
    """Bisection from ``[0, start]`` for where ``over`` (demand > capacity) turns false."""
    lo, hi = 0.0, start
    while over(hi):  # only if rounding defeated the estimate
        lo, hi = hi, 2.0 * hi + 1.0
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        if hi - lo <= _BISECT_REL * hi or not lo < mid < hi:
            break
        if over(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _threshold(envelopes: tuple[Envelope, ...], capacity: int) -> float:
    """The multiplier below which the rows' choices need more than ``capacity`` (-inf: never): the
    slope of the segment, in falling order over all rows, at which the steps first sum past it
    (plain floats: a few dozen segments cost less than the arrays would)."""
    segments = [seg for e in envelopes for seg in zip(e.slopes, e.steps)]
    if sum(step for _, step in segments) <= capacity:
        return -math.inf
    # by slope alone (C-level key, no tuple compares); equal slopes may come in any order: the slope
    # where the sum passes the capacity is the same
    segments.sort(key=itemgetter(0), reverse=True)
    need = 0
    for slope, step in segments:
        need += step
        if need > capacity:
            return slope
    raise AssertionError("unreachable: the steps sum past the capacity")  # pragma: no cover


def _all_idle_multiplier(pad: Padded, finite: np.ndarray | None = None) -> float:
    """A multiplier at which every job prefers 0 nodes: its steepest slope from 0, plus a margin."""
    # Column 0 is count 0 and padding (count 0) holds -inf, so the slopes of columns 1.. over their
    # counts (padding divided by 1 gives -inf) have the same maximum with 0 when all is finite; a
    # non-finite maximum (an infinite value in the table) takes the masked way.
    vals = pad.values
    slopes = (vals[:, 1:] - vals[:, :1]) / np.maximum(pad.counts[:, 1:], 1)
    top = float(slopes.max(initial=0.0))
    if not math.isfinite(top):
        running = pad.counts > 0
        if finite is None:
            finite = np.isfinite(vals)
        gain = np.where(running & finite, vals - vals[:, :1], 0.0)
        top = float((gain / np.where(running, pad.counts, 1)).max(initial=0.0))
    return top * (1.0 + 1e-9) + 1e-9


def _incumbent(pad: Padded, capacity: int, lo: Side, hi: Side, rows: np.ndarray) -> tuple[np.ndarray, float]:
    """A feasible choice vector: ``hi``'s choice, greedily moved toward ``lo``'s."""
    idx = hi.idx.copy()
    room = capacity - hi.demand
    alt = lo.idx
    cur_n = hi.chosen.copy()
    cur_v = pad.values[rows, idx]
    extra = lo.chosen - cur_n
    gain = pad.values[rows, alt] - cur_v
    movers = ((extra > 0) & (gain > 0)).nonzero()[0]
    if movers.size:
        order = movers[(-gain[movers] / extra[movers]).argsort(kind="stable")]
        for j in order.tolist():
            if extra[j] <= room:
                idx[j] = alt[j]
                cur_n[j] = lo.chosen[j]
                cur_v[j] = pad.values[j, alt[j]]
                room -= int(extra[j])
    idx, room = _fill(pad, idx, room, cur_n, cur_v)
    return idx, float(cur_v.sum())  # cur_v is pad.values[rows, idx], kept up to date by the moves


def _fill(pad: Padded, idx: np.ndarray, room: int, cur_n: np.ndarray, cur_v: np.ndarray,
          rounds: int = 8) -> tuple[np.ndarray, int]:
    """Apply the single best improving move that fits, a few times. ``cur_n`` / ``cur_v`` (the
    counts and values at ``idx``) are updated in place with the moves."""
    for _ in range(rounds):
        if room <= 0:
            break
        fits = pad.counts - cur_n[:, None] <= room
        gain = np.where(fits, pad.values - cur_v[:, None], -np.inf)
        flat = int(gain.argmax())
        j, k = divmod(flat, gain.shape[1])
        if not gain[j, k] > 0:
            break
        room -= int(pad.counts[j, k] - cur_n[j])
        idx[j] = k
        cur_n[j] = pad.counts[j, k]
        cur_v[j] = pad.values[j, k]
    return idx, room


def _solve_reduced(tables: Tables, keep: np.ndarray, capacity: int) -> list[int] | None:
    """Fix jobs with one surviving choice; DP over the rest above their smallest survivor.

    ``None`` if the surviving choices cannot fit (only possible without the incumbent).
    """
    # every surviving (row, choice) at once, row by row, choices ascending; then plain lists (a few
    # dozen survivors cost less in Python than a dozen more numpy calls on the small arrays)
    at, live_arr = keep.nonzero()
    alive = np.bincount(at, minlength=len(tables)).tolist()
    counts, values = tables.counts[at, live_arr].tolist(), tables.values[at, live_arr].tolist()
    live_all = live_arr.tolist()
    picks: list[int] = []
    spans: list[tuple[int, int, int]] = []  # (row, start, end) of the rows with several survivors
    room = capacity
    start = 0
    for j, n in enumerate(alive):
        if n:  # the first survivor (none: the row's count 0, as an argmax over no survivor gives)
            picks.append(live_all[start])
            room -= counts[start]
            if n > 1:
                spans.append((j, start, start + n))
            start += n
        else:
            picks.append(0)
    if room < 0:
        return None
    if spans:
        current_index = tables.current_index
        items: list[Item] = []
        for j, start, end in spans:
            live, ws = live_all[start:end], counts[start:end]
            items.append(Item([w - ws[0] for w in ws], values[start:end],
                              _live_preference(live, int(current_index[j]))))
        span = sum(it.weights[-1] for it in items)
        chosen, _ = solve_items(items, min(room, span))
        for (j, start, _end), c in zip(spans, chosen):
            picks[j] = live_all[start + c]
    return picks


def _live_preference(live: list[int], current: int) -> list[int]:
    """Tie-break order over the surviving choices: the current count first, then ascending."""
    order = list(range(len(live)))
    if current <= 0 or current not in live:
        return order
    at = live.index(current)
    return [at] + order[:at] + order[at + 1:]
