"""The daemon: ONE reconcile loop, observe -> decide -> act.

observe
    backend events (nodes idle, recalled, pilots gone), node agents (up, gone,
    worker started/exited), the job monitor (progress, throughput, rescale
    pauses), the store (jobs submitted or cancelled by the CLI, even while the
    daemon was down) and control requests.
decide
    new ``profile = true`` jobs get nodes from :func:`profiler.jpa.choose_sources`
    and run their inverse-order profile; every other job is placed by
    :func:`allocator.solve` on the held nodes (curves from
    :mod:`malletrain.scaling`). Decisions happen when something changed.
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

from allocator import Job, Problem, ProblemError, solve
from malletrain.config import ConfigError, DaemonConfig
from malletrain.jobspec import JobSpec, JobSpecError, JobState, parse_spec
from malletrain.monitor import Monitor
from malletrain.runtimes import Runtime
from malletrain.scaling import allocator_scaling, guess_one_node_rate
from malletrain.store import Store, StoreError
from profiler import jpa
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
DEFAULT_UP_COST_S = 1.0
DEFAULT_DOWN_COST_S = 0.5



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
    last_interrupted: float = 0.0
    profile_plan: jpa.ProfilePlan | None = None  # chosen; the session starts when it runs at the top count
    session: jpa.ProfileSession | None = None
    measured: dict[int, float] = field(default_factory=dict)
    ever_ran: bool = False
    adopted: bool = False

    @property
    def profiling(self) -> bool:
        return self.session is not None or self.profile_plan is not None


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

        tl = summit_like(cfg.local.machine_nodes, cfg.local.duration, cfg.local.seed)
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


class Daemon:
    """Build with :meth:`start`; drive with :meth:`run` (or :meth:`step` in tests); :meth:`close` cleans up."""

    def __init__(self, cfg: DaemonConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.state_dir = cfg.state_path
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.state_dir / "daemon.lock", os.O_CREAT | os.O_RDWR, 0o644)
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
        self.store = Store.open(self.state_dir / STORE_FILE)
        ports = self._ports()
        self.monitor = Monitor(self._bind(ports["monitor"], "monitor"), ctx=self.ctx)
        self.hub = AgentHub(
            self._bind(ports["agents"], "agents"), dead_after_s=cfg.agent_dead_after, ctx=self.ctx
        )
        self.control = self.ctx.socket(zmq.REP)
        self.control.setsockopt(zmq.LINGER, 0)
        try:
            self.control.bind(f"tcp://127.0.0.1:{ports['control']}")
        except zmq.ZMQError:
            self.control.bind("tcp://127.0.0.1:0")
        self.control_address = self.control.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.runtime = make_runtime(cfg, self.monitor.address, ports["rendezvous"])
        self.runtime.start()
        self.store.set_meta("ports", json.dumps({
            "monitor": _port(self.monitor.address), "agents": _port(self.hub.address),
            "control": _port(self.control_address), "rendezvous": int(getattr(self.runtime, "port", 0) or 0),
        }))
        self.backend = self._make_backend()
        self.runs: dict[str, JobRun] = {}
        self.stopping = False
        self._changed = True
        self._next_sample = 0.0
        self._next_decide = 0.0
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
            k: getattr(cfgp, k) or int(stored.get(k, 0)) for k in ("monitor", "agents", "control", "rendezvous")
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
            run.last_progress = rec.samples
            run.measured = self.store.scaling(rec.id)
            if rec.state.active:
                run.target = list(rec.nodes)
                run.adopted = True
                run.ever_ran = True
                self._adopt_until = now + self.cfg.agent_dead_after + 1.0
            self.runs[rec.id] = run

    def _write_state_file(self) -> None:
        info = {
            "pid": os.getpid(), "control": self.control_address, "agents": self.hub.address,
            "monitor": self.monitor.address, "store": str(self.state_dir / STORE_FILE),
        }
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(info))
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
        self._profile_steps(now)
        if self._changed or now >= self._next_decide:
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
                    self.backend.release(ev.node)
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
            self._finish(run, JobState.COMPLETED, f"worker {ev.worker} exited 0")
            return
        run.failures += 1
        if ev.node in run.target:
            run.target.remove(ev.node)
        self.store.log_event("worker_failed", run.id, worker=ev.worker, code=ev.code, failures=run.failures)
        if run.failures >= self.cfg.max_failures:
            self._finish(run, JobState.FAILED, f"{run.failures} workers failed without progress; last {ev.worker} exit {ev.code}")
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
                self.store.record_rescale(run.id, ev.from_size, ev.to_size, ev.pause_s, rescale_kind(ev, run.emptied_at))
            if persist:
                self.store.set_samples(run.id, progress)
                stable = stats.throughput.stable_rates()
                for n, r in stable.items():
                    old = run.measured.get(n)
                    if old is None or abs(r - old) > 0.05 * old:
                        run.measured[n] = r
                        self.store.record_scaling(run.id, n, r)
                        if not run.profiling:
                            self._changed = True
            target = run.spec.samples
            if target is not None and progress >= target:
                self.store.set_samples(run.id, progress)
                self._finish(run, JobState.COMPLETED, f"trained {progress} of {target} samples")

    def _observe_store(self, now: float) -> None:
        """New jobs and cancels written by the CLI (directly into the store)."""
        live = {rec.id: rec for rec in self.store.jobs([s for s in JobState if not s.terminal])}
        for rec in live.values():
            run = self.runs.get(rec.id)
            if run is None and rec.state is JobState.PENDING:
                self.runs[rec.id] = JobRun(rec.id, rec.spec, rec.state, base_samples=rec.samples,
                                           measured=self.store.scaling(rec.id))
                self._changed = True
            elif run is not None and rec.cancel_requested:
                self._finish(run, JobState.CANCELLED, "cancelled by user")
        for run in list(self.runs.values()):
            if not run.state.terminal and run.id not in live:  # cancelled while queued
                rec = self.store.get(run.id)
                if rec is not None and rec.state.terminal:
                    self._stop_workers(run, now)
                    run.state = rec.state
                    self._changed = True

    # ---------------------------------------------------------------- decide
    def _hold_idle_nodes(self) -> None:
        """A scavenger holds every idle node (pilots are preemptable: no cost to the main queue)."""
        for node in sorted(self.backend.idle_nodes()):
            self.backend.hold(node)

    def _decide(self, now: float) -> None:
        usable = self.usable_nodes()
        for run in self.runs.values():
            run.target = [n for n in run.target if n in usable]
        self._start_profiles(now, usable)
        profiling = [r for r in self.runs.values() if r.profiling]
        pool = usable - {n for r in profiling for n in r.target}
        candidates = [r for r in self.runs.values() if not r.profiling and not r.state.terminal
                      and not (r.spec.profile and not r.measured and not r.spec.scaling)]
        candidates.sort(key=lambda r: (not r.target, r.id))
        if self.cfg.max_running:
            candidates = candidates[: self.cfg.max_running]
        if not candidates:
            return
        guess = guess_one_node_rate([r.measured for r in self.runs.values() if r.measured])
        jobs = []
        for r in candidates:
            stats = self.monitor.jobs.get(r.id)
            costs = stats.rescale.costs() if stats else None
            jobs.append(Job(
                r.id, r.spec.min_nodes, r.spec.max_nodes,
                allocator_scaling(r.spec, r.measured, guess),
                tuple(n for n in r.target if n in pool),
                costs.up_or(DEFAULT_UP_COST_S) if costs else DEFAULT_UP_COST_S,
                costs.down_or(DEFAULT_DOWN_COST_S) if costs else DEFAULT_DOWN_COST_S,
            ))
        used = {n for j in jobs for n in j.nodes}
        free = tuple(sorted(pool - used))
        try:
            plan = solve(Problem(tuple(jobs), free, self.cfg.tfwd))
        except ProblemError as exc:
            log.error("allocator refused the problem: %s", exc)
            self.store.log_event("decide_error", error=str(exc))
            return
        for r in candidates:
            new = list(plan.nodes_of(r.id))
            if new != r.target:
                self.store.log_event("plan", r.id, nodes=new, before=r.target)
            r.target = new

    def _start_profiles(self, now: float, usable: set[str]) -> None:
        if self.backend.held_nodes() - self.hub.alive():
            return  # agents still starting: wait to see the whole pool (AgentUp re-triggers)
        waiting = [r for r in self.runs.values() if r.spec.profile and not r.measured and not r.spec.scaling
                   and not r.profiling and not r.state.terminal]
        for run in sorted(waiting, key=lambda r: r.id):
            taken = {n for r in self.runs.values() for n in r.target}
            free = sorted(usable - taken)
            running = [jpa.RunningJob(r.id, len(r.target), r.spec.min_nodes, r.last_interrupted, r.profiling)
                       for r in self.runs.values() if r.target and r is not run]
            try:
                choice = jpa.choose_sources(jpa.ProfilingRequest(run.id, run.spec.min_nodes, run.spec.max_nodes),
                                            len(free), running)
            except jpa.ProfilingError as exc:
                log.error("profiler: %s", exc)
                continue
            if isinstance(choice, jpa.Wait):
                continue
            nodes = free[: choice.from_free]
            if choice.lender:
                lender = self.runs[choice.lender]
                lent = lender.target[len(lender.target) - choice.borrowed:]
                lender.target = lender.target[: len(lender.target) - choice.borrowed]
                nodes += lent
            run.target = nodes
            run.profile_plan = choice
            self.store.log_event("profile_start", run.id, counts=list(choice.counts_desc), lender=choice.lender)

    def _profile_steps(self, now: float) -> None:
        for run in self.runs.values():
            if run.profile_plan is not None and run.session is None and len(run.target) < run.profile_plan.top:
                self._abort_profile(run, now, "lost nodes before the profile started")
                continue
            if run.session is not None and len(run.target) < run.session.count:
                self._abort_profile(run, now, "lost nodes during the profile")
                continue
            if run.session is None or len(run.members) != run.session.count or set(run.target) != set(run.members):
                continue
            stats = self.monitor.job(run.id)
            action = run.session.next_action(now, stats.throughput)
            if isinstance(action, jpa.StepDown):
                run.target = run.target[: action.count]
                self.store.log_event("profile_step", run.id, count=action.count)
                self._changed = True  # the released nodes go to other jobs
            elif isinstance(action, jpa.Done):
                measured = dict(run.session.measured)
                for n, r in measured.items():
                    self.store.record_scaling(run.id, n, r)
                run.measured.update(measured)
                run.session = None
                run.profile_plan = None
                self._set_state(run, JobState.RUNNING, "profiled")
                self.store.log_event("profile_done", run.id, measured={str(k): v for k, v in measured.items()},
                                     missing=list(action.missing))
                self._changed = True

    def _abort_profile(self, run: JobRun, now: float, reason: str) -> None:
        """A recall broke the profile: keep what was measured; the allocator (or a new profile) takes over."""
        measured = dict(run.session.measured) if run.session is not None else {}
        for n, r in measured.items():
            self.store.record_scaling(run.id, n, r)
        run.measured.update(measured)
        run.session = None
        run.profile_plan = None
        if not run.measured:
            self._stop_workers(run, now)  # profile again from scratch when nodes allow
            run.target = []
        self.store.log_event("profile_aborted", run.id, reason=reason, measured=len(measured))
        self._changed = True

    # ---------------------------------------------------------------- act
    def _act(self, now: float) -> None:
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
        want = JobState.PROFILING if run.profiling else JobState.RUNNING
        if run.members and run.members == run.target:
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
        plan = run.profile_plan
        if plan is not None and run.session is None and len(members) == plan.top:
            # the time cap of the first count runs from now, not from the (slow) worker start
            run.session = jpa.ProfileSession(plan, now, time_cap_s=self.cfg.profile_time_cap)
        if members:
            run.ever_ran = True

    def _suspend(self, run: JobRun, now: float, reason: str) -> None:
        self._stop_workers(run, now)
        run.target = []
        run.session = None
        run.profile_plan = None
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
        while True:
            try:
                raw = self.control.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                req = json.loads(raw)
                if not isinstance(req, dict):
                    raise ValueError("request is not a JSON object")
                reply = self.handle(req)
            except (ValueError, JobSpecError, StoreError) as exc:
                reply = {"ok": False, "error": str(exc)}
            self.control.send(json.dumps(reply, default=str).encode())

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "submit":
            spec = parse_spec(req.get("spec"), "submitted job")
            jid = self.store.submit(spec)
            self._observe_store(self.clock())
            return {"ok": True, "id": jid}
        if cmd == "cancel":
            jid = str(req.get("id"))
            state = self.store.request_cancel(jid)
            self._observe_store(self.clock())
            return {"ok": True, "id": jid, "state": self.store.require(jid).state.value, "was": state.value}
        if cmd == "status":
            return {"ok": True, "jobs": self.status_jobs(), "nodes": self.status_nodes()}
        if cmd == "nodes":
            return {"ok": True, "nodes": self.status_nodes()}
        if cmd == "shutdown":
            self.stopping = True
            return {"ok": True}
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid()}
        raise ValueError(f"unknown command {cmd!r}; known: submit, cancel, status, nodes, shutdown, ping")

    def status_jobs(self) -> list[dict[str, Any]]:
        out = []
        for rec in self.store.jobs():
            d = rec.as_dict()
            run = self.runs.get(rec.id)
            stats = self.monitor.jobs.get(rec.id)
            if run is not None:
                d["samples"] = max(d["samples"], run.last_progress)
                d["nodes"] = list(run.members)
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
        self.control.close(0)
        self.ctx.term()
        self.store.close()
        try:
            (self.state_dir / STATE_FILE).unlink()
        except FileNotFoundError:
            pass
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)


def _job_of(worker_id: str) -> str:
    return worker_id.split(".", 1)[0]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])
