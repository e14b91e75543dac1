"""Shared fixtures: where the real data lives (../shared/data beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the real data: $MALLETRAIN_SHARED_DATA, else $MALLETRAIN_DATA (as the product finds it), else the default
SHARED_DATA = Path(os.environ.get("MALLETRAIN_SHARED_DATA") or os.environ.get("MALLETRAIN_DATA")
                   or REPO.parent / "shared" / "data")


def shared_file(name: str) -> Path:
    """A file of the real data (:data:`SHARED_DATA`); a missing one is an error (CI always has it)."""
    path = SHARED_DATA / name
    if not path.exists():
        pytest.fail(f"real data file missing: {path} (set $MALLETRAIN_DATA, or put shared/data beside the checkout)")
    return path


@pytest.fixture
def summit_nodes() -> Path:
    return shared_file("summit-2021-02-10_17.nodes.csv.gz")


@pytest.fixture
def summit_scaling() -> Path:
    return shared_file("summit-scaling.csv")


@pytest.fixture
def kth_swf() -> Path:
    return shared_file("KTH-SP2-1996-2.1-cln.swf.gz")


@pytest.fixture
def cirrus_sacct() -> Path:
    return shared_file("cirrus-2024Q1-sacct.csv.gz")


@pytest.fixture(autouse=True)
def _torchrun_variables_stay_with_their_test():
    """The elastic layer writes each world's torchrun variables into ``os.environ`` (what a worker's
    libraries read); run in this process by a test, they would reach every later test's workers and
    ``client.context()``: each test gets them back as they were."""
    from malletrain.workerenv import ENV_GENERATION, TORCHRUN_VARIABLES
    names = (*TORCHRUN_VARIABLES, ENV_GENERATION)
    saved = {name: os.environ.get(name) for name in names}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
