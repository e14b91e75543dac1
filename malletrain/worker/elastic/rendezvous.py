"""A worker's access to its job's keys in the daemon's store (the rendezvous).

:class:`Rendezvous`: generations, member lists, ready marks, the join barrier, handover checkpoints;
it rides out a daemon restart (a background thread reconnects, for up to the grace period).
:func:`form_step`: the one step both launchers take to form a world (barrier, master address).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, TypeVar

from malletrain.worker.elastic.errors import StoreLost, StoreUnavailable, first_line, is_store_loss
from contract.storekeys import (CKPT_CHUNK_BYTES, active_key, arrive_key, ckpt_chunk_key, ckpt_header, ckpt_key,
                                ckpt_seq_key, ckpt_tag_key, gen_key, handover_key, joined_key, members_key,
                                parse_ckpt_header, parse_members, pg_key, ready_key, resume_key)
if TYPE_CHECKING:  # the snapshot module imports torch: the torchrun rank agent, which forms worlds here, does not
    from malletrain.worker.elastic.snapshot import Snapshot
from contract.wire import StoreClient, StoreConnectionLost, StoreRefused, listen_socket
from contract.workerenv import DEFAULT_STORE_GRACE_S, ENV_JOB_SECRET, ENV_STORE_GRACE, WorkerEnv, check_id, format_address

log = logging.getLogger("malletrain.worker.elastic")

T = TypeVar("T")

POLL_S = 0.005
"""Interval of store polls while waiting at a barrier (which may also end by a newer generation)."""

HANDOVER_WAIT_S = 20.0
"""How long new workers wait for the checkpoint of a world they replace (none comes if it was SIGKILLed)."""

RECONNECT_EVERY_S = 0.5
"""While the store is away, its address is probed at most this often."""

PUBLISH_POLL_S = 0.05
"""A worker waiting for a generation (joining, after a recall) polls the generation key this often."""

CONNECT_TIMEOUT_S = 30.0
"""How long a worker's first connection to the store may take (it retries while the daemon starts)."""

CALL_TIMEOUT_S = 10.0
"""No store call waits longer than this for its answer (then the store counts as lost)."""

PROBE_TIMEOUT_S = 2.0
"""A reconnection attempt (connect and handshake) gives up after this long."""


def connect_retrying(address: tuple[str, int], job: str, worker: str, secret: str,
                     wait_s: float = CONNECT_TIMEOUT_S) -> StoreClient:
    """An authenticated client of ``job``'s keys in the daemon's store at ``address``, retried every :data:`RECONNECT_EVERY_S` for up to ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return StoreClient(address, job, worker, secret, CALL_TIMEOUT_S)
        except StoreConnectionLost:
            if time.monotonic() > deadline:
                raise
            time.sleep(RECONNECT_EVERY_S)


def _address_text(address: tuple[str, int] | None) -> str:
    return "(no address)" if address is None else format_address(address)


class Rendezvous:
    """A worker's view of its job's keys in the daemon's store. With ``address`` a lost store is waited
    for (reconnected, this worker marked ready again) for up to ``grace_s``, then :class:`StoreLost`;
    without one a lost store raises the store's own error."""

    def __init__(self, store: Any, job: str, worker: str, poll_s: float = POLL_S,
                 address: tuple[str, int] | None = None, grace_s: float = DEFAULT_STORE_GRACE_S) -> None:
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
        self.probes = 0  # reconnection attempts made (in the background)
        self.world: tuple[str, ...] = ()  # this worker's current world (rank 0 re-registers it)
        self.current = 0  # this worker's current generation (reported after a reconnection)
        self.rank = 0
        self._marked_ready = False
        self.ready_value = "1"  # what its ready key holds (a torchrun rank agent: its local ranks)
        self._nowait = False
        self._next_probe = 0.0
        self.secret: str | None = None  # to reconnect (set by from_worker_env)
        self._swap = threading.Lock()  # guards the swap of the store client and lost_since
        self._prober: threading.Thread | None = None

    @property
    def store(self) -> Any:
        """The current store client (a new one after each reconnection)."""
        return self._store

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Rendezvous | None:
        """Connect as described by ``MALLETRAIN_STORE/JOB/WORKER/JOB_SECRET``; None if no store is set."""
        return cls.from_worker_env(WorkerEnv.from_environ(env))

    @classmethod
    def from_worker_env(cls, wenv: WorkerEnv) -> Rendezvous | None:
        """Connect to the store named in a parsed worker environment; None if it names none."""
        if wenv.store is None:
            return None
        if not wenv.job_secret:
            raise ValueError(f"{ENV_JOB_SECRET} is not set: the daemon's store serves a job's workers only "
                             "(started by malletrain, which sets it)")
        job, worker = wenv.require_job(), wenv.require_worker()
        store = connect_retrying(wenv.store, job, worker, wenv.job_secret)
        log.info("worker %s: connected to the daemon's store at %s (job %s)", wenv.worker, wenv.store_text, wenv.job)
        rdzv = cls(store, job, worker, address=wenv.store, grace_s=wenv.store_grace_s)
        rdzv.secret = wenv.job_secret
        return rdzv

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
            store = self._store
            try:
                return getattr(store, op)(*args)
            except Exception as exc:
                if self.address is None or not is_store_loss(exc):
                    raise
                self._mark_lost(exc, store)

    def _mark_lost(self, exc: BaseException, store: Any = None) -> None:
        with self._swap:
            if store is not None and store is not self._store:
                return  # an old connection failed: a new one is already in place
            if self.lost_since is None:
                self.lost_since = time.monotonic()
                self._next_probe = 0.0
                log.warning("worker %s: the daemon's store is gone (%s); training goes on for up to %.0f s "
                            "while it comes back", self.worker, first_line(exc, 120), self.grace_s)

    def lost_for(self) -> float:
        """Seconds since the store was found gone (0 while it is there)."""
        lost = self.lost_since
        return 0.0 if lost is None else time.monotonic() - lost

    def try_reconnect(self) -> bool:
        """True if connected; never blocks: while the store is away a background thread probes its
        address (at most every :data:`RECONNECT_EVERY_S`) and reconnects once it is back."""
        if self.lost_since is None:
            return True
        if self.address is None or self.secret is None:
            return False
        with self._swap:
            now = time.monotonic()
            if self._prober is not None or now < self._next_probe:
                return False
            self._next_probe = now + RECONNECT_EVERY_S
            self._prober = threading.Thread(target=self._probe, name="store-reconnect", daemon=True)
            self._prober.start()
        return False

    def _probe(self) -> None:
        """One reconnection attempt (the prober thread): connect, prove the key, re-register."""
        assert self.address is not None and self.secret is not None
        self.probes += 1
        try:
            try:
                store = StoreClient(self.address, self.job, self.worker, self.secret, PROBE_TIMEOUT_S)
            except StoreConnectionLost:
                return
            except StoreRefused as exc:  # a new daemon that does not know the job yet (still adopting)
                log.info("worker %s: the store at %s does not take job %s yet: %s", self.worker,
                         _address_text(self.address), self.job, first_line(exc))
                return
            try:
                self._register(store)
            except Exception as exc:
                store.close()
                if not is_store_loss(exc):
                    log.warning("worker %s: re-registering with the new store failed: %s", self.worker,
                                first_line(exc))
                return
            store.timeout_s = CALL_TIMEOUT_S
            with self._swap:
                away = time.monotonic() - (self.lost_since or time.monotonic())
                old, self._store = self._store, store
                self.lost_since = None
                self.reconnects += 1
            close = getattr(old, "close", None)
            if close is not None:
                close()
            log.warning("worker %s: reconnected to the daemon's store after %.1f s", self.worker, away)
        finally:
            with self._swap:
                self._prober = None

    def _register(self, store: Any) -> None:
        """Tell a new store about this worker (and rank 0 about its whole world): ready, and at which generation."""
        if self._marked_ready:
            store.set(ready_key(self.job, self.worker), self.ready_value)
        if self.current:
            store.set(resume_key(self.job, self.worker), str(self.current))
        if self.rank == 0:
            for member in self.world:
                store.set(ready_key(self.job, member), "1")
                if self.current:
                    store.set(resume_key(self.job, member), str(self.current))

    def _lost_error(self) -> StoreLost:
        return StoreLost(f"worker {self.worker} of job {self.job}: the daemon's store "
                         f"{_address_text(self.address)} stayed away for {self.lost_for():.0f} s "
                         f"(grace {self.grace_s:g} s, {ENV_STORE_GRACE})")

    def await_store(self) -> None:
        """Block until the store is back; :class:`StoreLost` once the grace period is over."""
        while not self.try_reconnect():
            if self.address is None or self.secret is None or self.lost_for() > self.grace_s:
                raise self._lost_error()
            time.sleep(0.02)

    def next_generation(self, current: int) -> int:
        """Rank 0 at a commit: the generation to run next (``current`` if nothing newer is ready or the store
        is away); never blocks on a lost store; :class:`StoreLost` once it was away past the grace period."""
        self._nowait = True
        try:
            gen = self.generation()
            if gen > current and self.all_ready(self.members(gen) or ()):
                return gen
            return current
        except StoreUnavailable:
            if self.lost_for() > self.grace_s:
                raise self._lost_error() from None
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
        raw = self._call("get_or_none", key)
        if raw is None:
            return 0
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"job {self.job}: store key {key} holds {raw!r}, not a generation number") from None

    def members(self, gen: int) -> tuple[str, ...] | None:
        """Generation ``gen``'s members in rank order; None if not (or no longer) in the store."""
        if gen < 1:
            return None
        raw = self._call("get_or_none", members_key(self.job, gen))
        if not raw:  # not (or no longer) there
            return None
        return parse_members(raw, self.job, gen)

    def published(self, gen: int) -> bool:
        """Whether generation ``gen`` exists (its member list is written before the generation key)."""
        return bool(self._call("check", [members_key(self.job, gen)]))

    def add(self, key: str, delta: int) -> int:
        """Add ``delta`` to this job's counter ``key`` (0: read it); its new value. A lost store is waited for."""
        return int(self._call("add", key, delta))

    def read(self, key: str) -> bytes | None:
        """This job's key ``key`` (None: not set). A lost store is waited for."""
        return self._call("get_or_none", key)

    def mark_ready(self) -> None:
        self._call("set", ready_key(self.job, self.worker), self.ready_value)
        self._marked_ready = True

    def clear_ready(self) -> None:
        self._marked_ready = False
        self._call("delete_key", ready_key(self.job, self.worker))

    def all_ready(self, members: tuple[str, ...]) -> bool:
        return not members or bool(self._call("check", [ready_key(self.job, m) for m in members]))

    def wait_published(self, gen: int) -> int:
        """Block until generation ``gen`` or a later one is published; return the newest. The generation key
        is polled, not ``gen``'s member list: numbering skips (a restarted daemon numbers on)."""
        while True:
            newest = self.generation()
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

    def save_checkpoint(self, snap: Snapshot, gen: int, aside: bool = False) -> None:
        """Store ``snap`` (taken in generation ``gen``) for a later world, bracketed by the ``ckpt_seq`` seqlock
        (odd while writing) so the daemon never copies a half-written one. ``aside``: on a connection of its
        own, never waiting (:class:`StoreUnavailable`): a signal handler may interrupt a call on the shared one."""
        if not aside:
            self._write_checkpoint(self._call, snap, gen)
            return
        if self.address is None or self.secret is None or self.lost_since is not None:
            raise StoreUnavailable(f"job {self.job}: the daemon's store is away")
        try:
            store = StoreClient(self.address, self.job, self.worker, self.secret, PROBE_TIMEOUT_S)
        except StoreConnectionLost as exc:
            raise StoreUnavailable(f"job {self.job}: {exc}") from None
        try:
            self._write_checkpoint(lambda op, *args: getattr(store, op)(*args), snap, gen)
        finally:
            store.close()

    def _write_checkpoint(self, call: Callable[..., Any], snap: Snapshot, gen: int) -> None:
        from malletrain.worker.elastic.snapshot import encode_checkpoint

        data = memoryview(encode_checkpoint(snap))
        chunks = range(0, len(data), CKPT_CHUNK_BYTES)
        if call("add", ckpt_seq_key(self.job), 1) % 2 == 0:
            call("add", ckpt_seq_key(self.job), 1)  # a writer died mid-write: odd again
        for i, start in enumerate(chunks):
            call("set", ckpt_chunk_key(self.job, i), bytes(data[start:start + CKPT_CHUNK_BYTES]))
        call("set", ckpt_key(self.job), ckpt_header(len(chunks), len(data)))
        call("set", ckpt_tag_key(self.job), str(gen))
        call("add", ckpt_seq_key(self.job), 1)
        log.info("worker %s: stored the checkpoint of step %s (generation %d, %d bytes) for the next world",
                 self.worker, snap.counters.get("step"), gen, len(data))

    def checkpoint_tag(self) -> int:
        raw = self._call("get_or_none", ckpt_tag_key(self.job))
        return 0 if raw is None else int(raw)

    def local_host(self) -> str:
        """The address this worker reaches the daemon from (where its peers can reach it too)."""
        host = getattr(self._store, "local_host", None)
        return str(host) if host else "127.0.0.1"

    def publish_group(self, gen: int, host: str, port: int, token: str) -> None:
        """Rank 0: where generation ``gen``'s gloo rendezvous is served, and the key prefix it uses."""
        self._call("set", pg_key(self.job, gen), f"{host} {port} {token}")

    def wait_group(self, gen: int, wait_s: float) -> tuple[str, int, str] | None:
        """Where rank 0 serves generation ``gen``'s gloo rendezvous; None if it did not say within
        ``wait_s`` or a newer generation came first."""
        deadline = time.monotonic() + wait_s
        while True:
            raw = self._call("get_or_none", pg_key(self.job, gen))
            if raw:
                try:
                    host, port, token = raw.decode().split(" ")
                    return host, int(port), token
                except ValueError:
                    raise ValueError(f"job {self.job}: store key {pg_key(self.job, gen)} holds {raw[:80]!r}, "
                                     "not 'HOST PORT TOKEN'") from None
            if time.monotonic() > deadline or self.published(gen + 1):
                return None
            time.sleep(self.poll_s)

    def mark_active(self, gen: int) -> None:
        """Generation ``gen``'s world has formed (rank 0 says so)."""
        self._call("set", active_key(self.job), str(gen))

    def wait_handover(self, gen: int, wait_s: float = HANDOVER_WAIT_S) -> None:
        """If ``gen`` replaces a whole world, wait (bounded) for that world's checkpoint."""
        if not self._call("check", [handover_key(self.job, gen)]):
            return
        raw = self._call("get_or_none", active_key(self.job))
        source = 0 if raw is None else int(raw)
        deadline = time.monotonic() + wait_s
        while self.checkpoint_tag() < source:
            if time.monotonic() > deadline:
                log.warning("job %s: no checkpoint from generation %d after %.0f s; using what is stored",
                            self.job, source, wait_s)
                return
            time.sleep(self.poll_s * 4)

    def load_checkpoint(self) -> Snapshot | None:
        """The job's stored checkpoint (None if there is none), loaded without unpickling objects."""
        head = self._call("get_or_none", ckpt_key(self.job))
        if head is None:
            return None
        n_chunks, size = parse_ckpt_header(head, self.job)
        data = b"".join(self._call("get", ckpt_chunk_key(self.job, i)) for i in range(n_chunks))
        if len(data) != size:
            raise ValueError(f"job {self.job}: checkpoint holds {len(data)} bytes, its header says {size}")
        from malletrain.worker.elastic.snapshot import decode_checkpoint

        return decode_checkpoint(data, self.job)

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


# -- forming a world: the one step both launchers take ---------------------------------------------
@dataclass
class WorldMaster:
    """Where a world's ranks meet (``MASTER_ADDR``/``MASTER_PORT``) and its rendezvous' key prefix; ``fd``: the
    port's socket, held by whoever named it until taken or released; None for everyone else."""

    host: str
    port: int
    token: str
    fd: int | None = None

    def take(self) -> int:
        """The held socket's fd, now the caller's (the in-process rank 0 hands it to its ``TCPStore``)."""
        if self.fd is None:
            raise RuntimeError(f"the master port {self.port} is not held here")
        fd, self.fd = self.fd, None
        return fd

    def release(self) -> None:
        """Let the held port go (a ``torchrun`` script's rank 0 binds it itself); idempotent."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class WorldStore(Protocol):
    """What :func:`form_step` reads and writes of a job's keys (a :class:`Rendezvous`)."""

    job: str

    def add(self, key: str, delta: int) -> int: ...
    def local_host(self) -> str: ...
    def publish_group(self, gen: int, host: str, port: int, token: str) -> None: ...
    def wait_group(self, gen: int, wait_s: float) -> tuple[str, int, str] | None: ...


def arrive(rdzv: WorldStore, gen: int, ranks: int) -> int:
    """Add ``ranks`` to generation ``gen``'s barrier; how many have arrived."""
    return rdzv.add(arrive_key(rdzv.job, gen), ranks)


def hold_port(host: str) -> int:
    """A TCP port on ``host`` bound and held, not listening (its fd, the caller's): nothing else can bind it,
    and a peer that connects early is refused and retries instead of queueing on a socket that will close."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock.detach()


def form_step(rdzv: WorldStore, gen: int, size: int, first: bool, listen: bool = True) -> WorldMaster | None:
    """One look at the forming of generation ``gen`` of ``size`` ranks (never blocks): its master once named,
    else None. Rank 0's holder (``first``) names it once all have arrived: a port on its host, held (``fd``),
    and a random key prefix, published under ``pg``. ``listen``: the held socket listens (for an in-process
    ``TCPStore``); else it is only bound (a ``torchrun`` script's rank 0 binds the port itself)."""
    found = rdzv.wait_group(gen, 0.0)
    if found is not None:
        return WorldMaster(*found)
    if not first or arrive(rdzv, gen, 0) < size:
        return None
    host = rdzv.local_host()
    fd = listen_socket(host, 0) if listen else hold_port(host)
    with socket.socket(fileno=socket.dup(fd)) as sock:
        port = int(sock.getsockname()[1])
    master = WorldMaster(host, port, secrets.token_hex(16), fd)
    try:
        rdzv.publish_group(gen, host, port, master.token)
    except BaseException:
        master.release()
        raise
    return master


def form_world(rdzv: Rendezvous, gen: int, size: int, first: bool, wait_s: float) -> WorldMaster | None:
    """:func:`form_step` until the master is named; None after ``wait_s`` or once a newer generation is out."""
    deadline = time.monotonic() + wait_s
    while True:
        master = form_step(rdzv, gen, size, first)
        if master is not None:
            return master
        if time.monotonic() > deadline or rdzv.published(gen + 1):
            return None
        time.sleep(rdzv.poll_s)
