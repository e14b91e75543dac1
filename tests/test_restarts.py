"""Daemon restarts: a clean stop (SIGTERM) and a kill -9, with every kind of job.

Data loss and stuck jobs: after a stop, torch jobs that
needed fresh workers waited for generation 1 forever; a job killed while
SUSPENDED lost its checkpoint; a stop left stored progress behind the workers';
and a clean restart aborted a profile for good. Each has a test here (the
elastic-layer halves are in ``tests/test_elastic.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from malletrain.worker.examples.tracelog import steps as _steps
from malletrain.daemon.jobspec import JobSpec as DaemonJobSpec
from malletrain.daemon.jobspec import JobState
from policy import PolicyConfig
from malletrain.daemon.store import Store
from tests.test_conformance import NODES, Harness, _lending_setup, _state
from stepping import wait_until

NODES_4 = NODES[:4]


def stored(tmp_path: Path, jid: str):
    """A job as the store of a stopped daemon holds it."""
    db = Store.open(tmp_path / "d" / "store.db")
    try:
        return db.require(jid)
    finally:
        db.close()


def test_a_clean_restart_restarts_an_interrupted_profile_cleanly(tmp_path: Path) -> None:
    """B is being profiled on 2 nodes it borrowed from A when the daemon is stopped (SIGTERM).

    Before: the restarted policy read B at 0 nodes as preempted and ended its profile for good
    (``profile_aborted``, never profiled again). Now the stop suspends both jobs, the restart
    drops the interrupted session (A is owed nothing any more) and B is profiled afresh."""
    h, a, b = _lending_setup(tmp_path)
    h.run_until(10.0)
    assert b in h.daemon.policy.state.profiles and _state(h, b) is JobState.PROFILING
    h.close()  # a clean stop: both jobs' workers stopped, both SUSPENDED
    assert stored(tmp_path, a).state is JobState.SUSPENDED and stored(tmp_path, b).state is JobState.SUSPENDED
    assert stored(tmp_path, b).message == "daemon stopped"
    h2 = Harness(tmp_path / "d", PolicyConfig(profiling="requested", max_running=4, profile_time_cap_s=60.0),
                 cluster=h.cluster, now=11.0)
    try:
        h2.monitor.curves.update(h.monitor.curves)
        assert b in h2.daemon.policy.state.profiles  # as saved: nothing is decided before the first decision
        h2.run_until(60.0)
        st = h2.daemon.policy.state
        assert [e["job"] for e in h2.events("profile_restarted")] == [b]
        assert not h2.events("profile_aborted")
        starts = [e for e in h2.events("profile_start") if e["job"] == b]
        assert len(starts) == 2  # the first, before the stop, and the fresh one
        assert [e["job"] for e in h2.events("profile_done")] == [b] and b in st.profiled  # profiled in full
        assert set(st.measured[b]) == {1, 2, 4} and b not in st.debts
        assert _state(h2, a) in (JobState.RUNNING, JobState.RESCALING)  # and the lender runs again
    finally:
        h2.close()


def test_a_kill_9_keeps_a_profile_going(tmp_path: Path) -> None:
    """The other half: a crash leaves the workers running, and the profile goes on (no restart)."""
    from tests.test_conformance import _crash

    h, a, b = _lending_setup(tmp_path)
    h.run_until(10.0)
    _crash(h)
    h2 = Harness(tmp_path / "d", PolicyConfig(profiling="requested", max_running=4, profile_time_cap_s=60.0),
                 cluster=h.cluster, now=11.0)
    try:
        h2.monitor.curves.update(h.monitor.curves)
        h.cluster.reconnect_agents()
        h2.run_until(14.0)
        assert _state(h2, b) is JobState.PROFILING and not h2.events("profile_restarted")
    finally:
        h2.close()


def test_a_queued_job_stays_queued_across_a_clean_restart(tmp_path: Path) -> None:
    h, a, b = _lending_setup(tmp_path)
    spec = DaemonJobSpec(name="C", command=("true",), min_nodes=8, max_nodes=8)  # never fits: stays queued
    c = h.daemon.store.submit(spec)
    h.run_until(10.0)
    h.close()
    assert stored(tmp_path, c).state is JobState.PENDING
    h2 = Harness(tmp_path / "d", PolicyConfig(profiling="requested", max_running=4, profile_time_cap_s=60.0),
                 cluster=h.cluster, now=11.0)
    try:
        h2.run_until(20.0)
        assert _state(h2, c) is JobState.PENDING and c in h2.daemon.runs
    finally:
        h2.close()


def test_a_clean_restart_gives_the_jobs_that_ran_their_nodes_before_a_job_that_waited(tmp_path: Path) -> None:
    """Three slots on four nodes: A on 2, B (profiled) on 1, C on 1; a recall takes C's node, so C
    keeps its slot with no node. After a clean stop every job is at 0 nodes and every count ties.

    Before: the restarted policy put A and B back through the queue front behind C, which had kept
    its slot, and the allocator gave the tie to C: B, which had run, waited with no node for good
    (the faults benchmark's part ``restarts`` lost it whenever the recall hit C's node). Now the
    allocator sees the jobs in FCFS order: A and B run on what they ran on, C waits as it did."""
    from tests.test_conformance import LINEAR, NODES

    pcfg = PolicyConfig(max_running=3)
    h = Harness(tmp_path / "d", pcfg)
    h.cluster.became_idle(*NODES[:4])
    a = h.submit("A", LINEAR, max_nodes=2)
    h.run_until(3.0)
    b = h.daemon.store.submit(DaemonJobSpec(name="B", command=("true",), min_nodes=1, max_nodes=1, profile=True))
    h.monitor.curves[b] = {1: 100.0}
    h.run_until(30.0)
    c = h.submit("C", LINEAR, max_nodes=1)
    h.run_until(40.0)
    assert [len(h.daemon.decide.nodes_of(j)) for j in (a, b, c)] == [2, 1, 1]
    h.cluster.recall(*h.daemon.decide.nodes_of(c))
    h.run_until(60.0)
    before = {j: h.daemon.decide.nodes_of(j) for j in (a, b)}
    assert _state(h, c) is JobState.SUSPENDED and h.daemon.decide.nodes_of(c) == ()
    assert c in h.daemon.policy.state.admitted  # it kept its slot, with no node
    h.close()  # a clean stop: every job SUSPENDED ("daemon stopped")
    h2 = Harness(tmp_path / "d", pcfg, cluster=h.cluster, now=61.0)
    try:
        h2.monitor.curves.update(h.monitor.curves)
        h2.run_until(120.0)
        assert {j: h2.daemon.decide.nodes_of(j) for j in (a, b)} == before
        assert _state(h2, a) is JobState.RUNNING and _state(h2, b) is JobState.RUNNING
        assert _state(h2, c) is JobState.SUSPENDED and h2.daemon.decide.nodes_of(c) == ()
    finally:
        h2.close()


def test_a_daemon_killed_without_its_state_file_gets_the_adoption_window(tmp_path: Path) -> None:
    """A daemon killed -9 with no job active, its ``daemon.json`` gone (the faults benchmark removes
    it to see the next one start): its agents still run, each holding its node's one connection.

    Before: the next daemon took the missing file for a clean stop and held the idle nodes at once;
    each new pilot's agent got no answer beside the surviving one, left, and was submitted again,
    forever, so the nodes never became usable and every queued job stayed pending (25 jobs lost in
    the benchmark's part ``kills``). Now the event log (a start with no stop after it) opens the
    adoption window too: no pilot is submitted before the surviving agents had their chance."""
    h = Harness(tmp_path / "d", PolicyConfig())
    h.cluster.became_idle(*NODES_4)
    h.run_until(3.0)
    assert [e["nodes"] for e in h.events("pilot_submitted")]  # it held the idle nodes
    log_event = h.daemon.store.log_event

    def no_stop(kind: str, job: str = "", **detail: object) -> None:
        if kind != "daemon_stop":
            log_event(kind, job, **detail)

    h.daemon.store.log_event = no_stop  # type: ignore[method-assign]
    h.close()  # killed: no daemon_stop logged; daemon.json is gone as after any close
    assert not (tmp_path / "d" / "daemon.json").exists()
    h2 = Harness(tmp_path / "d", PolicyConfig(), cluster=h.cluster, now=4.0)
    try:
        submitted = len(h2.events("pilot_submitted"))
        h2.run_until(5.0)
        assert len(h2.events("pilot_submitted")) == submitted  # the window is open: nothing new held
        h2.run_until(4.0 + h2.daemon.cfg.agent_dead_after + 3.0)
        assert len(h2.events("pilot_submitted")) > submitted  # and then the idle nodes are held again
    finally:
        h2.close()
    h3 = Harness(tmp_path / "d", PolicyConfig(), cluster=h.cluster, now=60.0)  # after a clean stop: no window
    try:
        submitted = len(h3.events("pilot_submitted"))
        h3.run_until(61.0)
        assert len(h3.events("pilot_submitted")) > submitted
    finally:
        h3.close()


# -- real processes: a torch job through a stop, a kill -9 while suspended, and a restart --------------

TORCH_CONFIG = """
state_dir = "{state}"
runtime = "torch"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 10.0
store_grace = 60.0
backend = "local"
[local]
nodes = {nodes}
trace = "none"
"""

TORCH_JOB = """
name = "lin"
command = ["{python}", "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
           "--trace", "--step-sleep", "0.05"]
min_nodes = 2
max_nodes = 2
scaling = {{ 1 = 100.0, 2 = 200.0 }}
env = {{ OMP_NUM_THREADS = "1" }}
"""


@pytest.mark.slow
def test_torch_job_survives_a_stop_and_a_kill_9_while_suspended(tmp_path: Path) -> None:
    """Findings 1-3 end to end, with real daemon, agent and worker processes.

    A stop suspends the job: its rank 0 leaves its last commit, which the daemon keeps on disk
    (0600), and every report is stored. A daemon then runs on 1 node (the job needs 2: it stays
    SUSPENDED) and is killed -9. On 2 nodes again, fresh workers join the generation the new
    daemon publishes and go on from the stored commit: no step is lost, none is trained twice but
    the one a stop may catch between its report and its commit."""
    import signal
    import stat
    import sys

    from tests.procs import procs_mentioning
    from tests.test_daemon_cli import cli, start_daemon

    state, cfg, log = tmp_path / "state", tmp_path / "daemon.toml", tmp_path / "daemon.log"
    (tmp_path / "job.toml").write_text(TORCH_JOB.format(python=sys.executable))

    def daemon(nodes: int):
        cfg.write_text(TORCH_CONFIG.format(state=state, nodes=nodes))
        d = start_daemon(cfg, log)
        wait_until(lambda: (state / "daemon.json").exists() or d.poll() is not None, "daemon.json", timeout=60)
        assert d.poll() is None, log.read_text()[-3000:]
        return d

    def logs(jid: str) -> set[Path]:
        return set((state / "logs").glob(f"{jid}.*.log"))

    def record(jid: str):
        db = Store.open(state / "store.db")
        try:
            return db.require(jid), list(db.events())
        finally:
            db.close()

    d = daemon(2)
    try:
        res = cli("submit", str(tmp_path / "job.toml"), "--state-dir", str(state))
        assert res.returncode == 0, res.stderr
        jid = res.stdout.strip()
        wait_until(lambda: len(logs(jid)) == 2 and all(sum(s["world"] == 2 for s in _steps(p)) >= 10 for p in logs(jid)),
             "the job trains on 2 nodes", timeout=240)
        # 1. a clean stop (SIGTERM)
        d.send_signal(signal.SIGTERM)
        assert d.wait(timeout=120) == 0, log.read_text()[-3000:]
        wait_until(lambda: not procs_mentioning(str(state)), "no orphans after the stop", timeout=30)
        first = logs(jid)
        last_step = max(s["step"] for p in first for s in _steps(p))
        trained = max(s["samples"] for p in first for s in _steps(p))
        rec, _ = record(jid)
        assert rec.state is JobState.SUSPENDED and rec.message == "daemon stopped"
        # every report of every committed step is stored; the last step printed may have been caught by the stop
        # between its report and its commit (the script sleeps there): rolled back, its report dropped, and
        # trained again after the restart (step 3: the fresh workers start at last_step or after)
        per_step = trained // last_step  # min = max = 2 nodes: every step the same global batch
        assert trained - per_step <= rec.samples <= trained, (rec.samples, trained, per_step)
        ckpt = state / "checkpoints" / f"{jid}.ckpt"
        assert ckpt.exists() and stat.S_IMODE(ckpt.stat().st_mode) == 0o600
        assert stat.S_IMODE((state / "checkpoints").stat().st_mode) == 0o700

        # 2. a daemon on 1 node: the job (2 nodes) stays SUSPENDED; it is killed -9 there
        d = daemon(1)
        def up_since_start() -> bool:
            events = record(jid)[1]
            last_start = max(i for i, e in enumerate(events) if e["kind"] == "daemon_start")
            return any(e["kind"] == "agent_up" for e in events[last_start:])

        wait_until(up_since_start, "the 1-node daemon's agent", timeout=60)
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=30)
        rec, events = record(jid)
        assert rec.state is JobState.SUSPENDED and logs(jid) == first  # never placed, no worker started
        assert ckpt.exists()
        samples_before = rec.samples

        # 3. 2 nodes again: fresh workers join whatever generation is published, from the stored commit
        d = daemon(2)
        wait_until(lambda: len(logs(jid) - first) == 2 and all(len(_steps(p)) >= 10 for p in logs(jid) - first),
             "fresh workers train", timeout=240)
        fresh = sorted(logs(jid) - first)
        steps = [s["step"] for s in _steps(fresh[0])]
        assert steps[0] >= last_step and steps == sorted(steps), (last_step, steps[:5])  # went on, no step lost
        assert {s["gen"] for p in fresh for s in _steps(p)} and min(s["gen"] for s in _steps(fresh[0])) > 1
        assert "resumed from the checkpoint" in fresh[0].read_text() + fresh[1].read_text()
        wait_until(lambda: record(jid)[0].samples > samples_before, "progress counted again", timeout=60)
        gens = [e["generation"] for e in record(jid)[1] if e["kind"] == "members" and e["job"] == jid]
        assert gens == sorted(gens) and len(set(gens)) == len(gens)  # numbering never went back
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=120)
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans", timeout=30)
    jobs = [r for r in Store.open(state / "store.db").jobs()]
    assert [r.id for r in jobs] == [jid]  # none lost, none duplicated


# -- real processes: every job kind through a kill -9, a stop, and a kill -9 while suspended -----------

# agent_dead_after: how long a node agent waits for a daemon before it gives up and stops its
# workers. A kill -9 and the next daemon's start fit in it (a loaded machine takes seconds to start a
# Python daemon: at 4 s every agent had given up, and nothing was there to adopt); adoption itself ends
# as soon as every agent is back, not after it.
TOY_CONFIG = """
state_dir = "{state}"
runtime = "toy"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = 20.0
backend = "local"
[local]
nodes = {nodes}
trace = "none"
[policy]
max_running = 3
profiling = "requested"
profile_rel_ci = 1e-9
profile_time_cap_s = 3600.0
"""


@pytest.mark.slow
def test_every_job_kind_resumes_after_kill_9_and_stop(tmp_path: Path) -> None:
    """A running job, a 2-node job, a job being profiled and a queued one (toy runtime), through a
    daemon kill -9, a clean stop, and a kill -9 while the 2-node job is SUSPENDED (a 1-node daemon):
    after each start every job is back and trains (progress grows), the profile goes on after the
    kill and starts over after the stop, the queued job stays queued, no job is lost or duplicated,
    and no process is left."""
    import signal
    import sys

    from tests.procs import procs_mentioning
    from tests.test_daemon_cli import start_daemon

    state, cfg, log = tmp_path / "state", tmp_path / "daemon.toml", tmp_path / "daemon.log"
    toy = (sys.executable, "-m", "malletrain.worker.toy", "--rate", "2000")
    state.mkdir(mode=0o700)
    db = Store.open(state / "store.db")
    one = db.submit(DaemonJobSpec("one", toy, 1, 1, False, {1: 100.0}))
    two = db.submit(DaemonJobSpec("two", toy, 2, 2, False, {1: 100.0, 2: 200.0}))
    prof = db.submit(DaemonJobSpec("prof", toy, 1, 2, True))
    queued = db.submit(DaemonJobSpec("queued", toy, 1, 1, False, {1: 100.0}))  # the 4th: max_running = 3
    db.close()
    running = (one, two, prof)

    def daemon(nodes: int):
        cfg.write_text(TOY_CONFIG.format(state=state, nodes=nodes))
        d = start_daemon(cfg, log)
        wait_until(lambda: (state / "daemon.json").exists() or d.poll() is not None, "daemon.json", timeout=60)
        assert d.poll() is None, log.read_text()[-3000:]
        return d

    def look() -> tuple[dict, list[dict]]:
        s = Store.open(state / "store.db")
        try:
            return {r.id: r for r in s.jobs()}, list(s.events())
        finally:
            s.close()

    def since_start(events: list[dict]) -> list[dict]:
        return events[max(i for i, e in enumerate(events) if e["kind"] == "daemon_start"):]

    def all_train(after: dict[str, int], states=(JobState.RUNNING, JobState.PROFILING)) -> bool:
        jobs, _ = look()
        return all(jobs[j].state in states and jobs[j].samples > after.get(j, 0) for j in running)

    d = daemon(5)
    try:
        wait_until(lambda: all_train({}) and look()[0][prof].state is JobState.PROFILING, "every job trains",
             timeout=120)
        assert look()[0][queued].state is JobState.PENDING

        # 1. kill -9: the workers go on, the new daemon re-adopts them; the profile goes on
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=30)
        at_kill = {j: r.samples for j, r in look()[0].items()}
        d = daemon(5)
        wait_until(lambda: all_train(at_kill) and any(e["kind"] == "readopted" for e in since_start(look()[1])),
             "every job re-adopted and training", timeout=120)
        jobs, events = look()
        assert jobs[prof].state is JobState.PROFILING and jobs[queued].state is JobState.PENDING
        assert not [e for e in events if e["kind"] in ("profile_aborted", "profile_restarted")]

        # 2. a clean stop: every running job SUSPENDED, its progress stored
        d.send_signal(signal.SIGTERM)
        assert d.wait(timeout=120) == 0, log.read_text()[-3000:]
        wait_until(lambda: not procs_mentioning(str(state)), "no orphans after the stop", timeout=30)
        jobs, _ = look()
        assert all(jobs[j].state is JobState.SUSPENDED and jobs[j].message == "daemon stopped" for j in running)
        assert jobs[queued].state is JobState.PENDING
        at_stop = {j: r.samples for j, r in jobs.items()}

        # 3. a daemon on 1 node ("two" needs 2: it stays SUSPENDED), killed -9
        d = daemon(1)
        wait_until(lambda: any(e["kind"] == "agent_up" for e in since_start(look()[1])), "the 1-node daemon's agent",
             timeout=60)
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=30)
        assert look()[0][two].state is JobState.SUSPENDED

        # 4. 5 nodes again: every job trains again; the profile interrupted by the stop starts over
        d = daemon(5)
        wait_until(lambda: all_train(at_stop, (JobState.RUNNING, JobState.PROFILING, JobState.RESCALING)),
             "every job trains after the stop", timeout=180)
        jobs, events = look()
        assert jobs[queued].state is JobState.PENDING
        assert [e["job"] for e in events if e["kind"] == "profile_restarted"] == [prof]
        assert len([e for e in events if e["kind"] == "profile_start" and e["job"] == prof]) == 2
        assert not [e for e in events if e["kind"] == "profile_aborted"]
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=120)
    wait_until(lambda: not procs_mentioning(str(state)), "no orphans", timeout=30)
    jobs, _ = look()
    assert sorted(jobs) == sorted((one, two, prof, queued))  # none lost, none duplicated
    assert all(jobs[j].samples > at_stop[j] for j in running)
