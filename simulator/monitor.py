"""The simulated job monitor: step records a job would report, drawn from its TRUE curve.

The daemon's monitor turns a training loop's ``report(samples)`` lines into
:class:`profiler.Record` s; here :func:`profiler.records.synthesize` makes the
same stream. A job runs a fixed per-node batch (:data:`PER_NODE_BATCH`), so at
``n`` nodes one step processes ``n * PER_NODE_BATCH`` samples and takes
``n * PER_NODE_BATCH / true_rate(n)`` seconds, times ``U(1 - noise, 1 + noise)``
(:data:`RECORD_NOISE` = 3% by default). The first :data:`WARMUP_STEPS` steps after
a (re)start take :data:`WARMUP_FACTOR` times longer, which the estimator drops.
Seeds derive from ``(seed, job, node count, chunk)``, so a replay is deterministic.
"""

from __future__ import annotations

import zlib
from typing import Mapping

from allocator import throughput_at
from profiler import Record, Segment, ThroughputEstimator, synthesize

PER_NODE_BATCH = 256  # samples per node per step (e.g. 6 GPUs x ~43 images)
RECORD_NOISE = 0.03  # step times vary by +-3% (uniform)
WARMUP_STEPS = 2
WARMUP_FACTOR = 2.0
CHUNK = 16  # records generated at a time


def step_seconds(true_curve: Mapping[int, float], n: int) -> float:
    rate = throughput_at(true_curve, n)
    if rate <= 0:
        raise ValueError(f"true rate at {n} nodes is {rate}: a job cannot run there")
    return n * PER_NODE_BATCH / rate


def _seed(*parts: object) -> int:
    return zlib.crc32(":".join(str(p) for p in parts).encode())


class StepFeed:
    """Records of one job running at ``n`` nodes from ``start`` (its first step ends one step later)."""

    def __init__(self, job_id: str, true_curve: Mapping[int, float], n: int, start: float,
                 seed: int = 0, noise: float = RECORD_NOISE) -> None:
        self.job_id = job_id
        self.n = n
        self.step_s = step_seconds(true_curve, n)
        self.noise = noise
        self.seed = seed
        self.t = start
        self.chunks = 0

    def next_records(self, k: int = CHUNK) -> list[Record]:
        first = self.chunks == 0
        seg = Segment(self.n, k, self.step_s, self.n * PER_NODE_BATCH,
                      warmup_steps=WARMUP_STEPS if first else 0, warmup_factor=WARMUP_FACTOR)
        recs = synthesize([seg], start=self.t, noise=self.noise,
                          seed=_seed(self.seed, self.job_id, self.n, self.chunks))
        self.chunks += 1
        self.t = recs[-1].timestamp
        return recs


def run_until_stable(feed: StepFeed, estimator: ThroughputEstimator, deadline: float,
                     rel_ci: float = 0.05) -> float | None:
    """Feed ``estimator`` from ``feed`` until its estimate at ``feed.n`` is stable; return the time of
    the record that made it so, or ``None`` if the records pass ``deadline`` first."""
    while True:
        for rec in feed.next_records():
            if rec.timestamp > deadline:
                return None
            estimator.add(rec)
            if estimator.stable(feed.n, rel_ci):
                return rec.timestamp


def measured_rate(job_id: str, true_curve: Mapping[int, float], n: int, work_s: float,
                  seed: int = 0, noise: float = RECORD_NOISE, rel_ci: float = 0.05) -> float | None:
    """What the monitor's estimator says after a job ran ``work_s`` seconds at ``n`` nodes: the
    stable estimate from the records of that run (at most 4 chunks), or ``None`` if it is not stable."""
    feed = StepFeed(job_id, true_curve, n, 0.0, seed=_seed(seed, "refine"), noise=noise)
    est = ThroughputEstimator()
    at = run_until_stable(feed, est, deadline=min(work_s, 4 * CHUNK * feed.step_s * WARMUP_FACTOR), rel_ci=rel_ci)
    if at is None:
        return None
    e = est.estimate(n)
    return None if e is None else e.rate
