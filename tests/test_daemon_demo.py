"""`malletrain demo` end to end (toy runtime: no torch), bounded, leaves no process behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_writes_report_and_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = subprocess.run(
        [sys.executable, "-m", "malletrain", "demo", "--duration", "12", "--out", str(out), "--runtime", "toy"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "0 processes left behind" in res.stdout and "JOBID" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["leftover_processes"] == 0
    assert {j["name"] for j in report["jobs"]} == {"cnn", "mlp", "linear"}
    assert sum(j["samples"] for j in report["jobs"]) > 0
    assert report["nodes"] and max(p["held"] for p in report["nodes"]) > 0
    cnn = next(j for j in report["jobs"] if j["name"] == "cnn")
    assert "profiling" in [s["state"] for s in cnn["states"]]
    assert (out / "nodes.png").stat().st_size > 1000
    assert "| job | name |" in (out / "report.md").read_text()


def test_the_demo_runs_the_default_policy_or_the_papers(tmp_path: Path) -> None:
    from malletrain.cli.demo import demo_config

    default = demo_config(tmp_path, 6, "toy").policy
    jpa = demo_config(tmp_path, 6, "toy", "jpa").policy
    assert default.profiling.value == "gated" and default.admission.value == "adaptive"
    assert jpa.profiling.value == "always" and jpa.admission.value == "fixed"
    assert default.tfwd_s == jpa.tfwd_s == 60.0 and jpa.profile_time_cap_s == 15.0  # the demo's time scale
    with pytest.raises(ValueError, match="freetrain"):
        demo_config(tmp_path, 6, "toy", "freetrain")
    res = subprocess.run([sys.executable, "-m", "malletrain", "demo", "--policy", "nope"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--policy" in res.stderr


@pytest.mark.slow
def test_horovod_demo_trains_and_leaves_nothing(tmp_path: Path) -> None:
    pytest.importorskip("horovod.torch")
    out = tmp_path / "demo"
    res = subprocess.run(
        [sys.executable, "-m", "malletrain", "demo", "--duration", "45", "--out", str(out), "--runtime", "horovod",
         "--quiet"],
        capture_output=True, text=True, timeout=240,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "0 processes left behind" in res.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["runtime"] == "horovod" and report["leftover_processes"] == 0
    assert {j["name"] for j in report["jobs"]} == {"hvd-prof", "hvd-guess", "hvd-given"}
    assert sum(j["samples"] for j in report["jobs"]) > 0  # Horovod workers reported to the daemon's monitor
