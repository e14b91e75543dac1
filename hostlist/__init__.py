"""Slurm host lists (``node[01-03,7],gpu01``) to node names: the one parser (the bottom layer).

Strict: a bracket holds comma-separated numbers or ascending ``lo-hi`` ranges (zero padding kept);
anything else raises :class:`HostListError` naming the list. Imports nothing of this project.
"""

from __future__ import annotations

import re

__all__ = ("DEFAULT_LIMIT", "UNSET", "HostListError", "expand_hostlist")

UNSET = frozenset({"", "unknown", "none", "n/a", "(null)"})  # how schedulers write "no host list"
DEFAULT_LIMIT = 1_000_000  # more names than a machine has nodes: not a real list

Range = tuple[int, int, int]  # lo, hi, zero-padded width
Slot = list[Range] | str  # a bracket's ranges, or literal text between brackets


class HostListError(ValueError):
    """A host list that is malformed; the message quotes it."""


def expand_hostlist(text: str, limit: int = DEFAULT_LIMIT) -> tuple[str, ...] | None:
    """Slurm host list to names: ``a[01-03,7],b2`` -> a01 a02 a03 a7 b2; None when unset
    (:data:`UNSET`) or more than ``limit`` nodes (counted before anything is expanded)."""
    text = text.strip()
    if text.lower() in UNSET or text.lower().startswith("none"):
        return None
    if "[" not in text and "]" not in text and "," not in text:
        return (text,)  # one plain name (a one-node pilot's line, most of a big squeue): nothing to split
    items = [_parse_item(item, text) for item in _split_top(text)]
    if sum(_count(slots, limit) for slots in items) > limit:
        return None
    names: list[str] = []
    for slots in items:
        names.extend(_expand(slots))
    return tuple(names)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets; brackets must balance and never nest."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise HostListError(f"bad host list {text[:60]!r}: unbalanced or nested brackets")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise HostListError(f"bad host list {text[:60]!r}: unbalanced brackets")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


_RANGE = re.compile(r"(\d{1,9})(?:-(\d{1,9}))?", re.ASCII)


def _parse_item(item: str, text: str) -> list[Slot]:
    """``c[01-02]s[8,9]`` -> ["c", [(1, 2, 2)], "s", [(8, 8, 1), (9, 9, 1)]]."""
    slots: list[Slot] = []
    for k, piece in enumerate(re.split(r"[\[\]]", item)):
        if k % 2 == 0:
            if piece:
                slots.append(piece)
            continue
        ranges: list[Range] = []
        for spec in piece.split(","):
            m = _RANGE.fullmatch(spec.strip())
            if m is None:
                raise HostListError(f"bad host list {text[:60]!r}: range {spec.strip()[:30]!r}")
            lo, hi = m.group(1), m.group(2) or m.group(1)
            if int(hi) < int(lo):
                raise HostListError(f"bad host list {text[:60]!r}: reversed range {spec.strip()[:30]!r}")
            ranges.append((int(lo), int(hi), len(lo)))
        slots.append(ranges)
    return slots


def _count(slots: list[Slot], limit: int) -> int:
    """How many names ``slots`` expand to (``limit + 1`` once past ``limit``)."""
    total = 1
    for slot in slots:
        if isinstance(slot, list):
            total *= sum(hi - lo + 1 for lo, hi, _ in slot)
        if total > limit:
            return limit + 1
    return total


def _expand(slots: list[Slot]) -> list[str]:
    names = [""]
    for slot in slots:
        values = [slot] if isinstance(slot, str) else [str(v).zfill(w) for lo, hi, w in slot for v in range(lo, hi + 1)]
        names = [head + v for head in names for v in values]
    return names
