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


USER_SCRIPT = """\
# A user's own trial, written for torchrun and nothing else: it knows no malletrain.
import argparse, json, os, time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--width", type=int, required=True)
p.add_argument("--ckpt", type=Path, required=True)
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.linspace(-1, 1, 8).unsqueeze(1)
net = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Tanh(), torch.nn.Linear(args.width, 1))
model = DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
ckpt, step = args.ckpt / "ckpt.pt", 0
if ckpt.exists():
    state = torch.load(ckpt, weights_only=True)
    net.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); step = int(state["step"])
trained = args.ckpt / "trained"
if rank == 0:
    args.ckpt.mkdir(parents=True, exist_ok=True)
    before = int(trained.read_text()) if trained.exists() else 0
    with open(args.ckpt / "starts.log", "a") as fh:
        fh.write(f"start {step} world {world} trained {before}\\n")
while step < args.steps:
    i = (step * 16 * world + rank * 16) % 256
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x[i:i + 16]), y[i:i + 16]).backward()
    opt.step()
    step += 1
    time.sleep(0.15)
    if rank == 0:
        (args.ckpt / "trained.tmp").write_text(str(step))  # atomic: a recall may stop the rank mid-write
        os.replace(args.ckpt / "trained.tmp", trained)
        if step % 3 == 0:
            tmp = args.ckpt / "ckpt.tmp"
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, ckpt)
if rank == 0:
    with torch.no_grad():
        value = float(torch.nn.functional.mse_loss(net(x), y))
    out = Path(os.environ["MALLETRAIN_TRIAL_RESULT"])
    out.with_suffix(".tmp").write_text(json.dumps({"value": value}))
    os.replace(out.with_suffix(".tmp"), out)
dist.barrier()
dist.destroy_process_group()
"""


class Churn:
    """Nodes that come and go: every ``every`` s a node of a job that has run ``min_age`` s and that
    ``eligible`` takes (a trial that checkpointed, an element mid-work) is recalled, and each recalled
    node comes back ``back_after`` s later (at each step of the test's loop). A job that has just
    started (its workers import torch for seconds under load) is not recalled the instant it runs."""

    def __init__(self, d, eligible, every: float = 8.0, back_after: float = 5.0,  # type: ignore[no-untyped-def]
                 min_age: float = 1.0) -> None:
        import time

        self.d, self.eligible, self.every, self.back_after = d, eligible, every, back_after
        self.min_age = min_age
        self.clock = time.monotonic
        self.next_at = self.clock() + every
        self.away: dict[str, float] = {}
        self.running_since: dict[str, float] = {}
        self.recalls = 0

    def __call__(self) -> None:
        now = self.clock()
        for node, at in list(self.away.items()):
            if now >= at:
                self.d.backend.make_idle(node)
                del self.away[node]
        for run in self.d.runs.values():
            if run.members and not run.state.terminal:
                self.running_since.setdefault(run.id, now)
            else:
                self.running_since.pop(run.id, None)
        if now < self.next_at:
            return
        for run in self.d.runs.values():
            if now - self.running_since.get(run.id, now) < self.min_age:
                continue
            if self.eligible(run):
                node = sorted(run.members)[0]
                self.d.backend.recall(node)
                self.away[node] = now + self.back_after
                self.recalls += 1
                self.next_at = now + self.every
                return

    def give_back(self) -> None:
        for node in self.away:
            self.d.backend.make_idle(node)
        self.away.clear()


@pytest.mark.slow
def test_a_users_search_of_twelve_torchrun_trials_on_nodes_that_come_and_go(tmp_path: Path) -> None:
    """The search as a user writes it: their own torchrun script (it reads --lr and --width, checkpoints
    into --ckpt {trial}, writes its value to MALLETRAIN_TRIAL_RESULT), 12 trials of 1 to 2 nodes on 3
    local nodes recalled and given back all along. About 4-8 minutes on 2 loaded cores."""
    pytest.importorskip("torch")
    pytest.importorskip("optuna")
    from malletrain.daemon.sweepfile import parse_sweep, register
    from procs import procs_mentioning
    from tests.stepping import step_until

    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    state, ckpt = tmp_path / "state", tmp_path / "runs"
    cmd = (PY, str(script), "--lr", "{lr}", "--width", "{width}", "--ckpt", f"{ckpt}/{{trial}}")
    spec = JobSpec("user-search", cmd, 1, 2, env={"OMP_NUM_THREADS": "1"}, launcher=Launcher.TORCHRUN)
    sweep = parse_sweep({"trials": 12, "direction": "minimize", "seed": 3,
                         "space": {"lr": {"low": 0.01, "high": 0.3, "log": True}, "width": {"low": 4, "high": 32}}},
                        "user-search", "test")
    d = _daemon(state)
    churn = Churn(d, lambda run: run.spec.trial is not None and (ckpt / str(run.spec.trial) / "ckpt.pt").exists())
    try:
        register(d.store, spec, sweep, None, None)
        step_until(d, lambda: churn.recalls >= 6, 900, "six recalls of trials that checkpointed", check=churn)
        churn.give_back()
        step_until(d, lambda: d.sweeps.status()[0]["done"], 900, "every trial ends and is told")
        show = d.sweeps.status()[0]
    finally:
        d.close()
    trials = show["trials"]
    assert [t["number"] for t in trials] == list(range(12)) and {t["state"] for t in trials} == {"completed"}, show
    assert all(t["value"] is not None for t in trials)
    best = min(trials, key=lambda t: t["value"])
    assert show["best"]["number"] == best["number"]
    resumed = 0
    for t in range(12):
        starts = [ln for ln in (ckpt / str(t) / "starts.log").read_text().splitlines() if ln]
        lost = [ln for ln in starts[1:] if ln.startswith("start 0 ") and not ln.endswith(" trained 0")]
        assert lost == [], (t, starts)  # never from scratch again once it trained
        resumed += len(starts) > 1
    assert resumed >= 1 and churn.recalls >= 6
    assert procs_mentioning(str(state)) == []  # nothing left running


@pytest.mark.slow
def test_an_array_of_twenty_short_elements_runs_each_index_once(tmp_path: Path) -> None:
    from malletrain.daemon.arrays import submit_array
    from procs import procs_mentioning
    from tests.stepping import step_until

    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    # a plain script (launcher torchrun: run as given, ready at once) that works a moment: work/INDEX
    # while it works, then out/INDEX gets one x a run to the end
    code = ("import os, pathlib, time; i = os.environ['MALLETRAIN_ARRAY_INDEX']; "
            f"w = pathlib.Path({str(work)!r}) / i; w.touch(); time.sleep(3.0); "
            f"p = pathlib.Path({str(out)!r}) / i; p.write_text(p.read_text() + 'x' if p.exists() else 'x'); w.unlink()")
    spec = JobSpec("seeds", (PY, "-c", code, "{index}"), 1, 1, launcher=Launcher.TORCHRUN)  # a plain script
    d = _daemon(tmp_path / "state")
    # the same nodes, coming and going: recalls land while an element works (one whose ranks have all
    # exited 0 is COMPLETED before its worker exits: test_torchrun_launcher recalls one in that gap)
    churn = Churn(d, lambda run: (work / str(run.spec.array_index)).exists(), every=6.0, back_after=4.0,
                  min_age=0.5)
    try:
        _, jobs = submit_array(d.store, spec, range(20))
        done = lambda: all(d.store.require(j).state.terminal for j in jobs)  # noqa: E731
        step_until(d, lambda: churn.recalls >= 4 or done(), 600, "four recalls", check=churn)
        churn.give_back()
        step_until(d, done, 600, "every element ends")
        states = {d.store.require(j).state for j in jobs}
    finally:
        d.close()
    assert states == {JobState.COMPLETED}
    assert sorted(int(p.name) for p in out.iterdir()) == list(range(20))
    assert all(p.read_text() == "x" for p in out.iterdir())  # each index once
    assert churn.recalls >= 4
    assert procs_mentioning(str(tmp_path / "state")) == []
