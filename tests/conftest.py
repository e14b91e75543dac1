"""Shared fixtures: where the real data lives (../shared/data beside the checkout)."""

from __future__ import annotations

import ctypes
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


PR_GET_CHILD_SUBREAPER = 37


def _is_subreaper() -> bool:
    flag = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return flag.value != 0


@pytest.fixture(autouse=True)
def _the_test_process_stays_no_subreaper():
    """A test that makes this process a subreaper (an agent's ``containment.choose`` run in it) makes it
    the parent of every daemon a later test starts (PBS forks into the background): they end as zombies
    no one reaps, and the next cluster refuses to start beside them. Such a test fails here, by name."""
    before = _is_subreaper()
    yield
    if not before and _is_subreaper():
        pytest.fail("this test made the test process a subreaper: run what calls containment.choose() "
                    "or jobproc.become_subreaper() in a process of its own")
