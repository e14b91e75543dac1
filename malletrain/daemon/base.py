"""The state every part of the daemon shares, declared once with its types.

The parts (:mod:`.wiring`, :mod:`.trainers`, :mod:`.observe`, :mod:`.adoption`, :mod:`.jobs`,
:mod:`.api`, :mod:`.shutdown`) are mixins of :class:`~malletrain.daemon.loop.Daemon`: each reads and
writes the run table and the loop's flags, so they share one object; what keeps state of its own
(node-second accounting) is a collaborator the daemon owns (:class:`.accounting.NodeAccounting`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import zmq

from malletrain.config import DaemonConfig
from malletrain.control import ControlServer
from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.records import JobRun, Trainer
from malletrain.jobspec import Launcher
from malletrain.metrics import Metrics
from malletrain.monitor import Monitor, ReplaySaver
from malletrain.runtimes import Runtime
from malletrain.runtimes.torchrun import TorchrunRuntime
from malletrain.scavenging import Scavenging
from malletrain.store import Store
from scavenger.base import SchedulerBackend
from scavenger.hub import AgentHub

log = logging.getLogger("malletrain.daemon")


class DaemonBase:
    """The daemon's shared state (set by :meth:`.wiring.Wiring._open`)."""

    cfg: DaemonConfig
    clock: Callable[[], float]
    state_dir: Path
    ctx: zmq.Context
    store: Store
    metrics: Metrics
    monitor: Monitor
    replay: ReplaySaver
    hub: AgentHub
    control: ControlServer
    control_address: str
    runtime: Runtime  # the configured runtime: every job whose launcher is the in-process one
    torchrun: TorchrunRuntime  # the restart-based runtime of jobs whose launcher is ``torchrun``
    backend: SchedulerBackend
    scav: Scavenging
    accounting: NodeAccounting
    runs: dict[str, JobRun]  # the non-terminal jobs (and ended ones until their workers are gone)
    trainers: dict[str, Trainer]
    stopping: bool  # a Shutdown request: run() returns
    _changed: bool  # something changed since the last decision: decide at the next step
    _next_sample: float
    _next_decide: float
    _to_release: set[str]  # nodes whose agent went: act cancels their pilots
    _node_owner: dict[str, str | None]  # node -> its trainer (memo of node_trainer)
    _saved_policy_state: str | None
    _worker_seq: int
    _adopt_until: float  # 0: no adoption window open
    _stopped_profiles: list[str]
    _machine_size: int
    _monitor_key: bytes
    _lock_fd: int  # the state dir's daemon.lock, held (flock) while the daemon runs

    def runtime_of(self, job_id: str) -> Runtime:
        """The runtime that runs ``job_id``: chosen by the job's launcher, whatever the trainer's runtime."""
        run = self.runs.get(job_id)
        return self.torchrun if run is not None and run.spec.launcher is Launcher.TORCHRUN else self.runtime
