"""The job monitor: a ZeroMQ PULL socket on the daemon that every job's rank 0 reports to.

Frames are :class:`malletrain.messages.Report` envelopes. :meth:`Monitor.drain`
reads whatever is queued without blocking (in batches), decodes each frame,
and feeds the job's profiler estimators (throughput per node count, rescale
pauses). A bad frame is counted and logged (rate-limited), never fatal.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import zmq

from malletrain.messages import MessageError, Report, decode, decode_batch, decode_report
from profiler.estimators import RescaleCostEstimator, RescaleEvent, ThroughputEstimator
from profiler.records import Record, RecordError

log = logging.getLogger(__name__)


@dataclass
class JobStats:
    """What the monitor knows about one job."""

    job: str
    samples: int = 0
    reports: int = 0
    last_time: float = 0.0
    world_size: int = 0
    generation: int = 0
    out_of_order: int = 0
    seq_gaps: int = 0
    throughput: ThroughputEstimator = field(default_factory=ThroughputEstimator)
    rescale: RescaleCostEstimator = field(default_factory=RescaleCostEstimator)
    _last_seq: dict[str, int] = field(default_factory=dict)
    _rescales_taken: int = 0

    def add(self, rep: Report) -> None:
        self.reports += 1
        self.samples += rep.samples
        last = self._last_seq.get(rep.worker)
        if last is not None and rep.seq > last + 1:
            self.seq_gaps += rep.seq - last - 1
        self._last_seq[rep.worker] = rep.seq if last is None else max(last, rep.seq)
        if rep.timestamp > self.last_time:
            self.last_time = rep.timestamp
            self.world_size = rep.world_size
            self.generation = max(self.generation, rep.generation)
        if rep.samples < 1:
            return
        try:
            rec = Record(rep.samples, rep.timestamp, rep.world_size)
            self.throughput.add(rec)
            self.rescale.add(rec)
        except RecordError:
            self.out_of_order += 1

    def rates(self) -> dict[int, float]:
        return self.throughput.rates()

    def new_rescales(self) -> list[RescaleEvent]:
        """Rescale pauses closed since the last call."""
        events = self.rescale.events()
        out = events[self._rescales_taken:]
        self._rescales_taken = len(events)
        return out


class Monitor:
    """The PULL socket and the per-job statistics."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0", ctx: zmq.Context | None = None, batch: int = 4096) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.bind(bind)
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.batch = batch
        self.jobs: dict[str, JobStats] = {}
        self.received = 0
        self.bad = 0
        self._last_bad_log = 0.0

    def job(self, job_id: str) -> JobStats:
        stats = self.jobs.get(job_id)
        if stats is None:
            stats = self.jobs[job_id] = JobStats(job_id)
        return stats

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def drain(self, timeout_ms: int = 0, max_frames: int | None = None) -> int:
        """Ingest every queued frame (waiting up to ``timeout_ms`` for the first); returns how many."""
        sock = self.sock
        if timeout_ms > 0 and not sock.poll(timeout_ms):
            return 0
        recv = sock.recv
        n = 0
        limit = max_frames if max_frames is not None else 1 << 62
        while n < limit:
            batch: list[bytes] = []
            try:
                for _ in range(min(self.batch, limit - n)):
                    batch.append(recv(zmq.NOBLOCK, copy=True))
            except zmq.Again:
                pass
            if batch:
                self._ingest_batch(batch)
            n += len(batch)
            if len(batch) < self.batch:
                break
        return n

    def _ingest_batch(self, frames: list[bytes]) -> None:
        self.received += len(frames)
        jobs = self.jobs
        for env in decode_batch(frames):
            try:
                if isinstance(env, MessageError):
                    raise env
                rep = decode_report(env)
            except MessageError as exc:
                self._bad(str(exc))
                continue
            stats = jobs.get(rep.job)
            if stats is None:
                stats = jobs[rep.job] = JobStats(rep.job)
            stats.add(rep)

    def ingest(self, frame: bytes) -> None:
        self.received += 1
        try:
            rep = decode_report(decode(frame))
        except MessageError as exc:
            self._bad(str(exc))
            return
        stats = self.jobs.get(rep.job)
        if stats is None:
            stats = self.jobs[rep.job] = JobStats(rep.job)
        stats.add(rep)

    def _bad(self, why: str) -> None:
        self.bad += 1
        now = time.monotonic()
        if now - self._last_bad_log > 5.0:
            self._last_bad_log = now
            log.warning("monitor: dropped a bad frame (%d so far): %s", self.bad, why)

    def close(self) -> None:
        self.sock.close(0)
