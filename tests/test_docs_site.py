"""The documentation site builds without a warning (``mkdocs build --strict``), every page in its nav."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (pip install -e '.[docs]'; CI installs it with [all])")
def test_docs_site_builds_strict(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()


def test_every_docs_page_is_in_the_nav() -> None:
    """mkdocs only reports a page left out of the nav; here it is an error, like a broken link. The reports
    ``malletrain evaluate`` writes under docs/evaluation/ are output, linked from the evaluation page, not in the nav."""
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = [p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")
             if not p.relative_to(REPO / "docs").as_posix().startswith("evaluation/")]
    assert pages and [p for p in pages if f": {p}\n" not in nav] == []
    assert "evaluation/" not in nav.split("\nnav:", 1)[1]  # no generated report in the navigation
