"""The K processes one worker runs on its node, which start and end together.

A worker runs one process per slot it uses (local ranks 0 .. K-1, placed by
:func:`spawner.slots.slot_place`); both spawners (the node agent and the ``torchrun`` launcher's rank
agent) keep them as one :class:`LocalRanks`: one that cannot start ends those started, the first
that fails is the worker's failure, and a stop is SIGTERM, then SIGKILL after the grace. How a
signal reaches a process is the spawner's ``send`` (the node agent signals each process's group).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Generic, Protocol, TypeVar


class Proc(Protocol):
    """A started process: a ``subprocess.Popen``, or a warm server's fork that is polled like one."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


P = TypeVar("P", bound=Proc)


def send_to_process(proc: Proc, sig: int) -> None:
    """``sig`` to ``proc`` itself (gone already: nothing to do)."""
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass


def exit_status(returncode: int) -> int:
    """A child's return code as a process exit status (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def pin_cores(cores: tuple[int, ...], then: Callable[[], None]) -> Callable[[], None]:
    """A ``preexec_fn`` that pins the process to ``cores`` (its slot's share), then runs ``then``."""
    def setup() -> None:
        if cores:
            os.sched_setaffinity(0, cores)
        then()
    return setup


@dataclass
class LocalRanks(Generic[P]):
    """One worker's processes on its node, local rank 0 first (see the module doc)."""

    procs: list[P]
    send: Callable[[P, int], None] = send_to_process
    failed: int | None = None
    """The return code of the first of them that failed (None: none has)."""
    kill_at: float | None = None
    """When those still running after a stop get SIGKILL (None: not stopped; inf: killed once)."""
    seen: dict[int, int] = field(default_factory=dict)
    """Local rank -> its return code, for those that exited."""
    told: set[int] = field(default_factory=set)
    """The local ranks whose exit :meth:`exits` returned."""

    @classmethod
    def start(cls, count: int, start_one: Callable[[int], P],
              send: Callable[[P, int], None] = send_to_process) -> LocalRanks[P]:
        """Local ranks 0 .. ``count``-1, each started by ``start_one(local_rank)``; one that raises ends
        those already started (SIGKILL, waited for) and the error goes on to the caller."""
        if count < 1:
            raise ValueError(f"a worker runs at least 1 local rank, got {count}")
        procs: list[P] = []
        try:
            for i in range(count):
                procs.append(start_one(i))
        except BaseException:
            for started in procs:
                send(started, signal.SIGKILL)
                started.wait()
            raise
        return cls(procs, send)

    def _look(self) -> None:
        """Record the exits since the last look; the first non-zero one becomes :attr:`failed`."""
        for i, proc in enumerate(self.procs):
            if i in self.seen:
                continue
            code = proc.poll()
            if code is None:
                continue
            self.seen[i] = code
            if code != 0 and self.failed is None:
                self.failed = code

    def exits(self) -> list[tuple[int, int]]:
        """``(local rank, return code)`` of each that exited and was not returned before (each exit is
        returned once, whatever :meth:`poll` saw in between)."""
        self._look()
        new = [(i, code) for i, code in sorted(self.seen.items()) if i not in self.told]
        self.told.update(i for i, _ in new)
        return new

    def poll(self) -> int | None:
        """None while any of them runs; then the worker's code: the first failure's, else 0."""
        self._look()
        if len(self.seen) < len(self.procs):
            return None
        return self.failed if self.failed is not None else 0

    @property
    def running(self) -> list[P]:
        return [p for i, p in enumerate(self.procs) if i not in self.seen and p.poll() is None]

    def signal(self, sig: int) -> None:
        """``sig`` to each of them (through ``send``)."""
        for proc in self.procs:
            self.send(proc, sig)

    def stop(self, grace_s: float, now: float | None = None) -> None:
        """SIGTERM to each of them; SIGKILL to those still running once ``grace_s`` has passed (:meth:`reap`). A second
        stop keeps the first deadline."""
        now = time.monotonic() if now is None else now
        self.signal(signal.SIGTERM)  # an exited one: its spawner's send does nothing (or reaches what it left)
        if self.kill_at is None:
            self.kill_at = now + max(0.0, grace_s)

    def reap(self, now: float | None = None) -> bool:
        """Whether all have exited; those still running past the stop's deadline get SIGKILL (once)."""
        if self.poll() is not None:
            return True
        now = time.monotonic() if now is None else now
        if self.kill_at is not None and now >= self.kill_at:
            self.signal(signal.SIGKILL)
            self.kill_at = float("inf")
        return False
