"""Pure: when a running job is stalled, when a failing one has failed for good, and why a queued job
waits while its workers start. The daemon records what it saw (times, counts) and calls these; no
driver holds a rule of its own about them.

Stalled
    A job whose workers run but report no progress for ``after_s`` seconds (counted from the later
    of its last progress and the start of its workers) is *stalled*: ``status`` says so and for how
    long. At twice ``after_s`` it is *restarted*: its workers are stopped and started again, and
    they resume from the job's last checkpoint. A job restarted ``restarts`` times without progress
    in between *fails* at the next stall instead. A job that cannot report progress (a ``torchrun``
    script without ``worker_batch``) is never called stalled: its silence says nothing.

Failed for good
    A worker that fails (its own code, not a stop we sent) counts toward ``max_failures``, and the
    count starts again at the job's next progress. A failure *before the first step* (no progress
    since that worker started) that follows another such failure ends the job at once: a script
    that crashes at start crashes again, and five tries only hold nodes longer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

STALL_RESTART_FACTOR = 2.0
"""A stalled job is restarted once its silence reaches this many times its bound."""
EARLY_FAILURES_FATAL = 2
"""Failures before the first step, in a row, that end a job at once."""


class Stall(enum.Enum):
    """What a job's silence calls for."""

    NONE = "none"
    """It reports progress (or cannot): nothing to say."""
    STALLED = "stalled"
    """Silent past its bound: shown as stalled."""
    RESTART = "restart"
    """Silent past twice its bound: stop its workers and start them again (from its checkpoint)."""
    FAIL = "fail"
    """Silent past twice its bound after its last allowed restart: FAILED."""


@dataclass(frozen=True)
class StallRule:
    """``after_s``: seconds without progress before a job is stalled; ``restarts``: restarts for a stall
    (without progress in between) before the next stall fails it."""

    after_s: float
    restarts: int

    def __post_init__(self) -> None:
        if not self.after_s > 0 or self.restarts < 0:
            raise ValueError(f"a stall rule needs after_s > 0 and restarts >= 0, got {self.after_s}, {self.restarts}")


def silent_for(now: float, workers_since: float | None, progress_at: float | None) -> float:
    """Seconds the job has been silent: since the later of its workers' start and its last progress
    (0 when it runs no worker)."""
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
    """Whether a job's silence means anything: a ``torchrun`` script (``restarted_script``) reports only
    through the launcher's step count (``worker_batch``) or its own ``report()`` calls, so without
    ``worker_batch`` it is judged only once it has reported."""
    return not restarted_script or worker_batch is not None or has_reported


def stall_text(silent_s: float, rule: StallRule, restarted: int) -> str:
    """How ``status`` words a stalled job."""
    then = "fails" if restarted >= rule.restarts else "is restarted from its checkpoint"
    return (f"stalled: no progress for {silent_s:.0f} s (bound {rule.after_s:g} s); it {then} at "
            f"{STALL_RESTART_FACTOR * rule.after_s:g} s" + (f" (restarts so far: {restarted})" if restarted else ""))


def failed_for_good(failures: int, early_in_a_row: int, max_failures: int) -> str | None:
    """Why a job whose worker just failed ends FAILED now (None: it goes on). ``failures``: failures
    since its last progress; ``early_in_a_row``: of those, the last ones that came before a first step."""
    if early_in_a_row >= EARLY_FAILURES_FATAL:
        return f"failed {early_in_a_row} times in a row before its first step"
    if failures >= max_failures:
        return f"{failures} workers failed without progress"
    return None


def starting_reason(workers: int, ready: int) -> str:
    """The waiting reason of a job given nodes whose workers have not formed its world yet."""
    return f"starting: workers importing ({ready} of {workers} ready)"


def pending_reason(policy_reason: str, workers: int, ready: int, known: bool, adopting: bool) -> str:
    """Why a queued job waits, always something: the policy's reason; else its workers starting; else
    the daemon has not decided on it yet (``known``: the daemon has read it; ``adopting``: it waits for
    the last daemon's agents before it decides)."""
    if policy_reason:
        return policy_reason
    if workers:
        return starting_reason(workers, ready)
    if adopting:
        return "the daemon waits for the last daemon's agents to come back before it decides"
    if known:
        return "submitted: the daemon decides at its next step"
    return "submitted: not read by the daemon yet"


def rate_is_current(active: bool, stalled: bool, report_generation: int, world_generation: int) -> bool:
    """Whether a job's last measured rate says what it trains now: it runs (not queued, suspended or
    stalled) and its reports come from the world it runs in (not the one before a restart or rescale)."""
    return active and not stalled and report_generation >= world_generation
