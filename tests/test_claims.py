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
