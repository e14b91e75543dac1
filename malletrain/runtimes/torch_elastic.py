"""The ``torch`` runtime, daemon side: the rendezvous store and membership generations.

The daemon hosts one authenticated rendezvous store (:mod:`malletrain.runtimes.store_server`) for
all its jobs; gloo's own rendezvous of each world is served by its rank 0
(:mod:`malletrain.worker.elastic.state`). :meth:`TorchRuntime.set_members` writes the member list
before the generation key, so a worker that sees generation ``g`` finds its members; workers switch
at their next commit point. After a daemon restart the store is new and empty on the same port:
workers train on for ``MALLETRAIN_STORE_GRACE`` seconds, the re-adopted ones are published again
above every old generation, and fresh ones start from the checkpoint the daemon kept on disk
(:meth:`TorchRuntime.persist_checkpoints`, :meth:`TorchRuntime.resume_generation`); see
docs/design/resilience.md."""

from __future__ import annotations

import contextlib
import json
import secrets
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

from contract.storekeys import (
    CKPT_CHUNK_BYTES, active_key, arrive_key, ckpt_chunk_key, ckpt_header, ckpt_key, ckpt_seq_key, ckpt_tag_key,
    gen_key, handover_key, joined_key, members_key, parse_ckpt_header, ready_key, resume_key
)
from contract.wire import listen_socket
from contract.messages import job_secret
from malletrain.runtimes import LaunchSpec, Runtime
from malletrain.runtimes.store_server import RendezvousStore, StoreLimits
from contract.workerenv import DEFAULT_COLLECTIVE_TIMEOUT_S, DEFAULT_STORE_GRACE_S, WorkerEnv, check_id, format_address

log = logging.getLogger("malletrain.runtimes.torch")


class RuntimeStateError(RuntimeError):
    """The runtime was used in the wrong state (e.g. before :meth:`TorchRuntime.start`)."""


MAX_RESUMED_GENERATION = 2**31 - 1
"""The largest generation a reconnected worker's ``resume`` key may report (a job writes that key: a
bigger number, e.g. 2^63, would overflow the daemon's SQLite record and the numbering after it)."""
CKPT_FILE_MAGIC = b"malletrain-checkpoint 1"
"""First word of a checkpoint file in the daemon's state dir: ``MAGIC TAG SIZE\\n`` then SIZE bytes."""


class CheckpointFileError(ValueError):
    """A checkpoint file in the state dir that is not one (the message names the file)."""


def checkpoint_path(directory: Path, job: str) -> Path:
    """Where the daemon keeps ``job``'s last checkpoint: ``DIR/<job>.ckpt``."""
    return directory / f"{check_id('job', job)}.ckpt"


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (0600) atomically and durably: a temporary file fsynced and renamed, the
    directory fsynced, so a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover temporary file keeps its old mode otherwise
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def encode_checkpoint_file(tag: int, data: bytes) -> bytes:
    return CKPT_FILE_MAGIC + f" {tag} {len(data)}\n".encode() + data


def decode_checkpoint_file(raw: bytes, path: Path) -> tuple[int, bytes]:
    """``(tag, checkpoint bytes)`` of a checkpoint file; :class:`CheckpointFileError` names ``path``."""
    head, sep, data = raw.partition(b"\n")
    words = head.split(b" ")
    try:
        if not sep or len(words) != 4 or b" ".join(words[:2]) != CKPT_FILE_MAGIC:
            raise ValueError("no malletrain checkpoint header")
        tag, size = int(words[2]), int(words[3])
        if tag < 0 or size != len(data):
            raise ValueError(f"header says generation {tag}, {size} bytes; the file holds {len(data)}")
    except ValueError as exc:
        raise CheckpointFileError(f"{path}: not a checkpoint file of malletrain: {exc}") from None
    return tag, data


class WorldKeys(Protocol):
    """What a launcher built on this runtime (by composition: the ``torchrun`` launcher's
    :class:`~malletrain.runtimes.torchrun.TorchrunRuntime`) writes for each generation."""

    def before_publish(self, store: RendezvousStore, job_id: str, gen: int, members: tuple[str, ...],
                       forgotten: int) -> None:
        """Keys of generation ``gen`` written before its member list (under the runtime's lock);
        ``forgotten``: the generations whose keys :meth:`TorchRuntime.forget` already deleted."""

    def world_keys(self, job_id: str, gen: int) -> list[str]:
        """Its own keys of generation ``gen``, which :meth:`TorchRuntime.forget` deletes with the rest."""


class TorchRuntime(Runtime):
    """In-process elastic DDP: the daemon-side half.

    ``host``: the store's address as the nodes see it (``bind``: where it listens, default ``host``);
    ``port`` 0 or busy: a free one. ``monitor``: ``MALLETRAIN_MONITOR`` for workers. ``store_grace_s``:
    how long workers train on without the store. ``checkpoint_dir``: where :meth:`persist_checkpoints`
    keeps each job's checkpoint (``<job>.ckpt``, 0600) for :meth:`resume_generation` after a restart
    (without it, only in the store). A connection proves its job's secret (``secret_for``, set by
    :meth:`use_secrets`) and sees that job's keys only, within ``limits``. ``worlds``: keys a launcher
    adds to each generation (:class:`WorldKeys`)."""

    name = "torch"
    warm_modules = ("torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "malletrain.worker.elastic.state",
                    "malletrain.worker.elastic.loop")
    """What a node agent's warm worker imports before its assignment (``scavenger.warm``): torch, what
    a worker of this runtime imports (``malletrain.worker.elastic`` loads its modules on first use: named
    here, so the worker finds them loaded), and ``torch._dynamo``, which torch imports when a script
    makes its first optimizer (about 800 modules, sympy among them: most of a worker's start after torch)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, monitor: str | None = None,
                 collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S, store_grace_s: float = DEFAULT_STORE_GRACE_S,
                 bind: str | None = None, checkpoint_dir: str | Path | None = None, limits: StoreLimits | None = None,
                 worlds: WorldKeys | None = None) -> None:
        if collective_timeout_s <= 0:
            raise ValueError(f"collective_timeout_s must be > 0, got {collective_timeout_s}")
        if store_grace_s <= 0:
            raise ValueError(f"store_grace_s must be > 0, got {store_grace_s}")
        self.store_grace_s = store_grace_s
        self.host = host
        self.bind = bind or host
        self._port = port
        self.monitor = monitor
        self.collective_timeout_s = collective_timeout_s
        self._store: RendezvousStore | None = None
        self.limits = limits or StoreLimits()
        own_key = secrets.token_bytes(32)
        self.secret_for: Callable[[str], str] = lambda job: job_secret(own_key, job)
        self._generations: dict[str, int] = {}  # kept across forget(): numbering never restarts
        self._forgotten: dict[str, int] = {}  # job -> generations whose keys forget() deleted
        self._last_nonempty: dict[str, tuple[int, frozenset[str]]] = {}  # kept across forget()
        self._members: dict[str, dict[int, tuple[str, ...]]] = {}
        self._workers: dict[str, set[str]] = {}
        self._own: dict[str, set[str]] = {}  # job -> every worker started or re-adopted for it (until it ends)
        self._lock = threading.Lock()
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self._persisted: dict[str, int] = {}  # job -> ckpt_seq of the checkpoint on disk
        self._scratch: set[str] = set()  # jobs whose last published world starts from step 0
        self.worlds = worlds

    # -- lifecycle -----------------------------------------------------------------
    def use_secrets(self, secret_for: Callable[[str], str]) -> None:
        """The store checks each job's requests with the daemon's secret of that job."""
        self.secret_for = secret_for

    def start(self) -> None:
        """Serve the rendezvous store; idempotent."""
        with self._lock:
            if self._store is not None:
                return
            if self.checkpoint_dir is not None:
                self.checkpoint_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(self.checkpoint_dir, 0o700)
            try:
                fd = listen_socket(self.bind, self._port)
            except OSError as exc:
                if not self._port:
                    raise
                log.warning("rendezvous port %d is not free (%s); picking another: running workers "
                            "cannot reconnect", self._port, exc)
                fd = listen_socket(self.bind, 0)
            store = RendezvousStore(self, self.limits)
            store.serve(fd)
            self._store = store
            self._port = store.port
            log.info("rendezvous store listening on %s (workers reach it at %s)",
                     format_address((self.bind, self._port)), format_address((self.host, self._port)))

    def close(self) -> None:
        """Stop serving the store (workers still connected lose it); idempotent."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    # -- what the store asks -----------------------------------------------------------
    def secret_of(self, job: str) -> str | None:
        """The secret of a job this runtime runs (launched, published or resumed); None for any other."""
        with self._lock:
            known = job in self._workers or job in self._generations
        return self.secret_for(job) if known else None

    def may_checkpoint(self, job: str, worker: str) -> bool:
        """Whether ``worker`` is one of ``job``'s own: started or re-adopted for it, or in one of its lists."""
        with self._lock:
            return worker in self._own.get(job, ())

    def store_usage(self, job: str) -> tuple[int, int]:
        """``(keys, bytes)`` ``job`` holds in the store."""
        return self.require_store().usage(job)

    @property
    def rejected(self) -> dict[str, int]:
        """What the store refused, counted by reason."""
        return dict(self._store.rejected) if self._store is not None else {}

    @property
    def serving(self) -> bool:
        """Whether the store is served (started and not closed)."""
        return self._store is not None

    @property
    def port(self) -> int:
        """The store's port (the real one once started)."""
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` of the store, as given to workers in ``MALLETRAIN_STORE``."""
        self.require_store()
        return format_address((self.host, self._port))

    def require_store(self) -> RendezvousStore:
        if self._store is None:
            raise RuntimeStateError("TorchRuntime is not started: call start() first")
        return self._store

    # -- Runtime protocol ------------------------------------------------------------
    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str,
                    slots: int = 1) -> LaunchSpec:
        """The argv/env of worker ``worker_id`` of ``job_id`` on ``node``: ``slots`` processes of ``command``
        (each finds its place from ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``: :mod:`malletrain.worker.elastic.state`)."""
        check_id("job", job_id)
        check_id("worker", worker_id)
        argv = tuple(command)
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ValueError(f"job {job_id}: command must be a non-empty list of non-empty strings, got {command!r}")
        self.require_store()
        env = WorkerEnv(job=job_id, worker=worker_id, monitor=self.monitor or None, runtime=self.name,
                        store=(self.host, self._port), collective_timeout_s=self.collective_timeout_s,
                        store_grace_s=self.store_grace_s, job_secret=self.secret_for(job_id)).to_environ()
        with self._lock:
            self._workers.setdefault(job_id, set()).add(worker_id)
            self._own.setdefault(job_id, set()).add(worker_id)
        return LaunchSpec(argv=argv, env=env, slots=slots)

    def set_members(self, job_id: str, members: Sequence[str]) -> int:
        """Publish ``members`` (rank order) as the next generation and return its number (empty: all leave)."""
        check_id("job", job_id)
        ordered = tuple(members)
        for m in ordered:
            check_id(f"job {job_id}: worker", m)
        dupes = sorted({m for m in ordered if ordered.count(m) > 1})
        if dupes:
            raise ValueError(f"job {job_id}: duplicate workers in member list: {dupes}")
        with self._lock:
            store = self.require_store()
            gen = max(self._generations.get(job_id, 0), self._reported(store, job_id, ordered)) + 1
            last = self._last_nonempty.get(job_id)
            self._scratch.discard(job_id)
            if ordered and last is not None and not last[1] & set(ordered):
                # nobody of the last world stays: the new one starts from its checkpoint
                store.set(handover_key(job_id, gen), str(last[0]))
                if not store.check([ckpt_tag_key(job_id)]):  # ... or, with none, from step 0
                    self._scratch.add(job_id)
            if ordered:
                self._last_nonempty[job_id] = (gen, frozenset(ordered))
            if self.worlds is not None:
                self.worlds.before_publish(store, job_id, gen, ordered, self._forgotten.get(job_id, 0))
            store.set(members_key(job_id, gen), json.dumps(list(ordered)))
            store.set(gen_key(job_id), str(gen))  # after the members: readers see both
            self._generations[job_id] = gen
            self._members.setdefault(job_id, {})[gen] = ordered
            self._workers.setdefault(job_id, set()).update(ordered)
            self._own.setdefault(job_id, set()).update(ordered)
        return gen

    def generation_keys(self, job_id: str, gen: int) -> list[str]:
        """The keys of generation ``gen`` that :meth:`forget` deletes (those of :attr:`worlds` included)."""
        own = [members_key(job_id, gen), arrive_key(job_id, gen), joined_key(job_id, gen), handover_key(job_id, gen)]
        return own + (self.worlds.world_keys(job_id, gen) if self.worlds is not None else [])

    def readopt(self, job_id: str, command: Sequence[str], workers: dict[str, str]) -> int:
        """Workers an earlier daemon started (worker id -> node): remembered so :meth:`forget` clears
        their keys. Returns the job's generation."""
        check_id("job", job_id)
        with self._lock:
            self._workers.setdefault(job_id, set()).update(workers)
            self._own.setdefault(job_id, set()).update(workers)
            return self._generations.get(job_id, 0)

    def restarted_from_scratch(self, job_id: str) -> bool:
        """Whether the job's last published world has none of the last one's workers and no checkpoint."""
        with self._lock:
            return job_id in self._scratch

    def resume_generation(self, job_id: str, generation: int) -> None:
        """After a daemon restart: numbering goes on above ``generation``, and the job's durable checkpoint (if
        any) is put back into the new store, for a next world none of whose workers survived."""
        check_id("job", job_id)
        if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
            raise ValueError(f"job {job_id}: generation must be an integer >= 0, got {generation!r}")
        with self._lock:
            if generation > self._generations.get(job_id, 0):
                self._generations[job_id] = generation
                self._forgotten[job_id] = max(self._forgotten.get(job_id, 0), generation)
            self._restore_checkpoint(job_id)

    def _restore_checkpoint(self, job_id: str) -> None:
        """Copy ``job_id``'s checkpoint file into the store (caller holds the lock); a bad file is logged."""
        if self.checkpoint_dir is None or self._store is None or job_id in self._persisted:
            return
        path = checkpoint_path(self.checkpoint_dir, job_id)
        try:
            tag, data = decode_checkpoint_file(path.read_bytes(), path)
        except FileNotFoundError:
            return
        except (OSError, CheckpointFileError) as exc:
            log.error("job %s: its checkpoint cannot be restored, it starts from scratch: %s", job_id, exc)
            return
        self._put_checkpoint(self._store, job_id, tag, data)
        self._persisted[job_id] = 2
        self._store.set(ckpt_seq_key(job_id), "2")  # what is on disk: a worker's next write makes it 4
        # the next world starts from it unless a survivor holds a newer state (see State._sync_state)
        self._last_nonempty.setdefault(job_id, (tag, frozenset()))
        log.info("job %s: restored its checkpoint (generation %d, %d bytes) from %s", job_id, tag, len(data), path)

    @staticmethod
    def _put_checkpoint(store: RendezvousStore, job_id: str, tag: int, data: bytes) -> None:
        chunks = range(0, len(data), CKPT_CHUNK_BYTES)
        for i, start in enumerate(chunks):
            store.set(ckpt_chunk_key(job_id, i), data[start:start + CKPT_CHUNK_BYTES])
        store.set(ckpt_key(job_id), ckpt_header(len(chunks), len(data)))
        store.set(ckpt_tag_key(job_id), str(tag))

    def persist_checkpoints(self, jobs: Iterable[str]) -> list[str]:
        """Copy each of ``jobs``' checkpoints new since the last call to the state dir (the store is in memory:
        called every loop, so a checkpoint outlives a ``kill -9``); one being written is taken next time.
        Returns the jobs written; a failure (a full disk) is logged and tried again."""
        if self.checkpoint_dir is None:
            return []
        done = []
        for job in jobs:
            try:
                with self._lock:
                    found = self._read_new_checkpoint(job)
                if found is None:
                    continue
                seq, tag, data = found
                write_private_file(checkpoint_path(self.checkpoint_dir, job), encode_checkpoint_file(tag, data))
                self._persisted[job] = seq
                done.append(job)
            except (OSError, ValueError, RuntimeError) as exc:
                log.warning("job %s: its checkpoint is not on disk yet: %s", job, exc)
        return done

    def _read_new_checkpoint(self, job: str) -> tuple[int, int, bytes] | None:
        store = self._store
        seq_key = ckpt_seq_key(job)
        if store is None or not store.check([seq_key]):
            return None
        seq = int(store.get(seq_key))
        if seq % 2 or seq <= self._persisted.get(job, 0) or not store.check([ckpt_key(job), ckpt_tag_key(job)]):
            return None
        n_chunks, size = parse_ckpt_header(store.get(ckpt_key(job)), job)
        tag = int(store.get(ckpt_tag_key(job)))
        keys = [ckpt_chunk_key(job, i) for i in range(n_chunks)]
        if keys and not store.check(keys):
            return None
        data = b"".join(store.get(k) for k in keys)
        if int(store.get(seq_key)) != seq or len(data) != size:
            return None  # rewritten while read: the next call takes the new one
        return seq, tag, data

    @staticmethod
    def _reported(store: Any, job_id: str, workers: Sequence[str]) -> int:
        """The newest generation any of ``workers`` reported when it reconnected (0: none)."""
        newest = 0
        for w in workers:
            key = resume_key(job_id, w)
            if store.check([key]):
                raw = store.get(key)
                value = int(raw) if raw.isdigit() and len(raw) <= len(str(MAX_RESUMED_GENERATION)) else -1
                if 0 <= value <= MAX_RESUMED_GENERATION:
                    newest = max(newest, value)
                else:
                    log.warning("job %s: store key %s is not a generation number in [0, %d]; ignored",
                                job_id, key, MAX_RESUMED_GENERATION)
        return newest

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        """Delete the job's member lists, barriers and ready marks; idempotent. The generation key stays, so a
        job that comes back never reuses a generation; its checkpoint stays unless ``keep_state`` is False."""
        with self._lock:
            if not keep_state:
                self._last_nonempty.pop(job_id, None)
                self._own.pop(job_id, None)
                if self._store is not None:
                    head = ckpt_key(job_id)
                    if self._store.check([head]):
                        try:
                            n_chunks, _ = parse_ckpt_header(self._store.get(head), job_id)
                        except ValueError as exc:  # a header the job wrote wrong: its other keys still go
                            log.warning("%s", exc)
                            n_chunks = 0
                        for i in range(n_chunks):
                            self._store.delete_key(ckpt_chunk_key(job_id, i))
                    for key in (head, ckpt_tag_key(job_id), ckpt_seq_key(job_id), active_key(job_id)):
                        self._store.delete_key(key)
                self._persisted.pop(job_id, None)
                if self.checkpoint_dir is not None:
                    with contextlib.suppress(FileNotFoundError):
                        checkpoint_path(self.checkpoint_dir, job_id).unlink()
            gens = self._generations.get(job_id, 0)
            first = self._forgotten.get(job_id, 0) + 1
            self._forgotten[job_id] = gens
            self._members.pop(job_id, None)
            workers = self._workers.pop(job_id, set())
            store = self._store
            if store is None:
                return
            keys = []
            for g in range(first, gens + 1):
                keys += self.generation_keys(job_id, g)
            keys += [ready_key(job_id, w) for w in workers] + [resume_key(job_id, w) for w in workers]
            for key in keys:
                store.delete_key(key)

    # -- inspection --------------------------------------------------------------------
    def generation(self, job_id: str) -> int:
        """The job's current generation (0 before the first :meth:`set_members`)."""
        with self._lock:
            return self._generations.get(job_id, 0)

    def members(self, job_id: str, generation: int | None = None) -> tuple[str, ...]:
        """The member list of ``generation`` (default: the current one; () if none or forgotten)."""
        with self._lock:
            gens = self._members.get(job_id, {})
            g = self._generations.get(job_id, 0) if generation is None else generation
            if g == 0 or (generation is None and g not in gens):
                return ()
            if g not in gens:
                raise KeyError(f"job {job_id} has no generation {g} (or it was forgotten)")
            return gens[g]

    def checkpoint_generation(self, job_id: str) -> int | None:
        """The generation the job's stored checkpoint was taken in (None: no checkpoint)."""
        store = self.require_store()
        key = ckpt_tag_key(job_id)
        return int(store.get(key)) if store.check([key]) else None

    def ready(self, job_id: str, worker_id: str) -> bool:
        """Whether worker ``worker_id`` has connected and waits to join (or has joined)."""
        return bool(self.require_store().check([ready_key(job_id, worker_id)]))
