"""Where the real data lives: ``$MALLETRAIN_DATA``, else the default: a ``shared/data`` folder beside the checkout."""

from __future__ import annotations

import os
from pathlib import Path

import traces


def data_dirs() -> list[Path]:
    """Candidate directories, in the order they are searched."""
    dirs: list[Path] = []
    env = os.environ.get("MALLETRAIN_DATA")
    if env:
        dirs.append(Path(env))
    dirs.append(Path(traces.__file__).resolve().parents[2] / "shared" / "data")
    dirs.append(Path.cwd() / ".." / "shared" / "data")
    return dirs


def find_data(name: str) -> Path | None:
    """The path of data file ``name`` in the first directory that has it; None if none does."""
    for d in data_dirs():
        path = d / name
        if path.is_file():
            return path
    return None


def without_data_dir(text: str) -> str:
    """``text`` with every path into a data directory written as ``$MALLETRAIN_DATA/...``: a report
    written on one machine names no folder of that machine (and none outside the repository)."""
    for d in [*data_dirs(), Path("..") / "shared" / "data"]:
        for form in {str(d), str(d.resolve())}:
            if form not in ("", ".", "/"):
                text = text.replace(form.rstrip("/") + "/", "$MALLETRAIN_DATA/")
    return text
