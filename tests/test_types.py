"""The type checker passes: mypy with the configuration in ``pyproject.toml`` (strict on the pure core,
``curves``, ``allocator``, ``profiler``, ``policy``; every body checked in ``malletrain/daemon`` and
``scavenger``). This test is where CI runs it (once: ``.ci/run`` runs the suite) and puts it under the
README's test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_mypy_passes_on_the_configured_packages() -> None:
    pytest.importorskip("mypy", reason="mypy is in the `test` extra: pip install -e '.[test]'")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert "no issues found" in res.stdout
