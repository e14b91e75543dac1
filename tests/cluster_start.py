"""Start a one-machine Slurm or OpenPBS cluster for a test module, or skip (fail under
MALLETRAIN_REQUIRE_SLURM=1 or MALLETRAIN_REQUIRE_PBS=1: CI as root, where the cluster must start)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import pytest

from tests.clusters.common import ClusterUnavailable, LocalCluster
from tests.clusters.pbs_cluster import PbsCluster, PreemptOrder
from tests.clusters.slurm_cluster import SlurmCluster

C = TypeVar("C", bound=LocalCluster)


def start_or_skip(cluster: C, kind: str) -> C:
    """``cluster`` started; a test skips (or fails under ``MALLETRAIN_REQUIRE_<KIND>=1``) saying why not."""
    try:
        return cluster.start()
    except ClusterUnavailable as exc:
        require = f"MALLETRAIN_REQUIRE_{kind.upper()}"
        if os.environ.get(require) == "1":
            pytest.fail(f"{require}=1 but no {kind} cluster: {exc}")
        pytest.skip(f"no {kind} cluster on this machine: {exc}")


def slurm_or_skip(nodes: int, root: Path | None = None) -> SlurmCluster:
    return start_or_skip(SlurmCluster(nodes, root), "Slurm")


def pbs_or_skip(vnodes: int, order: PreemptOrder = PreemptOrder.REQUEUE) -> PbsCluster:
    return start_or_skip(PbsCluster(vnodes, preempt_order=order), "PBS")
