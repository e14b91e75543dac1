"""The rank agent of a ``torchrun`` job: what the daemon starts as each worker (it imports no torch itself).

    python -m malletrain.worker.torchrun_agent [--stop-grace S] [--failure-wait S] -- COMMAND...

It runs K ranks of the command on its node (``MALLETRAIN_LOCAL_RANKS``), restarted in each world that lists
it: the barrier, rank 0's agent naming the master, stops, failures and the store's absence are in
docs/design/resilience.md (the torchrun launcher). Exits: 0 once every rank of its world exited 0, the
command's status on a failure no newer world answered, 143 on SIGTERM, 75 when the store stayed away.
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from malletrain.worker.ending import exit_now
from malletrain.worker.elastic.errors import StoreLost
from contract.exits import EXIT_SIGTERM, EXIT_STORE_LOST, STOP_STATUSES  # a stop: never a crash of the script
from contract.storekeys import done_key, failed_key, world_key
from malletrain.worker.elastic.rendezvous import Rendezvous, WorldMaster, arrive, form_step
from contract.world import DEFAULT_FAILURE_WAIT_S, DEFAULT_STOP_GRACE_S, World, rank_names
from malletrain.worker.warm_ranks import ENV_WARM_IMPORTS, READY_WAIT_S, InFork, RankServer, WarmChild, \
    imported_ahead, learned_imports, os_threads, warm_wanted
from contract.workerenv import ENV_GENERATION, ENV_INCARNATION, ENV_WORKER, RankPlace, WorkerEnv, \
    configure_worker_logging, torchrun_environ
from spawner.ranks import LocalRanks, exit_status, pin_cores
from spawner.slots import DEVICE_VARIABLES, ENV_LOCAL_RANKS, MAX_SLOTS, SlotPlace, detect_accelerator, slot_place

log = logging.getLogger("malletrain.torchrun")

POLL_S = 0.05
"""How often the agent looks at its command and the job's generation."""
FORMING_POLL_S = 0.01
"""How often it looks while a world forms (a few looks: every one it waits is a pause of the whole job)."""
ENV_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
"""``True`` in a rank's environment: its agent serves the world's store (rank 0 a client of it too)."""
AGENT_STORE_TIMEOUT_S = 300.0
EXIT_NOT_FORMED = 1  # a world whose ranks never all came: a failure (the daemon replaces this worker)


class RankState(enum.Enum):
    """Where a rank agent is: no world lists it, in a world's barrier (or waiting for its master), its command
    runs, it exited 0 (waiting for the other ranks), or it failed (waiting a bounded time for a newer world)."""

    WAITING = "waiting"
    FORMING = "forming"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


RANK_TRANSITIONS: dict[RankState, frozenset[RankState]] = {  # a newer world takes any state to FORMING or WAITING
    RankState.WAITING: frozenset({RankState.FORMING}),
    RankState.FORMING: frozenset({RankState.RUNNING, RankState.FORMING, RankState.WAITING}),
    RankState.RUNNING: frozenset({RankState.FINISHED, RankState.FAILED, RankState.FORMING, RankState.WAITING}),
    RankState.FINISHED: frozenset({RankState.FORMING, RankState.WAITING}),
    RankState.FAILED: frozenset({RankState.FORMING, RankState.WAITING}),
}


def dev_names() -> list[str]:
    """The names under ``/dev`` (what tells the node's accelerator; none where it cannot be read)."""
    try:
        return os.listdir("/dev")
    except OSError:
        return []


RankProcess = Union["subprocess.Popen[bytes]", WarmChild]
"""A started rank: a ``subprocess.Popen`` (cold) or a :class:`~malletrain.worker.warm_ranks.WarmChild`."""
exit_code = exit_status  # a child's return code as a process exit status (killed by signal N: 128 + N)


@dataclass
class RankAgent:
    """One worker of a ``torchrun`` job: its command, restarted in each world that lists it."""

    rdzv: Rendezvous
    command: tuple[str, ...]
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    failure_wait_s: float = DEFAULT_FAILURE_WAIT_S
    local_ranks: int = 1  # the ranks it runs on its node (the node's worker slots the job uses)
    state: RankState = RankState.WAITING
    gen: int = 0  # the newest generation seen
    world: World | None = None  # the world this worker is in (FORMING onwards)
    children: LocalRanks[RankProcess] | None = None  # its ranks in the current world (None: none running)
    warm: bool = False  # its ranks start as forks of rank servers (main: unless the job says WARM_RANKS=0)
    servers: list[RankServer] = field(default_factory=list)  # by local rank (none: every start is cold)
    failed: tuple[int, float] | None = None  # (exit status, when) of a failed command
    forming_since: float = 0.0  # when it entered its current world's barrier
    stopping: list[LocalRanks[RankProcess]] = field(default_factory=list)  # old ranks told to stop, not yet exited
    stop_requested: bool = False
    master: WorldMaster | None = None  # the current world's master, once named (its port held where named here)
    serves_store: bool = False  # it serves its worlds' store where it holds rank 0 (main: torch imported here)
    world_store: object | None = None  # the torch TCPStore this agent serves for its world (rank 0's agent)
    retired_stores: list[object] = field(default_factory=list)  # older worlds' stores, kept until their ranks exit
    _env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def worker(self) -> str:
        return self.rdzv.worker

    @property
    def child(self) -> RankProcess | None:
        """Local rank 0's command (None: not running)."""
        return self.children.procs[0] if self.children is not None else None

    @property
    def names(self) -> list[str]:
        """Its ranks' names in a world's places, by local rank."""
        return rank_names(self.worker, self.local_ranks)

    @property
    def places(self) -> list[RankPlace]:
        """Its ranks' places in the current world, by local rank."""
        assert self.world is not None
        return [self.world.places[name] for name in self.names]

    def move(self, new: RankState) -> None:
        if new not in RANK_TRANSITIONS[self.state]:
            raise RuntimeError(f"rank agent {self.worker}: no move from {self.state.value} to {new.value}")
        self.state = new

    def run(self) -> int:
        """Until the job is complete (0), the command failed for good (its status), a stop (143) or the store
        gone past its grace (75)."""
        try:
            self.prepare()
            self.rdzv.mark_ready()
            log.info("worker %s: ready, waiting for a world that lists it", self.worker)
            while not self.stop_requested:
                code = self.tick()
                if code is not None:
                    return code
                time.sleep(self.pause())
        except StoreLost as exc:  # the daemon stayed away past the grace: a stop, not a failure
            log.error("worker %s: %s; stopping its command", self.worker, exc)
            self.stop_child()
            return EXIT_STORE_LOST
        finally:
            self.stop_child()  # (none left running when it ends otherwise) then the servers that forked them
            self.close_servers()
            self.drop_master()
            self.world_store = None
            self.retired_stores.clear()
        return EXIT_SIGTERM

    def pause(self) -> float:
        """How long until the next look: :data:`FORMING_POLL_S` while a world forms (its ranks' start waits on each
        look), else :data:`POLL_S`."""
        return FORMING_POLL_S if self.state is RankState.FORMING else POLL_S

    def start_servers(self) -> None:
        got = start_rank_servers(self.command, self._env, self.local_ranks, self.warm, self.worker)
        assert not isinstance(got, InFork)  # (no fork asked)
        self.servers = got

    def prepare(self) -> None:
        """Before it says it is ready: its rank servers have imported (a joining worker does so while the old world
        trains on)."""
        if not self.servers:
            self.start_servers()
        deadline = time.monotonic() + READY_WAIT_S
        while not self.stop_requested and time.monotonic() < deadline \
                and any(s.usable and not s.ready for s in self.servers):
            for server in self.servers:
                server.wait_ready(0.1)
        if self.servers:
            log.info("worker %s: warm: %d rank server(s) ready", self.worker, sum(s.ready for s in self.servers))

    def close_servers(self) -> None:
        for server in self.servers:
            server.close()
        self.servers = []

    def slots(self) -> list[SlotPlace]:
        return slots_of(self.local_ranks, self._env)

    def tick(self) -> int | None:
        """One look: a newer world first, then the current state's own step; an exit status when done."""
        newest = self.rdzv.generation()
        if newest > self.gen and self.rdzv.published(newest):
            self.switch_to(newest)
            if self.state is not RankState.FORMING:
                return None  # (a world that lists it goes on forming in this same look: no pause in between)
        if self.state is RankState.FORMING:
            if time.monotonic() - self.forming_since > self.stop_grace_s + self.failure_wait_s:
                log.error("worker %s: world %d did not form in %.0f s (a rank never came)", self.worker, self.gen,
                          self.stop_grace_s + self.failure_wait_s)
                return EXIT_NOT_FORMED
            self.form()
        elif self.state is RankState.RUNNING:
            self.watch_child()
        elif self.state is RankState.FINISHED:
            assert self.world is not None
            if self.rdzv.add(done_key(self.rdzv.job, self.gen), 0) >= len(self.world.places):
                log.info("worker %s: every rank of world %d exited 0", self.worker, self.gen)
                return 0
        elif self.state is RankState.FAILED:
            assert self.failed is not None and self.world is not None
            if self.rdzv.add(failed_key(self.rdzv.job, self.gen), 0) >= len(self.world.places):
                log.error("worker %s: the command failed (exit %d) on every rank of world %d: no newer world "
                          "would help", self.worker, self.failed[0], self.gen)
                return self.failed[0]
            if time.monotonic() - self.failed[1] > self.failure_wait_s:
                log.error("worker %s: the command failed (exit %d) and no newer world came in %.0f s",
                          self.worker, self.failed[0], self.failure_wait_s)
                return self.failed[0]
        return None

    def switch_to(self, gen: int) -> None:
        """Generation ``gen`` is published: stop the command; join it if it lists this worker."""
        self.gen = gen
        members = self.rdzv.members(gen) or ()
        if self.worker not in members:
            if self.state is not RankState.WAITING:
                log.info("worker %s: world %d does not list it; stopping its command", self.worker, gen)
                self.stop_child()
                self.move(RankState.WAITING)
            return
        raw = self.rdzv.read(world_key(self.rdzv.job, gen))
        if raw is None:
            raise ValueError(f"job {self.rdzv.job}: generation {gen} has no world key (not a torchrun job?)")
        world = World.parse(raw, world_key(self.rdzv.job, gen))
        missing = [name for name in self.names if name not in world.places]
        if missing:
            raise ValueError(f"job {self.rdzv.job}: world {gen} has no place for {', '.join(missing)} "
                             f"(this worker runs {self.local_ranks} local ranks)")
        if self.state in (RankState.RUNNING, RankState.FINISHED) and self.world is not None \
                and world.places == self.world.places:
            # the same world published again (a restarted daemon re-adopting it): the command goes on
            log.info("worker %s: world %d is the one it runs in; the command goes on", self.worker, gen)
            self.rdzv.current = gen
            finished = sum(1 for i in self.children.told if self.children.seen[i] == 0) \
                if self.state is RankState.RUNNING and self.children is not None else self.local_ranks
            if finished:  # its ranks that exited 0, counted in the world under its new number
                self.rdzv.add(done_key(self.rdzv.job, gen), finished)
            return
        self.begin_stop()  # the old ranks stop while this agent arrives: it starts its new ones once they have
        self.drop_master()  # an older world's, never used
        self.world = world
        self.rdzv.current = gen  # reported to a restarted daemon's store: its numbering goes on above it
        self.move(RankState.FORMING)
        self.forming_since = time.monotonic()
        arrive(self.rdzv, gen, self.local_ranks)

    def form(self) -> None:
        """FORMING: rank 0's agent names the master once all have arrived; each agent starts its ranks with it once
        its own old ranks have exited (a joining worker, with none, starts while the old world's still stop)."""
        assert self.world is not None
        if self.master is None:
            self.master = form_step(self.rdzv, self.gen, len(self.world.places),
                                    any(p.rank == 0 for p in self.places), listen=False)
            if self.serves_store and self.master is not None and self.master.fd is not None:  # rank 0 is here
                self.world_store = serve_world_store(self.master)
                if self.world_store is not None:
                    log.info("worker %s: serves world %d's store on port %d", self.worker, self.gen, self.master.port)
        if not self.reap_stopping() or self.master is None:
            return
        master, self.master = self.master, None
        master.release()  # (unless served here) rank 0's script binds it now (init_process_group("env://"))
        self.start_child((master.host, master.port))

    def drop_master(self) -> None:
        """Let go of a master port this agent held for a world it will not start."""
        if self.master is not None:
            self.master.release()
            self.master = None

    def start_child(self, master: tuple[str, int]) -> None:
        """Start the command once per local rank, each with its place's variables, device and cores."""
        assert self.world is not None
        count = self.world.restart_count
        env = dict(self._env)
        places, slots = self.places, self.slots()

        def start_one(i: int) -> RankProcess:
            place, slot = places[i], slots[i]
            child_env = {**env, **slot.env, **torchrun_environ(place, master, self.rdzv.job, count)}
            child_env[ENV_WORKER] = self.names[i]  # the rank's name in the world's places
            child_env[ENV_INCARNATION] = str(count)  # its reports: (name, incarnation) is their sender
            child_env[ENV_GENERATION] = str(self.gen)  # reports count at the size the daemon gave this world
            if self.world_store is not None:
                child_env[ENV_AGENT_STORE] = str(True)  # torch's env:// rendezvous: rank 0 a client too
            log.info("worker %s: starting rank %d of %d (local rank %d of %d, restart %d, master %s:%d)",
                     self.worker, place.rank, place.world_size, i, self.local_ranks, count, master[0], master[1])
            warm = self.servers[i].spawn(self.command, child_env) if i < len(self.servers) else "warm ranks off"
            if isinstance(warm, str):
                if self.servers:
                    log.info("worker %s: local rank %d starts cold: %s", self.worker, i, warm)
                setup = pin_cores(slot.cores, lambda: None) if self.local_ranks > 1 else None
                return subprocess.Popen(list(self.command), env=child_env, preexec_fn=setup)
            log.info("worker %s: local rank %d forked warm (pid %d)", self.worker, i, warm.pid)
            return warm

        self.children = LocalRanks.start(self.local_ranks, start_one)
        self.move(RankState.RUNNING)

    def watch_child(self) -> None:
        """RUNNING: a rank that exits 0 adds to the world's ``done``; once all have, FINISHED. One that fails stops
        the node's other local ranks (the failure counted once)."""
        assert self.children is not None
        for i, code in self.children.exits():
            if code == 0:
                self.rdzv.add(done_key(self.rdzv.job, self.gen), 1)
                continue
            log.warning("worker %s: local rank %d's command exited %d in world %d; its node's other ranks stop "
                        "with it; waiting up to %.0f s for a newer world", self.worker, i, code, self.gen,
                        self.failure_wait_s)
            self.stop_child()
            self.failed = (exit_code(code), time.monotonic())
            if exit_code(code) not in STOP_STATUSES:  # a crash (a rank stopped by a signal may be a recall's)
                self.rdzv.add(failed_key(self.rdzv.job, self.gen), self.local_ranks)  # its node's ranks end together
            self.move(RankState.FAILED)
            return
        if self.children.poll() == 0:
            self.children = None
            self.move(RankState.FINISHED)

    def begin_stop(self) -> None:
        """SIGTERM to every local rank still running; :meth:`reap_stopping` sees them exit (or kills them)."""
        children, self.children = self.children, None
        if children is not None and children.poll() is None:
            children.stop(self.stop_grace_s)
            self.stopping.append(children)
        if self.world_store is not None:  # its world's ranks (here and elsewhere) may use it while they stop
            self.retired_stores.append(self.world_store)
            self.world_store = None

    def reap_stopping(self) -> bool:
        """Whether every rank told to stop has exited (one still running ``stop_grace_s`` after SIGTERM: SIGKILL)."""
        for ranks in self.stopping:
            if ranks.kill_at is not None and ranks.kill_at != float("inf") and time.monotonic() >= ranks.kill_at \
                    and ranks.poll() is None:
                log.warning("worker %s: a rank's command did not exit %.1f s after SIGTERM: SIGKILL", self.worker,
                            self.stop_grace_s)
        self.stopping = [ranks for ranks in self.stopping if not ranks.reap()]
        if not self.stopping:
            self.retired_stores.clear()  # the old worlds' stores go with their last local ranks
        return not self.stopping

    def stop_child(self) -> None:
        """Every local rank: SIGTERM, ``stop_grace_s`` seconds, SIGKILL; returns once all have exited."""
        self.begin_stop()
        while not self.reap_stopping():
            time.sleep(POLL_S / 5)


def serve_world_store(master: WorldMaster) -> object | None:
    """A torch ``TCPStore`` served by this process on ``master``'s held port (its fd), as torchrun's agent serves
    one; None (the port still held, for rank 0's script to bind) where torch is not imported here or the store
    cannot be made."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or master.fd is None or not dist.is_available():
        return None
    import socket
    from datetime import timedelta

    try:
        with socket.socket(fileno=socket.dup(master.fd)) as sock:
            sock.listen(1024)  # from now on a rank's connection waits in the backlog: no refusal, no back-off
        store = dist.TCPStore(master.host, master.port, None, True, timedelta(seconds=AGENT_STORE_TIMEOUT_S),
                              wait_for_workers=False, master_listen_fd=master.fd)
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        log.warning("cannot serve the world's store on port %d here (%s): rank 0's script serves it", master.port, exc)
        return None
    master.take()  # the store owns the socket now
    return store


def slots_of(local_ranks: int, env: Mapping[str, str]) -> list[SlotPlace]:
    """Each of ``local_ranks`` ranks' device, thread count and cores on this node, as the node agent gives a worker
    slot: the device variable in ``env`` (the agent's) is the node's, shared out among the local ranks."""
    env = dict(env)
    acc, cores = detect_accelerator(env, dev_names()), sorted(os.sched_getaffinity(0))
    job_env = {k: v for k, v in env.items() if k not in DEVICE_VARIABLES}
    return [slot_place(i, local_ranks, acc, env, cores, job_env) for i in range(local_ranks)]


def start_rank_servers(command: Sequence[str], env: Mapping[str, str], local_ranks: int, warm: bool, worker: str,
                       fork: bool = False) -> list[RankServer] | InFork:
    """A rank server per local rank (:mod:`malletrain.worker.warm_ranks`) with the rank's environment and cores:
    each a new interpreter, or with ``fork`` a fork of this process (torch imported already: ready when forked).
    None for a command another interpreter runs or with warm ranks off; in a forked server, what it ends with."""
    if not command or not warm:
        return []
    python = command[0] if os.sep in command[0] else shutil.which(command[0])
    if python is None:
        return []
    modules = learned_imports(command, env.get(ENV_WARM_IMPORTS, ""))
    if fork and os.path.realpath(python) != os.path.realpath(sys.executable):
        fork = False  # a fork is this interpreter: the command names another
    threads = os_threads() if fork else 0
    servers: list[RankServer] = []
    for slot in slots_of(local_ranks, env):
        server = RankServer(modules, {**env, **slot.env}, tuple(slot.cores) if local_ranks > 1 else (), python=python)
        forked = server.start(fork, servers)
        if forked is not None:
            return forked
        servers.append(server)
    log.info("worker %s: %d rank server(s) %s, importing %s", worker, len(servers),
             f"forked from this agent (torch imported ahead; {threads} thread(s))" if fork else "started",
             ", ".join(modules))
    return servers


def local_ranks_of(env: Mapping[str, str]) -> int:
    """K, the ranks this worker runs on its node: ``MALLETRAIN_LOCAL_RANKS`` (unset: 1); ``ValueError`` naming
    the variable if it is not an integer in [1, MAX_SLOTS]."""
    text = env.get(ENV_LOCAL_RANKS, "1")
    try:
        k = int(text)
    except ValueError:
        k = 0
    if not 1 <= k <= MAX_SLOTS:
        raise ValueError(f"{ENV_LOCAL_RANKS}={text!r}: not an integer in [1, {MAX_SLOTS}]")
    return k


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m malletrain.worker.torchrun_agent",
                                description="Run a torchrun script as one rank of a malletrain job, "
                                            "restarted in each of the job's worlds.")
    p.add_argument("--stop-grace", type=float, default=DEFAULT_STOP_GRACE_S,
                   help="seconds between SIGTERM and SIGKILL when the world changes")
    p.add_argument("--failure-wait", type=float, default=DEFAULT_FAILURE_WAIT_S,
                   help="seconds a failed command waits for a newer world before the failure counts")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the job's command")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("no command given after --")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_worker_logging()
    wenv = WorkerEnv.from_environ()
    if wenv.store is None:
        print("malletrain torchrun agent: MALLETRAIN_STORE is not set: start it through the daemon", file=sys.stderr)
        return 2
    try:
        local_ranks = local_ranks_of(os.environ)
    except ValueError as exc:
        print(f"malletrain torchrun agent: {exc}", file=sys.stderr)
        return 2
    warm = warm_wanted(os.environ)
    servers: list[RankServer] = []
    if warm and imported_ahead():  # a node's warm process became this agent: fork, before any connection
        got = start_rank_servers(tuple(args.command), os.environ, local_ranks, warm, wenv.worker or "?", fork=True)
        if isinstance(got, InFork):
            return got.code  # a rank server (or one of its ranks) ends here
        servers = got
    rdzv = Rendezvous.from_worker_env(wenv)
    assert rdzv is not None  # (its store is set)
    rdzv.ready_value = str(local_ranks)  # a restarted daemon learns the worker's K from its ready key
    agent = RankAgent(rdzv, tuple(args.command), args.stop_grace, args.failure_wait, local_ranks,
                      warm=warm, servers=servers, serves_store="torch.distributed" in sys.modules)

    def on_sigterm(signum: int, frame: object) -> None:
        agent.stop_requested = True

    signal.signal(signal.SIGTERM, on_sigterm)
    code = agent.run()
    if imported_ahead():  # torch loaded here (the node's warm process): its teardown takes seconds, past the grace
        exit_now(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
