"""Budgets and deadlines (issue H, part 4): job files take ``budget_node_hours`` and ``deadline``;
the daemon counts each job's node-seconds, shows them to the policy and stops a job the policy
finds over its budget (CANCELLED, "over budget: used X of Y node-hours"); ``status`` shows both."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from procs import procs_mentioning
from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import NODE_SECONDS_KEY, Daemon
from malletrain.daemon.jobspec import JobSpec, JobSpecError, JobState, load_spec, parse_spec
from malletrain.cli.status_view import budget_text, deadline_text, format_jobs
from tests.stepping import step_until

TOY = (sys.executable, "-m", "malletrain.worker.toy")


# ---------------------------------------------------------------- job files


def spec(**kw) -> JobSpec:
    return parse_spec({"command": ["train"], **kw})


def test_budget_and_deadline_are_optional_and_absent_from_old_stored_specs() -> None:
    plain = spec()
    assert plain.budget_node_hours is None and plain.deadline is None
    stored = json.loads(plain.to_json())
    assert "budget_node_hours" not in stored and "deadline" not in stored  # older readers see what they knew


def test_budget_is_a_positive_finite_number() -> None:
    assert spec(budget_node_hours=3).budget_node_hours == 3.0
    assert spec(budget_node_hours=0.25).budget_node_hours == 0.25
    for bad in (0, -1, float("inf"), float("nan"), True, "10", 10**400):
        with pytest.raises(JobSpecError, match="budget_node_hours"):
            spec(budget_node_hours=bad)


def test_deadline_takes_unix_seconds_or_iso_with_a_timezone() -> None:
    assert spec(deadline=1_772_366_400).deadline == 1_772_366_400.0
    assert spec(deadline="2026-03-01T12:00:00Z").deadline == 1_772_366_400.0
    assert spec(deadline="2026-03-01T14:00:00+02:00").deadline == 1_772_366_400.0
    for bad, why in (("2026-03-01T12:00:00", "no timezone"), ("tomorrow", "not an ISO 8601"),
                     (-5, "deadline"), (float("inf"), "deadline"), (True, "deadline"), ([1], "deadline")):
        with pytest.raises(JobSpecError, match=why) as err:
            spec(deadline=bad)
        assert "deadline" in str(err.value)


def test_a_toml_job_file_converts_its_deadline_at_submit(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('command = ["train"]\nbudget_node_hours = 12.5\ndeadline = 2026-03-01T12:00:00Z\n')
    got = load_spec(f)
    assert (got.budget_node_hours, got.deadline) == (12.5, 1_772_366_400.0)
    assert JobSpec.from_json(got.to_json()) == got  # stored as unix seconds, read back unchanged
    f.write_text('command = ["train"]\ndeadline = 2026-03-01T12:00:00\n')  # a local time: which zone?
    with pytest.raises(JobSpecError, match=f"{f}: deadline .* no timezone"):
        load_spec(f)


def test_status_shows_budget_use_and_deadline_only_when_some_job_has_one() -> None:
    base = {"id": "j000001", "name": "a", "state": "running", "nodes": ["n1"], "min_nodes": 1, "max_nodes": 2,
            "samples": 10, "target": None}
    assert "BUDGET" not in format_jobs([base]) and "DEADLINE" not in format_jobs([base])
    table = format_jobs([base, {**base, "id": "j000002", "budget_node_hours": 2.0, "used_node_hours": 0.5,
                                "deadline": 1_772_366_400.0}])
    assert "BUDGET-NH" in table and "DEADLINE" in table
    assert "0.5/2" in table and "2026-03-01 12:00Z" in table
    assert budget_text({"budget_node_hours": 2.0}) == "?/2"  # no daemon: the use is not known
    assert deadline_text(None) == "-"


# ---------------------------------------------------------------- the daemon acts on them


def config(tmp: Path, nodes: int) -> DaemonConfig:
    return DaemonConfig(state_dir=str(tmp / "state"), runtime="toy", local=LocalConfig(nodes=nodes, trace="none"),
                        agent_heartbeat=0.2, agent_dead_after=4.0, loop_interval=0.05)


def until(d: Daemon, pred: Callable[[], bool], timeout: float = 30.0) -> None:
    step_until(d, pred, timeout)


@pytest.fixture
def daemon(tmp_path: Path):
    made: list[Daemon] = []

    def make(nodes: int = 2) -> Daemon:
        d = Daemon(config(tmp_path, nodes))
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()
    assert procs_mentioning(str(tmp_path / "state")) == []


@pytest.mark.slow
def test_a_job_over_its_budget_is_stopped_and_one_without_is_untouched(daemon) -> None:
    d = daemon(nodes=2)
    budget = 0.0005  # 1.8 node-seconds
    capped = d.store.submit(JobSpec("capped", TOY + ("--rate", "2000"), 1, 1, False, {1: 100.0},
                                    budget_node_hours=budget, deadline=time.time() + 3600))
    free = d.store.submit(JobSpec("free", TOY + ("--rate", "2000"), 1, 1, False, {1: 100.0}))
    until(d, lambda: capped in d.runs and free in d.runs)
    view = {j.id: j for j in d.decide.view(d.clock()).jobs}
    assert view[capped].budget_node_hours == budget and view[capped].deadline is not None
    assert view[free].budget_node_hours is None and view[free].deadline is None
    until(d, lambda: d.store.require(capped).state.terminal)
    rec = d.store.require(capped)
    assert rec.state is JobState.CANCELLED
    assert rec.message.startswith("over budget: used ") and rec.message.endswith(f"of {budget:.4g} node-hours")
    used = float(rec.message.split()[3])
    assert used >= budget  # stopped once spent, not before
    assert [e["job"] for e in d.store.events("over_budget")] == [capped]
    until(d, lambda: not d.runs.get(capped))  # its workers are gone
    until(d, lambda: d.store.require(free).state is JobState.RUNNING)
    rec_free = d.store.require(free)
    assert rec_free.state is JobState.RUNNING and rec_free.nodes  # the job without a budget runs on
    assert d.accounting.used_node_hours(free) > 0  # counted, but no limit to reach
    assert d.runs[free].ending is None


@pytest.mark.slow
def test_node_seconds_survive_a_restart(daemon, tmp_path: Path) -> None:
    d = daemon(nodes=1)
    jid = d.store.submit(JobSpec("long", TOY + ("--rate", "2000"), 1, 1, False, {1: 100.0}, budget_node_hours=100.0))
    until(d, lambda: d.accounting.used_node_hours(jid) > 0 and bool(d.store.get_meta(NODE_SECONDS_KEY)))
    status = {j["id"]: j for j in d.api.status_jobs()}[jid]
    assert status["budget_node_hours"] == 100.0 and status["used_node_hours"] > 0
    d.close()
    again = daemon(nodes=1)
    assert again.accounting.used_node_hours(jid) >= d.accounting.used_node_hours(jid) > 0  # the count goes on, not from zero
