"""One job-monitor record: a training step finished. The daemon's job monitor turns each ``report(samples)`` line of a
training loop into a :class:`Record`; the simulator synthesises the same stream. A record says "a step that processed
``samples`` samples (the global batch) finished at ``timestamp`` while the job ran on ``world_size`` nodes"."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Iterator, Sequence


class RecordError(ValueError):
    """A record that cannot be used; the message names the field and the value."""


_INF = math.inf


@dataclass(frozen=True, slots=True)
class Record:
    """A finished training step: global batch ``samples`` at ``timestamp`` (s) on ``world_size`` nodes."""

    samples: int
    timestamp: float
    world_size: int

    def __post_init__(self) -> None:
        # a monitor makes one per training step: the common case, every value well typed, is passed by one
        # expression (in the order of the full checks, which anything else goes through to be named)
        samples, ts, ws = self.samples, self.timestamp, self.world_size
        if (type(samples) is int and samples >= 1 and type(ws) is int and ws >= 1
                and type(ts) is float and -_INF < ts < _INF):
            return
        if not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 1:
            raise RecordError(f"record samples must be an int >= 1, got {self.samples!r}")
        if not isinstance(self.world_size, int) or isinstance(self.world_size, bool) or self.world_size < 1:
            raise RecordError(f"record world_size must be an int >= 1, got {self.world_size!r}")
        if not isinstance(self.timestamp, (int, float)) or not math.isfinite(self.timestamp):
            raise RecordError(f"record timestamp must be a finite number, got {self.timestamp!r}")


@dataclass(frozen=True)
class Segment:
    """A run of steps at one world size for :func:`synthesize`. The segment's first step ends ``pause_before_s +
    step_s`` after the previous segment's last step (or after ``start``); the next ``warmup_steps`` steps take ``step_s
    * warmup_factor``; the rest take ``step_s``."""

    world_size: int
    steps: int
    step_s: float
    samples: int
    pause_before_s: float = 0.0
    warmup_steps: int = 0
    warmup_factor: float = 3.0

    def __post_init__(self) -> None:
        if self.steps < 1 or not (self.step_s > 0) or self.pause_before_s < 0 or not (self.warmup_factor > 0):
            raise RecordError(f"bad segment {self!r}: need steps >= 1, step_s > 0, pause >= 0, warmup_factor > 0")


def synthesize(segments: Sequence[Segment], start: float = 0.0, noise: float = 0.0, seed: int = 0) -> list[Record]:
    """A deterministic record stream (tests, the simulator): step times times ``U(1-noise, 1+noise)``
    drawn from ``random.Random(seed)``."""
    _check_noise(noise)
    return list(iter_records(segments, start, noise, seed))


def iter_records(
    segments: Sequence[Segment], start: float = 0.0, noise: float = 0.0, seed: int = 0
) -> Iterator[Record]:
    """:func:`synthesize`'s stream one record at a time: a consumer that stops early (the simulated
    monitor, once an estimate is stable) draws nothing more; what it does draw is the same."""
    _check_noise(noise)
    draw = random.Random(seed).random
    low, span = 1.0 - noise, (1.0 + noise) - (1.0 - noise)  # U(low, low + span), as Random.uniform makes it
    t = start
    for seg in segments:
        step_s, samples, world_size = seg.step_s, seg.samples, seg.world_size
        for i in range(seg.steps):
            dt = step_s * (seg.warmup_factor if 1 <= i <= seg.warmup_steps else 1.0)
            if noise:
                dt *= low + span * draw()
            t += dt + (seg.pause_before_s if i == 0 else 0.0)
            yield Record(samples, t, world_size)


def _check_noise(noise: float) -> None:
    if not 0.0 <= noise < 1.0:
        raise RecordError(f"noise must be in [0, 1), got {noise}")
