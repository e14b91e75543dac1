"""Elastic runtimes: the daemon asks one for a :class:`LaunchSpec` per worker, which the node agent runs,
and tells it each new membership (:meth:`Runtime.set_members`); workers leave or join at a commit point."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence


@dataclass(frozen=True)
class LaunchSpec:
    """What a node agent runs for one worker: argv (no shell), extra env, cwd, and how many processes.

    ``slots``: K, the worker's ranks on the node: K processes of ``argv`` (local ranks 0 .. K-1, each with its
    own device, cores, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``: :mod:`spawner.slots`), ending together.
    ``starts_own_ranks``: one process starts its K ranks itself (the ``torchrun`` rank agent); the agent
    runs it alone and tells it K in ``MALLETRAIN_LOCAL_RANKS``."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    slots: int = 1
    starts_own_ranks: bool = False


class Runtime(Protocol):
    """One elastic runtime; the hooks after the first five methods default to nothing, so the daemon calls
    every one and a runtime overrides only what it needs."""

    name: str
    warm_modules: tuple[str, ...] = ()  # what its workers import: agents prepare a process ahead
    COMMAND_BESIDE_DAEMON: bool = False  # the job's command runs in a process of the daemon's own

    @property
    def port(self) -> int:
        """Where the runtime serves its rendezvous (0: none); kept across daemon restarts."""
        return 0

    def start(self) -> None:
        """Start daemon-side services (e.g. the rendezvous store)."""

    def close(self) -> None:
        """Stop daemon-side services; idempotent."""

    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str,
                    slots: int = 1) -> LaunchSpec:
        """The argv/env for worker ``worker_id`` of ``job_id`` on ``node``, which gives the job ``slots`` worker
        slots (K, or fewer where it asks); its :attr:`LaunchSpec.slots` says how many processes the agent runs."""

    def set_members(self, job_id: str, members: Sequence[str]) -> int:
        """Publish the job's new ordered worker set; returns the new generation number."""

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        """Drop the job's membership and rendezvous state; idempotent. ``keep_state=True`` (a suspended job)
        keeps its last committed training state to resume from; ``False`` (the job ended) drops it too."""

    def ready(self, job_id: str, worker_id: str) -> bool:
        """Whether a worker started ahead of time is ready to join (default: as soon as it started)."""
        return True

    def resume_generation(self, job_id: str, generation: int) -> None:
        """After a daemon restart: number the job's generations on from ``generation`` (and, for
        runtimes that keep one, restore the job's checkpoint). Default: nothing to do."""
        return None

    def readopt(self, job_id: str, command: Sequence[str], workers: dict[str, str]) -> int | None:
        """Take over a job an earlier daemon ran, with its ``workers`` (worker id -> node), e.g. a
        Horovod driver left running; returns the generation taken over. Default: nothing to take."""
        return None

    def restarted_from_scratch(self, job_id: str) -> bool:
        """Whether the generation :meth:`set_members` last published starts training from step 0 (none of the last
        world's workers in it, no checkpoint). Default: never (a runtime that cannot tell)."""
        return False

    def finished(self, job_id: str) -> str | None:
        """Why the job's training is over while its workers may still run (every rank of a world exited 0),
        else None: the daemon ends it COMPLETED at once, so a recall before the processes exit does not start
        it again. Default: None (a worker's exit 0 says it)."""
        return None

    def persist_checkpoints(self, jobs: Iterable[str]) -> list[str]:
        """Copy new checkpoints of ``jobs`` to the state dir; returns the jobs copied. Called every
        iteration. Default: none kept."""
        return []

    def use_secrets(self, secret_for: Callable[[str], str]) -> None:
        """The daemon's per-job signing secret (``secret_for(job_id)``), for runtimes that hand it to
        what they start or check it themselves. Default: not needed."""
        return None
