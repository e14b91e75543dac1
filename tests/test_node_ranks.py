"""K ranks per node with real worker processes (the torch runtime, the example trainer, gloo on CPU).

The daemon's member list names one worker per node; each node runs K processes of it (local
ranks). Checked here: ranks are numbered node by node and every process is a distinct rank; a
recall of one node removes its K ranks in ONE generation (never one rank at a time); after every
switch every rank holds the same parameters.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.clusters.localjob import LocalJob, example_command

pytestmark = pytest.mark.slow

K = 2


def _steps_by_gen(job: LocalJob) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = defaultdict(list)
    for w in job.workers.values():
        for s in w.steps():
            out[s["gen"]].append(s)
    return out


def _in_sync(steps: list[dict]) -> bool:
    """Every rank that traced a step of this generation had the same parameters after it."""
    by_step: dict[int, set[str]] = defaultdict(set)
    for s in steps:
        by_step[s["step"]].add(s["hash"])
    return bool(by_step) and all(len(h) == 1 for h in by_step.values())


def test_a_node_recall_drops_its_k_ranks_in_one_generation_and_ranks_stay_in_sync() -> None:
    cmd = example_command("--model", "mlp", "--width", "32", "--samples", str(10**9), "--trace",
                          "--step-sleep", "0.02")
    with LocalJob("nodes", cmd, collective_timeout_s=10.0) as job:
        nodes = ["w0", "w1", "w2"]
        for node in nodes:
            for lr in range(K):
                job.spawn(node, node, local=(lr, K))
        g1, _ = job.set_members(nodes)
        for wid in job.workers:
            job.wait_steps(wid, g1, 3, timeout_s=240)
        first = [s for s in _steps_by_gen(job)[g1]]
        assert sorted({(s["rank"], s["worker"]) for s in first}) == sorted(
            (i * K + lr, f"{n}") for i, n in enumerate(nodes) for lr in range(K))
        assert {s["world"] for s in first} == {len(nodes) * K}

        # the main scheduler takes node w1 back: both its processes die, the daemon publishes the rest
        for lr in range(K):
            job.kill(f"w1/{lr}")
        g2, _ = job.set_members(["w0", "w2"])
        for wid in ("w0/0", "w0/1", "w2/0", "w2/1"):
            job.wait_steps(wid, g2, 3, timeout_s=240)
        after = _steps_by_gen(job)[g2]
        assert {s["world"] for s in after} == {2 * K} and sorted({s["rank"] for s in after}) == list(range(2 * K))
        # one generation for the recall: each survivor went from the full world straight to the smaller one
        for wid in ("w0/0", "w0/1", "w2/0", "w2/1"):
            moves = [(e["world_before"], e["world_after"], e["to"]) for e in job.workers[wid].rescales()
                     if e["kind"] != "join"]
            assert moves and {(b, a) for b, a, _ in moves} == {(3 * K, 2 * K)} and {t for *_, t in moves} == {g2}, \
                (wid, moves)

        # the node comes back (a fresh worker of K processes)
        for lr in range(K):
            job.spawn("w3", "w3", local=(lr, K))
        g3, _ = job.set_members(["w0", "w2", "w3"])
        for wid in ("w0/0", "w3/0", "w3/1"):
            job.wait_steps(wid, g3, 3, timeout_s=240)
        gens = _steps_by_gen(job)
        assert {s["world"] for s in gens[g3]} == {3 * K}
        assert {s["world"] for steps in gens.values() for s in steps} == {3 * K, 2 * K}  # never 5 ranks
        for g in (g1, g2, g3):
            assert _in_sync(gens[g]), f"ranks disagree on the parameters in generation {g}"
        job.set_members([])
        for wid in [w for w in job.workers if not w.startswith("w1/")]:
            assert job.wait_exit(wid, timeout_s=120) == 0


ENV_SCRIPT = """
import json, os, sys, time
import torch
from malletrain.worker.elastic import State, run

def train(state):
    net = state.ddp()
    opt = state.optimizer
    while True:
        opt.zero_grad()
        net(torch.ones(1, 4)).sum().backward()
        opt.step()
        state.step += 1
        print(json.dumps({"ev": "step", "gen": state.generation, "rank": state.rank, "world": state.world_size,
                          "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                   "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                                                   "GROUP_WORLD_SIZE", "MASTER_ADDR")}}),
              flush=True)
        time.sleep(0.02)
        state.commit()

torch.set_num_threads(1)
model = torch.nn.Linear(4, 1)
run(train, State(model, torch.optim.SGD(model.parameters(), lr=0.01)))
"""


def test_every_world_s_torchrun_variables_are_in_each_rank_s_environment(tmp_path: Path) -> None:
    script = tmp_path / "env_train.py"
    script.write_text(ENV_SCRIPT)
    with LocalJob("envs", [sys.executable, str(script)], collective_timeout_s=10.0) as job:
        for node in ("a", "b"):
            for lr in range(K):
                job.spawn(node, node, local=(lr, K))
        g1, _ = job.set_members(["a", "b"])
        for wid in job.workers:
            job.wait_steps(wid, g1, 2, timeout_s=240)
        g2, _ = job.set_members(["b"])  # node a leaves: b's ranks become 0 and 1 of 2
        for wid in ("b/0", "b/1"):
            job.wait_steps(wid, g2, 2, timeout_s=240)
        for g, world in ((g1, 2 * K), (g2, K)):
            seen = [s for w in job.workers.values() for s in w.steps(g)]
            assert seen and {s["world"] for s in seen} == {world}
            for s in seen:
                env = s["env"]
                assert (env["RANK"], env["WORLD_SIZE"]) == (str(s["rank"]), str(world)), s
                assert env["LOCAL_RANK"] == str(s["rank"] % K) and env["LOCAL_WORLD_SIZE"] == str(K)
                assert env["GROUP_WORLD_SIZE"] == str(world // K) and env["MASTER_ADDR"]
        job.set_members([])
