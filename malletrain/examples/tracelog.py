"""Read the JSON lines ``python -m malletrain.examples.train --trace`` prints (light: no torch).

A worker's log mixes them with other output; lines that are not a JSON object are skipped, and a
log that does not exist (yet) has no events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def traced(log: Path, ev: str | None = None) -> list[dict[str, Any]]:
    """The traced events in ``log`` in order; only those of kind ``ev`` (``"step"``, ``"rescale"``) if given."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and (ev is None or obj.get("ev") == ev):
            out.append(obj)
    return out


def steps(log: Path) -> list[dict[str, Any]]:
    """The traced steps in ``log``."""
    return traced(log, "step")
