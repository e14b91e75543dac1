"""A burst of recalls becomes a new plan with work that follows the recalls, not the machine
(recall -> new plan at 4,608 nodes): the store's writes of one phase without a savepoint
each, and the others below."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from malletrain.daemon.jobspec import JobSpec
from malletrain.daemon.scavenging import PilotTexts, parse_pilots, pilots_json
from malletrain.daemon.store import Store
from scavenger.base import PilotId, PilotRequest, PilotState, PilotView, Throttled
from scavenger.slurm import SlurmBackend, SlurmConfig
from tests.clusters.fake_slurm import FakeSlurm

SPEC = JobSpec("j", ("true",))


# ---------------------------------------------------------------- the store: one statement per write in a batch
def test_a_batch_of_events_runs_one_statement_per_event(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    jid = store.submit(SPEC)
    ran: list[str] = []
    store.conn.set_trace_callback(ran.append)
    with store.batch():
        for i in range(40):
            store.log_event("agent_gone", node=f"n{i}")
        store.set_samples(jid, 9)
        store.set_meta("pilots", "{}")
    store.conn.set_trace_callback(None)
    assert len(ran) == 40 + 2 + 2  # the writes, BEGIN and COMMIT: no SAVEPOINT/RELEASE around each
    assert not any(sql.startswith(("SAVEPOINT", "RELEASE")) for sql in ran)
    assert len(list(store.events("agent_gone"))) == 40 and store.require(jid).samples == 9
    store.close()


def test_a_failed_single_write_in_a_batch_loses_only_itself(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    jid = store.submit(SPEC)
    store.conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.kind = 'bad' "
                       "BEGIN SELECT RAISE(ABORT, 'refused'); END")
    with store.batch():
        store.log_event("before", jid)
        store.log_event("bad", jid)  # refused: dropped and counted, never raised
        store.set_samples(jid, 5)
        store.log_event("after", jid)
    kinds = [e["kind"] for e in store.events()]
    assert "before" in kinds and "after" in kinds and "bad" not in kinds
    assert store.dropped_events == 1 and store.require(jid).samples == 5
    assert not store.conn.in_transaction
    store.close()


def test_a_single_write_outside_a_batch_is_its_own_commit(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.db")
    before = store.commits
    store.log_event("alone")
    store.set_meta("k", "v")
    assert store.commits == before + 2 and store.get_meta("k") == "v"
    store.close()


# ---------------------------------------------------------------- the backend: views of the pilots touched
def full_views(be: SlurmBackend) -> dict:
    return {r.id: r.view() for r in be.book.live()}


def full_held(views: dict) -> dict:
    return {n: pid for pid, v in views.items() if v.state is PilotState.RUNNING for n in v.nodes}


@pytest.mark.parametrize("seed", range(6))
def test_pilot_views_built_from_the_touched_pilots_equal_a_full_rebuild(seed: int) -> None:
    rng = random.Random(seed)
    clock = [1_790_000_000.0]
    nodes = [f"n{i}" for i in range(12)]
    slurm = FakeSlurm(nodes, clock=lambda: clock[0])
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", submit_rate=1e6, submit_burst=10**6,
                                  max_pilots=40, walltime_s=30.0, renew_before_s=10.0 * (seed % 2), max_queued_s=20.0),
                      clock=lambda: clock[0], runner=slurm.run)
    last_views, last_version = dict(be.pilots()), be.version
    for _ in range(300):
        what = rng.random()
        node = rng.choice(nodes)
        if what < 0.3:
            try:
                be.submit(PilotRequest((node,)))
            except Throttled:
                pass
        elif what < 0.45:
            slurm.recall(node)
        elif what < 0.6:
            slurm.give_back(node)
        elif what < 0.7 and be.pilots():
            pid = rng.choice(sorted(be.pilots()))
            (be.cancel_all([pid, rng.choice(sorted(be.pilots()))]) if rng.random() < 0.5 else be.cancel(pid))
        else:
            clock[0] += rng.choice((0.5, 2.0, 7.0))
            slurm.tick()
            be.poll()
        views = dict(be.pilots())
        assert views == full_views(be)
        assert list(views) == [r.id for r in be.book.live()]  # the book's order, as a full rebuild has it
        assert dict(be.held_nodes()) == full_held(full_views(be))
        assert (be.version != last_version) == (views != last_views)  # it moves when, and only when, a view did
        last_views, last_version = views, be.version


def test_an_old_mapping_of_views_stays_as_it_was() -> None:
    slurm = FakeSlurm(["n0", "n1"])
    be = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", submit_rate=100.0, submit_burst=10,
                                  renew_before_s=0.0), runner=slurm.run)
    a = be.submit(PilotRequest(("n0",)))
    be.poll()
    views, held = be.pilots(), be.held_nodes()
    be.submit(PilotRequest(("n1",)))
    be.cancel(a)
    be.poll()
    assert list(views) == [a] and views[a].state is PilotState.RUNNING and not views[a].cancelling
    assert dict(held) == {"n0": a}
    assert a not in be.pilots() and "n0" not in be.held_nodes()


# ---------------------------------------------------------------- the pilots kept for a restart
def test_the_pilots_json_written_from_the_last_entries_equals_one_written_whole() -> None:
    rng = random.Random(3)
    texts: PilotTexts = {}
    views: dict[PilotId, PilotView] = {}
    for step in range(400):
        pid = PilotId(str(rng.randrange(1, 60)))
        what = rng.random()
        if what < 0.2:
            views.pop(pid, None)
        else:
            state = rng.choice((PilotState.QUEUED, PilotState.RUNNING, PilotState.ENDING, PilotState.ENDED))
            views[pid] = PilotView(pid, state, (f"n{rng.randrange(9)}",), None,
                                   PilotId(str(rng.randrange(60))) if rng.random() < 0.2 else None,
                                   rng.random() < 0.2, rng.random() < 0.2)
        got = pilots_json(views, texts)
        assert got == pilots_json(views)  # the same text as one written whole
        assert parse_pilots(got) == parse_pilots(pilots_json(dict(views)))
    whole = {str(p): {"nodes": list(v.nodes), "replaces": v.replaces, **({"waits": True} if v.waits_for_node else {})}
             for p, v in views.items() if not v.cancelling and v.state is not PilotState.ENDED}
    assert json.loads(pilots_json(views, texts)) == whole


# ---------------------------------------------------------------- the loop: a recall's plan before scheduler commands
def _daemon_on_fake_slurm(tmp_path: Path, nodes: int = 6):
    """A daemon on the Slurm backend against the stand-in (commands counted), each agent a message
    handed to the real hub (hello when its pilot starts, ``leaving`` when its node is recalled)."""
    from malletrain.daemon.config import parse_config
    from malletrain.daemon import Daemon, DaemonParts
    from scavenger import protocol as P
    from scavenger.hub import AgentHub
    from tests.fakes import FakeRuntime

    clock = [1_790_000_000.0]
    inbox: list[object] = []

    class Hub(AgentHub):
        def poll(self, timeout_ms: int = 0, max_frames: int = 0) -> list[object]:
            msgs, inbox[:] = list(inbox), []
            return [ev for m in msgs for ev in self._handle(m, self.clock())]

        def send(self, msg: object) -> bool:
            if isinstance(msg, P.StartWorker):
                inbox.append(P.WorkerStarted(msg.node, msg.worker, 4242))
            return True

    names = [f"n{i}" for i in range(nodes)]
    slurm = FakeSlurm(names, clock=lambda: clock[0],
                      on_start=lambda node, pilot: inbox.append(P.Hello(node, 1, (), pilot)),
                      on_stop=lambda node, pilot, why: inbox.append(P.Leaving(node, "recalled")))
    cfg = parse_config({"state_dir": str(tmp_path / "state"), "runtime": "toy", "loop_interval": 0.1,
                        "agent_heartbeat": 5.0, "agent_dead_after": 86400.0,
                        "scavenger": {"kind": "slurm", "partition": "preemptable", "walltime": 86400.0,
                                      "max_pilots": nodes + 4, "submit_rate": 1000.0, "poll_interval": 1.0,
                                      "renew_before": 0.0}}, "test")
    backend = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", walltime_s=86400.0, max_pilots=nodes + 4,
                                       renew_before_s=0.0, submit_rate=1e6, submit_burst=10**6),
                           clock=lambda: clock[0], runner=slurm.run)
    hub = Hub(dead_after_s=1e9, clock=lambda: clock[0], key_file=tmp_path / "agent.key")
    d = Daemon(cfg, clock=lambda: clock[0], parts=DaemonParts(backend=backend, hub=hub, runtime=FakeRuntime()))
    d.store.submit(JobSpec("j", ("x",), 1, nodes))

    def step(quick: bool = False) -> None:
        d.step(quick)
        clock[0] += 0.1
        slurm.tick()

    for _ in range(60):
        step()
        if len(d.scav.usable()) == nodes and all(len(r.members) == nodes for r in d.runs.values()):
            break
    assert len(d.scav.usable()) == nodes, "the warm-up did not hold the machine"
    return d, slurm, step, hub


def test_a_quick_iteration_plans_for_a_recall_before_any_scheduler_command(tmp_path: Path) -> None:
    d, slurm, step, hub = _daemon_on_fake_slurm(tmp_path)
    try:
        run = next(iter(d.runs.values()))
        for _ in range(12):  # a poll is due in this iteration, whatever the phase
            step()
        lost = run.members[0]
        slurm.recall(lost)
        slurm.give_back(lost)  # idle again at once: a hold would submit a pilot for it
        d._observe_agents_between_steps(d.clock())  # the loop's wait read the leaving (and ended at once)
        commands: list[int] = []
        decide = d.decide.decide

        def noted(now: float) -> float | None:
            commands.append(sum(slurm.commands.values()))
            return decide(now)

        d.decide.decide = noted  # type: ignore[method-assign]
        before = sum(slurm.commands.values())
        d._next_decide = 0.0
        d.scav._next_look = 0.0  # the look is due
        step(quick=True)
        assert commands == [before]  # decided before squeue, sinfo, scontrol or sbatch ran
        assert lost not in d.trainers[next(iter(d.trainers))].last_decision.nodes_of(run.id)
        step()  # the next iteration looks at the scheduler as usual
        assert sum(slurm.commands.values()) > before and slurm.commands.get("squeue", 0) > 0
    finally:
        d.close()
        hub.close()


def test_the_loop_runs_a_quick_iteration_after_a_loss_never_two_in_a_row(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.loopwait import LoopWait

    calls: list[bool] = []
    answers = iter([False, True, True, True, False, True] + [False] * 1000)

    def fake_step(self: Daemon, quick: bool = False) -> None:
        calls.append(quick)
        if len(calls) >= 7:
            self.stopping = True

    monkeypatch.setattr(LoopWait, "wait", lambda self, seconds: next(answers))
    monkeypatch.setattr(Daemon, "step", fake_step)
    d = Daemon(DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", loop_interval=10.0,
                            local=LocalConfig(nodes=2, trace="none")))
    try:
        d.run()  # (its step and its wait are the fakes above)
    finally:
        d.close()
    # the wait's answers: none, lost, lost, lost, none, lost -> the next iteration quick after a loss, but a
    # quick one is followed by a full one even if another agent went meanwhile
    assert calls == [False, False, True, False, True, False, True]
