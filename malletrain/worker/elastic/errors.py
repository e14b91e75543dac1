"""The elastic layer's control-flow exceptions and how a failure is classified."""

from __future__ import annotations

import sys
from typing import Any

from contract.exits import EXIT_STORE_LOST  # noqa: F401  (the package exports it)
from contract.wire import StoreConnectionLost


_FAILURE_MARKERS = ("gloo", "connection reset", "connection closed", "connection refused", "broken pipe", "timed out",
                    "timeout")
_STORE_LOSS_MARKERS = ("broken pipe", "connection reset", "connection was likely closed", "connection refused",
                       "failed to recv")


class LeaveJob(Exception):
    """This worker is not a member of the job's new generation: it leaves cleanly."""


class Rescaled(Exception):
    """Raised by :meth:`State.commit` after a switch to a new world; :func:`run` restarts the training function."""


class StoreUnavailable(Exception):
    """The daemon's store is away right now (only raised by operations that must not block)."""


def _dist() -> Any:
    """``torch.distributed`` if this process imported it, else None (the rank agent never imports torch)."""
    return sys.modules.get("torch.distributed")


class StoreLost(Exception):
    """The daemon's store stayed away longer than the grace period: the worker exits."""


def is_store_loss(exc: BaseException) -> bool:
    """Whether a store operation failed because the store's connection is gone (not a timeout)."""
    dist = _dist()
    if isinstance(exc, StoreConnectionLost) or (dist is not None and isinstance(exc, dist.DistNetworkError)):
        return True
    if isinstance(exc, RuntimeError) and not (dist is not None and isinstance(exc, dist.DistStoreError)):
        text = str(exc).lower()
        return any(m in text for m in _STORE_LOSS_MARKERS)
    return False


def is_comm_failure(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a lost peer (gloo error, timeout, distributed error)."""
    if isinstance(exc, (LeaveJob, Rescaled, StoreLost, StoreUnavailable)):
        return False
    dist = _dist()
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if dist is not None and isinstance(cur, dist.DistError):
            return True
        if isinstance(cur, RuntimeError):
            text = str(cur).lower()
            if any(m in text for m in _FAILURE_MARKERS):
                return True
        cur = cur.__cause__ or cur.__context__
    return False


def drop_frames(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and of the exceptions it was raised from or during (their frames,
    and what those hold, are freed: e.g. a training function's DDP model and its gloo group)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of ``exc``'s message, shortened, for a log line."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:limit]
