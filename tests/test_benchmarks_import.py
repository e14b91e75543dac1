"""Every script under benchmarks/ imports: a sibling script's helper renamed or removed is found here,
not by the next person who runs the benchmark (calibrate.py once imported a helper bench_slurm.py no
longer had). Importing runs no benchmark: each script's work is behind ``if __name__ == "__main__"``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
# the benchmarks, the attack suite (benchmarks/attacks/) and the one-off measurements (benchmarks/oneoff/)
FOLDERS = (BENCH, BENCH / "attacks", BENCH / "oneoff")
SCRIPTS = sorted(p.relative_to(BENCH).with_suffix("").as_posix() for folder in FOLDERS for p in folder.glob("*.py"))


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for folder in FOLDERS:  # as `python benchmarks/attacks/bench_faults.py` has its own folder on sys.path
        monkeypatch.syspath_prepend(str(folder))


def test_every_folder_of_scripts_is_imported() -> None:
    assert {"harness", "attacks/bench_faults", "attacks/faults_common", "oneoff/bench_workloads"} <= set(SCRIPTS)
    assert {p.parent for p in BENCH.rglob("*.py")} <= {*FOLDERS, BENCH / "scale"}  # scale/: run as processes


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_imports(script: str) -> None:
    name = script.split("/")[-1]
    if name.startswith("bench_horovod"):
        pytest.importorskip("horovod")
    module = importlib.import_module(name)
    assert module.__file__ is not None and Path(module.__file__) == BENCH / f"{script}.py"
    sys.modules.pop(name, None)


def test_the_sweep_baseline_retries_stale_trials_with_optunas_current_callback(tmp_path: Path) -> None:
    """bench_sweep's baseline (Optuna's heartbeat and retry) is built with no deprecated Optuna call (it
    passed ``failed_trial_callback``, which Optuna 4.9 deprecates and 6 removes), and retries without bound."""
    pytest.importorskip("optuna")
    import warnings

    bench_sweep = importlib.import_module("bench_sweep")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # Optuna's deprecations
            warnings.simplefilter("error", DeprecationWarning)
            storage = bench_sweep.retry_storage(f"sqlite:///{tmp_path / 'study.db'}")
        assert storage.heartbeat_interval == 1 and storage.grace_period == 3
        retry = storage.heartbeat_stale_trial_callback if hasattr(storage, "heartbeat_stale_trial_callback") \
            else storage.failed_trial_callback
        assert retry is not None and retry._max_retry is None
    finally:
        sys.modules.pop("bench_sweep", None)
