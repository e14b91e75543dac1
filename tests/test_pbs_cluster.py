"""The PBS backend on a real OpenPBS server started on this machine (marker ``pbs``).

The module fixture starts server, scheduler, comm and one MoM with four vnodes ``vn0..vn3``
(:mod:`tests.clusters.pbs_cluster`, building and installing OpenPBS as root when missing)
and stops them at the end. Pilots go to the ``preemptable`` queue (``kill_delay`` 2 s),
production jobs to ``prod`` (an express queue, which preempts them). Without PBS these tests
skip with the reason, unless MALLETRAIN_REQUIRE_PBS=1 (CI as root), where a cluster that
cannot start is a failure.
"""

from __future__ import annotations

import json
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
    PilotQueued,
    PilotRequest,
    PilotStarted,
    PilotState,
)
from scavenger.hub import AgentHub
from scavenger.pbs import PbsBackend, PbsConfig
from tests.clusters.pbs_cluster import PbsCluster, PreemptOrder, failing_command, pbs_daemon_pids
from tests.cluster_start import pbs_or_skip

pytestmark = pytest.mark.pbs
VNODES = ("vn0", "vn1", "vn2", "vn3")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PbsCluster]:
    c = pbs_or_skip(len(VNODES))
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

    def __init__(self, cluster: PbsCluster, name: str, tmp: Path, **cfg: object) -> None:
        self.cluster = cluster
        self.hub = AgentHub(dead_after_s=AGENT_DEAD_AFTER_S)
        env = dict(cluster.env, **cfg.pop("env", {}))  # type: ignore[arg-type]
        self.config = PbsConfig(
            daemon_address=self.hub.address, queue="preemptable", job_name=name, env=env,
            output=str(tmp / "pilot.out"), submit_rate=50.0, submit_burst=50,
            agent_args=("--key-file", self.hub.key_file, "--dead-after", str(AGENT_DEAD_AFTER_S)), **cfg,  # type: ignore[arg-type]
        )
        self.backend = PbsBackend(self.config)
        self.events: list[PilotEvent] = []
        self.agents: dict[str, str] = {}  # node -> batch job of its agent's last hello

    def pump(self) -> None:
        for ev in self.hub.poll(50):
            if isinstance(ev, AgentUp):
                self.agents[ev.node] = self.hub.batch_job(ev.node) or ""
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
        """Submit a pilot on every idle vnode; wait until each runs and its agent said hello."""
        idle = sorted(self.backend.discover().idle)
        pilots = {self.backend.submit(PilotRequest((n,))): n for n in idle}
        self.wait("pilots started", lambda: set(pilots) <= set(self.started()), timeout=60)
        self.wait("agents up", lambda: set(idle) <= set(self.agents))
        return pilots

    def close(self) -> None:
        self.backend.close()
        self.cluster.delete_all()
        self.hub.close()


@pytest.fixture
def rig(cluster: PbsCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Rig]:
    cluster.set_preempt_order(PreemptOrder.REQUEUE)
    r = Rig(cluster, f"mt-{request.node.name[5:14]}", tmp_path)
    try:
        yield r
    finally:
        r.close()
        cluster.set_preempt_order(PreemptOrder.REQUEUE)


def prod_job(cluster: PbsCluster, vnodes: tuple[str, ...], seconds: int = 30) -> str:
    return cluster.qsub("prod", vnodes, ["/bin/sleep", str(seconds)])


def test_pilots_hold_every_idle_vnode(rig: Rig) -> None:
    d = rig.backend.discover()
    assert d.idle == set(VNODES)  # the host's own vnode has no CPUs: never a pilot's
    pilots = rig.hold_all()
    assert sorted(pilots.values()) == list(VNODES)
    assert {n: rig.agents[n] for n in VNODES} == {n: p for p, n in pilots.items()}  # PBS_JOBID in each hello
    d = rig.backend.discover()
    assert d.idle == set() and {n.raw for n in d.nodes} == {"job-exclusive"}  # place=excl
    assert {v.state for v in rig.backend.pilots().values()} == {PilotState.RUNNING}


def test_requeued_pilots_rerun_when_the_prod_job_ends_and_are_used_again(rig: Rig) -> None:
    """preempt_order R: the prod job takes vn1 and vn2, their pilots go back to the queue (their
    agents get SIGTERM), the others stay; when the prod job ends the requeued pilots rerun by
    themselves on their vnodes and their agents say hello again: the same pilots, held again."""
    pilots = rig.hold_all()
    by_node = {n: p for p, n in pilots.items()}
    victims = {by_node["vn1"], by_node["vn2"]}
    rig.agents.clear()
    job = prod_job(rig.cluster, ("vn1", "vn2"), seconds=8)
    rig.wait("pilots requeued", lambda: victims <= {e.pilot for e in rig.events
                                                   if isinstance(e, PilotQueued) and e.requeued})
    assert {rig.backend.pilots()[p].state for p in victims} == {PilotState.QUEUED}
    rig.wait("prod job running", lambda: rig.cluster.job_state(job) == "R")
    assert {rig.backend.pilots()[by_node[n]].state for n in ("vn0", "vn3")} == {PilotState.RUNNING}
    assert rig.ended() == {}
    rig.wait("the requeued pilots run again", lambda: all(
        sum(1 for e in rig.events if isinstance(e, PilotStarted) and e.pilot == p) == 2 for p in victims), timeout=60)
    rig.wait("their agents say hello again", lambda: {n: rig.agents.get(n) for n in ("vn1", "vn2")}
             == {"vn1": by_node["vn1"], "vn2": by_node["vn2"]})
    assert rig.cluster.job(by_node["vn1"])["run_count"] == 2
    assert rig.cluster.job_state(job) == "F"
    rig.backend.cancel(by_node["vn0"])
    rig.wait("cancelled pilot ended", lambda: by_node["vn0"] in rig.ended())
    assert rig.ended()[by_node["vn0"]] is EndReason.CANCELLED  # our qdel is not a preemption


def test_a_requeued_pilot_waiting_too_long_is_cancelled(cluster: PbsCluster, tmp_path: Path) -> None:
    """preempt_order R and a long prod job: the requeued pilot would hold a queue slot (and rerun
    later for nobody): after ``max_queued_s`` the backend cancels it."""
    cluster.set_preempt_order(PreemptOrder.REQUEUE)
    rig = Rig(cluster, "mt-requeue", tmp_path, max_queued_s=3.0)
    try:
        pilot = rig.backend.submit(PilotRequest(("vn3",)))
        rig.wait("pilot started", lambda: pilot in rig.started())
        job = prod_job(cluster, ("vn3",), seconds=300)
        rig.wait("pilot requeued", lambda: rig.backend.pilots().get(pilot) is not None
                 and rig.backend.pilots()[pilot].state is PilotState.QUEUED)
        rig.wait("requeued pilot cancelled", lambda: pilot in rig.ended(), timeout=30)
        assert rig.ended()[pilot] is EndReason.CANCELLED
        assert cluster.job_state(pilot) == "F" and cluster.job_state(job) == "R"
    finally:
        rig.close()


def test_deleting_preemption_reports_preempted(rig: Rig) -> None:
    rig.cluster.set_preempt_order(PreemptOrder.DELETE)
    pilots = rig.hold_all()
    by_node = {n: p for p, n in pilots.items()}
    job = prod_job(rig.cluster, ("vn2", "vn3"))
    victims = {by_node["vn2"], by_node["vn3"]}
    rig.wait("preempted pilots ended", lambda: victims <= set(rig.ended()))
    assert {rig.ended()[p] for p in victims} == {EndReason.PREEMPTED}
    assert all("terminated by Scheduler" in rig.cluster.job(p).get("comment", "") for p in victims)
    rig.wait("prod job running", lambda: rig.cluster.job_state(job) == "R")
    assert set(rig.backend.pilots()) == {by_node["vn0"], by_node["vn1"]}  # the others stay
    rig.backend.cancel(by_node["vn0"])
    rig.wait("cancelled pilot ended", lambda: by_node["vn0"] in rig.ended())
    assert rig.ended()[by_node["vn0"]] is EndReason.CANCELLED


@pytest.mark.slow
def test_walltime_reports_timeout_and_the_replacement_starts(cluster: PbsCluster, tmp_path: Path) -> None:
    rig = Rig(cluster, "mt-walltime", tmp_path, walltime_s=60.0, renew_before_s=50.0)
    try:
        old = rig.backend.submit(PilotRequest(("vn0",)))
        rig.wait("pilot started", lambda: old in rig.started())
        rig.wait("walltime notice", lambda: any(isinstance(e, PilotEnding) and e.reason is EndReason.TIMEOUT
                                                 for e in rig.events), timeout=20)
        new = next(v.id for v in rig.backend.pilots().values() if v.replaces == old)
        assert rig.cluster.job_state(new) == "H"  # held on its dependency
        rig.wait("old pilot timed out", lambda: old in rig.ended(), timeout=90)
        assert rig.ended()[old] is EndReason.TIMEOUT
        rig.wait("replacement started", lambda: new in rig.started(), timeout=60)
        assert rig.started()[new] == ("vn0",)
    finally:
        rig.close()


def test_failing_or_hanging_qstat_pbsnodes_give_typed_errors_then_catch_up(
    cluster: PbsCluster, tmp_path: Path
) -> None:
    cluster.set_preempt_order(PreemptOrder.DELETE)
    wrap = tmp_path / "bin"
    wrap.mkdir()
    for name in ("qstat", "pbsnodes"):
        failing_command(wrap, name)
    path = f"{wrap}:{cluster.env['PATH']}"
    rig = Rig(cluster, "mt-wrapper", tmp_path, env={"PATH": path}, command_timeout_s=1.0)
    try:
        pilot = rig.backend.submit(PilotRequest(("vn3",)))
        rig.wait("pilot started", lambda: pilot in rig.started())
        before = dict(rig.backend.pilots())
        (wrap / "hang").touch()
        with pytest.raises(CommandTimeout, match="qstat.*timed out"):
            rig.backend.poll()
        with pytest.raises(CommandTimeout, match="pbsnodes.*timed out"):
            rig.backend.discover()
        (wrap / "hang").unlink()
        (wrap / "fail").touch()
        job = prod_job(cluster, ("vn3",), seconds=20)  # the pilot is preempted meanwhile
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and cluster.job_state(job) != "R":
            time.sleep(0.2)
        with pytest.raises(CommandFailed, match="qstat.*cannot connect"):
            rig.backend.poll()
        with pytest.raises(CommandFailed, match="pbsnodes"):
            rig.backend.discover()
        assert rig.backend.pilots() == before  # nothing guessed from stale or missing data
        (wrap / "fail").unlink()
        rig.wait("caught up", lambda: rig.ended().get(pilot) is EndReason.PREEMPTED)
        assert "vn3" not in rig.backend.discover().idle
    finally:
        rig.close()
        cluster.set_preempt_order(PreemptOrder.REQUEUE)
        for name in ("hang", "fail"):
            (wrap / name).unlink(missing_ok=True)


def test_the_scavenger_reads_k_4_from_the_vnodes_ngpus(rig: Rig) -> None:
    """Each vnode declares ``resources_available.ngpus = 4``: pbsnodes reports it and the scavenger
    gives every vnode 4 worker slots, whatever the config's fallback says."""
    assert {n.name: n.gpus for n in rig.backend.discover().nodes} == {v: 4 for v in VNODES}
    scav = Scavenging(rig.backend, rig.hub, lambda *a, **k: None, workers_per_node=2)
    scav.look(time.time())
    assert {v: scav.slots_of(v) for v in VNODES} == {v: 4 for v in VNODES}


def test_edges_the_backend_relies_on(cluster: PbsCluster) -> None:
    """What the real server does at the edges the parsers handle."""
    assert cluster.run(["qstat", "-f", "-F", "json", f"99999.{cluster.host}"], check=False).returncode == 153
    done = cluster.qsub("preemptable", ("vn1",), ["/bin/true"])
    other = cluster.qsub("preemptable", ("vn2",), ["/bin/true"])
    two = cluster.run(["qstat", "-x", "-f", "-F", "json", done, other])
    assert list(json.loads(two.stdout)["Jobs"]) == [done]  # only the first id: polls ask for every job
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cluster.job_state(done) != "F":
        time.sleep(0.3)
    assert cluster.job_state(done) == "F"
    res = cluster.run(["qdel", done], check=False)
    assert res.returncode == 35 and "Job has finished" in res.stderr
    assert cluster.run(["pbsnodes", "vn1"], check=False).returncode != 0  # a vnode needs -v
    assert cluster.run(["pbsnodes", "-v", "vn1"], check=False).returncode == 0


def test_cluster_stops_everything_it_started(cluster: PbsCluster) -> None:
    """Runs last in this module: stop, nothing of PBS left; a second cluster starts in its place."""
    assert set(pbs_daemon_pids()) == {"pbs_server.bin", "pbs_sched", "pbs_comm", "pbs_mom"}
    cluster.qsub("preemptable", ("vn0",), ["/bin/sleep", "300"])
    cluster.stop()
    assert pbs_daemon_pids() == {}
    assert not [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "sleep"
                and p.info["cmdline"] == ["/bin/sleep", "300"]]
    cluster.start()
    assert cluster.free_vnodes() == set(VNODES) and cluster.job_ids() == []

