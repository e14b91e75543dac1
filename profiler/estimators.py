"""Throughput per node count and rescale costs from a job's stream of records (docs/research.md, Profiler).

Both are incremental (``add`` is O(1) amortised, so the daemon's monitor feeds them every step) and have a batch form.

Throughput: a segment's first record only marks the resume (its interval holds the rescale pause); the next
``warmup_steps`` intervals are warm-up and dropped; the estimate is the **median** of the last ``window`` per-step rates
``samples / (t_i - t_{i-1})`` (robust to a slow checkpoint step), with a distribution-free ~95% interval of the median
from order statistics; ``rel_ci`` is its half-width over the median.

Rescale cost: the gap between the last step at the old size and the first at the new **minus one typical step at the new
size** (that step did useful work), clamped at 0: the wall time lost against running on. The typical step is the median
of the first ``settle_steps`` steps after warm-up there; if the job rescales again before that, whatever steady steps it
had, else the old size's recent median step, else nothing. Scale-up and scale-down costs are kept apart (medians).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from profiler.records import Record, RecordError

# Two-sided ~95% normal quantile, halved: ranks n/2 -/+ Z_HALF*sqrt(n) bound the median.
_Z_HALF = 0.98

Figures = tuple[float, int, float, int]  # an Estimate's rate, n_steps, rel_ci, total_steps (its world size known)


@dataclass(frozen=True)
class Estimate:
    """Throughput at one world size: ``rate`` samples/s from ``n_steps`` recent steps. ``rel_ci`` is the ~95% confidence
    half-width relative to ``rate`` (``inf`` when there are fewer steps than the estimator's ``min_steps``);
    ``total_steps`` counts every step used at this size since the start."""

    world_size: int
    rate: float
    n_steps: int
    rel_ci: float
    total_steps: int


def _median_sorted(xs: list[float]) -> float:
    n = len(xs)
    mid = n // 2
    return xs[mid] if n % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def _median(values: Iterable[float]) -> float:
    return _median_sorted(sorted(values))


def median_ci(values: Iterable[float]) -> tuple[float, float, float]:
    """``(median, low, high)``: a distribution-free ~95% interval of the median. Ranks ``round(n/2 - 0.98 sqrt(n))`` and
    ``round(1 + n/2 + 0.98 sqrt(n))`` (1-based, clamped to the sample) of the sorted values."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci of no values")
    lo, hi = _ci_ranks(n)
    return _median_sorted(xs), xs[lo - 1], xs[hi - 1]


def _ci_ranks(n: int) -> tuple[int, int]:
    """The 1-based ranks of :func:`median_ci`'s bounds among ``n`` values (they depend on ``n`` only)."""
    spread = _Z_HALF * math.sqrt(n)
    return min(n, max(1, round(n / 2 - spread))), min(n, max(1, round(1 + n / 2 + spread)))


class _SizeStats:
    """Per-world-size window of per-step rates (in arrival order and sorted), with a cached estimate."""

    __slots__ = ("rates", "ordered", "total", "figures", "cache")

    def __init__(self, window: int | None) -> None:
        self.rates: deque[float] = deque(maxlen=window)
        # the same rates kept sorted as they come and go: an estimate after every step (the simulated
        # monitor takes one) then reads its median and bounds without sorting the window again
        self.ordered: list[float] = []
        self.total = 0
        self.figures: Figures | None = None  # the estimate's figures, made when first asked after a push
        self.cache: Estimate | None = None

    def push(self, rate: float) -> None:
        rates = self.rates
        if len(rates) == rates.maxlen:  # the oldest leaves the window
            del self.ordered[bisect_left(self.ordered, rates[0])]
        rates.append(rate)
        insort(self.ordered, rate)
        self.total += 1
        self.figures = self.cache = None


class _OrderedStream:
    """Counts records and insists their timestamps strictly increase."""

    _last_ts: float | None = None
    _count: int = 0

    def _advance(self, ts: float) -> float | None:
        """Take a record's timestamp; return the previous one (None for the first)."""
        last = self._last_ts
        if last is not None and not ts > last:
            raise RecordError(f"record #{self._count}: timestamp {ts!r} is not after the previous record's {last!r}")
        self._count += 1
        self._last_ts = ts
        return last

    def add(self, record: Record) -> None:
        raise NotImplementedError

    def extend(self, records: Iterable[Record]) -> None:
        for record in records:
            self.add(record)


class ThroughputEstimator(_OrderedStream):
    """Incremental samples/s per world size from one job's records (see the module doc)."""

    def __init__(self, warmup_steps: int = 2, window: int | None = 64, min_steps: int = 5) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps}")
        if window is not None and window < min_steps:
            raise ValueError(f"window {window} must be >= min_steps {min_steps} (or None for unbounded)")
        self.warmup_steps = warmup_steps
        self.window = window
        self.min_steps = min_steps
        self._stats: dict[int, _SizeStats] = {}
        self._last_ws = 0
        self._seg_pos = 0

    @property
    def world_size(self) -> int:
        """World size of the last record (0 before any)."""
        return self._last_ws

    def add(self, record: Record) -> None:
        """Ingest one record; a timestamp not after the previous one raises :class:`RecordError`."""
        samples, ts, ws = record.samples, record.timestamp, record.world_size
        last = self._advance(ts)
        if ws != self._last_ws:
            self._last_ws = ws
            self._seg_pos = 1
            return
        pos = self._seg_pos
        self._seg_pos = pos + 1
        if pos <= self.warmup_steps:
            return
        stats = self._stats.get(ws)
        if stats is None:
            stats = self._stats[ws] = _SizeStats(self.window)
        stats.push(samples / (ts - last))  # type: ignore[operator]

    def estimate(self, world_size: int) -> Estimate | None:
        """The current estimate at ``world_size``; ``None`` before any step counted there."""
        stats = self._stats.get(world_size)
        if stats is None or not stats.rates:
            return None
        if stats.cache is None:
            stats.cache = Estimate(world_size, *self._figures(stats))
        return stats.cache

    def figures(self, world_size: int) -> Figures | None:
        """:meth:`estimate`'s figures, without making the :class:`Estimate`: a caller that keeps the estimate after
        every record (the simulated monitor) makes only those it reads, ``Estimate(world_size, *figures)``."""
        stats = self._stats.get(world_size)
        if stats is None or not stats.rates:
            return None
        return self._figures(stats)

    def _figures(self, stats: _SizeStats) -> Figures:
        if stats.figures is None:
            stats.figures = self._parts(stats)
        return stats.figures

    def _parts(self, stats: _SizeStats) -> Figures:
        xs = stats.ordered  # the window, sorted
        n = len(xs)
        med = _median_sorted(xs)
        if n >= self.min_steps and med > 0:
            lo, hi = _ci_ranks(n)
            rel = (xs[hi - 1] - xs[lo - 1]) / (2.0 * med)
        else:
            rel = math.inf
        return med, n, rel, stats.total

    def stable(self, world_size: int, rel_ci: float = 0.05) -> bool:
        """At least ``min_steps`` steps and a relative CI half-width ``<= rel_ci``."""
        figures = self.figures(world_size)
        if figures is None:
            return False
        _, n_steps, rel, _ = figures
        return n_steps >= self.min_steps and rel <= rel_ci

    def estimates(self) -> dict[int, Estimate]:
        out: dict[int, Estimate] = {}
        for ws in sorted(self._stats):
            est = self.estimate(ws)
            if est is not None:
                out[ws] = est
        return out

    def rates(self) -> dict[int, float]:
        """World size -> estimated samples/s, for every size with at least one counted step."""
        return {ws: est.rate for ws, est in self.estimates().items()}


def throughput_by_world_size(
    records: Iterable[Record], warmup_steps: int = 2, window: int | None = None, min_steps: int = 5
) -> dict[int, Estimate]:
    """Batch form: every world size's estimate over a recorded stream (unbounded window by default)."""
    est = ThroughputEstimator(warmup_steps=warmup_steps, window=window, min_steps=min_steps)
    est.extend(records)
    return est.estimates()


@dataclass(frozen=True)
class RescaleEvent:
    """A world-size change: ``pause_s`` lost (see the module doc); ``timestamp`` is the last step at the old size,
    ``gap_s`` the raw time from it to the first step at the new size."""

    from_size: int
    to_size: int
    pause_s: float
    timestamp: float
    gap_s: float

    @property
    def is_up(self) -> bool:
        return self.to_size > self.from_size


@dataclass(frozen=True)
class RescaleCosts:
    """Median pause of scale-ups and of scale-downs (``None`` when none was seen)."""

    up_s: float | None
    down_s: float | None
    n_up: int
    n_down: int


def summarize_rescales(events: Iterable[RescaleEvent]) -> RescaleCosts:
    """Median pause per direction over ``events``."""
    summary = RescaleSummary()
    for event in events:
        summary.add(event)
    return summary.costs()


class RescaleSummary:
    """:func:`summarize_rescales` kept up to date one event at a time: each direction's pauses stay
    sorted as events come, so the summary after a new event costs a median, not a sort of them all
    (the simulated monitor asks after every probe)."""

    __slots__ = ("_ups", "_downs", "_costs")

    def __init__(self) -> None:
        self._ups: list[float] = []
        self._downs: list[float] = []
        self._costs: RescaleCosts | None = None  # made once per new event, when asked

    def __len__(self) -> int:
        return len(self._ups) + len(self._downs)

    def add(self, event: RescaleEvent) -> None:
        insort(self._ups if event.is_up else self._downs, event.pause_s)
        self._costs = None

    def costs(self) -> RescaleCosts:
        """The median pause per direction of the events added so far."""
        if self._costs is None:
            ups, downs = self._ups, self._downs
            self._costs = RescaleCosts(_median_sorted(ups) if ups else None,
                                       _median_sorted(downs) if downs else None, len(ups), len(downs))
        return self._costs


@dataclass
class _Pending:
    from_size: int
    to_size: int
    gap_s: float
    at: float
    fallback_step_s: float | None
    steps: list[float] = field(default_factory=list)


class RescaleCostEstimator(_OrderedStream):
    """Incremental rescale pauses from one job's records (see the module doc)."""

    def __init__(self, warmup_steps: int = 2, settle_steps: int = 3) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if settle_steps < 1:
            raise ValueError(f"settle_steps must be >= 1, got {settle_steps}")
        self.warmup_steps = warmup_steps
        self.settle_steps = settle_steps
        self._events: list[RescaleEvent] = []
        self._pending: _Pending | None = None
        self._steady: deque[float] = deque(maxlen=settle_steps)
        self._last_ws = 0
        self._seg_pos = 0

    def add(self, record: Record) -> None:
        """Ingest one record; a timestamp not after the previous one raises :class:`RecordError`."""
        ts, ws = record.timestamp, record.world_size
        last = self._advance(ts)
        if last is None:
            self._last_ws, self._seg_pos = ws, 1
            return
        dt = ts - last
        if ws != self._last_ws:
            self.flush()
            fallback = _median(self._steady) if self._steady else None
            self._pending = _Pending(self._last_ws, ws, dt, last, fallback)
            self._steady.clear()
            self._last_ws, self._seg_pos = ws, 1
            return
        pos = self._seg_pos
        self._seg_pos = pos + 1
        if pos <= self.warmup_steps:
            return
        self._steady.append(dt)
        pending = self._pending
        if pending is not None:
            pending.steps.append(dt)
            if len(pending.steps) >= self.settle_steps:
                self.flush()

    def flush(self) -> None:
        """Close the open rescale now with what is known (the batch form calls it at the end)."""
        p = self._pending
        if p is None:
            return
        self._pending = None
        if p.steps:
            step = _median(p.steps)
        else:
            step = p.fallback_step_s if p.fallback_step_s is not None else 0.0
        pause = max(0.0, p.gap_s - step)
        self._events.append(RescaleEvent(p.from_size, p.to_size, pause, p.at, p.gap_s))

    @property
    def pending(self) -> bool:
        """A rescale has been seen but its pause is not final yet."""
        return self._pending is not None

    def events(self) -> list[RescaleEvent]:
        return list(self._events)

    def costs(self) -> RescaleCosts:
        """Medians over the closed events (an open one is not included; see :meth:`flush`)."""
        return summarize_rescales(self._events)


def rescale_events(records: Iterable[Record], warmup_steps: int = 2, settle_steps: int = 3) -> list[RescaleEvent]:
    """Batch form: every rescale of a recorded stream, in order."""
    est = RescaleCostEstimator(warmup_steps=warmup_steps, settle_steps=settle_steps)
    est.extend(records)
    est.flush()
    return est.events()
