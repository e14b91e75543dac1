"""The daemon's side of its backend (malletrain/scavenging.py) and the [scavenger] config table.

No scheduler needed: a scripted backend speaks :class:`scavenger.base.SchedulerBackend`, and a
daemon configured for PBS on a machine without PBS shows that failing commands never kill it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from malletrain.config import ConfigError, DaemonConfig, ScavengerConfig, parse_config, to_toml
from malletrain.scavenging import Scavenging, view_extras
from policy import View
from scavenger.base import (
    Claim,
    CommandFailed,
    Discovery,
    NodeInfo,
    NodeState,
    PilotRequest,
    PilotState,
    PilotView,
    Throttled,
)


class ScriptedBackend:
    name = "scripted"

    def __init__(self, idle: set[str], claims: tuple[Claim, ...] = ()) -> None:
        self.idle = set(idle)
        self.claims = claims
        self.fail: Exception | None = None
        self.cap = 100
        self.views: dict[str, PilotView] = {}
        self.cancelled: list[str] = []

    def poll(self) -> list[Any]:
        if self.fail:
            raise self.fail
        return []

    def discover(self) -> Discovery:
        if self.fail:
            raise self.fail
        nodes = tuple(NodeInfo(n, NodeState.IDLE) for n in sorted(self.idle))
        return Discovery(nodes, self.claims, frozenset(self.idle - {n for v in self.views.values() for n in v.nodes}),
                         0.0)

    def submit(self, request: PilotRequest) -> str:
        if len(self.views) >= self.cap:
            raise Throttled("cap", None)
        pid = f"p{len(self.views) + len(self.cancelled) + 1}"
        self.views[pid] = PilotView(pid, PilotState.RUNNING, request.nodes, None)  # type: ignore[arg-type]
        return pid

    def cancel(self, pilot: str) -> None:
        self.cancelled.append(pilot)
        self.views.pop(pilot, None)

    def pilots(self) -> dict[str, PilotView]:
        return dict(self.views)

    def close(self) -> None:
        pass


class Hub:
    def __init__(self, alive: set[str], batch: dict[str, str] | None = None) -> None:
        self._alive, self._batch = alive, batch or {}

    def alive(self) -> set[str]:
        return set(self._alive)

    def batch_job(self, node: str) -> str | None:
        return self._batch.get(node)


def scav(backend: ScriptedBackend, hub: Hub, **kw: Any) -> tuple[Scavenging, list[tuple]]:
    log: list[tuple] = []
    return Scavenging(backend, hub, lambda kind, job=None, **d: log.append((kind, d)), **kw), log


def test_holds_idle_nodes_in_groups_and_stops_at_the_cap() -> None:
    b = ScriptedBackend({"a", "b", "c", "d", "e"})
    s, log = scav(b, Hub(set()), nodes_per_pilot=2)
    s.look(0.0)
    assert len(s.hold_idle(0.0)) == 2  # a+b, c+d; e alone is not a pilot of 2
    assert sorted(v.nodes for v in b.views.values()) == [("a", "b"), ("c", "d")]
    assert s.hold_idle(0.0) == []  # idempotent: nothing new is idle
    b.idle |= {"f"}
    b.cap = 2
    s.look(1.0)
    assert s.hold_idle(1.0) == [] and s.hold_idle(1.0) == []  # throttled: no call until it may retry


def test_stale_looks_make_no_decision_and_the_next_good_look_catches_up() -> None:
    b = ScriptedBackend({"a"})
    s, log = scav(b, Hub({"a"}))
    s.look(0.0)
    b.fail = CommandFailed("sinfo: exit 1: Unable to contact slurm controller")
    s.look(1.0)
    s.look(2.0)
    assert s.stale and [k for k, _ in log].count("backend_error") == 1  # logged once per outage
    assert s.hold_idle(2.0) == [] and b.views == {}  # nothing submitted on stale data
    b.fail = None
    s.look(3.0)
    assert not s.stale and ("backend_ok" in [k for k, _ in log])
    assert len(s.hold_idle(3.0)) == 1


def test_usable_nodes_need_a_running_pilot_and_its_own_agent() -> None:
    b = ScriptedBackend({"a", "b", "c"})
    b.views = {"1": PilotView("1", PilotState.RUNNING, ("a",), None),  # type: ignore[arg-type]
               "2": PilotView("2", PilotState.ENDING, ("b",), 5.0),  # type: ignore[arg-type]
               "3": PilotView("3", PilotState.RUNNING, ("c",), None)}  # type: ignore[arg-type]
    s, _ = scav(b, Hub({"a", "b", "c"}, {"a": "1", "c": "99"}))
    assert s.usable() == {"a"}  # b: ending; c: the agent there belongs to another batch job
    s.release({"a", "c"})
    assert b.cancelled == []  # their agents are up: nothing to give back
    s.hub = Hub({"c"})
    s.release({"a"})
    assert b.cancelled == ["1"]


def test_planned_starts_become_recall_times_in_the_view() -> None:
    b = ScriptedBackend({"a"}, (Claim("77", ("a", "b"), 500.0), Claim("78", ("a",), 300.0), Claim("79", ("c",), None)))
    s, _ = scav(b, Hub(set()))
    s.look(0.0)
    assert s.recall_times() == {"a": 300.0, "b": 500.0}
    assert view_extras(View, {"a": 300.0}) == {"recall_at": {"a": 300.0}}


def test_scavenger_config_errors_name_the_key() -> None:
    cases = {
        "scavenger.partition (or scavenger.qos) is required": {"scavenger": {"kind": "slurm"}},
        "scavenger.queue is required": {"scavenger": {"kind": "pbs"}},
        "scavenger.partition applies to kind = slurm only": {"scavenger": {"partition": "p"}},
        "scavenger.kind must be one of": {"scavenger": {"kind": "lsf"}},
        "disagree": {"backend": "local", "scavenger": {"kind": "pbs", "queue": "q"}},
        "scavenger.walltime must be >= 60": {"scavenger": {"kind": "pbs", "queue": "q", "walltime": 5}},
        "scavenger.renew_before must be less than scavenger.walltime":
            {"scavenger": {"kind": "slurm", "partition": "p", "walltime": 60, "renew_before": 60}},
        "unknown key(s) scavenger.nodes": {"scavenger": {"nodes": 3}},
    }
    for text, obj in cases.items():
        with pytest.raises(ConfigError, match=text.replace("(", r"\(").replace(")", r"\)")):
            parse_config(obj)
    cfg = parse_config({"scavenger": {"kind": "slurm", "qos": "scav", "max_pilots": 7}})
    assert cfg.backend == "slurm" and cfg.scavenger.max_pilots == 7
    assert parse_config(tomllib.loads(to_toml(cfg))) == cfg


def test_daemon_on_pbs_without_pbs_survives_and_decides_nothing(tmp_path: Path) -> None:
    from malletrain.daemon import Daemon

    cfg = DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", backend="pbs",
                       scavenger=ScavengerConfig(kind="pbs", queue="preempt", poll_interval=0.0,
                                                 command_timeout=2.0))
    d = Daemon(cfg)
    try:
        for _ in range(3):
            d.step()  # pbsnodes / qstat are not installed here: every look fails
        assert d.scav.stale and "pbsnodes" in d.scav.error
        assert d.last_decision is None and d.backend.pilots() == {}
        assert [e["kind"] for e in d.store.events("backend_error")]
    finally:
        d.close()
