"""When a sweep (a search or a job array's daemon-driven cousin) opens its next trial: pure.

A sweep's trials are short and many. The daemon asks Optuna for a trial's values only when the
trial can start soon, so each trial is chosen with the most results known: a new trial is opened
when none of the sweep's open trials waits for nodes (every one of them runs), so the sweep keeps
exactly one trial in the queue, and runs as many at once as the policy gives nodes to. A trial
that a recall suspended waits in the queue too, so no new trial is opened in its place: it resumes
first (FCFS) and no trial is lost to a recall.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SweepProgress:
    """What a driver knows of one sweep: trials wanted, asked so far, and open ones that wait for nodes."""

    trials: int  # how many the sweep runs in all
    asked: int  # trials opened so far (running, waiting or ended)
    waiting: int  # open trials with no nodes (queued, or suspended by a recall)


def trials_to_open(p: SweepProgress) -> int:
    """How many new trials to open now: one while none waits and some are left, else none."""
    if p.waiting > 0 or p.asked >= p.trials:
        return 0
    return 1
