"""The daemon's job table (:class:`JobTable`, the one mutable record its parts share; the "decide again"
flag is not in it), the :class:`Plan` decide hands act, and :class:`Runtimes` (which runtime runs a job)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from malletrain.daemon.records import JobRun, Trainer
from malletrain.daemon.jobspec import JobSpec, Launcher
from malletrain.runtimes import Runtime
from malletrain.runtimes.torchrun import TorchrunRuntime

log = logging.getLogger("malletrain.daemon")


@dataclass
class JobTable:
    """The jobs and trainers of one daemon, and the loop's flags."""

    trainers: dict[str, Trainer]  # by name, in the config's order (the first is the default)
    runs: dict[str, JobRun] = field(default_factory=dict)  # the non-terminal jobs (and ended ones until
    #                                                        their workers are gone)
    to_release: set[str] = field(default_factory=set)  # nodes whose agent went: act cancels their pilots
    stopping: bool = False  # a Shutdown request: run() returns
    adopt_until: float = 0.0  # 0: no adoption window open
    stopped_profiles: list[str] = field(default_factory=list)  # profiles a clean stop interrupted

    def trainer_name(self, spec: JobSpec) -> str:
        """The trainer a job names, or the first one (which need not exist: see :meth:`unknown_trainer`)."""
        return spec.trainer or next(iter(self.trainers))

    def trainer_of(self, run: JobRun) -> Trainer:
        return self.trainers[self.trainer_name(run.spec)]

    def unknown_trainer(self, spec: JobSpec) -> str | None:
        """Why this daemon cannot run the job (it names a trainer the daemon does not have), or None."""
        if spec.trainer is None or spec.trainer in self.trainers:
            return None
        return f"no trainer {spec.trainer!r} in this daemon (its trainers: {', '.join(self.trainers)})"


@dataclass(frozen=True)
class Runtimes:
    """The configured runtime (every job whose launcher is the in-process one) and the restart-based
    runtime of jobs whose launcher is ``torchrun``."""

    default: Runtime
    torchrun: TorchrunRuntime

    def of(self, spec: JobSpec | None) -> Runtime:
        """The runtime that runs a job of ``spec``: chosen by its launcher, whatever the trainer's runtime."""
        return self.torchrun if spec is not None and spec.launcher is Launcher.TORCHRUN else self.default


@dataclass(frozen=True)
class Plan:
    """What decide leaves act to carry out at this step: each live job's nodes (its trainer's ledger:
    what the last decision gave it, less what it lost since) and the jobs its last decisions profile."""

    nodes: dict[str, tuple[str, ...]]
    profiling: frozenset[str]
