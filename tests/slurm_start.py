"""Start the one-machine Slurm cluster for a test module, or skip (fail under MALLETRAIN_REQUIRE_SLURM=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.clusters.slurm_cluster import ClusterUnavailable, SlurmCluster


def start_or_skip(nodes: int, root: Path | None = None) -> SlurmCluster:
    try:
        return SlurmCluster(nodes, root).start()
    except ClusterUnavailable as exc:
        if os.environ.get("MALLETRAIN_REQUIRE_SLURM") == "1":
            pytest.fail(f"MALLETRAIN_REQUIRE_SLURM=1 but no Slurm cluster: {exc}")
        pytest.skip(f"no Slurm cluster on this machine: {exc}")
