"""Pilots queued for recalled nodes (a node back trains within seconds).

When the main scheduler preempts one of our pilots, the daemon's side of the backend
(:class:`malletrain.daemon.scavenging.Scavenging`) queues a new pilot for that node at once: it waits
while the main job runs, is not cancelled as stuck meanwhile, starts the moment the node is
given back, and is cancelled when the daemon no longer wants the node. Run against the Slurm
backend over :class:`tests.clusters.fake_slurm.FakeSlurm` (no scheduler needed).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from malletrain.daemon.scavenging import REQUEUE_AFTER_S, Scavenging, parse_pilots, pilots_json
from scavenger.base import AgentRoster, CommandResult, PilotStarted, PilotState, PilotView, SavedPilot
from scavenger.slurm import SlurmBackend, SlurmConfig
from tests.clusters.fake_slurm import FakeSlurm

NODES = ["n00", "n01", "n02"]
MAX_QUEUED_S = 60.0


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Hub(AgentRoster):
    def alive(self) -> set[str]:
        return set()


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, kind: str, job: object = None, **detail: Any) -> None:
        self.seen.append((kind, detail))

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [d for k, d in self.seen if k == kind]


DRAINED: set[str] = set()


def sinfo_with_drained(slurm: FakeSlurm) -> Any:
    """The stand-in's runner, with the nodes in :data:`DRAINED` reported ``drained`` by sinfo."""
    def run(argv: Any, **kw: Any) -> CommandResult:
        res = slurm.run(argv, **kw)
        if argv[0] != "sinfo" or not DRAINED:
            return res
        lines = [f"{ln.split('|')[0]}|drained" if ln.split("|")[0] in DRAINED else ln
                 for ln in res.stdout.splitlines()]
        return replace(res, stdout="".join(ln + "\n" for ln in lines))
    return run


def scavenging_on(slurm: FakeSlurm, clock: Clock, **kw: Any) -> tuple[Scavenging, SlurmBackend, Events]:
    DRAINED.clear()
    backend = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", max_pilots=100, submit_rate=1000.0,
                                       submit_burst=100, renew_before_s=0.0, max_queued_s=MAX_QUEUED_S),
                           clock=clock, runner=sinfo_with_drained(slurm))
    events = Events()
    return Scavenging(backend, Hub(), events, **kw), backend, events


def step(scav: Scavenging, clock: Clock, wanted: Any = None) -> list[Any]:
    """One daemon step's worth: look, then hold."""
    events = scav.look(clock())
    scav.hold_idle(clock(), wanted)
    return events


def recalled_setup(**kw: Any) -> tuple[FakeSlurm, Clock, Scavenging, SlurmBackend, Events, str]:
    """Every node held by a pilot, then n00 recalled by the main queue; the old pilot's id."""
    clock = Clock()
    slurm = FakeSlurm(NODES, clock=clock)
    scav, backend, events = scavenging_on(slurm, clock, **kw)
    step(scav, clock)
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    assert set(backend.held_nodes()) == set(NODES)
    old = backend.held_nodes()["n00"]
    clock.t += 5
    assert slurm.recall("n00") == old
    return slurm, clock, scav, backend, events, old


def waiting_on(backend: SlurmBackend, node: str) -> list[PilotView]:
    return [v for v in backend.pilots().values() if node in v.nodes and v.state is PilotState.QUEUED]


def test_a_recalled_nodes_pilot_is_queued_at_once_and_starts_when_the_node_comes_back() -> None:
    slurm, clock, scav, backend, events, old = recalled_setup()
    step(scav, clock)  # the preemption is seen: the daemon shrinks its jobs off n00 first, no sbatch
    clock.t += REQUEUE_AFTER_S - 1
    step(scav, clock)
    assert waiting_on(backend, "n00") == []
    clock.t += 1
    step(scav, clock)  # the node is still the main queue's
    [view] = waiting_on(backend, "n00")
    assert view.waits_for_node and view.id != old
    assert [d["nodes"] for d in events.kinds("pilot_submitted") if d.get("waits_for_node")] == [["n00"]]
    for _ in range(5):  # the main job runs for longer than max_queued_s: the pilot is not stuck
        clock.t += MAX_QUEUED_S / 2
        step(scav, clock)
    assert [v.id for v in waiting_on(backend, "n00")] == [view.id]
    slurm.give_back("n00")
    slurm.tick()  # the scheduler starts what waits for the node, before our next look
    assert slurm.running().get("n00") == view.id
    started = [e for e in step(scav, clock) if isinstance(e, PilotStarted)]
    assert [e.pilot for e in started] == [view.id]
    assert backend.held_nodes()["n00"] == view.id
    assert len([d for d in events.kinds("pilot_submitted") if "n00" in d["nodes"]]) == 2  # no third


def test_without_requeue_the_node_waits_for_the_next_look() -> None:
    slurm, clock, scav, backend, events, old = recalled_setup(requeue_recalled=False)
    step(scav, clock)
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    assert waiting_on(backend, "n00") == []
    slurm.give_back("n00")
    slurm.tick()
    assert "n00" not in slurm.running()  # nothing of ours was there to start
    step(scav, clock)  # the usual rule: the next look finds it idle and submits
    assert "n00" in slurm.running()


def test_a_queued_pilot_for_a_node_no_longer_wanted_is_cancelled() -> None:
    slurm, clock, scav, backend, events, old = recalled_setup()
    step(scav, clock)
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    [view] = waiting_on(backend, "n00")
    clock.t += 1
    step(scav, clock, wanted=lambda node: node != "n00")
    assert waiting_on(backend, "n00") == [] or all(v.cancelling for v in waiting_on(backend, "n00"))
    assert [d["pilot"] for d in events.kinds("pilot_cancelled")] == [view.id]
    slurm.give_back("n00")
    slurm.tick()
    assert "n00" not in slurm.running()


def test_a_node_given_back_at_once_gets_one_pilot_by_the_usual_rule() -> None:
    slurm, clock, scav, backend, events, old = recalled_setup()
    slurm.give_back("n00")  # the main job ended before the daemon even saw the preemption
    step(scav, clock)
    assert len([d for d in events.kinds("pilot_submitted") if "n00" in d["nodes"]]) == 1  # only the first yet
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    assert len([d for d in events.kinds("pilot_submitted") if "n00" in d["nodes"]]) == 2  # the first, and one
    assert not any(d.get("waits_for_node") for d in events.kinds("pilot_submitted"))  # by the usual rule


def test_a_recalled_node_seen_idle_before_the_main_job_starts_gets_a_waiting_pilot_not_a_stuck_one() -> None:
    slurm, clock, scav, backend, events, old = recalled_setup()
    slurm.give_back("n00")  # the look between the pilot's end and the main job's start sees it idle
    step(scav, clock)
    assert not [v for v in backend.pilots().values() if "n00" in v.nodes]  # no pilot by accident
    slurm.recall("n00")  # the main job starts
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    [view] = waiting_on(backend, "n00")
    assert view.waits_for_node
    clock.t += 2 * MAX_QUEUED_S  # a long main job: the pilot still waits
    step(scav, clock)
    assert [v.id for v in waiting_on(backend, "n00") if not v.cancelling] == [view.id]


def test_a_node_drained_while_the_pilot_waits_makes_it_stuck_after_max_queued() -> None:
    slurm, clock, scav, backend, events, old = recalled_setup()
    step(scav, clock)
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    [view] = waiting_on(backend, "n00")
    DRAINED.add("n00")  # the main job ends and the node is drained: the pilot can never start
    slurm.give_back("n00")
    slurm.recall("n00")  # (the stand-in keeps it from starting; sinfo says drained)
    clock.t += MAX_QUEUED_S + 1
    step(scav, clock)
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    assert [v for v in waiting_on(backend, "n00") if not v.cancelling] == []
    assert ("n00", view.id) not in slurm.running().items()


def test_a_restarted_daemon_keeps_knowing_the_pilot_waits_for_its_node() -> None:
    saved = parse_pilots(pilots_json({
        "7": PilotView("7", PilotState.QUEUED, ("n00",), None, waits_for_node=True),  # type: ignore[arg-type]
        "8": PilotView("8", PilotState.RUNNING, ("n01",), None),  # type: ignore[arg-type]
    }))
    assert sorted(saved, key=lambda p: p.id) == [SavedPilot("7", ("n00",), None, True),  # type: ignore[arg-type]
                                                 SavedPilot("8", ("n01",), None, False)]  # type: ignore[arg-type]
    assert '"waits"' not in pilots_json({"8": PilotView("8", PilotState.RUNNING, ("n01",), None)})  # type: ignore


def test_pilots_waiting_for_recalled_nodes_are_capped_and_idle_nodes_come_first() -> None:
    clock = Clock()
    slurm = FakeSlurm([*NODES, "n03"], clock=clock)
    scav, backend, events = scavenging_on(slurm, clock, max_waiting=1)
    step(scav, clock, wanted=lambda node: node != "n03")  # n03 is not wanted yet
    step(scav, clock, wanted=lambda node: node != "n03")
    assert set(backend.held_nodes()) == set(NODES) and "n03" not in slurm.running()
    clock.t += 5
    slurm.recall("n00")
    slurm.recall("n01")
    step(scav, clock)
    clock.t += REQUEUE_AFTER_S
    step(scav, clock)
    waiting = [v for v in backend.pilots().values() if v.waits_for_node]
    assert len(waiting) == 1  # a machine-wide recall does not fill max_pilots with waiting pilots
    assert "n03" in slurm.running()  # and the idle node was held in the same step
