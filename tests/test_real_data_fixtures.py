"""The real data reaches a test only through conftest's fixtures, which skip on a clone without it (naming
the file and docs/data.md) and fail under MALLETRAIN_REQUIRE_DATA=1 (CI): the README's fast test command
passes on a plain clone, and CI still runs every real-data test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import traces.data
from tests import conftest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# what reads the data folder past the fixtures: conftest's own names, or a path to the default folder
DIRECT = re.compile(r"\b(SHARED_DATA|shared_file|MALLETRAIN_SHARED_DATA|missing_data)\b"
                    r"|[\"']shared[\"']\s*/\s*[\"']data[\"']|shared/data/[\w-]")
# the tests of the lookup itself, of the README sandbox and of the benchmark runs: they name the data folder, and read nothing in it
LOOKUP_TESTS = {"test_traces_real.py": "asserts where traces.data looks",
                "test_readme.py": "links ../shared into the fresh-clone sandbox, as a clone beside it has",
                "test_real_data_fixtures.py": "this file",
                "test_benchmarks_run.py": "hands the data folder to the benchmarks it runs, skipping (or failing "
                                          "under MALLETRAIN_REQUIRE_DATA=1) by conftest.missing_data, as a fixture does"}


def test_no_test_reads_the_real_data_past_the_fixtures() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "conftest.py" or path.name in LOOKUP_TESTS:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DIRECT.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert offenders == [], ("take the real data through a fixture of tests/conftest.py (summit_nodes, "
                             "summit_scaling, kth_swf, cirrus_sacct, philly_data), which skips without it:\n"
                             + "\n".join(offenders))


def test_a_test_without_a_data_fixture_does_not_see_the_data() -> None:
    real = conftest.SHARED_DATA.resolve()
    assert all(d.resolve() != real for d in traces.data.data_dirs())
    found = traces.data.find_data("summit-scaling.csv")
    assert found is None or not found.resolve().is_relative_to(real)


def test_a_test_with_a_data_fixture_sees_it(summit_scaling: Path) -> None:
    found = traces.data.find_data(summit_scaling.name)
    assert found is not None and found.resolve() == summit_scaling.resolve()


def test_a_missing_file_skips_naming_it_and_where_to_get_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path)
    monkeypatch.delenv(conftest.REQUIRE_DATA, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"summit-scaling\.csv.*MALLETRAIN_DATA.*docs/data\.md"):
        conftest.shared_file("summit-scaling.csv")


def test_a_missing_file_fails_when_the_data_is_required(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path)
    monkeypatch.setenv(conftest.REQUIRE_DATA, "1")
    with pytest.raises(pytest.fail.Exception, match=r"MALLETRAIN_REQUIRE_DATA=1 but .*philly-jobs\.csv\.gz"):
        conftest.shared_file("philly-jobs.csv.gz")


def test_ci_requires_the_data() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^\s*export MALLETRAIN_REQUIRE_DATA=1\b", ci, re.MULTILINE)


def test_the_data_page_names_every_file_the_fixtures_read() -> None:
    page = (REPO / "docs" / "data.md").read_text(encoding="utf-8")
    for name in ("summit-2021-02-10_17.nodes.csv.gz", "summit-scaling.csv", "KTH-SP2-1996-2.1-cln.swf.gz",
                 "cirrus-2024Q1-sacct.csv.gz", "philly-jobs.csv.gz", "pollux/<model>/placements.csv",
                 "pollux/<model>/scalability.csv"):
        assert f"`{name}`" in page, name
    for model in conftest.POLLUX_MODELS:
        assert model in page
