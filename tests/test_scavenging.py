"""The daemon's side of its backend (malletrain/daemon/scavenging.py) and the [scavenger] config table.

No scheduler needed: a scripted backend speaks :class:`scavenger.base.SchedulerBackend`, and a
daemon configured for PBS on a machine without PBS shows that failing commands never kill it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from malletrain.daemon.config import ConfigError, DaemonConfig, ScavengerConfig, parse_config, to_toml
from malletrain.daemon.scavenging import Scavenging
from policy import PolicyConfig
from scavenger.base import (
    AgentRoster,
    Claim,
    CommandFailed,
    Discovery,
    NodeInfo,
    NodeState,
    PilotRequest,
    PilotState,
    PilotView,
    SavedPilot,
    SchedulerBackend,
    Throttled,
)


class ScriptedBackend(SchedulerBackend):
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


class Hub(AgentRoster):
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


def test_daemon_on_pbs_without_pbs_survives_and_decides_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from malletrain.daemon import Daemon

    # no PBS client on the PATH, whatever this machine has installed (CI builds OpenPBS, and its server
    # may be up from a PBS test: pbsnodes then answers)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    cfg = DaemonConfig(state_dir=str(tmp_path / "state"), runtime="toy", backend="pbs",
                       scavenger=ScavengerConfig(kind="pbs", queue="preempt", poll_interval=0.0,
                                                 command_timeout=2.0))
    d = Daemon(cfg)
    try:
        for _ in range(3):
            d.step()  # pbsnodes / qstat are not found: every look fails
        assert d.scav.stale and "pbsnodes" in d.scav.error
        assert d.last_decision is None and d.backend.pilots() == {}
        assert [e["kind"] for e in d.store.events("backend_error")]
    finally:
        d.close()


# ---- nodes no trainer uses, pilots without their agent, pilots kept across restarts ------------


class Meta:
    """The store's meta table, counting writes."""

    def __init__(self, data: dict[str, str] | None = None) -> None:
        self.data = dict(data or {})
        self.writes = 0

    def get_meta(self, key: str) -> str | None:
        return self.data.get(key)

    def set_meta(self, key: str, value: str) -> None:
        self.writes += 1
        self.data[key] = value


def test_hold_idle_holds_only_nodes_the_predicate_accepts() -> None:
    b = ScriptedBackend({"n01", "n02", "gpu1"})
    s, _ = scav(b, Hub(set()))
    s.look(0.0)
    s.hold_idle(0.0, wanted=lambda n: n.startswith("n0"))
    assert sorted(v.nodes for v in b.views.values()) == [("n01",), ("n02",)]  # gpu1: no trainer uses it


def test_daemon_never_holds_a_node_no_trainer_matches(tmp_path: Path) -> None:
    from malletrain.daemon.config import TrainerConfig
    from tests.test_conformance import NODES, Harness

    h = Harness(tmp_path / "d", PolicyConfig(), trainers=(TrainerConfig("vision", ("n0[1-2]",)),
                                                          TrainerConfig("lm", ("n0[3-4]",))))
    try:
        h.cluster.became_idle(*NODES)
        h.run_until(3.0)
        assert sorted(h.cluster.held) == ["n01", "n02", "n03", "n04"]  # n05..n08: no trainer's patterns
    finally:
        h.close()


def test_a_running_pilot_without_its_own_agent_is_cancelled_after_the_grace() -> None:
    b = ScriptedBackend({"a", "b", "c", "d"})
    b.views = {p: PilotView(p, PilotState.RUNNING, (n,), None)  # type: ignore[arg-type]
               for p, n in (("1", "a"), ("2", "b"), ("3", "c"), ("4", "d"))}
    hub = Hub({"b", "c"}, {"b": "99", "c": "3"})  # a: no hello; b: another batch job's agent; d: hello later
    s, log = scav(b, hub, agent_grace=10.0)
    s.look(0.0)
    s.hold_idle(0.0)
    s.hold_idle(9.0)
    assert b.cancelled == []  # within the grace
    hub._alive.add("d")
    s.hold_idle(10.0)
    assert sorted(b.cancelled) == ["1", "2"]  # c and d: their own agents are up
    why = {d["pilot"]: d["reason"] for k, d in log if k == "pilot_cancelled"}
    assert "no agent said hello from node a" in why["1"]
    assert "the agent on node b belongs to batch job 99" in why["2"]
    s.look(11.0)
    assert s.hold_idle(11.0) == []  # a and b are idle again, but lost a pilot for want of an agent
    assert s.hold_idle(20.0) == ["p5", "p6"]  # tried again after the grace
    assert sorted(b.cancelled) == ["1", "2"]  # cancelled once
    s.look(21.0)
    s.hold_idle(30.0), s.hold_idle(40.0)
    assert b.cancelled[2:] == ["p5", "p6"]  # again no agent: out for twice as long
    s.look(41.0)
    assert s.hold_idle(59.0) == [] and s.hold_idle(60.0) == ["p7", "p8"]
    hub._alive.add("a"), hub._batch.update(a="p7")
    s.hold_idle(60.5)
    assert "a" not in s._shunned and "b" in s._shunned  # a's agent works: a is trusted again
    off, _ = scav(ScriptedBackend(set()), Hub(set()))
    assert off.agent_grace == 0.0  # off unless asked (the daemon: twice agent_dead_after)


def test_live_pilots_are_kept_in_the_store_only_when_they_change_and_given_back() -> None:
    b = ScriptedBackend({"a", "b"})
    meta = Meta()
    s, _ = scav(b, Hub(set()), meta=meta)
    assert s.resume() == []
    s.look(0.0)
    s.hold_idle(0.0)
    assert json.loads(meta.data["pilots"]) == {"p1": {"nodes": ["a"], "replaces": None},
                                               "p2": {"nodes": ["b"], "replaces": None}}
    writes = meta.writes
    s.look(1.0), s.hold_idle(1.0), s.release(set())
    assert meta.writes == writes  # nothing changed: nothing written
    b.views["p2"] = PilotView("p2", PilotState.RUNNING, ("b",), None, cancelling=True)  # type: ignore[arg-type]
    s.look(2.0)
    assert list(json.loads(meta.data["pilots"])) == ["p1"]  # a pilot we cancelled is not taken back

    class Resuming(ScriptedBackend):
        def resume(self, saved: list[SavedPilot]) -> list[str]:
            self.saved = list(saved)
            return [p.id for p in saved]

    b2 = Resuming(set())
    s2, log = scav(b2, Hub(set()), meta=meta)
    assert s2.resume() == ["p1"] and b2.saved == [SavedPilot("p1", ("a",), None)]  # type: ignore[arg-type]
    assert ("pilots_resumed", {"pilots": ["p1"]}) in log
    bad, log = scav(Resuming(set()), Hub(set()), meta=Meta({"pilots": '{"p1": {"nodes": "a"}}'}))
    assert bad.resume() == []  # a bad entry is named, never fatal
    assert any(k == "pilots_unreadable" and "bad entry for pilot 'p1'" in d["error"] for k, d in log)


def test_a_restart_knows_the_nodes_of_the_last_daemons_pilots_before_their_agents_say_hello() -> None:
    """Adoption after a kill -9 waits for these nodes' agents: a backend that cannot resume its
    pilots (local) learns of them only from the hellos, and a new pilot submitted meanwhile for
    such a node fought the agent still running there (the job never got the node)."""
    import json as _json

    from malletrain.daemon.scavenging import PILOTS_KEY, Scavenging

    class Meta:
        def get_meta(self, key: str) -> str | None:
            assert key == PILOTS_KEY
            return _json.dumps({"local-n0-1": {"nodes": ["n0"], "replaces": None},
                                "local-n1-2": {"nodes": ["n1"], "replaces": None}})

    class NoResume(SchedulerBackend):  # a backend without resume(): its pilots come back only through their agents
        name = "stub"

    scav = Scavenging(NoResume(), Hub(set()), lambda *a, **k: None, meta=Meta())  # type: ignore[abstract,arg-type]
    assert scav.last_daemons_nodes() == frozenset()
    assert scav.resume() == []
    assert scav.last_daemons_nodes() == {"n0", "n1"}
