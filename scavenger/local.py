"""The ``local`` backend: N nodes on this machine, each held node a real agent process.

Which nodes are idle follows an :class:`~traces.model.IdleTimeline` replayed in
compressed time (``time_scale`` trace seconds per wall second), so recalls
happen for real: a held node the trace takes back gets SIGTERM on its agent,
exactly as a pilot job killed by the main scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator, Sequence

import numpy as np
import psutil

from scavenger.base import (
    AgentGone,
    BackendEvent,
    NodeIdle,
    NodeRecalled,
    Pilot,
    PilotState,
    PilotTable,
)
from traces.model import EventBatch, IdleTimeline

log = logging.getLogger(__name__)


def node_names(n: int) -> tuple[str, ...]:
    return tuple(f"node{i:02d}" for i in range(n))


class LocalBackend:
    """Local nodes ``node00..`` whose idleness follows ``timeline`` (None: always idle).

    The first ``n_nodes`` nodes of the timeline map, in order, onto the local
    names; changes of other timeline nodes are ignored. ``epoch`` is the wall
    time (``clock()``) at which the trace starts; pass the stored one after a
    daemon restart to continue where it was.
    """

    name = "local"

    def __init__(
        self,
        n_nodes: int,
        daemon_address: str,
        timeline: IdleTimeline | None = None,
        time_scale: float = 1.0,
        epoch: float | None = None,
        clock: Callable[[], float] = time.time,
        agent_args: Sequence[str] = (),
        log_dir: str | None = None,
    ) -> None:
        if n_nodes < 1:
            raise ValueError(f"local backend: nodes must be >= 1, got {n_nodes}")
        if not time_scale > 0:
            raise ValueError(f"local backend: time_scale must be > 0, got {time_scale}")
        self.nodes = node_names(n_nodes)
        self.daemon_address = daemon_address
        self.time_scale = float(time_scale)
        self.clock = clock
        self.epoch = clock() if epoch is None else float(epoch)
        self.agent_args = tuple(agent_args)
        self.log_dir = log_dir
        self.pilots = PilotTable()
        self._procs: dict[str, subprocess.Popen[bytes] | psutil.Process] = {}
        self._pending: list[BackendEvent] = []
        self._timeline = timeline
        self._map: dict[str, str] = {}
        self._idle: set[str]
        self._batches: Iterator[EventBatch] = iter(())
        self._next: EventBatch | None = None
        if timeline is None:
            self._idle = set(self.nodes)
        else:
            self._map = dict(zip(timeline.nodes, self.nodes))
            self._idle = {self._map[n] for n in timeline.initial_idle if n in self._map}
            self._batches = timeline.batches()
            self._next = next(self._batches, None)
        self._pending.extend(NodeIdle(n) for n in sorted(self._idle))

    # -- time
    def trace_time(self) -> float:
        """The trace time that corresponds to now."""
        start = self._timeline.start if self._timeline is not None else 0.0
        return start + (self.clock() - self.epoch) * self.time_scale

    # -- protocol
    def idle_nodes(self) -> set[str]:
        return self._idle - self.pilots.nodes()

    def held_nodes(self) -> set[str]:
        return self.pilots.nodes()

    def hold(self, node: str) -> Pilot:
        if node in self.pilots:
            return self.pilots.get(node)  # type: ignore[return-value]
        if node not in self._idle:
            raise ValueError(f"local backend: node {node} is not idle")
        argv = [
            sys.executable, "-m", "scavenger.agent",
            "--node", node, "--daemon", self.daemon_address, *self.agent_args,
        ]
        if self.log_dir:
            argv += ["--log-dir", self.log_dir]
        stderr = subprocess.DEVNULL
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            stderr = open(os.path.join(self.log_dir, f"agent-{node}.log"), "ab")  # type: ignore[assignment]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, start_new_session=True
        )
        if stderr is not subprocess.DEVNULL:
            stderr.close()  # type: ignore[union-attr]
        self._procs[node] = proc
        return self.pilots.hold(node, handle=str(proc.pid))

    def agent_up(self, node: str, pid: int = 0) -> None:
        """The daemon heard ``node``'s agent: HOLDING -> HELD; adopt it if we did not start it."""
        if node not in self.nodes:
            return
        if node not in self.pilots and pid > 0:
            try:
                self._procs[node] = psutil.Process(pid)
            except psutil.Error:
                return
            self.pilots.hold(node, handle=str(pid))
            self._idle.add(node)
        if node in self.pilots:
            self.pilots.move(node, PilotState.HELD)

    def release(self, node: str) -> None:
        if node not in self.pilots:
            return
        self._signal(node, signal.SIGTERM)
        self.pilots.move(node, PilotState.RELEASED)

    def recall(self, node: str) -> None:
        """The main scheduler takes ``node`` back now (the trace does this; tests may too)."""
        if node not in self._idle:
            return
        self._idle.discard(node)
        held = node in self.pilots
        if held:
            self._signal(node, signal.SIGTERM)
            self.pilots.move(node, PilotState.RECALLED)
        self._pending.append(NodeRecalled(node, held))

    def make_idle(self, node: str) -> None:
        if node in self._idle or node not in self.nodes:
            return
        self._idle.add(node)
        self._pending.append(NodeIdle(node))

    def poll(self) -> list[BackendEvent]:
        now = self.trace_time()
        while self._next is not None and self._next.time <= now:
            batch = self._next
            for n in batch.recalled:
                if n in self._map:
                    self.recall(self._map[n])
            for n in batch.became_idle:
                if n in self._map:
                    self.make_idle(self._map[n])
            self._next = next(self._batches, None)
        self._reap()
        out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        for node in list(self.pilots.nodes()):
            self.release(node)
        deadline = time.monotonic() + 10.0
        while self._procs and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.02)
        for node in list(self._procs):
            self._kill_tree(node)  # an agent that did not leave in time: its workers first
        self._reap(wait=True)

    # -- processes
    def agent_pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self._procs.items()}

    def _signal(self, node: str, sig: int) -> None:
        proc = self._procs.get(node)
        if proc is None:
            return
        try:
            proc.send_signal(sig)
        except (ProcessLookupError, psutil.Error):
            pass

    def _kill_tree(self, node: str) -> None:
        proc = self._procs.get(node)
        if proc is None:
            return
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        self._signal(node, signal.SIGKILL)

    def _reap(self, wait: bool = False) -> None:
        for node, proc in list(self._procs.items()):
            if isinstance(proc, subprocess.Popen):
                try:
                    code = proc.wait(timeout=2.0) if wait else proc.poll()
                except subprocess.TimeoutExpired:
                    code = None
            else:
                code = None if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE else -1
            if code is None:
                continue
            del self._procs[node]
            if node in self.pilots:
                self.pilots.move(node, PilotState.RELEASED)
                self._pending.append(AgentGone(node, f"agent process exited with {code}"))


def slot_timeline(timeline: IdleTimeline, n_slots: int) -> IdleTimeline:
    """The first ``n_slots`` idle nodes of a bigger machine, as a timeline of ``n_slots`` nodes.

    Slot ``i`` is idle while the machine has more than ``i`` idle nodes: when the
    idle count drops, the highest slots are recalled first. This keeps the
    trace's arrivals and recalls (their timing and burstiness) while fitting a
    machine of thousands of nodes onto the few local ones.
    """
    if n_slots < 1:
        raise ValueError(f"slot_timeline: n_slots must be >= 1, got {n_slots}")
    t, c = timeline.idle_counts()
    capped = np.minimum(c, n_slots)
    times: list[float] = []
    ids: list[int] = []
    idle: list[bool] = []
    prev = int(capped[0])
    for when, now in zip(t[1:].tolist(), capped[1:].tolist()):
        if now > prev:
            for slot in range(prev, now):
                times.append(when), ids.append(slot), idle.append(True)
        elif now < prev:
            for slot in range(prev - 1, now - 1, -1):
                times.append(when), ids.append(slot), idle.append(False)
        prev = now
    names = tuple(f"slot{i}" for i in range(n_slots))
    return IdleTimeline(
        source=f"{timeline.source} (first {n_slots} idle nodes)",
        format=timeline.format,
        nodes=names,
        start=timeline.start,
        end=timeline.end,
        initial_idle=frozenset(names[: int(capped[0])]),
        times=np.asarray(times, dtype=np.float64),
        node_ids=np.asarray(ids, dtype=np.int32),
        idle=np.asarray(idle, dtype=bool),
    )
