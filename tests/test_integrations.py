"""The Lightning and Hugging Face callbacks under real torchrun (2 processes, gloo, CPU), through the launcher.

Each example runs under ``torchrun`` through the launcher, as the daemon runs a ``launcher = "torchrun"``
job (``python -m malletrain.worker.launch -m MODULE``, with ``MALLETRAIN_WORKER_BATCH`` set, which the
callback's own count must override), and reports to a real monitor; the recall test starts the ranks
itself, with torchrun's variables, as the daemon does (no torchrun agent stops a rank whose peer
exited first). Counting: the samples reported are the real batch sizes trained, a short
last batch included. Recall: SIGTERM to both ranks mid-run leaves a checkpoint; the next start goes
on at the next step, so over both starts every step is reported exactly once.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from malletrain.daemon.monitor import Monitor
from contract.workerenv import RankPlace, torchrun_environ

from launching import JOB, RUN_TIMEOUT_S, mon, torchrun_cmd, wait_received, worker_env

__all__ = ["mon"]  # the fixture, used by name

pytestmark = pytest.mark.slow
WORLD = 2
BATCH = 8
HOOK_BATCH = 1000  # MALLETRAIN_WORKER_BATCH: were the launcher's hook counting, the totals would show it


def lightning_step(ckpt_dir: Path) -> int:
    return int(torch.load(ckpt_dir / "recall.ckpt", map_location="cpu", weights_only=False)["global_step"])


def hf_step(ckpt_dir: Path) -> int:
    from malletrain.worker.integrations.huggingface import last_checkpoint

    found = last_checkpoint(ckpt_dir)
    assert found is not None, f"no checkpoint in {ckpt_dir}"
    return int(json.loads((Path(found) / "trainer_state.json").read_text())["global_step"])


@dataclass(frozen=True)
class Example:
    module: str
    dir_flag: str
    saved_step: Callable[[Path], int]
    epoch_samples: int  # samples trained in one epoch of 28 samples, batch 8 per rank, 2 ranks
    epoch_steps: int


# Lightning: a DistributedSampler gives each rank 14 samples: batches 8 and 6 -> steps of 16 and 12.
# HF (accelerate): batches of 8 from the whole set (8, 8, 8, 4) dealt to the ranks in turn, and the short
# last one completed from the start of the set (accelerate's even_batches): the model trains 16 and 16.
EXAMPLES = {
    "lightning": Example("malletrain.worker.examples.lightning_train", "--ckpt-dir", lightning_step, 28, 2),
    "hf": Example("malletrain.worker.examples.hf_train", "--output-dir", hf_step, 32, 2),
}


def needs(name: str) -> None:
    pytest.importorskip("lightning" if name == "lightning" else "transformers")


def run_example(ex: Example, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun_cmd(WORLD, ["-m", ex.module, *args]), env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_callback_counts_the_real_batches(name: str, tmp_path: Path, mon: tuple[Monitor, str]) -> None:
    needs(name)
    ex, (m, secret) = EXAMPLES[name], mon
    epochs = 2
    res = run_example(ex, ["--samples", "28", "--batch", str(BATCH), "--epochs", str(epochs),
                           ex.dir_flag, str(tmp_path / "ckpt")], worker_env(m, secret, HOOK_BATCH))
    assert res.returncode == 0, res.stderr[-4000:]
    steps = epochs * ex.epoch_steps
    assert f"done: step {steps}" in res.stdout
    wait_received(m, steps)
    assert (m.accepted, m.job(JOB).samples) == (steps, epochs * ex.epoch_samples)
    assert m.job(JOB).world_size == WORLD


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_one_process_counts_its_short_last_batch(name: str, tmp_path: Path, mon: tuple[Monitor, str]) -> None:
    """One rank (no sharding, no padding): 28 samples in batches of 8 are steps of 8, 8, 8 and 4."""
    needs(name)
    ex, (m, secret) = EXAMPLES[name], mon
    res = subprocess.run([sys.executable, "-m", "malletrain.worker.launch", "-m", ex.module, "--samples", "28",
                          "--batch", str(BATCH), "--epochs", "2", ex.dir_flag, str(tmp_path / "ckpt")],
                         env=worker_env(m, secret, HOOK_BATCH), capture_output=True, text=True,
                         timeout=RUN_TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "done: step 8" in res.stdout
    wait_received(m, 8)
    assert (m.accepted, m.job(JOB).samples, m.job(JOB).world_size) == (8, 56, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_ranks(ex: Example, args: list[str], env: dict[str, str], restart: int) -> list[subprocess.Popen[str]]:
    """Start every rank as the daemon does for ``launcher = "torchrun"``: ``python -m malletrain.worker.launch
    -m MODULE`` with torchrun's variables (one node of WORLD ranks), no torchrun agent."""
    master = ("127.0.0.1", free_port())
    procs = []
    for local in range(WORLD):
        rank_env = env | torchrun_environ(RankPlace(0, 1, local, WORLD), master, JOB, restart_count=restart)
        procs.append(subprocess.Popen([sys.executable, "-m", "malletrain.worker.launch", "-m", ex.module, *args],
                                      env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """Wait for every rank: (exit code, stdout, stderr) each."""
    outs = [p.communicate(timeout=RUN_TIMEOUT_S) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs)]


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=60)


def recall_after(n: int, procs: list[subprocess.Popen[str]], m: Monitor) -> None:
    """Wait for ``n`` reported steps, then SIGTERM every rank (as the daemon stops a job); each exits 143."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while m.received < n and all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        m.drain(timeout_ms=100)
    assert m.received >= n, finish(procs)
    for p in procs:
        p.send_signal(signal.SIGTERM)
    results = finish(procs)
    assert [code for code, _, _ in results] == [128 + signal.SIGTERM] * WORLD, [err[-3000:] for _, _, err in results]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_recall_loses_no_step(name: str, tmp_path: Path, mon: tuple[Monitor, str]) -> None:
    needs(name)
    ex, (m, secret) = EXAMPLES[name], mon
    ckpt = tmp_path / "ckpt"
    common = ["--samples", "1000000", "--batch", str(BATCH), ex.dir_flag, str(ckpt)]
    first = start_ranks(ex, [*common, "--max-steps", "100000"],
                        worker_env(m, secret, HOOK_BATCH, worker=f"{JOB}.n0.0"), restart=0)
    try:
        recall_after(3, first, m)
    finally:
        stop(first)
    saved = ex.saved_step(ckpt)
    wait_received(m, saved)  # every step up to the saved one reported once: the stopped step too
    assert m.job(JOB).samples == saved * BATCH * WORLD
    more = 3
    second = start_ranks(ex, [*common, "--max-steps", str(saved + more)],
                         worker_env(m, secret, HOOK_BATCH, worker=f"{JOB}.n0.1"), restart=1)
    try:
        results = finish(second)
    finally:
        stop(second)
    assert [code for code, _, _ in results] == [0] * WORLD, [err[-3000:] for _, _, err in results]
    assert f"done: step {saved + more}" in results[0][1]
    wait_received(m, saved + more)  # the second start reported exactly steps saved+1 .. saved+3
    assert m.job(JOB).samples == (saved + more) * BATCH * WORLD
