"""Sweeps and arrays for real (slow): the local backend's 3 nodes, real processes.

A search of torchrun trials (``malletrain.worker.examples.sweep_train``, gloo on CPU) whose nodes are
recalled and come back: every trial ends COMPLETED with a value, none starts from scratch twice,
the best is named, nothing is left running. A job array of short elements: each index runs once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from malletrain.daemon.jobspec import JobSpec, JobState, Launcher

PY = sys.executable


def _daemon(state: Path):  # type: ignore[no-untyped-def]
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon

    cfg = DaemonConfig(state_dir=str(state), runtime="toy", local=LocalConfig(nodes=3, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    return Daemon(cfg)


@pytest.mark.slow
def test_a_search_of_torchrun_trials_survives_recalls_and_names_the_best(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("optuna")
    from malletrain.daemon.sweepfile import parse_sweep, register
    from procs import procs_mentioning
    from tests.stepping import step_until

    state = tmp_path / "state"
    ckpt = tmp_path / "ckpt"
    cmd = (PY, "-m", "malletrain.worker.examples.sweep_train", "--lr", "{lr}", "--width", "{width}",
           "--ckpt", f"{ckpt}/{{trial}}", "--steps", "40", "--step-sleep", "0.1")
    spec = JobSpec("search", cmd, 1, 2, env={"OMP_NUM_THREADS": "1"}, launcher=Launcher.TORCHRUN, worker_batch=8)
    sweep = parse_sweep({"trials": 3, "direction": "minimize", "seed": 1,
                         "space": {"lr": {"low": 0.01, "high": 0.2, "log": True}, "width": {"low": 4, "high": 16}}},
                        "search", "test")
    d = _daemon(state)
    try:
        register(d.store, spec, sweep, None, None)

        def trials() -> dict[int, str]:
            return {r.spec.trial: r.id for r in d.store.jobs() if r.spec.sweep_name == "search"}

        def started(t: int) -> bool:  # and checkpointed: a recall before its first checkpoint starts it over
            return (ckpt / str(t) / "ckpt.pt").exists()

        step_until(d, lambda: 0 in trials() and started(0) and bool(d.runs[trials()[0]].members), 240,
                   "trial 0 trains")
        victims = list(d.runs[trials()[0]].members)
        for node in victims:
            d.backend.recall(node)  # trial 0 loses every node: suspended, resumed later from its checkpoint
        step_until(d, lambda: d.store.require(trials()[0]).state is JobState.SUSPENDED
                   or d.store.require(trials()[0]).state.terminal, 120, "trial 0 is suspended")
        for node in victims:
            d.backend.make_idle(node)
        step_until(d, lambda: d.sweeps.status()[0]["done"], 600, "every trial ends and is told")
        show = d.sweeps.status()[0]
    finally:
        d.close()
    assert [(t["number"], t["state"]) for t in show["trials"]] == [(0, "completed"), (1, "completed"),
                                                                    (2, "completed")], show
    assert all(t["value"] is not None for t in show["trials"]) and show["best"] is not None
    for t in range(3):
        starts = (ckpt / str(t) / "starts.log").read_text().split("\n")
        lost = [ln for ln in starts[1:] if ln.startswith("start 0 ") and " trained 0 " not in ln]
        assert lost == [], (t, starts)  # never from scratch again once it trained
    assert len([ln for ln in (ckpt / "0" / "starts.log").read_text().splitlines() if ln]) >= 2  # it resumed
    assert procs_mentioning(str(state)) == []


@pytest.mark.slow
def test_an_array_of_twenty_short_elements_runs_each_index_once(tmp_path: Path) -> None:
    from malletrain.daemon.arrays import submit_array
    from procs import procs_mentioning
    from tests.stepping import step_until

    out = tmp_path / "out"
    out.mkdir()
    # a plain script (launcher torchrun: run as given, ready at once) that works a moment
    code = ("import os, pathlib, time; time.sleep(1.5); i = os.environ['MALLETRAIN_ARRAY_INDEX']; "
            f"p = pathlib.Path({str(out)!r}) / i; p.write_text(p.read_text() + 'x' if p.exists() else 'x')")
    spec = JobSpec("seeds", (PY, "-c", code, "{index}"), 1, 1, launcher=Launcher.TORCHRUN)  # a plain script
    d = _daemon(tmp_path / "state")
    try:
        _, jobs = submit_array(d.store, spec, range(20))
        step_until(d, lambda: all(d.store.require(j).state.terminal for j in jobs), 300, "every element ends")
        states = {d.store.require(j).state for j in jobs}
    finally:
        d.close()
    assert states == {JobState.COMPLETED}
    assert sorted(int(p.name) for p in out.iterdir()) == list(range(20))
    assert all(p.read_text() == "x" for p in out.iterdir())  # each index once
    assert procs_mentioning(str(tmp_path / "state")) == []
