"""The ``torch`` runtime, worker side: elastic data-parallel training with plain PyTorch.

.. code-block:: python

    from malletrain.client import report
    from malletrain.elastic import State, run

    def train(state: State) -> None:
        model = state.ddp()                      # DDP for the current world
        while state.samples < total:
            loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
            state.step += 1; state.samples += global_batch
            report(global_batch)                 # the one line
            state.commit()                       # rescale point

    run(train, State(model, opt))

Workers stay alive across rescales. At :meth:`State.commit` the state
(model, optimizer and counters) is snapshot in memory and rank 0 reads the
job's generation from the daemon's store (:mod:`malletrain.runtimes.torch_elastic`)
and broadcasts its decision, so every rank switches at the same step. A switch
happens once all members of the new generation have connected (new workers are
started ahead and wait): the old gloo group is destroyed, workers not in the new
member list leave (``SystemExit(0)`` from :func:`run`), the others meet at a
store barrier, create a gloo group for the new world under a fresh store prefix
and take the state of the member with the newest commit (a survivor). Then
:meth:`commit` raises :class:`Rescaled` and :func:`run` calls the training
function again, which picks up the counters and wraps the model in a new DDP.

On a recall a peer dies: a collective fails at once ("connection closed by
peer") or after the short collective timeout (``MALLETRAIN_COLLECTIVE_TIMEOUT``,
3 s). :func:`run` then rolls back to the last commit, waits for the next
generation (the job manager publishes it after the recall) and re-joins.

A daemon restart (even ``kill -9``) takes the store away. Training goes on:
rank 0's check at a commit fails soft and it probes the store's address every
half second; a store operation a worker cannot do without (a switch, a wait
for a generation) waits for the store to come back. Once it is back (a new,
empty store on the same port), rank 0 marks its whole world ready and reports
its generation, the daemon publishes the re-adopted workers as a newer
generation and the world switches to it at its next commit, keeping every
step. If the store stays away longer than ``MALLETRAIN_STORE_GRACE``
(60 s), the workers exit with code 75 (:data:`EXIT_STORE_LOST`).

Outside malletrain (no ``MALLETRAIN_STORE``) the same script runs as a
single worker in a one-process gloo group.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from malletrain import client
from malletrain.runtimes.torch_elastic import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_STORE_GRACE_S,
    ENV_JOB,
    ENV_STORE,
    ENV_STORE_GRACE,
    ENV_TIMEOUT,
    ENV_WORKER,
    active_key,
    arrive_key,
    check_id,
    CKPT_CHUNK_BYTES,
    ckpt_chunk_key,
    ckpt_header,
    ckpt_key,
    ckpt_tag_key,
    gen_key,
    handover_key,
    joined_key,
    members_key,
    parse_address,
    parse_ckpt_header,
    parse_members,
    pg_prefix,
    ready_key,
    resume_key,
)

log = logging.getLogger("malletrain.elastic")

T = TypeVar("T")

POLL_S = 0.005
"""Interval of store polls while waiting at a barrier (which may also end by a newer generation)."""

HANDOVER_WAIT_S = 20.0
"""How long new workers wait for the checkpoint of a world they replace (none comes if it was SIGKILLed)."""

WAIT_CHUNK_S = 600.0
"""A blocking store wait is renewed after this long (each renewal logs a c10d warning)."""

MAX_RECOVERIES_WITHOUT_COMMIT = 10

RECONNECT_EVERY_S = 0.5
"""While the store is away, its address is probed at most this often."""

PUBLISH_POLL_S = 0.05
"""After a reconnection, waits for a generation poll the generation key at this interval."""

EXIT_STORE_LOST = 75
"""Exit code of a worker whose store stayed away longer than the grace period (EX_TEMPFAIL)."""

_STORE_LOST = -1  # rank 0's broadcast decision: everyone exits (StoreLost)
"""A failure that repeats this often without one commit in between is not a recall: it is raised."""

_FAILURE_MARKERS = (
    "gloo",
    "connection reset",
    "connection closed",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
)


class LeaveJob(Exception):
    """This worker is not a member of the job's new generation: it leaves cleanly."""


class Rescaled(Exception):
    """Raised by :meth:`State.commit` after a switch to a new world; :func:`run` restarts the training function."""


class StoreUnavailable(Exception):
    """The daemon's store is away right now (only raised by operations that must not block)."""


class StoreLost(Exception):
    """The daemon's store stayed away longer than the grace period: the worker exits."""


@dataclass(frozen=True)
class RescaleEvent:
    """One membership change as seen by this worker (times are unix seconds)."""

    kind: str  # "join" (first), "up", "down", "change" (same size), "recover", "leave"
    from_generation: int
    to_generation: int
    world_before: int
    world_after: int
    started: float
    finished: float

    @property
    def pause(self) -> float:
        return self.finished - self.started


@dataclass
class _Snapshot:
    version: int
    model: dict[str, Any]
    optimizer: dict[str, Any] | None
    counters: dict[str, Any] = field(default_factory=dict)


def is_store_loss(exc: BaseException) -> bool:
    """Whether a store operation failed because the store's connection is gone (not a timeout)."""
    if isinstance(exc, dist.DistNetworkError):
        return True
    if isinstance(exc, RuntimeError) and not isinstance(exc, dist.DistStoreError):
        text = str(exc).lower()
        return any(m in text for m in ("broken pipe", "connection reset", "connection was likely closed",
                                       "connection refused", "failed to recv"))
    return False


def is_comm_failure(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a lost peer (gloo error, timeout, distributed error)."""
    if isinstance(exc, (LeaveJob, Rescaled, StoreLost, StoreUnavailable)):
        return False
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, dist.DistError):
            return True
        if isinstance(cur, RuntimeError):
            text = str(cur).lower()
            if any(m in text for m in _FAILURE_MARKERS):
                return True
        cur = cur.__cause__ or cur.__context__
    return False


class Rendezvous:
    """A worker's view of its job's keys in the daemon's store.

    With ``address`` (``(host, port)``) it survives the store going away: an
    operation that finds the connection gone waits, probing the address every
    :data:`RECONNECT_EVERY_S`, until the store is back (then it reconnects,
    marks this worker ready again and retries) or ``grace_s`` seconds have
    passed since the loss (then :class:`StoreLost`). Without an address a lost
    store raises the store's own error, as before.
    """

    def __init__(
        self,
        store: Any,
        job: str,
        worker: str,
        poll_s: float = POLL_S,
        address: tuple[str, int] | None = None,
        grace_s: float = DEFAULT_STORE_GRACE_S,
    ) -> None:
        if grace_s <= 0:
            raise ValueError(f"store grace must be > 0 s, got {grace_s}")
        self._store = store
        self.job = check_id("job", job)
        self.worker = check_id("worker", worker)
        self.poll_s = poll_s
        self.address = address
        self.grace_s = grace_s
        self.lost_since: float | None = None  # monotonic time the store was found gone
        self.reconnects = 0
        self.world: tuple[str, ...] = ()  # this worker's current world (rank 0 re-registers it)
        self.current = 0  # this worker's current generation (reported after a reconnection)
        self.rank = 0
        self._marked_ready = False
        self._nowait = False
        self._next_probe = 0.0

    @property
    def store(self) -> Any:
        """The current store client (a new one after each reconnection)."""
        return self._store

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Rendezvous | None:
        """Connect as described by ``MALLETRAIN_STORE/JOB/WORKER``; None if no store is set."""
        env = dict(os.environ) if env is None else env
        address = env.get(ENV_STORE, "")
        if not address:
            return None
        host, port = parse_address(address)
        missing = [name for name in (ENV_JOB, ENV_WORKER) if not env.get(name)]
        if missing:
            raise ValueError(f"{ENV_STORE} is set but {', '.join(missing)} is not")
        grace = _env_seconds(env, ENV_STORE_GRACE, DEFAULT_STORE_GRACE_S)
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
        return cls(store, env[ENV_JOB], env[ENV_WORKER], address=(host, port), grace_s=grace)

    # -- a store that may go away ---------------------------------------------------------------
    def _call(self, op: str, *args: Any) -> Any:
        """``store.<op>(*args)``; a lost store is waited for (or :class:`StoreUnavailable` in no-wait mode)."""
        while True:
            if self.lost_since is not None:
                if self._nowait:
                    if not self.try_reconnect():
                        raise StoreUnavailable(f"job {self.job}: the daemon's store is away")
                else:
                    self.await_store()
            try:
                return getattr(self._store, op)(*args)
            except Exception as exc:
                if self.address is None or not is_store_loss(exc):
                    raise
                self._mark_lost(exc)

    def _mark_lost(self, exc: BaseException) -> None:
        if self.lost_since is None:
            self.lost_since = time.monotonic()
            self._next_probe = 0.0
            log.warning("worker %s: the daemon's store is gone (%s); training goes on for up to %.0f s "
                        "while it comes back", self.worker, str(exc).splitlines()[0][:120], self.grace_s)

    def lost_for(self) -> float:
        """Seconds since the store was found gone (0 while it is there)."""
        return 0.0 if self.lost_since is None else time.monotonic() - self.lost_since

    def try_reconnect(self) -> bool:
        """Reconnect if the store is back (probing at most every :data:`RECONNECT_EVERY_S`); True if connected."""
        if self.lost_since is None:
            return True
        now = time.monotonic()
        if self.address is None or now < self._next_probe:
            return False
        self._next_probe = now + RECONNECT_EVERY_S
        host, port = self.address
        try:  # a plain connect first: TCPStore's own connect retries for seconds and logs each try
            socket.create_connection((host, port), timeout=RECONNECT_EVERY_S).close()
        except OSError:
            return False
        try:
            store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
        except (dist.DistError, RuntimeError) as exc:
            log.warning("worker %s: store at %s:%d answers but refuses a client: %s", self.worker, host, port, exc)
            return False
        self._store = store
        away = now - self.lost_since
        self.lost_since = None
        self.reconnects += 1
        log.warning("worker %s: reconnected to the daemon's store after %.1f s", self.worker, away)
        try:
            self._register()
        except Exception as exc:
            if not is_store_loss(exc):
                raise
            self._mark_lost(exc)
            return False
        return True

    def _register(self) -> None:
        """Tell a new store about this worker (and rank 0 about its whole world): ready, and at which generation."""
        if self._marked_ready:
            self._store.set(ready_key(self.job, self.worker), "1")
        if self.current:
            self._store.set(resume_key(self.job, self.worker), str(self.current))
        if self.rank == 0:
            for member in self.world:
                self._store.set(ready_key(self.job, member), "1")
                if self.current:
                    self._store.set(resume_key(self.job, member), str(self.current))

    def await_store(self) -> None:
        """Block until the store is back; :class:`StoreLost` once the grace period is over."""
        while not self.try_reconnect():
            if self.address is None or self.lost_for() > self.grace_s:
                raise StoreLost(f"worker {self.worker} of job {self.job}: the daemon's store "
                                f"{_address_text(self.address)} stayed away for {self.lost_for():.0f} s "
                                f"(grace {self.grace_s:g} s, {ENV_STORE_GRACE})")
            time.sleep(min(RECONNECT_EVERY_S, max(0.0, self._next_probe - time.monotonic())) or 0.01)

    def next_generation(self, current: int) -> int:
        """Rank 0 at a commit: the generation to run next; never blocks on a lost store.

        ``current`` if nothing newer is ready or the store is away; raises
        :class:`StoreLost` once it has been away longer than the grace period.
        """
        self._nowait = True
        try:
            gen = self.generation()
            if gen > current and self.all_ready(self.members(gen) or ()):
                return gen
            return current
        except StoreUnavailable:
            if self.lost_for() > self.grace_s:
                raise StoreLost(f"worker {self.worker} of job {self.job}: the daemon's store "
                                f"{_address_text(self.address)} stayed away for {self.lost_for():.0f} s "
                                f"(grace {self.grace_s:g} s, {ENV_STORE_GRACE})") from None
            return current
        finally:
            self._nowait = False

    def try_quietly(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` in no-wait mode: :class:`StoreUnavailable` instead of waiting for a lost store."""
        self._nowait = True
        try:
            return fn()
        finally:
            self._nowait = False

    # -- keys -----------------------------------------------------------------------------------
    def generation(self) -> int:
        key = gen_key(self.job)
        if not self._call("check", [key]):
            return 0
        raw = self._call("get", key)
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"job {self.job}: store key {key} holds {raw!r}, not a generation number") from None

    def members(self, gen: int) -> tuple[str, ...] | None:
        """Generation ``gen``'s members in rank order; None if not (or no longer) in the store."""
        key = members_key(self.job, gen)
        if gen < 1 or not self._call("check", [key]):
            return None
        try:
            raw = self._call("get", key)
        except dist.DistStoreError as exc:
            # The daemon forgot this generation between the check and the get: a
            # get of a missing key blocks until the store's timeout, then raises.
            if "timeout" in str(exc).lower():
                return None
            raise
        if not raw:  # deleted while being read: the store answers with an empty value
            return None
        return parse_members(raw, self.job, gen)

    def published(self, gen: int) -> bool:
        """Whether generation ``gen`` exists (its member list is written before the generation key)."""
        return bool(self._call("check", [members_key(self.job, gen)]))

    def mark_ready(self) -> None:
        self._call("set", ready_key(self.job, self.worker), "1")
        self._marked_ready = True

    def clear_ready(self) -> None:
        self._marked_ready = False
        self._call("delete_key", ready_key(self.job, self.worker))

    def all_ready(self, members: tuple[str, ...]) -> bool:
        return not members or bool(self._call("check", [ready_key(self.job, m) for m in members]))

    def wait_key(self, key: str) -> None:
        """Block until ``key`` exists (served by the store: no polling); a lost store waits for it to return."""
        while True:
            try:
                self._call("wait", [key], timedelta(seconds=WAIT_CHUNK_S))
                return
            except dist.DistStoreError as exc:
                if "timeout" not in str(exc).lower():
                    raise

    def wait_published(self, gen: int) -> int:
        """Block until generation ``gen`` (or a later one) exists; return the newest.

        After a reconnection the store is a new one that may skip generations
        (its daemon numbers on from the last one it published): the
        generation key is polled instead of waiting for ``gen``'s own key.
        """
        while self.reconnects == 0 and self.lost_since is None:
            try:
                self._store.wait([members_key(self.job, gen)], timedelta(seconds=WAIT_CHUNK_S))
                return max(gen, self.generation())
            except Exception as exc:
                if isinstance(exc, dist.DistStoreError) and "timeout" in str(exc).lower():
                    continue
                if self.address is None or not is_store_loss(exc):
                    raise
                self._mark_lost(exc)
        while True:
            newest = self.generation()  # waits for a lost store
            if newest >= gen and self.published(newest):
                return newest
            time.sleep(PUBLISH_POLL_S)

    def wait_including(self, worker: str) -> tuple[int, tuple[str, ...]]:
        """Block until a generation lists ``worker`` (a worker started ahead waits here)."""
        gen = self.generation()
        while True:
            members = self.members(gen)
            if members is not None and worker in members:
                return gen, members
            gen = self.wait_published(gen + 1)

    def save_checkpoint(self, snap: _Snapshot, gen: int) -> None:
        """Store ``snap`` (taken in generation ``gen``) in the daemon's store for a later world."""
        buf = io.BytesIO()
        torch.save({"version": snap.version, "model": snap.model, "optimizer": snap.optimizer,
                    "counters": snap.counters}, buf)
        data = buf.getbuffer()
        chunks = range(0, len(data), CKPT_CHUNK_BYTES)
        for i, start in enumerate(chunks):
            self._call("set", ckpt_chunk_key(self.job, i), bytes(data[start:start + CKPT_CHUNK_BYTES]))
        self._call("set", ckpt_key(self.job), ckpt_header(len(chunks), len(data)))
        self._call("set", ckpt_tag_key(self.job), str(gen))

    def checkpoint_tag(self) -> int:
        key = ckpt_tag_key(self.job)
        return int(self._call("get", key)) if self._call("check", [key]) else 0

    def mark_active(self, gen: int) -> None:
        """Generation ``gen``'s world has formed (rank 0 says so)."""
        self._call("set", active_key(self.job), str(gen))

    def wait_handover(self, gen: int, wait_s: float = HANDOVER_WAIT_S) -> None:
        """If ``gen`` replaces a whole world, wait (bounded) for that world's checkpoint."""
        if not self._call("check", [handover_key(self.job, gen)]):
            return
        key = active_key(self.job)
        source = int(self._call("get", key)) if self._call("check", [key]) else 0
        deadline = time.monotonic() + wait_s
        while self.checkpoint_tag() < source:
            if time.monotonic() > deadline:
                log.warning("job %s: no checkpoint from generation %d after %.0f s; using what is stored",
                            self.job, source, wait_s)
                return
            time.sleep(self.poll_s * 4)

    def load_checkpoint(self) -> _Snapshot | None:
        key = ckpt_key(self.job)
        if not self._call("check", [key]):
            return None
        n_chunks, size = parse_ckpt_header(self._call("get", key), self.job)
        data = b"".join(self._call("get", ckpt_chunk_key(self.job, i)) for i in range(n_chunks))
        if len(data) != size:
            raise ValueError(f"job {self.job}: checkpoint holds {len(data)} bytes, its header says {size}")
        # written by this job's own rank 0 through the daemon's store, as trusted as gloo's traffic
        obj = torch.load(io.BytesIO(data), weights_only=False)
        return _Snapshot(obj["version"], obj["model"], obj["optimizer"], obj["counters"])

    def barrier(self, gen: int, world: int) -> bool:
        """Wait until all ``world`` members reached ``gen``; False if a newer generation came first."""
        if self._call("add", arrive_key(self.job, gen), 1) >= world:
            self._call("set", joined_key(self.job, gen), "1")
            return True
        done = joined_key(self.job, gen)
        while True:
            reconnects = self.reconnects
            if self._call("check", [done]):
                return True
            if self.published(gen + 1) or (self.reconnects and self.generation() > gen):
                return False
            if self.reconnects != reconnects:
                return False  # a new store knows nothing of this barrier: wait for its generation
            time.sleep(self.poll_s)


class State:
    """Model, optimizer and counters (``step``, ``epoch``, ``samples``, ``extra``) of one worker."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        step: int = 0,
        epoch: int = 0,
        samples: int = 0,
        rendezvous: Rendezvous | None = None,
        timeout_s: float | None = None,
        **extra: Any,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.step = step
        self.epoch = epoch
        self.samples = samples
        self.extra: dict[str, Any] = dict(extra)
        self.rank = 0
        self.world_size = 1
        self.generation = 0
        self.members: tuple[str, ...] = ()
        self.rescales: list[RescaleEvent] = []
        self._rdzv = rendezvous if rendezvous is not None else Rendezvous.from_env()
        self.worker = self._rdzv.worker if self._rdzv else os.environ.get(ENV_WORKER, "local")
        self.timeout_s = timeout_s if timeout_s is not None else _env_timeout()
        self._version = -1  # commits of the state this worker holds; -1: none yet
        self._committed: _Snapshot | None = None
        self._ddp: Any = None
        self._joined = False
        self._recoveries = 0

    # -- user API --------------------------------------------------------------------
    @property
    def elastic(self) -> bool:
        """True under the ``torch`` runtime (a store to rendezvous with)."""
        return self._rdzv is not None

    def ddp(self, **kwargs: Any) -> torch.nn.Module:
        """The model wrapped in DistributedDataParallel for the current world (made once per world).

        ``init_sync`` defaults to False: joining a world already gave every
        rank the same parameters and buffers.
        """
        if not self._joined:
            raise RuntimeError("State.ddp() before join(): call it inside run(train_fn, state)")
        if self._ddp is None:
            from torch.nn.parallel import DistributedDataParallel

            kwargs.setdefault("init_sync", False)
            self._ddp = DistributedDataParallel(self.model, **kwargs)
        return self._ddp

    def allreduce_gradients(self) -> None:
        """Average gradients over the world by hand (an alternative to :meth:`ddp`)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if self.world_size == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def commit(self) -> None:
        """Snapshot the state; switch to a new generation if one is ready (then raise :class:`Rescaled`)."""
        self._version += 1
        self._committed = self._snapshot()
        self._recoveries = 0
        if self._rdzv is None:
            return
        target = self._decide()
        if target != self.generation:
            self._switch(target)
            raise Rescaled(f"worker {self.worker}: now rank {self.rank} of {self.world_size} (generation {target})")

    def restore(self) -> None:
        """Roll back to the last commit."""
        if self._committed is not None:
            self._load(self._committed)

    # -- joining -----------------------------------------------------------------------
    def join(self) -> None:
        """First join: wait for a generation that includes this worker and take the job's state."""
        if self._joined:
            return
        started = time.time()
        if self._rdzv is None:
            if not dist.is_initialized():
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self._joined = True
            client.set_context(self.rank, self.world_size, 0)
            return
        self._install_sigterm()
        self._rdzv.mark_ready()
        gen, _ = self._rdzv.wait_including(self.worker)
        self._join(gen)
        self._record("join", 0, 0, started)

    def _decide(self) -> int:
        """The generation to run next, agreed by all ranks (rank 0 reads the store)."""
        assert self._rdzv is not None
        target = self.generation
        lost: StoreLost | None = None
        if self.rank == 0:
            try:
                target = self._rdzv.next_generation(self.generation)
            except StoreLost as exc:
                lost, target = exc, _STORE_LOST
        if self.world_size > 1:
            t = torch.tensor([target], dtype=torch.int64)
            dist.broadcast(t, src=0)
            target = int(t.item())
        if target == _STORE_LOST:
            raise lost or StoreLost(f"worker {self.worker}: rank 0 lost the daemon's store for good")
        return target

    def _switch(self, gen: int) -> None:
        assert self._rdzv is not None
        started, old_gen, old_world = time.time(), self.generation, self.world_size
        if self.rank == 0 and not set(self._rdzv.members(gen) or ()) & set(self.members):
            self._save_checkpoint()  # nobody stays: hand the state over through the store
        self._teardown()
        self._join(gen)
        kind = "up" if self.world_size > old_world else "down" if self.world_size < old_world else "change"
        self._record(kind, old_gen, old_world, started)

    def _join(self, gen: int) -> None:
        """Join generation ``gen`` (or a later one after a failure or a newer publication)."""
        assert self._rdzv is not None
        while True:
            members = self._rdzv.members(gen)
            if members is None and self._rdzv.generation() < gen:
                gen = self._rdzv.wait_published(gen)  # a new store (daemon restart) has not got there yet
                continue
            if members is None or self.worker not in members:
                raise LeaveJob(f"worker {self.worker} is not in generation {gen} of job {self._rdzv.job}")
            if self._version < 0:
                self._rdzv.wait_handover(gen)
            if not self._rdzv.barrier(gen, len(members)):
                gen = self._rdzv.wait_published(gen + 1)
                continue
            try:
                self._init_group(gen, members)
                self._sync_state()
                if self.rank == 0:
                    self._rdzv.mark_active(gen)
            except Exception as exc:
                if not is_comm_failure(exc):
                    raise
                log.warning("worker %s: joining generation %d failed (%s); waiting for the next", self.worker, gen, exc)
                self._teardown()
                self.restore()
                gen = self._rdzv.wait_published(gen + 1)
                continue
            return

    def _init_group(self, gen: int, members: tuple[str, ...]) -> None:
        assert self._rdzv is not None
        rank = members.index(self.worker)
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(pg_prefix(self._rdzv.job, gen), self._rdzv.store),
            rank=rank,
            world_size=len(members),
            timeout=timedelta(seconds=self.timeout_s),
        )
        self.rank, self.world_size, self.generation, self.members = rank, len(members), gen, members
        self._rdzv.world, self._rdzv.current, self._rdzv.rank = members, gen, rank
        self._joined = True
        client.set_context(rank, len(members), gen)

    def _sync_state(self) -> None:
        """Everyone takes the state of the lowest rank holding the newest commit."""
        if self._committed is None:
            self._committed = self._snapshot()
        mine = torch.tensor([self._version], dtype=torch.int64)
        if self.world_size == 1:
            versions = [self._version]
        else:
            gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            dist.all_gather(gathered, mine)
            versions = [int(v.item()) for v in gathered]
        newest = max(versions)
        src = versions.index(newest)
        if newest < 0 and self.rank == src and self._rdzv is not None:
            stored = self._rdzv.load_checkpoint()  # nobody has state: a world that left stored it
            if stored is not None:
                self._load(stored)
                log.info("worker %s: resumed from the checkpoint of step %s", self.worker, self.step)
        if self.world_size > 1 and (newest < 0 or any(v != newest for v in versions)):
            snap = broadcast_snapshot(self._committed if self.rank == src else None, src, self.rank)
            if self.rank != src:
                self._load(snap)
        self._version = max(self._version, 0)
        self._committed.version = self._version

    # -- recovery ---------------------------------------------------------------------
    def recover(self, exc: BaseException) -> None:
        """After a failed collective: roll back, wait for the next generation, re-join."""
        if self._rdzv is None:
            raise exc
        self._recoveries += 1
        if self._recoveries > MAX_RECOVERIES_WITHOUT_COMMIT:
            raise RuntimeError(
                f"worker {self.worker}: {self._recoveries} failures without a commit; last: {exc}"
            ) from exc
        started, old_gen, old_world = time.time(), self.generation, self.world_size
        log.warning("worker %s: generation %d failed (%s); rolling back to the last commit", self.worker, old_gen, exc)
        self._teardown()
        self.restore()
        gen = self._rdzv.wait_published(old_gen + 1)
        self._join(gen)
        self._record("recover", old_gen, old_world, started)

    def leave(self) -> None:
        """Drop out of the job: destroy the group and clear the ready mark."""
        started, old_gen, old_world = time.time(), self.generation, self.world_size
        self._teardown()
        self._uninstall_sigterm()
        if self._rdzv is not None:
            try:
                self._rdzv.try_quietly(self._rdzv.clear_ready)
            except StoreUnavailable:
                pass  # a new store never had the mark
        self._record("leave", old_gen, old_world, started)

    def _save_checkpoint(self) -> None:
        if self._rdzv is not None and self._committed is not None and self._version >= 0:
            self._rdzv.save_checkpoint(self._committed, self.generation)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A stop or recall: rank 0 leaves the last commit in the store, then the worker exits 143."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.rank == 0 and self._rdzv is not None:
            try:
                self._rdzv.try_quietly(self._save_checkpoint)  # never wait for a lost store here
            except Exception as exc:  # the store may be gone too
                log.warning("worker %s: no checkpoint on SIGTERM: %s", self.worker, exc)
        raise SystemExit(128 + signum)

    def _uninstall_sigterm(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:
            pass

    def _install_sigterm(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread: leave signals alone
            pass

    # -- internals ----------------------------------------------------------------------
    def _teardown(self) -> None:
        self._ddp = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def _snapshot(self) -> _Snapshot:
        return _Snapshot(
            version=self._version,
            model=copy.deepcopy(self.model.state_dict()),
            optimizer=copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
            counters={"step": self.step, "epoch": self.epoch, "samples": self.samples, "extra": copy.deepcopy(self.extra)},
        )

    def _load(self, snap: _Snapshot) -> None:
        self.model.load_state_dict(snap.model)
        if self.optimizer is not None and snap.optimizer is not None:
            # the optimizer may alias the tensors it is given: hand it a copy
            self.optimizer.load_state_dict(copy.deepcopy(snap.optimizer))
        c = snap.counters
        self.step, self.epoch, self.samples = c["step"], c["epoch"], c["samples"]
        self.extra = copy.deepcopy(c["extra"])
        self._version = snap.version
        self._committed = snap

    def _record(self, kind: str, old_gen: int, old_world: int, started: float) -> None:
        event = RescaleEvent(kind, old_gen, self.generation, old_world, self.world_size, started, time.time())
        self.rescales.append(event)
        log.info("worker %s: %s g%d->g%d world %d->%d in %.3f s", self.worker, kind, old_gen,
                 event.to_generation, old_world, event.world_after, event.pause)


@dataclass(frozen=True)
class _TensorRef:
    """Where a tensor of a snapshot sits in the broadcast byte buffer."""

    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def _extract(obj: Any, tensors: list[torch.Tensor], offset: list[int]) -> Any:
    """``obj`` with every CPU tensor replaced by a :class:`_TensorRef`; the tensors go to ``tensors``."""
    if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.layout == torch.strided:
        flat = obj.detach().contiguous().reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
        ref = _TensorRef(offset[0], raw.numel(), tuple(obj.shape), obj.dtype)
        tensors.append(raw)
        offset[0] += raw.numel()
        return ref
    if isinstance(obj, dict):
        return {k: _extract(v, tensors, offset) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_extract(v, tensors, offset) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_extract(v, tensors, offset) for v in obj)
    return obj


def _inject(obj: Any, buf: torch.Tensor) -> Any:
    if isinstance(obj, _TensorRef):
        raw = buf[obj.offset : obj.offset + obj.nbytes].clone()  # own, aligned storage
        return (raw.view(obj.dtype) if obj.dtype != torch.uint8 else raw).reshape(obj.shape)
    if isinstance(obj, dict):
        return {k: _inject(v, buf) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_inject(v, buf) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_inject(v, buf) for v in obj)
    return obj


def broadcast_snapshot(snap: _Snapshot | None, src: int, rank: int) -> _Snapshot:
    """Send ``snap`` from ``src`` to every rank: its structure pickled, its tensors as one byte buffer."""
    tensors: list[torch.Tensor] = []
    box: list[Any] = [None]
    if rank == src:
        assert snap is not None
        size = [0]
        skeleton = _extract((snap.model, snap.optimizer), tensors, size)
        box = [(snap.version, snap.counters, skeleton, size[0])]
    dist.broadcast_object_list(box, src=src)
    version, counters, skeleton, nbytes = box[0]
    buf = torch.cat(tensors) if rank == src and tensors else torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        dist.broadcast(buf, src=src)
    if rank == src:
        assert snap is not None
        return snap
    model, optimizer = _inject(skeleton, buf)
    return _Snapshot(version, model, optimizer, counters)


def _env_timeout() -> float:
    return _env_seconds(os.environ, ENV_TIMEOUT, DEFAULT_COLLECTIVE_TIMEOUT_S)


def _env_seconds(env: Any, name: str, default: float) -> float:
    """A positive number of seconds from environment variable ``name`` (``default`` if unset)."""
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be > 0")
    return value


def _address_text(address: tuple[str, int] | None) -> str:
    return "(no address)" if address is None else f"{address[0]}:{address[1]}"


def run(train_fn: Callable[..., T], state: State, *args: Any, **kwargs: Any) -> T:
    """Call ``train_fn(state, *args, **kwargs)`` elastically (like ``hvd.elastic.run``).

    Joins the job first; calls ``train_fn`` again after every rescale (with the
    counters of the last commit) and after a recovery from a lost peer. A worker
    dropped from the job leaves with ``SystemExit(0)``; one whose daemon's store
    stayed away too long with ``SystemExit(75)``.
    """
    try:
        state.join()
        while True:
            try:
                return train_fn(state, *args, **kwargs)
            except Rescaled:
                continue
            except LeaveJob:
                raise
            except Exception as exc:
                if not state.elastic or not is_comm_failure(exc):
                    raise
                state.recover(exc)
    except LeaveJob as exc:
        log.info("%s", exc)
        state.leave()
        raise SystemExit(0) from None
    except StoreLost as exc:
        log.error("%s; exiting with code %d", exc, EXIT_STORE_LOST)
        state.leave()
        raise SystemExit(EXIT_STORE_LOST) from None
