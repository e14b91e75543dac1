"""A worker's training state and its life in the job: join, commit, switch, recover, leave.

:class:`State` owns this worker's process group: every way out of a world destroys it, so no gloo
thread outlives the world it served.
"""

from __future__ import annotations

import copy
import gc
import logging
import os
import signal
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# torch.distributed.nn.functional binds ``group=group.WORLD`` as a default argument when it is
# first imported (DistributedDataParallel imports it). Imported while a group exists, it keeps
# that group -- and its gloo threads -- alive until the interpreter exits, where a gloo thread
# finishing a work item then needs the GIL and aborts the process ("terminate called without an
# active exception"). Imported here, before any group exists, it binds None.
import torch.distributed.nn.functional  # noqa: F401,E402  (see above)

from malletrain.worker import client
from malletrain.worker.elastic.devices import collective_backend, local_slot, place_in
from malletrain.worker.elastic.errors import LeaveJob, Rescaled, StoreLost, StoreUnavailable, first_line, is_comm_failure
from malletrain.worker.elastic.rendezvous import Rendezvous, form_world
from malletrain.worker.elastic.snapshot import Snapshot, broadcast_snapshot
from contract.workerenv import WorkerEnv, configure_worker_logging, torchrun_environ

log = logging.getLogger("malletrain.worker.elastic")

MAX_RECOVERIES_WITHOUT_COMMIT = 10
"""A failure that repeats this often without one commit in between is not a recall: it is raised."""

_STORE_LOST = -1
"""Rank 0's broadcast decision: everyone exits (StoreLost)."""


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


class State:
    """Model, optimizer and counters (``step``, ``epoch``, ``samples``, ``extra``) of one worker."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, step: int = 0,
                 epoch: int = 0, samples: int = 0, rendezvous: Rendezvous | None = None,
                 timeout_s: float | None = None, **extra: Any) -> None:
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
        env = WorkerEnv.from_environ()
        if env.worker is not None:  # started by a runtime: stderr is the worker's log file
            configure_worker_logging(env.log_level)
        self._rdzv = rendezvous if rendezvous is not None else Rendezvous.from_worker_env(env)
        self.worker = self._rdzv.worker if self._rdzv else (env.worker or "local")
        self.timeout_s = timeout_s if timeout_s is not None else env.collective_timeout_s
        # this process's slot on its node: the daemon's members are nodes, each of K ranks
        self.local_rank, self.local_world_size = local_slot(os.environ) if self._rdzv else (0, 1)
        self.backend = "gloo"  # the collectives of the current world (see _init_group)
        self._worlds = 0  # worlds joined so far (torchrun's restart count is this less one)
        self._version = -1  # commits of the state this worker holds; -1: none yet
        self._committed: Snapshot | None = None
        self._ddp: Any = None
        self._joined = False
        self._recoveries = 0
        self._groups: list[tuple[int, weakref.ref[Any]]] = []  # (generation, group) of every world joined
        self._owns_group = False  # the current default group was made by this State
        self._term_pending: int | None = None  # the signal that stops this worker, once one came
        self._checkpointing = False  # a checkpoint write is under way
        self._in_handler = False  # the SIGTERM handler itself writes the checkpoint

    # -- user API --------------------------------------------------------------------
    @property
    def job(self) -> str | None:
        """The job id under the ``torch`` runtime (None when running as one local worker)."""
        return self._rdzv.job if self._rdzv is not None else None

    @property
    def stopping(self) -> int | None:
        """The signal that is stopping this worker (SIGTERM: a stop or a recall); None while none came."""
        return self._term_pending

    @property
    def elastic(self) -> bool:
        """True under the ``torch`` runtime (a store to rendezvous with)."""
        return self._rdzv is not None

    def ddp(self, **kwargs: Any) -> torch.nn.Module:
        """The model wrapped in DistributedDataParallel for the current world (made once per world);
        ``init_sync`` defaults to False: joining a world already gave every rank the same parameters."""
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
        """Snapshot the state; switch to a new generation if one is ready (then raise :class:`Rescaled`).
        The reports held since the last commit are sent now: a rollback never counts a sample twice."""
        self._version += 1
        self._committed = self._snapshot()
        self._recoveries = 0
        if self._rdzv is None:
            return
        client.release_reports()
        target = self._decide()
        if target == self.generation:
            return
        if self._relabel(target):
            return
        self._switch(target)
        raise Rescaled(f"worker {self.worker}: now rank {self.rank} of {self.world_size} (generation {target})")

    def restore(self) -> None:
        """Roll back to the last commit (the reports made since are dropped, not sent)."""
        client.drop_held_reports()
        if self._committed is not None:
            self._load(self._committed)

    # -- joining -----------------------------------------------------------------------
    def join(self) -> None:
        """First join: wait for a generation that includes this worker and take the job's state."""
        if self._joined:
            return
        started = time.time()
        if self._rdzv is None:
            if not dist.is_initialized():  # a group the script made itself stays the script's
                dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
                self._owns_group = True
                self._groups.append((0, weakref.ref(dist.group.WORLD)))
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self._joined = True
            log.info("worker %s: no MALLETRAIN_STORE, training as a single local worker", self.worker)
            client.set_context(self.rank, self.world_size, 0)
            return
        self._install_sigterm()
        client.hold_reports()
        self._rdzv.mark_ready()
        log.info("worker %s: ready, waiting for a generation of job %s that lists it", self.worker, self._rdzv.job)
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
            t = torch.tensor([target], dtype=torch.int64, device=self._comm_device())
            dist.broadcast(t, src=0)
            target = int(t.item())
        if target == _STORE_LOST:
            raise lost or StoreLost(f"worker {self.worker}: rank 0 lost the daemon's store for good")
        return target

    def _relabel(self, gen: int) -> bool:
        """Generation ``gen`` lists this world as it is (same workers, same ranks; e.g. a restarted
        daemon publishing the workers it re-adopted): keep the group and the model, take the number.
        False if ``gen`` changes the world."""
        assert self._rdzv is not None
        if self._rdzv.members(gen) != self.members:
            return False
        started, old_gen = time.time(), self.generation
        self.generation = self._rdzv.current = gen
        client.set_context(self.rank, self.world_size, gen, self.local_world_size)
        if self.rank == 0:
            self._rdzv.mark_active(gen)
        log.info("worker %s: generation %d keeps this world as it is: renumbered from %d at step %d",
                 self.worker, gen, old_gen, self.step)
        self._record("change", old_gen, self.world_size, started)
        return True

    def _switch(self, gen: int) -> None:
        assert self._rdzv is not None
        started, old_gen, old_world = time.time(), self.generation, self.world_size
        log.info("worker %s: generation %d is ready; switching from generation %d at step %d",
                 self.worker, gen, old_gen, self.step)
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
            t0 = time.monotonic()
            if not self._rdzv.barrier(gen, len(members) * self.local_world_size):
                gen = self._rdzv.wait_published(gen + 1)
                continue
            try:
                t1 = time.monotonic()
                self._init_group(gen, members)
                t2 = time.monotonic()
                self._sync_state()
                if self.rank == 0:
                    self._rdzv.mark_active(gen)
                log.info("worker %s: in generation %d as rank %d of %d: barrier %.3f s, %s group %.3f s, "
                         "state %.3f s", self.worker, gen, self.rank, self.world_size, t1 - t0, self.backend,
                         t2 - t1, time.monotonic() - t2)
            except Exception as exc:
                if not is_comm_failure(exc):
                    raise
                log.warning("worker %s: joining generation %d failed (%s); rolling back to step %d and "
                            "waiting for the next generation", self.worker, gen, first_line(exc), self.step)
                self._teardown()
                self.restore()
                gen = self._rdzv.wait_published(gen + 1)
                continue
            return

    def _init_group(self, gen: int, members: tuple[str, ...]) -> None:
        assert self._rdzv is not None
        place = place_in(members, self.worker, self.local_rank, self.local_world_size)
        rank, world = place.rank, place.world_size
        self.backend = self._backend()
        if self.backend == "nccl":
            torch.cuda.set_device(self._model_device())  # NCCL binds each rank to its current device
            # a lost peer (a recalled node) raises in the training thread, which recovers as under gloo,
            # instead of NCCL's watchdog tearing the whole process down (its default)
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        store, master = self._group_store(gen, rank, world)
        dist.init_process_group(self.backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=self.timeout_s))
        self._owns_group = True
        self._groups.append((gen, weakref.ref(dist.group.WORLD)))
        self.rank, self.world_size, self.generation, self.members = rank, world, gen, members
        self._rdzv.world, self._rdzv.current, self._rdzv.rank = members, gen, rank
        self._joined = True
        # libraries that read torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK ...) see this world; the
        # worlds it was in before this one are torchrun's restart count
        os.environ.update(torchrun_environ(place, master, self._rdzv.job, restart_count=self._worlds))
        self._worlds += 1
        client.set_context(rank, world, gen, self.local_world_size)  # reports count nodes

    def _backend(self) -> str:
        """The collectives for the model's device: NCCL (RCCL) on CUDA, XCCL on XPU, else gloo."""
        available = {name for name, has in (("nccl", dist.is_nccl_available()),
                                            ("xccl", getattr(dist, "is_xccl_available", lambda: False)()))
                     if has}
        return collective_backend(self._model_device().type, available)

    def _model_device(self) -> torch.device:
        first = next(iter(self.model.parameters()), None)
        return first.device if first is not None else torch.device("cpu")

    def _comm_device(self) -> torch.device:
        """Where the control tensors of a collective live: the model's device under the device's own
        collectives (NCCL takes device tensors only), the CPU under gloo."""
        return self._model_device() if self.backend != "gloo" else torch.device("cpu")

    def _group_store(self, gen: int, rank: int, world: int) -> tuple[Any, tuple[str, int]]:
        """The store of generation ``gen``'s own rendezvous and its (host, port): served by its rank 0 (never
        the daemon's store) under a random key prefix only the job's workers learn (:func:`form_world`)."""
        assert self._rdzv is not None
        timeout = timedelta(seconds=self.timeout_s)
        master = form_world(self._rdzv, gen, world, rank == 0, self.timeout_s)
        if master is None:
            raise RuntimeError(f"gloo rendezvous of generation {gen}: rank 0 did not say where within "
                               f"{self.timeout_s:g} s (timed out)")
        if master.fd is not None:
            fd = master.take()
            try:
                store = dist.TCPStore(master.host, master.port, is_master=True, wait_for_workers=False,
                                      timeout=timeout, master_listen_fd=fd, use_libuv=True)
            except BaseException:
                os.close(fd)
                raise
        else:
            store = dist.TCPStore(master.host, master.port, is_master=False, timeout=timeout)
        return dist.PrefixStore(master.token, store), (master.host, master.port)

    def _sync_state(self) -> None:
        """Everyone takes the state of the lowest rank holding the newest commit."""
        if self._committed is None:
            self._committed = self._snapshot()
        device = self._comm_device()
        mine = torch.tensor([self._version], dtype=torch.int64, device=device)
        if self.world_size == 1:
            versions = [self._version]
        else:
            gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.world_size)]
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
            snap = broadcast_snapshot(self._committed if self.rank == src else None, src, self.rank,
                                      self._rdzv.job if self._rdzv is not None else "-", device)
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
            raise RuntimeError(f"worker {self.worker}: {self._recoveries} failures without a commit; last: {exc}") \
                from exc
        started, old_gen, old_world = time.time(), self.generation, self.world_size
        self._teardown()
        if any(ref() is not None for _, ref in self._groups):
            gc.collect()  # a DDP wrapper in a reference cycle holds the group: its connections close now
        self.restore()
        log.warning("worker %s: a peer of generation %d failed (%s); rolled back to the commit of step %d, "
                    "waiting for the next generation", self.worker, old_gen, first_line(exc), self.step)
        gen = self._rdzv.wait_published(old_gen + 1)
        self._join(gen)
        self._record("recover", old_gen, old_world, started)

    def leave(self) -> None:
        """Drop out of the job: destroy the group and clear the ready mark."""
        started, old_gen, old_world = time.time(), self.generation, self.world_size
        self.close()
        if self._rdzv is not None:
            try:
                self._rdzv.try_quietly(self._rdzv.clear_ready)
            except StoreUnavailable:
                pass  # a new store never had the mark
        self._record("leave", old_gen, old_world, started)

    def close(self) -> None:
        """Leave the current world for good: destroy the gloo group (joining its threads), drop the
        SIGTERM handler. Called by :func:`~malletrain.worker.elastic.run` on every way out; idempotent."""
        self._teardown()
        client.drop_held_reports()  # steps after the last commit: whoever goes on trains them again
        self._uninstall_sigterm()
        self._check_groups_gone()
        self._joined = False  # another run() joins again

    def _save_checkpoint(self, aside: bool = False) -> None:
        """Leave the last commit in the store; a SIGTERM that comes meanwhile waits until it is written.
        ``aside``: from the SIGTERM handler (its own connection, see :meth:`Rendezvous.save_checkpoint`)."""
        if self._rdzv is None or self._committed is None or self._version < 0:
            return
        self._checkpointing = True
        try:
            self._rdzv.save_checkpoint(self._committed, self.generation, aside=aside)
        finally:
            self._checkpointing = False
        if self._term_pending is not None and not self._in_handler:
            raise SystemExit(128 + self._term_pending)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """A stop or a recall: rank 0 leaves the last commit in the store, then the worker exits 143. A second
        signal is logged and ignored; one during a checkpoint write lets the write finish first."""
        if self._term_pending is not None:
            log.info("worker %s: %s again: already stopping", self.worker, signal.Signals(signum).name)
            return
        self._term_pending = signum
        log.info("worker %s: %s (a stop or a recall) at step %d of generation %d", self.worker,
                 signal.Signals(signum).name, self.step, self.generation)
        if self._checkpointing:
            return  # the training thread is writing one: it exits once it is written
        client.drop_held_reports()  # steps after the last commit: the next world trains them again
        if self.rank == 0 and self._rdzv is not None:
            self._in_handler = True
            try:
                # on a connection of its own: the training thread may be inside a call on the shared one
                self._save_checkpoint(aside=True)
            except Exception as exc:  # the store may be gone too
                log.warning("worker %s: no checkpoint on %s: %s", self.worker, signal.Signals(signum).name, exc)
            finally:
                self._in_handler = False
        raise SystemExit(128 + signum)

    def _uninstall_sigterm(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                # once stopping, a late second SIGTERM must not turn the exit 143 into a kill
                signal.signal(signal.SIGTERM, signal.SIG_IGN if self._term_pending is not None else signal.SIG_DFL)
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
        """Destroy this world's gloo group (its threads stop once nothing else references it)."""
        self._ddp = None
        if (self._owns_group or self._rdzv is not None) and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def _check_groups_gone(self) -> None:
        """After the last teardown: every gloo group this worker made must be freed, or its threads
        would still run when the interpreter exits (where they can abort the process)."""
        if any(ref() is not None for _, ref in self._groups):
            gc.collect()  # a DDP wrapper in a reference cycle may still hold its group
        alive = [gen for gen, ref in self._groups if ref() is not None]
        self._groups = [(gen, ref) for gen, ref in self._groups if ref() is not None]
        if alive:
            log.warning("worker %s: the gloo group of generation(s) %s is still referenced after it was "
                        "destroyed, so its threads outlive it (does the training script keep a DDP model "
                        "or a process group?)", self.worker, alive)

    def _snapshot(self) -> Snapshot:
        return Snapshot(self._version, copy.deepcopy(self.model.state_dict()),
                        copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
                        {"step": self.step, "epoch": self.epoch, "samples": self.samples,
                         "extra": copy.deepcopy(self.extra)})

    def _load(self, snap: Snapshot) -> None:
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
        log.info("worker %s: %s generation %d -> %d, world %d -> %d, rank %d, step %d (%.3f s)", self.worker,
                 kind, old_gen, event.to_generation, old_world, event.world_after, self.rank, self.step, event.pause)
