"""Step an in-process daemon until something holds (the tests' one loop for it)."""

from __future__ import annotations

import time
from typing import Callable

from malletrain.daemon import Daemon


def step_until(d: Daemon, pred: Callable[[], bool], timeout: float, what: str = "timed out",
               check: Callable[[], None] | None = None, detail: Callable[[], str] | None = None) -> None:
    """Run ``d.step()`` (then ``check()``, if given) until ``pred()``; between steps drain the monitor
    for one loop interval. After ``timeout`` s, fail naming ``what``, the runs and ``detail()`` (by
    default the last 12 stored events)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d.step()
        if check is not None:
            check()
        if pred():
            return
        d.monitor.drain(timeout_ms=int(d.cfg.loop_interval * 1000))
    more = detail() if detail is not None else f"events: {list(d.store.events())[-12:]}"
    raise AssertionError(f"{what}; runs: {d.runs}; {more}")
