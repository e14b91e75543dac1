"""Elastic runtimes: how the job manager starts a job's workers and changes their set.

The job manager never starts workers itself: it asks the runtime for a
:class:`LaunchSpec` per worker, hands it to the node agent on that node, and
tells the runtime the new membership with :meth:`Runtime.set_members`.
Workers not in the new membership leave at their next commit point; new ones
(started ahead of time) join there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class LaunchSpec:
    """What a node agent runs for one worker: argv (no shell), extra env, cwd."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


class Runtime(Protocol):
    """One elastic runtime (``torch``: in-process elastic DDP; ``horovod``: Elastic Horovod)."""

    name: str

    def start(self) -> None:
        """Start daemon-side services (e.g. the rendezvous store)."""

    def close(self) -> None:
        """Stop daemon-side services; idempotent."""

    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str) -> LaunchSpec:
        """The argv/env for worker ``worker_id`` of ``job_id`` on ``node``."""

    def set_members(self, job_id: str, members: Sequence[str]) -> int:
        """Publish the job's new ordered worker set; returns the new generation number."""

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        """Drop the job's membership and rendezvous state; idempotent.

        ``keep_state=True`` (a suspended job that may come back) lets the runtime
        keep the job's last committed training state to resume from;
        ``keep_state=False`` (the job ended) drops that too.
        """
