"""The daemon's configuration as values: one frozen dataclass per TOML table (the keys, their
defaults and their meaning are in :mod:`malletrain.daemon.config`, which parses and checks a file into these)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path

from contract.nodeshape import parse_workers_per_node
from policy import PolicyConfig

DEFAULT_TRAINER = "default"
"""The one trainer of a config without ``[[trainers]]``: every node, the ``[policy]`` table."""


class ConfigError(ValueError):
    """A bad configuration; the message names the file and the key."""


@dataclass(frozen=True)
class LocalConfig:
    nodes: int = 6
    trace: str = "synthetic"
    time_scale: float = 60.0
    seed: int = 1
    duration: float = 7 * 86400.0
    machine_nodes: int = 64


@dataclass(frozen=True)
class Ports:
    control: int = 0
    agents: int = 0
    monitor: int = 0
    rendezvous: int = 0
    host: str = "127.0.0.1"
    """The interface address the daemon's TCP sockets (agents, monitor, rendezvous) listen on,
    which agents and workers use to reach it: loopback for the local backend; on a cluster, the
    head node's address on the network the compute nodes share (never 0.0.0.0: every socket
    then answers on every network of the head node)."""


@dataclass(frozen=True)
class MetricsConfig:
    address: str = ""  # "" = no metrics

    @property
    def enabled(self) -> bool:
        return bool(self.address)


@dataclass(frozen=True)
class LogConfig:
    format: str = "text"
    level: str = "info"


@dataclass(frozen=True)
class ScavengerConfig:
    """[scavenger]: which backend holds nodes and how its pilots look (slurm/pbs keys; see the module doc)."""

    kind: str = "local"
    partition: str = ""
    qos: str = ""
    account: str = ""
    queue: str = ""
    job_name: str = ""
    nodes_per_pilot: int = 1
    walltime: float = 3600.0
    max_pilots: int = 20
    renew_before: float = 120.0
    max_queued: float = 60.0
    poll_interval: float = 1.0
    submit_rate: float = 2.0
    command_timeout: float = 15.0
    workers_per_node: int | str = "gpus"
    """Worker slots per node: ``"gpus"`` (one per GPU the scheduler reports, 1 where it reports none)
    or an integer used where the scheduler reports no GPUs (:func:`contract.nodeshape.node_slots`)."""

    @property
    def slots_per_node(self) -> int | None:
        """``workers_per_node`` as the count the daemon uses (None: ``"gpus"``); checked when parsed."""
        return parse_workers_per_node(self.workers_per_node)


@dataclass(frozen=True)
class TrainerConfig:
    """One ``[[trainers]]`` entry: a policy of its own over its own nodes."""

    name: str
    nodes: tuple[str, ...] | None = None
    """fnmatch patterns over node names (case-sensitive); None: every node no other trainer matched."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def matches(self, node: str) -> bool:
        return self.nodes is not None and any(fnmatchcase(node, p) for p in self.nodes)


def node_trainer(trainers: Sequence[TrainerConfig], node: str) -> str | None:
    """The trainer ``node`` belongs to: the first whose patterns match it, else the one without
    patterns; None: no trainer takes it."""
    for t in trainers:
        if t.matches(node):
            return t.name
    return next((t.name for t in trainers if t.nodes is None), None)


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: str = "~/.malletrain"
    runtime: str = "torch"
    loop_interval: float = 0.1
    max_failures: int = 5
    stall_after: float = 600.0  # seconds without progress before a running job is stalled (policy.health)
    stall_restarts: int = 1  # restarts for a stall before the next one fails the job
    store_grace: float = 60.0
    agent_heartbeat: float = 0.5
    agent_dead_after: float = 30.0  # fits a restart with room: see the module docstring
    backend: str = "local"
    local: LocalConfig = field(default_factory=LocalConfig)
    ports: Ports = field(default_factory=Ports)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    scavenger: ScavengerConfig = field(default_factory=ScavengerConfig)
    trainers: tuple[TrainerConfig, ...] = ()  # (): one trainer, DEFAULT_TRAINER (see trainer_list)
    admin_groups: tuple[str | int, ...] = ()
    """Group names or gids whose members are admins of the control socket (besides root and the daemon's user)."""

    def trainer_list(self) -> tuple[TrainerConfig, ...]:
        """The trainers the daemon runs, in declared order; none declared: one named ``default``
        on every node with the ``[policy]`` table."""
        return self.trainers or (TrainerConfig(DEFAULT_TRAINER, None, self.policy),)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    def with_state_dir(self, path: str | Path) -> "DaemonConfig":
        return replace(self, state_dir=str(path))

