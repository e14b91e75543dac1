"""The simulated job monitor: step records a job would report, drawn from its TRUE curve. The daemon's monitor turns a
training loop's ``report(samples)`` lines into :class:`profiler.Record` s; here :func:`profiler.records.synthesize`
makes the same stream. A job runs a fixed per-node batch (:data:`PER_NODE_BATCH`), so at ``n`` nodes one step processes
``n * PER_NODE_BATCH`` samples and takes ``n * PER_NODE_BATCH / true_rate(n)`` seconds, times ``U(1 - noise, 1 +
noise)`` (:data:`RECORD_NOISE` = 3% by default). The first :data:`WARMUP_STEPS` steps after a (re)start take
:data:`WARMUP_FACTOR` times longer, which the estimator drops. Seeds derive from ``(seed, job, node count, chunk)``, so
a replay is deterministic."""

from __future__ import annotations

import math
import zlib
from bisect import bisect_right
from itertools import islice
from operator import itemgetter
from typing import TYPE_CHECKING, Iterator, Mapping

from curves import throughput_at
from policy import JobEvidence, evidence_from
from profiler import Estimate, Record, Segment, ThroughputEstimator, rescale_events, synthesize
from profiler.estimators import Figures, RescaleSummary
from profiler.records import iter_records

if TYPE_CHECKING:
    from profiler import RescaleEvent

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
    return zlib.crc32(":".join(map(str, parts)).encode())


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
        # _seed(seed, job_id, n, chunk) is the checksum of this and the chunk: made once, not at every chunk
        self._seed_prefix = f"{seed}:{job_id}:{n}:"

    def next_records(self, k: int = CHUNK) -> list[Record]:
        recs = synthesize([self._segment(k)], start=self.t, noise=self.noise, seed=self._chunk_seed())
        self.chunks += 1
        self.t = recs[-1].timestamp
        return recs

    def records(self) -> Iterator[Record]:
        """Records one at a time, chunk after chunk: the stream of repeated :meth:`next_records`, drawn
        only as far as it is read."""
        while True:
            t = self.t
            for rec in iter_records([self._segment(CHUNK)], start=t, noise=self.noise, seed=self._chunk_seed()):
                t = rec.timestamp
                yield rec
            self.chunks += 1
            self.t = t

    def _segment(self, k: int) -> Segment:
        return Segment(self.n, k, self.step_s, self.n * PER_NODE_BATCH,
                       warmup_steps=WARMUP_STEPS if self.chunks == 0 else 0, warmup_factor=WARMUP_FACTOR)

    def _chunk_seed(self) -> int:
        return zlib.crc32(f"{self._seed_prefix}{self.chunks}".encode())


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


_TIME = itemgetter(0)

MAX_CHUNKS = 8  # records of one run at one count: at most this many chunks (128 steps)
PROBE_STEPS = 4  # steady steps on each side of a rescale, for the pause estimate


class SimJobMonitor:
    """What the daemon's job monitor would have measured for one simulated job. Every run at a node count (from the
    moment its pause ends) yields step records drawn from the job's TRUE curve (:class:`StepFeed`), fed to a real
    :class:`profiler.ThroughputEstimator` until its estimate is stable (or :data:`MAX_CHUNKS` chunks): a monitor keeps
    the newest estimate per count, and records arrive over simulated time, so :meth:`evidence` at ``now`` shows only the
    records that exist by then (a run's records are drawn only as far as a look reaches, or to the stable point when
    :attr:`stable_at` is asked: a run cut short by the next change draws no more than was read). Every rescale between
    two non-zero counts yields a short record stream around the pause (:data:`PROBE_STEPS` steps at each size),
    measured by the real :func:`profiler.rescale_events`. Nothing here reads a true value but the curve that makes the
    records."""

    def __init__(self, job_id: str, true_curve: Mapping[int, float], seed: int = 0, noise: float = RECORD_NOISE,
                 rel_ci: float = 0.05, rates: bool = True, costs: bool = True) -> None:
        self.job_id = job_id
        self.curve = true_curve
        self.seed = seed
        self.noise = noise
        self.rel_ci = rel_ci
        self.want_rates = rates
        self.want_costs = costs
        self.rates: dict[int, "Estimate"] = {}
        self.events: list["RescaleEvent"] = []
        self._stable_at: float | None = None  # when the current run's estimate became stable (once drawn that far)
        # the current run's estimates at self._run_n drawn so far: (record time, the figures of the estimate after
        # it); the Estimate is made only for the one a look takes
        self._snaps: list[tuple[float, Figures]] = []
        self._pos = 0
        self._run_n = 0
        # the current run's records not drawn yet (None: no run, or it is drawn to its end), its estimator,
        # and the time of the last record drawn (the run's start before any)
        self._records: Iterator[Record] | None = None
        self._est = ThroughputEstimator()
        self._drawn_to = 0.0
        self._runs = 0
        self._evidence: JobEvidence | None = None
        self._summary = RescaleSummary()  # the events' pauses, sorted as they come

    def change(self, t: float, old_n: int, new_n: int, resume_at: float) -> None:
        """The job went from ``old_n`` to ``new_n`` nodes at ``t`` and works again from ``resume_at``."""
        self._feed(t)
        self._snaps, self._pos, self._stable_at, self._records = [], 0, None, None
        if self.want_costs and old_n > 0 and new_n > 0 and old_n != new_n:
            self._probe(t, old_n, new_n, max(0.0, resume_at - t))
        if self.want_rates and new_n > 0:
            self._start_run(new_n, max(t, resume_at))

    @property
    def stable_at(self) -> float | None:
        """When the current run's estimate becomes stable (None: no run, or it never does within
        :data:`MAX_CHUNKS` chunks); draws the run's records that far."""
        self._draw(math.inf)
        return self._stable_at

    def evidence(self, now: float) -> JobEvidence:
        if self._feed(now) or self._evidence is None:
            # the events' summary, kept as they came, is what evidence_from(self.rates, self.events) makes
            self._evidence = evidence_from(self.rates, self._summary)
        return self._evidence

    def _feed(self, now: float) -> bool:
        """Take the current run's estimates made by ``now``; the newest is the one kept."""
        self._draw(now)
        pos = self._pos
        if pos == len(self._snaps) or self._snaps[pos][0] > now:
            return False
        end = bisect_right(self._snaps, now, lo=pos, key=_TIME)
        self.rates[self._run_n] = Estimate(self._run_n, *self._snaps[end - 1][1])
        self._pos = end
        return True

    def _start_run(self, n: int, start: float) -> None:
        self._runs += 1
        feed = StepFeed(self.job_id, self.curve, n, start, seed=_seed(self.seed, self._runs), noise=self.noise)
        self._run_n = n
        self._est = ThroughputEstimator()
        self._records = islice(feed.records(), MAX_CHUNKS * CHUNK)  # drawn until the estimate is stable
        self._drawn_to = start

    def _draw(self, until: float) -> None:
        """Draw the current run's records up to the first one after ``until`` (each record's estimate is
        the one a look at its time shows), or to the one that makes the estimate stable."""
        records = self._records
        if records is None:
            return
        est, n = self._est, self._run_n
        while self._drawn_to <= until:
            rec = next(records, None)
            if rec is None:  # MAX_CHUNKS chunks, never stable
                self._records = None
                return
            self._drawn_to = rec.timestamp
            est.add(rec)
            figures = est.figures(n)
            if figures is not None:
                self._snaps.append((rec.timestamp, figures))
                if est.stable(n, self.rel_ci):
                    self._stable_at = rec.timestamp
                    self._records = None
                    return

    def _probe(self, t: float, old_n: int, new_n: int, pause: float) -> None:
        old_s, new_s = step_seconds(self.curve, old_n), step_seconds(self.curve, new_n)
        segs = [Segment(old_n, PROBE_STEPS, old_s, old_n * PER_NODE_BATCH),
                Segment(new_n, PROBE_STEPS, new_s, new_n * PER_NODE_BATCH, pause_before_s=pause)]
        records = iter_records(segs, start=t - PROBE_STEPS * old_s, noise=self.noise,
                               seed=_seed(self.seed, self.job_id, "rescale", len(self.events)))
        for event in rescale_events(records, warmup_steps=0, settle_steps=PROBE_STEPS - 1):
            self.events.append(event)
            self._summary.add(event)
        self._evidence = None
