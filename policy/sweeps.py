"""When a sweep opens its next trial, and how a sweep's or an array's short jobs are admitted and grown: pure.

A new trial is opened only when none of the sweep's open trials waits for nodes, so each is chosen with the
most results known and a trial a recall suspended resumes first. A stream (``JobView.group``) holds at most
``stream_share`` of the Pjmax slots, its further jobs behind every other queued job, and a stream job is not grown
at a pause its work left cannot repay (docs/training/sweeps.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from curves import throughput_at


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


def stream_bound(stream_share: float, max_running: int) -> int:
    """The most of the Pjmax slots the jobs of one sweep or array hold at once (0: no bound): at least 1."""
    if stream_share <= 0 or max_running <= 0:
        return 0
    return max(1, int(stream_share * max_running))


def stream_order(queue: list[str], group_of: Mapping[str, str], held: Mapping[str, int], bound: int) -> list[str]:
    """The queue with each stream's jobs beyond its ``bound`` moved behind every other job, FCFS kept within each
    part; ``group_of``: each job's stream (``""``: none), ``held``: the slots each stream holds now."""
    if bound <= 0:
        return list(queue)
    seen = dict(held)
    first: list[str] = []
    later: list[str] = []
    for job_id in queue:
        group = group_of.get(job_id, "")
        if not group:
            first.append(job_id)
            continue
        seen[group] = seen.get(group, 0) + 1
        (first if seen[group] <= bound else later).append(job_id)
    return first + later


def grow_repays(work_left: float, rate_now: float, rate_up: float, up_cost_s: float) -> bool:
    """Whether growing a short job from ``rate_now`` to ``rate_up`` (samples/s) finishes its ``work_left`` samples
    sooner, its scale-up pause ``up_cost_s`` included."""
    if rate_up <= rate_now or rate_now <= 0:
        return rate_now <= 0 < rate_up
    return work_left / rate_up + up_cost_s < work_left / rate_now


def most_repaid(work_left: float, count: int, hi: int, curve: Mapping[int, float], up_cost_s: float) -> int:
    """The largest count in ``(count, hi]`` to which growing a running job repays its scale-up pause on ``curve``,
    else ``count``; ``hi`` if it is at most ``count``."""
    if hi <= count:
        return hi
    rate_now = throughput_at(curve, count)
    best = count
    for n in range(count + 1, hi + 1):
        if grow_repays(work_left, rate_now, throughput_at(curve, n), up_cost_s):
            best = n
    return best


def stream_full(group: str) -> str:
    """Why a stream's queued job waits while its stream holds its most slots."""
    return f"its sweep or array ({group}) holds its most slots (policy.stream_share)"
