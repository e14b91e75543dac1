"""Fakes of the daemon's four collaborators (backend, agent hub, runtime, job monitor) and a scripted
evidence rule both drivers of the policy can compute from their own state.

No process, no socket (but the daemon's control socket), no wall clock: every fake reads the test's
clock. A :class:`FakeCluster` is the machine: the test says when nodes become idle or are recalled,
and the fake backend and hub report it as the real ones would, in the same reconcile iteration
(a pilot starts, and its agent says hello, at once).

The scripted evidence (:class:`ScriptedRates`): once a job has run at ``n`` nodes for
:data:`MEASURE_S` seconds without a change, its evidence holds ``Estimate(n, true_rate(n), 10, 0.0,
10)`` (stable: rel_ci 0), and keeps it after the job moves on (a monitor keeps the newest estimate
per count). No rescale pauses are ever reported, so both drivers' policies use the configured costs.
The simulator gets it through ``Simulator(monitor_factory=...)`` (:class:`ScriptedSimMonitor`), the
daemon through :class:`FakeMonitor` (``jobs[job].throughput.estimates()``); the count is the one the
policy is shown (the simulator: the job's nodes; the daemon: its target nodes), 0 below ``min_nodes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping

from allocator import throughput_at
from malletrain.daemon.config import DaemonConfig
from malletrain.runtimes import LaunchSpec, Runtime
from policy import JobEvidence, PolicyConfig
from profiler.estimators import Estimate
from scavenger.base import (
    AgentGone,
    AgentRoster,
    AgentUp,
    Discovery,
    EndReason,
    NodeInfo,
    NodeState,
    PilotEnded,
    PilotRequest,
    PilotState,
    PilotView,
    SchedulerBackend,
)
from scavenger.hub import AgentWorkers, WorkerExitedEvent, WorkerStartedEvent

MEASURE_S = 10.0
"""Seconds at one count before the scripted monitor has a stable estimate there."""


# ------------------------------------------------------------------ the scripted evidence rule
class ScriptedRates:
    """The rates a monitor would show for one job under the rule of the module doc."""

    def __init__(self, true_curve: Mapping[int, float]) -> None:
        self.curve = dict(true_curve)
        self.n = 0
        self.since = 0.0
        self.rates: dict[int, Estimate] = {}

    def observe(self, t: float, n: int) -> None:
        """The job runs at ``n`` nodes from ``t`` on (no-op when it already did)."""
        if n != self.n:
            self._settle(t)
            self.n, self.since = n, t

    def _settle(self, now: float) -> None:
        if self.n > 0 and now - self.since >= MEASURE_S:
            self.rates[self.n] = Estimate(self.n, throughput_at(self.curve, self.n), 10, 0.0, 10)

    def estimates(self, now: float) -> dict[int, Estimate]:
        self._settle(now)
        return dict(self.rates)

    @property
    def stable_at(self) -> float | None:
        return self.since + MEASURE_S if self.n > 0 else None


class ScriptedSimMonitor:
    """The simulator's side: what :class:`simulator.monitor.SimJobMonitor` offers the engine."""

    def __init__(self, true_curve: Mapping[int, float]) -> None:
        self.r = ScriptedRates(true_curve)

    def change(self, t: float, old_n: int, new_n: int, resume_at: float) -> None:
        self.r.observe(t, new_n)

    def evidence(self, now: float) -> JobEvidence:
        return JobEvidence(self.r.estimates(now), None)

    @property
    def stable_at(self) -> float | None:
        return self.r.stable_at


# ------------------------------------------------------------------ the machine
class FakeCluster:
    """Nodes, pilots, agents and workers; the test moves it, the fake backend and hub report it."""

    def __init__(self, nodes: tuple[str, ...]) -> None:
        self.nodes = tuple(nodes)
        self.idle: set[str] = set()
        self.held: set[str] = set()
        self.agents: set[str] = set()  # nodes whose agent is connected
        self.workers: dict[str, set[str]] = {}  # node -> running worker ids
        self.backend_events: list[Any] = []
        self.hub_events: list[Any] = []
        self.started: list[tuple[str, str]] = []  # (node, worker) start requests, in order
        self.stopped: list[tuple[str, str]] = []
        self.gpus: dict[str, int] = {}  # node -> GPUs the scheduler reports (none: it says nothing)
        self.slots: dict[str, int] = {}  # worker -> processes its start asked for
        self.umasks: dict[str, int | None] = {}  # worker -> the umask its start asked for

    def became_idle(self, *nodes: str) -> None:
        for node in nodes:
            if node in self.idle:
                continue
            self.idle.add(node)
            # the pilot starts at once and its agent says hello in the same iteration
            self.agents.add(node)
            self.hub_events.append(AgentUp(node))

    def recall(self, *nodes: str) -> None:
        for node in nodes:
            if node not in self.idle:
                continue
            held = node in self.held
            self.idle.discard(node)
            self.held.discard(node)
            if held:
                self.backend_events.append(("recalled", node))  # its pilot is preempted
            if node in self.agents:
                self.agents.discard(node)
                self.workers.pop(node, None)  # killed with the pilot: no exit event
                self.hub_events.append(AgentGone(node, "recalled"))

    def exit_worker(self, node: str, worker: str, code: int, stopped: bool = False) -> None:
        """A worker ends by itself (``code`` 0: the job's command finished); ``stopped``: its agent
        stopped it (its node recalled)."""
        self.workers.get(node, set()).discard(worker)
        self.hub_events.append(WorkerExitedEvent(node, worker, code, stopped))

    def reconnect_agents(self) -> None:
        """Every agent says hello to a new daemon with the workers it still runs (re-adoption)."""
        for node in sorted(self.agents):
            self.hub_events.append(AgentWorkers(node, self.pid(node), tuple(sorted(self.workers.get(node, ())))))

    def pid(self, node: str) -> int:
        return 1000 + self.nodes.index(node)


class FakeBackend(SchedulerBackend):
    """A :class:`scavenger.base.SchedulerBackend` on the fake cluster: a pilot runs as soon as it is
    submitted; a recall of a held node ends its pilot ``preempted``."""

    name = "fake"

    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster
        self.nodes = cluster.nodes
        self._pilots: dict[str, str] = {}  # pilot id -> node
        self._ended: list[Any] = []
        self._seq = 0

    def poll(self) -> list[Any]:
        events, self.c.backend_events = self.c.backend_events, []
        out, self._ended = self._ended, []
        for _, node in events:
            pid = self._on(node)
            if pid is not None:
                del self._pilots[pid]
                out.append(PilotEnded(pid, (node,), EndReason.PREEMPTED, "recalled"))
        return out

    def discover(self) -> Discovery:
        infos = tuple(NodeInfo(n, NodeState.IDLE if n in self.c.idle else NodeState.BUSY, gpus=self.c.gpus.get(n))
                      for n in self.c.nodes)
        return Discovery(infos, (), frozenset(self.c.idle - set(self._pilots.values())), 0.0)

    def submit(self, request: PilotRequest) -> str:
        (node,) = request.nodes
        pid = self._on(node)
        if pid is not None:
            return pid
        self._seq += 1
        pid = f"fake-{self._seq}"
        self._pilots[pid] = node
        self.c.held.add(node)
        return pid

    def cancel(self, pilot: str) -> None:
        node = self._pilots.pop(pilot, None)
        if node is not None:
            self.c.held.discard(node)
            self._ended.append(PilotEnded(pilot, (node,), EndReason.CANCELLED, "cancelled by us"))

    def pilots(self) -> dict[str, PilotView]:
        return {p: PilotView(p, PilotState.RUNNING, (n,), None) for p, n in self._pilots.items()}

    def adopt(self, node: str, batch_job: str, pid: int) -> str | None:
        """A new daemon meets the agents of the last one: their pilots run on."""
        if node not in self.c.held:
            return None
        return self._on(node) or self.submit(PilotRequest((node,)))

    def _on(self, node: str) -> str | None:
        return next((p for p, n in self._pilots.items() if n == node), None)

    def close(self) -> None:
        pass


class FakeHub(AgentRoster):
    address = "tcp://127.0.0.1:1"

    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster

    def poll(self) -> list[Any]:
        out, self.c.hub_events = self.c.hub_events, []
        return out

    def alive(self) -> set[str]:
        return set(self.c.agents)

    def pid(self, node: str) -> int:
        return self.c.pid(node)

    def start_worker(self, node: str, worker: str, argv: Any, env: Any, cwd: Any,
                     uid: int | None = None, gid: int | None = None, slots: int = 1,
                     umask: int | None = None, starts_own_ranks: bool = False) -> None:
        if node not in self.c.agents or worker in self.c.workers.get(node, set()):
            return  # idempotent, as the agent is
        self.c.workers.setdefault(node, set()).add(worker)
        self.c.started.append((node, worker))
        self.c.slots[worker] = slots
        self.c.umasks[worker] = umask
        self.c.hub_events.append(WorkerStartedEvent(node, worker, 5000 + len(self.c.started)))

    def stop_worker(self, node: str, worker: str, grace: float = 0.0) -> None:
        if worker in self.c.workers.get(node, set()):
            self.c.workers[node].discard(worker)
            self.c.stopped.append((node, worker))
            self.c.hub_events.append(WorkerExitedEvent(node, worker, -15, True))

    def close(self) -> None:
        pass


class FakeRuntime(Runtime):
    port = 0

    def __init__(self) -> None:
        self.generation: dict[str, int] = {}
        self.members: dict[str, list[str]] = {}

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def launch_spec(self, job_id: str, command: Any, worker_id: str, node: str, slots: int = 1) -> LaunchSpec:
        return LaunchSpec(tuple(command), {}, None, slots)

    def set_members(self, job_id: str, members: Any) -> int:
        self.generation[job_id] = self.generation.get(job_id, 0) + 1
        self.members[job_id] = list(members)
        return self.generation[job_id]

    def resume_generation(self, job_id: str, gen: int) -> None:
        self.generation[job_id] = max(self.generation.get(job_id, 0), gen)

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        self.members.pop(job_id, None)


# ------------------------------------------------------------------ the monitor
class _Throughput:
    def __init__(self, stats: "FakeStats") -> None:
        self.s = stats

    def estimates(self) -> dict[int, Estimate]:
        m = self.s.monitor
        m.sync()
        return self.s.rates.estimates(m.clock())

    def estimate(self, n: int) -> Estimate | None:
        return self.estimates().get(n)


@dataclass
class FakeStats:
    job: str
    monitor: "FakeMonitor"
    rates: ScriptedRates
    done_at: float | None = None  # the job reports its spec's samples from then on
    target: int = 0
    world_size: int = 0
    generation: int = 0  # reports carry no generation here: the rate is always the current world's
    worlds: dict[int, int] = field(default_factory=dict)
    throughput: _Throughput = field(init=False)

    def __post_init__(self) -> None:
        self.throughput = _Throughput(self)

    @property
    def samples(self) -> int:
        return self.target if self.done_at is not None and self.monitor.clock() >= self.done_at else 0

    def new_rescales(self) -> list:
        return []

    def rates_dict(self) -> dict[int, float]:
        return {n: e.rate for n, e in self.throughput.estimates().items()}


class FakeMonitor:
    """The job monitor: per-job statistics under the scripted rule, for every live job of the daemon.

    ``curves[job]`` is a job's true curve, ``done_at[job]`` when it reports its last sample. Set
    ``daemon`` after building the daemon: the count a job runs at is read from its target nodes.
    """

    address = "tcp://127.0.0.1:2"

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.daemon: Any = None
        self.curves: dict[str, Mapping[int, float]] = {}
        self.done_at: dict[str, float] = {}
        self.jobs: dict[str, FakeStats] = {}
        self.forgotten: set[str] = set()

    def _stats(self, job_id: str) -> FakeStats | None:
        if job_id in self.forgotten or job_id not in self.curves:
            return None
        st = self.jobs.get(job_id)
        if st is None:
            run = self.daemon.runs.get(job_id) if self.daemon is not None else None
            target = run.spec.samples if run is not None and run.spec.samples is not None else 0
            st = self.jobs[job_id] = FakeStats(job_id, self, ScriptedRates(self.curves[job_id]),
                                               self.done_at.get(job_id), target)
        return st

    def sync(self) -> None:
        """Observe every live job's count now (call after each daemon step, and at each decision)."""
        d = self.daemon
        if d is None:
            return
        now = self.clock()
        for job_id, run in d.runs.items():
            st = self._stats(job_id)
            if st is None:
                continue
            n = 0 if run.state.terminal else len(d.decide.nodes_of(job_id))
            st.rates.observe(now, n if n >= run.spec.min_nodes else 0)
            st.world_size = len(run.members)

    # what the daemon calls
    def drain(self, timeout_ms: int = 0, max_frames: int | None = None) -> int:
        if self.daemon is not None:
            for job_id in list(self.daemon.runs):
                self._stats(job_id)
        return 0

    def register(self, job_id: str, secret: str = "", replay_state: Any = None,
                 max_nodes: int | None = None) -> FakeStats | None:
        self.forgotten.discard(job_id)
        return self._stats(job_id)

    def forget(self, job_id: str, ended: bool = False) -> None:
        self.forgotten.add(job_id)
        self.jobs.pop(job_id, None)

    def set_world(self, job_id: str, generation: int, size: int, workers: Iterable[str] = ()) -> None:
        pass  # the scripted world size is the daemon's own (sync)

    def job(self, job_id: str) -> FakeStats:
        st = self._stats(job_id)
        if st is None:
            raise KeyError(f"job {job_id} is not registered with the monitor")
        return st

    def replay_state(self, job_id: str) -> dict:
        return {}

    def counts(self) -> dict[str, int]:
        return {"received": 0, "accepted": 0, "rejected": 0}

    @property
    def bad(self) -> int:
        return 0

    def close(self) -> None:
        pass


# ------------------------------------------------------------------ the daemon's config
def daemon_config(state_dir: Any, pcfg: PolicyConfig, **kw: Any) -> DaemonConfig:
    """A DaemonConfig whose ``policy`` is ``pcfg`` (read by the daemon as ``getattr(cfg, "policy")``).

    DaemonConfig has no ``policy`` field (yet): then a frozen subclass adds one.
    """
    kw.setdefault("runtime", "toy")
    kw.setdefault("agent_dead_after", 0.5)
    kw.setdefault("agent_heartbeat", 0.1)
    kw.setdefault("stall_after", 7 * 86400.0)  # a scripted job reports its samples only when done: never stalled
    base = DaemonConfig(state_dir=str(state_dir), **kw)
    if "policy" in {f.name for f in fields(DaemonConfig)}:
        return replace(base, policy=pcfg)  # type: ignore[call-arg]
    return _WithPolicy(state_dir=str(state_dir), policy=pcfg, **kw)


@dataclass(frozen=True)
class _WithPolicy(DaemonConfig):
    policy: PolicyConfig | None = None
