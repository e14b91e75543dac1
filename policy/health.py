"""Pure: when a running job is stalled, when a failing one has failed for good, and why a queued job waits while
its workers start. The daemon records what it saw and calls these; the rules, for operators, are in
docs/operators.md: silence past ``stall_after`` is a stall, twice that a restart from the checkpoint, and a
script that crashes before its first step twice in a row fails at once (it would crash again).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

STALL_RESTART_FACTOR = 2.0
"""A stalled job is restarted once its silence reaches this many times its bound."""
EARLY_FAILURES_FATAL = 2
"""Failures before the first step, in a row, that end a job at once."""


class Stall(enum.Enum):
    """What a job's silence calls for: nothing, shown stalled (past its bound), its workers restarted (past twice
    its bound), or FAILED (past twice its bound after its last allowed restart)."""

    NONE = "none"
    STALLED = "stalled"
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class StallRule:
    """``after_s``: seconds without progress before a job is stalled; ``restarts``: restarts for a stall before the
    next one fails it."""

    after_s: float
    restarts: int

    def __post_init__(self) -> None:
        if not self.after_s > 0 or self.restarts < 0:
            raise ValueError(f"a stall rule needs after_s > 0 and restarts >= 0, got {self.after_s}, {self.restarts}")


def silent_for(now: float, workers_since: float | None, progress_at: float | None) -> float:
    """Seconds since the later of its workers' start and its last progress (0 when it runs no worker)."""
    if workers_since is None:
        return 0.0
    return max(0.0, now - max(workers_since, progress_at if progress_at is not None else workers_since))


def stall_verdict(silent_s: float, rule: StallRule, restarted: int, reports: bool = True) -> Stall:
    """What ``silent_s`` seconds without progress call for, after ``restarted`` restarts for a stall."""
    if not reports or silent_s < rule.after_s:
        return Stall.NONE
    if silent_s < STALL_RESTART_FACTOR * rule.after_s:
        return Stall.STALLED
    return Stall.FAIL if restarted >= rule.restarts else Stall.RESTART


def reports_progress(restarted_script: bool, worker_batch: int | None, has_reported: bool) -> bool:
    """Whether a job's silence means anything: a ``torchrun`` script (``restarted_script``) without ``worker_batch``
    is judged only once it has reported."""
    return not restarted_script or worker_batch is not None or has_reported


def stall_text(silent_s: float, rule: StallRule, restarted: int) -> str:
    """How ``status`` words a stalled job."""
    then = "fails" if restarted >= rule.restarts else "is restarted from its checkpoint"
    return (f"stalled: no progress for {silent_s:.0f} s (bound {rule.after_s:g} s); it {then} at "
            f"{STALL_RESTART_FACTOR * rule.after_s:g} s" + (f" (restarts so far: {restarted})" if restarted else ""))


def failed_for_good(failures: int, early_in_a_row: int, max_failures: int) -> str | None:
    """Why a job whose worker just failed ends FAILED now (None: it goes on): ``failures`` since its last progress,
    ``early_in_a_row`` of them in a row before a first step."""
    if early_in_a_row >= EARLY_FAILURES_FATAL:
        return f"failed {early_in_a_row} times in a row before its first step"
    if failures >= max_failures:
        return f"{failures} workers failed without progress"
    return None


def pending_reason(policy_reason: str, workers: int, ready: int, known: bool, adopting: bool) -> str:
    """Why a queued job waits, always something: the policy's reason, its workers starting, or the daemon has not
    decided on it yet."""
    if policy_reason:
        return policy_reason
    if workers:
        return f"starting: workers importing ({ready} of {workers} ready)"
    if adopting:
        return "the daemon waits for the last daemon's agents to come back before it decides"
    if known:
        return "submitted: the daemon decides at its next step"
    return "submitted: not read by the daemon yet"


def rate_is_current(active: bool, stalled: bool, report_generation: int, world_generation: int) -> bool:
    """Whether a job's last measured rate says what it trains now: it runs, not stalled, and its reports come from
    the world it runs in."""
    return active and not stalled and report_generation >= world_generation
