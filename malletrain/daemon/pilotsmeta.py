"""Our live pilots kept in the store's meta for a restarted daemon (:data:`PILOTS_KEY`): written by
:meth:`malletrain.daemon.scavenging.Scavenging._remember` when they change, read back by its ``resume``."""

from __future__ import annotations

import json
from typing import Mapping, Protocol

from scavenger.base import PilotId, PilotState, PilotView, SavedPilot

PILOTS_KEY = "pilots"
"""Store meta: our live pilots, ``{id: {"nodes": [...], "replaces": id or null[, "waits": true]}}``."""
PilotTexts = dict[PilotId, tuple[PilotView, str]]
"""Each kept pilot's view and its entry's JSON, as :func:`pilots_json` last wrote them."""


class MetaStore(Protocol):
    """Where the live pilots are kept across restarts (the daemon's store)."""

    def get_meta(self, key: str) -> str | None:
        """The text kept under ``key``; None: nothing."""

    def set_meta(self, key: str, value: str) -> None:
        """Keep ``value`` under ``key``."""


def pilots_json(views: Mapping[PilotId, PilotView], last: PilotTexts | None = None) -> str:
    """The live pilots a restarted daemon must take back (every one not cancelled); ``last``: the entries of
    the call before, reused where a pilot is unchanged (at 4,608 pilots the whole JSON took ~25 ms a change)."""
    texts = last if last is not None else {}
    for pid in [pid for pid in texts if pid not in views]:
        del texts[pid]
    for pid, v in views.items():
        known = texts.get(pid)
        if known is not None and known[0] == v:
            continue
        if v.cancelling or v.state is PilotState.ENDED:
            texts.pop(pid, None)
            continue
        entry = {"nodes": list(v.nodes), "replaces": v.replaces, **({"waits": True} if v.waits_for_node else {})}
        texts[pid] = v, json.dumps(entry, sort_keys=True)
    return "{" + ", ".join(f"{json.dumps(str(pid))}: {texts[pid][1]}" for pid in sorted(texts, key=str)) + "}"


def parse_pilots(text: str) -> list[SavedPilot]:
    """The pilots :func:`pilots_json` wrote; ValueError naming what is wrong."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"store meta {PILOTS_KEY!r} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"store meta {PILOTS_KEY!r} is not a JSON object")
    out = []
    for pid, rec in obj.items():
        nodes = rec.get("nodes") if isinstance(rec, dict) else None
        replaces = rec.get("replaces") if isinstance(rec, dict) else None
        waits = rec.get("waits", False) if isinstance(rec, dict) else None
        if not pid or not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes) \
                or not (replaces is None or isinstance(replaces, str)) or not isinstance(waits, bool):
            raise ValueError(f"store meta {PILOTS_KEY!r}: bad entry for pilot {pid!r}: {rec!r}")
        out.append(SavedPilot(PilotId(pid), tuple(nodes), PilotId(replaces) if replaces else None, waits))
    return out
