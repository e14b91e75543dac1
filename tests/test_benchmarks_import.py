"""Every script under benchmarks/ imports: a sibling script's helper renamed or removed is found here,
not by the next person who runs the benchmark (calibrate.py once imported a helper bench_slurm.py no
longer had). Importing runs no benchmark: each script's work is behind ``if __name__ == "__main__"``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


@pytest.fixture(autouse=True)
def _bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports(name: str) -> None:
    if name.startswith("bench_horovod"):
        pytest.importorskip("horovod")
    module = importlib.import_module(name)
    assert module.__file__ is not None and Path(module.__file__).parent == BENCH
    sys.modules.pop(name, None)
