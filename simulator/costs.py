"""When a start, a restart or a join of a simulated job ends: the real daemon's warm-worker rule. A node agent
(:mod:`scavenger.warm`) keeps one warm worker per node: a process that imports the framework from the agent's hello (the
pilot's start) and again from the exit of the node's last worker. A worker handed a ready warm process reaches its first
step in ``warm_start_s`` (0.25 s measured, docs/research/real-system.md); one handed a process still importing waits for
the import. The engine (:mod:`simulator.engine`) asks these functions, so a start, a restart and a join all follow the
same rule; nothing here reads a clock or holds state."""

from __future__ import annotations

from typing import Sequence

from simulator.calibration import Calibration


def warm_began(idle_since: float, pilot_start_s: float, left_at: float | None) -> float:
    """When a node's agent began warming the worker a job would get there: its pilot's start (``idle_since
    + pilot_start_s``), or the exit of the node's last worker if that came later."""
    began = idle_since + pilot_start_s
    return began if left_at is None else max(began, left_at)


def join_ready(cal: Calibration, warm: Sequence[float], t: float) -> float:
    """A running job grows onto nodes whose warm workers began at ``warm``: when every new worker is ready."""
    return max(warm, default=t) + cal.join_s


def start_ends(cal: Calibration, t: float, warm: Sequence[float], restart: bool, load_s: float = 0.0) -> float:
    """A job starts (``restart``: from its checkpoint) at ``t`` on nodes whose warm workers began at ``warm``: when its
    first step comes. Each node's worker is ready ``cold_start_s`` (``restart_s``) after its warm process began (what
    the calibration measured from the agent's hello: import, rendezvous, first step, and for a restart the checkpoint's
    load); once all are ready the start costs only ``warm_start_s`` (plus, for a restart, the load: ``restart_s -
    cold_start_s``). A restart adds ``load_s``, the load of the job's own checkpoint (its model's size at the
    calibration's rate). A calibration without ``warm_start_s`` charges the full figure from ``t``, as before it
    existed."""
    full = cal.restart_s + load_s if restart else cal.cold_start_s
    if cal.warm_start_s is None:
        return t + full
    quick = cal.warm_start_s + (max(0.0, cal.restart_s - cal.cold_start_s) + load_s if restart else 0.0)
    return min(t + full, max(t + quick, max(warm, default=t) + full))
