"""The tests' one way to wait: :func:`poll` until something holds (a safety net against a hang, never a
timing assertion), :func:`wait_until` that fails naming what it waited for, and :func:`step_until` for an
in-process daemon (step its loop between looks)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:
    from malletrain.daemon import Daemon


T = TypeVar("T")


def poll(pred: Callable[[], T], timeout: float, tick: Callable[[], object] | None = None,
         pause: float = 0.05) -> T:
    """``pred()``'s first true value, looking after each ``tick()`` (drain a socket, poll a process), then
    sleeping ``pause`` s between looks. After ``timeout`` s, ``pred()``'s last (false) value."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            tick()
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        if pause:
            time.sleep(pause)


def wait_until(pred: Callable[[], T], what: str, timeout: float = 30.0, tick: Callable[[], object] | None = None,
               pause: float = 0.05) -> T:
    """:func:`poll`, failing with an AssertionError naming ``what`` when ``pred()`` is still false."""
    value = poll(pred, timeout, tick, pause)
    if not value:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return value


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
