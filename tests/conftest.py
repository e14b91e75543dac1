"""Shared fixtures: where the real data lives (../shared/data beside the checkout), and the one way a test
reads it (the fixtures below): on a clone without the data a test that needs it skips, naming the file and
where to get it (docs/data.md); under ``MALLETRAIN_REQUIRE_DATA=1`` (CI) a missing file fails it instead."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

import traces.data

REPO = Path(__file__).resolve().parent.parent
# the real data: $MALLETRAIN_SHARED_DATA, else $MALLETRAIN_DATA (as the product finds it), else the default
SHARED_DATA = Path(os.environ.get("MALLETRAIN_SHARED_DATA") or os.environ.get("MALLETRAIN_DATA")
                   or REPO.parent / "shared" / "data")
REQUIRE_DATA = "MALLETRAIN_REQUIRE_DATA"
"""Set to 1 (CI does), a missing real-data file fails the test that needs it rather than skipping it."""
DATA_DOC = "docs/data.md"
POLLUX_MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
DATA_FIXTURES = frozenset({"summit_nodes", "summit_scaling", "kth_swf", "cirrus_sacct", "philly_data"})
"""The fixtures that hand a test the real data: a test that takes none of them sees no data directory."""


def missing_data(names: list[str]) -> None:
    """Skip the test (fail it under ``MALLETRAIN_REQUIRE_DATA=1``) naming the files of the real data it needs."""
    why = (f"real data file {', '.join(names)} not found in {SHARED_DATA}: set MALLETRAIN_DATA to a folder "
           f"that has it, or put shared/data beside the checkout ({DATA_DOC} says where each file comes from)")
    if os.environ.get(REQUIRE_DATA) == "1":
        pytest.fail(f"{REQUIRE_DATA}=1 but {why}")
    pytest.skip(why)


def shared_file(name: str) -> Path:
    """A file of the real data (:data:`SHARED_DATA`); a missing one skips the test (fails it under
    ``MALLETRAIN_REQUIRE_DATA=1``). Tests take it through the fixtures below, never directly."""
    path = SHARED_DATA / name
    if not path.exists():
        missing_data([name])
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


@pytest.fixture
def philly_data() -> Path:
    """The data directory, holding the Philly jobs and the Pollux models' measurements (``pollux/<model>/``):
    what the philly workloads and jobs files read (:mod:`simulator.philly`)."""
    needed = ["philly-jobs.csv.gz", *(f"pollux/{m}/{f}" for m in POLLUX_MODELS
                                      for f in ("placements.csv", "scalability.csv"))]
    missing = [name for name in needed if not (SHARED_DATA / name).is_file()]
    if missing:
        missing_data(missing)
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _real_data_only_through_a_fixture(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that takes none of :data:`DATA_FIXTURES` runs as on a clone without the data: the product's
    data lookup (:func:`traces.data.data_dirs`) does not see the real data directory. A test that reads the
    data without saying so fails here, with the data as without it, rather than only on a clone without it."""
    if DATA_FIXTURES & set(request.fixturenames):
        return
    real = SHARED_DATA.resolve()
    searched = traces.data.data_dirs

    def without_the_real_data() -> list[Path]:
        return [d for d in searched() if d.resolve() != real]

    monkeypatch.setattr(traces.data, "data_dirs", without_the_real_data)


@pytest.fixture(autouse=True)
def _torchrun_variables_stay_with_their_test():
    """The elastic layer writes each world's torchrun variables into ``os.environ`` (what a worker's
    libraries read); run in this process by a test, they would reach every later test's workers and
    ``client.context()``: each test gets them back as they were."""
    from contract.workerenv import ENV_GENERATION, TORCHRUN_VARIABLES
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
