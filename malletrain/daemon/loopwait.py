"""What the daemon's loop does between two iterations: read reports and agent frames as they come,
and end the wait at once when an agent is gone (a recall), so its new plan does not wait for the next
tick. Agent frames go through observe, handled exactly as at an iteration's start; anything else
waits for the tick (a heartbeat a millisecond at Summit size must not make the loop spin)."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

import zmq


@dataclass
class LoopWait:
    """``reports``: the monitor; ``agents``: the hub (``sock``, ``lost``); ``observe_agents(now)``: observe's
    agent phase, run in one store transaction. A fake without ``sock`` or ``lost`` is read each iteration."""

    reports: Any
    agents: Any
    observe_agents: Callable[[float], None]
    batch: Callable[[], AbstractContextManager[Any]]
    clock: Callable[[], float]

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds``, reading what comes; True when it ended early because an agent was gone. With
        no time it reads what is there once, so an overrunning loop still learns of a recall before its next look."""
        agent_sock = getattr(self.agents, "sock", None)
        if agent_sock is None or not hasattr(self.agents, "lost"):
            self.reports.drain(timeout_ms=int(seconds * 1000))  # (returns at the first reports: as before)
            return False
        poller = zmq.Poller()
        poller.register(self.reports.sock, zmq.POLLIN)
        poller.register(agent_sock, zmq.POLLIN)
        end = time.monotonic() + seconds
        first = True
        while True:
            left = end - time.monotonic()
            if left <= 0 and not first:
                return False
            first = False  # (no time left, as after an iteration that overran: what is there is read, once)
            ready = dict(poller.poll(max(1, int(left * 1000)) if left > 0 else 0))
            if self.reports.sock in ready:
                self.reports.drain()
            if agent_sock in ready:
                before = self.agents.lost
                with self.batch():
                    self.observe_agents(self.clock())
                if self.agents.lost != before:
                    return True

