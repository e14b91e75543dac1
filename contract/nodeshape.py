"""A node's shape: how many worker slots it has.

A node has K worker slots: one per GPU the main scheduler reports, else the operator's
``[scavenger] workers_per_node``, else 1; a job runs one worker process per slot it uses. Each
slot's part of the node is :mod:`spawner.slots`. Pure, so the rules are tested without a GPU."""

from __future__ import annotations

import re
from typing import Any, Mapping

from spawner.slots import MAX_SLOTS, NodeShapeError  # noqa: F401  (NodeShapeError: re-exported for the daemon)

# ---------------------------------------------------------------- what the scheduler says
_GRES_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


def parse_gres_gpus(gres: str) -> int | None:
    """GPUs in a Slurm ``Gres`` string: ``gpu:a100:4(S:0-1)`` -> 4, ``gpu:2,gpu:v100:2`` -> 4;
    ``(null)`` or no ``gpu`` entry -> None (the scheduler says nothing about GPUs)."""
    text = gres.strip()
    if not text or text == "(null)":
        return None
    total, found = 0, False
    for entry in _split_gres(text):
        entry = entry.strip()
        if not entry.startswith("gpu"):
            continue
        m = _GRES_GPU.match(entry)
        if m is None:
            if entry == "gpu" or entry.startswith("gpu("):
                total, found = total + 1, True  # a bare "gpu" means one
                continue
            raise NodeShapeError(f"Gres entry {entry!r} of {gres!r}: no GPU count")
        total, found = total + int(m.group(1)), True
    return total if found else None


def _split_gres(text: str) -> list[str]:
    """Split ``gpu:a100:2(S:0-1),shard:8`` at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def pbs_ngpus(attrs: Mapping[str, Any]) -> int | None:
    """``resources_available.ngpus`` of one ``pbsnodes -F json`` entry (None: not reported)."""
    avail = attrs.get("resources_available")
    if not isinstance(avail, Mapping) or "ngpus" not in avail:
        return None
    value = avail["ngpus"]
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise NodeShapeError(f"resources_available.ngpus = {value!r} is not a number") from None
    if count < 0:
        raise NodeShapeError(f"resources_available.ngpus = {value!r} is negative")
    return count


# ---------------------------------------------------------------- K
WORKERS_PER_NODE_GPUS = "gpus"
"""``[scavenger] workers_per_node = "gpus"``: one worker slot per GPU the scheduler reports (1 where none)."""


def parse_workers_per_node(value: Any, where: str = "[scavenger] workers_per_node") -> int | None:
    """The operator's setting: an int in [1, MAX_SLOTS], or ``"gpus"`` (returned as None)."""
    if value == WORKERS_PER_NODE_GPUS:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SLOTS:
        raise NodeShapeError(f"{where} must be an integer in [1, {MAX_SLOTS}] or \"gpus\", got {value!r}")
    return value


def node_slots(reported_gpus: int | None, configured: int | None) -> int:
    """K of one node: the GPUs its scheduler reports (0 counts as none), else ``configured``, else 1."""
    if reported_gpus:
        return min(reported_gpus, MAX_SLOTS)
    return configured if configured is not None else 1


def job_slots(slots: int, workers_per_node: int | None) -> int:
    """The workers a job runs on a node of ``slots`` slots: all of them, or fewer where it asks."""
    if workers_per_node is None:
        return slots
    return max(1, min(slots, workers_per_node))
