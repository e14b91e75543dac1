"""The worker environment contract: every ``MALLETRAIN_*`` variable a worker reads, defined once.

The daemon side writes them with :meth:`WorkerEnv.to_environ`; the worker side reads them with
:meth:`WorkerEnv.from_environ`, which checks every value and names the bad one. Standard library
only, so every side uses it without torch.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from spawner.slots import ENV_DEVICES, ENV_LOCAL_RANKS  # noqa: F401  (defined beside the slots they shape)

ENV_PREFIX = "MALLETRAIN_"
"""Every variable of this contract starts so; a job's own ``env`` may set none but :data:`ENV_DEVICES`."""
ENV_JOB = "MALLETRAIN_JOB"
"""The job id (all runtimes)."""
ENV_WORKER = "MALLETRAIN_WORKER"
"""This worker's id within the job (all runtimes)."""
ENV_MONITOR = "MALLETRAIN_MONITOR"
"""ZeroMQ address of the job monitor (``tcp://host:port``); unset: ``report`` does nothing."""
ENV_RUNTIME = "MALLETRAIN_RUNTIME"
"""Name of the runtime that launched the worker (``torch``, ``horovod``, ``toy``)."""
ENV_STORE = "MALLETRAIN_STORE"
"""``host:port`` of the daemon's rendezvous store (``torch`` runtime; it takes the job's secret); unset: one local worker."""
ENV_COLLECTIVE_TIMEOUT = "MALLETRAIN_COLLECTIVE_TIMEOUT"
"""Seconds a gloo collective waits for a silent peer (``torch`` runtime)."""
ENV_STORE_GRACE = "MALLETRAIN_STORE_GRACE"
"""Seconds workers train on without the daemon's store before they exit 75 (``torch`` runtime)."""
ENV_HOROVOD_JOB_DIR = "MALLETRAIN_HOROVOD_JOB_DIR"
"""The Horovod job directory (hosts file, ``members.json``), set for the driver and its workers."""
ENV_TOY_DIR = "MALLETRAIN_TOY_DIR"
"""The toy runtime's membership directory."""
ENV_LOG_LEVEL = "MALLETRAIN_LOG_LEVEL"
"""Level of malletrain's own log lines in a worker (``DEBUG``, ``INFO``, ... or a number); default INFO."""
ENV_JOB_SECRET = "MALLETRAIN_JOB_SECRET"
"""The job's secret that signs its progress reports (see :mod:`contract.messages`); never logged."""

ENV_WORKER_BATCH = "MALLETRAIN_WORKER_BATCH"
"""Samples one worker trains per optimizer step (the job file's ``worker_batch``); unset: not given."""

ENV_GENERATION = "MALLETRAIN_GENERATION"
"""The daemon's number of the world a restarted command runs in (``torchrun`` launcher): its reports
carry it, so the monitor counts them at the size the daemon published for that world."""

ENV_INCARNATION = "MALLETRAIN_INCARNATION"
"""Which start of its worker a process is (0, 1, ...: the ``torchrun`` launcher's rank agent sets the world's
restart count): its reports carry it, and the monitor keeps each (worker, incarnation)'s ``seq`` apart, so a
worker restarted under its own name counts from 1 again. Unset: ``TORCHELASTIC_RESTART_COUNT``, else 0."""

ENV_ARRAY_INDEX = "MALLETRAIN_ARRAY_INDEX"
"""An element's index in its job array (``malletrain submit --array``); unset: not an array element."""

ENV_TRIAL = "MALLETRAIN_TRIAL"
"""A sweep trial's number (0, 1, ...); unset: not a trial."""

ENV_TRIAL_RESULT = "MALLETRAIN_TRIAL_RESULT"
"""The file a sweep trial writes its value to, as ``{"value": X}`` (:func:`malletrain.worker.client.trial_result`)."""

ENV_TRIAL_STEPS = "MALLETRAIN_TRIAL_STEPS"
"""The file a sweep trial appends its intermediate values to, one ``{"step": S, "value": X}`` a line
(:func:`malletrain.worker.client.trial_report`; the sweep's pruner reads them)."""

# ENV_DEVICES (the one ``MALLETRAIN_*`` a job's ``env`` may set: ``own``, each worker sees its slot's
# device, or ``all``) and ENV_LOCAL_RANKS (a rank agent's K) are defined beside the slots they shape,
# in :mod:`spawner.slots`, below this package; they are part of the worker's environment all the same.

# Not a worker's, but read beside the daemon: the state folder the CLI talks to, and the batch job id
# the local backend gives the node agents it starts (Slurm and PBS give their own).
ENV_STATE_DIR = "MALLETRAIN_STATE_DIR"
"""The daemon's state folder, where ``--state-dir`` is not given."""
ENV_BATCH_JOB = "MALLETRAIN_BATCH_JOB"
"""A node agent's batch job id under the local backend."""

ALL_VARIABLES: tuple[str, ...] = (
    ENV_JOB, ENV_WORKER, ENV_MONITOR, ENV_RUNTIME, ENV_STORE, ENV_COLLECTIVE_TIMEOUT,
    ENV_STORE_GRACE, ENV_HOROVOD_JOB_DIR, ENV_TOY_DIR, ENV_LOG_LEVEL, ENV_JOB_SECRET, ENV_WORKER_BATCH,
    ENV_GENERATION, ENV_INCARNATION, ENV_ARRAY_INDEX, ENV_TRIAL, ENV_TRIAL_RESULT, ENV_TRIAL_STEPS,
)

TORCHRUN_VARIABLES: tuple[str, ...] = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
)
"""The variables ``torchrun`` gives each worker, which :func:`torchrun_environ` writes for one rank."""

DEFAULT_COLLECTIVE_TIMEOUT_S = 3.0
"""Seconds a gloo collective (or a group rendezvous) waits for a silent peer."""

DEFAULT_STORE_GRACE_S = 60.0
"""Seconds workers keep training without the daemon's store (a daemon restart) before they exit."""

DEFAULT_LOG_LEVEL = logging.INFO

_FORBIDDEN_ID_CHARS = frozenset("/ \t\n\r")


class WorkerEnvError(ValueError):
    """A worker environment variable is missing or malformed; the message names it and its value."""


def check_id(kind: str, value: str) -> str:
    """``value`` if it is a usable job or worker id, else ``ValueError`` naming it."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{kind} id must be a non-empty string, got {value!r}")
    bad = sorted(set(value) & _FORBIDDEN_ID_CHARS)
    if bad:
        raise ValueError(f"{kind} id {value!r} contains forbidden characters {bad!r}")
    return value


def parse_address(text: str, what: str = ENV_STORE) -> tuple[str, int]:
    """``host:port`` -> (host, port); a ``ValueError`` names ``what`` and the text."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise WorkerEnvError(f"{what}={text!r} is not host:port")
    try:
        port = int(port_text)
    except ValueError:
        raise WorkerEnvError(f"{what}={text!r}: port {port_text!r} is not an integer") from None
    if not 0 < port < 65536:
        raise WorkerEnvError(f"{what}={text!r}: port {port} out of range")
    return host.strip("[]"), port


def format_address(address: tuple[str, int]) -> str:
    """(host, port) -> ``host:port`` (IPv6 hosts in brackets), the inverse of :func:`parse_address`."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_seconds(name: str, text: str | None, default: float) -> float:
    """A positive number of seconds from variable ``name`` (``default`` if unset or empty)."""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise WorkerEnvError(f"{name}={text!r} is not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise WorkerEnvError(f"{name}={text!r} must be a finite number > 0")
    return value


def parse_log_level(text: str | None, name: str = ENV_LOG_LEVEL) -> int:
    """A logging level from a name (``info``, ``DEBUG``) or a number; INFO if unset."""
    if not text:
        return DEFAULT_LOG_LEVEL
    if text.strip().lstrip("-").isdigit():
        return int(text)
    level = logging.getLevelName(text.strip().upper())
    if not isinstance(level, int):
        raise WorkerEnvError(f"{name}={text!r} is not a log level (DEBUG, INFO, WARNING, ERROR or a number)")
    return level


def worker_batch_from_environ(environ: Mapping[str, str] | None = None) -> int | None:
    """``MALLETRAIN_WORKER_BATCH`` as a positive int (None if unset); :class:`WorkerEnvError` names a bad value."""
    env = os.environ if environ is None else environ
    text = env.get(ENV_WORKER_BATCH)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise WorkerEnvError(f"{ENV_WORKER_BATCH}={text!r} is not an integer") from None
    if value < 1:
        raise WorkerEnvError(f"{ENV_WORKER_BATCH}={text!r} must be >= 1")
    return value


def _id_or_none(name: str, env: Mapping[str, str]) -> str | None:
    text = env.get(name)
    if not text:
        return None
    try:
        return check_id(name, text)
    except ValueError as exc:
        raise WorkerEnvError(f"{name}={text!r}: {exc}") from None


def _path_or_none(env: Mapping[str, str], name: str) -> Path | None:
    text = env.get(name)
    return Path(text) if text else None


@dataclass(frozen=True)
class WorkerEnv:
    """What a worker learns from its environment; None/defaults for what is unset."""

    job: str | None = None
    worker: str | None = None
    monitor: str | None = None
    runtime: str | None = None
    store: tuple[str, int] | None = None
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    store_grace_s: float = DEFAULT_STORE_GRACE_S
    horovod_job_dir: Path | None = None
    toy_dir: Path | None = None
    log_level: int = DEFAULT_LOG_LEVEL
    job_secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name, value in (("collective_timeout_s", self.collective_timeout_s),
                            ("store_grace_s", self.store_grace_s)):
            if not value > 0:
                raise WorkerEnvError(f"WorkerEnv.{name} must be > 0, got {value!r}")
        if self.store is not None and not (self.job and self.worker):
            missing = [n for n, v in ((ENV_JOB, self.job), (ENV_WORKER, self.worker)) if not v]
            raise WorkerEnvError(f"{ENV_STORE} is set but {', '.join(missing)} is not")

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Parse ``environ`` (default ``os.environ``); :class:`WorkerEnvError` names a bad variable."""
        env = os.environ if environ is None else environ
        store_text = env.get(ENV_STORE)
        return cls(
            job=_id_or_none(ENV_JOB, env),
            worker=_id_or_none(ENV_WORKER, env),
            monitor=env.get(ENV_MONITOR) or None,
            runtime=env.get(ENV_RUNTIME) or None,
            store=parse_address(store_text, ENV_STORE) if store_text else None,
            collective_timeout_s=parse_seconds(ENV_COLLECTIVE_TIMEOUT, env.get(ENV_COLLECTIVE_TIMEOUT),
                                               DEFAULT_COLLECTIVE_TIMEOUT_S),
            store_grace_s=parse_seconds(ENV_STORE_GRACE, env.get(ENV_STORE_GRACE), DEFAULT_STORE_GRACE_S),
            horovod_job_dir=_path_or_none(env, ENV_HOROVOD_JOB_DIR),
            toy_dir=_path_or_none(env, ENV_TOY_DIR),
            log_level=parse_log_level(env.get(ENV_LOG_LEVEL)),
            job_secret=env.get(ENV_JOB_SECRET) or None,
        )

    def require_job(self) -> str:
        """The job id; :class:`WorkerEnvError` if ``MALLETRAIN_JOB`` is not set."""
        if not self.job:
            raise WorkerEnvError(f"{ENV_JOB} is not set: this process was not started as a malletrain worker")
        return self.job

    def require_worker(self) -> str:
        """The worker id; :class:`WorkerEnvError` if ``MALLETRAIN_WORKER`` is not set."""
        if not self.worker:
            raise WorkerEnvError(f"{ENV_WORKER} is not set: this process was not started as a malletrain worker")
        return self.worker

    def require_toy_dir(self) -> Path:
        """The toy runtime's directory; :class:`WorkerEnvError` if ``MALLETRAIN_TOY_DIR`` is not set."""
        if self.toy_dir is None:
            raise WorkerEnvError(f"{ENV_TOY_DIR} is not set: start toy workers through ToyRuntime.launch_spec")
        return self.toy_dir

    @property
    def store_text(self) -> str:
        """``host:port`` of the store, or ``(no store)``."""
        return "(no store)" if self.store is None else format_address(self.store)

    # -- writing (daemon side) --------------------------------------------------------------------
    def to_environ(self) -> dict[str, str]:
        """The variables to set for a worker: only those that differ from unset (the inverse of parsing)."""
        out: dict[str, str] = {}
        for name, value in ((ENV_JOB, self.job), (ENV_WORKER, self.worker), (ENV_MONITOR, self.monitor),
                            (ENV_RUNTIME, self.runtime)):
            if value:
                out[name] = value
        if self.store is not None:
            out[ENV_STORE] = format_address(self.store)
            out[ENV_COLLECTIVE_TIMEOUT] = repr(self.collective_timeout_s)
            out[ENV_STORE_GRACE] = repr(self.store_grace_s)
        if self.horovod_job_dir is not None:
            out[ENV_HOROVOD_JOB_DIR] = str(self.horovod_job_dir)
        if self.toy_dir is not None:
            out[ENV_TOY_DIR] = str(self.toy_dir)
        if self.log_level != DEFAULT_LOG_LEVEL:
            out[ENV_LOG_LEVEL] = logging.getLevelName(self.log_level)
        if self.job_secret:
            out[ENV_JOB_SECRET] = self.job_secret
        return out


@dataclass(frozen=True)
class RankPlace:
    """Where one worker sits in its job's current world: rank ``group_rank * local_world_size +
    local_rank``, node by node, as ``torchrun`` numbers them."""

    group_rank: int
    group_world_size: int
    local_rank: int
    local_world_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.group_rank < self.group_world_size:
            raise WorkerEnvError(f"RankPlace: group_rank {self.group_rank} not in [0, {self.group_world_size})")
        if not 0 <= self.local_rank < self.local_world_size:
            raise WorkerEnvError(f"RankPlace: local_rank {self.local_rank} not in [0, {self.local_world_size})")

    @property
    def rank(self) -> int:
        return self.group_rank * self.local_world_size + self.local_rank

    @property
    def world_size(self) -> int:
        return self.group_world_size * self.local_world_size


def torchrun_environ(place: RankPlace, master: tuple[str, int], run_id: str,
                     restart_count: int = 0, max_restarts: int = 0) -> dict[str, str]:
    """The variables ``torchrun`` would give the worker at ``place`` (:data:`TORCHRUN_VARIABLES`):
    ``master`` the world's rendezvous, ``run_id`` the job, ``restart_count`` the world's restarts."""
    if restart_count < 0 or max_restarts < 0:
        raise WorkerEnvError(f"torchrun_environ: restart counts must be >= 0, got {restart_count}, {max_restarts}")
    host, port = master
    return {
        "RANK": str(place.rank), "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank), "LOCAL_WORLD_SIZE": str(place.local_world_size),
        "GROUP_RANK": str(place.group_rank), "GROUP_WORLD_SIZE": str(place.group_world_size),
        "ROLE_RANK": str(place.rank), "ROLE_WORLD_SIZE": str(place.world_size), "ROLE_NAME": "default",
        "MASTER_ADDR": host, "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count), "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
    }


_HANDLER_NAME = "malletrain-worker"


def configure_worker_logging(level: int | None = None, stream: object = None) -> logging.Logger:
    """Make malletrain's log lines of a worker reach its stderr at ``level`` (``MALLETRAIN_LOG_LEVEL``,
    INFO), unless the user's program configured logging itself. Idempotent."""
    import sys

    logger = logging.getLogger("malletrain")
    if level is None:
        level = parse_log_level(os.environ.get(ENV_LOG_LEVEL))
    logger.setLevel(level)
    ours = [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]
    if not ours and not logging.getLogger().handlers:
        handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s pid %(process)d %(name)s: %(message)s"))
        logger.addHandler(handler)
    return logger
