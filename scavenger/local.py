"""The ``local`` backend: N nodes on this machine, each held node a real agent process.

A pilot is one agent process on one node, running at once with no walltime; which nodes are idle
follows an :class:`~traces.model.IdleTimeline` replayed in compressed time (``time_scale``), so a
node the trace takes back gets SIGTERM on its agent, as a preempted pilot job, and ends
``preempted``. A pilot's id ``local-NODE-RANDOM`` reaches the agent in ``MALLETRAIN_BATCH_JOB``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import psutil

from contract.workerenv import ENV_BATCH_JOB  # the pilot id a local agent reports in its hello
from scavenger.base import (
    BackendError,
    Discovery,
    EndReason,
    NodeInfo,
    NodeState,
    PilotEnded,
    PilotEvent,
    PilotId,
    PilotQueued,
    PilotRequest,
    PilotStarted,
    PilotState,
    PilotStateError,
    PilotView,
    SchedulerBackend,
    can_move,
)
from scavenger import jobproc
from traces.model import EventBatch, IdleTimeline

log = logging.getLogger(__name__)


def node_names(n: int) -> tuple[str, ...]:
    return tuple(f"node{i:02d}" for i in range(n))


def new_pilot_id(node: str) -> PilotId:
    return PilotId(f"local-{node}-{os.urandom(4).hex()}")


@dataclass
class _LocalPilot:
    id: PilotId
    node: str
    state: PilotState = PilotState.RUNNING
    end_reason: EndReason | None = None  # set by cancel (CANCELLED) or a recall (PREEMPTED)

    def view(self) -> PilotView:
        return PilotView(self.id, self.state, (self.node,), None)


class LocalBackend(SchedulerBackend):
    """Local nodes ``node00..`` whose idleness follows the first ``n_nodes`` nodes of ``timeline``
    (None: always idle). ``epoch``: the wall time at which the trace starts (the stored one after
    a daemon restart). ``agent_args`` give the agent key's path (``--key-file``), never the key.
    """

    name = "local"
    queues_for_busy_nodes = False  # an agent process starts at once or not at all

    def __init__(self, n_nodes: int, daemon_address: str, timeline: IdleTimeline | None = None,
                 time_scale: float = 1.0, epoch: float | None = None, clock: Callable[[], float] = time.time,
                 agent_args: Sequence[str] = (), log_dir: str | None = None) -> None:
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
        self._pilots: dict[PilotId, _LocalPilot] = {}  # live (not yet reported ended)
        self._procs: dict[PilotId, subprocess.Popen[bytes] | psutil.Process] = {}  # agents not yet reaped
        self._proc_node: dict[PilotId, str] = {}
        self._events: list[PilotEvent] = []
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

    # -- time
    def trace_time(self) -> float:
        """The trace time that corresponds to now."""
        start = self._timeline.start if self._timeline is not None else 0.0
        return start + (self.clock() - self.epoch) * self.time_scale

    # -- protocol
    def discover(self) -> Discovery:
        self._advance()
        infos = tuple(
            NodeInfo(n, NodeState.IDLE if n in self._idle else NodeState.BUSY, False,
                     "idle" if n in self._idle else "busy")
            for n in self.nodes
        )
        return Discovery(infos, (), frozenset(self._idle - self._nodes_in_use()), self.clock())

    def submit(self, request: PilotRequest) -> PilotId:
        """One agent process on ``request.nodes[0]`` (empty: the first idle node); idempotent per node."""
        if len(request.nodes) > 1:
            raise ValueError(f"local backend: a pilot holds one node, asked for {request.nodes}")
        node = request.nodes[0] if request.nodes else min(self._idle - self._nodes_in_use(), default="")
        if not node:
            raise BackendError("local backend: no idle node to hold")
        holder = self._holder(node)
        if holder is not None:
            return holder.id
        if node not in self._idle:
            raise BackendError(f"local backend: node {node} is not idle")
        pilot = _LocalPilot(new_pilot_id(node), node)
        self._procs[pilot.id] = self._spawn(node, pilot.id)
        self._proc_node[pilot.id] = node
        self._pilots[pilot.id] = pilot
        self._events += [PilotQueued(pilot.id, (node,)), PilotStarted(pilot.id, (node,), None)]
        return pilot.id

    def cancel(self, pilot: PilotId) -> None:
        p = self._pilots.get(pilot)
        if p is None or p.state is PilotState.ENDING:
            return
        p.end_reason = p.end_reason or EndReason.CANCELLED
        self._move(p, PilotState.ENDING)
        self._signal(p.id, signal.SIGTERM)

    def poll(self) -> list[PilotEvent]:
        self._advance()
        self._reap()
        out, self._events = self._events, []
        return out

    def pilots(self) -> Mapping[PilotId, PilotView]:
        return {pid: p.view() for pid, p in self._pilots.items()}

    def adopt(self, node: str, batch_job: str, pid: int) -> PilotId | None:
        """An agent a previous backend started says hello: its pilot is ours again (None when the
        node is not ours to hold or the process is gone). Idempotent."""
        if node not in self.nodes or pid <= 0:
            return None
        holder = self._holder(node)
        if holder is not None:
            return holder.id
        try:
            proc = psutil.Process(pid)
        except psutil.Error:
            return None
        pilot = _LocalPilot(PilotId(batch_job) if batch_job else new_pilot_id(node), node)
        self._pilots[pilot.id] = pilot
        self._procs[pilot.id] = proc
        self._proc_node[pilot.id] = node
        self._idle.add(node)  # it ran a pilot: the trace left it idle then
        self._events.append(PilotStarted(pilot.id, (node,), None))
        return pilot.id

    def close(self) -> None:
        for pid in list(self._pilots):
            self.cancel(pid)
        deadline = time.monotonic() + 10.0
        while self._procs and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.02)
        for pid in list(self._procs):
            self._kill_tree(pid)  # an agent that did not leave in time: its workers first
        self._reap(wait=True)

    # -- the main scheduler (the trace does this; tests may too)
    def recall(self, node: str) -> None:
        """The main scheduler takes ``node`` back now: its pilot is preempted (SIGTERM on the agent)."""
        if node not in self._idle:
            return
        self._idle.discard(node)
        p = self._holder(node)
        if p is not None:
            p.end_reason = EndReason.PREEMPTED
            self._move(p, PilotState.ENDING)
            self._signal(p.id, signal.SIGTERM)
            self._finish(p, "recalled by the main scheduler")  # the node is gone now, not when the agent exits

    def make_idle(self, node: str) -> None:
        if node in self.nodes:
            self._idle.add(node)

    def agent_pids(self) -> dict[str, int]:
        """Node -> process id of every agent still running (live pilots and ended ones not yet reaped)."""
        return {self._proc_node[pid]: proc.pid for pid, proc in self._procs.items()}

    # -- helpers
    def _advance(self) -> None:
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

    def _nodes_in_use(self) -> set[str]:
        return {p.node for p in self._pilots.values()}

    def _holder(self, node: str) -> _LocalPilot | None:
        return next((p for p in self._pilots.values() if p.node == node), None)

    def _spawn(self, node: str, pid: PilotId) -> "subprocess.Popen[bytes]":
        argv = [sys.executable, "-m", "scavenger.agent", "--node", node, "--daemon", self.daemon_address,
                *self.agent_args]
        out: Any = subprocess.DEVNULL
        if self.log_dir:
            argv += ["--log-dir", self.log_dir]
            jobproc.private_dir(Path(self.log_dir))  # 0700 (0711 for root) and 0600, whatever the umask
            out = jobproc.open_private(Path(self.log_dir) / f"agent-{node}.log")
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                env={**os.environ, ENV_BATCH_JOB: pid},
            )
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    def _move(self, p: _LocalPilot, new: PilotState) -> None:
        if not can_move(p.state, new):
            raise PilotStateError(f"local pilot {p.id}: cannot go from {p.state.value} to {new.value}")
        p.state = new

    def _finish(self, p: _LocalPilot, detail: str) -> None:
        """``p`` ended (once): PilotEnded; its process is reaped later."""
        if self._pilots.pop(p.id, None) is not None:
            self._events.append(PilotEnded(p.id, (p.node,), p.end_reason or EndReason.EXITED, detail))

    def _signal(self, pid: PilotId, sig: int) -> None:
        proc = self._procs.get(pid)
        if proc is None:
            return
        try:
            proc.send_signal(sig)
        except (ProcessLookupError, psutil.Error):
            pass

    def _kill_tree(self, pid: PilotId) -> None:
        proc = self._procs.get(pid)
        if proc is None:
            return
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for child in tree:
            try:
                child.kill()
            except psutil.Error:
                pass
        self._signal(pid, signal.SIGKILL)

    def _reap(self, wait: bool = False) -> None:
        for pid, proc in list(self._procs.items()):
            if isinstance(proc, subprocess.Popen):
                try:
                    code = proc.wait(timeout=2.0) if wait else proc.poll()
                except subprocess.TimeoutExpired:
                    code = None
            else:
                try:
                    code = None if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE else -1
                except psutil.Error:
                    code = -1
            if code is None:
                continue
            del self._procs[pid]
            self._proc_node.pop(pid, None)
            p = self._pilots.get(pid)
            if p is not None:
                self._finish(p, f"agent process exited with {code}")


def slot_timeline(timeline: IdleTimeline, n_slots: int) -> IdleTimeline:
    """The first ``n_slots`` idle nodes of a bigger machine, as a timeline of ``n_slots`` nodes: slot
    ``i`` is idle while the machine has more than ``i`` idle nodes, so the trace's arrivals and
    recalls keep their timing and burstiness on a few local nodes."""
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
                times.append(when)
                ids.append(slot)
                idle.append(True)
        elif now < prev:
            for slot in range(prev - 1, now - 1, -1):
                times.append(when)
                ids.append(slot)
                idle.append(False)
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
