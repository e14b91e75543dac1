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


def handwritten_pages() -> list[Path]:
    """The pages people write (``malletrain evaluate``'s reports under docs/evaluation/ are output)."""
    return [p for p in sorted((REPO / "docs").rglob("*.md"))
            if not p.relative_to(REPO / "docs").as_posix().startswith("evaluation/")]


def test_the_handwritten_pages_stay_under_40000_words() -> None:
    """One page per reader, each thing said once: the pages together stay under 40,000 words (as ``wc -w``)."""
    words = sum(len(p.read_text(encoding="utf-8").split()) for p in handwritten_pages())
    assert 0 < words < 40_000, f"{words} words in docs/ (figures belong on docs/figures.md, history in CHANGELOG.md)"


def test_the_readmes_figures_table_is_short() -> None:
    """The README's figures table has three columns (figure, target, link) and no cell over 150 characters;
    the commands, machines and loads are on docs/figures.md."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Figures at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]
    assert rows and rows[0].replace(" ", "") == "|figure|target|link|"
    cells = [c.strip() for row in rows for c in row.replace("\\|", "/").strip("|").split("|")]
    assert len(cells) == 3 * len(rows)
    assert [c for c in cells if len(c) > 150] == []
    assert all("docs/figures.md#" in row for row in rows[1:])
