"""Conformance: the simulator and the daemon drive the same :class:`policy.Policy` to the same decisions.

One scripted scenario (nodes arrive, a recall, jobs submitted with and without a user curve,
profiled jobs, one of them with a lender, a job completes, a job is cancelled) runs through the
simulator engine and through the daemon (fake backend, runtime, agent hub and monitor from
:mod:`tests.fakes`, an injected clock, no process). Both get the same evidence (the scripted rule
of :mod:`tests.fakes`) and are asked at the same times: the daemon steps at every time the simulator
decides and at every scripted time, and is made to decide there (``Harness.step(decide=True)``); a
second test leaves the daemon to its own cadence (every ``REPLAN_S``, its own wake-ups) and still
gets the same decisions, since a decision that changed nothing is answered again unchanged. A job completes in the daemon
when its fake monitor reports the spec's samples, at the time the simulator finished it. Their
decisions, with repeats that changed nothing dropped, must be equal: time, admitted jobs, the nodes
of each job (by name), profiling counts, waiting jobs and their reasons, and each decision's events.

Fixed on the way (each has its test): the daemon now marks a job interrupted on any change of its
nodes, as the simulator does (the lender order reads it); a permutation of a job's nodes is not a
rescale; the simulator shows the policy every queued job (up to 1,000), as the daemon does; a
lender's repayment and the re-plan it allows happen in one decision.

A second scenario replays budgets and deadlines: a job with ``budget_node_hours`` is stopped
(``Decision.stop``) at the same decision in both drivers, each counting the node-hours it held, a
job with a ``deadline`` is weighed up the same way, and one still training at its deadline is
stopped at the same decision; each stop carries the same typed reason in both drivers.

Then daemon-side tests of Pjmax and lending (the daemon had none) and of the policy state across a
restart (clean close, and a crash with re-adoption), with the same fakes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from malletrain.daemon import Daemon, DaemonParts
from malletrain.daemon.decide import user_name
from malletrain.daemon.jobspec import JobSpec as DaemonJobSpec
from malletrain.daemon.jobspec import JobState
from policy import Decision, Loss, LossOutcome, Policy, PolicyConfig, Stop, StopReason, View
from simulator import SimConfig, SimPolicy, Simulator, Workload
from simulator.records import SimJobState
from simulator.workload import JobSpec as SimJobSpec
from tests.fakes import (
    FakeBackend,
    FakeCluster,
    FakeHub,
    FakeMonitor,
    FakeRuntime,
    ScriptedSimMonitor,
    daemon_config,
)
from traces.model import IdleTimeline

NODES = tuple(f"n{i:02d}" for i in range(1, 9))
END = 400.0


@dataclass(frozen=True)
class ScriptJob:
    name: str
    arrival: float
    curve: Mapping[int, float]  # the truth (what the scripted monitor reports)
    user_curve: Mapping[int, float] | None  # what the user says (None: no curve)
    min_nodes: int = 1
    max_nodes: int = 4
    samples: int | None = None  # None: runs past the end
    budget_node_hours: float | None = None
    deadline: float | None = None  # on the scenario's clock (both drivers start at 0)
    uid: int | None = None  # the submitter (None: the daemon's own uid, the simulator's one user)

    @property
    def user(self) -> str:
        """Whose it is, as the daemon names a submitter (the simulator's job spec carries the same)."""
        return "" if self.uid is None else user_name(self.uid)


@dataclass(frozen=True)
class Scenario:
    jobs: tuple[ScriptJob, ...]
    idle: tuple[tuple[float, tuple[str, ...]], ...]  # (time, nodes that become idle)
    recalls: tuple[tuple[float, tuple[str, ...]], ...]
    cancels: tuple[tuple[float, str], ...]  # (time, job name)
    policy: PolicyConfig
    end: float = END

    @property
    def arrival_order(self) -> list[ScriptJob]:
        return sorted(self.jobs, key=lambda j: j.arrival)  # stable: ties keep the listed order


SCENARIO = Scenario(
    jobs=(
        # A: the user gives a curve (a bit optimistic); it trains to completion
        ScriptJob("A", 0.0, {1: 100.0, 2: 190.0, 4: 340.0}, {1: 100.0, 2: 200.0, 4: 400.0}, samples=40_000),
        # B: no curve; arrives when A holds every node, so its profile borrows from A
        ScriptJob("B", 45.0, {1: 50.0, 2: 95.0, 4: 170.0}, None),
        # C: a curve; waits for a slot (max_running = 2) until A completes
        ScriptJob("C", 120.0, {1: 80.0, 2: 150.0, 4: 260.0}, {1: 80.0, 2: 150.0, 4: 260.0}),
        # D: no curve; waits behind C, and is cancelled while it waits (B is cancelled while it runs)
        ScriptJob("D", 130.0, {1: 60.0, 2: 110.0, 4: 200.0}, None),
    ),
    idle=((0.0, NODES[:4]), (100.0, NODES[4:6])),
    recalls=((150.0, (NODES[1],)),),
    cancels=((160.0, "D"), (200.0, "B")),
    policy=PolicyConfig(profiling="always", max_running=2, profile_time_cap_s=60.0, objective="samples"),
)


# ------------------------------------------------------------------ normal form of a decision
_ID = re.compile(r"\bj\d{5,6}\b")


def normal(dec: Decision, names: Mapping[str, str]) -> tuple:
    """A decision in driver-independent terms: job ids become the scenario's names."""

    def name(text: str) -> str:
        return _ID.sub(lambda m: names.get(m.group(0), m.group(0)), text)

    return (
        dec.now,
        tuple(names[j] for j in dec.admitted),
        tuple(sorted((names[j], tuple(sorted(nodes))) for j, nodes in dec.assignment.items())),
        tuple(sorted((names[j], c) for j, c in dec.profiling.items())),
        tuple(sorted((names[j], name(r)) for j, r in dec.waiting.items())),
        tuple((ev.kind.value, names[ev.job]) for ev in dec.events),
        tuple(sorted((names[j], stop.reason) for j, stop in dec.stop.items())),  # typed: no text to compare
    )


def changes_only(decisions: Iterable[tuple]) -> list[tuple]:
    """Drop decisions that repeat the last kept one's outcome and did nothing (no event)."""
    out: list[tuple] = []
    for d in decisions:
        if out and not d[5] and d[1:5] == out[-1][1:5] and d[6] == out[-1][6]:
            continue
        out.append(d)
    return out


# ------------------------------------------------------------------ the simulator side
def sim_timeline(sc: Scenario) -> IdleTimeline:
    index = {n: i for i, n in enumerate(NODES)}
    initial = [n for t, nodes in sc.idle if t == 0.0 for n in nodes]
    changes = [(t, n, True) for t, nodes in sc.idle if t > 0.0 for n in nodes]
    changes += [(t, n, False) for t, nodes in sc.recalls for n in nodes]
    changes.sort(key=lambda c: c[0])
    return IdleTimeline(
        source="conformance", format="test", nodes=NODES, start=0.0, end=sc.end,
        initial_idle=frozenset(initial),
        times=np.array([c[0] for c in changes], dtype=np.float64),
        node_ids=np.array([index[c[1]] for c in changes], dtype=np.int32),
        idle=np.array([c[2] for c in changes], dtype=bool),
    )


@dataclass
class SimRun:
    decisions: list[Decision]
    names: dict[str, str]  # sim id -> scenario name
    finished_at: dict[str, float]  # scenario name -> completion time
    sim: Simulator


def run_simulator(sc: Scenario) -> SimRun:
    order = sc.arrival_order
    specs = [SimJobSpec(name=j.name, model=j.name, samples=float(j.samples or 1e15), scaling=dict(j.curve),
                        min_nodes=j.min_nodes, max_nodes=j.max_nodes, up_cost_s=2.0, down_cost_s=1.0,
                        arrival_s=j.arrival, believed_scaling=dict(j.user_curve) if j.user_curve else None,
                        budget_node_hours=j.budget_node_hours, deadline=j.deadline, user=j.user)
             for j in order]
    ids = {j.name: f"j{i:05d}" for i, j in enumerate(order)}
    pol = SimPolicy("conformance", Policy(sc.policy), lambda spec: spec.believed_scaling)
    sim = Simulator(sim_timeline(sc), Workload("conformance", "test", timed=specs, finite=True), pol, SimConfig(),
                    keep_decisions=True, monitor_factory=lambda job_id, spec: ScriptedSimMonitor(spec.scaling))
    for t, name in sc.cancels:
        sim.cancel_at(t, ids[name])
    res = sim.run()
    names = {v: k for k, v in ids.items()}
    done = {names[j.id]: j.finished_at for j in res.jobs if j.finished_at is not None}
    return SimRun(res.decisions, names, done, sim)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the daemon side
class Harness:
    """A daemon on fakes, with the test's clock."""

    def __init__(self, state_dir: Path, pcfg: PolicyConfig, cluster: FakeCluster | None = None,
                 now: float = 0.0, **cfg: Any) -> None:
        self.now = now
        self.cluster = cluster or FakeCluster(NODES)
        self.monitor = FakeMonitor(lambda: self.now)
        self.runtime = FakeRuntime()
        self.daemon = Daemon(daemon_config(state_dir, pcfg, **cfg), clock=lambda: self.now,
                             parts=DaemonParts(self.monitor, FakeHub(self.cluster), self.runtime,
                                               FakeBackend(self.cluster)))
        self.monitor.daemon = self.daemon
        self.decisions: list[Decision] = []
        self.final_states: dict[str, JobState] = {}
        self.messages: dict[str, str] = {}
        self._last: Decision | None = None

    def submit(self, name: str, curve: Mapping[int, float], user_curve: Mapping[int, float] | None = None,
               min_nodes: int = 1, max_nodes: int = 4, samples: int | None = None,
               done_at: float | None = None, budget_node_hours: float | None = None,
               deadline: float | None = None, uid: int | None = None) -> str:
        spec = DaemonJobSpec(name=name, command=("true",), min_nodes=min_nodes, max_nodes=max_nodes,
                             scaling=dict(user_curve) if user_curve else None, samples=samples,
                             budget_node_hours=budget_node_hours, deadline=deadline)
        jid = self.daemon.store.submit(spec, owner_uid=uid)
        self.monitor.curves[jid] = dict(curve)
        if done_at is not None:
            self.monitor.done_at[jid] = done_at
        return jid

    def step(self, t: float, decide: bool = False) -> Decision | None:
        """One reconcile iteration at ``t``; ``decide``: ask the policy even if the daemon would not."""
        assert t >= self.now
        self.now = t
        if decide:
            self.daemon._changed = True  # the daemon's own trigger for "something changed: decide"
        self.daemon.step()
        self.monitor.sync()
        dec = self.daemon.last_decision
        if dec is not None and dec is not self._last:
            self._last = dec
            self.decisions.append(dec)
            return dec
        return None

    def run_until(self, t_end: float, dt: float = 1.0) -> None:
        t = self.now
        while t < t_end:
            t = min(t_end, t + dt)
            self.step(t)

    def events(self, kind: str) -> list[dict]:
        return list(self.daemon.store.events(kind))

    def close(self) -> None:
        self.daemon.close()


def run_daemon(sc: Scenario, times: Iterable[float], done_at: Mapping[str, float], state_dir: Path,
               decide_at: set[float] | frozenset[float] = frozenset()) -> tuple[Harness, dict[str, str]]:
    h = Harness(state_dir, sc.policy)
    ids: dict[str, str] = {}
    arrivals: dict[float, list[ScriptJob]] = {}
    for j in sc.arrival_order:
        arrivals.setdefault(j.arrival, []).append(j)
    script = {t for t, _ in sc.idle} | {t for t, _ in sc.recalls} | {t for t, _ in sc.cancels} | set(arrivals)
    try:
        for t in sorted(set(times) | script):
            if t >= sc.end:
                break
            for when, nodes in sc.idle:
                if when == t:
                    h.cluster.became_idle(*nodes)
            for when, nodes in sc.recalls:
                if when == t:
                    h.cluster.recall(*nodes)
            for j in arrivals.get(t, ()):
                ids[j.name] = h.submit(j.name, j.curve, j.user_curve, j.min_nodes, j.max_nodes, j.samples,
                                       done_at.get(j.name), j.budget_node_hours, j.deadline, j.uid)
            for when, name in sc.cancels:
                if when == t:
                    h.daemon.store.request_cancel(ids[name])
            h.step(t, decide=t in decide_at)
        h.final_states = {name: h.daemon.store.require(jid).state for name, jid in ids.items()}
        h.messages = {name: h.daemon.store.require(jid).message for name, jid in ids.items()}
    finally:
        h.close()
    return h, {v: k for k, v in ids.items()}


# ------------------------------------------------------------------ the conformance test
def both(sc: Scenario, tmp_path: Path, same_times: bool = True) -> tuple[list[tuple], list[tuple], SimRun, Harness]:
    sim = run_simulator(sc)
    sim_seq = changes_only(normal(d, sim.names) for d in sim.decisions)
    times = {d.now for d in sim.decisions}
    h, names = run_daemon(sc, times, sim.finished_at, tmp_path / "daemon", times if same_times else frozenset())
    daemon_seq = changes_only(normal(d, names) for d in h.decisions)
    return sim_seq, daemon_seq, sim, h


def _first_difference(sim_seq: list[tuple], daemon_seq: list[tuple]) -> str | None:
    for i, (a, b) in enumerate(zip(sim_seq, daemon_seq)):
        if a != b:
            return f"decision {i}:\n  simulator {a}\n  daemon    {b}"
    if len(sim_seq) != len(daemon_seq):
        return f"{len(sim_seq)} decisions in the simulator, {len(daemon_seq)} in the daemon"
    return None


def test_simulator_and_daemon_make_the_same_decisions(tmp_path: Path) -> None:
    sim_seq, daemon_seq, sim, h = both(SCENARIO, tmp_path)
    assert _first_difference(sim_seq, daemon_seq) is None, _first_difference(sim_seq, daemon_seq)
    assert len(sim_seq) >= 12
    # what happened to the jobs agrees too
    assert h.final_states == {"A": JobState.COMPLETED, "B": JobState.CANCELLED, "C": JobState.RUNNING,
                              "D": JobState.CANCELLED}


# Two jobs that could lend: X was rescaled by the plan more recently (it grew at 40 s) than Y (20 s);
# neither was ever recalled. Z arrives at 60 s with no free node and needs a lender.
LENDER_CHOICE = Scenario(
    jobs=(ScriptJob("X", 0.0, {1: 100.0, 2: 200.0, 4: 400.0}, None, max_nodes=4),
          ScriptJob("Y", 0.0, {1: 100.0, 2: 200.0, 3: 300.0}, None, max_nodes=3),
          ScriptJob("Z", 60.0, {1: 50.0, 2: 100.0}, None, max_nodes=2)),
    idle=((0.0, NODES[:6]), (40.0, NODES[6:7])),
    recalls=(),
    cancels=(),
    policy=PolicyConfig(profiling="always", max_running=3, profile_time_cap_s=60.0),
    end=200.0,
)


def test_lender_choice_is_the_same_in_both_drivers(tmp_path: Path) -> None:
    sim_seq, daemon_seq, _, _ = both(LENDER_CHOICE, tmp_path)
    assert ("lent", "Y") in sim_seq[5][5]  # the simulator's choice: Y, rescaled at 20 s, not X at 40 s
    assert _first_difference(sim_seq, daemon_seq) is None


def test_same_decisions_when_the_daemon_keeps_its_own_cadence(tmp_path: Path) -> None:
    sim_seq, daemon_seq, _, _ = both(SCENARIO, tmp_path, same_times=False)
    assert _first_difference(sim_seq, daemon_seq) is None


# E has a budget of 0.05 node-hours (180 node-seconds): it is stopped when it has held its nodes that
# long, and its nodes go to the others. F has a deadline it can meet only near its max, so the policy
# weighs it up; G, without either, takes what is left. H arrives with a seventh node, runs on it and
# cannot finish by its deadline (100 s): it is stopped then. Both drivers count node-seconds from the decisions' times, end E at the same decision
# and H at its deadline.
BUDGET_DEADLINE = Scenario(
    jobs=(ScriptJob("E", 0.0, {1: 100.0, 2: 200.0, 3: 300.0}, {1: 100.0, 2: 200.0, 3: 300.0}, max_nodes=3,
                    budget_node_hours=0.05),
          ScriptJob("F", 0.0, {1: 100.0, 2: 190.0, 3: 270.0}, {1: 100.0, 2: 190.0, 3: 270.0}, max_nodes=3,
                    samples=40_000, deadline=160.0),
          ScriptJob("G", 0.0, {1: 100.0, 2: 200.0, 3: 300.0}, {1: 100.0, 2: 200.0, 3: 300.0}, max_nodes=3),
          ScriptJob("H", 70.0, {1: 100.0}, {1: 100.0}, max_nodes=1, samples=1_000_000, deadline=100.0)),
    idle=((0.0, NODES[:6]), (70.0, NODES[6:7])),
    recalls=(),
    cancels=(),
    policy=PolicyConfig(profiling="never", max_running=4),
    end=300.0,
)


def test_budget_and_deadline_are_replayed_as_the_daemon_decides(tmp_path: Path) -> None:
    sim_seq, daemon_seq, sim, h = both(BUDGET_DEADLINE, tmp_path)
    assert _first_difference(sim_seq, daemon_seq) is None, _first_difference(sim_seq, daemon_seq)
    events = [ev for d in sim_seq for ev in d[5]]
    assert ("over_budget", "E") in events
    stops = [stop for d in sim_seq for stop in d[6]]
    assert stops == [("H", StopReason.PAST_DEADLINE), ("E", StopReason.OVER_BUDGET)]  # the same in the daemon
    by_name = {j.spec.name: j for j in sim.sim.jobs.values()}
    e, late = by_name["E"], by_name["H"]
    assert e.state is SimJobState.STOPPED and e.stop is not None and e.stop.reason is StopReason.OVER_BUDGET
    assert 0.05 * 3600 <= e.node_seconds < 0.05 * 3600 + 3 * 60  # stopped at the decision its budget ran out
    assert late.state is SimJobState.STOPPED and late.stop == Stop(StopReason.PAST_DEADLINE, 100.0, 100.0)
    assert late.node_seconds == 30.0  # it ran from its arrival until its deadline
    assert ("past_deadline", "H") in events
    assert sim.sim.tally.policy_stops == {StopReason.OVER_BUDGET: 1, StopReason.PAST_DEADLINE: 1}
    assert h.final_states["E"] is JobState.CANCELLED  # the daemon's end for a job over its budget
    assert h.final_states["H"] is JobState.CANCELLED  # and for one past its deadline, with the policy's words
    assert h.messages["H"] == late.stop.describe() == "past its deadline: not done by it (stopped 0 s after it)"
    assert h.messages["E"].startswith("over budget: used ")
    assert h.final_states["F"] is JobState.COMPLETED
    f_first = next(d for d in sim.decisions if d.assignment.get(sim_ids(sim)["F"]))
    g_first = f_first.assignment.get(sim_ids(sim)["G"], ())
    assert len(f_first.assignment[sim_ids(sim)["F"]]) > len(g_first)  # the deadline weighs F up


def sim_ids(run: SimRun) -> dict[str, str]:
    return {name: job_id for job_id, name in run.names.items()}


# More queued jobs than max_running: P runs, Q, R and S wait for the one slot.
QUEUE_WINDOW = Scenario(
    jobs=tuple(ScriptJob(n, 0.0, {1: 100.0, 2: 200.0}, {1: 100.0, 2: 200.0}, max_nodes=2) for n in "PQRS"),
    idle=((0.0, NODES[:2]),),
    recalls=(),
    cancels=(),
    policy=PolicyConfig(profiling="never", max_running=1),
    end=100.0,
)


def test_waiting_jobs_are_the_same_beyond_the_queue_window(tmp_path: Path) -> None:
    sim_seq, daemon_seq, _, _ = both(QUEUE_WINDOW, tmp_path)
    assert [d[1] for d in sim_seq] == [d[1] for d in daemon_seq]  # the same jobs are admitted
    assert _first_difference(sim_seq, daemon_seq) is None


# Two users: P (uid 4201) claims a curve 1,000x superlinear and holds all four nodes; Q (uid 4202)
# submits at 30 s. Both drivers hold P to its share once Q has waited fair_wait_s at 0 nodes.
FAIR = Scenario(
    jobs=(ScriptJob("P", 0.0, {1: 100.0, 2: 200.0, 4: 400.0}, {1: 1.0, 4: 1000.0}, uid=4201),
          ScriptJob("Q", 30.0, {1: 100.0, 2: 200.0, 4: 400.0}, None, uid=4202)),
    idle=((0.0, NODES[:4]),),
    recalls=(),
    cancels=(),
    policy=PolicyConfig(profiling="never", fair_wait_s=10.0),
    end=120.0,
)


def test_both_drivers_share_the_nodes_between_users(tmp_path: Path) -> None:
    sim_seq, daemon_seq, _, _ = both(FAIR, tmp_path)
    assert _first_difference(sim_seq, daemon_seq) is None, _first_difference(sim_seq, daemon_seq)
    last = dict(sim_seq[-1][2])
    assert (len(last["P"]), len(last["Q"])) == (2, 2)  # each user's equal share of the four nodes
    first_q = min(d[0] for d in sim_seq if dict(d[2]).get("Q"))
    assert first_q - 30.0 <= FAIR.policy.fair_wait_s


def test_the_scenario_covers_what_it_claims(tmp_path: Path) -> None:
    sim = run_simulator(SCENARIO)
    seq = changes_only(normal(d, sim.names) for d in sim.decisions)
    events = {ev for d in seq for ev in d[5]}
    for ev in [("profile_start", "A"), ("profile_done", "A"), ("profile_start", "B"), ("lent", "A"),
               ("returned", "A"), ("profile_done", "B"), ("profile_aborted", "C"), ("refined", "C")]:
        assert ev in events
    assert any(dict(d[4]).get("C", "").startswith("all 2 slots") for d in seq)  # Pjmax
    assert set(sim.finished_at) == {"A"} and sim.finished_at["A"] < SCENARIO.end  # A completes
    last = seq[-1]
    assert "A" not in last[1] and "D" not in last[1] and "D" not in dict(last[4])  # completed, cancelled
    assert "B" not in last[1]  # cancelled while running


# ------------------------------------------------------------------ daemon-side rules
LINEAR = {1: 100.0, 2: 200.0, 4: 400.0}


def _state(h: Harness, jid: str) -> JobState:
    return h.daemon.store.require(jid).state


def _status(h: Harness, jid: str) -> dict:
    return next(d for d in h.daemon.api.status_jobs() if d["id"] == jid)


def test_daemon_pjmax_keeps_the_second_job_pending_with_a_reason(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(max_running=1, profiling="never", admission="fixed"))
    try:
        h.cluster.became_idle(*NODES[:4])
        first = h.submit("first", LINEAR, max_nodes=2)
        second = h.submit("second", LINEAR, max_nodes=2)
        h.step(0.0)
        h.run_until(5.0)
        assert _state(h, first) is JobState.RUNNING
        assert len(h.daemon.runs[first].members) == 2
        assert _state(h, second) is JobState.PENDING  # two nodes are free, but the one slot is taken
        assert h.daemon.decide.nodes_of(second) == ()
        assert h.decisions[-1].waiting[second] == "all 1 slots are taken (max_running)"
        assert h.daemon.runs[second].waiting == "all 1 slots are taken (max_running)"
        assert _status(h, second).get("waiting") == "all 1 slots are taken (max_running)"
        h.daemon.store.request_cancel(first)  # the slot frees: the second job is admitted
        h.run_until(10.0)
        assert _state(h, first) is JobState.CANCELLED
        assert _state(h, second) is JobState.RUNNING and h.daemon.runs[second].waiting == ""
    finally:
        h.close()


def _lending_setup(tmp_path: Path) -> tuple[Harness, str, str]:
    """A (no profile) runs on 4 nodes; B (profile = true) arrives with no node free: it borrows 2 from A."""
    h = Harness(tmp_path / "d", PolicyConfig(profiling="requested", max_running=4, profile_time_cap_s=60.0))
    h.cluster.became_idle(*NODES[:4])
    a = h.submit("A", LINEAR, max_nodes=4)
    h.run_until(5.0)
    assert h.daemon.decide.nodes_of(a) == tuple(NODES[:4]) and _state(h, a) is JobState.RUNNING
    spec = DaemonJobSpec(name="B", command=("true",), min_nodes=1, max_nodes=4, profile=True)
    b = h.daemon.store.submit(spec)
    h.monitor.curves[b] = {1: 50.0, 2: 95.0, 4: 170.0}
    h.step(6.0)
    return h, a, b


def test_daemon_lending_shrinks_the_lender_and_gives_the_nodes_back(tmp_path: Path) -> None:
    h, a, b = _lending_setup(tmp_path)
    try:
        st = h.daemon.policy.state
        assert st.debts[b].lender == a and st.debts[b].nodes == 2 and st.profiles[b].count == 2
        assert len(h.daemon.decide.nodes_of(a)) == 2  # shrunk by what it lent
        assert sorted(h.daemon.decide.nodes_of(a) + h.daemon.decide.nodes_of(b)) == list(NODES[:4])
        h.run_until(10.0)
        assert _state(h, b) is JobState.PROFILING
        assert len(h.runtime.members[a]) == 2 and len(h.runtime.members[b]) == 2
        # the step at 2 nodes ends once the evidence is stable (10 s): B steps down to 1; the node it
        # releases is held back for the lender, which may not grow while it is owed
        h.run_until(16.0)
        assert st.profiles[b].count == 1 and len(h.daemon.decide.nodes_of(b)) == 1
        assert len(h.daemon.decide.nodes_of(a)) == 2
        assert len(h.daemon.scav.usable()) == 4  # the held-back node stays held, unused
        h.run_until(26.0)  # the step at 1 node ends: profile done, debt repaid
        assert b not in st.profiles and b not in st.debts
        assert len(h.daemon.decide.nodes_of(a)) > 2  # grew back with the returned nodes
        lent = [e for e in h.events("lent")]
        returned = [e for e in h.events("returned")]
        assert [(e["job"], e["nodes"], e["borrower"]) for e in lent] == [(a, 2, b)]
        assert [(e["job"], e["nodes"], e["borrower"]) for e in returned] == [(a, 2, b)]
        assert lent[0]["time"] <= returned[0]["time"]
        h.run_until(40.0)
        assert set(h.daemon.runs[a].members) == set(h.daemon.decide.nodes_of(a))  # the workers followed
    finally:
        h.close()


def test_daemon_a_reordered_node_list_is_not_a_rescale(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:3])
        job = h.submit("A", LINEAR, max_nodes=3)
        h.run_until(5.0)
        assert _state(h, job) is JobState.RUNNING and len(h.daemon.runs[job].members) == 3
        decide = h.daemon.policy.decide

        def reversed_nodes(view, evidence):  # the same nodes, in another order
            d = decide(view, evidence)
            return replace(d, assignment={k: tuple(reversed(v)) for k, v in d.assignment.items()})

        h.daemon.policy.decide = reversed_nodes  # type: ignore[method-assign]
        plans = len(h.events("plan"))
        h.step(6.0, decide=True)
        h.run_until(10.0)
        assert set(h.daemon.runs[job].members) == set(h.daemon.decide.nodes_of(job))
        assert len(h.events("plan")) == plans  # not a new plan
        assert _state(h, job) is JobState.RUNNING
    finally:
        h.close()


def test_daemon_policy_state_survives_a_restart_mid_profile(tmp_path: Path) -> None:
    h, a, b = _lending_setup(tmp_path)
    h.run_until(10.0)
    before = h.daemon.policy.state
    assert b in before.profiles and before.debts[b].lender == a
    h.close()
    h2 = Harness(tmp_path / "d", PolicyConfig(profiling="requested", max_running=4, profile_time_cap_s=60.0),
                 cluster=h.cluster, now=11.0)
    try:
        st = h2.daemon.policy.state
        assert b in st.profiles and st.profiles[b].count == 2 and st.profiles[b].plan.lender == a
        assert st.debts[b] == before.debts[b]
        assert st.lent_at[a] == before.lent_at[a] and st.admitted == before.admitted
    finally:
        h2.close()


def _crash(h: Harness) -> None:
    """The daemon dies (kill -9): workers go on, the store keeps every job as it was; only the lock
    and the sockets are let go, so a new daemon can open the state dir in this process."""
    d = h.daemon
    d.act.stop_workers = lambda run, now: None  # type: ignore[method-assign]
    d.act.set_state = lambda run, state, reason: None  # type: ignore[method-assign]
    d.close()


def test_daemon_resumes_a_profile_and_its_debt_after_a_crash(tmp_path: Path) -> None:
    h, a, b = _lending_setup(tmp_path)
    h.run_until(10.0)
    debt = h.daemon.policy.state.debts[b]
    _crash(h)
    h2 = Harness(tmp_path / "d", PolicyConfig(profiling="requested", max_running=4, profile_time_cap_s=60.0),
                 cluster=h.cluster, now=11.0)
    try:
        h2.monitor.curves.update(h.monitor.curves)
        h.cluster.reconnect_agents()  # the agents kept the workers and say so to the new daemon
        st = h2.daemon.policy.state
        assert st.profiles[b].count == 2 and st.debts[b] == debt
        h2.run_until(14.0)  # adoption window (agent_dead_after + 1 s), then the same plan goes on
        assert h2.daemon.runs[b].members == ["n03", "n04"] and _state(h2, b) is JobState.PROFILING
        assert st.profiles[b].count == 2 and st.debts[b] == debt
        assert not h2.events("profile_aborted")
        h2.run_until(40.0)  # two steps of 10 s of fresh evidence: the profile ends, A gets its nodes back
        assert b not in st.profiles and b not in st.debts
        assert [(e["job"], e["nodes"], e["borrower"]) for e in h2.events("returned")] == [(a, 2, b)]
        assert [e["job"] for e in h2.events("profile_done")] == [b]
        assert len(h2.daemon.decide.nodes_of(a)) > 2
    finally:
        h2.close()


def test_daemon_view_is_its_trainers_ledger_a_recall_ends_a_fragment_once(tmp_path: Path) -> None:
    """The daemon keeps no idle or interruption bookkeeping of its own: the view its policy decides
    on is its trainer's ledger's, so a recalled node's idle fragment is shown once and the job that
    held it is interrupted at the recall."""
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:3])
        job = h.submit("A", LINEAR, max_nodes=3)
        h.run_until(5.0)
        assert _state(h, job) is JobState.RUNNING and len(h.daemon.runs[job].members) == 3
        ledger = next(iter(h.daemon.trainers.values())).ledger
        victim = h.daemon.decide.nodes_of(job)[-1]
        since = ledger.idle_since(victim)
        assert since is not None and ledger.holder(victim) == job
        views: list[View] = []
        decide = h.daemon.policy.decide

        def seen(view, evidence):
            views.append(view)
            return decide(view, evidence)

        h.daemon.policy.decide = seen  # type: ignore[method-assign]
        h.cluster.recall(victim)
        h.step(8.0, decide=True)
        shown = next(j for j in views[-1].jobs if j.id == job)
        assert views[-1].ended_fragments == (8.0 - since,)
        assert shown.last_interrupted == 8.0 and victim not in shown.nodes and len(shown.nodes) == 2
        assert ledger.idle_since(victim) is None and set(h.daemon.decide.nodes_of(job)) == set(shown.nodes)
        h.step(9.0, decide=True)
        assert views[-1].ended_fragments == ()  # learned by the last decision: not given again
    finally:
        h.close()


def test_daemon_words_a_stop_from_its_typed_reason_never_from_text(tmp_path: Path) -> None:
    """The daemon's message for a job the policy stops is the :class:`policy.Stop`'s own wording: a stop
    over budget says so with its figures, though the job file sets no budget and no text is parsed."""
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:2])
        job = h.submit("A", LINEAR, max_nodes=2)  # no budget_node_hours in its spec
        h.run_until(5.0)
        assert _state(h, job) is JobState.RUNNING
        decide = h.daemon.policy.decide

        def over(view, evidence):
            return replace(decide(view, evidence), stop={job: Stop(StopReason.OVER_BUDGET, 2.5, 2.0)})

        h.daemon.policy.decide = over  # type: ignore[method-assign]
        h.step(6.0, decide=True)
        rec = h.daemon.store.require(job)
        assert rec.state is JobState.CANCELLED and rec.message == "over budget: used 2.5 of 2 node-hours"
    finally:
        h.close()


def test_daemon_suspends_a_job_a_recall_takes_below_its_min_as_the_ledger_says(tmp_path: Path) -> None:
    """A lost node's consequence is the ledger's :class:`policy.Loss`: a recall that leaves a job below
    its min gives a SUSPENDED outcome, and the daemon suspends the job with that Loss's reason."""
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:2])
        job = h.submit("A", LINEAR, min_nodes=2, max_nodes=2)
        h.run_until(5.0)
        assert _state(h, job) is JobState.RUNNING and len(h.daemon.runs[job].members) == 2
        ledger = next(iter(h.daemon.trainers.values())).ledger
        losses: list[Loss] = []
        lost = ledger.lost

        def seen(nodes, at):
            out = lost(nodes, at)
            losses.extend(out)
            return out

        ledger.lost = seen  # type: ignore[method-assign]
        h.cluster.recall(NODES[1])
        h.step(6.0)
        h.run_until(8.0)
        (loss,) = [x for x in losses if x.job == job]
        assert loss.outcome is LossOutcome.SUSPENDED and (loss.left, loss.min_nodes) == (1, 2)
        rec = h.daemon.store.require(job)
        assert rec.state is JobState.SUSPENDED and rec.message == loss.describe()
        assert h.daemon.runs[job].members == [] and not h.daemon.runs[job].workers
    finally:
        h.close()


def test_daemon_view_shows_known_recall_times_of_its_usable_nodes_only(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:2])
        h.run_until(3.0)
        held = sorted(h.daemon.scav.usable())
        assert held == sorted(NODES[:2])
        planned = {held[0]: 300.0, NODES[3]: 400.0}  # a planned start on one of ours, one on a node not ours
        h.daemon.scav.recall_times = lambda: dict(planned)  # type: ignore[method-assign]
        h.step(4.0)  # the ledger learns them at the next step (a view feeds nothing)
        assert h.daemon.decide.view(h.now).recall_at == {held[0]: 300.0}
    finally:
        h.close()


class _ViewSpy(Policy):
    """The policy, keeping every view it decided on."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__(config)
        self.views: list[View] = []

    def decide(self, view: View, evidence: Any) -> Decision:
        self.views.append(view)
        return super().decide(view, evidence)


def test_the_simulator_feeds_known_recalls_as_the_daemon_feeds_its_schedulers(tmp_path: Path) -> None:
    """With ``recall_notice_s``, a recall of a node we hold is in the views of that long before it, as
    the daemon's ledger has a scheduler's planned starts (``recall_expected``); without, none is."""
    def views(notice: float) -> list[View]:
        spy = _ViewSpy(SCENARIO.policy)
        specs = [SimJobSpec(name=j.name, model=j.name, samples=float(j.samples or 1e15), scaling=dict(j.curve),
                            max_nodes=j.max_nodes, arrival_s=j.arrival) for j in SCENARIO.arrival_order]
        Simulator(sim_timeline(SCENARIO), Workload("c", "test", timed=specs, finite=True),
                  SimPolicy("spy", spy, lambda spec: spec.believed_scaling), SimConfig(recall_notice_s=notice),
                  monitor_factory=lambda job_id, spec: ScriptedSimMonitor(spec.scaling)).run()
        return spy.views

    known = [(v.now, dict(v.recall_at)) for v in views(100.0) if v.recall_at]
    assert known and all(50.0 <= now < 150.0 and at == {NODES[1]: 150.0} for now, at in known)
    assert not any(v.recall_at for v in views(0.0))
