"""The simulator's injected clock and its event heap. Events are ordered by ``(time, priority, seq)``: equal times break
on the priority of the event kind, then on insertion order, so a replay is deterministic. Nothing here reads the wall
clock."""

from __future__ import annotations

import enum
import heapq
from typing import Generic, TypeVar

T = TypeVar("T")


class SimClock:
    """Simulated time in seconds; only moves forward, only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"clock cannot go back from {self._now} to {t}")
        self._now = float(t)


class Priority(enum.IntEnum):
    """Order of event kinds at one timestamp (lower first)."""

    COMPLETION = 0  # a job finishing frees its nodes and its slot first
    TRACE = 1  # then the batch of node changes at that time
    ARRIVAL = 2  # then jobs that arrive
    DECIDE = 3  # a deferred decision (when decisions are rate-limited)
    END = 4  # the end of the replay window, after everything else at that time


_PRIORITIES: dict[int, Priority] = {int(p): p for p in Priority}  # int -> Priority


class EventQueue(Generic[T]):
    """A heap of ``(time, priority, seq, payload)`` with deterministic ties."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, T]] = []
        self._seq = 0

    def push(self, time: float, priority: Priority, payload: T) -> None:
        heapq.heappush(self._heap, (float(time), int(priority), self._seq, payload))
        self._seq += 1

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, Priority, T]:
        t, p, _, payload = heapq.heappop(self._heap)
        return t, _PRIORITIES[p], payload

    def __len__(self) -> int:
        return len(self._heap)
