"""Read the JSON lines ``python -m malletrain.worker.examples.train --trace`` prints, and the step lines of
``malletrain.worker.examples.torchrun_ddp`` (light: no torch).

A worker's log mixes them with other output; lines that are not a JSON object are skipped, and a
log that does not exist (yet) has no events.
"""

from __future__ import annotations

import json
import re
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


TORCHRUN_STEP = re.compile(r"^step (\d+) world (\d+) rank (\d+) restart (\d+) t ([\d.]+)$")
"""A step line of :mod:`malletrain.worker.examples.torchrun_ddp`."""


def torchrun_steps(log: Path) -> list[dict[str, Any]]:
    """The step lines ``malletrain.worker.examples.torchrun_ddp`` printed into ``log``, in order (keys ``step``,
    ``world``, ``rank``, ``restart``, ``t``)."""
    if not log.exists():
        return []
    out: list[dict[str, Any]] = []
    for line in log.read_text(errors="replace").splitlines():
        m = TORCHRUN_STEP.match(line.strip())
        if m:
            step, world, rank, restart = (int(g) for g in m.groups()[:4])
            out.append({"step": step, "world": world, "rank": rank, "restart": restart, "t": float(m.group(5))})
    return out
