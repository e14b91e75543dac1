"""The Slurm backend on a real Slurm cluster started on this machine (marker ``slurm``).

The session fixture starts munged, slurmctld and four ``slurmd -N nodeX``
(installing slurm-wlm and munge with apt when missing) and stops them at the end.
Without Slurm these tests skip with the reason, unless MALLETRAIN_REQUIRE_SLURM=1
(CI as root), where a cluster that cannot start is a failure.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterator

import psutil
import pytest

from malletrain.daemon.scavenging import Scavenging
from scavenger.base import (
    AgentUp,
    CommandFailed,
    CommandTimeout,
    EndReason,
    PilotEnded,
    PilotEnding,
    PilotEvent,
    PilotRequest,
    PilotStarted,
    PilotState,
)
from scavenger.hub import AgentHub
from scavenger.slurm import SlurmBackend, SlurmConfig
from tests.clusters.slurm_cluster import SlurmCluster, failing_command
from tests.cluster_start import slurm_or_skip

pytestmark = pytest.mark.slurm
NODES = ("node1", "node2", "node3", "node4")


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    c = slurm_or_skip(len(NODES))
    try:
        yield c
    finally:
        c.stop()


AGENT_DEAD_AFTER_S = 30.0
"""The hub's and its agents' silence bound alike (the daemon's default). An agent left at its own default
(10 s, counted from its start) gave up before a loaded machine (both cores busy) had answered its
handshake: its pilot failed and the wait for it timed out."""


class Rig:
    """A backend on the cluster plus an agent hub, with helpers to wait for events."""

    def __init__(self, cluster: SlurmCluster, name: str, tmp: Path, **cfg: object) -> None:
        self.cluster = cluster
        self.hub = AgentHub(dead_after_s=AGENT_DEAD_AFTER_S)
        env = dict(cluster.env, **cfg.pop("env", {}))  # type: ignore[arg-type]
        self.config = SlurmConfig(
            daemon_address=self.hub.address, job_name=name, env=env, output=str(tmp / "pilot-%j.out"),
            submit_rate=50.0, submit_burst=50, agent_args=("--key-file", self.hub.key_file, "--dead-after", str(AGENT_DEAD_AFTER_S)),
            **cfg,  # type: ignore[arg-type]
        )
        self.backend = SlurmBackend(self.config)
        self.events: list[PilotEvent] = []
        self.agents: set[str] = set()

    def pump(self) -> None:
        for ev in self.hub.poll(50):
            if isinstance(ev, AgentUp):
                self.agents.add(ev.node)
        self.events.extend(self.backend.poll())

    def wait(self, what: str, pred: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump()
            if pred():
                return
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {timeout:g} s; events: {self.events}")

    def ended(self) -> dict[str, EndReason]:
        return {e.pilot: e.reason for e in self.events if isinstance(e, PilotEnded)}

    def started(self) -> dict[str, tuple[str, ...]]:
        return {e.pilot: e.nodes for e in self.events if isinstance(e, PilotStarted)}

    def hold_all(self) -> dict[str, str]:
        """Submit a pilot on every idle node; wait until each runs and its agent said hello."""
        idle = sorted(self.backend.discover().idle)
        pilots = {self.backend.submit(PilotRequest((n,))): n for n in idle}
        self.wait("pilots started", lambda: set(pilots) <= set(self.started()))
        self.wait("agents up", lambda: set(idle) <= self.agents)
        return pilots

    def close(self) -> None:
        self.backend.close()
        self.cluster.cancel_all()
        self.hub.close()


@pytest.fixture
def rig(cluster: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = Rig(cluster, f"mt-{request.node.name[5:30]}", tmp_path)
    try:
        yield r
    finally:
        r.close()


def prod_job(cluster: SlurmCluster, *args: str) -> str:
    out = cluster.run(["sbatch", "--parsable", "-p", "prod", "-o", "/dev/null", *args])
    return out.stdout.strip().split(";")[0]


def job_state(cluster: SlurmCluster, job: str) -> str:
    return cluster.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"]).stdout.strip()


def test_pilots_hold_every_idle_node(rig: Rig) -> None:
    assert rig.backend.discover().idle == set(NODES)
    pilots = rig.hold_all()
    assert sorted(pilots.values()) == list(NODES)
    assert rig.agents == set(NODES)  # every agent said hello from its node
    d = rig.backend.discover()
    assert d.idle == set() and {n.raw for n in d.nodes} == {"allocated"}
    assert {v.state for v in rig.backend.pilots().values()} == {PilotState.RUNNING}


def test_the_scavenger_reads_k_4_from_the_nodes_gres(rig: Rig) -> None:
    """Each node declares ``Gres=gpu:4`` (gres.conf by count, no device files): sinfo reports it and
    the scavenger gives every node 4 worker slots, whatever the config's fallback says."""
    assert {n.name: n.gpus for n in rig.backend.discover().nodes} == {n: 4 for n in NODES}
    scav = Scavenging(rig.backend, rig.hub, lambda *a, **k: None, workers_per_node=2)
    scav.look(time.time())
    assert {n: scav.slots_of(n) for n in NODES} == {n: 4 for n in NODES}


def test_prod_job_preempts_pilots_and_backend_reports_preempted(rig: Rig) -> None:
    pilots = rig.hold_all()
    by_node = {n: p for p, n in pilots.items()}
    job = prod_job(rig.cluster, "-N2", "-w", "node2,node3", "--wrap", "sleep 30")
    victims = {by_node["node2"], by_node["node3"]}
    rig.wait("preempted pilots ended", lambda: victims <= set(rig.ended()))
    assert {rig.ended()[p] for p in victims} == {EndReason.PREEMPTED}
    rig.wait("prod job running", lambda: job_state(rig.cluster, job) == "RUNNING")
    assert set(rig.backend.pilots()) == {by_node["node1"], by_node["node4"]}  # the others stay
    rig.backend.cancel(by_node["node1"])
    rig.wait("cancelled pilot ended", lambda: by_node["node1"] in rig.ended())
    assert rig.ended()[by_node["node1"]] is EndReason.CANCELLED  # our cancel is not a preemption


@pytest.mark.slow
def test_walltime_reports_timeout_and_the_replacement_starts(cluster: SlurmCluster, tmp_path: Path) -> None:
    rig = Rig(cluster, "mt-walltime", tmp_path, walltime_s=60.0, renew_before_s=55.0)
    try:
        old = rig.backend.submit(PilotRequest(("node1",)))
        rig.wait("pilot started", lambda: old in rig.started())
        rig.wait("walltime notice", lambda: any(isinstance(e, PilotEnding) and e.reason is EndReason.TIMEOUT
                                                 for e in rig.events), timeout=15)
        new = next(v.id for v in rig.backend.pilots().values() if v.replaces == old)
        rig.wait("old pilot timed out", lambda: old in rig.ended(), timeout=150)
        assert rig.ended()[old] is EndReason.TIMEOUT
        rig.wait("replacement started", lambda: new in rig.started())
        assert rig.started()[new] == ("node1",)
    finally:
        rig.close()


def test_planned_nodes_are_never_held(rig: Rig) -> None:
    blocker = prod_job(rig.cluster, "-w", "node1", "--time=5", "--wrap", "sleep 300")
    rig.wait("blocker running", lambda: job_state(rig.cluster, blocker) == "RUNNING")
    big = prod_job(rig.cluster, "-N4", "--time=1", "--wrap", "sleep 1")
    deadline = time.monotonic() + 20
    d = rig.backend.discover()
    while time.monotonic() < deadline and not {"node2", "node3", "node4"} <= {n.name for n in d.nodes if n.planned}:
        time.sleep(0.5)
        d = rig.backend.discover()
    assert {n.name for n in d.nodes if n.planned} == {"node2", "node3", "node4"}
    assert d.idle == set()  # idle but planned: not ours
    claim = next(c for c in d.claims if c.job == big)
    assert set(claim.nodes) == set(NODES) and claim.start is not None
    for node in d.idle:
        rig.backend.submit(PilotRequest((node,)))
    assert rig.backend.pilots() == {}


def test_failing_or_hanging_sinfo_squeue_give_typed_errors_then_catch_up(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    wrap = tmp_path / "bin"
    wrap.mkdir()
    for name in ("sinfo", "squeue"):
        failing_command(wrap, name)
    path = f"{wrap}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    rig = Rig(cluster, "mt-wrapper", tmp_path, env={"PATH": path}, command_timeout_s=1.0)
    try:
        pilot = rig.backend.submit(PilotRequest(("node4",)))
        rig.wait("pilot started", lambda: pilot in rig.started())
        before = dict(rig.backend.pilots())
        (wrap / "hang").touch()
        with pytest.raises(CommandTimeout, match="squeue.*timed out"):
            rig.backend.poll()
        with pytest.raises(CommandTimeout, match="sinfo.*timed out"):
            rig.backend.discover()
        (wrap / "hang").unlink()
        (wrap / "fail").touch()
        job = prod_job(cluster, "-w", "node4", "--wrap", "sleep 20")  # the pilot is preempted meanwhile
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and job_state(cluster, job) != "RUNNING":
            time.sleep(0.2)
        with pytest.raises(CommandFailed, match="squeue.*Unable to contact"):
            rig.backend.poll()
        with pytest.raises(CommandFailed, match="sinfo"):
            rig.backend.discover()
        assert rig.backend.pilots() == before  # nothing guessed from stale or missing data
        (wrap / "fail").unlink()
        rig.wait("caught up", lambda: rig.ended().get(pilot) is EndReason.PREEMPTED)
        assert "node4" not in rig.backend.discover().idle
    finally:
        rig.close()
        for name in ("hang", "fail"):
            (wrap / name).unlink(missing_ok=True)


def test_cluster_stops_everything_it_started(tmp_path: Path) -> None:
    c = slurm_or_skip(1, tmp_path / "c")
    pids = {name: p.pid for name, p in c.procs.items()}
    assert set(pids) == {"munged", "slurmctld", "slurmd-node1"}
    c.run(["sbatch", "-p", "preemptable", "-o", "/dev/null", "--wrap", "sleep 300"])
    c.stop()
    alive = [n for n, pid in pids.items() if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert alive == []
    assert not any(str(c.conf) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
