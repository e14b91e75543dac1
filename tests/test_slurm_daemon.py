"""The daemon on a real Slurm cluster with real torch training jobs (marker ``slurm``).

A module fixture starts munged, slurmctld and four ``slurmd -N nodeX`` on this machine
(:mod:`tests.clusters.slurm_cluster`, installing slurm-wlm and munge with apt when
missing) and stops them at the end. The daemon runs in this process with
``[scavenger] kind = "slurm"``: its pilots are ``sbatch`` jobs in the ``preemptable``
partition, their agents connect back to it, and production jobs go to ``prod``
(PriorityTier 10, which preempts pilots). Without Slurm these tests skip with the reason,
unless MALLETRAIN_REQUIRE_SLURM=1 (CI as root), where a cluster that cannot start fails.

    MALLETRAIN_REQUIRE_SLURM=1 nice -n 10 .venv/bin/python -m pytest -q -p no:cacheprovider \\
        -m slurm tests/test_slurm_daemon.py
"""

from __future__ import annotations

import os
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
from tests.clusters.slurm_cluster import SlurmCluster, failing_command  # noqa: E402
from tests.cluster_start import slurm_or_skip  # noqa: E402
from tests.stepping import step_until  # noqa: E402

pytestmark = pytest.mark.slurm
NODES = ("node1", "node2", "node3", "node4")
TRAIN = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
         "--trace", "--step-sleep", "0.05")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SlurmCluster]:
    c = slurm_or_skip(len(NODES))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(c.conf))  # the daemon's sinfo/squeue/sbatch find the cluster
        try:
            yield c
        finally:
            c.stop()


def config(tmp: Path, name: str, **scav: Any) -> DaemonConfig:
    sc = dict(kind="slurm", partition="preemptable", job_name=name, poll_interval=0.3, submit_rate=50.0,
              walltime=3600.0, renew_before=120.0, command_timeout=5.0)
    sc.update(scav)
    return DaemonConfig(state_dir=str(tmp / "state"), runtime="torch", backend="slurm", agent_heartbeat=0.2,
                        agent_dead_after=AGENT_DEAD_AFTER, loop_interval=0.05, store_grace=60.0,
                        policy=NO_PROBES, scavenger=ScavengerConfig(**sc))  # type: ignore[arg-type]


@pytest.fixture
def daemon(cluster: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Daemon]]:
    made: list[Daemon] = []

    def make(**scav: Any) -> Daemon:
        d = Daemon(config(tmp_path, f"mt-{request.node.name[5:25]}", **scav))
        made.append(d)
        return d

    try:
        yield make
    finally:
        for d in made:
            d.close()
        cluster.cancel_all()


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


def prod_job(cluster: SlurmCluster, *args: str) -> str:
    out = cluster.run(["sbatch", "--parsable", "-p", "prod", "-o", "/dev/null", *args])
    return out.stdout.strip().split(";")[0]


def job_state(cluster: SlurmCluster, job: str) -> str:
    """The job's state through ``scontrol`` (never the wrapped ``squeue``)."""
    res = cluster.run(["scontrol", "show", "job", "-o", job], check=False)
    for part in res.stdout.split():
        if part.startswith("JobState="):
            return part.split("=", 1)[1]
    return ""


def planned(cluster: SlurmCluster) -> set[str]:
    res = cluster.run(["sinfo", "-N", "-h", "-p", "preemptable", "-o", "%N %t"], check=False)
    return {parts[0] for parts in map(str.split, res.stdout.splitlines()) if len(parts) == 2 and parts[1] == "plnd"}


def run_seconds(cluster: SlurmCluster, job: str) -> int:
    """How long ``job`` has run, from ``scontrol`` (its ``RunTime``, ``[D-]HH:MM:SS``)."""
    res = cluster.run(["scontrol", "show", "job", "-o", job])
    text = next(part.split("=", 1)[1] for part in res.stdout.split() if part.startswith("RunTime="))
    days, _, hms = text.rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def kinds(d: Daemon, kind: str) -> list[dict]:
    return [e for e in d.store.events() if e["kind"] == kind]


def trains_on(d: Daemon, jid: str, n: int, steps: int = 5) -> bool:
    """The job's published members are ``n`` nodes and its workers reported ``steps`` steps at world n."""
    run = d.runs[jid]
    if len(run.members) != n:
        return False
    logs = [d.state_dir / "logs" / f"{run.workers[m]}.log" for m in run.members]
    return all(sum(s["world"] == n for s in steps_of(p)) >= steps for p in logs)


def test_daemon_holds_every_idle_node_and_the_job_follows_prod_jobs(daemon, cluster: SlurmCluster) -> None:
    d = daemon()
    jid = submit_job(d)
    # every idle node gets a pilot, and the job grows onto all of them
    until(d, "the job trains on the 4 held nodes", lambda: trains_on(d, jid, 4), timeout=120)
    assert sorted(e["nodes"][0] for e in kinds(d, "pilot_started")) == list(NODES)
    assert d.store.require(jid).state is JobState.RUNNING
    run = d.runs[jid]
    survivor_log = d.state_dir / "logs" / f"{run.workers['node1']}.log"
    # a prod job arrives on node3 and node4: their pilots are preempted, the job shrinks to node1, node2
    prod = prod_job(cluster, "-N2", "-w", "node3,node4", "--time=1", "--wrap", "sleep 15")
    until(d, "the job shrinks to 2 nodes", lambda: sorted(d.runs[jid].members) == ["node1", "node2"])
    until(d, "the prod job runs", lambda: job_state(cluster, prod) == "RUNNING", timeout=30)
    until(d, "the job trains on at 2 nodes", lambda: trains_on(d, jid, 2), timeout=60)
    until(d, "the preemptions are reported",
          lambda: sorted(e["nodes"][0] for e in kinds(d, "pilot_ended") if e["reason"] == "preempted")
          == ["node3", "node4"], timeout=30)
    steps = steps_of(survivor_log)
    four = [s["step"] for s in steps if s["world"] == 4]
    two = [s["step"] for s in steps if s["world"] == 2]
    assert four and two and min(two) > max(four) - 2, (four[-3:], two[:3])  # from its last commit, not from 0
    assert d.store.require(jid).state is JobState.RUNNING
    # the prod job ends: node3 and node4 are held again and the job grows back to 4
    until(d, "the job grows back to 4 nodes", lambda: trains_on(d, jid, 4, steps=10), timeout=120)
    assert job_state(cluster, prod) == "COMPLETED"
    later = steps_of(survivor_log)
    assert [s["step"] for s in later] == sorted(s["step"] for s in later)  # never went back
    assert JobState.SUSPENDED.value not in [s for s, _, _ in d.store.history(jid)]


def test_a_node_planned_for_a_pending_prod_job_is_never_held(daemon, cluster: SlurmCluster) -> None:
    blocker = prod_job(cluster, "-w", "node1", "--time=5", "--wrap", "sleep 300")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and job_state(cluster, blocker) != "RUNNING":
        time.sleep(0.2)
    big = prod_job(cluster, "-N4", "--time=1", "--wrap", "sleep 1")  # waits for node1: node2-4 get planned
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and planned(cluster) != {"node2", "node3", "node4"}:
        time.sleep(0.2)  # backfill marks them (every bf_interval): before that they are plainly idle
    d = daemon()
    until(d, "the planned nodes are seen", lambda: d.scav.discovery is not None and {
        n.name for n in d.scav.discovery.nodes if n.planned} == {"node2", "node3", "node4"}, timeout=30)
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end:  # several looks and decisions
        d.step()
        time.sleep(0.05)
    assert kinds(d, "pilot_submitted") == [] and d.backend.pilots() == {}
    assert set(d.scav.recall_times()) == set(NODES)  # the planned start is known for every node of the claim
    # the main scheduler lets go: the blocker and the big job end, every node is idle and held
    cluster.run(["scancel", blocker, big])
    until(d, "every node held", lambda: d.scav.usable() == set(NODES), timeout=60)


def test_a_restarted_daemon_takes_back_its_queued_pilots_and_submits_no_duplicate(
    daemon, cluster: SlurmCluster
) -> None:
    """A daemon is killed while its pilots wait in the queue (the preemptable partition is down): the
    next daemon on the same state dir takes them back from the store, submits nothing while they
    wait, and uses them when they start."""
    def partition(state: str) -> None:
        cluster.run(["scontrol", "update", "PartitionName=preemptable", f"State={state}"])

    def in_slurm() -> set[str]:
        return set(cluster.run(["squeue", "-h", "-p", "preemptable", "-o", "%i"]).stdout.split())

    partition("DOWN")  # sbatch accepts pilots, Slurm starts none
    try:
        d = daemon(max_queued=600.0)
        until(d, "a queued pilot on every node", lambda: len(d.backend.pilots()) == len(NODES) and all(
            v.state is PilotState.QUEUED for v in d.backend.pilots().values()), timeout=30)
        queued = set(d.backend.pilots())
        d.scav.close = lambda: None  # type: ignore[method-assign]  # killed: its pilots wait on in Slurm
        d.close()
        assert in_slurm() == queued
        d2 = daemon(max_queued=600.0)
        started = kinds(d2, "daemon_start")[-1]["time"]
        assert set(d2.backend.pilots()) == queued  # taken back before the first look
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:  # several looks, all pilots still queued
            d2.step()
            time.sleep(0.05)
        assert {v.state for v in d2.backend.pilots().values()} == {PilotState.QUEUED}
        assert in_slurm() == queued
        partition("UP")
        until(d2, "the old pilots hold every node", lambda: d2.scav.usable() == set(NODES), timeout=60)
        assert set(d2.backend.pilots()) == queued and in_slurm() == queued
        assert [e for e in kinds(d2, "pilot_submitted") if e["time"] >= started] == []
    finally:
        partition("UP")


def test_sinfo_squeue_failing_or_hanging_daemon_survives_and_catches_up(
    daemon, cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrap = tmp_path / "bin"
    wrap.mkdir()
    for name in ("sinfo", "squeue"):
        failing_command(wrap, name)
    monkeypatch.setenv("PATH", f"{wrap}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    d = daemon(command_timeout=1.0)
    jid = submit_job(d)
    try:
        until(d, "the job trains on 4 nodes", lambda: trains_on(d, jid, 4), timeout=120)
        decisions = [d.last_decision]
        (wrap / "hang").touch()
        t_end = time.monotonic() + 4
        while time.monotonic() < t_end:
            d.step()  # each look hangs until the command timeout: the loop goes on
            decisions.append(d.last_decision)
        assert d.scav.stale and "timed out" in d.scav.error
        (wrap / "hang").unlink()
        (wrap / "fail").touch()
        prod = prod_job(cluster, "-w", "node4", "--time=1", "--wrap", "sleep 10")  # preempts node4's pilot
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end:
            d.step()
            decisions.append(d.last_decision)
            d.monitor.drain(timeout_ms=50)
        assert d.scav.stale and "Unable to contact" in d.scav.error
        assert {id(x) for x in decisions} == {id(decisions[0])}  # no decision while the data is stale
        assert kinds(d, "pilot_submitted")[-1]["time"] < kinds(d, "backend_error")[0]["time"]  # nor pilots
        assert job_state(cluster, prod) == "RUNNING"
        assert "node4" not in d.runs[jid].members  # its agent left: the job let the node go meanwhile
        (wrap / "fail").unlink()
        until(d, "caught up", lambda: not d.scav.stale and any(
            e["reason"] == "preempted" and e["nodes"] == ["node4"] for e in kinds(d, "pilot_ended")), timeout=30)
        assert kinds(d, "backend_ok")
        until(d, "decides again", lambda: d.last_decision is not decisions[0], timeout=30)
        assert d.store.require(jid).state is JobState.RUNNING
    finally:
        for name in ("hang", "fail"):
            (wrap / name).unlink(missing_ok=True)


@pytest.mark.slow
def test_a_pilot_reaching_its_walltime_hands_its_node_over_without_loss(daemon, cluster: SlurmCluster) -> None:
    """Once the job trains on node1 and node2, node1's pilot is given a walltime 40 s away (``scontrol
    update TimeLimit``, as an operator may: the daemon reads the new end from ``squeue``); at the notice,
    10 s before it, a replacement pilot is queued ``afterany`` on the same node and the job leaves the
    node, training on on node2; at the walltime the daemon ends the old pilot, the replacement starts and
    the job grows back. Each stage waits for the one before: no stage assumes how fast a worker starts
    (with node1's walltime fixed at its submission, under load node2's cold worker had not joined yet
    when node1's notice came, and the job was left with no member)."""
    blockers = [prod_job(cluster, "-w", n, "--time=10", "--wrap", "sleep 600") for n in ("node2", "node3", "node4")]
    d = daemon(walltime=3600.0, renew_before=10.0)
    jid = submit_job(d, max_nodes=2)
    until(d, "the job trains on node1", lambda: trains_on(d, jid, 1, steps=2), timeout=90)
    first = next(e["pilot"] for e in kinds(d, "pilot_started") if e["nodes"] == ["node1"])
    cluster.run(["scancel", blockers[0]])
    until(d, "the job trains on node1 and node2", lambda: trains_on(d, jid, 2, steps=2), timeout=120)
    node2_log = d.state_dir / "logs" / f"{d.runs[jid].workers['node2']}.log"
    ran = run_seconds(cluster, first)
    cluster.run(["scontrol", "update", f"JobId={first}", f"TimeLimit={(ran + 40) // 60}:{(ran + 40) % 60:02d}"])

    def replacement_started() -> float | None:
        repl = [e["pilot"] for e in kinds(d, "pilot_queued") if e["replaces"] == first]
        times = [e["time"] for e in kinds(d, "pilot_started") if repl and e["pilot"] == repl[0]]
        return times[0] if times else None

    until(d, "the replacement runs on node1 and the job is back on it", lambda: replacement_started() is not None
          and any(e["time"] > replacement_started() and "node1" in e["nodes"] for e in kinds(d, "members")),
          timeout=150)
    notice = next(e["time"] for e in kinds(d, "pilot_ending") if e["pilot"] == first)
    assert next(e["reason"] for e in kinds(d, "pilot_ending") if e["pilot"] == first) == "timeout"
    assert next(e["reason"] for e in kinds(d, "pilot_ended") if e["pilot"] == first) == "timeout"
    between = [e["nodes"] for e in kinds(d, "members") if notice <= e["time"] <= replacement_started()]
    assert between and all(nodes == ["node2"] for nodes in between)  # left node1 at the notice, trained on
    steps = steps_of(node2_log)
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps)  # node2's worker never restarted
    assert {1, 2} <= {s["world"] for s in steps}
    assert JobState.SUSPENDED.value not in [s for s, _, _ in d.store.history(jid)]
    cluster.run(["scancel", *blockers[1:]])
