"""The job monitor: a ZeroMQ PULL socket on the daemon that every job's rank 0 reports to.

Frames are signed :class:`contract.messages.Report` envelopes, kept only for jobs registered with their
secret. :meth:`Monitor.drain` checks, in order: size, envelope, the job's signature, each payload field,
and ``seq`` above the sender's last (worker and incarnation: the replay window); then feeds the job's
profiler estimators. Rejections are counted by :class:`~contract.messages.Reason` and logged at most once
per reason every few seconds; nothing a sender does raises out of :meth:`Monitor.drain`. A frame in
:meth:`Report.encode`'s exact layout takes a fast path that changes no verdict (``tests/test_monitor.py``).
:class:`ReplaySaver` keeps the replay windows across restarts (after a ``kill -9``, the last
``SAVE_EVERY_S`` of reports could be replayed once); a job's secret is derived from one private
key in the state dir (:func:`job_secret`), so a restarted daemon re-derives what running workers hold."""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

import zmq

from contract.messages import (  # job_secret: the daemon derives each job's secret with it
    MAX_FRAME, MAX_INT, MAX_SAMPLES, MAX_TIMESTAMP, MAX_WORLD, VERSION, TRANSPORT_MAX_FRAME, MessageError, Reason,
    Report, decode, decode_report, job_secret, quote, secret_key, verify,
)
from malletrain.daemon.ratebound import MAX_RATE_PER_NODE, ClaimBound, HistoryBound
from profiler.estimators import RescaleCostEstimator, RescaleEvent, ThroughputEstimator
from profiler.records import Record, RecordError
from scavenger.channel import create_key_file
from scavenger.connguard import ConnectionGuard

log = logging.getLogger(__name__)

MAX_WORKERS = 64
"""Senders a job's replay window remembers; the least recently heard is retired first."""

RCVHWM = 10_000
"""Frames libzmq queues per sender connection before it pushes back."""

LOG_EVERY_S = 5.0
"""At most one log line per rejection reason this often."""

MASTER_KEY_BYTES = 32

SAVE_EVERY_S = 1.0
"""While reports arrive, the replay windows are saved at most this often (:class:`ReplaySaver`)."""

REPLAY_META_KEY = "monitor_replay_windows"
"""The store meta key holding every registered job's replay window (JSON)."""

# The layout Report.encode writes. Ids: printable ASCII but '"' and '\\' (no JSON escapes);
# numbers: no sign, bounded digits (so int()/float() here give what json would).
_ID = rb'[\x20\x21\x23-\x5b\x5d-\x7e]'
_FAST = re.compile(
    rb'\{"v":' + str(VERSION).encode() + rb',"type":"report","job":"(' + _ID + rb'{1,256})",'
    rb'"seq":([1-9][0-9]{0,18}),"payload":\{"samples":(0|[1-9][0-9]{0,9}),'
    rb'"timestamp":((?:0|[1-9][0-9]{0,11})(?:\.[0-9]{1,40})?(?:[eE][-+]?[0-9]{1,3})?),'
    rb'"world_size":([1-9][0-9]{0,4}),"generation":(0|[1-9][0-9]{0,18}),"worker":"(' + _ID + rb'{0,256})",'
    rb'"incarnation":(0|[1-9][0-9]{0,18})\},'
    rb'"sig":"([0-9a-f]{64})"\}\Z'
)
_SIG_TRAILER = len(b',"sig":"') + 64 + len(b'"}')


def _no_match(frame: bytes) -> None:
    return None


# ---------------------------------------------------------------- replay window
Sender = tuple[str, int]
"""Who sent a report: the worker's name and its incarnation (which start of its process)."""


@dataclass
class ReplayWindow:
    """Last accepted ``seq`` per sender (worker, incarnation) of one job; a frame must be above it. Of at
    most ``max_workers`` senders, retiring one raises ``floor`` to its last timestamp, so its old frames stay replays."""

    max_workers: int = MAX_WORKERS
    floor: float = -1.0
    last: dict[Sender, tuple[int, float]] = field(default_factory=dict)

    def admit(self, worker: str, seq: int, ts: float, incarnation: int = 0) -> int:
        """Accept (worker, incarnation, seq, ts) and return the seq gap before it, or raise REPLAYED."""
        sender = (worker, incarnation)
        prev = self.last.get(sender)
        if prev is None:
            if ts <= self.floor:
                raise MessageError(Reason.REPLAYED, f"worker {worker!r} incarnation {incarnation} seq {seq}: "
                                                    "from a retired sender")
            if len(self.last) >= self.max_workers:
                self._retire_oldest()
            self.last[sender] = (seq, ts)
            return 0
        last_seq, last_ts = prev
        if seq <= last_seq:
            raise MessageError(Reason.REPLAYED, f"worker {worker!r} incarnation {incarnation} seq {seq} <= "
                                                f"{last_seq} already accepted")
        self.last[sender] = (seq, max(ts, last_ts))
        return seq - last_seq - 1

    def _retire_oldest(self) -> None:
        oldest = min(self.last, key=lambda w: self.last[w][1])
        self.floor = max(self.floor, self.last.pop(oldest)[1])

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state, to persist so a restarted monitor still refuses old frames: ``senders`` is a
        list of ``[worker, incarnation, seq, timestamp]``."""
        return {"floor": self.floor, "senders": [[w, i, s, t] for (w, i), (s, t) in self.last.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], max_workers: int = MAX_WORKERS) -> "ReplayWindow":
        """The inverse of :meth:`to_dict`; ``ValueError`` if ``data`` is not one. A state saved before
        incarnations (``last``: worker -> ``[seq, timestamp]``) is read as incarnation 0 of each worker."""
        try:
            floor = float(data["floor"])
            if "senders" in data:
                last = {(str(w), int(i)): (int(s), float(t)) for w, i, s, t in data["senders"]}
            else:
                last = {(str(w), 0): (int(s), float(t)) for w, (s, t) in data["last"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"replay state is not valid: {exc!r}") from None
        win = cls(max_workers, floor, {})
        for w, st in sorted(last.items(), key=lambda kv: kv[1][1]):
            if len(win.last) >= max_workers:
                win._retire_oldest()
            win.last[w] = st
        return win


# ---------------------------------------------------------------- per-job statistics
RECORDED_GENERATIONS = 2
"""Published generations whose world sizes a job's reports may be counted at (the current one and the
one before it, whose reports are still in flight during a rescale)."""


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
    bound: ClaimBound = field(default_factory=lambda: ClaimBound(0.0))
    """What its reports may claim: absolute per node, and relative to its own history (malletrain.daemon.ratebound)."""
    implausible: int = 0
    worlds: dict[int, int] = field(default_factory=dict)
    """World sizes of the job's last generations as the daemon published them (:meth:`Monitor.set_world`);
    empty: none recorded, a report's own world size is taken (a monitor without a daemon)."""
    recorded_world: int = 0
    """The size of the job's newest non-empty published world (0: none recorded)."""
    members: frozenset[str] = frozenset()  # its workers (empty: not told): a report of no generation counts from them
    _rescales_taken: int = 0

    def add(self, rep: Report, now: float | None = None) -> None:
        """Take one validated, authenticated report; REPLAYED (nothing changed) for a replay, IMPLAUSIBLE (only
        its seq used up) for more samples than the job could train by ``now`` (the receiver's clock; None: unbounded)."""
        self.add_fields(rep.worker, rep.seq, rep.samples, rep.timestamp, rep.world_size, rep.generation, now,
                        rep.incarnation)

    def add_fields(self, worker: str, seq: int, samples: int, timestamp: float, world_size: int,
                   generation: int, now: float | None = None, incarnation: int = 0) -> None:
        """:meth:`add` of a report's fields (the fast path builds no :class:`Report`)."""
        self.seq_gaps += self.window.admit(worker, seq, timestamp, incarnation)
        world_size = self.world_of(world_size, generation)
        given = bool(self.recorded_world)  # world_size is the daemon's record of the nodes it gave the job
        if now is not None and (why := self.bound.refusal(samples, world_size, now, given)) is not None:
            self.implausible += 1
            raise MessageError(Reason.IMPLAUSIBLE, f"job {self.job}: {why}")
        self.reports += 1
        self.samples += samples
        if timestamp > self.last_time:
            self.last_time = timestamp
            self.world_size = world_size
            self.generation = max(self.generation, generation)
        if samples < 1 or (generation == 0 and self.members and not self.is_member(worker)):
            return  # (its samples counted: trained, but in which world is not known)
        try:
            rec = Record(samples, timestamp, world_size)
            self.throughput.add(rec)
            self.rescale.add(rec)
        except RecordError:
            self.out_of_order += 1

    def world_of(self, claimed: int, generation: int) -> int:
        """The world size a report of ``generation`` counts at: the daemon's record of it (or of its newest
        world), what the report claims only where there is none, so a job cannot claim nodes it was not given."""
        if not self.recorded_world:
            return claimed
        return self.worlds.get(generation) or self.recorded_world

    def is_member(self, worker: str) -> bool:
        """``worker`` (or the worker whose rank it is: ``WORKER/i``) is in the newest published world."""
        return worker in self.members or worker.split("/", 1)[0] in self.members

    def record_world(self, generation: int, size: int, workers: Iterable[str] = ()) -> None:
        """The daemon published ``generation`` with ``size`` members (0: the job's workers leave), ``workers``."""
        if size > 0:
            self.worlds[generation] = size
            self.recorded_world = size
            self.members = frozenset(workers)
            for old in sorted(self.worlds)[:-RECORDED_GENERATIONS]:
                del self.worlds[old]

    def rates(self) -> dict[int, float]:
        return self.throughput.rates()

    def new_rescales(self) -> list[RescaleEvent]:
        """Rescale pauses closed since the last call."""
        events = self.rescale.events()
        out = events[self._rescales_taken:]
        self._rescales_taken = len(events)
        return out


ENDED_KEPT = 1024
"""Ended jobs whose late reports the monitor drops quietly (older ones: unknown_job, as any job it never knew)."""


# ---------------------------------------------------------------- the monitor
class Monitor:
    """The PULL socket, the registered jobs' keys and statistics, and the counters."""

    def __init__(self, bind: str = "tcp://127.0.0.1:0", ctx: zmq.Context | None = None, batch: int = 4096,
                 clock: Callable[[], float] = time.monotonic, max_rate_per_node: float = MAX_RATE_PER_NODE,
                 history: HistoryBound | None = None) -> None:
        self.max_rate_per_node = max_rate_per_node
        self.history = history or HistoryBound()  # what a job's reports may claim relative to its own rate
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, RCVHWM)
        self.sock.setsockopt(zmq.MAXMSGSIZE, TRANSPORT_MAX_FRAME)
        self.sock.bind(bind)
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.guard = ConnectionGuard(self.sock, "monitor")  # caps connections per user and in total
        self.batch = batch
        self.jobs: dict[str, JobStats] = {}
        """Registered jobs' statistics (read-only for callers: use register/forget)."""
        self._keys: dict[str, bytes] = {}
        self._fast: dict[bytes, tuple[Any, JobStats]] = {}  # job id -> (its keyed hmac, copied per frame; stats)
        self._saved_windows: dict[str, dict[str, Any]] = {}  # restored, for jobs not registered yet
        self._ended: dict[str, None] = {}  # jobs that ended lately (oldest first): their late reports are dropped quietly
        self.late = 0  # reports of such jobs dropped
        self.fast_path = True
        self.received = 0
        self.accepted = 0
        self.rejected: dict[Reason, int] = {r: 0 for r in Reason}
        self._clock = clock
        self._last_log: dict[Reason, float] = {}
        self._unlogged: dict[Reason, int] = {}

    # -- registration (the owner's set of live jobs)
    def register(self, job_id: str, secret: str, replay_state: dict[str, Any] | None = None,
                 max_nodes: int | None = None) -> JobStats:
        """Take reports for ``job_id`` signed with ``secret``; idempotent (keeps the statistics).

        ``max_nodes`` bounds the progress its reports may claim (:mod:`malletrain.daemon.ratebound`; more is
        :attr:`Reason.IMPLAUSIBLE`). ``replay_state`` (or else a window from :meth:`restore_replay_states`)
        restores the job's replay window when it is not registered yet."""
        key = secret_key(secret, f"secret of job {job_id}")
        self._keys[job_id] = key
        saved = self._saved_windows.pop(job_id, None)
        stats = self.jobs.get(job_id)
        if stats is None:
            state = replay_state if replay_state is not None else saved
            window = ReplayWindow.from_dict(state) if state is not None else ReplayWindow()
            stats = self.jobs[job_id] = JobStats(job_id, window=window,
                                                 bound=ClaimBound(self._clock(), history=self.history))
        stats.bound.max_nodes, stats.bound.max_rate_per_node = max_nodes or MAX_WORLD, self.max_rate_per_node
        self._fast[job_id.encode("utf-8", "surrogatepass")] = (hmac.new(key, digestmod="sha256"), stats)
        return stats

    def set_world(self, job_id: str, generation: int, size: int, workers: Iterable[str] = ()) -> None:
        """The daemon published ``generation`` of ``job_id`` with ``size`` members (``workers``): the job's reports
        are counted at the world sizes the daemon records, never at what they claim (see :meth:`JobStats.world_of`)."""
        stats = self.jobs.get(job_id)
        if stats is not None:
            stats.record_world(generation, size, workers)

    def forget(self, job_id: str, ended: bool = False) -> None:
        """Drop a job's key and statistics; its reports are unknown_job from now on, but those of an ``ended`` job
        still in flight are counted in :attr:`late` and dropped quietly (the last :data:`ENDED_KEPT` such jobs)."""
        if ended:
            self._ended.pop(job_id, None)
            self._ended[job_id] = None
            while len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]
        self._keys.pop(job_id, None)
        self._fast.pop(job_id.encode("utf-8", "surrogatepass"), None)
        self._saved_windows.pop(job_id, None)
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

    def replay_states(self) -> dict[str, dict[str, Any]]:
        """Every registered job's replay window, for :meth:`restore_replay_states` (restored windows of jobs never
        registered again are left out)."""
        return {job: stats.window.to_dict() for job, stats in self.jobs.items()}

    def restore_replay_states(self, states: Mapping[str, Any]) -> list[str]:
        """Hand back :meth:`replay_states` from before a restart; each job's window is used when
        the job is registered. Returns the jobs whose state was not valid (skipped; the caller logs)."""
        bad = []
        for job, state in states.items():
            try:
                ReplayWindow.from_dict(state)
            except ValueError:
                bad.append(str(job)[:64])
                continue
            if job in self.jobs:
                self.jobs[job].window = ReplayWindow.from_dict(state)
            else:
                self._saved_windows[str(job)] = state
        return bad

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
        self.guard.poll()
        if timeout_ms > 0 and not sock.poll(timeout_ms):
            self.guard.poll()
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
        match = _FAST.match if self.fast_path else _no_match
        fast, checked = self._accept_fast, self._accept_checked
        for frame in frames:
            try:
                m = match(frame)
                if m is None or not fast(frame, m):
                    checked(frame)
            except MessageError as exc:
                self._reject(exc.reason, str(exc))
            except Exception as exc:  # a bug on one frame must not stop the daemon
                log.exception("monitor: failed on frame %s", quote(frame))
                self._reject(Reason.INTERNAL, f"{type(exc).__name__}: {exc}")

    def ingest(self, frame: bytes) -> None:
        self.ingest_batch([frame])

    def _accept_fast(self, frame: bytes, m: "re.Match[bytes]") -> bool:
        """Take a frame in the canonical layout; False (nothing changed) to let the full path decide."""
        job_b, seq_b, samples_b, ts_b, world_b, gen_b, worker_b, inc_b, sig = m.groups()
        known = self._fast.get(job_b)
        if known is None:
            return False
        seq, samples, ts, world, gen = int(seq_b), int(samples_b), float(ts_b), int(world_b), int(gen_b)
        incarnation = int(inc_b)
        if seq > MAX_INT or samples > MAX_SAMPLES or gen > MAX_INT or world > MAX_WORLD or not ts <= MAX_TIMESTAMP \
                or incarnation > MAX_INT:
            return False
        mac, stats = known
        if not self._signed_by(mac, frame[:-_SIG_TRAILER], sig):
            return False
        stats.add_fields(worker_b.decode("ascii"), seq, samples, ts, world, gen, self._clock(), incarnation)
        self.accepted += 1
        return True

    @staticmethod
    def _signed_by(mac: Any, prefix: bytes, sig: bytes) -> bool:
        h = mac.copy()
        h.update(prefix)
        return hmac.compare_digest(h.hexdigest().encode(), sig)

    def _accept_checked(self, frame: bytes) -> None:
        """Every check of the module doc, in order, each failure a :class:`MessageError` with its reason."""
        if len(frame) > MAX_FRAME:
            raise MessageError(Reason.OVERSIZE, f"frame of {len(frame)} bytes (limit {MAX_FRAME})")
        env = decode(frame)
        if env.type != Report.TYPE:
            raise MessageError(Reason.BAD_TYPE, f"the monitor takes reports, not {env.type[:32]!r}")
        if not env.signed:
            raise MessageError(Reason.UNSIGNED, f"report for job {env.job[:64]!r} has no sig")
        key = self._keys.get(env.job)
        if key is None and env.job in self._ended:
            self.late += 1  # a report sent just before its job ended: nothing wrong, nothing to count
            return
        if key is None:
            raise MessageError(Reason.UNKNOWN_JOB, f"report for unknown job {env.job[:64]!r}")
        verify(frame, key)
        rep = decode_report(env)
        self.jobs[env.job].add(rep, now=self._clock())
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
        self.guard.close()
        self.sock.close(0)


# ---------------------------------------------------------------- replay windows across restarts
class Meta(Protocol):
    """Where :class:`ReplaySaver` keeps the windows (``malletrain.daemon.store.Store`` is one)."""

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...


class ReplaySaver:
    """Keeps a monitor's replay windows in ``meta`` (:data:`REPLAY_META_KEY`): :meth:`load` before jobs
    are registered, :meth:`tick` each loop (at most every ``every_s``), :meth:`save` at a clean stop."""

    def __init__(self, monitor: Any, meta: Meta, every_s: float = SAVE_EVERY_S) -> None:
        self.monitor = monitor
        self.meta = meta
        self.every_s = every_s
        self._on = hasattr(monitor, "replay_states") and hasattr(monitor, "restore_replay_states")
        self._saved_accepted = -1
        self._next = 0.0

    def load(self) -> int:
        """Restore what the last daemon saved; returns how many jobs' windows. A damaged entry
        is logged and skipped (that job's old frames are then refused only by their seq gaps)."""
        if not self._on:
            return 0
        text = self.meta.get_meta(REPLAY_META_KEY)
        if not text:
            return 0
        try:
            states = json.loads(text)
            if not isinstance(states, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError) as exc:
            log.error("monitor: saved replay windows (store meta %s) are not valid (%s); starting without",
                      REPLAY_META_KEY, exc)
            return 0
        bad = self.monitor.restore_replay_states(states)
        for job in bad:
            log.error("monitor: saved replay window of job %s is not valid; skipped", job, extra={"job": job})
        return len(states) - len(bad)

    def tick(self, now: float) -> None:
        if self._on and now >= self._next:
            self._next = now + self.every_s
            if self.monitor.accepted != self._saved_accepted:
                self.save()

    def save(self) -> None:
        if not self._on:
            return
        self._saved_accepted = self.monitor.accepted
        self.meta.set_meta(REPLAY_META_KEY, json.dumps(self.monitor.replay_states(), separators=(",", ":")))


# ---------------------------------------------------------------- daemon-side secrets


def load_master_key(path: Path | str) -> bytes:
    """The daemon's master key from ``path``, created (0600, random, atomically) if absent; refuses
    (:class:`KeyFileError`) the same files the agents' key check does (:func:`scavenger.channel.create_key_file`)."""
    return create_key_file(path, MASTER_KEY_BYTES, "monitor key file")

