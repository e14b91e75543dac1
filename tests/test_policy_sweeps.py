"""The policy knows a sweep's or an array's jobs are short and many (:mod:`policy.sweeps`): pure.

A stream holds at most ``stream_share`` of the Pjmax slots, so an array submitted first keeps no later
job out; fair share between users holds beside it; a trial near its end is not grown at a scale-up
pause it cannot repay; the simulator's ``hpo`` stream says which search each trial is of.
"""

from __future__ import annotations

from policy import Policy, PolicyConfig, View
from policy.model import JobView
from policy.sweeps import grow_repays, most_repaid, stream_bound, stream_order

NODES = tuple(f"n{i}" for i in range(4))
LINEAR = {1: 10.0, 2: 20.0, 3: 30.0, 4: 40.0}


def _decide(pol: Policy, jobs: list[JobView], now: float = 0.0) -> dict[str, int]:
    used = {n for j in jobs for n in j.nodes}
    return pol.decide(View(now, tuple(n for n in NODES if n not in used), tuple(jobs)), {}).counts


def _array(n: int, user: str = "alice") -> list[JobView]:
    return [JobView(f"e{i:02d}", 1, 1, order=i, scaling={1: 10.0}, user=user, group="array:a000001") for i in range(n)]


def test_an_array_submitted_first_keeps_no_later_job_out_of_a_slot():
    cfg = PolicyConfig(profiling="never", max_running=4)
    late = JobView("x", 1, 1, order=100, scaling={1: 10.0}, user="alice")  # the same user: fair share is no help
    counts = _decide(Policy(cfg), _array(12) + [late])
    assert counts.get("x") == 1, counts
    assert sum(counts.values()) == 4  # the array still takes every node the other job cannot use
    # the knob turns it off: FCFS, the array's 4 elements hold every slot and the later job waits
    off = _decide(Policy(PolicyConfig(profiling="never", max_running=4, stream_share=0.0)), _array(12) + [late])
    assert "x" not in off and sum(off.values()) == 4


def test_a_stream_alone_still_runs_on_every_node():
    counts = _decide(Policy(PolicyConfig(profiling="never", max_running=4)), _array(12))
    assert sum(counts.values()) == 4


def test_fair_share_between_users_holds_beside_a_stream():
    pol = Policy(PolicyConfig(profiling="never", max_running=4, fair_wait_s=5.0))
    held: dict[str, tuple[str, ...]] = {}
    counts: dict[str, int] = {}
    for t in range(0, 20):
        jobs = [JobView(j.id, 1, 1, held.get(j.id, ()), order=j.order, scaling=j.scaling, user=j.user, group=j.group)
                for j in _array(12)]
        if t >= 3:
            jobs.append(JobView("b1", 1, 4, held.get("b1", ()), order=100, scaling=LINEAR, user="bob"))
        used = {n for nodes in held.values() for n in nodes}
        d = pol.decide(View(float(t), tuple(n for n in NODES if n not in used), tuple(jobs)), {})
        held = {j: tuple(nodes) for j, nodes in d.assignment.items()}
        counts = d.counts
    assert counts.get("b1", 0) >= 2, counts  # bob's share of 4 nodes between two users


def _trial(work_left: float, group: str = "sweep:s") -> JobView:
    return JobView("t", 1, 4, ("n0",), order=0, scaling=LINEAR, work_left=work_left, group=group)


def test_a_trial_near_its_end_is_not_grown_at_a_pause_it_cannot_repay():
    cfg = PolicyConfig(profiling="never", default_up_cost_s=10.0)
    assert _decide(Policy(cfg), [_trial(50.0)]) == {"t": 1}  # 5 s left at 1 node; 11.25 s at 4 with the pause
    assert _decide(Policy(cfg), [_trial(1e6)]) == {"t": 4}  # a long way to go: growing pays
    assert _decide(Policy(cfg), [_trial(50.0, group="")]) == {"t": 4}  # a job of no stream: as before


def test_grow_repays_and_most_repaid():
    assert grow_repays(100.0, 10.0, 20.0, 1.0)  # 10 s -> 5 s + 1 s
    assert not grow_repays(100.0, 10.0, 20.0, 5.0)  # 10 s -> 5 s + 5 s: no sooner
    assert not grow_repays(100.0, 10.0, 10.0, 0.0)  # no faster
    assert most_repaid(300.0, 1, 4, LINEAR, 10.0) == 4  # 30 s at 1 node; 7.5 s + 10 s at 4
    assert most_repaid(300.0, 1, 3, LINEAR, 10.0) == 3  # no more than its max in this decision
    assert most_repaid(120.0, 1, 4, LINEAR, 10.0) == 1  # 12 s at 1 node; 3 s + 10 s at 4: never sooner
    assert most_repaid(120.0, 2, 4, {1: 10.0, 2: 20.0}, 1.0) == 2  # no faster past its last point
    assert most_repaid(120.0, 3, 2, LINEAR, 1.0) == 2  # a max below its count: the max


def test_stream_bound_and_order():
    assert stream_bound(0.5, 10) == 5 and stream_bound(0.01, 10) == 1
    assert stream_bound(0.0, 10) == 0 and stream_bound(0.5, 0) == 0
    group = {"a": "g", "b": "g", "c": "g", "x": ""}
    assert stream_order(["a", "b", "c", "x"], group, {}, 2) == ["a", "b", "x", "c"]
    assert stream_order(["a", "b", "c", "x"], group, {"g": 2}, 2) == ["x", "a", "b", "c"]
    assert stream_order(["a", "b", "c", "x"], group, {}, 0) == ["a", "b", "c", "x"]


def test_the_hpo_stream_says_which_search_each_trial_is_of(summit_scaling):
    from simulator.jobs import load_scaling
    from simulator.streams import HPO_SEARCH_TRIALS, make_stream

    hpo = make_stream("hpo", load_scaling(summit_scaling), 0)
    jobs = [hpo.draw() for _ in range(HPO_SEARCH_TRIALS + 1)]
    assert [j.group for j in jobs if j is not None] == ["hpo-search-0"] * HPO_SEARCH_TRIALS + ["hpo-search-1"]
    nas = make_stream("nas", load_scaling(summit_scaling), 0)
    assert all(j is not None and j.group == "" for j in (nas.draw() for _ in range(5)))
