"""The client API: the one line in the user's training loop.

.. code-block:: python

    from malletrain.worker.client import report
    ...
    report(global_batch_size)        # once per training step

``report`` sends a signed :class:`contract.messages.Report` from rank 0 to the job monitor at
``MALLETRAIN_MONITOR`` over a ZeroMQ PUSH socket that never blocks (a full queue drops the report).
Without ``MALLETRAIN_MONITOR`` it does nothing. Rank, world size and generation come from the elastic
layer (:func:`set_context`), else from ``RANK``/``WORLD_SIZE`` and the like. No torch here.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from contract.messages import Report, secret_key
from contract.workerenv import (ENV_INCARNATION, ENV_JOB, ENV_JOB_SECRET, ENV_MONITOR, ENV_TRIAL_RESULT,
                                ENV_TRIAL_STEPS, ENV_WORKER)

SEND_HWM = 1000
"""Frames the PUSH socket queues before reports are dropped."""

LINGER_MS = 1000
"""How long exit waits to flush queued reports."""

_RANK_VARS = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_WORLD_VARS = ("WORLD_SIZE", "HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_INCARNATION_VARS = (ENV_INCARNATION, "TORCHELASTIC_RESTART_COUNT")
_GENERATION_VARS = ("MALLETRAIN_GENERATION", "TORCHELASTIC_RESTART_COUNT")
"""A report's generation without the elastic layer: the daemon's number of the world the process was
started in (the torchrun launcher's rank agent sets it), else torchrun's restart count."""


@dataclass(frozen=True)
class Context:
    """Where this process stands in its job: set by the elastic layer at each (re)join."""

    rank: int
    world_size: int
    generation: int
    per_node: int = 1
    """Ranks a node runs (its K worker slots): reports count nodes, the policy's unit."""

    @property
    def nodes(self) -> int:
        """The nodes of the world: what a report's ``world_size`` says (the monitor and the policy count nodes)."""
        return max(1, self.world_size // self.per_node)


_context: Context | None = None
_script_reports = False  # True once report() ran or a callback claimed the reports (malletrain.worker.launch)


def set_context(rank: int, world_size: int, generation: int, per_node: int = 1) -> None:
    """Tell :func:`report` the current rank, world size (ranks), generation and ranks a node (elastic layer)."""
    global _context
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad context: rank {rank} of world size {world_size}")
    if per_node < 1 or world_size % per_node:
        raise ValueError(f"bad context: {per_node} ranks a node in a world of {world_size}")
    _context = Context(rank, world_size, generation, per_node)


def context() -> Context:
    """The current context: from the elastic layer, else from the environment (under torchrun the
    generation is ``TORCHELASTIC_RESTART_COUNT``: each restart at a new size is a new world)."""
    if _context is not None:
        return _context
    world, per_node = max(1, _env_int(_WORLD_VARS, 1)), max(1, _env_int(("LOCAL_WORLD_SIZE",), 1))
    return Context(_env_int(_RANK_VARS, 0), world, _env_int(_GENERATION_VARS, 0),
                   per_node if world % per_node == 0 else 1)


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        text = os.environ.get(name)
        if text is None:
            continue
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"environment variable {name}={text!r} is not an integer") from None
    return default


class Reporter:
    """A non-blocking PUSH connection to one monitor address, for one job and worker; frames signed with
    ``secret`` (default: ``$MALLETRAIN_JOB_SECRET``; none: unsigned, which the monitor rejects)."""

    def __init__(self, address: str, job: str, worker: str = "", secret: str | None = None,
                 incarnation: int = 0) -> None:
        import zmq

        if not address:
            raise ValueError("monitor address is empty")
        if secret is None:
            secret = os.environ.get(ENV_JOB_SECRET) or None
        self._key = None if secret is None else secret_key(secret)
        self.address = address
        self.job = job
        self.worker = worker
        self.incarnation = incarnation  # which start of the worker's process: (worker, incarnation) is the sender
        self.seq = 0
        self.sent = 0
        self.dropped = 0
        self._zmq = zmq
        self._ctx = zmq.Context.instance()
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        sock.setsockopt(zmq.IMMEDIATE, 0)
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise ValueError(f"{ENV_MONITOR}={address!r}: cannot connect: {exc}") from None
        self._sock: Any = sock
        self._lock = threading.Lock()

    def send(self, samples: int, world_size: int, generation: int, timestamp: float | None = None) -> bool:
        """Queue one report; False if it was dropped (queue full or closed)."""
        with self._lock:
            if self._sock is None:
                self.dropped += 1
                return False
            self.seq += 1
            frame = Report(job=self.job, seq=self.seq, samples=samples,
                           timestamp=time.time() if timestamp is None else timestamp, world_size=world_size,
                           generation=generation, worker=self.worker, incarnation=self.incarnation).encode(self._key)
            try:
                self._sock.send(frame, self._zmq.NOBLOCK)
            except self._zmq.Again:
                self.dropped += 1
                return False
            self.sent += 1
            return True

    def close(self, linger_ms: int = LINGER_MS) -> None:
        """Flush for at most ``linger_ms`` and close; idempotent."""
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger_ms)
                self._sock = None


_reporter: Reporter | None = None
_reporter_lock = threading.Lock()


def incarnation() -> int:
    """Which start of its worker this process is (``MALLETRAIN_INCARNATION``, else
    ``TORCHELASTIC_RESTART_COUNT``, else 0): a restarted process's ``seq`` starts again from 1."""
    return _env_int(_INCARNATION_VARS, 0)


def reporter() -> Reporter | None:
    """The process's reporter, created on first use from the environment (None if no monitor)."""
    global _reporter
    with _reporter_lock:
        if _reporter is None:
            address = os.environ.get(ENV_MONITOR, "")
            if not address:
                return None
            _reporter = Reporter(address, os.environ.get(ENV_JOB, ""), os.environ.get(ENV_WORKER, ""),
                                 incarnation=incarnation())
            atexit.register(_reporter.close)
        return _reporter


@dataclass(frozen=True)
class HeldReport:
    """A report made since the last commit, sent only once the step it counts is committed."""

    samples: int
    world_size: int
    generation: int
    timestamp: float


_held: list[HeldReport] | None = None  # None: reports go out at once
_held_lock = threading.RLock()  # a SIGTERM handler drops held reports, maybe while report() holds it


def hold_reports() -> None:
    """From now on :func:`report` keeps reports until :func:`release_reports` (the elastic layer
    holds them between commits, so a rolled-back step is never counted)."""
    global _held
    with _held_lock:
        if _held is None:
            _held = []


def release_reports() -> int:
    """Send the held reports (a commit made their steps permanent); returns how many were sent."""
    with _held_lock:
        if not _held:
            return 0
        pending = list(_held)
        _held.clear()
    rep = reporter()
    if rep is None:
        return 0
    return sum(rep.send(h.samples, h.world_size, h.generation, h.timestamp) for h in pending)


def drop_held_reports() -> int:
    """Forget the held reports (their steps were rolled back); returns how many."""
    with _held_lock:
        if not _held:
            return 0
        n = len(_held)
        _held.clear()
        return n


def claim_reports() -> None:
    """Say that this process reports its own progress (a callback of :mod:`malletrain.worker.integrations`
    calls it when training starts): :mod:`malletrain.worker.launch`'s optimizer-step count stops."""
    global _script_reports
    _script_reports = True


def script_reports() -> bool:
    """True once :func:`report` was called or :func:`claim_reports` was (on any rank)."""
    return _script_reports


def report(samples: int, *, world_size: int | None = None, rank: int | None = None) -> bool:
    """Report one finished training step of ``samples`` (the global batch size); non-blocking. True if a
    report was queued (only rank 0 reports). The first call stops :mod:`malletrain.worker.launch`'s count."""
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise ValueError(f"report(samples={samples!r}): samples must be an int >= 0 (the global batch size)")
    claim_reports()
    ctx = context()
    if (ctx.rank if rank is None else rank) != 0:
        return False
    world = ctx.nodes if world_size is None else world_size
    with _held_lock:
        if _held is not None:
            if os.environ.get(ENV_MONITOR, ""):
                _held.append(HeldReport(samples, world, ctx.generation, time.time()))
                return True
            return False
    rep = reporter()
    if rep is None:
        return False
    return rep.send(samples, world, ctx.generation)


def close(linger_ms: int = LINGER_MS) -> None:
    """Flush the queued reports (for at most ``linger_ms``) and close the reporter."""
    global _reporter
    with _reporter_lock:
        if _reporter is not None:
            _reporter.close(linger_ms)
        _reporter = None


def reset() -> None:
    """Close the reporter, forget the context and the claim, stop holding reports (tests; a forked child)."""
    global _reporter, _context, _held, _script_reports
    with _reporter_lock:
        if _reporter is not None:
            _reporter.close(0)
        _reporter = None
    _context = None
    _script_reports = False
    with _held_lock:
        _held = None


# ---------------------------------------------------------------- sweep trials
def trial_result(value: float) -> bool:
    """A sweep trial's value, the one line a trial needs: writes ``{"value": value}`` to the file
    ``MALLETRAIN_TRIAL_RESULT`` names (whole or not at all: a temporary file renamed). Only rank 0
    writes; returns False on other ranks and outside a sweep (the variable unset)."""
    _check_finite(f"trial_result({value!r})", value)
    path = os.environ.get(ENV_TRIAL_RESULT, "")
    if not path or _rank() != 0:
        return False
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"value": float(value)}, fh)
    os.replace(tmp, path)
    return True


def trial_report(step: int, value: float) -> bool:
    """An intermediate value of a sweep trial at ``step`` (for the sweep's pruner): one JSON line
    appended to ``MALLETRAIN_TRIAL_STEPS``. The daemon stops a trial its pruner prunes. Only rank 0
    writes; returns False on other ranks and outside a sweep."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"trial_report(step={step!r}): step must be an int >= 0")
    _check_finite(f"trial_report(value={value!r})", value)
    path = os.environ.get(ENV_TRIAL_STEPS, "")
    if not path or _rank() != 0:
        return False
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, "value": float(value)}) + "\n")
    return True


def _check_finite(call: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{call}: the value must be a finite number")


def _rank() -> int:
    """This process's rank: the elastic layer's context if set, else the launcher's variables, else 0."""
    if _context is not None:
        return _context.rank
    return _env_int(_RANK_VARS, 0)
