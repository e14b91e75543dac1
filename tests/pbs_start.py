"""Start the one-machine OpenPBS cluster for a test module, or skip (fail under MALLETRAIN_REQUIRE_PBS=1)."""

from __future__ import annotations

import os

import pytest

from tests.clusters.pbs_cluster import ClusterUnavailable, PbsCluster, PreemptOrder


def start_or_skip(vnodes: int, order: PreemptOrder = PreemptOrder.REQUEUE) -> PbsCluster:
    try:
        return PbsCluster(vnodes, preempt_order=order).start()
    except ClusterUnavailable as exc:
        if os.environ.get("MALLETRAIN_REQUIRE_PBS") == "1":
            pytest.fail(f"MALLETRAIN_REQUIRE_PBS=1 but no PBS cluster: {exc}")
        pytest.skip(f"no PBS cluster on this machine: {exc}")
