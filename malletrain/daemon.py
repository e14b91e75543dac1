"""The daemon: ONE reconcile loop, observe -> decide -> act.

observe
    the scavenger backend (local, Slurm or PBS, through :class:`scavenger.base.SchedulerBackend`
    and :mod:`malletrain.scavenging`: pilots started / ending / ended, idle nodes, planned starts;
    nothing is decided on a stale look), node agents (up, gone,
    worker started/exited), the job monitor (progress, throughput, rescale
    pauses), the store (jobs submitted or cancelled by the CLI, even while the
    daemon was down) and control requests.
decide
    only calls the policy (:class:`policy.Policy`, the same code the simulator
    replays), once per trainer (``[[trainers]]``; none declared: one, ``default``):
    the trainer's view (its held usable nodes, its live jobs in submission order)
    and the monitor's evidence go in; the decision (admitted jobs and their
    nodes, waiting reasons, profiling counts) comes out and becomes each job's
    target. A node belongs to the first trainer whose patterns match it (else
    the one without patterns), a job to the trainer it names (else the first).
    The policy states, one per trainer, are saved in the store after every
    decision that changed one, so a restart resumes profiles and lender debts. Decisions
    happen when something changed, at least every ``REPLAN_S``, and while a
    profile runs (its steps end on evidence).
act
    make the workers match the plan: start workers on new nodes (ahead of
    time), publish the new member list once they are ready, stop workers of
    nodes a job lost. Every action is idempotent (agents ignore duplicate
    starts/stops; a member list is published only when it differs).

A restart re-reads the store, waits ``agent_dead_after`` for the agents to
reconnect (they keep running their workers meanwhile), re-adopts the workers
they report and republishes each job's membership. The runtime's rendezvous
comes back on the port kept in the store, and each job's generation numbering
goes on from the last one published (kept in the store too), so running
``torch`` workers switch to the republished membership without losing a step.

A clean stop (:meth:`Daemon.close`) stops the workers but waits for them:
their last commit reaches the state dir and their last reports the store,
and the jobs are SUSPENDED ("daemon stopped"); a profile it interrupted
starts over at the next start. A daemon that finds the ``daemon.json`` of a
killed one waits ``agent_dead_after`` for surviving agents even with no job
active. See "Restarts" in docs/operators.md.

Optional runtime hooks (looked up with ``getattr``): ``ready(job, worker)``
(a worker started ahead is ready to join), ``resume_generation(job, gen)``
(numbering goes on after a restart; the torch runtime also restores the job's
checkpoint from disk), ``readopt(job, command, workers)`` (take over a job an
earlier daemon ran, e.g. a Horovod driver) and ``persist_checkpoints(jobs)``
(copy new checkpoints to the state dir; called every iteration).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from malletrain.config import DEFAULT_TRAINER, ConfigError, DaemonConfig, TrainerConfig, node_trainer
from malletrain.jobspec import JobSpec, JobSpecError, JobState, parse_spec
from malletrain.control import Caller, Cancel, ControlServer, Nodes, Ping, Request, Shutdown, Status, Submit
from malletrain.control import admin_gids_from, socket_path
from malletrain.messages import ENV_SECRET
from malletrain.logs import about
from malletrain.loopwait import LoopWait
from malletrain.metrics import Metrics
from malletrain.monitor import Monitor, ReplaySaver, job_secret, load_master_key
from malletrain.runtimes import Runtime
from malletrain.store import Store, StoreError
from policy import Decision, EventKind, JobEvidence, JobView, Policy, PolicyState, PolicyStateError, View
from policy import PolicyInputError, evidence_from
from profiler.estimators import RescaleEvent
from malletrain.scavenging import Scavenging, view_extras
from scavenger.base import AgentGone, AgentUp, BackendError, PilotEnded, PilotEnding, PilotStarted
from scavenger.base import observed, run_command
from scavenger import jobproc
from scavenger.channel import AGENT_KEY_FILE
from scavenger.connguard import raise_nofile_limit
from scavenger.hub import AgentHub, AgentWorkers, WorkerExitedEvent, WorkerStartedEvent
from scavenger.local import LocalBackend, slot_timeline
from traces.model import IdleTimeline

log = logging.getLogger("malletrain.daemon")

STATE_FILE = "daemon.json"
STORE_FILE = "store.db"
LEAVE_GRACE_S = 5.0  # a dropped worker leaves at its next commit; killed after this
START_RETRY_S = 3.0

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP)
EXIT_STORE_LOST = 75  # a torch worker whose daemon's store stayed away too long (malletrain.elastic)


def stopped_from_outside(code: int) -> bool:
    """Whether a worker's exit ``code`` says it was stopped (a signal to stop, as a recall, a cancel
    or a killed process sends, or the daemon's store gone), not that the job's own code failed:
    only failures count toward ``max_failures``."""
    return code == EXIT_STORE_LOST or any(code in (-sig, 128 + sig) for sig in _STOP_SIGNALS)
REPLAN_S = 10.0  # decide at least this often (estimates drift), besides every event
POLICY_STATE_KEY = "policy_state"
NODE_SECONDS_KEY = "node_seconds"  # store meta: {job: node-seconds its workers held} for live jobs
CHECKPOINT_DIR = "checkpoints"  # STATE_DIR/checkpoints/<job>.ckpt: suspended jobs' state (torch runtime)
STOPPED = "daemon stopped"  # the reason a clean stop gives the jobs it suspends
STOP_WAIT_S = 15.0  # a clean stop waits at most this long for the workers it stopped to exit


def rescale_kind(ev: RescaleEvent, emptied_at: float | None) -> str:
    """``up`` or ``down``; ``resume`` when the job had no worker at all during the gap.

    A job suspended below its min and placed again later shows up in its step
    records as one long "rescale" from the old to the new size; that gap is the
    time it waited for nodes, not a pause of running workers.
    """
    if emptied_at is not None and ev.timestamp <= emptied_at <= ev.timestamp + ev.gap_s:
        return "resume"
    return "up" if ev.is_up else "down"

class DaemonError(RuntimeError):
    """The daemon cannot start (state dir locked, runtime missing); the message says why."""


@dataclass
class Trainer:
    """One trainer (``[[trainers]]``): its own nodes, its own policy and state, its own decisions."""

    config: TrainerConfig
    policy: Policy
    last_decision: Decision | None = None
    profiling: frozenset[str] = frozenset()  # its jobs the last decision profiles

    @property
    def name(self) -> str:
        return self.config.name


def read_policy_states(text: str, first: str) -> dict[str, PolicyState]:
    """The saved policy states by trainer name. A single state (saved before trainers existed,
    recognised by its ``version`` number) is ``first``'s."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise PolicyStateError(f"saved policy states are not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyStateError("saved policy states are not a JSON object")
    if isinstance(data.get("version"), int):
        return {first: PolicyState.from_json(text)}
    out = {}
    for name, value in data.items():
        if not isinstance(value, dict):
            raise PolicyStateError(f"the saved policy state of trainer {name!r} is not a JSON object")
        try:
            out[name] = PolicyState.from_json(json.dumps(value))
        except PolicyStateError as exc:
            raise PolicyStateError(f"trainer {name!r}: {exc}") from None
    return out


def policy_states_json(trainers: dict[str, Trainer]) -> str:
    """Every trainer's policy state, one JSON object keyed by trainer name (each state's own order kept)."""
    return "{" + ", ".join(f"{json.dumps(name)}: {t.policy.state.to_json()}" for name, t in trainers.items()) + "}"


@dataclass
class JobRun:
    """The daemon's in-memory view of a non-terminal job."""

    id: str
    spec: JobSpec
    state: JobState
    base_samples: int = 0  # progress stored before this daemon started
    target: list[str] = field(default_factory=list)  # nodes the last decision gave it
    members: list[str] = field(default_factory=list)  # nodes of the published member list
    published: tuple[str, ...] = ()  # worker ids of the published member list, in rank order
    workers: dict[str, str] = field(default_factory=dict)  # node -> worker id (members + joining)
    started: set[str] = field(default_factory=set)  # worker ids the agent confirmed
    start_sent: dict[str, float] = field(default_factory=dict)  # worker id -> last start request
    leaving: dict[str, tuple[str, float]] = field(default_factory=dict)  # worker -> (node, kill time)
    emptied_at: float | None = None  # when the job last lost all its workers (suspended or stopped)
    failures: int = 0
    last_progress: int = 0
    last_interrupted: float | None = None
    rescales: list[RescaleEvent] = field(default_factory=list)  # measured pauses (resumes left out)
    waiting: str = ""  # why the policy keeps it queued
    adopted: bool = False
    saved_samples: int = 0  # progress last written to the store
    ending: tuple[JobState, str] | None = None  # observed: it ends (act makes it so), and why
    owner: tuple[int | None, int | None] = (None, None)  # (uid, gid) of the submitter


def load_timeline(cfg: DaemonConfig) -> IdleTimeline | None:
    """The local backend's idle-node trace; None = every node always idle (``trace = "none"``).

    ``synthetic``: :func:`traces.synthetic.summit_like` on ``machine_nodes``
    nodes; a path: that log via :func:`traces.read`. Either way the local
    nodes are the machine's first idle ones (:func:`scavenger.local.slot_timeline`).
    """
    trace = cfg.local.trace
    if trace == "none":
        return None
    if trace == "synthetic":
        from traces.synthetic import summit_like

        # the independent-node model: Summit's bursts scaled down to a few dozen nodes leave every
        # node busy for an hour or more at a time, which is no way to show a handful of local nodes
        tl = summit_like(cfg.local.machine_nodes, cfg.local.duration, cfg.local.seed, bursty=False)
    else:
        from traces import read

        tl = read(trace)
    return slot_timeline(tl, cfg.local.nodes)


def make_runtime(cfg: DaemonConfig, monitor_address: str, rendezvous_port: int = 0) -> Runtime:
    """The configured runtime; ``rendezvous_port`` is where the torch runtime serves its store (0: any)."""
    if cfg.runtime == "toy":
        from malletrain.toy_runtime import ToyRuntime

        return ToyRuntime(str(cfg.state_path / "toy"), monitor=monitor_address)
    if cfg.runtime == "torch":
        from malletrain.runtimes.torch_elastic import TorchRuntime

        return TorchRuntime(host=cfg.ports.host, port=rendezvous_port, monitor=monitor_address,
                            store_grace_s=cfg.store_grace, checkpoint_dir=cfg.state_path / CHECKPOINT_DIR)
    if cfg.runtime == "horovod":
        from malletrain.runtimes.horovod_elastic import HorovodRuntime

        return HorovodRuntime(str(cfg.state_path / "horovod"), local=cfg.backend == "local",
                              env={"MALLETRAIN_MONITOR": monitor_address})
    raise ConfigError(f"unknown runtime {cfg.runtime!r}")


@dataclass
class DaemonParts:
    """Collaborators a test (or another front end) gives the daemon instead of the real ones: the
    job monitor, the agent hub, the runtime and the backend. Each must offer the methods the daemon
    calls on the real one; ``tests/test_conformance.py`` drives the daemon with fakes of all four
    and an injected clock, with no process and no socket but the control one."""

    monitor: Any = None
    hub: Any = None
    runtime: Any = None
    backend: Any = None


class Daemon:
    """Build with :meth:`start`; drive with :meth:`run` (or :meth:`step` in tests); :meth:`close` cleans up."""

    def __init__(self, cfg: DaemonConfig, clock: Callable[[], float] = time.time,
                 parts: DaemonParts | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.parts = parts if parts is not None else DaemonParts()
        self.state_dir = cfg.state_path
        raise_nofile_limit()  # connection caps bind before the descriptor limit does
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.state_dir / "daemon.lock", os.O_CREAT | os.O_RDWR, 0o600)
        except OSError as exc:  # read-only, not ours, a file in the way
            raise DaemonError(f"state dir {self.state_dir}: cannot write to it ({exc.strerror or exc}); make it "
                              f"writable by uid {os.geteuid()} or set another state_dir") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DaemonError(f"another daemon runs on state dir {self.state_dir}") from None
        self.ctx = zmq.Context()
        try:
            self._open(cfg)
        except BaseException:
            getattr(self, "metrics", Metrics()).close()
            self.ctx.destroy(linger=0)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            raise

    def _open(self, cfg: DaemonConfig) -> None:
        self.store = Store.open(self.state_dir / STORE_FILE, clock=self.clock)
        self.metrics = Metrics(cfg.metrics.address)  # [metrics]: off (a no-op) unless an address is set
        ports = self._ports()
        parts = self.parts
        self.monitor = parts.monitor or Monitor(self._bind(ports["monitor"], "monitor"), ctx=self.ctx)
        self.replay = ReplaySaver(self.monitor, self.store)  # replay windows survive restarts (store meta)
        self.replay.load()
        self.hub = parts.hub or AgentHub(
            self._bind(ports["agents"], "agents"), dead_after_s=cfg.agent_dead_after, ctx=self.ctx, clock=self.clock,
            key_file=self.state_dir / AGENT_KEY_FILE,  # kept across restarts: agents outlive a daemon
        )
        self._monitor_key = load_master_key(self.state_dir / "monitor.key")
        self.control = ControlServer(socket_path(self.state_dir), self.handle,
                                     admin_gids=admin_gids_from(list(getattr(cfg, "admin_groups", ()) or ())),
                                     owner_of=self._owner_of, shared=os.geteuid() == 0)
        self.control_address = str(self.control.path)
        self.runtime = parts.runtime or make_runtime(cfg, self.monitor.address, ports["rendezvous"])
        if hasattr(self.runtime, "job_env"):  # runtimes that spawn workers themselves (Horovod's driver)
            self.runtime.job_env = lambda job_id: {ENV_SECRET: self.job_secret(job_id)}
        if hasattr(self.runtime, "secret_for"):  # the torch runtime's store takes each job's own secret
            self.runtime.secret_for = self.job_secret
        self.runtime.start()
        self.store.set_meta("ports", json.dumps({
            "monitor": _port(self.monitor.address), "agents": _port(self.hub.address),
            "rendezvous": int(getattr(self.runtime, "port", 0) or 0),
        }))
        self.backend = parts.backend or self._make_backend()
        self.scav = Scavenging(self.backend, self.hub, self.store.log_event,
                               nodes_per_pilot=self._scavenger().nodes_per_pilot if self._kind() != "local" else 1,
                               poll_interval=self._scavenger().poll_interval if self._kind() != "local" else 0.0,
                               # an agent that cannot reach us leaves after agent_dead_after: twice that
                               # without its hello, the pilot's node is broken
                               meta=self.store, agent_grace=2 * cfg.agent_dead_after)
        self.scav.resume()  # the pilots the last daemon left (still queued ones too) before anything new
        self._machine_size = 0
        self._discover_machine()
        self.runs: dict[str, JobRun] = {}
        self.stopping = False
        self._changed = True
        self._next_sample = 0.0
        self._next_decide = 0.0
        self._to_release: set[str] = set()
        self._node_owner: dict[str, str | None] = {}  # node -> its trainer (memo of node_trainer)
        self.trainers, self._saved_policy_state = self._load_trainers()
        self._node_seconds = self._load_node_seconds()  # what each live job has used (budget_node_hours)
        self._saved_node_seconds = dict(self._node_seconds)
        self._counted_at: float | None = None  # the last step counted (a gap while no daemon ran is not counted)
        self._idle_since: dict[str, float] = {}  # usable node -> since when (node valuation)
        self._ended_fragments: dict[str | None, list[float]] = {}  # trainer -> idle fragments ended since
        self._worker_seq = 0
        now = self.clock()
        self._adopt_until = 0.0
        self._load_jobs(now)
        if (self.state_dir / STATE_FILE).exists() and not self._adopt_until:
            # the last daemon was killed (a clean stop removes daemon.json): its agents may still run
            # even with no job active; give them the adoption window to come back before holding nodes,
            # or a new agent and a surviving one would fight over a node
            self._adopt_until = now + self.cfg.agent_dead_after + 1.0
        # jobs a clean stop suspended in the middle of their profile: restarted at the first decision
        self._stopped_profiles = sorted(
            run.id for run in self.runs.values()
            if run.id in self._trainer_of(run).policy.state.profiles and run.state is JobState.SUSPENDED
            and (self.store.get(run.id) is not None and self.store.require(run.id).message == STOPPED))
        self._write_state_file()
        self.store.log_event("daemon_start", pid=os.getpid(), control=self.control_address)

    # ---------------------------------------------------------------- setup
    def _ports(self) -> dict[str, int]:
        stored = self.store.ports(("monitor", "agents", "rendezvous"))  # a bad entry: StoreError naming the file
        return {k: getattr(self.cfg.ports, k) or port for k, port in stored.items()}

    def _bind(self, port: int, what: str) -> str:
        """The address for ``what`` (``monitor``, ``agents``): ``port`` on ``[ports] host``
        (loopback by default), if free.

        A port set in ``[ports]`` is fixed: when something else holds it (another daemon, or
        a local user waiting there for our agents) the daemon refuses to start, naming the
        port and its holder. A port of 0 floats: the one kept from the last run is preferred
        and, if taken, another is picked; that is logged as an error and stored as a
        ``port_taken`` event (the last run's agents cannot prove themselves to the holder's
        socket nor obey it, and leave after ``agent_dead_after``).
        """
        import socket

        host = url_host = "127.0.0.1" if self.cfg.ports.host == "localhost" else self.cfg.ports.host
        if not port:
            return f"tcp://{url_host}:0"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # closes at once (a zmq socket lingers)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as zmq binds
            try:
                probe.bind((host, port))
                probe.listen(1)
                return f"tcp://{url_host}:{port}"
            except OSError as exc:
                why = exc.strerror or str(exc)
        holder = _port_holder(port)
        if getattr(self.cfg.ports, what, 0):
            raise DaemonError(f"{what} port {port} (ports.{what} in the config) is taken{holder}: {why}; "
                              f"refusing to start (stop that process, or set ports.{what} = 0 to let the port float)")
        log.error("%s port %d kept from the last run is taken%s; picking another (the last run's agents "
                  "cannot reach this daemon)", what, port, holder)
        self.store.log_event("port_taken", what=what, port=port, holder=holder.strip(" ()"))
        return f"tcp://{url_host}:0"

    def _scavenger(self) -> Any:
        """The [scavenger] table (a config without one: the defaults)."""
        from malletrain.config import ScavengerConfig

        return getattr(self.cfg, "scavenger", None) or ScavengerConfig()

    def _kind(self) -> str:
        """Which backend: [scavenger] kind, or the top-level ``backend`` when only that is set."""
        kind = self._scavenger().kind
        return kind if kind != "local" else self.cfg.backend

    def _discover_machine(self) -> None:
        """One look at the machine at start: its size bounds the jobs `submit` accepts."""
        try:
            self.scav.discovery = self.backend.discover()
        except BackendError as exc:  # the scheduler may be down now: the count comes with the first good look
            self.store.log_event("backend_error", backend=self.backend.name, error=str(exc))
            return
        self._note_machine_size()

    def _note_machine_size(self) -> None:
        n = self.scav.machine_size()
        if n and n != self._machine_size:
            self._machine_size = n
            self.store.set_machine_nodes(n)  # `submit` refuses jobs bigger than the machine

    def _make_backend(self) -> Any:
        """The configured :class:`scavenger.base.SchedulerBackend`: local, slurm or pbs."""
        kind = self._kind()
        if kind != "local":
            return self._make_batch_backend(kind)
        cfg = self.cfg
        stored = self.store.get_meta("local_epoch")
        epoch = float(stored) if stored else self.clock()
        if not stored:
            self.store.set_meta("local_epoch", repr(epoch))
        timeline = load_timeline(cfg)
        logs = str(self.state_dir / "logs")
        return LocalBackend(
            cfg.local.nodes, self.hub.address, timeline, cfg.local.time_scale, epoch=epoch, clock=self.clock,
            agent_args=("--heartbeat", f"{cfg.agent_heartbeat:g}", "--dead-after", f"{cfg.agent_dead_after:g}",
                        *self._key_args(), *self._warm_args()),
            log_dir=logs,
        )

    def _key_args(self) -> tuple[str, ...]:
        """``--key-file PATH`` when the hub has an agent key (agents get its path, never the key)."""
        path = getattr(self.hub, "key_file", None)
        return ("--key-file", str(path)) if path else ()

    def _warm_args(self) -> tuple[str, ...]:
        """``--warm MODULES``: what the runtime's workers import, so agents prepare one ahead."""
        modules = tuple(getattr(self.runtime, "warm_modules", ()) or ())
        return ("--warm", ",".join(modules)) if modules else ()

    def _make_batch_backend(self, kind: str) -> Any:
        """Pilots as Slurm or PBS batch jobs; their agents connect to this daemon's hub."""
        sc = self._scavenger()
        logs = jobproc.private_dir(self.state_dir / "logs")  # 0700 (0711 for root), whatever the umask
        common: dict[str, Any] = dict(
            daemon_address=self.hub.address, walltime_s=sc.walltime, nodes_per_pilot=sc.nodes_per_pilot,
            max_pilots=sc.max_pilots, renew_before_s=sc.renew_before, max_queued_s=sc.max_queued,
            submit_rate=sc.submit_rate, command_timeout_s=sc.command_timeout,
            agent_args=("--heartbeat", f"{self.cfg.agent_heartbeat:g}", "--dead-after",
                        f"{self.cfg.agent_dead_after:g}", "--log-dir", str(logs), *self._key_args(),
                        *self._warm_args()),
            account=sc.account or None,
        )
        if sc.job_name:
            common["job_name"] = sc.job_name
        try:
            if kind == "slurm":
                from scavenger.slurm import SlurmBackend, SlurmConfig

                return SlurmBackend(SlurmConfig(partition=sc.partition or None, qos=sc.qos or None,
                                                output=str(logs / "pilot-%j.out"), **common), clock=self.clock,
                                    runner=observed(run_command, self.metrics.observe_command))
            from scavenger.pbs import PbsBackend, PbsConfig

            return PbsBackend(PbsConfig(queue=sc.queue, output=str(logs / "pilot.out"), **common), clock=self.clock,
                              runner=observed(run_command, self.metrics.observe_command))
        except ValueError as exc:
            raise ConfigError(f"[scavenger]: {exc}") from None

    def _load_jobs(self, now: float) -> None:
        resume = getattr(self.runtime, "resume_generation", None)
        for rec in self.store.jobs():
            if rec.state.terminal or self._refused_trainer(rec.id, rec.spec):
                continue
            gen = self.store.generation(rec.id)
            if gen and resume is not None:
                resume(rec.id, gen)  # numbering never goes backwards: old workers may still run
            run = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples,
                         owner=(rec.owner_uid, rec.owner_gid))
            self._register(rec.id)
            run.last_progress = rec.samples
            if rec.state.active:
                run.target = list(rec.nodes)
                run.adopted = True
                self._adopt_until = now + self.cfg.agent_dead_after + 1.0
            self.runs[rec.id] = run

    def _load_trainers(self) -> tuple[dict[str, Trainer], str | None]:
        """One policy per trainer, each with the state the last daemon saved for it (profiles, debts,
        learned curves); a single state saved before trainers existed is the ``default`` (or first)
        trainer's. The state of a trainer no longer configured is dropped (an event says so)."""
        configs = self.cfg.trainer_list()
        names = [t.name for t in configs]
        saved = self.store.get_meta(POLICY_STATE_KEY)
        try:
            states = read_policy_states(saved, DEFAULT_TRAINER if DEFAULT_TRAINER in names else names[0]) \
                if saved is not None else {}
        except PolicyStateError as exc:
            raise DaemonError(f"{self.state_dir / STORE_FILE}: {exc}") from None
        for name in sorted(set(states) - set(names)):
            self.store.log_event("policy_state_dropped", trainer=name)
        return {t.name: Trainer(t, Policy(t.policy, states.get(t.name))) for t in configs}, saved

    @property
    def policy(self) -> Policy:
        """The first trainer's policy (the only one of a config without ``[[trainers]]``)."""
        return next(iter(self.trainers.values())).policy

    @property
    def last_decision(self) -> Decision | None:
        """The first trainer's last decision (each trainer's: ``trainers[name].last_decision``)."""
        return next(iter(self.trainers.values())).last_decision

    @property
    def _profiling(self) -> frozenset[str]:
        """Jobs every trainer's last decision profiles."""
        return frozenset().union(*(t.profiling for t in self.trainers.values()))

    def trainer_name(self, spec: JobSpec) -> str:
        """The trainer a job names, or the first one (which need not exist: see :meth:`unknown_trainer`)."""
        return spec.trainer or next(iter(self.trainers))

    def unknown_trainer(self, spec: JobSpec) -> str | None:
        """Why this daemon cannot run the job (it names a trainer the daemon does not have), or None."""
        if spec.trainer is None or spec.trainer in self.trainers:
            return None
        return f"no trainer {spec.trainer!r} in this daemon (its trainers: {', '.join(self.trainers)})"

    def _trainer_of(self, run: JobRun) -> Trainer:
        return self.trainers[self.trainer_name(run.spec)]

    def node_trainer(self, node: str) -> str | None:
        """The trainer ``node`` belongs to (None: no trainer's patterns take it)."""
        if node not in self._node_owner:
            self._node_owner[node] = node_trainer([t.config for t in self.trainers.values()], node)
        return self._node_owner[node]

    def _write_state_file(self) -> None:
        info = {
            "pid": os.getpid(), "control": self.control_address, "agents": self.hub.address,
            "monitor": self.monitor.address, "store": str(self.state_dir / STORE_FILE),
        }
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(info))
        os.replace(tmp, self.state_dir / STATE_FILE)

    # ---------------------------------------------------------------- loop
    def run(self, duration_s: float | None = None, on_tick: Callable[["Daemon"], None] | None = None) -> None:
        end = None if duration_s is None else time.monotonic() + duration_s
        while not self.stopping and (end is None or time.monotonic() < end):
            t0 = time.monotonic()
            self._guarded(self.step)
            if on_tick is not None:
                on_tick(self)
            spare = self.cfg.loop_interval - (time.monotonic() - t0)
            if spare > 0:  # reports and agent frames as they come; a recall starts the next step at once
                wait = LoopWait(self.monitor, self.hub, self._observe_agents, self.store.batch, self.clock)
                self._guarded(lambda: wait.wait(spare))

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except (OSError, RuntimeError, ValueError, KeyError, zmq.ZMQError, sqlite3.Error) as exc:
            # the daemon never dies of one bad input; the event log keeps the reason
            log.exception("reconcile step failed")
            self.store.log_event("step_error", error=f"{type(exc).__name__}: {exc}")

    def step(self) -> None:
        now = self.clock()
        self._count_node_seconds(now)
        self._observe_backend(now)
        with self.store.batch():  # a burst of agent events, every job's progress: one commit each
            self._observe_agents(now)
        self.monitor.drain()
        with self.store.batch():
            self._observe_progress(now)
        self.replay.tick(now)
        self._observe_store(now)
        self._serve_control()
        if now < self._adopt_until and not self._adoption_complete():
            return  # agents may still reconnect with the workers of the last daemon
        if self._adopt_until:
            self._finish_adoption(now)
        self._hold_idle_nodes()
        self._track_idle(now)
        # a profile's step ends on evidence: while one runs, ask at every iteration (the policy
        # answers an unchanged problem without solving)
        if self.scav.stale:
            pass  # no decision on stale data: the next good look catches up
        elif self._changed or now >= self._next_decide or self._profiling:
            self._changed = False
            self._next_decide = now + REPLAN_S
            with self.store.batch():  # a decision's events, plans and policy states: one commit
                self._decide(now)
        self._act(now)
        self._persist_checkpoints()
        self._sample(now)

    # ---------------------------------------------------------------- observe
    def usable_nodes(self) -> set[str]:
        """Nodes of RUNNING pilots whose own agent is connected (not ENDING ones: jobs leave those)."""
        return self.scav.usable()

    def _observe_backend(self, now: float) -> None:
        """Pilot events and the idle nodes (at most every poll_interval); a failed look marks them stale."""
        for ev in self.scav.look(now):
            kind, detail = Scavenging.describe(ev)
            self.store.log_event(kind, **detail)
            if isinstance(ev, PilotEnded):
                for node in ev.nodes:
                    if node not in self.scav.held():  # not a replacement that already took over
                        self._node_lost(node, now, f"pilot {ev.reason.value}")
            elif isinstance(ev, (PilotStarted, PilotEnding)):
                self._changed = True  # a node to grow onto, or one to leave before its deadline
        self._note_machine_size()

    def _observe_agents(self, now: float) -> None:
        for ev in self.hub.poll():
            if isinstance(ev, AgentUp):
                self.scav.adopt(ev.node, self.scav.agent_batch_job(ev.node), self.hub.pid(ev.node))
                self.store.log_event("agent_up", node=ev.node)
                log.info("agent up on node %s", ev.node, extra=about(node=ev.node))
                self._changed = True
            elif isinstance(ev, AgentWorkers):
                self.scav.adopt(ev.node, str(getattr(ev, "batch_job", "") or self.scav.agent_batch_job(ev.node)),
                                ev.pid)
                self._adopt_workers(ev.node, ev.workers)
            elif isinstance(ev, AgentGone):
                self.store.log_event("agent_gone", node=ev.node, reason=ev.reason)
                log.info("agent on node %s gone (%s)", ev.node, ev.reason, extra=about(node=ev.node))
                self._node_lost(ev.node, now, ev.reason)
                if ev.node in self.scav.held():
                    self._to_release.add(ev.node)  # act cancels its pilot: observe only records
            elif isinstance(ev, WorkerStartedEvent):
                run = self.runs.get(_job_of(ev.worker))
                if run is not None:
                    run.started.add(ev.worker)
                    self.store.log_event("worker_started", run.id, node=ev.node, worker=ev.worker)
            elif isinstance(ev, WorkerExitedEvent):
                self._worker_exited(ev, now)

    def _adopt_workers(self, node: str, workers: tuple[str, ...]) -> None:
        for wid in workers:
            run = self.runs.get(_job_of(wid))
            if run is not None and run.adopted and node in run.target and node not in run.workers:
                run.workers[node] = wid
                run.started.add(wid)
                self.store.log_event("adopt", run.id, node=node, worker=wid)
            elif run is None or run.workers.get(node) != wid:
                if run is None or wid not in run.leaving:
                    self.hub.stop_worker(node, wid, grace=1.0)  # a worker nobody owns

    def _adoption_complete(self) -> bool:
        """Every pilot the last daemon held has its agent back, and every job it ran has its workers
        back: adoption need not wait out ``agent_dead_after`` (that is for dead nodes, not restarts)."""
        held = self.scav.held()
        alive = self.hub.alive()
        # the last daemon's pilots too: one whose agent has not said hello yet is not in held(), and a
        # new pilot submitted for its node would fight the agent still running there
        if not held or any(node not in alive for node in set(held) | self.scav.last_daemons_nodes()):
            return False
        return all(node in run.workers for run in self.runs.values() if run.adopted for node in run.target)

    def _finish_adoption(self, now: float) -> None:
        self._adopt_until = 0.0
        readopt = getattr(self.runtime, "readopt", None)  # optional: runtimes with daemon-side state
        for run in self.runs.values():
            if not run.adopted:
                continue
            run.adopted = False
            run.target = [n for n in run.target if n in run.workers]
            run.members, run.published = [], ()  # republish: the runtime may be new
            if readopt is not None:
                try:
                    readopt(run.id, run.spec.command, {wid: node for node, wid in run.workers.items()})
                except (OSError, ValueError, RuntimeError) as exc:
                    log.warning("runtime.readopt(%s): %s", run.id, exc, extra=about(job=run.id))
                    self.store.log_event("readopt_error", run.id, error=str(exc))
            if len(run.target) < run.spec.min_nodes:
                self._suspend(run, now, "not re-adopted after a daemon restart")
                try:
                    self.runtime.forget(run.id)  # e.g. a driver the last daemon left running
                except Exception as exc:
                    log.warning("runtime.forget(%s): %s", run.id, exc, extra=about(job=run.id))
            self.store.log_event("readopted", run.id, nodes=run.target)
        self._changed = True

    def _node_lost(self, node: str, now: float, reason: str) -> None:
        for run in self.runs.values():
            if node in run.target or node in run.workers:
                if node in run.target:
                    run.target.remove(node)
                wid = run.workers.pop(node, None)
                if wid:
                    run.leaving.pop(wid, None)
                run.last_interrupted = now
                self.store.log_event("node_lost", run.id, node=node, reason=reason)
                log.info("job %s lost node %s (%s)", run.id, node, reason, extra=about(job=run.id, node=node))
        self._changed = True

    def _worker_exited(self, ev: WorkerExitedEvent, now: float) -> None:
        run = self.runs.get(_job_of(ev.worker))
        if run is None:
            return
        if ev.worker in run.leaving:
            del run.leaving[ev.worker]
            return
        if run.workers.get(ev.node) != ev.worker:
            return  # an old worker of a node the job no longer has
        if ev.node not in self.scav.held():  # its pilot is ending or gone: a recall (Slurm signals the whole
            self._node_lost(ev.node, now, "pilot ending")  # step), not a failure of the job
            return
        del run.workers[ev.node]
        if ev.code == 0 and ev.node in run.members:
            self._end(run, JobState.COMPLETED, f"worker {ev.worker} exited 0")
            return
        if stopped_from_outside(ev.code):  # not the job's failure: a new worker takes its place at once
            self.store.log_event("worker_stopped", run.id, worker=ev.worker, code=ev.code)
            log.info("job %s: worker %s was stopped (exit %d) on node %s; starting another", run.id, ev.worker,
                     ev.code, ev.node, extra=about(job=run.id, worker=ev.worker))
            self._changed = True
            return
        run.failures += 1
        if ev.node in run.target:
            run.target.remove(ev.node)
        self.store.log_event("worker_failed", run.id, worker=ev.worker, code=ev.code, failures=run.failures)
        if run.failures >= self.cfg.max_failures:
            self._end(run, JobState.FAILED, f"{run.failures} workers failed without progress; last {ev.worker} exit {ev.code}")
        self._changed = True

    def _observe_progress(self, now: float) -> None:
        """Progress from the monitor, stored as soon as it grows (one small UPDATE; WAL, no fsync).

        Stored at once rather than once a second: a ``kill -9`` then loses only the
        reports the dead daemon had received but not yet read (one loop interval), so
        the stored count stays with what the workers trained (finding E: a stop left it
        3,840 samples behind). A clean stop reads every last report first (:meth:`close`).
        """
        for run in list(self.runs.values()):
            stats = self.monitor.jobs.get(run.id)
            if stats is None:
                continue
            progress = run.base_samples + stats.samples
            if progress > run.last_progress:
                run.last_progress = progress
                run.failures = 0
            for ev in stats.new_rescales():
                kind = rescale_kind(ev, run.emptied_at)
                self.store.record_rescale(run.id, ev.from_size, ev.to_size, ev.pause_s, kind)
                self.metrics.observe_rescale(kind, ev.pause_s)
                if kind != "resume":
                    run.rescales.append(ev)
                    self._changed = True
            if progress > run.saved_samples:
                self.store.set_samples(run.id, progress)
                run.saved_samples = progress
            target = run.spec.samples
            if target is not None and progress >= target:
                self.store.set_samples(run.id, progress)
                self._end(run, JobState.COMPLETED, f"trained {progress} of {target} samples")

    def _observe_store(self, now: float) -> None:
        """New jobs and cancels written by the CLI (directly into the store)."""
        live = self.store.job_states([s for s in JobState if not s.terminal])  # specs read only for new jobs
        for jid, status in live.items():
            run = self.runs.get(jid)
            if run is not None:
                if status.cancel_requested:
                    self._end(run, JobState.CANCELLED, "cancelled by user")
                continue
            rec = self.store.get(jid) if status.state is JobState.PENDING else None  # a new job's spec, read once
            if rec is not None and not self._refused_trainer(rec.id, rec.spec):
                self.runs[rec.id] = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples,
                                           owner=(rec.owner_uid, rec.owner_gid))
                self._register(rec.id)
                self._changed = True
        for run in list(self.runs.values()):
            if not run.state.terminal and run.id not in live:  # cancelled while queued
                rec = self.store.get(run.id)
                if rec is not None and rec.state.terminal:
                    self._end(run, rec.state, rec.message or "ended in the store")

    def _refused_trainer(self, job_id: str, spec: JobSpec) -> bool:
        """A job that reached the store without the daemon (CLI, no daemon running) naming a trainer
        this daemon does not have: FAILED, with the reason."""
        why = self.unknown_trainer(spec)
        if why is None:
            return False
        try:
            self.store.set_state(job_id, JobState.FAILED, why)
            self.store.set_nodes(job_id, [])  # workers an earlier daemon ran for it: stopped as nobody's
        except StoreError as exc:  # e.g. cancelled a moment ago
            log.warning("%s", exc, extra=about(job=job_id))
        self.store.log_event("trainer_unknown", job_id, trainer=spec.trainer)
        return True

    # ---------------------------------------------------------------- decide
    def _hold_idle_nodes(self) -> None:
        """A scavenger holds every idle node some trainer can use (pilots are preemptable: no cost to
        the main queue), never one the main scheduler planned for a pending job, and nothing while the
        last look is stale."""
        self.scav.hold_idle(self.clock(), wanted=lambda node: self.node_trainer(node) is not None)

    def view(self, now: float, trainer: str | None = None) -> View:
        """What one trainer's policy decides on (default: the first trainer's): its held usable
        nodes, its live jobs (the daemon's targets)."""
        name = trainer or next(iter(self.trainers))
        usable = {n for n in self.usable_nodes() if self.node_trainer(n) == name}
        jobs = []
        taken: set[str] = set()
        for run in sorted(self.runs.values(), key=lambda r: r.id):
            if run.state.terminal or run.ending is not None or self.trainer_name(run.spec) != name:
                continue
            nodes = tuple(n for n in run.target if n in usable and n not in taken)[: run.spec.max_nodes]
            taken.update(nodes)
            spec = run.spec
            jobs.append(JobView(run.id, spec.min_nodes, spec.max_nodes, nodes, order=_order(run.id),
                                last_interrupted=run.last_interrupted,
                                scaling=dict(spec.scaling) if spec.scaling else None,
                                profile=bool(spec.profile),
                                work_left=None if spec.samples is None else float(max(0, spec.samples - run.last_progress)),
                                budget_node_hours=spec.budget_node_hours,
                                used_node_hours=self.used_node_hours(run.id),
                                deadline=spec.deadline))
        free = tuple(sorted(usable - taken))
        return View(now, free, tuple(jobs),
                    idle_since={n: self._idle_since[n] for n in free if n in self._idle_since},
                    ended_fragments=tuple(self._ended_fragments.get(name, ())),
                    **view_extras(View, {n: t for n, t in self.scav.recall_times().items() if n in usable}))

    def used_node_hours(self, job_id: str) -> float:
        """Node-hours the job's workers have held, as this daemon (and the ones before it) counted them."""
        return self._node_seconds.get(job_id, 0.0) / 3600.0

    def _count_node_seconds(self, now: float) -> None:
        """Each live job's workers (members and joining ones) held their nodes since the last step."""
        last, self._counted_at = self._counted_at, now
        if last is None or now <= last:
            return
        for run in self.runs.values():
            if run.workers and not run.state.terminal:
                self._node_seconds[run.id] = self._node_seconds.get(run.id, 0.0) + len(run.workers) * (now - last)

    def _load_node_seconds(self) -> dict[str, float]:
        try:
            data = json.loads(self.store.get_meta(NODE_SECONDS_KEY) or "{}")
            return {str(k): float(v) for k, v in data.items() if float(v) >= 0}
        except (ValueError, TypeError, AttributeError) as exc:  # a bad record: start the count again, say so
            self.store.log_event("node_seconds_unreadable", error=str(exc))
            return {}

    def _save_node_seconds(self) -> None:
        """The live jobs' counts to the store meta (at most once a second, from :meth:`_sample`)."""
        live = {k: v for k, v in self._node_seconds.items() if k in self.runs}
        self._node_seconds = {k: self._node_seconds[k] for k in live}
        if live != self._saved_node_seconds:
            self.store.set_meta(NODE_SECONDS_KEY, json.dumps(live, sort_keys=True))
            self._saved_node_seconds = live

    def _track_idle(self, now: float) -> None:
        """Since when each usable node is ours; a node that went ends an idle fragment of that length."""
        usable = self.usable_nodes()
        gone = self._idle_since.keys() - usable  # (set operations: 4,608 nodes each step; a pass only when one went)
        for node in [n for n in self._idle_since if n in gone] if gone else []:
            frags = self._ended_fragments.setdefault(self.node_trainer(node), [])
            frags.append(max(0.0, now - self._idle_since.pop(node)))
            del frags[:-1024]  # a policy that never decides (stale looks) keeps only the newest
        for node in usable - self._idle_since.keys():
            self._idle_since[node] = now

    def evidence(self, trainer: str | None = None) -> dict[str, JobEvidence]:
        """What the monitor measured, per live job of ``trainer`` (default: the first): rates per count
        and the rescale pauses."""
        name = trainer or next(iter(self.trainers))
        out: dict[str, JobEvidence] = {}
        for run in self.runs.values():
            stats = self.monitor.jobs.get(run.id)
            if stats is not None and not run.state.terminal and self.trainer_name(run.spec) == name:
                out[run.id] = evidence_from(stats.throughput.estimates(), run.rescales)
        return out

    def _decide(self, now: float) -> None:
        """Each trainer's policy decides on its own view; every decision is carried out."""
        if self._stopped_profiles:
            self._restart_stopped_profiles()
        for trainer in self.trainers.values():
            self._decide_trainer(trainer, now)
        self._save_policy_states()

    def _decide_trainer(self, trainer: Trainer, now: float) -> None:
        t0 = time.perf_counter()
        try:
            decision = trainer.policy.decide(self.view(now, trainer.name), self.evidence(trainer.name))
            self.metrics.observe_decision(time.perf_counter() - t0)
        except PolicyInputError as exc:  # a bug of ours, not a reason to stop: log it, try again later
            log.error("policy of trainer %s refused the view: %s", trainer.name, exc)
            self.store.log_event("decide_error", error=str(exc), trainer=trainer.name)
            return
        self._ended_fragments.pop(trainer.name, None)  # the policy has learned them
        trainer.last_decision = decision
        trainer.profiling = frozenset(decision.profiling)
        self._apply_decision(decision, now, trainer.name)

    def _save_policy_states(self) -> None:
        state = policy_states_json(self.trainers)
        if state != self._saved_policy_state:
            self.store.set_meta(POLICY_STATE_KEY, state)
            self._saved_policy_state = state

    def _apply_decision(self, decision: Decision, now: float, trainer: str) -> None:
        """``trainer``'s decision: its jobs' targets, waiting reasons and the policy's events."""
        for ev in decision.events:
            detail = {k: v for k, v in ev.detail.items()}
            self.store.log_event(ev.kind.value, ev.job, **detail)
            if ev.kind in (EventKind.REFINED, EventKind.PROFILE_DONE, EventKind.PROFILE_ABORTED):
                points = detail.get("points", detail.get("measured", {}))
                for n, rate in dict(points).items():  # type: ignore[call-overload]
                    self.store.record_scaling(ev.job, int(n), float(rate))
            if ev.kind is EventKind.LENT and ev.job in self.runs:
                self.runs[ev.job].last_interrupted = now
        for run in self.runs.values():
            if run.state.terminal or self.trainer_name(run.spec) != trainer:
                continue
            new = list(decision.nodes_of(run.id))
            if set(new) != set(run.target):  # a permutation of the same nodes is no change
                self.store.log_event("plan", run.id, nodes=new, before=run.target)
                run.last_interrupted = now  # as the simulator counts it: any change of nodes (lender order)
                run.target = [n for n in run.target if n in set(new)] + [n for n in new if n not in set(run.target)]
            run.waiting = decision.waiting.get(run.id, "")
        for job_id, why in getattr(decision, "stop", {}).items():
            run = self.runs.get(job_id)
            if run is not None and not run.state.terminal and self.trainer_name(run.spec) == trainer:
                self._end(run, *self._stop_reason(run, why))
        if decision.wake_at is not None:
            self._next_decide = min(self._next_decide, decision.wake_at)

    def _stop_reason(self, run: JobRun, why: str) -> tuple[JobState, str]:
        """The state and message of a job the policy stops (``Decision.stop``).

        CANCELLED, not FAILED: the job did nothing wrong; it reached a limit its user set, which
        is the user cancelling it at that point, decided in advance. FAILED stays what the
        job's own command did (``max_failures`` and alerting on FAILED keep meaning a broken job),
        and COMPLETED would claim it trained what it was asked to. The message says it was the
        budget and by how much, so ``malletrain status`` tells it apart from a user's cancel.
        """
        budget = run.spec.budget_node_hours
        if budget is not None and "budget" in why:
            return JobState.CANCELLED, f"over budget: used {self.used_node_hours(run.id):.4g} of {budget:.4g} node-hours"
        return JobState.CANCELLED, f"stopped by the policy: {why}"

    # ---------------------------------------------------------------- act
    def _end(self, run: JobRun, state: JobState, reason: str) -> None:
        """Observe's way to end a job: recorded now, carried out by act (the first reason wins)."""
        if run.ending is None and not run.state.terminal:
            run.ending = (state, reason)
            self._changed = True

    def _act(self, now: float) -> None:
        for run in list(self.runs.values()):
            if run.ending is not None:
                self._finish(run, *run.ending)
        self.scav.release(self._to_release)
        self._to_release.clear()
        usable = self.usable_nodes()
        for run in list(self.runs.values()):
            if run.state.terminal:
                continue
            run.target = [n for n in run.target if n in usable]
            if len(run.target) < run.spec.min_nodes:
                if run.members or run.workers or run.state.active:
                    self._suspend(run, now, "below min_nodes")
                run.target = []
                continue
            try:
                self._act_job(run, now)
            except ValueError as exc:  # e.g. the runtime refuses the job's command or ids
                self._finish(run, JobState.FAILED, f"cannot run: {exc}")
        for run in self.runs.values():
            for wid, (node, kill_at) in list(run.leaving.items()):
                if now >= kill_at:
                    self.hub.stop_worker(node, wid, grace=1.0)
                    run.leaving[wid] = (node, now + 5.0)

    def _act_job(self, run: JobRun, now: float) -> None:
        for node in run.target:
            if node not in run.workers:
                self._worker_seq += 1
                run.workers[node] = f"{run.id}.{node}.{int(now * 1000) % 10**9}{self._worker_seq}"
            wid = run.workers[node]
            if wid not in run.started and now - run.start_sent.get(wid, -1e9) >= START_RETRY_S:
                uid, gid = self._run_as(run, getattr(self.runtime, "COMMAND_BESIDE_DAEMON", False))
                spec = self.runtime.launch_spec(run.id, run.spec.command, wid, node)
                env = dict(spec.env)
                env.update(run.spec.env)
                env[ENV_SECRET] = self.job_secret(run.id)  # after the user's env: not overridable
                self.hub.start_worker(node, wid, spec.argv, env, spec.cwd or run.spec.cwd, uid, gid)
                run.start_sent[wid] = now
        target = set(run.target)  # (list lookups: 64 x 64 a job, every step)
        for node in [n for n in run.workers if n not in target]:
            wid = run.workers.pop(node)
            run.leaving[wid] = (node, now + LEAVE_GRACE_S)
        # a member whose worker changed (it died and another took its place) is joining again
        published_ids = set(run.published)
        kept = [n for n in run.members if n in target and run.workers.get(n) in published_ids]
        kept_set = set(kept)
        joining = [n for n in run.target if n not in kept_set]
        ready = all(self._ready(run, run.workers[n]) for n in joining)
        members = kept + joining if ready else kept
        if members and len(members) < run.spec.min_nodes:
            members = []
        changed = members != run.members or tuple(run.workers[n] for n in members) != run.published
        if changed and (members or run.members):
            self._publish(run, members, now)
        want = JobState.PROFILING if run.id in self._profiling else JobState.RUNNING
        if run.members and set(run.members) == target:
            self._set_state(run, want, "placed")
        elif run.members:
            self._set_state(run, JobState.RESCALING, f"to {len(run.target)} nodes")

    @staticmethod
    def _run_as(run: JobRun, beside_daemon: bool = False) -> tuple[int | None, int | None]:
        """A root daemon runs each job as its owner (agents switch users); any other daemon
        runs every job as its own user, which is then the only user whose jobs it takes.
        ``beside_daemon``: the runtime runs the job's command in a process of the daemon's own
        (Horovod's driver), which cannot switch users: a root daemon runs only root's jobs so."""
        if os.geteuid() != 0:
            return None, None
        if run.owner[0] is None:  # a row of the old schema: never run as root by default
            raise ValueError("the job has no recorded owner (submitted before owners were stored); "
                             "a root daemon does not run it as root: resubmit it as its user")
        if beside_daemon and run.owner[0] != 0:
            raise ValueError(f"this runtime runs the job's command beside the daemon, as root; a root daemon runs "
                             f"only root's jobs with it (uid {run.owner[0]}: use a daemon of your own)")
        return run.owner

    def _ready(self, run: JobRun, wid: str) -> bool:
        if wid not in run.started:
            return False
        ready = getattr(self.runtime, "ready", None)
        if ready is None:
            return True
        try:
            return bool(ready(run.id, wid))
        except Exception as exc:  # a runtime hiccup must not kill the loop
            log.warning("runtime.ready(%s, %s): %s", run.id, wid, exc, extra=about(job=run.id, worker=wid))
            return False

    def _publish(self, run: JobRun, members: list[str], now: float) -> None:
        gen = self.runtime.set_members(run.id, [run.workers[n] for n in members])
        self.store.set_generation(run.id, gen)
        self.store.log_event("members", run.id, generation=gen, nodes=members, before=run.members)
        run.members = list(members)
        run.published = tuple(run.workers[n] for n in members)
        self.store.set_nodes(run.id, members)

    def _suspend(self, run: JobRun, now: float, reason: str) -> None:
        self._stop_workers(run, now)
        run.target = []
        if run.state.active:
            self._set_state(run, JobState.SUSPENDED, reason)
        self._changed = True

    def _stop_workers(self, run: JobRun, now: float) -> None:
        run.emptied_at = now
        if run.members:
            try:
                gen = self.runtime.set_members(run.id, [])  # members leave at their next commit ...
                self.store.set_generation(run.id, gen)
                self.runtime.forget(run.id)  # ... and workers started later wait for a new list
            except Exception as exc:
                log.warning("runtime.set_members(%s, []): %s", run.id, exc, extra=about(job=run.id))
            run.members = []
        run.published = ()
        for node, wid in run.workers.items():
            self.hub.stop_worker(node, wid, grace=2.0)
            run.leaving[wid] = (node, now + 5.0)
        run.workers.clear()
        self.store.set_nodes(run.id, [])

    def _finish(self, run: JobRun, state: JobState, reason: str) -> None:
        if run.state.terminal:
            return
        self.store.set_samples(run.id, run.last_progress)  # status shows what was trained, not the last 1-s sample
        if run.id in self._node_seconds:
            self.store.log_event("node_hours", run.id, used=round(self.used_node_hours(run.id), 6))
        self._stop_workers(run, self.clock())
        self._set_state(run, state, reason)
        self.monitor.forget(run.id)
        try:
            self.runtime.forget(run.id, keep_state=False)
        except Exception as exc:
            log.warning("runtime.forget(%s): %s", run.id, exc, extra=about(job=run.id))
        self._changed = True

    def _set_state(self, run: JobRun, state: JobState, reason: str) -> None:
        if run.state == state:
            return
        try:
            self.store.set_state(run.id, state, reason)
        except StoreError as exc:  # e.g. cancelled by the CLI a moment ago
            log.warning("%s", exc, extra=about(job=run.id))
            rec = self.store.get(run.id)
            if rec is not None:
                run.state = rec.state
            return
        log.info("job %s: %s -> %s (%s)", run.id, run.state.value, state.value, reason, extra=about(job=run.id))
        self.metrics.observe_state(state)
        run.state = state

    def _sample(self, now: float) -> None:
        if now < self._next_sample:
            return
        self._next_sample = now + 1.0
        self._save_node_seconds()
        states = self.scav.node_states()
        held = [n for n, s in states.items() if s in ("held", "holding")]
        used = {n for r in self.runs.values() for n in r.members}
        self.store.log_event(
            "nodes", idle=len(held) + sum(s == "idle" for s in states.values()), held=len(held), used=len(used),
            jobs={r.id: len(r.members) for r in self.runs.values() if r.members},
        )
        self.metrics.observe_nodes(sum(s == "idle" for s in states.values()), len(held), len(used))
        self.metrics.observe_runs(self.runs.values(), self.monitor)
        self.metrics.observe_monitor(self.monitor)
        for rid in [rid for rid, r in self.runs.items() if r.state.terminal and not r.leaving]:
            del self.runs[rid]

    # ---------------------------------------------------------------- control API
    def _serve_control(self) -> None:
        self.control.serve(0)

    def _register(self, job_id: str) -> None:
        """The monitor takes this job's reports, signed with its secret, and no more progress than
        its max_nodes could train."""
        rec = self.store.get(job_id)
        self.monitor.register(job_id, self.job_secret(job_id), max_nodes=rec.spec.max_nodes if rec else None)

    def job_secret(self, job_id: str) -> str:
        """The job's report-signing secret, derived from the daemon's private key (nothing stored per job)."""
        return job_secret(self._monitor_key, job_id)

    def _owner_of(self, job_id: str) -> int | None:
        rec = self.store.get(job_id)
        if rec is None:
            return None
        owner = getattr(rec, "owner_uid", None)
        return int(owner) if owner is not None else os.geteuid()

    def handle(self, req: Request, caller: Caller) -> dict[str, Any]:
        """One authorised control request (``control.authorize`` has checked who may do it)."""
        if isinstance(req, Submit):
            spec = parse_spec(req.spec, "submitted job").resolved(where="submitted job")  # `python` -> this Python
            why = self.unknown_trainer(spec)
            if why is not None:
                raise JobSpecError(f"submitted job: {why}")
            jid = self._submit(spec, req.owner_uid, req.owner_gid)
            self._observe_store(self.clock())
            return {"ok": True, "id": jid}
        if isinstance(req, Cancel):
            state = self.store.request_cancel(req.job)
            self._observe_store(self.clock())
            return {"ok": True, "id": req.job, "state": self.store.require(req.job).state.value, "was": state.value}
        if isinstance(req, Status):
            return {"ok": True, "jobs": self.status_jobs(), "nodes": self.status_nodes()}
        if isinstance(req, Nodes):
            return {"ok": True, "nodes": self.status_nodes()}
        if isinstance(req, Shutdown):
            self.stopping = True
            return {"ok": True}
        assert isinstance(req, Ping)
        return {"ok": True, "pid": os.getpid()}

    def _submit(self, spec: JobSpec, owner_uid: int, owner_gid: int) -> str:
        try:
            return self.store.submit(spec, owner_uid=owner_uid, owner_gid=owner_gid)  # type: ignore[call-arg]
        except TypeError:  # a store without owners (older schema)
            return self.store.submit(spec)

    def status_jobs(self) -> list[dict[str, Any]]:
        out = []
        for rec in self.store.jobs():
            d = rec.as_dict()
            d["trainer"] = self.trainer_name(rec.spec)
            if rec.spec.budget_node_hours is not None:
                d["budget_node_hours"] = rec.spec.budget_node_hours
                if rec.id in self._node_seconds:
                    d["used_node_hours"] = self.used_node_hours(rec.id)
            if rec.spec.deadline is not None:
                d["deadline"] = rec.spec.deadline
            run = self.runs.get(rec.id)
            stats = self.monitor.jobs.get(rec.id)
            if run is not None:
                d["samples"] = max(d["samples"], run.last_progress)
                d["nodes"] = list(run.members)
                if run.waiting:
                    d["waiting"] = run.waiting
            if stats is not None and stats.world_size and d["nodes"]:
                est = stats.throughput.estimate(stats.world_size)
                d["rate"] = est.rate if est else None
            out.append(d)
        return out

    def status_nodes(self) -> list[dict[str, Any]]:
        owner = {n: r.id for r in self.runs.values() for n in r.members}
        return [{"node": node, "state": state, "job": owner.get(node, ""), "trainer": self.node_trainer(node) or ""}
                for node, state in self.scav.node_states().items()]

    # ---------------------------------------------------------------- restarts
    def _persist_checkpoints(self) -> None:
        """Copy new checkpoints from the runtime's store to the state dir (a runtime hook, optional)."""
        persist = getattr(self.runtime, "persist_checkpoints", None)
        if persist is None:
            return
        for job in persist([r.id for r in self.runs.values() if not r.state.terminal]):
            self.store.log_event("checkpoint_saved", job)

    def _restart_stopped_profiles(self) -> None:
        """Profiles that a clean stop interrupted start over (``PolicyState.restart_profile`` says why)."""
        for job in self._stopped_profiles:
            run = self.runs.get(job)
            if run is None:
                continue
            count = self._trainer_of(run).policy.state.restart_profile(job)
            if count is not None:
                self.store.log_event("profile_restarted", job, reason=STOPPED, count=count)
        self._stopped_profiles = []

    def _stop_for_restart(self, now: float) -> None:
        """A clean stop: every job's workers go, leaving nothing behind that a restart needs.

        The workers are told to leave (an empty generation) and stopped, then
        waited for (at most :data:`STOP_WAIT_S`) while the daemon still serves the
        rendezvous and the monitor: rank 0 leaves its last commit in the store on
        the way out, which goes to the state dir, and the last reports are read.

        Progress: the stored count is what the workers reported, flushed after
        they exited, so it is never behind what they trained and committed. It can
        be ahead by the steps after the last commit (reported, then rolled back by
        the stop and trained again after the restart): at most one commit
        interval. The other choice, the samples counter in the checkpoint, would
        make the daemon read its users' checkpoints and trust a counter a script
        need not keep in the units it reports; and a job whose rank 0 was killed
        before it could leave a checkpoint would lose everything it reported.
        """
        stopping = []
        for run in self.runs.values():
            if not run.state.terminal and (run.members or run.workers):
                before = set(run.leaving)
                self._stop_workers(run, now)
                stopping += [(run, wid) for wid in run.leaving if wid not in before]
                if run.state.active:
                    self._set_state(run, JobState.SUSPENDED, STOPPED)
        if not stopping:
            return
        deadline = time.monotonic() + STOP_WAIT_S
        while any(wid in run.leaving for run, wid in stopping) and time.monotonic() < deadline:
            for ev in self.hub.poll():
                if isinstance(ev, WorkerExitedEvent):
                    run = self.runs.get(_job_of(ev.worker))
                    if run is not None:
                        run.leaving.pop(ev.worker, None)
                elif isinstance(ev, AgentGone):
                    for run, wid in stopping:
                        if run.leaving.get(wid, ("",))[0] == ev.node:
                            run.leaving.pop(wid, None)
            self.monitor.drain(timeout_ms=50)
            self._persist_checkpoints()
        while self.monitor.drain(timeout_ms=100):  # reports still on their way from the exited workers
            pass
        self._observe_progress(self.clock())  # stores what the last reports added
        self._persist_checkpoints()

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop every job's workers (see :meth:`_stop_for_restart`), release every node, close
        sockets; idempotent. The jobs it stops are SUSPENDED ("daemon stopped") and resume
        when a daemon runs again on the same state dir."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        now = self.clock()
        for run in list(self.runs.values()):
            if run.ending is not None:  # observed but not yet carried out
                self._finish(run, *run.ending)
        self._count_node_seconds(now)
        self._stop_for_restart(now)
        self._save_node_seconds()
        self.scav.close()
        self.runtime.close()
        self.store.log_event("daemon_stop", pid=os.getpid())
        self.replay.save()
        self.metrics.close()
        for sock in (self.monitor, self.hub):
            sock.close()
        self.control.close()
        self.ctx.term()
        self.store.close()
        try:
            (self.state_dir / STATE_FILE).unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)


def _order(job_id: str) -> int:
    """Submission order from the store's id (``j000042`` -> 42)."""
    digits = "".join(c for c in job_id if c.isdigit())
    return int(digits) if digits else 0


def _job_of(worker_id: str) -> str:
    return worker_id.split(".", 1)[0]


def _port_holder(port: int) -> str:
    """`` (pid P, NAME, user U)`` of the process listening on TCP ``port``, when this user may see it."""
    import psutil

    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                if conn.pid is None:
                    return " (by a process of another user)"
                proc = psutil.Process(conn.pid)
                return f" (by pid {conn.pid}, {proc.name()}, user {proc.username()})"
    except (psutil.Error, OSError):
        pass
    return ""


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])
