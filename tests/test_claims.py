"""What a job claims about itself (its declared curve, its reported rates, the keys it writes) takes no
other job's nodes and stalls no daemon."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policy import Policy, PolicyConfig
from policy.config import Fairness, Objective
from policy import beliefs
from tests.test_policy import Cluster, jv, names, stable


def _victim_then_attacker(scaling: dict[int, float] | None, reported: dict[int, float], nodes: int = 2,
                          config: PolicyConfig | None = None, victim_counts: list[int] | None = None) -> Cluster:
    """A linear victim runs on two nodes; then a job with ``scaling`` arrives and reports ``reported``
    at every count it runs at (``victim_counts``: the victim's count after each decision from then on)."""
    c = Cluster(Policy(config or PolicyConfig()), names("n", nodes))
    c.submit(jv("victim", 1, 2, order=0))
    c.step(0.0)
    honest = {"victim": stable((2, 200.0), (1, 100.0))}
    c.step(1.0, honest)
    assert c.count("victim") == 2
    c.submit(jv("attacker", 1, 2, order=1, scaling=scaling))
    for t in range(2, 40):
        ev = dict(honest)
        if c.count("attacker"):
            ev["attacker"] = stable(*[(n, r) for n, r in reported.items() if n <= c.count("attacker")])
        c.step(10.0 * t, ev)
        if victim_counts is not None:
            victim_counts.append(c.count("victim"))
    return c


@pytest.mark.parametrize("scaling,reported", [
    ({1: 1.0, 2: 1_000_000.0}, {1: 1.0, 2: 40_000.0}),  # the declared lie, then the measured one
    ({1: 1e6, 2: 2e6}, {1: 1.0, 2: 2000.0}),  # a linear declaration at a level its reports contradict
    (None, {1: 1.0, 2: 1_000_000.0}),  # no declaration: under-report at one node, over-report at two
])
def test_a_declared_or_reported_superlinear_curve_takes_no_running_jobs_nodes(scaling, reported) -> None:
    """Before: the declared ``{1: 1, 2: 10^6}`` was believed as given and took both of the victim's nodes."""
    c = _victim_then_attacker(scaling, reported)
    assert c.count("victim") == 2 and c.count("attacker") == 0


def test_with_a_free_node_a_superlinear_claim_still_takes_none_of_the_victims() -> None:
    c = _victim_then_attacker({1: 1.0, 2: 1_000_000.0}, {1: 1.0, 2: 1_000_000.0}, nodes=3)
    assert c.count("victim") == 2 and c.count("attacker") == 1


@pytest.mark.parametrize("objective", list(Objective))
def test_a_declared_curves_level_takes_no_running_jobs_nodes_under_any_objective(objective) -> None:
    """A linear curve declared at a level no step showed ({1: 10^6, 2: 2 x 10^6}; the job trains 1/s a
    node). Before: under ``objective = "samples"`` that level was believed until measured, and the
    attacker took both of the running victim's nodes at once."""
    counts: list[int] = []
    c = _victim_then_attacker({1: 1e6, 2: 2e6}, {1: 1.0, 2: 2.0}, config=PolicyConfig(objective=objective),
                              victim_counts=counts)
    assert min(counts) == 2 and c.count("attacker") == 0
    # with a node free the attacker gets it and is weighed at the population's per-node rate until measured
    counts.clear()
    c = _victim_then_attacker({1: 1e6, 2: 2e6}, {1: 1.0, 2: 2.0}, nodes=3, config=PolicyConfig(objective=objective),
                              victim_counts=counts)
    assert min(counts) == 2 and c.count("attacker") == 1


def _fresh_fast_job_beside_a_victim(fairness: Fairness, attacker_user: str, level: float = 1e6) -> list[int]:
    """Under ``objective = "samples"`` a victim (user ``victim``) trains 100/s a node on two of three
    nodes; a job with no declared curve takes the free node and reports ``level`` a node from its first
    report. The victim's count after each decision from then on."""
    c = Cluster(Policy(PolicyConfig(objective=Objective.SAMPLES, fairness=fairness)), names("n", 3))
    c.submit(replace(jv("victim", 1, 2, order=0), user="victim"))
    c.step(0.0)
    honest = {"victim": stable((2, 200.0), (1, 100.0))}
    c.step(1.0, honest)
    assert c.count("victim") == 2
    c.submit(replace(jv("fresh", 1, 3, order=1), user=attacker_user))
    counts = []
    for t in range(2, 40):
        ev = dict(honest)
        if c.count("fresh"):
            ev["fresh"] = stable(*[(n, level * n) for n in range(1, c.count("fresh") + 1)])
        c.step(10.0 * t, ev)
        counts.append(c.count("victim"))
    assert c.count("fresh") >= 1
    return counts


@pytest.mark.parametrize("fairness", [Fairness.NONE, Fairness.EQUAL])
def test_a_reported_level_takes_no_running_job_of_another_user_under_samples(fairness) -> None:
    """A fresh job of another user reports 10^6 samples/s a node from its first report (a level the
    daemon cannot check: a sample is the job's own unit). Before: under ``objective = "samples"`` that
    level was believed, and the fresh job took both of the running victim's nodes at once (and, with
    fair share, held them for ``fair_wait_s``)."""
    assert min(_fresh_fast_job_beside_a_victim(fairness, "mallory")) == 2


def test_between_one_users_jobs_a_higher_level_still_wins_under_samples() -> None:
    """The paper's objective stands within a user's own jobs: its faster job takes its slower one's node."""
    assert min(_fresh_fast_job_beside_a_victim(Fairness.NONE, "victim")) < 2


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_fresh_job_on_one_node_claims_no_more_than_one_node_trains_whatever_its_max_nodes(fast_path) -> None:
    """The absolute bound is per node the daemon gave the job (its published world), not per node of its
    ``max_nodes``. Before: a job allowed 8 nodes, running on one, could claim 8 x 10^6 samples/s from
    its first report."""
    from contract.messages import Report, new_secret, secret_key
    from malletrain.daemon.monitor import Monitor
    from malletrain.daemon.ratebound import MAX_RATE_PER_NODE

    now = [1000.0]
    mon = Monitor(clock=lambda: now[0])
    mon.fast_path = fast_path
    try:
        secret = new_secret()
        key = secret_key(secret)
        mon.register("j", secret, max_nodes=8)
        mon.set_world("j", 0, 1)
        now[0] += 2.0  # its first report, 2 s after it was taken, claims a world of 8 at 3 x 10^6 a node
        mon.ingest(Report("j", 1, int(3 * MAX_RATE_PER_NODE * 2), now[0], 8, 0, "w0").encode(key))
        assert mon.counts()["implausible"] == 1 and mon.jobs["j"].samples == 0
        mon.ingest(Report("j", 2, int(MAX_RATE_PER_NODE * 2), now[0], 8, 0, "w0").encode(key))  # one node's worth
        assert mon.counts()["accepted"] == 1
        mon.set_world("j", 1, 4)  # grown to 4 nodes: 4 nodes' worth is taken
        now[0] += 2.0
        mon.ingest(Report("j", 3, int(4 * MAX_RATE_PER_NODE * 2), now[0], 4, 1, "w0").encode(key))
        assert mon.counts()["accepted"] == 2
    finally:
        mon.close()


def test_learn_off_trusts_a_declared_level_as_given() -> None:
    """``learn = false`` (the FreeTrain baseline) trusts the user's curve: its level decides under samples."""
    pol = Policy(PolicyConfig(objective=Objective.SAMPLES, learn=False))
    assert pol.beliefs.curves(jv("a", 1, 2, scaling={1: 1e6, 2: 2e6}))[1] == pytest.approx({1: 1e6, 2: 2e6})
    pol = Policy(PolicyConfig(objective=Objective.SAMPLES))
    assert pol.beliefs.curves(jv("a", 1, 2, scaling={1: 1e6, 2: 2e6}))[1] == pytest.approx({1: 1.0, 2: 2.0})


def test_efficiency_above_linear_is_never_believed() -> None:
    assert beliefs.at_most_linear({1: 1.0, 2: 1e6, 4: 3.0}) == {1: 1.0, 2: 2.0, 4: 3.0}
    assert beliefs.at_most_linear({2: 10.0, 4: 30.0, 8: 35.0}) == {2: 10.0, 4: 20.0, 8: 35.0}
    concave = {1: 10.0, 2: 19.0, 4: 30.0}
    assert beliefs.at_most_linear(concave) == concave
    pol = Policy(PolicyConfig())
    assert pol.believed_curve(jv("a", 1, 4, scaling={1: 1.0, 4: 1e6})) == pytest.approx({1: 1.0, 2: 2.0, 4: 4.0})
    pol = Policy(PolicyConfig(), beliefs.PolicyState(measured={"a": {1: 5.0, 2: 5000.0}}))
    assert pol.believed_curve(jv("a", 1, 2, scaling={1: 1.0, 2: 1e6})) == pytest.approx({1: 5.0, 2: 10.0})


# ------------------------------------------------------------------ counts and values the job can inflate


def test_a_worker_batch_a_report_cannot_carry_is_refused_at_submit() -> None:
    """Before: 2^31 was accepted although a report carries at most 2^31-1 samples."""
    from malletrain.daemon.jobspec import JobSpecError, parse_spec
    from contract.messages import MAX_SAMPLES

    assert parse_spec({"command": ["python", "t.py"], "worker_batch": MAX_SAMPLES}).worker_batch == MAX_SAMPLES
    with pytest.raises(JobSpecError, match="worker_batch"):
        parse_spec({"command": ["python", "t.py"], "worker_batch": MAX_SAMPLES + 1})


def test_malletrain_devices_all_is_the_one_reserved_variable_a_job_may_set() -> None:
    """Before: the docs told users to set it in ``env`` and submit refused it."""
    from malletrain.daemon.jobspec import JobSpecError, parse_spec

    assert parse_spec({"command": ["python", "t.py"], "env": {"MALLETRAIN_DEVICES": "all"}}).env == {
        "MALLETRAIN_DEVICES": "all"}
    for env in ({"MALLETRAIN_DEVICES": "0"}, {"MALLETRAIN_SECRET": "x"}):
        with pytest.raises(JobSpecError, match="set by the daemon"):
            parse_spec({"command": ["python", "t.py"], "env": env})


def test_a_torchrun_world_too_big_for_one_store_frame_is_refused_at_submit() -> None:
    from malletrain.daemon.jobspec import JobSpecError, check_submit, parse_spec
    from contract.world import TORCHRUN_MAX_RANKS

    ok = parse_spec({"command": ["python", "t.py"], "launcher": "torchrun", "max_nodes": TORCHRUN_MAX_RANKS // 8,
                     "workers_per_node": 8})
    check_submit(ok)
    big = parse_spec({"command": ["python", "t.py"], "launcher": "torchrun", "max_nodes": 4608,
                      "workers_per_node": 6})
    with pytest.raises(JobSpecError, match="ranks"):
        check_submit(big)
    check_submit(parse_spec({"command": ["python", "t.py"], "max_nodes": 4608, "workers_per_node": 6}))  # elastic


def test_a_ready_key_claiming_a_million_local_ranks_is_not_believed_and_no_world_outgrows_a_frame() -> None:
    """Before: a restarted daemon believed any K in a rank agent's ready key (the job writes it) and
    built a world of that many ranks (10^6: 12 s of no answer, 600 MB)."""
    import sys

    from contract.storekeys import ready_key, world_key
    from contract.world import TORCHRUN_MAX_RANKS, WORKERS_PER_NODE_MAX
    from malletrain.runtimes.torchrun import TorchrunRuntime, WORLD_MAX_BYTES
    from contract.world import World

    rt = TorchrunRuntime()
    try:
        rt.start_if_needed()
        store = rt._require_store()
        store.set(ready_key("j1", "j1.a"), str(10**6))
        store.set(ready_key("j1", "j1.b"), str(10**6))
        rt.readopt("j1", (sys.executable, "train.py"), {"j1.a": "n1", "j1.b": "n2"})
        gen = rt.set_members("j1", ["j1.a", "j1.b"])
        world = World.parse(store.get(world_key("j1", gen)), "w")
        assert sorted(world.places) == ["j1.a", "j1.b"]
        # honest K up to a node's most are believed; a world of more ranks than a frame carries is refused
        workers = [f"j2.w{i}" for i in range(TORCHRUN_MAX_RANKS // WORKERS_PER_NODE_MAX + 1)]
        for w in workers:
            store.set(ready_key("j2", w), str(WORKERS_PER_NODE_MAX))
        rt.readopt("j2", (sys.executable, "train.py"), {w: f"n{i}" for i, w in enumerate(workers)})
        with pytest.raises(ValueError, match="ranks"):
            rt.set_members("j2", workers)
        long = [f"j3.{'n' * 200}{i}" for i in range(TORCHRUN_MAX_RANKS // 2)]
        for w in long:
            store.set(ready_key("j3", w), "2")
        rt.readopt("j3", (sys.executable, "train.py"), {w: w for w in long})
        with pytest.raises(ValueError, match=str(WORLD_MAX_BYTES)):
            rt.set_members("j3", long)
    finally:
        rt.close()


# ------------------------------------------------------------------ what a restart reads does not rotate


def test_no_jobs_events_rotate_out_what_a_restarted_daemon_reads(tmp_path) -> None:
    """Before: a job restarted in a loop (~14 events a second) rotated the kept events, the daemon's
    start row with them, and a restarted daemon no longer knew its predecessor was killed; a torchrun
    job's restart count was counted from those rows too."""
    from malletrain.daemon.store import Store

    s = Store.open(tmp_path / "state" / "store.db", max_events=50)
    try:
        s.log_event("daemon_start", pid=1)  # ... and no daemon_stop: killed
        s.count_world("j1")
        s.count_world("j1")
        for i in range(400):
            s.log_event("worker_stopped", "j2", worker=f"w{i}", code=143)
        s.prune_events()
        assert len(list(s.events("worker_stopped"))) == 50
        assert s.last_daemon_was_killed()
        assert s.worlds("j1") == 2 and s.worlds("j2") is None
        s.set_worlds("j2", 5)
        s.count_world("j2")
        assert s.worlds("j2") == 6
    finally:
        s.close()


# ------------------------------------------------------------------ the submitter's umask


def test_workers_run_with_the_umask_their_submitter_had(tmp_path) -> None:
    """Before: workers ran with the daemon's umask (0022 under root): a job submitted under umask 077
    wrote checkpoints every other user could read."""
    from malletrain.daemon.control import Caller, parse_request
    from policy import PolicyConfig
    from tests.test_conformance import LINEAR, Harness

    req = parse_request({"cmd": "submit", "spec": {"command": ["true"]}, "umask": 0o077}, Caller(1000, 1000, False))
    assert req.umask == 0o077  # type: ignore[union-attr]
    with pytest.raises(Exception, match="umask"):
        parse_request({"cmd": "submit", "spec": {"command": ["true"]}, "umask": 0o1000}, Caller(1000, 1000, False))
    from malletrain.daemon.jobspec import JobSpec
    from malletrain.daemon.statedir import current_umask

    h = Harness(tmp_path / "d", PolicyConfig())
    try:
        h.cluster.became_idle("n01")
        plain = h.daemon.store.submit(JobSpec(name="plain", command=("true",), max_nodes=1))
        assert h.daemon.store.get(plain).owner_umask == current_umask()  # the submitting process's
        h.daemon.store.request_cancel(plain)
        private = h.daemon.store.submit(JobSpec(name="private", command=("true",), max_nodes=1), owner_umask=0o077)
        h.monitor.curves[private] = dict(LINEAR)
        h.run_until(3.0)
        worker = h.daemon.runs[private].workers["n01"]
        assert h.cluster.umasks[worker] == 0o077
    finally:
        h.close()


# ------------------------------------------------------------------ the metrics endpoint's errors


def test_a_silent_connection_to_the_metrics_endpoint_is_one_log_line_not_a_traceback(monkeypatch, capfd, caplog) -> None:
    """Before: each timed-out silent connection printed a 17-line traceback on the daemon's stderr,
    outside the log's repeat filter (40 KB a minute from 4 connections)."""
    import logging
    import socket
    import time

    from malletrain.daemon import metrics_server

    monkeypatch.setattr(metrics_server._QuietHandler, "timeout", 0.2)
    app = lambda environ, start: (start("200 OK", []), [b"ok"])[1]  # noqa: E731
    httpd, thread = metrics_server.serve_metrics("127.0.0.1", 0, app)
    try:
        with caplog.at_level(logging.WARNING, logger="malletrain.daemon.metrics"):
            conns = [socket.create_connection(httpd.server_address[:2]) for _ in range(2)]
            deadline = time.monotonic() + 20
            while len([r for r in caplog.records if "request failed" in r.getMessage()]) < 2:
                assert time.monotonic() < deadline, "no failure logged"
                time.sleep(0.05)
            for c in conns:
                c.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert all("TimeoutError" in r.getMessage() or "timed out" in r.getMessage() for r in caplog.records
               if "request failed" in r.getMessage())


# ------------------------------------------------------------------ one unreadable node, not the whole listing


def test_one_node_whose_gres_cannot_be_read_is_skipped_and_the_others_are_listed(caplog) -> None:
    """Before: one bad Gres (or ngpus) failed the whole listing, so no node was held anywhere."""
    import json
    import logging

    from scavenger.base import CommandResult
    from scavenger.pbs import PbsConfig, PbsDialect
    from scavenger.slurm import SlurmConfig, SlurmDialect

    reply = "n1|idle|gpu:4\nn2|idle|gpu:a100:x\nn3|idle|(null)\n"
    with caplog.at_level(logging.WARNING):
        nodes = SlurmDialect(SlurmConfig(partition="p")).parse_nodes(CommandResult(["sinfo"], 0, reply, "", 0.0))
    assert [n.name for n in nodes] == ["n1", "n3"]
    assert any("n2" in r.getMessage() and "gpu:a100:x" in r.getMessage() for r in caplog.records)
    doc = {"nodes": {"v1": {"state": "free", "resources_available": {"ncpus": 1, "ngpus": 2}},
                     "v2": {"state": "free", "resources_available": {"ncpus": 1, "ngpus": "four"}}}}
    with caplog.at_level(logging.WARNING):
        nodes = PbsDialect(PbsConfig()).parse_nodes(CommandResult(["pbsnodes"], 0, json.dumps(doc), "", 0.0))
    assert [n.name for n in nodes] == ["v1"]
    assert any("v2" in r.getMessage() and "ngpus" in r.getMessage() for r in caplog.records)


def test_at_the_daemon_a_declared_superlinear_curve_takes_no_running_jobs_nodes(tmp_path) -> None:
    """The attack through the daemon (fakes, the test's clock): a victim on both nodes, then a job
    declaring ``{1: 1, 2: 10^6}`` that trains 20/s a node. Before: it took both nodes at once."""
    from policy import PolicyConfig
    from tests.test_conformance import Harness

    h = Harness(tmp_path / "d", PolicyConfig())
    try:
        h.cluster.became_idle("n01", "n02")
        victim = h.submit("victim", {1: 100.0, 2: 200.0}, max_nodes=2)
        h.run_until(20.0)
        assert len(h.daemon.decide.nodes_of(victim)) == 2
        liar = h.submit("liar", {1: 20.0, 2: 40.0}, user_curve={1: 1.0, 2: 1_000_000.0}, max_nodes=2)
        for t in range(21, 120):
            h.step(float(t))
            assert len(h.daemon.decide.nodes_of(victim)) == 2, f"the liar took the victim's nodes at {t} s"
        assert not h.daemon.decide.nodes_of(liar)
    finally:
        h.close()
