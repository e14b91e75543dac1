"""The example trainer's ``--device``: the model trains where it is told, and a GPU that is not
there is named as the reason (``benchmarks/bench_cuda_resume.py`` runs it on a GPU through the daemon)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from malletrain.worker.examples.train import parse_args, pick_device


def test_device_defaults_to_cpu_and_auto_takes_a_gpu_only_when_torch_sees_one() -> None:
    assert parse_args([]).device == "cpu"
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_names_the_cause() -> None:
    with pytest.raises(SystemExit, match=r"--device cuda: torch sees no GPU here"):
        pick_device("cuda")


def test_traced_steps_say_where_they_trained() -> None:
    out = subprocess.run([sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--batch", "4",
                          "--samples", "8", "--trace", "--device", "auto"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    steps = [json.loads(line) for line in out.splitlines() if '"ev": "step"' in line]
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert [s["step"] for s in steps] == [1, 2] and {s["device"] for s in steps} == {expected}


def test_the_cuda_resume_check_fails_a_restart_from_zero_a_lost_commit_or_another_device() -> None:
    """``benchmarks/bench_cuda_resume.py``'s verdict can fail: each way a resume goes wrong is a FAIL."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        verdict = importlib.import_module("bench_cuda_resume").resumed_from_checkpoint
    finally:
        sys.path.pop(0)
    assert verdict(12, 11, 11, ["cuda:0"], "cuda")  # the run on the H200
    assert not verdict(1, 11, 11, ["cuda:0"], "cuda")  # started again from step 0
    assert not verdict(9, 8, 11, ["cuda:0"], "cuda")  # the checkpoint lost committed steps
    assert not verdict(12, 11, 11, ["cuda:0", "cpu"], "cuda")  # some steps ran on the CPU
    assert not verdict(12, 11, 11, [], "cuda")  # nothing was seen
