"""The daemon on a real OpenPBS server with real torch training jobs (marker ``pbs``).

A module fixture starts server, scheduler, comm and one MoM with four vnodes ``vn0..vn3``
(:mod:`tests.clusters.pbs_cluster`) and stops them at the end. The daemon runs in this
process with ``[scavenger] kind = "pbs"``: its pilots are ``qsub`` jobs in the
``preemptable`` queue (``kill_delay`` 2 s, ``preempt_order`` R unless a test says D), their
agents connect back to it, and production jobs go to ``prod`` (an express queue, which
preempts pilots). Without PBS these tests skip with the reason, unless
MALLETRAIN_REQUIRE_PBS=1 (CI as root), where a cluster that cannot start fails.

    MALLETRAIN_REQUIRE_PBS=1 nice -n 10 .venv/bin/python -m pytest -q -p no:cacheprovider -m pbs \\
        tests/test_pbs_daemon.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("torch")

from malletrain.daemon.config import DaemonConfig, ScavengerConfig  # noqa: E402
from cluster_daemon import AGENT_DEAD_AFTER, NO_PROBES  # noqa: E402
from malletrain.daemon import Daemon  # noqa: E402
from malletrain.worker.examples.tracelog import steps as steps_of  # noqa: E402
from malletrain.daemon.jobspec import JobSpec, JobState  # noqa: E402
from scavenger.base import PilotState  # noqa: E402
from tests.clusters.pbs_cluster import PbsCluster, PreemptOrder, failing_command  # noqa: E402
from tests.cluster_start import pbs_or_skip  # noqa: E402
from tests.stepping import step_until  # noqa: E402

pytestmark = pytest.mark.pbs
VNODES = ("vn0", "vn1", "vn2", "vn3")
TRAIN = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
         "--trace", "--step-sleep", "0.05")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PbsCluster]:
    c = pbs_or_skip(len(VNODES))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", c.env["PATH"])  # the daemon's pbsnodes/qstat/qsub find PBS
        try:
            yield c
        finally:
            c.stop()


def config(tmp: Path, name: str, **scav: Any) -> DaemonConfig:
    sc = dict(kind="pbs", queue="preemptable", job_name=name, poll_interval=0.3, submit_rate=50.0,
              walltime=3600.0, renew_before=120.0, command_timeout=5.0)
    sc.update(scav)
    return DaemonConfig(state_dir=str(tmp / "state"), runtime="torch", backend="pbs", agent_heartbeat=0.2,
                        agent_dead_after=AGENT_DEAD_AFTER, loop_interval=0.05, store_grace=60.0,
                        policy=NO_PROBES, scavenger=ScavengerConfig(**sc))  # type: ignore[arg-type]


@pytest.fixture
def daemon(cluster: PbsCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []
    cluster.set_preempt_order(PreemptOrder.REQUEUE)

    def make(**scav: Any) -> Daemon:
        d = Daemon(config(tmp_path, f"mt-{request.node.name[5:14]}", **scav))
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.close()
        cluster.delete_all()
        cluster.set_preempt_order(PreemptOrder.REQUEUE)


def until(d: Daemon, what: str, pred: Callable[[], bool], timeout: float = 60.0) -> None:
    step_until(d, pred, timeout, what=f"{what}: not within {timeout:g} s",
               detail=lambda: f"events: {[e for e in d.store.events() if e['kind'] != 'nodes'][-15:]}")


def submit_job(d: Daemon, max_nodes: int = 4) -> str:
    scaling = {n: 100.0 * n for n in range(1, max_nodes + 1)}
    # one worker a node: the test cluster's nodes declare 4 GPUs (4 slots), and 4 nodes of 4 torch workers
    # would not fit this machine's 2 cores; the slots themselves are tested in test_nodeshape and the
    # torchrun daemon tests
    return d.store.submit(JobSpec("lin", TRAIN, 1, max_nodes, False, scaling, env={"OMP_NUM_THREADS": "1"},
                                  workers_per_node=1))


def prod_job(cluster: PbsCluster, vnodes: tuple[str, ...], seconds: int) -> str:
    return cluster.qsub("prod", vnodes, ["/bin/sleep", str(seconds)])


def kinds(d: Daemon, kind: str) -> list[dict]:
    return [e for e in d.store.events() if e["kind"] == kind]


def trains_on(d: Daemon, jid: str, n: int, steps: int = 5) -> bool:
    """The job's published members are ``n`` nodes and its workers reported ``steps`` steps at world n."""
    run = d.runs[jid]
    if len(run.members) != n:
        return False
    logs = [d.state_dir / "logs" / f"{run.workers[m]}.log" for m in run.members]
    return all(sum(s["world"] == n for s in steps_of(p)) >= steps for p in logs)


def test_daemon_holds_every_idle_vnode_and_the_job_follows_prod_jobs(daemon, cluster: PbsCluster) -> None:
    """preempt_order R: the prod job's vnodes' pilots are requeued (SIGTERM), the job shrinks and
    trains on from its last commit; when the prod job ends, the requeued pilots rerun by themselves,
    the daemon takes them as they are (no new pilot) and the job grows back."""
    d = daemon()
    jid = submit_job(d)
    until(d, "the job trains on the 4 held vnodes", lambda: trains_on(d, jid, 4), timeout=120)
    assert sorted(e["nodes"][0] for e in kinds(d, "pilot_started")) == list(VNODES)
    submitted = {e["pilot"] for e in kinds(d, "pilot_submitted")}
    run = d.runs[jid]
    survivor_log = d.state_dir / "logs" / f"{run.workers['vn0']}.log"
    prod = prod_job(cluster, ("vn2", "vn3"), seconds=15)
    until(d, "the job shrinks to 2 vnodes", lambda: sorted(d.runs[jid].members) == ["vn0", "vn1"])
    until(d, "the prod job runs", lambda: cluster.job_state(prod) == "R", timeout=30)
    until(d, "the job trains on at 2 vnodes", lambda: trains_on(d, jid, 2), timeout=60)
    until(d, "the requeues are reported", lambda: sorted(
        e["nodes"][0] for e in kinds(d, "pilot_queued") if e["requeued"]) == ["vn2", "vn3"], timeout=30)
    steps = steps_of(survivor_log)
    four = [s["step"] for s in steps if s["world"] == 4]
    two = [s["step"] for s in steps if s["world"] == 2]
    assert four and two and min(two) > max(four) - 2, (four[-3:], two[:3])  # from its last commit, not from 0
    assert d.store.require(jid).state is JobState.RUNNING
    until(d, "the job grows back to 4 vnodes", lambda: trains_on(d, jid, 4, steps=10), timeout=120)
    assert cluster.job_state(prod) == "F"
    assert {e["pilot"] for e in kinds(d, "pilot_submitted")} == submitted  # the requeued pilots came back
    later = steps_of(survivor_log)
    assert [s["step"] for s in later] == sorted(s["step"] for s in later)  # never went back
    assert JobState.SUSPENDED.value not in [s for s, _, _ in d.store.history(jid)]


def test_deleting_preemption_shrinks_the_job_and_new_pilots_grow_it_back(daemon, cluster: PbsCluster) -> None:
    """preempt_order D: the preempted pilot ends (preempted), the job trains on at 2 vnodes (the
    other held ones); when the prod job ends the daemon submits a new pilot on the freed vnode."""
    cluster.set_preempt_order(PreemptOrder.DELETE)
    d = daemon()
    jid = submit_job(d, max_nodes=2)
    until(d, "the job trains on 2 vnodes", lambda: trains_on(d, jid, 2), timeout=120)
    members = tuple(sorted(d.runs[jid].members))
    prod = prod_job(cluster, (members[1],), seconds=10)
    until(d, "the preemption is reported", lambda: [e["nodes"] for e in kinds(d, "pilot_ended")
                                                     if e["reason"] == "preempted"] == [[members[1]]], timeout=30)
    until(d, "the job trains on at 1 vnode or more", lambda: cluster.job_state(prod) == "R"
          and members[1] not in d.runs[jid].members, timeout=30)
    until(d, "the job is on 2 vnodes and the prod job over", lambda: trains_on(d, jid, 2, steps=10)
          and cluster.job_state(prod) == "F", timeout=120)
    until(d, "a new pilot runs on the freed vnode", lambda: any(
        e["nodes"] == [members[1]] for e in kinds(d, "pilot_started")[len(VNODES):]), timeout=60)
    assert len(kinds(d, "pilot_submitted")) == len(VNODES) + 1


def test_a_restarted_daemon_takes_back_its_queued_pilots_and_submits_no_duplicate(
    daemon, cluster: PbsCluster
) -> None:
    """A daemon is killed while its pilots wait in the queue (the preemptable queue is stopped): the
    next daemon on the same state dir takes them back from the store, submits nothing while they
    wait, and uses them when they start."""
    def started(value: bool) -> None:
        cluster.qmgr(f"set queue preemptable started = {value}")

    def in_pbs() -> set[str]:
        res = cluster.run(["qselect", "-q", "preemptable"], check=False)
        return set(res.stdout.split())

    started(False)  # qsub accepts pilots, PBS runs none
    try:
        d = daemon(max_queued=600.0)
        until(d, "a queued pilot on every vnode", lambda: len(d.backend.pilots()) == len(VNODES) and all(
            v.state is PilotState.QUEUED for v in d.backend.pilots().values()), timeout=30)
        queued = set(d.backend.pilots())
        d.scav.close = lambda: None  # type: ignore[method-assign]  # killed: its pilots wait on in PBS
        d.close()
        assert in_pbs() == queued
        d2 = daemon(max_queued=600.0)
        since = kinds(d2, "daemon_start")[-1]["time"]
        assert set(d2.backend.pilots()) == queued  # taken back before the first look
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            d2.step()
            time.sleep(0.05)
        assert {v.state for v in d2.backend.pilots().values()} == {PilotState.QUEUED}
        started(True)
        until(d2, "the old pilots hold every vnode", lambda: d2.scav.usable() == set(VNODES), timeout=60)
        assert set(d2.backend.pilots()) == queued and in_pbs() == queued
        assert [e for e in kinds(d2, "pilot_submitted") if e["time"] >= since] == []
    finally:
        started(True)


def test_a_restarted_daemon_takes_back_its_running_pilots_and_the_job(daemon, cluster: PbsCluster) -> None:
    d = daemon()
    jid = submit_job(d, max_nodes=2)
    until(d, "the job trains on 2 vnodes", lambda: trains_on(d, jid, 2), timeout=120)
    pilots = set(d.backend.pilots())
    d.scav.close = lambda: None  # type: ignore[method-assign]  # killed: its pilots run on in PBS
    d.close()
    d2 = daemon()
    since = kinds(d2, "daemon_start")[-1]["time"]
    until(d2, "every vnode held by the old pilots", lambda: d2.scav.usable() == set(VNODES), timeout=60)
    until(d2, "the job trains on 2 vnodes again", lambda: trains_on(d2, jid, 2, steps=10), timeout=120)
    assert set(d2.backend.pilots()) == pilots
    assert [e for e in kinds(d2, "pilot_submitted") if e["time"] >= since] == []


def test_qstat_pbsnodes_failing_or_hanging_daemon_survives_and_catches_up(
    daemon, cluster: PbsCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.set_preempt_order(PreemptOrder.DELETE)
    wrap = tmp_path / "bin"
    wrap.mkdir()
    for name in ("qstat", "pbsnodes"):
        failing_command(wrap, name)
    monkeypatch.setenv("PATH", f"{wrap}:{cluster.env['PATH']}")
    d = daemon(command_timeout=1.0)
    jid = submit_job(d)
    try:
        until(d, "the job trains on 4 vnodes", lambda: trains_on(d, jid, 4), timeout=120)
        decisions = [d.last_decision]
        (wrap / "hang").touch()
        t_end = time.monotonic() + 4
        while time.monotonic() < t_end:
            d.step()  # each look hangs until the command timeout: the loop goes on
            decisions.append(d.last_decision)
        assert d.scav.stale and "timed out" in d.scav.error
        (wrap / "hang").unlink()
        (wrap / "fail").touch()
        prod = prod_job(cluster, ("vn3",), seconds=30)  # preempts vn3's pilot
        # at least 8 s of failing looks, and on until the main queue's job runs: how long PBS takes to
        # preempt the pilot (kill its processes, run the next scheduling cycle) depends on the machine's load
        t_min, t_max = time.monotonic() + 8, time.monotonic() + 90
        while time.monotonic() < t_min or (time.monotonic() < t_max and cluster.job_state(prod) != "R"):
            d.step()
            decisions.append(d.last_decision)
            d.monitor.drain(timeout_ms=50)
        assert d.scav.stale and "cannot connect" in d.scav.error
        assert {id(x) for x in decisions} == {id(decisions[0])}  # no decision while the data is stale
        assert kinds(d, "pilot_submitted")[-1]["time"] < kinds(d, "backend_error")[0]["time"]  # nor pilots
        assert cluster.job_state(prod) == "R"
        assert "vn3" not in d.runs[jid].members  # its agent left: the job let the vnode go meanwhile
        (wrap / "fail").unlink()
        until(d, "caught up", lambda: not d.scav.stale and any(
            e["reason"] == "preempted" and e["nodes"] == ["vn3"] for e in kinds(d, "pilot_ended")), timeout=30)
        assert kinds(d, "backend_ok")
        until(d, "decides again", lambda: d.last_decision is not decisions[0], timeout=30)
        assert d.store.require(jid).state is JobState.RUNNING
    finally:
        for name in ("hang", "fail"):
            (wrap / name).unlink(missing_ok=True)


@pytest.mark.slow
def test_a_pilot_reaching_its_walltime_hands_its_vnode_over_without_loss(daemon, cluster: PbsCluster) -> None:
    """Walltime 2 min, renewed 10 s before: at the notice a replacement pilot is queued ``afterany``
    on the same vnode and the job leaves the vnode, training on on the other one; at the walltime
    the backend ends the old pilot, the replacement starts and the job grows back. vn1's pilot
    starts 30 s after vn0's, so the job always has a vnode that is not ending (and vn1's worker
    has 80 s to join before vn0's notice, on a loaded machine too)."""
    blockers = [prod_job(cluster, (v,), seconds=600) for v in ("vn1", "vn2", "vn3")]
    d = daemon(walltime=120.0, renew_before=10.0)
    jid = submit_job(d, max_nodes=2)
    until(d, "the job trains on vn0", lambda: trains_on(d, jid, 1, steps=2), timeout=90)
    first, started = next((e["pilot"], e["time"]) for e in kinds(d, "pilot_started") if e["nodes"] == ["vn0"])
    until(d, "30 s into vn0's pilot", lambda: time.time() > started + 30, timeout=60)
    cluster.run(["qdel", blockers[0]])
    until(d, "the job trains on vn0 and vn1", lambda: trains_on(d, jid, 2, steps=2), timeout=75)
    vn1_log = d.state_dir / "logs" / f"{d.runs[jid].workers['vn1']}.log"

    def replacement_started() -> float | None:
        repl = [e["pilot"] for e in kinds(d, "pilot_queued") if e["replaces"] == first]
        times = [e["time"] for e in kinds(d, "pilot_started") if repl and e["pilot"] == repl[0]]
        return times[0] if times else None

    until(d, "the replacement runs on vn0 and the job is back on it", lambda: replacement_started() is not None
          and any(e["time"] > replacement_started() and "vn0" in e["nodes"] for e in kinds(d, "members")),
          timeout=150)
    notice = next(e["time"] for e in kinds(d, "pilot_ending") if e["pilot"] == first)
    assert next(e["reason"] for e in kinds(d, "pilot_ending") if e["pilot"] == first) == "timeout"
    assert next(e["reason"] for e in kinds(d, "pilot_ended") if e["pilot"] == first) == "timeout"
    between = [e["nodes"] for e in kinds(d, "members") if notice <= e["time"] <= replacement_started()]
    timeline = [(round(e["time"] - started, 1), e["kind"], e.get("nodes"), e.get("pilot"), e.get("reason"))
                for e in d.store.events() if e["kind"] in ("members", "pilot_ending", "pilot_ended", "pilot_started",
                                                          "pilot_queued", "agent_gone", "node_lost")]
    assert between and all(nodes == ["vn1"] for nodes in between), timeline  # left vn0 at the notice, trained on
    steps = steps_of(vn1_log)
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps)  # vn1's worker never restarted
    assert {1, 2} <= {s["world"] for s in steps}
    assert JobState.SUSPENDED.value not in [s for s, _, _ in d.store.history(jid)]
