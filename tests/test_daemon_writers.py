"""One writer for each fact of the daemon, seen while it runs (not read from its spelling).

While real daemon runs of other tests go on (fakes with the test's clock, and the local backend's
real agents and workers), every write to a :class:`JobRun` field is recorded with the daemon module
whose code made it: an assignment, or a change to the field's dict, set or list in place. Each field
has one writer module (a part of the daemon, or :mod:`malletrain.daemon.records` where the record's
own methods hold its transitions); a job's phase (:class:`JobPhase`, with its one transition table,
and the :class:`JobState` the store keeps of it) moves by :meth:`JobRun.move` alone. The parts keep no flag of their own that they set while running, so "decide
again" is the loop's alone. A second writer of a field, or a second flag, fails here whatever it is
called. Below: a lost node reaches the ledger by one path, and a node's status is one enum.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import pytest

from malletrain.daemon import Daemon, JobRun
from malletrain.daemon.act import Act
from malletrain.daemon.adoption import Adoption
from malletrain.daemon.api import ControlApi
from malletrain.daemon.decide import Decide
from malletrain.daemon.intake import JobIntake
from malletrain.daemon.observe import Observe
from malletrain.daemon.shutdown import Shutdown
from malletrain.daemon.state import JobTable
from malletrain.daemon.sweeps import SweepDriver
from malletrain.daemon.jobspec import JobSpec, JobState
from policy import PolicyConfig

PACKAGE = "malletrain.daemon."
PARTS: tuple[type, ...] = (Daemon, Observe, JobIntake, Adoption, Decide, Act, ControlApi, Shutdown, SweepDriver,
                           JobTable)
FLAGS_ALLOWED = {("Daemon", "_changed"), ("Daemon", "_closed"), ("JobTable", "stopping")}
"""The loop's "something changed: decide again" and "closed", and the table's stop request (a
Shutdown request or a signal): the only booleans a part rewrites while the daemon runs."""

Writes = dict[str, set[str]]  # field -> the daemon modules that wrote it


def _writer(frame: FrameType | None) -> str | None:
    """The daemon module whose code made a write (the first frame in malletrain.daemon, this file's
    recorders skipped); None for a write made outside the daemon (a test poking a run)."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(PACKAGE):
            return name[len(PACKAGE):]
        if name != __name__:
            return None
        frame = frame.f_back
    return None


def _tracked(kind: type, fld: str, note: Callable[[str], None]) -> type:
    """A dict, set or list that notes every change in place as a write to ``fld``."""
    mutators = {dict: ("__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault"),
                set: ("add", "discard", "remove", "pop", "clear", "update", "difference_update",
                      "intersection_update", "symmetric_difference_update", "__ior__", "__iand__", "__isub__"),
                list: ("__setitem__", "__delitem__", "append", "extend", "insert", "pop", "remove", "clear",
                       "sort", "reverse", "__iadd__")}[kind]

    def wrap(name: str) -> Callable[..., Any]:
        base = getattr(kind, name)

        def method(self: Any, *args: Any, **kw: Any) -> Any:
            note(fld)
            return base(self, *args, **kw)
        return method

    return type(f"Tracked{kind.__name__}", (kind,), {name: wrap(name) for name in mutators})


@contextmanager
def recording() -> Iterator[tuple[Writes, set[tuple[str, str]]]]:
    """Record every JobRun field's writers and every boolean a part rewrites, while the block runs."""
    writes: Writes = {}
    flags: set[tuple[str, str]] = set()
    classes: dict[tuple[type, str], type] = {}

    def note(fld: str) -> None:
        note_from(sys._getframe(1), fld)

    run_setattr = JobRun.__setattr__

    def on_run(self: JobRun, name: str, value: Any) -> None:
        caller = sys._getframe(1)
        if caller.f_code.co_name not in ("__init__", "__post_init__"):  # construction is no write of a fact
            note_from(caller, name)
        kind = type(value)
        if kind in (dict, set, list):
            cls = classes.get((kind, name))
            if cls is None:
                cls = classes[(kind, name)] = _tracked(kind, name, note)
            value = cls(value)
        run_setattr(self, name, value)

    def note_from(frame: FrameType, fld: str) -> None:
        who = _writer(frame)
        if who is not None:
            writes.setdefault(fld, set()).add(who)

    saved = {part: part.__setattr__ for part in PARTS}

    def on_part(original: Callable[[Any, str, Any], None]) -> Callable[[Any, str, Any], None]:
        def setattr_(self: Any, name: str, value: Any) -> None:
            if isinstance(value, bool) and isinstance(getattr(self, name, None), bool):
                flags.add((type(self).__name__, name))
            original(self, name, value)
        return setattr_

    own = {cls: "__setattr__" in vars(cls) for cls in (JobRun, *PARTS)}  # to put each class back as it was
    JobRun.__setattr__ = on_run  # type: ignore[method-assign,assignment]
    for part, original in saved.items():
        part.__setattr__ = on_part(original)  # type: ignore[method-assign,assignment]
    try:
        yield writes, flags
    finally:
        for cls, had in own.items():
            if had:
                cls.__setattr__ = run_setattr if cls is JobRun else saved[cls]  # type: ignore[method-assign]
            else:
                del cls.__setattr__


def _run_tests_of(module: ModuleType, tmp_path: Path, names: tuple[str, ...] | None = None) -> int:
    """Run the tests of ``module`` that take only ``tmp_path`` (their daemon runs are what is recorded)."""
    ran = 0
    for name, fn in sorted(vars(module).items()):
        if not name.startswith("test_") or not callable(fn) or (names is not None and name not in names):
            continue
        marks = {m.name for m in getattr(fn, "pytestmark", [])}
        if list(inspect.signature(fn).parameters) != ["tmp_path"] or marks & {"slow", "slurm", "pbs", "skip"}:
            continue
        where = tmp_path / f"t{ran}"  # (short: a Unix socket's path is at most 107 bytes)
        where.mkdir()
        fn(where)
        ran += 1
    return ran


OWNERS: dict[str, str] = {
    # act: what it publishes, as act makes it
    "members": "act", "published": "act", "start_sent": "act", "ready_at": "act",
    "emptied_at": "act", "workers_since": "act",
    # observe: what happened to the job (its workers started, its rescales measured)
    "started": "observe", "inherited": "observe", "rescales": "observe",
    # the record's own transitions (its worker table, progress and health, an end asked): its methods,
    # called by the parts (act starts and stops workers, observe records those that exited or were lost)
    "workers": "records", "leaving": "records", "base_samples": "records", "last_progress": "records", "saved_samples": "records", "progress_at": "records",
    "failures": "records", "early_failures": "records", "stalled": "records", "stalled_s": "records",
    "stall_restarts": "records", "restart": "records", "ending": "records",
    "phase": "records", "state": "records",  # JobRun.move, the one way a phase changes (act, adoption, an end)
    # decide: what the policy and the ledger say of the job
    "waiting": "decide", "suspended_by": "decide",
    # adoption: the last daemon's job, while the adoption window is open
    "left_on": "adoption",
}


def _check(writes: Writes, flags: set[tuple[str, str]]) -> None:
    many = {f: sorted(w) for f, w in writes.items() if len(w) > 1}
    assert not many, f"fields with more than one writer: {many}"
    wrong = {f: (sorted(w), OWNERS.get(f)) for f, w in writes.items() if w != {OWNERS.get(f)}}
    assert not wrong, f"fields written by another part than their owner (writers, owner): {wrong}"
    assert flags <= FLAGS_ALLOWED, f"a flag besides the loop's: {sorted(flags - FLAGS_ALLOWED)}"


def test_each_job_field_and_the_decide_again_flag_have_one_writer_on_fakes(tmp_path: Path) -> None:
    import tests.test_conformance as conformance
    import tests.test_daemon_shape as shape
    import tests.test_join_batch as join_batch
    import tests.test_restarts as restarts
    import tests.test_trainers as trainers
    import tests.test_worker_exits as worker_exits

    with recording() as (writes, flags):
        ran = 0
        for i, module in enumerate((conformance, worker_exits, join_batch, trainers, restarts)):
            (tmp_path / f"m{i}").mkdir()
            ran += _run_tests_of(module, tmp_path / f"m{i}")
        (tmp_path / "s").mkdir()
        ran += _run_tests_of(shape, tmp_path / "s",
                             ("test_a_job_submitted_through_the_control_api_is_decided_at_the_next_step",))
    assert ran >= 25, ran
    # the runs went through the transitions this checks (each field written at least once)
    assert set(OWNERS) - set(writes) <= {"base_samples", "rescales", "stalled", "stalled_s", "stall_restarts",
                                         "restart"}, sorted(set(OWNERS) - set(writes))
    _check(writes, flags)


def test_the_recorder_sees_a_second_writer_and_a_second_flag(tmp_path: Path) -> None:
    """The check above can fail: a write of another part, in place or by assignment, and a part's own
    flag, are seen."""
    from tests.test_conformance import Harness

    h = Harness(tmp_path / "d", PolicyConfig())
    try:
        with recording() as (writes, flags):
            run = JobRun("j000001", JobSpec("j", ("true",), 1, 1), JobState.PENDING)
            exec("run.workers['n01'] = 'w'; run.waiting = 'x'", {"__name__": PACKAGE + "observe", "run": run})
            exec("api._flag = False; api._flag = True", {"__name__": PACKAGE + "api", "api": h.daemon.api})
    finally:
        h.close()
    assert writes == {"workers": {"observe"}, "waiting": {"observe"}} and flags == {("ControlApi", "_flag")}
    with pytest.raises(AssertionError, match="fields written by another part"):
        _check(writes, set())
    with pytest.raises(AssertionError, match="a flag besides the loop's"):
        _check({}, flags)


@pytest.mark.slow
def test_each_job_field_has_one_writer_with_real_agents_and_workers(tmp_path: Path) -> None:
    """The local backend: real agents and toy workers grow, shrink on a recall, complete, fail and are
    cancelled."""
    import tests.test_daemon as real

    with recording() as (writes, flags):
        for i, name in enumerate(("test_job_grows_on_arrival_shrinks_on_recall_and_keeps_training",
                                  "test_completion_failure_and_cancel")):
            made: list[Daemon] = []
            where = tmp_path / f"t{i}"
            where.mkdir()

            def make(**kw: Any) -> Daemon:
                d = Daemon(real.config(where, **kw))  # noqa: B023
                made.append(d)  # noqa: B023
                return d
            try:
                getattr(real, name)(make)
            finally:
                for d in made:
                    d.close()
    assert {"state", "workers", "leaving", "members", "rescales", "ending", "last_progress"} <= set(writes)
    _check(writes, flags)


# ---- a lost node by one path -----------------------------------------------------------------------


def _ledger_state(ledger: Any, now: float) -> tuple[Any, ...]:
    jobs = sorted(ledger.live_jobs())
    return (ledger.ours(), ledger.free_nodes(), {j: ledger.nodes_of(j) for j in jobs},
            {j: ledger.job(j) for j in jobs}, ledger.view(now, jobs))


def test_a_recall_reaches_the_ledger_once_by_the_usable_sets_difference_and_view_feeds_nothing(
        tmp_path: Path) -> None:
    """A recall is learnt twice (the agent gone, read while the loop waits; the pilot ended, at the
    step): both only wake the loop, and the ledger is told of the loss once, at the step's feed,
    before the decision that answers it. Asking for the view twice changes nothing."""
    from tests.test_conformance import LINEAR, NODES, Harness

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:3])
        job = h.submit("A", LINEAR, max_nodes=3)
        h.run_until(5.0)
        ledger = next(iter(h.daemon.trainers.values())).ledger
        victim = h.daemon.decide.nodes_of(job)[-1]
        told: list[tuple[tuple[str, ...], float]] = []
        lost = ledger.lost

        def spy(nodes: Any, at: float) -> Any:
            told.append((tuple(nodes), at))
            return lost(nodes, at)

        ledger.lost = spy  # type: ignore[method-assign]
        h.cluster.recall(victim)  # its agent goes and its pilot ends: two events of one loss
        h.now = 7.5
        h.daemon._observe_agents_between_steps(h.now)  # the agent's frame, read while the loop waits
        assert told == [] and victim not in h.daemon.runs[job].workers  # observed, not yet fed
        h.daemon.scav.recall_times = lambda: {NODES[0]: 300.0}  # type: ignore[method-assign]  # news for a feed
        before = _ledger_state(ledger, h.now)
        first, second = h.daemon.decide.view(h.now), h.daemon.decide.view(h.now)
        assert first == second and _ledger_state(ledger, h.now) == before  # a getter: it feeds nothing
        del h.daemon.scav.recall_times
        h.step(8.0, decide=True)
        assert [n for n, _ in told if victim in n] == [(victim,)] and told[0][1] == 8.0
        assert ledger.job(job).last_interrupted == 8.0 and victim not in h.daemon.decide.nodes_of(job)
        h.step(9.0, decide=True)
        h.step(10.0, decide=True)
        assert [n for n, _ in told if victim in n] == [(victim,)]  # once, whatever the decisions after it
    finally:
        h.close()


def test_a_nodes_status_is_one_enum_derived_in_one_place(tmp_path: Path) -> None:
    """What ``malletrain nodes`` shows and what the sampler counts come from one place,
    :meth:`Scavenging.node_states`, as :class:`NodeStatus` members (not strings compared by spelling)."""
    from malletrain.daemon.scavenging import NodeStatus
    from tests.test_conformance import NODES, Harness

    h = Harness(tmp_path / "d", PolicyConfig(profiling="never"))
    try:
        h.cluster.became_idle(*NODES[:2])
        h.run_until(3.0)
        states = h.daemon.scav.node_states()
        assert all(type(s) is NodeStatus for s in states.values())
        assert {states[n] for n in NODES[:2]} == {NodeStatus.HELD} and states[NODES[2]] is NodeStatus.BUSY
        assert {n["node"]: n["state"] for n in h.daemon.api.status_nodes()} == {n: s.value for n, s in states.items()}
    finally:
        h.close()
