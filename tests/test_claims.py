"""What a job claims about itself (its declared curve, its reported rates, the keys it writes) takes no
other job's nodes and stalls no daemon."""

from __future__ import annotations

import pytest

from policy import Policy, PolicyConfig
from policy import beliefs
from tests.test_policy import Cluster, jv, names, stable


def _victim_then_attacker(scaling: dict[int, float] | None, reported: dict[int, float], nodes: int = 2) -> Cluster:
    """A linear victim runs on two nodes; then a job with ``scaling`` arrives and reports ``reported``
    at every count it runs at."""
    c = Cluster(Policy(PolicyConfig()), names("n", nodes))
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
    from malletrain.jobspec import JobSpecError, parse_spec
    from malletrain.messages import MAX_SAMPLES

    assert parse_spec({"command": ["python", "t.py"], "worker_batch": MAX_SAMPLES}).worker_batch == MAX_SAMPLES
    with pytest.raises(JobSpecError, match="worker_batch"):
        parse_spec({"command": ["python", "t.py"], "worker_batch": MAX_SAMPLES + 1})


def test_malletrain_devices_all_is_the_one_reserved_variable_a_job_may_set() -> None:
    """Before: the docs told users to set it in ``env`` and submit refused it."""
    from malletrain.jobspec import JobSpecError, parse_spec

    assert parse_spec({"command": ["python", "t.py"], "env": {"MALLETRAIN_DEVICES": "all"}}).env == {
        "MALLETRAIN_DEVICES": "all"}
    for env in ({"MALLETRAIN_DEVICES": "0"}, {"MALLETRAIN_SECRET": "x"}):
        with pytest.raises(JobSpecError, match="set by the daemon"):
            parse_spec({"command": ["python", "t.py"], "env": env})


def test_a_torchrun_world_too_big_for_one_store_frame_is_refused_at_submit() -> None:
    from malletrain.jobspec import TORCHRUN_MAX_RANKS, JobSpecError, check_submit, parse_spec

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

    from malletrain.elastic.keys import ready_key, world_key
    from malletrain.jobspec import TORCHRUN_MAX_RANKS, WORKERS_PER_NODE_MAX
    from malletrain.runtimes.torchrun import TorchrunRuntime, World, WORLD_MAX_BYTES

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
