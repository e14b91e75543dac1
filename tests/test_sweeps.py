"""Sweeps: a [sweep] job file checked at submit, its trials asked of Optuna, run as jobs by the daemon
(on fakes, the test's clock), each trial's value told, recalls and restarts costing no trial."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("optuna")

from malletrain.daemon.jobspec import JobSpec, JobSpecError, JobState  # noqa: E402
from malletrain.daemon.sweepfile import (  # noqa: E402
    TRIALS_MAX, SweepError, load_sweep_file, parse_sweep, register, result_path, steps_path, trial_spec,
)
from contract.workerenv import ENV_TRIAL, ENV_TRIAL_RESULT  # noqa: E402
from policy import PolicyConfig  # noqa: E402
from policy.sweeps import SweepProgress, trials_to_open  # noqa: E402

try:
    from test_conformance import Harness
except ImportError:  # run from the repository root as a package
    from tests.test_conformance import Harness  # type: ignore[no-redef]

SPACE = {"lr": {"low": 1e-4, "high": 0.1, "log": True}, "width": {"low": 8, "high": 64},
         "act": {"choices": ["relu", "gelu"]}}


def _table(**kw: Any) -> dict[str, Any]:
    return {"trials": 4, "direction": "minimize", "seed": 7, "space": dict(SPACE)} | kw


def _spec(command: tuple[str, ...] = ("true", "--lr={lr}", "--width", "{width}", "--ckpt", "c/{trial}"),
          **kw: Any) -> JobSpec:
    return JobSpec(name="search", command=command, min_nodes=1, max_nodes=2, **kw)


# ---------------------------------------------------------------- the [sweep] table
def test_a_sweep_table_is_parsed_and_a_trial_gets_its_values_in_its_command() -> None:
    sweep = parse_sweep(_table(), "search", "job.toml")
    kinds = {p.name: p.kind for p in sweep.space}
    assert kinds == {"lr": "float", "width": "int", "act": "choice"} and sweep.sampler == "tpe"
    assert parse_sweep(sweep.to_table(), "x", "again") == sweep
    job = trial_spec(_spec(), sweep, 3, {"lr": 0.01, "width": 16, "act": "relu"})
    assert job.command == ("true", "--lr=0.01", "--width", "16", "--ckpt", "c/3")
    assert (job.sweep_name, job.trial, job.name) == ("search", 3, "search-t3")


@pytest.mark.parametrize("table, words", [
    (_table(space={"lr": {}}), ["lr", "empty"]),
    (_table(space={"lr": {"low": 1, "high": 2, "step": 1}}), ["lr", "unknown", "step"]),
    (_table(space={"lr": {"low": 0.5, "high": 0.1}}), ["lr", "low 0.5 > high 0.1"]),
    (_table(space={"lr": {"low": 0.0, "high": 0.1, "log": True}}), ["lr", "log", "low > 0"]),
    (_table(space={"lr": {"choices": []}}), ["lr", "choices"]),
    (_table(space={}), ["[sweep.space]", "empty"]),
    (_table(trials=0), ["trials", "0"]),
    (_table(trials=TRIALS_MAX + 1), ["trials", str(TRIALS_MAX + 1)]),
    (_table(direction="up"), ["direction", "'up'"]),
    (_table(sampler="cmaes"), ["sampler", "'cmaes'"]),
    (_table(pruner="hyperband"), ["pruner", "'hyperband'"]),
    (_table(sampler="grid"), ["grid", "lr", "float"]),
    (_table(sampler="grid", trials=5, space={"w": {"low": 1, "high": 2}, "a": {"choices": ["x", "y"]}}),
     ["trials 5", "grid's 4 points"]),
    (_table(colour=1), ["unknown", "colour"]),
])
def test_bad_sweep_tables_are_refused_naming_the_field(table: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(SweepError) as err:
        parse_sweep(table, "search", "job.toml")
    assert all(w in str(err.value) for w in words), str(err.value)


GRID = {"width": {"low": 8, "high": 9}, "act": {"choices": ["relu", "gelu"]}}


@pytest.mark.parametrize("sampler", ["random", "grid"])
def test_each_sampler_asks_values_in_the_space_and_a_grid_each_point_once(tmp_path: Path, sampler: str) -> None:
    """Trials asked two at a time and told as they end, as the daemon does: every value within its entry;
    the grid sampler asks each point once and its last trials are told (Optuna's grid sampler stops
    the study once every point is asked, which raises outside ``optimize``: the last tells failed)."""
    from malletrain.daemon.sweepfile import SweepStudy

    sweep = parse_sweep(_table(trials=4, sampler=sampler, space=GRID), "search", "t")
    study = SweepStudy(sweep, tmp_path / "study.journal")
    asked = [study.ask(), study.ask()]
    while asked:
        number, _ = asked.pop(0)
        study.tell_value(number, float(number))
        if study.asked() < sweep.trials:
            asked.append(study.ask())
    rows = study.rows()
    assert [(r.number, r.state, r.value) for r in rows] == [(n, "completed", float(n)) for n in range(4)]
    assert all(r.values["width"] in (8, 9) and r.values["act"] in ("relu", "gelu") for r in rows)
    if sampler == "grid":
        assert sorted((r.values["width"], r.values["act"]) for r in rows) == [
            (8, "gelu"), (8, "relu"), (9, "gelu"), (9, "relu")]


def test_a_placeholder_with_no_entry_is_refused_at_submit(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_text('name = "s"\ncommand = ["true", "--lr", "{lr}", "--depth", "{depth}"]\n'
                 '[sweep]\ntrials = 2\ndirection = "maximize"\n[sweep.space]\nlr = { low = 0.1, high = 1.0 }\n')
    with pytest.raises(SweepError, match=r"job.toml: command uses \{depth\}, which has no entry"):
        load_sweep_file(f)
    f.write_text(f.read_text().replace("{depth}", "{trial}"))
    loaded = load_sweep_file(f)
    assert loaded is not None and loaded[1].direction == "maximize"


def test_a_job_file_cannot_name_itself_a_trial_or_an_element(tmp_path: Path) -> None:
    from malletrain.daemon.jobspec import load_spec

    f = tmp_path / "job.toml"
    f.write_text('command = ["true"]\nsweep_name = "x"\ntrial = 1\n')
    with pytest.raises(JobSpecError, match="set by malletrain"):
        load_spec(f)


def test_a_new_trial_opens_only_while_none_waits_for_nodes() -> None:
    assert trials_to_open(SweepProgress(trials=12, asked=0, waiting=0)) == 1
    assert trials_to_open(SweepProgress(trials=12, asked=3, waiting=1)) == 0  # e.g. a recalled one
    assert trials_to_open(SweepProgress(trials=12, asked=12, waiting=0)) == 0


# ---------------------------------------------------------------- the daemon drives it
PCFG = PolicyConfig(profiling="never", admission="fixed")


def _harness(tmp_path: Path, **kw: Any) -> Harness:
    h = Harness(tmp_path / "d", PCFG, **kw)
    h.env: dict[str, dict[str, str]] = {}  # type: ignore[attr-defined]
    start = h.daemon.act.hub.start_worker

    def recording(node: str, worker: str, argv: Any, env: Any, *a: Any, **k: Any) -> None:
        h.env[worker] = dict(env)  # type: ignore[attr-defined]
        start(node, worker, argv, env, *a, **k)

    h.daemon.act.hub.start_worker = recording  # type: ignore[method-assign]
    return h


def _trials(h: Harness) -> dict[int, str]:
    return {r.spec.trial: r.id for r in h.daemon.store.jobs() if r.spec.sweep_name == "search"}


def _finish(h: Harness, jid: str, value: float | None) -> None:
    """The trial's command writes its value (or none) and its workers exit 0."""
    run = h.daemon.runs[jid]
    if value is not None:
        result_path(h.daemon.state_dir, "search", run.spec.trial).write_text(json.dumps({"value": value}))
    node, wid = next(iter(run.workers.items()))
    h.cluster.exit_worker(node, wid, 0)


def _show(h: Harness) -> dict[str, Any]:
    (s,) = h.daemon.api.sweep_driver.status()
    return s


def test_trials_run_as_jobs_each_told_its_value_and_the_best_is_named(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(trials=3), "search", "t"), None, None)
        h.cluster.became_idle("n01", "n02", "n03")
        h.run_until(8.0)
        running = _trials(h)
        assert len(running) >= 2, running  # as many at once as the policy gives nodes to
        first = h.daemon.runs[running[0]]
        env = h.env[next(iter(first.workers.values()))]  # type: ignore[attr-defined]
        assert env[ENV_TRIAL] == "0" and env[ENV_TRIAL_RESULT].endswith("trial-0.json")
        for value, t in zip((0.5, 0.2, 0.9), range(3)):
            h.run_until(h.now + 3.0)
            _finish(h, _trials(h)[t], value)
            h.run_until(h.now + 3.0)
        h.run_until(h.now + 5.0)
        s = _show(h)
        assert [(t["number"], t["state"], t["value"]) for t in s["trials"]] == [
            (0, "completed", 0.5), (1, "completed", 0.2), (2, "completed", 0.9)]
        assert s["best"]["number"] == 1 and s["done"]
        from malletrain.daemon.control import Caller, Status

        reply = h.daemon.api.handle(Status(), Caller(0, 0, True))  # status --json carries the same
        assert reply["sweeps"][0]["best"] == s["best"] and reply["sweeps"][0]["trials"] == s["trials"]
        assert len(_trials(h)) == 3  # no trial more than asked
    finally:
        h.close()


def test_a_grid_sweep_runs_every_point_and_ends_with_each_trial_told(tmp_path: Path) -> None:
    """The daemon drives a grid sweep of as many trials as points to its end (before, the tell of the
    grid's last trials raised and the sweep stopped, "sweep_error", with trials left untold)."""
    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(("true", "--width", "{width}", "--act", "{act}")),
                 parse_sweep(_table(trials=4, sampler="grid", space=GRID), "search", "t"), None, None)
        h.cluster.became_idle("n01", "n02", "n03")
        for _ in range(20):
            h.run_until(h.now + 3.0)
            for t, jid in _trials(h).items():
                run = h.daemon.runs.get(jid)
                if run is not None and run.members and run.workers and run.ending is None:
                    _finish(h, jid, float(t))
            if _show(h)["done"]:
                break
        s = _show(h)
        assert s["done"] and [(t["state"], t["value"]) for t in s["trials"]] == [
            ("completed", float(n)) for n in range(4)], s
        assert sorted((t["values"]["width"], t["values"]["act"]) for t in s["trials"]) == [
            (8, "gelu"), (8, "relu"), (9, "gelu"), (9, "relu")]
        assert h.events("sweep_error") == [] and s["error"] is None
    finally:
        h.close()


def test_a_trial_that_ends_without_a_value_fails_saying_so(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(trials=1), "search", "t"), None, None)
        h.cluster.became_idle("n01")
        h.run_until(5.0)
        jid = _trials(h)[0]
        _finish(h, jid, None)
        h.run_until(h.now + 3.0)
        rec = h.daemon.store.require(jid)
        assert rec.state is JobState.FAILED and "without a value" in rec.message
        (t,) = _show(h)["trials"]
        assert t["state"] == "failed" and "MALLETRAIN_TRIAL_RESULT" in t["reason"]
    finally:
        h.close()


def test_a_recall_mid_trial_suspends_and_resumes_the_same_trial(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(trials=12), "search", "t"), None, None)
        h.cluster.became_idle("n01", "n02")
        h.run_until(6.0)
        before = _trials(h)
        assert len(before) <= 3, before  # the ones with nodes, and one waiting
        jid = before[0]
        nodes = list(h.daemon.runs[jid].members)
        assert nodes and h.daemon.runs[jid].state is JobState.RUNNING
        h.cluster.recall("n01", "n02")  # every node it had: suspended, not failed, not a new trial
        h.run_until(h.now + 6.0)
        assert h.daemon.store.require(jid).state is JobState.SUSPENDED
        assert _trials(h) == before  # no trial opened in its place while it waits
        h.cluster.became_idle("n01", "n02")
        h.run_until(h.now + 5.0)
        assert h.daemon.runs[jid].state is JobState.RUNNING and h.daemon.runs[jid].members
        _finish(h, jid, 0.3)
        h.run_until(h.now + 3.0)
        t0 = _show(h)["trials"][0]
        assert (t0["number"], t0["state"], t0["value"], t0["job"]) == (0, "completed", 0.3, jid)
        assert sorted(h.daemon.store.jobs(), key=lambda r: r.id)[0].id == jid
        assert all(r.spec.trial != 0 or r.id == jid for r in h.daemon.store.jobs())  # trial 0: one job, ever
    finally:
        h.close()


def test_a_daemon_restart_keeps_every_trial_and_value(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    register(h.daemon.store, _spec(), parse_sweep(_table(trials=4), "search", "t"), None, None)
    h.cluster.became_idle("n01", "n02")
    h.run_until(6.0)
    _finish(h, _trials(h)[0], 0.25)
    h.run_until(h.now + 4.0)
    before = _show(h)
    asked = _trials(h)
    h.close()  # a clean stop: running trials are suspended ("daemon stopped")
    h2 = _harness(tmp_path, cluster=h.cluster, now=h.now + 1.0)
    try:
        after = _show(h2)
        assert after["trials"][0] == before["trials"][0] and after["trials"][0]["value"] == 0.25
        assert [t["values"] for t in after["trials"]] == [t["values"] for t in before["trials"]]
        h2.run_until(h2.now + 6.0)
        again = _trials(h2)
        assert all(again[t] == j for t, j in asked.items())  # each trial resumed as its own job
        running = [t for t, j in again.items() if j in h2.daemon.runs and h2.daemon.runs[j].members]
        assert running and set(running) <= set(again)
    finally:
        h2.close()


def test_the_median_pruner_stops_a_trial_worse_than_the_others(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(trials=4, pruner="median"), "search", "t"), None, None)
        h.cluster.became_idle("n01")
        state = h.daemon.state_dir
        for t, curve in ((0, [1.0, 0.5]), (1, [1.0, 0.4]), (2, [5.0, 4.0])):
            h.run_until(h.now + 4.0)
            jid = _trials(h)[t]
            steps_path(state, "search", t).write_text(
                "".join(json.dumps({"step": s, "value": v}) + "\n" for s, v in enumerate(curve)))
            h.run_until(h.now + 2.0)
            if t < 2:
                _finish(h, jid, curve[-1])
                h.run_until(h.now + 2.0)
        h.run_until(h.now + 3.0)
        t2 = _show(h)["trials"][2]
        assert t2["state"] == "pruned" and "pruned at step 1" in t2["reason"]
        assert h.daemon.store.require(_trials(h)[2]).state is JobState.CANCELLED
    finally:
        h.close()


def test_a_sweep_is_submitted_through_the_control_api_and_checked_there(tmp_path: Path) -> None:
    from malletrain.daemon.control import Caller, Submit

    h = _harness(tmp_path)
    try:
        me = Caller(0, 0, True)
        job = {"name": "search", "command": ["true", "--lr", "{lr}"], "max_nodes": 2}
        reply = h.daemon.api.handle(Submit(job | {"sweep": _table(space={"lr": SPACE["lr"]})}, 0, 0), me)
        assert reply == {"ok": True, "id": "search", "sweep": "search"}
        with pytest.raises(SweepError, match="exists already"):
            h.daemon.api.handle(Submit(job | {"sweep": _table(space={"lr": SPACE["lr"]})}, 0, 0), me)
        with pytest.raises(SweepError, match=r"\{lr\}, which has no entry"):
            h.daemon.api.handle(Submit(job | {"name": "other", "sweep": _table(space={"w": SPACE["width"]})}, 0, 0), me)
        with pytest.raises(JobSpecError, match="set by malletrain"):
            h.daemon.api.handle(Submit(job | {"sweep_name": "search", "trial": 0}, 0, 0), me)
    finally:
        h.close()


def test_cli_submits_a_sweep_file_and_shows_it_without_a_daemon(tmp_path: Path, capsys: Any) -> None:
    from malletrain.cli import main

    f = tmp_path / "job.toml"
    f.write_text('name = "s1"\ncommand = ["true", "--lr", "{lr}"]\n'
                 '[sweep]\ntrials = 2\ndirection = "maximize"\n[sweep.space]\nlr = { low = 0.1, high = 1.0 }\n')
    state = str(tmp_path / "state")
    assert main(["submit", "--state-dir", state, str(f)]) == 0
    assert capsys.readouterr().out.startswith("sweep s1: 2 trials (maximize")
    assert main(["sweep", "show", "s1", "--state-dir", state]) == 0
    assert "sweep s1: maximize, 0 of 2 trials ended" in capsys.readouterr().out
    assert main(["sweep", "show", "nope", "--state-dir", state]) == 2
    assert "no sweep 'nope' (sweeps: s1)" in capsys.readouterr().err
    f.write_text(f.read_text().replace("low = 0.1", "low = 2.0"))
    assert main(["submit", "--state-dir", state, str(f)]) == 2
    assert "[sweep.space] lr: low 2.0 > high 1.0" in capsys.readouterr().err


def test_a_trial_asked_but_never_submitted_is_submitted_after_a_restart(tmp_path: Path) -> None:
    """The daemon died between Optuna's ask and the trial's job: the journal has the trial, the store
    no job. The next daemon submits it with the values asked, and asks no trial in its place."""
    from malletrain.daemon.store import Store
    from malletrain.daemon.sweepfile import SweepStudy, journal_path

    state = tmp_path / "d"
    state.mkdir()
    sweep = parse_sweep(_table(trials=2), "search", "t")
    store = Store.open(state / "store.db")
    try:
        register(store, _spec(), sweep, None, None)
    finally:
        store.close()
    number, values = SweepStudy(sweep, journal_path(state, "search")).ask()
    h = _harness(tmp_path)
    try:
        h.run_until(2.0)
        (rec,) = [r for r in h.daemon.store.jobs() if r.spec.trial == number]
        assert rec.spec.command[1] == f"--lr={values['lr']!r}" and rec.spec.command[3] == str(values["width"])
        assert [t["job"] for t in _show(h)["trials"]][:1] == [rec.id]
        assert _show(h)["trials_asked"] == 1  # trial 0 waits for nodes: none asked in its place
    finally:
        h.close()


def test_a_trial_value_is_read_from_a_regular_file_only_and_never_quoted(tmp_path: Path) -> None:
    from malletrain.daemon.sweepfile import read_value

    secret = tmp_path / "secret"
    secret.write_text("root:hash:1:2")
    link = tmp_path / "trial-0.json"
    link.symlink_to(secret)
    value, why = read_value(link)
    assert value is None and "cannot be read" in why and "hash" not in why
    bad = tmp_path / "trial-1.json"
    bad.write_text("not json: token=abc")
    value, why = read_value(bad)
    assert value is None and "not JSON" in why and "abc" not in why
    good = tmp_path / "trial-2.json"
    good.write_text('{"value": 0.5}')
    assert read_value(good) == (0.5, "")
    assert read_value(tmp_path / "none.json")[0] is None


def test_without_optuna_a_sweep_stops_saying_why_and_the_daemon_goes_on(tmp_path: Path, monkeypatch: Any) -> None:
    import malletrain.daemon.sweepfile as sweeps_module

    def missing() -> Any:
        raise SweepError(f"sweeps need Optuna, which is not installed ({sweeps_module.EXTRA})")

    monkeypatch.setattr(sweeps_module, "_optuna", missing)
    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(), "search", "t"), None, None)
        plain = h.daemon.store.submit(JobSpec(name="plain", command=("true",)))
        h.cluster.became_idle("n01")
        h.run_until(4.0)
        assert h.daemon.runs[plain].members  # every other job runs
        (s,) = h.daemon.api.sweep_driver.status()
        assert "malletrain[sweep]" in s["error"] and s["trials"] == []
        assert [e["sweep"] for e in h.events("sweep_error")] == ["search"]  # said once
    finally:
        h.close()


# ---------------------------------------------------------------- cancel a whole sweep
def test_cancel_of_a_sweep_stops_its_trials_opens_no_more_and_show_says_so(tmp_path: Path) -> None:
    from malletrain.daemon.control import Caller, Cancel, authorize

    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(trials=6), "search", "t"), 1234, 1234)
        h.cluster.became_idle("n01", "n02", "n03")
        h.run_until(8.0)
        _finish(h, _trials(h)[0], 0.5)
        h.run_until(h.now + 3.0)
        before = _trials(h)
        assert 2 <= len(before) < 6, before
        req = Cancel("search")
        assert authorize(req, Caller(999, 999, False), h.daemon.api.owner_of) is not None  # not its owner
        assert authorize(req, Caller(1234, 1234, False), h.daemon.api.owner_of) is None
        reply = h.daemon.api.handle(req, Caller(1234, 1234, False))
        assert reply["ok"] and reply["sweep"] == "search" and reply["jobs"] == [before[t] for t in sorted(before)]
        h.run_until(h.now + 10.0)
        assert _trials(h) == before  # no trial opened after the cancel
        assert all(h.daemon.store.require(j).state.terminal for j in before.values())
        assert not any(r.members for r in h.daemon.runs.values() if not r.state.terminal)
        s = _show(h)
        assert s["done"] and s["cancelled"] and s["best"]["number"] == 0
        assert [t["state"] for t in s["trials"]] == ["completed"] + ["cancelled"] * (len(before) - 1)
    finally:
        h.close()


def test_cli_cancels_a_sweep_without_a_daemon_and_show_reads_it(tmp_path: Path, capsys: Any) -> None:
    from malletrain.cli import main

    f = tmp_path / "job.toml"
    f.write_text('name = "s1"\ncommand = ["true", "--lr", "{lr}"]\n'
                 '[sweep]\ntrials = 2\ndirection = "maximize"\n[sweep.space]\nlr = { low = 0.1, high = 1.0 }\n')
    state = str(tmp_path / "state")
    assert main(["submit", "--state-dir", state, str(f)]) == 0
    capsys.readouterr()
    assert main(["cancel", "s1", "--state-dir", state]) == 0
    assert "sweep s1: cancelled" in capsys.readouterr().out
    assert main(["sweep", "show", "s1", "--state-dir", state]) == 0
    assert "0 of 2 trials ended, sampler tpe, pruner none, cancelled" in capsys.readouterr().out
    assert main(["sweep", "show", "s1", "--json", "--state-dir", state]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["cancelled"] and shown["done"] and shown["trials"] == []
    assert main(["cancel", "nope", "--state-dir", state]) == 1  # neither a job nor a sweep


# ---------------------------------------------------------------- what a trial and a user see
def test_the_client_writes_the_value_and_the_steps_the_daemon_reads(tmp_path: Path, monkeypatch: Any) -> None:
    """``trial_result`` and ``trial_report`` (the one-line client calls) write what the daemon reads, on
    rank 0 alone, and nothing outside a sweep; a value that is not a finite number is refused."""
    from contract.workerenv import ENV_TRIAL_STEPS
    from malletrain.daemon.sweepfile import read_steps, read_value
    from malletrain.worker import client

    client.reset()
    for var in (ENV_TRIAL_RESULT, ENV_TRIAL_STEPS, "RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert client.trial_result(0.5) is False and client.trial_report(0, 0.5) is False  # outside a sweep
    result, steps = tmp_path / "trial-0.json", tmp_path / "trial-0.steps.jsonl"
    monkeypatch.setenv(ENV_TRIAL_RESULT, str(result))
    monkeypatch.setenv(ENV_TRIAL_STEPS, str(steps))
    monkeypatch.setenv("RANK", "1")
    assert client.trial_result(0.5) is False and client.trial_report(0, 0.5) is False
    assert not result.exists() and not steps.exists()  # another rank writes nothing
    monkeypatch.setenv("RANK", "0")
    assert client.trial_report(0, 1.0) and client.trial_report(1, 0.7) and client.trial_result(0.25)
    assert read_value(result) == (0.25, "") and read_steps(steps, -1) == [(0, 1.0), (1, 0.7)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trial-0.json", "trial-0.steps.jsonl"]  # no temp left
    with pytest.raises(ValueError, match="finite"):
        client.trial_result(float("nan"))
    with pytest.raises(ValueError, match="step"):
        client.trial_report(-1, 0.1)


def test_sweep_show_names_the_best_and_status_json_carries_sweeps_and_arrays(tmp_path: Path, capsys: Any) -> None:
    """After a daemon ran a sweep and an array: ``sweep show`` prints each trial and the best one, and
    ``status --json`` carries the sweep (its trials and best) and the array (one summary), read
    without a daemon."""
    from malletrain.cli import main
    from malletrain.daemon.arrays import submit_array

    h = _harness(tmp_path)
    try:
        register(h.daemon.store, _spec(), parse_sweep(_table(trials=2), "search", "t"), None, None)
        submit_array(h.daemon.store, JobSpec(name="seeds", command=("true", "{index}")), (0, 1))
        h.cluster.became_idle("n01", "n02", "n03")
        for t, value in ((0, 0.5), (1, 0.2)):
            h.run_until(h.now + 4.0)
            _finish(h, _trials(h)[t], value)
        h.run_until(h.now + 4.0)
    finally:
        h.close()
    state = str(tmp_path / "d")
    assert main(["sweep", "show", "search", "--state-dir", state]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("sweep search: minimize, 2 of 2 trials ended")
    assert out[-1].startswith("best: trial 1, value 0.2, ") and "width=" in out[-1]
    assert sum(" completed " in ln for ln in out) == 2
    assert main(["status", "--state-dir", state, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (s,) = data["sweeps"]
    assert s["best"]["number"] == 1 and [t["value"] for t in s["trials"]] == [0.5, 0.2]
    (a,) = data["arrays"]
    assert (a["array"], a["elements"], a["indices"]) == ("a000001", 2, [0, 1])


def test_a_sweeps_trials_and_an_arrays_elements_run_with_their_submitters_umask(tmp_path: Path) -> None:
    """Every job a submit makes carries the umask the submitter had (a plain job's: tests/test_claims.py).
    It had been lost between two branches once: trials and elements ran with the daemon's."""
    from malletrain.daemon.control import Caller, Submit

    h = _harness(tmp_path)
    try:
        me = Caller(0, 0, True)
        job = {"name": "search", "command": ["true", "--lr", "{lr}"], "max_nodes": 1}
        h.daemon.api.handle(Submit(job | {"sweep": _table(trials=2, space={"lr": SPACE["lr"]})}, 0, 0, 0o077), me)
        reply = h.daemon.api.handle(Submit({"name": "arr", "command": ["true"], "array": "0-2"}, 0, 0, 0o027), me)
        h.run_until(2.0)
        trials = [r for r in h.daemon.store.jobs() if r.spec.sweep_name == "search"]
        assert trials and all(r.owner_umask == 0o077 for r in trials)
        elements = [h.daemon.store.get(j) for j in reply["jobs"]]
        assert len(elements) == 3 and all(r is not None and r.owner_umask == 0o027 for r in elements)
    finally:
        h.close()
