"""Real Elastic Horovod under HorovodRuntime: start on 2 slots, scale to 3, then to 1.

Needs ``horovod.torch`` (``bash .ci/build-horovod.sh .venv`` builds it); skipped
without it. Runs the example malletrain/worker/examples/hvd_train.py with real
processes on this host and checks, from its progress file, that training goes
on at each size, ends cleanly and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("horovod.torch")

from malletrain.runtimes.horovod_elastic import HorovodRuntime, job_processes  # noqa: E402
from stepping import wait_until  # noqa: E402

pytestmark = pytest.mark.slow

JOB = "hvd-1"
TIMEOUT_S = 90.0


def read_progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_scale_2_to_3_to_1_keeps_training_and_cleans_up(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    stop = tmp_path / "stop"
    command = [sys.executable, "-m", "malletrain.worker.examples.hvd_train", "--steps", "100000",
               "--step-sleep", "0.05", "--progress", str(progress), "--stop-file", str(stop)]
    rt = HorovodRuntime(tmp_path / "rt")
    rt.start()
    holders: dict[str, subprocess.Popen[bytes]] = {}

    def launch(worker: str) -> None:
        spec = rt.launch_spec(JOB, command, worker, "localhost")
        holders[worker] = subprocess.Popen(list(spec.argv), env={**os.environ, **spec.env})

    def steps_at(size: int) -> int:
        return sum(1 for rec in read_progress(progress) if rec["size"] == size)

    try:
        launch("w0")
        launch("w1")
        assert rt.set_members(JOB, ["w0", "w1"]) == 1
        job_dir = rt.job_dir(JOB)
        wait_until(lambda: steps_at(2) >= 3, "3 steps at size 2", TIMEOUT_S)

        launch("w2")
        assert rt.set_members(JOB, ["w0", "w1", "w2"]) == 2
        wait_until(lambda: steps_at(3) >= 3, "3 steps at size 3", TIMEOUT_S)

        assert rt.set_members(JOB, ["w0"]) == 3
        wait_until(lambda: steps_at(1) >= 5, "5 steps at size 1", TIMEOUT_S)
        assert holders["w1"].wait(timeout=30) == 0
        assert holders["w2"].wait(timeout=30) == 0

        stop.touch()
        assert rt.wait(JOB, timeout=TIMEOUT_S) == 0
        assert holders["w0"].wait(timeout=30) == 0
        assert job_processes(job_dir) == []

        records = read_progress(progress)
        sizes = [rec["size"] for rec in records]
        # each size appears as one run, in the order 2, 3, 1
        runs = [s for i, s in enumerate(sizes) if i == 0 or sizes[i - 1] != s]
        assert runs == [2, 3, 1], runs
        steps = [rec["step"] for rec in records]
        assert all(b >= a for a, b in zip(steps, steps[1:])), "steps went back more than one commit"
        generations = [rec["generation"] for rec in records]
        assert generations[-1] == 3
        assert records[-1]["loss"] < records[0]["loss"]
    finally:
        rt.close()
        for proc in holders.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    assert not (tmp_path / "rt").joinpath(job_dir.name).exists()
