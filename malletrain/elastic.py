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

Outside malletrain (no ``MALLETRAIN_STORE``) the same script runs as a
single worker in a one-process gloo group.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from malletrain import client
from malletrain.runtimes.torch_elastic import (
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    ENV_JOB,
    ENV_STORE,
    ENV_TIMEOUT,
    ENV_WORKER,
    active_key,
    arrive_key,
    check_id,
    ckpt_key,
    ckpt_tag_key,
    gen_key,
    handover_key,
    joined_key,
    members_key,
    parse_address,
    parse_members,
    pg_prefix,
    ready_key,
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


def is_comm_failure(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a lost peer (gloo error, timeout, distributed error)."""
    if isinstance(exc, (LeaveJob, Rescaled)):
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
    """A worker's view of its job's keys in the daemon's store."""

    def __init__(self, store: Any, job: str, worker: str, poll_s: float = POLL_S) -> None:
        self.store = store
        self.job = check_id("job", job)
        self.worker = check_id("worker", worker)
        self.poll_s = poll_s

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
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
        return cls(store, env[ENV_JOB], env[ENV_WORKER])

    def generation(self) -> int:
        key = gen_key(self.job)
        if not self.store.check([key]):
            return 0
        raw = self.store.get(key)
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"job {self.job}: store key {key} holds {raw!r}, not a generation number") from None

    def members(self, gen: int) -> tuple[str, ...] | None:
        """Generation ``gen``'s members in rank order; None if not (or no longer) in the store."""
        key = members_key(self.job, gen)
        if gen < 1 or not self.store.check([key]):
            return None
        return parse_members(self.store.get(key), self.job, gen)

    def published(self, gen: int) -> bool:
        """Whether generation ``gen`` exists (its member list is written before the generation key)."""
        return bool(self.store.check([members_key(self.job, gen)]))

    def mark_ready(self) -> None:
        self.store.set(ready_key(self.job, self.worker), "1")

    def clear_ready(self) -> None:
        self.store.delete_key(ready_key(self.job, self.worker))

    def all_ready(self, members: tuple[str, ...]) -> bool:
        return not members or bool(self.store.check([ready_key(self.job, m) for m in members]))

    def wait_key(self, key: str) -> None:
        """Block until ``key`` exists (served by the store: no polling); a lost store raises."""
        while True:
            try:
                self.store.wait([key], timedelta(seconds=WAIT_CHUNK_S))
                return
            except dist.DistStoreError as exc:
                if "timeout" not in str(exc).lower():
                    raise

    def wait_published(self, gen: int) -> int:
        """Block until generation ``gen`` (or a later one) exists; return the newest."""
        self.wait_key(members_key(self.job, gen))
        return max(gen, self.generation())

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
        self.store.set(ckpt_key(self.job), buf.getvalue())
        self.store.set(ckpt_tag_key(self.job), str(gen))

    def checkpoint_tag(self) -> int:
        key = ckpt_tag_key(self.job)
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def mark_active(self, gen: int) -> None:
        """Generation ``gen``'s world has formed (rank 0 says so)."""
        self.store.set(active_key(self.job), str(gen))

    def wait_handover(self, gen: int, wait_s: float = HANDOVER_WAIT_S) -> None:
        """If ``gen`` replaces a whole world, wait (bounded) for that world's checkpoint."""
        if not self.store.check([handover_key(self.job, gen)]):
            return
        key = active_key(self.job)
        source = int(self.store.get(key)) if self.store.check([key]) else 0
        deadline = time.monotonic() + wait_s
        while self.checkpoint_tag() < source:
            if time.monotonic() > deadline:
                log.warning("job %s: no checkpoint from generation %d after %.0f s; using what is stored",
                            self.job, source, wait_s)
                return
            time.sleep(self.poll_s * 4)

    def load_checkpoint(self) -> _Snapshot | None:
        key = ckpt_key(self.job)
        if not self.store.check([key]):
            return None
        # written by this job's own rank 0 through the daemon's store, as trusted as gloo's traffic
        obj = torch.load(io.BytesIO(self.store.get(key)), weights_only=False)
        return _Snapshot(obj["version"], obj["model"], obj["optimizer"], obj["counters"])

    def barrier(self, gen: int, world: int) -> bool:
        """Wait until all ``world`` members reached ``gen``; False if a newer generation came first."""
        if self.store.add(arrive_key(self.job, gen), 1) >= world:
            self.store.set(joined_key(self.job, gen), "1")
            return True
        done = joined_key(self.job, gen)
        while True:
            if self.store.check([done]):
                return True
            if self.published(gen + 1):
                return False
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
        if self.rank == 0:
            gen = self._rdzv.generation()
            if gen > self.generation and self._rdzv.all_ready(self._rdzv.members(gen) or ()):
                target = gen
        if self.world_size > 1:
            t = torch.tensor([target], dtype=torch.int64)
            dist.broadcast(t, src=0)
            target = int(t.item())
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
            self._rdzv.clear_ready()
        self._record("leave", old_gen, old_world, started)

    def _save_checkpoint(self) -> None:
        if self._rdzv is not None and self._committed is not None and self._version >= 0:
            self._rdzv.save_checkpoint(self._committed, self.generation)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A stop or recall: rank 0 leaves the last commit in the store, then the worker exits 143."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.rank == 0:
            try:
                self._save_checkpoint()
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
    text = os.environ.get(ENV_TIMEOUT)
    if not text:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{ENV_TIMEOUT}={text!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{ENV_TIMEOUT}={text!r} must be > 0")
    return value


def run(train_fn: Callable[..., T], state: State, *args: Any, **kwargs: Any) -> T:
    """Call ``train_fn(state, *args, **kwargs)`` elastically (like ``hvd.elastic.run``).

    Joins the job first; calls ``train_fn`` again after every rescale (with the
    counters of the last commit) and after a recovery from a lost peer. A worker
    dropped from the job leaves with ``SystemExit(0)``.
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
