"""When a sweep (a search or a job array's daemon-driven cousin) opens its next trial: pure.

A sweep's trials are short and many. The daemon asks Optuna for a trial's values only when the
trial can start soon, so each trial is chosen with the most results known: a new trial is opened
when none of the sweep's open trials waits for nodes (every one of them runs), so the sweep keeps
exactly one trial in the queue, and runs as many at once as the policy gives nodes to. A trial
that a recall suspended waits in the queue too, so no new trial is opened in its place: it resumes
first (FCFS) and no trial is lost to a recall.

The policy knows a sweep's or an array's jobs are short and many (:attr:`policy.model.JobView.group`
names the stream; :class:`policy.Policy` applies both rules, the daemon and the simulator only say
whose stream each job is):

- **admitted as a stream, bounded**: a stream holds at most ``stream_share`` of the Pjmax slots
  (:func:`stream_bound`); its jobs beyond that wait behind every other queued job
  (:func:`stream_order`) and are admitted beyond Pjmax only onto nodes no other job can use (adaptive
  admission's surplus), so an array of 20 elements submitted first keeps no later job out. Fair share
  between users (:mod:`policy.fairness`) applies on top, unchanged;
- **not grown at a cost it cannot repay**: a running stream job whose work left is known is given no
  more nodes than those whose speed-up finishes it sooner, its scale-up pause included
  (:func:`most_repaid`).
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


# ---------------------------------------------------------------- short and many: admission and allocation


def stream_bound(stream_share: float, max_running: int) -> int:
    """The most of the ``max_running`` (Pjmax) slots the jobs of one sweep or array hold at once
    (0: no bound, when ``stream_share`` is 0 or there is no Pjmax): at least 1, so a stream always runs."""
    if stream_share <= 0 or max_running <= 0:
        return 0
    return max(1, int(stream_share * max_running))


def stream_order(queue: list[str], group_of: Mapping[str, str], held: Mapping[str, int], bound: int) -> list[str]:
    """The queue with each stream's jobs beyond its ``bound`` moved behind every other job, FCFS kept
    within each part. ``group_of``: each job's sweep or array (``""``: none, never moved); ``held``: how
    many slots each stream holds now. A stream's trials are admitted as a stream: up to its bound in its
    queue place, the rest only after the jobs behind it, so a stream of many short jobs submitted first
    never keeps a later job out of a slot (and they still take what nodes no other job can use)."""
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
    """Whether growing a short job from ``rate_now`` to ``rate_up`` (samples/s) finishes its
    ``work_left`` samples sooner, its scale-up pause ``up_cost_s`` included. A trial near its end is
    not grown at a rescale cost it cannot repay (the allocator's horizon outlives it)."""
    if rate_up <= rate_now or rate_now <= 0:
        return rate_now <= 0 < rate_up
    return work_left / rate_up + up_cost_s < work_left / rate_now


def most_repaid(work_left: float, count: int, hi: int, curve: Mapping[int, float], up_cost_s: float) -> int:
    """The largest count in ``(count, hi]`` to which growing a running job with ``work_left`` samples to
    go repays its scale-up pause on ``curve`` (samples/s, :func:`curves.throughput_at` between its
    points), else ``count``; ``hi`` if it is at most ``count``: the job's max in this decision."""
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
