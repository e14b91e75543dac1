"""The daemon: ONE reconcile loop, observe -> decide -> act.

observe
    backend events (nodes idle, recalled, pilots gone), node agents (up, gone,
    worker started/exited), the job monitor (progress, throughput, rescale
    pauses), the store (jobs submitted or cancelled by the CLI, even while the
    daemon was down) and control requests.
decide
    only calls the policy (:class:`policy.Policy`, the same code the simulator
    replays): the view (held usable nodes, every live job in submission order)
    and the monitor's evidence go in; the decision (admitted jobs and their
    nodes, waiting reasons, profiling counts) comes out and becomes each job's
    target. The policy's state is saved in the store after every decision that
    changed it, so a restart resumes profiles and lender debts. Decisions
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

Optional runtime hooks (looked up with ``getattr``): ``ready(job, worker)``
(a worker started ahead is ready to join), ``resume_generation(job, gen)``
(numbering goes on after a restart) and ``readopt(job, command, workers)``
(take over a job an earlier daemon ran, e.g. a Horovod driver).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from malletrain.config import ConfigError, DaemonConfig
from malletrain.jobspec import JobSpec, JobState, parse_spec
from malletrain.control import Caller, Cancel, ControlServer, Nodes, Ping, Request, Shutdown, Status, Submit
from malletrain.control import admin_gids_from, socket_path
from malletrain.messages import ENV_SECRET
from malletrain.monitor import Monitor, job_secret, load_master_key
from malletrain.runtimes import Runtime
from malletrain.store import Store, StoreError
from policy import Decision, EventKind, JobEvidence, JobView, Policy, PolicyConfig, PolicyState, PolicyStateError, View
from policy import PolicyInputError, evidence_from
from profiler.estimators import RescaleEvent
from scavenger.base import AgentGone, AgentUp, NodeIdle, NodeRecalled
from scavenger.hub import AgentHub, AgentWorkers, WorkerExitedEvent, WorkerStartedEvent
from scavenger.local import LocalBackend, slot_timeline
from traces.model import IdleTimeline

log = logging.getLogger("malletrain.daemon")

STATE_FILE = "daemon.json"
STORE_FILE = "store.db"
LEAVE_GRACE_S = 5.0  # a dropped worker leaves at its next commit; killed after this
START_RETRY_S = 3.0
REPLAN_S = 10.0  # decide at least this often (estimates drift), besides every event
POLICY_STATE_KEY = "policy_state"


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
class JobRun:
    """The daemon's in-memory view of a non-terminal job."""

    id: str
    spec: JobSpec
    state: JobState
    base_samples: int = 0  # progress stored before this daemon started
    target: list[str] = field(default_factory=list)  # nodes the last decision gave it
    members: list[str] = field(default_factory=list)  # nodes of the published member list
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
    ending: tuple[JobState, str] | None = None  # observed: it ends (act makes it so), and why


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

        return TorchRuntime(host="127.0.0.1", port=rendezvous_port, monitor=monitor_address,
                            store_grace_s=cfg.store_grace)
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
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.state_dir / "daemon.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DaemonError(f"another daemon runs on state dir {self.state_dir}") from None
        self.ctx = zmq.Context()
        try:
            self._open(cfg)
        except BaseException:
            self.ctx.destroy(linger=0)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            raise

    def _open(self, cfg: DaemonConfig) -> None:
        self.store = Store.open(self.state_dir / STORE_FILE, clock=self.clock)
        ports = self._ports()
        parts = self.parts
        self.monitor = parts.monitor or Monitor(self._bind(ports["monitor"], "monitor"), ctx=self.ctx)
        self.hub = parts.hub or AgentHub(
            self._bind(ports["agents"], "agents"), dead_after_s=cfg.agent_dead_after, ctx=self.ctx, clock=self.clock
        )
        self._monitor_key = load_master_key(self.state_dir / "monitor.key")
        self.control = ControlServer(socket_path(self.state_dir), self.handle,
                                     admin_gids=admin_gids_from(list(getattr(cfg, "admin_groups", ()) or ())),
                                     owner_of=self._owner_of, shared=os.geteuid() == 0)
        self.control_address = str(self.control.path)
        self.runtime = parts.runtime or make_runtime(cfg, self.monitor.address, ports["rendezvous"])
        if hasattr(self.runtime, "job_env"):  # runtimes that spawn workers themselves (Horovod's driver)
            self.runtime.job_env = lambda job_id: {ENV_SECRET: self.job_secret(job_id)}
        self.runtime.start()
        self.store.set_meta("ports", json.dumps({
            "monitor": _port(self.monitor.address), "agents": _port(self.hub.address),
            "rendezvous": int(getattr(self.runtime, "port", 0) or 0),
        }))
        self.backend = parts.backend or self._make_backend()
        self.store.set_machine_nodes(len(self.backend.nodes))  # `submit` refuses jobs bigger than the machine
        self.runs: dict[str, JobRun] = {}
        self.stopping = False
        self._changed = True
        self._next_sample = 0.0
        self._next_decide = 0.0
        self._profiling: set[str] = set()
        self._to_release: set[str] = set()
        self.last_decision: Decision | None = None
        self.policy, self._saved_policy_state = self._load_policy()
        self._next_persist = 0.0
        self._worker_seq = 0
        now = self.clock()
        self._adopt_until = 0.0
        self._load_jobs(now)
        self._write_state_file()
        self.store.log_event("daemon_start", pid=os.getpid(), control=self.control_address)

    # ---------------------------------------------------------------- setup
    def _ports(self) -> dict[str, int]:
        stored = json.loads(self.store.get_meta("ports") or "{}")
        cfgp = self.cfg.ports
        return {
            k: getattr(cfgp, k) or int(stored.get(k, 0)) for k in ("monitor", "agents", "rendezvous")
        }

    def _bind(self, port: int, what: str) -> str:
        if port:
            probe = self.ctx.socket(zmq.PULL)
            try:
                probe.bind(f"tcp://127.0.0.1:{port}")
                probe.close(0)
                time.sleep(0.01)
                return f"tcp://127.0.0.1:{port}"
            except zmq.ZMQError:
                probe.close(0)
                log.warning("%s port %d is busy; picking another", what, port)
        return "tcp://127.0.0.1:0"

    def _make_backend(self) -> LocalBackend:
        cfg = self.cfg
        stored = self.store.get_meta("local_epoch")
        epoch = float(stored) if stored else self.clock()
        if not stored:
            self.store.set_meta("local_epoch", repr(epoch))
        timeline = load_timeline(cfg)
        logs = str(self.state_dir / "logs")
        return LocalBackend(
            cfg.local.nodes, self.hub.address, timeline, cfg.local.time_scale, epoch=epoch, clock=self.clock,
            agent_args=("--heartbeat", f"{cfg.agent_heartbeat:g}", "--dead-after", f"{cfg.agent_dead_after:g}"),
            log_dir=logs,
        )

    def _load_jobs(self, now: float) -> None:
        resume = getattr(self.runtime, "resume_generation", None)
        for rec in self.store.jobs():
            if rec.state.terminal:
                continue
            gen = self.store.generation(rec.id)
            if gen and resume is not None:
                resume(rec.id, gen)  # numbering never goes backwards: old workers may still run
            run = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples)
            self._register(rec.id)
            run.last_progress = rec.samples
            if rec.state.active:
                run.target = list(rec.nodes)
                run.adopted = True
                self._adopt_until = now + self.cfg.agent_dead_after + 1.0
            self.runs[rec.id] = run

    def _load_policy(self) -> tuple[Policy, str | None]:
        """The policy with the state the last daemon saved (profiles, debts, learned curves)."""
        cfg: PolicyConfig = getattr(self.cfg, "policy", None) or PolicyConfig()
        saved = self.store.get_meta(POLICY_STATE_KEY)
        if saved is None:
            return Policy(cfg), None
        try:
            return Policy(cfg, PolicyState.from_json(saved)), saved
        except PolicyStateError as exc:
            raise DaemonError(f"{self.state_dir / STORE_FILE}: {exc}") from None

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
            try:
                self.step()
            except (OSError, RuntimeError, ValueError, KeyError, zmq.ZMQError, sqlite3.Error) as exc:
                # the daemon never dies of one bad input; the event log keeps the reason
                log.exception("reconcile step failed")
                self.store.log_event("step_error", error=f"{type(exc).__name__}: {exc}")
            if on_tick is not None:
                on_tick(self)
            spare = self.cfg.loop_interval - (time.monotonic() - t0)
            if spare > 0:
                self.monitor.drain(timeout_ms=int(spare * 1000))

    def step(self) -> None:
        now = self.clock()
        self._observe_backend(now)
        self._observe_agents(now)
        self.monitor.drain()
        self._observe_progress(now)
        self._observe_store(now)
        self._serve_control()
        if now < self._adopt_until:
            return  # agents may still reconnect with the workers of the last daemon
        if self._adopt_until:
            self._finish_adoption(now)
        self._hold_idle_nodes()
        # a profile's step ends on evidence: while one runs, ask at every iteration (the policy
        # answers an unchanged problem without solving)
        if self._changed or now >= self._next_decide or self._profiling:
            self._changed = False
            self._next_decide = now + REPLAN_S
            self._decide(now)
        self._act(now)
        self._sample(now)

    # ---------------------------------------------------------------- observe
    def usable_nodes(self) -> set[str]:
        """Held nodes whose agent is connected."""
        return self.backend.held_nodes() & self.hub.alive()

    def _observe_backend(self, now: float) -> None:
        for ev in self.backend.poll():
            if isinstance(ev, NodeIdle):
                self.store.log_event("node_idle", node=ev.node)
            elif isinstance(ev, NodeRecalled):
                self.store.log_event("node_recalled", node=ev.node, held=ev.held)
                if ev.held:
                    self._node_lost(ev.node, now, "recalled")
            elif isinstance(ev, AgentGone):
                self._node_lost(ev.node, now, ev.reason)

    def _observe_agents(self, now: float) -> None:
        for ev in self.hub.poll():
            if isinstance(ev, AgentUp):
                self.backend.agent_up(ev.node, self.hub.pid(ev.node))
                self.store.log_event("agent_up", node=ev.node)
                self._changed = True
            elif isinstance(ev, AgentWorkers):
                self.backend.agent_up(ev.node, ev.pid)
                self._adopt_workers(ev.node, ev.workers)
            elif isinstance(ev, AgentGone):
                self.store.log_event("agent_gone", node=ev.node, reason=ev.reason)
                self._node_lost(ev.node, now, ev.reason)
                if ev.node in self.backend.held_nodes():
                    self._to_release.add(ev.node)  # act releases it: observe only records
            elif isinstance(ev, WorkerStartedEvent):
                run = self.runs.get(_job_of(ev.worker))
                if run is not None:
                    run.started.add(ev.worker)
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

    def _finish_adoption(self, now: float) -> None:
        self._adopt_until = 0.0
        readopt = getattr(self.runtime, "readopt", None)  # optional: runtimes with daemon-side state
        for run in self.runs.values():
            if not run.adopted:
                continue
            run.adopted = False
            run.target = [n for n in run.target if n in run.workers]
            run.members = []  # republish: the runtime may be new
            if readopt is not None:
                try:
                    readopt(run.id, run.spec.command, {wid: node for node, wid in run.workers.items()})
                except (OSError, ValueError, RuntimeError) as exc:
                    log.warning("runtime.readopt(%s): %s", run.id, exc)
                    self.store.log_event("readopt_error", run.id, error=str(exc))
            if len(run.target) < run.spec.min_nodes:
                self._suspend(run, now, "not re-adopted after a daemon restart")
                try:
                    self.runtime.forget(run.id)  # e.g. a driver the last daemon left running
                except Exception as exc:
                    log.warning("runtime.forget(%s): %s", run.id, exc)
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
        del run.workers[ev.node]
        if ev.code == 0 and ev.node in run.members:
            self._end(run, JobState.COMPLETED, f"worker {ev.worker} exited 0")
            return
        run.failures += 1
        if ev.node in run.target:
            run.target.remove(ev.node)
        self.store.log_event("worker_failed", run.id, worker=ev.worker, code=ev.code, failures=run.failures)
        if run.failures >= self.cfg.max_failures:
            self._end(run, JobState.FAILED, f"{run.failures} workers failed without progress; last {ev.worker} exit {ev.code}")
        self._changed = True

    def _observe_progress(self, now: float) -> None:
        persist = now >= self._next_persist
        if persist:
            self._next_persist = now + 1.0
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
                if kind != "resume":
                    run.rescales.append(ev)
                    self._changed = True
            if persist:
                self.store.set_samples(run.id, progress)
            target = run.spec.samples
            if target is not None and progress >= target:
                self.store.set_samples(run.id, progress)
                self._end(run, JobState.COMPLETED, f"trained {progress} of {target} samples")

    def _observe_store(self, now: float) -> None:
        """New jobs and cancels written by the CLI (directly into the store)."""
        live = {rec.id: rec for rec in self.store.jobs([s for s in JobState if not s.terminal])}
        for rec in live.values():
            run = self.runs.get(rec.id)
            if run is None and rec.state is JobState.PENDING:
                self.runs[rec.id] = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples)
                self._register(rec.id)
                self._changed = True
            elif run is not None and rec.cancel_requested:
                self._end(run, JobState.CANCELLED, "cancelled by user")
        for run in list(self.runs.values()):
            if not run.state.terminal and run.id not in live:  # cancelled while queued
                rec = self.store.get(run.id)
                if rec is not None and rec.state.terminal:
                    self._end(run, rec.state, rec.message or "ended in the store")

    # ---------------------------------------------------------------- decide
    def _hold_idle_nodes(self) -> None:
        """A scavenger holds every idle node (pilots are preemptable: no cost to the main queue)."""
        for node in sorted(self.backend.idle_nodes()):
            self.backend.hold(node)

    def view(self, now: float) -> View:
        """What the policy decides on: held usable nodes, every live job (the daemon's targets)."""
        usable = self.usable_nodes()
        jobs = []
        taken: set[str] = set()
        for run in sorted(self.runs.values(), key=lambda r: r.id):
            if run.state.terminal or run.ending is not None:
                continue
            nodes = tuple(n for n in run.target if n in usable and n not in taken)[: run.spec.max_nodes]
            taken.update(nodes)
            jobs.append(JobView(run.id, run.spec.min_nodes, run.spec.max_nodes, nodes, order=_order(run.id),
                                last_interrupted=run.last_interrupted,
                                scaling=dict(run.spec.scaling) if run.spec.scaling else None,
                                profile=bool(run.spec.profile)))
        return View(now, tuple(sorted(usable - taken)), tuple(jobs))

    def evidence(self) -> dict[str, JobEvidence]:
        """What the monitor measured, per live job: rates per count and the rescale pauses."""
        out: dict[str, JobEvidence] = {}
        for run in self.runs.values():
            stats = self.monitor.jobs.get(run.id)
            if stats is not None and not run.state.terminal:
                out[run.id] = evidence_from(stats.throughput.estimates(), run.rescales)
        return out

    def _decide(self, now: float) -> None:
        try:
            decision = self.policy.decide(self.view(now), self.evidence())
        except PolicyInputError as exc:  # a bug of ours, not a reason to stop: log it, try again later
            log.error("policy refused the view: %s", exc)
            self.store.log_event("decide_error", error=str(exc))
            return
        self.last_decision = decision
        self._apply_decision(decision, now)

    def _apply_decision(self, decision: Decision, now: float) -> None:
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
            if run.state.terminal:
                continue
            new = list(decision.nodes_of(run.id))
            if set(new) != set(run.target):  # a permutation of the same nodes is no change
                self.store.log_event("plan", run.id, nodes=new, before=run.target)
                run.last_interrupted = now  # as the simulator counts it: any change of nodes (lender order)
                run.target = [n for n in run.target if n in set(new)] + [n for n in new if n not in set(run.target)]
            run.waiting = decision.waiting.get(run.id, "")
        self._profiling = set(decision.profiling)
        if decision.wake_at is not None:
            self._next_decide = min(self._next_decide, decision.wake_at)
        state = self.policy.state.to_json()
        if state != self._saved_policy_state:
            self.store.set_meta(POLICY_STATE_KEY, state)
            self._saved_policy_state = state

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
        for node in sorted(self._to_release):
            if node in self.backend.held_nodes():
                self.backend.release(node)
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
                spec = self.runtime.launch_spec(run.id, run.spec.command, wid, node)
                env = dict(spec.env)
                env.update(run.spec.env)
                env[ENV_SECRET] = self.job_secret(run.id)  # after the user's env: not overridable
                self.hub.start_worker(node, wid, spec.argv, env, spec.cwd or run.spec.cwd)
                run.start_sent[wid] = now
        for node in [n for n in run.workers if n not in run.target]:
            wid = run.workers.pop(node)
            run.leaving[wid] = (node, now + LEAVE_GRACE_S)
        kept = [n for n in run.members if n in run.target]
        joining = [n for n in run.target if n not in run.members]
        ready = all(self._ready(run, run.workers[n]) for n in joining)
        members = kept + joining if ready else kept
        if members and len(members) < run.spec.min_nodes:
            members = []
        if members != run.members and (members or run.members):
            self._publish(run, members, now)
        want = JobState.PROFILING if run.id in self._profiling else JobState.RUNNING
        if run.members and set(run.members) == set(run.target):
            self._set_state(run, want, "placed")
        elif run.members:
            self._set_state(run, JobState.RESCALING, f"to {len(run.target)} nodes")

    def _ready(self, run: JobRun, wid: str) -> bool:
        if wid not in run.started:
            return False
        ready = getattr(self.runtime, "ready", None)
        if ready is None:
            return True
        try:
            return bool(ready(run.id, wid))
        except Exception as exc:  # a runtime hiccup must not kill the loop
            log.warning("runtime.ready(%s, %s): %s", run.id, wid, exc)
            return False

    def _publish(self, run: JobRun, members: list[str], now: float) -> None:
        gen = self.runtime.set_members(run.id, [run.workers[n] for n in members])
        self.store.set_generation(run.id, gen)
        self.store.log_event("members", run.id, generation=gen, nodes=members, before=run.members)
        run.members = list(members)
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
                log.warning("runtime.set_members(%s, []): %s", run.id, exc)
            run.members = []
        for node, wid in run.workers.items():
            self.hub.stop_worker(node, wid, grace=2.0)
            run.leaving[wid] = (node, now + 5.0)
        run.workers.clear()
        self.store.set_nodes(run.id, [])

    def _finish(self, run: JobRun, state: JobState, reason: str) -> None:
        if run.state.terminal:
            return
        self.store.set_samples(run.id, run.last_progress)  # status shows what was trained, not the last 1-s sample
        self._stop_workers(run, self.clock())
        self._set_state(run, state, reason)
        self.monitor.forget(run.id)
        try:
            self.runtime.forget(run.id, keep_state=False)
        except Exception as exc:
            log.warning("runtime.forget(%s): %s", run.id, exc)
        self._changed = True

    def _set_state(self, run: JobRun, state: JobState, reason: str) -> None:
        if run.state == state:
            return
        try:
            self.store.set_state(run.id, state, reason)
        except StoreError as exc:  # e.g. cancelled by the CLI a moment ago
            log.warning("%s", exc)
            rec = self.store.get(run.id)
            if rec is not None:
                run.state = rec.state
            return
        run.state = state

    def _sample(self, now: float) -> None:
        if now < self._next_sample:
            return
        self._next_sample = now + 1.0
        held = self.backend.held_nodes()
        used = {n for r in self.runs.values() for n in r.members}
        self.store.log_event(
            "nodes", idle=len(self.backend.idle_nodes() | held), held=len(held), used=len(used),
            jobs={r.id: len(r.members) for r in self.runs.values() if r.members},
        )
        for rid in [rid for rid, r in self.runs.items() if r.state.terminal and not r.leaving]:
            del self.runs[rid]

    # ---------------------------------------------------------------- control API
    def _serve_control(self) -> None:
        self.control.serve(0)

    def _register(self, job_id: str) -> None:
        """The monitor takes this job's reports, signed with its secret."""
        self.monitor.register(job_id, self.job_secret(job_id))

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
        held = self.backend.held_nodes()
        idle = self.backend.idle_nodes()
        alive = self.hub.alive()
        owner = {n: r.id for r in self.runs.values() for n in r.members}
        out = []
        for node in self.backend.nodes:
            if node in held:
                state = "held" if node in alive else "holding"
            elif node in idle:
                state = "idle"
            else:
                state = "busy"
            out.append({"node": node, "state": state, "job": owner.get(node, "")})
        return out

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop every job's workers, release every node, close sockets; idempotent."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        now = self.clock()
        for run in list(self.runs.values()):
            if run.ending is not None:  # observed but not yet carried out
                self._finish(run, *run.ending)
        for run in self.runs.values():
            if not run.state.terminal and (run.members or run.workers):
                self._stop_workers(run, now)
                if run.state.active:
                    self._set_state(run, JobState.SUSPENDED, "daemon stopped")
        self.backend.close()
        self.runtime.close()
        self.store.log_event("daemon_stop", pid=os.getpid())
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


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])
