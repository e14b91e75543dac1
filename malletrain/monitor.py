"""The job monitor: a ZeroMQ PULL socket on the daemon that every job's rank 0 reports to.

Frames are signed :class:`malletrain.messages.Report` envelopes (see that module
for the format and why HMAC). The monitor knows only the jobs its owner registers
(:meth:`Monitor.register` with the job's secret, :meth:`Monitor.forget`); it keeps
no state for any other job id. :meth:`Monitor.drain` reads whatever is queued
without blocking and, per frame, in this order:

1. size (``MAX_FRAME``; libzmq already cut the peer off above ``TRANSPORT_MAX_FRAME``),
2. JSON and envelope shape, version, type,
3. signed at all, for a registered job, signed with *that* job's key,
4. every payload field by type and range,
5. ``seq`` above the last accepted from that worker (replay window),

then feeds the job's profiler estimators (throughput per node count, rescale
pauses). Every rejection is counted under its :class:`~malletrain.messages.Reason`
(:meth:`Monitor.counts`, for metrics) and logged, at most once per reason every
few seconds; nothing a sender does raises out of :meth:`Monitor.drain`.

Memory: per registered job a :class:`JobStats` whose replay window holds at most
``MAX_WORKERS`` senders; per connection libzmq queues at most ``RCVHWM`` frames of
at most ``TRANSPORT_MAX_FRAME`` bytes.

The daemon's side of the secrets: :func:`load_master_key` (one private key file in
the state dir) and :func:`job_secret` (a job's secret derived from it, so nothing
per job needs storing and a restarted daemon re-derives what running workers hold).
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import zmq

from malletrain.messages import (
    MAX_FRAME,
    TRANSPORT_MAX_FRAME,
    MessageError,
    Reason,
    Report,
    decode,
    decode_report,
    quote,
    secret_key,
    verify,
)
from profiler.estimators import RescaleCostEstimator, RescaleEvent, ThroughputEstimator
from profiler.records import Record, RecordError

log = logging.getLogger(__name__)

MAX_WORKERS = 64
"""Senders a job's replay window remembers; the least recently heard is retired first."""

RCVHWM = 10_000
"""Frames libzmq queues per sender connection before it pushes back."""

LOG_EVERY_S = 5.0
"""At most one log line per rejection reason this often."""

MASTER_KEY_BYTES = 32


# ---------------------------------------------------------------- replay window
@dataclass
class ReplayWindow:
    """Last accepted ``seq`` per worker of one job; a frame must be above it.

    At most ``max_workers`` workers are remembered. Retiring the least recently
    heard one raises ``floor`` to its last timestamp, and a worker not remembered
    must report after ``floor``: a retired worker's old frames stay replays.
    """

    max_workers: int = MAX_WORKERS
    floor: float = -1.0
    last: dict[str, tuple[int, float]] = field(default_factory=dict)

    def admit(self, worker: str, seq: int, ts: float) -> int:
        """Accept (worker, seq, ts) and return the seq gap before it, or raise REPLAYED."""
        prev = self.last.get(worker)
        if prev is None:
            if ts <= self.floor:
                raise MessageError(Reason.REPLAYED, f"worker {worker!r} seq {seq}: from a retired sender")
            if len(self.last) >= self.max_workers:
                self._retire_oldest()
            self.last[worker] = (seq, ts)
            return 0
        last_seq, last_ts = prev
        if seq <= last_seq:
            raise MessageError(Reason.REPLAYED, f"worker {worker!r} seq {seq} <= {last_seq} already accepted")
        self.last[worker] = (seq, max(ts, last_ts))
        return seq - last_seq - 1

    def _retire_oldest(self) -> None:
        oldest = min(self.last, key=lambda w: self.last[w][1])
        self.floor = max(self.floor, self.last.pop(oldest)[1])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state, to persist so a restarted monitor still refuses old frames."""
        return {"floor": self.floor, "last": {w: [s, t] for w, (s, t) in self.last.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], max_workers: int = MAX_WORKERS) -> "ReplayWindow":
        """The inverse of :meth:`to_dict`; ``ValueError`` if ``data`` is not one."""
        try:
            floor = float(data["floor"])
            last = {str(w): (int(s), float(t)) for w, (s, t) in data["last"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"replay state is not valid: {exc!r}") from None
        win = cls(max_workers, floor, {})
        for w, st in sorted(last.items(), key=lambda kv: kv[1][1]):
            if len(win.last) >= max_workers:
                win._retire_oldest()
            win.last[w] = st
        return win


# ---------------------------------------------------------------- per-job statistics
@dataclass
class JobStats:
    """What the monitor knows about one registered job."""

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
    window: ReplayWindow = field(default_factory=ReplayWindow)
    _rescales_taken: int = 0

    def add(self, rep: Report) -> None:
        """Take one validated, authenticated report; raises REPLAYED (and changes nothing) for a replay."""
        self.seq_gaps += self.window.admit(rep.worker, rep.seq, rep.timestamp)
        self.reports += 1
        self.samples += rep.samples
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


# ---------------------------------------------------------------- the monitor
class Monitor:
    """The PULL socket, the registered jobs' keys and statistics, and the counters."""

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:0",
        ctx: zmq.Context | None = None,
        batch: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, RCVHWM)
        self.sock.setsockopt(zmq.MAXMSGSIZE, TRANSPORT_MAX_FRAME)
        self.sock.bind(bind)
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.batch = batch
        self.jobs: dict[str, JobStats] = {}
        """Registered jobs' statistics (read-only for callers: use register/forget)."""
        self._keys: dict[str, bytes] = {}
        self.received = 0
        self.accepted = 0
        self.rejected: dict[Reason, int] = {r: 0 for r in Reason}
        self._clock = clock
        self._last_log: dict[Reason, float] = {}
        self._unlogged: dict[Reason, int] = {}

    # -- registration (the owner's set of live jobs)
    def register(self, job_id: str, secret: str, replay_state: dict[str, Any] | None = None) -> JobStats:
        """Take reports for ``job_id`` signed with ``secret``; idempotent (keeps the statistics).

        ``replay_state`` (from :meth:`replay_state`, e.g. as persisted before a restart)
        restores the job's replay window when the job is not registered yet.
        """
        key = secret_key(secret, f"secret of job {job_id}")
        self._keys[job_id] = key
        stats = self.jobs.get(job_id)
        if stats is None:
            window = ReplayWindow.from_dict(replay_state) if replay_state is not None else ReplayWindow()
            stats = self.jobs[job_id] = JobStats(job_id, window=window)
        return stats

    def forget(self, job_id: str) -> None:
        """Drop a job's key and statistics; its reports are unknown_job from now on."""
        self._keys.pop(job_id, None)
        self.jobs.pop(job_id, None)

    def job(self, job_id: str) -> JobStats:
        """A registered job's statistics; ``KeyError`` naming it otherwise."""
        stats = self.jobs.get(job_id)
        if stats is None:
            raise KeyError(f"job {job_id} is not registered with the monitor")
        return stats

    def replay_state(self, job_id: str) -> dict[str, Any]:
        """A registered job's replay window as JSON-able data (see :meth:`register`)."""
        return self.job(job_id).window.to_dict()

    def counts(self) -> dict[str, int]:
        """``received``, ``accepted``, ``rejected`` (total) and one entry per :class:`Reason` (for metrics)."""
        out = {"received": self.received, "accepted": self.accepted, "rejected": self.bad}
        out.update({r.value: n for r, n in self.rejected.items()})
        return out

    @property
    def bad(self) -> int:
        """Frames rejected, all reasons."""
        return sum(self.rejected.values())

    # -- ingest
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
                self.ingest_batch(batch)
            n += len(batch)
            if len(batch) < self.batch:
                break
        return n

    def ingest_batch(self, frames: list[bytes]) -> None:
        """Ingest frames already received (the socket path and tests)."""
        self.received += len(frames)
        accept = self._accept
        for frame in frames:
            try:
                accept(frame)
            except MessageError as exc:
                self._reject(exc.reason, str(exc))
            except Exception as exc:  # a bug on one frame must not stop the daemon
                log.exception("monitor: failed on frame %s", quote(frame))
                self._reject(Reason.INTERNAL, f"{type(exc).__name__}: {exc}")

    def ingest(self, frame: bytes) -> None:
        self.ingest_batch([frame])

    def _accept(self, frame: bytes) -> None:
        if len(frame) > MAX_FRAME:
            raise MessageError(Reason.OVERSIZE, f"frame of {len(frame)} bytes (limit {MAX_FRAME})")
        env = decode(frame)
        if env.type != Report.TYPE:
            raise MessageError(Reason.BAD_TYPE, f"the monitor takes reports, not {env.type[:32]!r}")
        if not env.signed:
            raise MessageError(Reason.UNSIGNED, f"report for job {env.job[:64]!r} has no sig")
        key = self._keys.get(env.job)
        if key is None:
            raise MessageError(Reason.UNKNOWN_JOB, f"report for unknown job {env.job[:64]!r}")
        verify(frame, key)
        rep = decode_report(env)
        self.jobs[env.job].add(rep)
        self.accepted += 1

    def _reject(self, reason: Reason, why: str) -> None:
        self.rejected[reason] += 1
        now = self._clock()
        last = self._last_log.get(reason)
        if last is not None and now - last < LOG_EVERY_S:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return
        self._last_log[reason] = now
        more = self._unlogged.pop(reason, 0)
        log.warning("monitor: rejected a frame (%s; %d of this reason so far%s): %s", reason.value,
                    self.rejected[reason], f", {more} not logged" if more else "", why)

    def close(self) -> None:
        self.sock.close(0)


# ---------------------------------------------------------------- daemon-side secrets
class KeyFileError(RuntimeError):
    """The master key file is missing, unsafe or damaged; the text names the file."""


def load_master_key(path: Path | str) -> bytes:
    """The daemon's master key from ``path``, created (0600, random) if absent.

    Refuses a file that is not a regular file owned by this user, is readable by
    group or others, or does not hold exactly ``MASTER_KEY_BYTES`` bytes.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(MASTER_KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise KeyFileError(f"{p}: cannot open the monitor key: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise KeyFileError(f"{p}: the monitor key must be a regular file owned by uid {os.geteuid()} "
                               f"with mode 0600 (is {stat.filemode(st.st_mode)}, uid {st.st_uid})")
        key = f.read(MASTER_KEY_BYTES + 1)
    if len(key) != MASTER_KEY_BYTES:
        raise KeyFileError(f"{p}: the monitor key holds {len(key)} bytes, not {MASTER_KEY_BYTES}")
    return key


def job_secret(master_key: bytes, job_id: str) -> str:
    """The secret of ``job_id`` (64 hex digits): ``HMAC-SHA256(master_key, "malletrain job secret\\0" + id)``."""
    return hmac.new(master_key, b"malletrain job secret\0" + job_id.encode(), "sha256").hexdigest()
