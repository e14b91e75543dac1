"""The daemon's shape: one class with no base class, built from parts that call each other one
way only. That the "decide again" flag is the loop's alone, and each job field has one writer, is
seen while the daemon runs (``tests/test_daemon_writers.py``), not read from the spelling."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

from malletrain.daemon import Daemon
from malletrain.daemon.adoption import Adoption
from malletrain.daemon.api import ControlApi
from malletrain.daemon.intake import JobIntake
from malletrain.daemon.act import Act
from malletrain.daemon.observe import Observe
from malletrain.daemon.shutdown import Shutdown
from malletrain.daemon.sweeps import SweepDriver
from malletrain.daemon.decide import Decide
from malletrain.daemon.wiring import Wiring

PARTS: tuple[type, ...] = (Daemon, Wiring, Observe, JobIntake, Adoption, Decide, Act, ControlApi, Shutdown,
                           SweepDriver)


def test_the_daemon_has_no_base_class_but_object() -> None:
    assert Daemon.__bases__ == (object,), f"Daemon's bases: {Daemon.__bases__}"
    for part in PARTS:
        assert len(part.__bases__) <= 1 and not any(b in PARTS for b in part.__bases__), part


def _calls(part: type) -> set[type]:
    """The other parts ``part`` may call: those its constructor takes, and those its module names."""
    hints = typing.get_type_hints(part.__init__)
    taken = {h for h in hints.values() if h in PARTS}
    module = inspect.getmodule(part)
    assert module is not None
    names = vars(module)  # a name resolved in the part's own module (api's ``Shutdown`` is a request)
    named = {names.get(n.id) for n in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(n, ast.Name)}
    return (taken | {p for p in PARTS if p in named}) - {part}


def test_no_part_of_the_daemon_calls_back_into_a_part_that_calls_it() -> None:
    graph = {part: _calls(part) for part in PARTS}
    order: list[type] = []  # parts that call no part left to place: a topological order exists, or a cycle
    left = dict(graph)
    while left:
        leaves = [p for p, calls in left.items() if not (calls & set(left))]
        assert leaves, "parts that call each other: " + ", ".join(
            f"{p.__name__} -> {sorted(c.__name__ for c in calls & set(left))}" for p, calls in left.items())
        order += leaves
        for p in leaves:
            del left[p]
    assert graph[Decide] == set() and graph[Act] == set(), "decide and act call no other part"
    assert Daemon not in set().union(*(graph[p] for p in PARTS if p is not Daemon)), "no part calls the daemon"


def test_a_job_submitted_through_the_control_api_is_decided_at_the_next_step(tmp_path: Path) -> None:
    """What a request submitted goes into the store; the loop observes it at its next step and
    decides for it then (not at the next periodic replan), whether the request came through the
    socket or not."""
    from malletrain.daemon.control import Caller, Submit
    from policy import PolicyConfig

    try:
        from test_conformance import NODES, Harness
    except ImportError:  # run from the repository root as a package
        from tests.test_conformance import NODES, Harness  # type: ignore[no-redef]

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never", admission="fixed"))
    try:
        h.cluster.became_idle(*NODES[:2])
        h.run_until(3.0)  # nothing to run: decided, and the next replan is seconds away
        decided = len(h.decisions)
        ok = h.daemon.api.handle(Submit({"command": ["true"], "max_nodes": 2}, 0, 0), Caller(0, 0, True))
        assert h.daemon.store.get(ok["id"]) is not None  # in the store: observed by the next step
        h.step(3.5)
        assert len(h.decisions) == decided + 1 and h.daemon.decide.nodes_of(ok["id"]) != ()
    finally:
        h.close()


def test_a_node_that_becomes_usable_without_an_event_is_decided_at_the_next_step(tmp_path: Path) -> None:
    """A returning node is usable once its pilot runs and its agent is connected, which may come a step
    after the agent's event: the usable set's difference itself asks for a decision, so the job grows
    then, not at the next periodic replan (10 s later)."""
    from policy import PolicyConfig

    try:
        from test_conformance import NODES, Harness
    except ImportError:  # run from the repository root as a package
        from tests.test_conformance import NODES, Harness  # type: ignore[no-redef]

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never", admission="fixed"))
    try:
        h.cluster.became_idle(*NODES[:2])
        job = h.submit("grow", {1: 10.0, 2: 20.0, 3: 30.0}, max_nodes=3)
        h.run_until(3.0)
        assert len(h.daemon.decide.nodes_of(job)) == 2
        h.cluster.became_idle(NODES[2])
        h.cluster.hub_events.clear()  # its agent is connected, but its hello is not seen as an event
        h.run_until(5.0)
        assert len(h.daemon.decide.nodes_of(job)) == 3
    finally:
        h.close()
