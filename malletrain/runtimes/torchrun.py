"""The ``torchrun`` launcher, daemon side: a script written for ``torchrun --nnodes=MIN:MAX``, run as it is.

Every change of the job's world restarts every rank (SIGTERM, grace, SIGKILL) at the new size, with
``TORCHELASTIC_RESTART_COUNT`` one higher; each worker is a rank agent (:mod:`malletrain.worker.torchrun_agent`)
running K ranks on its node. :class:`TorchrunRuntime` hosts the store through a ``torch`` runtime it holds (by
composition) and, with each member list, writes the world's rank places (``mt/<job>/world/<g>``), numbered
node by node as ``torchrun`` numbers them. The checkpoint is the script's own: the daemon keeps none.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from authframe import MAX_FRAME
from contract.storekeys import done_key, failed_key, pg_key, ready_key, world_key
from contract.workerenv import DEFAULT_STORE_GRACE_S, ENV_RUNTIME, RankPlace, WorkerEnvError
from contract.world import DEFAULT_FAILURE_WAIT_S, DEFAULT_STOP_GRACE_S, TORCHRUN_MAX_RANKS, WORKERS_PER_NODE_MAX, \
    World, rank_names, rank_places
from malletrain.runtimes import LaunchSpec, Runtime
from malletrain.runtimes.store_server import RendezvousStore
from malletrain.runtimes.torch_elastic import TorchRuntime

log = logging.getLogger("malletrain.torchrun")

LAUNCH_MODULE = "malletrain.worker.launch"
"""The worker-side launcher a Python command runs through (it installs the progress hook, then runs the script)."""
AGENT_MODULE = "malletrain.worker.torchrun_agent"
"""The rank agent the daemon starts as each worker of a ``torchrun`` job."""

WORLD_MAX_BYTES = MAX_FRAME - 64 * 1024
"""A world's places as one store value, at most (one frame of the store, less room for its key and framing)."""

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def launch_module_present() -> bool:
    """Whether :data:`LAUNCH_MODULE` is installed (Python commands run through it once it is)."""
    try:
        return importlib.util.find_spec(LAUNCH_MODULE) is not None
    except (ImportError, ValueError):
        return False


def wrap_python_command(command: Sequence[str], launcher_present: bool | None = None) -> tuple[str, ...]:
    """``command`` as a rank runs it: ``PY SCRIPT|-m MODULE ARGS`` through ``PY -m malletrain.worker.launch`` when that
    is installed (``launcher_present``, default: look); anything else (not Python, interpreter flags) as given."""
    argv = tuple(command)
    present = launch_module_present() if launcher_present is None else launcher_present
    if len(argv) < 2 or not present or not _PYTHON.fullmatch(os.path.basename(argv[0])):
        return argv
    rest = argv[1:]
    if rest[0] == "-m" and len(rest) >= 2 and not rest[1].startswith("-"):
        return (argv[0], "-m", LAUNCH_MODULE, *rest)
    if rest[0].startswith("-"):
        return argv
    return (argv[0], "-m", LAUNCH_MODULE, *rest)


class TorchrunRuntime(Runtime):
    """The daemon-side half of the ``torchrun`` launcher: its :attr:`torch` runtime serves the store and publishes
    the member lists; this one adds each world's places (:meth:`before_publish`) and launches rank agents
    (run by ``python``). The store starts on first use: a daemon that runs no such job opens no port for it."""

    name = "torchrun"
    warm_modules: tuple[str, ...] = ()

    def __init__(self, host: str = "127.0.0.1", monitor: str | None = None,
                 store_grace_s: float = DEFAULT_STORE_GRACE_S, python: str = sys.executable,
                 stop_grace_s: float = DEFAULT_STOP_GRACE_S, bind: str | None = None, port: int = 0,
                 on_start: Callable[[], None] | None = None,
                 failure_wait_s: float = DEFAULT_FAILURE_WAIT_S) -> None:
        if not stop_grace_s > 0 or not failure_wait_s >= 0:
            raise ValueError(f"stop_grace_s must be > 0 and failure_wait_s >= 0, got {stop_grace_s}, {failure_wait_s}")
        self.torch = TorchRuntime(host=host, port=port, monitor=monitor, store_grace_s=store_grace_s, bind=bind,
                                  worlds=self)
        self.on_start = on_start
        self.python = python
        self.stop_grace_s = stop_grace_s
        self.failure_wait_s = failure_wait_s
        self._lock = threading.Lock()  # taken inside the torch runtime's lock (before_publish), never around it
        self._nodes: dict[str, dict[str, str]] = {}  # job -> worker -> node
        self._local: dict[str, dict[str, int]] = {}  # job -> worker -> local ranks (its node's slots)
        self._restarts: dict[str, int] = {}  # job -> restart count of its last world
        self._pruned: dict[str, int] = {}  # job -> generations whose keys are deleted (all up to it)
        self._ranks: dict[str, dict[int, int]] = {}  # job -> its worlds whose keys are kept -> their ranks

    # -- what the daemon calls, mostly the torch runtime's --------------------------------------
    @property
    def port(self) -> int:
        """The store's port (kept across daemon restarts)."""
        return self.torch.port

    def start(self) -> None:
        self.torch.start()

    def close(self) -> None:
        self.torch.close()

    def use_secrets(self, secret_for: Callable[[str], str]) -> None:
        self.torch.use_secrets(secret_for)

    def restarted_from_scratch(self, job_id: str) -> bool:
        return self.torch.restarted_from_scratch(job_id)

    def ready(self, job_id: str, worker_id: str) -> bool:
        return self.torch.serving and self.torch.ready(job_id, worker_id)

    def _require_store(self) -> RendezvousStore:
        return self.torch.require_store()

    def start_if_needed(self) -> None:
        """Serve the store now if it is not served yet (then ``on_start``: the daemon records its port)."""
        if not self.torch.serving:
            self.torch.start()
            if self.on_start is not None:
                self.on_start()

    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str, slots: int = 1) -> LaunchSpec:
        """The rank agent, with the job's command (a Python one through :data:`LAUNCH_MODULE`) after ``--``; it
        starts the ``slots`` ranks itself (``starts_own_ranks``)."""
        self.start_if_needed()
        if slots < 1:
            raise ValueError(f"job {job_id}: worker {worker_id} on {node}: {slots} worker slots, need at least 1")
        spec = self.torch.launch_spec(job_id, wrap_python_command(command), worker_id, node)
        with self._lock:
            self._nodes.setdefault(job_id, {})[worker_id] = node
            self._local.setdefault(job_id, {})[worker_id] = slots
        argv = (self.python, "-m", AGENT_MODULE, "--stop-grace", repr(self.stop_grace_s),
                "--failure-wait", repr(self.failure_wait_s), "--", *spec.argv)
        return LaunchSpec(argv=argv, env={**spec.env, ENV_RUNTIME: self.name}, cwd=spec.cwd, slots=slots,
                          starts_own_ranks=True)

    def set_members(self, job_id: str, members: Sequence[str]) -> int:
        self.start_if_needed()
        return self.torch.set_members(job_id, members)

    def resume_generation(self, job_id: str, generation: int) -> None:
        """After a daemon restart: serve the store at once (on the last daemon's port), numbering on from
        ``generation``."""
        self.start_if_needed()
        self.torch.resume_generation(job_id, generation)

    def resume_worlds(self, job_id: str, worlds: int) -> None:
        """After a daemon restart: ``job_id`` has run ``worlds`` worlds, so its restart count goes on from there."""
        with self._lock:
            if worlds > 0:
                self._restarts[job_id] = max(self._restarts.get(job_id, -1), worlds - 1)

    def readopt(self, job_id: str, command: Sequence[str], workers: dict[str, str]) -> int:
        self.start_if_needed()
        with self._lock:
            self._nodes.setdefault(job_id, {}).update(workers)
        return self.torch.readopt(job_id, command, workers)

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        """As the ``torch`` runtime's; a job that ended (``keep_state=False``) also loses its restart count."""
        self.torch.forget(job_id, keep_state)
        with self._lock:
            self._nodes.pop(job_id, None)
            self._local.pop(job_id, None)
            self._pruned.pop(job_id, None)  # forget deleted them: its own count goes on from there
            self._ranks.pop(job_id, None)  # (their done counts with them)
            if not keep_state:
                self._restarts.pop(job_id, None)

    # -- the world keys (WorldKeys, called by the torch runtime) ------------------------------------
    def before_publish(self, store: RendezvousStore, job_id: str, gen: int, members: tuple[str, ...],
                       forgotten: int) -> None:
        """A non-empty world's places and restart count go into the store before its member list; the keys of worlds
        two generations back go (no agent reads them)."""
        with self._lock:
            first = self._pruned.get(job_id, forgotten) + 1
            for old in range(first, gen - 1):
                for key in self.torch.generation_keys(job_id, old):
                    store.delete_key(key)
            self._pruned[job_id] = max(first - 1, gen - 2)
            kept = {g: k for g, k in self._ranks.get(job_id, {}).items() if g > self._pruned[job_id]}
            self._ranks[job_id] = kept
            if not members:
                return
            nodes = self._nodes.get(job_id, {})
            local = [(w, self._local_ranks(store, job_id, w)) for w in members]
            ranks = sum(k for _, k in local)
            if ranks > TORCHRUN_MAX_RANKS:  # refused before it is built
                raise ValueError(f"a torchrun world of {ranks} ranks; at most {TORCHRUN_MAX_RANKS}")
            places = rank_places([(name, nodes.get(w, w)) for w, k in local  # unknown node: a node of its own
                                  for name in rank_names(w, k)])
            count = self._restarts.get(job_id, -1) + 1
            value = World(count, places).to_json()
            if len(value) > WORLD_MAX_BYTES:
                raise ValueError(f"a torchrun world of {ranks} ranks is {len(value)} bytes; the store carries "
                                 f"{WORLD_MAX_BYTES} at most")
            self._restarts[job_id] = count
            kept[gen] = ranks
            store.set(world_key(job_id, gen), value)

    def finished(self, job_id: str) -> str | None:
        """Every rank of one of the job's worlds exited 0 (its ``done`` count reached its ranks): the work is done
        from the count on, before the agents exit, so a recall in between must not start it again. The world
        before the current one counts too (its last rank may have finished as a newer one was published)."""
        with self._lock:
            worlds = sorted(self._ranks.get(job_id, {}).items(), reverse=True)
        if not worlds or not self.torch.serving:
            return None
        store = self._require_store()
        for gen, ranks in worlds:
            raw = store.get_or_none(done_key(job_id, gen))
            try:
                done = int(raw) if raw is not None else 0
            except ValueError:
                continue
            if done >= ranks:
                return f"every rank of world {gen} ({ranks}) exited 0"
        return None

    def world_keys(self, job_id: str, gen: int) -> list[str]:
        return [world_key(job_id, gen), done_key(job_id, gen), failed_key(job_id, gen), pg_key(job_id, gen)]

    def _local_ranks(self, store: RendezvousStore, job_id: str, worker: str) -> int:
        """The ranks ``worker`` runs on its node: what its launch said, else (an earlier daemon's worker) the K its
        agent wrote in its ready key, else 1; the key is the job's to write, so a K above any node's is taken as 1."""
        known = self._local.get(job_id, {}).get(worker)
        if known is not None:
            return known
        raw = store.get_or_none(ready_key(job_id, worker))
        try:
            said = int(raw) if raw is not None else 0
        except ValueError:
            said = 0
        if said > WORKERS_PER_NODE_MAX:
            log.warning("job %s: worker %s says it runs %d local ranks; at most %d: taken as 1",
                        job_id, worker, said, WORKERS_PER_NODE_MAX)
            said = 1
        if said < 1:
            return 1
        self._local.setdefault(job_id, {})[worker] = said
        return said
