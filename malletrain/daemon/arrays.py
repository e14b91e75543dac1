"""Job arrays: one job file submitted once per index (``malletrain submit --array 0-19 job.toml``).

Index specs as in Slurm (``0-19``, ``0-19:2``, ``1,3,5``, mixed). Each element is a job of its own with
the array's id and its index in its spec, ``{index}`` in its command and ``MALLETRAIN_ARRAY_INDEX``
in its env; ``cancel`` takes the array's id (every element) or ``ID_INDEX``. The id ``aNNNNNN`` is
counted in the store, so the CLI and the daemon give the same kind of id."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable

from malletrain.daemon.jobspec import JobSpec, JobSpecError, JobState
from malletrain.daemon.store import JobRecord, Store

ARRAY_MAX_ELEMENTS = 10_000
"""No array has more elements than this (a typo such as ``0-1000000`` is refused, not queued)."""
ARRAY_INDEX_MAX = 1_000_000
INDEX_PLACEHOLDER = "{index}"
ARRAY_SEQ_KEY = "array_seq"
"""Store meta: the last array number given."""
_ARRAY_ID = re.compile(r"a[0-9]{6,}")
_ELEMENT_ID = re.compile(r"(a[0-9]{6,})_([0-9]{1,7})")
_PART = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7})(?::([0-9]{1,7}))?)?")


class ArraySpecError(JobSpecError):
    """An index spec that is not valid; the message quotes it and says which part is wrong."""


def parse_indices(text: str) -> tuple[int, ...]:
    """The indices of an index spec (sorted, each once); :class:`ArraySpecError` names a bad one."""
    if not isinstance(text, str) or not text.strip():
        raise ArraySpecError(f"--array {text!r}: empty; give e.g. 0-19, 0-19:2 or 1,3,5")
    out: set[int] = set()
    for part in text.strip().split(","):
        m = _PART.fullmatch(part.strip())
        if m is None:
            raise ArraySpecError(f"--array {text!r}: {part!r} is not N, N-M or N-M:STEP (digits only)")
        low = int(m.group(1))
        high = int(m.group(2)) if m.group(2) is not None else low
        step = int(m.group(3)) if m.group(3) is not None else 1
        if high < low:
            raise ArraySpecError(f"--array {text!r}: {part!r} ends below its start")
        if step < 1:
            raise ArraySpecError(f"--array {text!r}: {part!r} has a step below 1")
        if high > ARRAY_INDEX_MAX:
            raise ArraySpecError(f"--array {text!r}: index {high} is above {ARRAY_INDEX_MAX}")
        if (high - low) // step + 1 + len(out) > ARRAY_MAX_ELEMENTS:
            raise ArraySpecError(f"--array {text!r}: more than {ARRAY_MAX_ELEMENTS} elements")
        out.update(range(low, high + 1, step))
    return tuple(sorted(out))


def element_spec(spec: JobSpec, array_id: str, index: int) -> JobSpec:
    """The job of one element: ``{index}`` replaced (in any word of the command), its array and index set."""
    command = tuple(w.replace(INDEX_PLACEHOLDER, str(index)) for w in spec.command)
    return replace(spec, command=command, array_id=array_id, array_index=index)


def submit_array(store: Store, spec: JobSpec, indices: Iterable[int], owner_uid: int | None = None,
                 owner_gid: int | None = None, owner_umask: int | None = None) -> tuple[str, list[str]]:
    """Queue one job per index, all or none (one transaction); returns the array's id and the job ids.
    Every element runs with ``owner_umask``, the submitter's (as :meth:`Store.submit`)."""
    indices = tuple(indices)
    if not indices:
        raise ArraySpecError("an array needs at least one index")
    if spec.array_id is not None or spec.sweep_name is not None:
        raise JobSpecError(f"job {spec.name!r}: already an element of {spec.array_id or spec.sweep_name}")
    with store.batch():
        seq = int(store.get_meta(ARRAY_SEQ_KEY) or 0) + 1
        store.set_meta(ARRAY_SEQ_KEY, str(seq))
        array_id = f"a{seq:06d}"
        jobs = [store.submit(element_spec(spec, array_id, i), owner_uid, owner_gid, owner_umask) for i in indices]
    store.log_event("array_submit", array=array_id, elements=len(jobs), first=jobs[0])
    return array_id, jobs


def is_array_ref(ref: str) -> bool:
    """Whether ``ref`` names an array (``a000001``) or one of its elements (``a000001_3``)."""
    return bool(_ARRAY_ID.fullmatch(ref) or _ELEMENT_ID.fullmatch(ref))


def resolve(records: Iterable[JobRecord], ref: str) -> list[str]:
    """The job ids ``ref`` names: an array's elements (``a000001``), one element (``a000001_3``), else []."""
    m = _ELEMENT_ID.fullmatch(ref)
    array_id, index = (m.group(1), int(m.group(2))) if m else (ref, None)
    if not _ARRAY_ID.fullmatch(array_id):
        return []
    return [r.id for r in records if r.spec.array_id == array_id and (index is None or r.spec.array_index == index)]


def summary(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per array of the status jobs (each with ``array_id``, ``array_index``, ``state``):
    its id, name, element count, counts by state and the indices of its elements."""
    rows: dict[str, dict[str, Any]] = {}
    for j in jobs:
        aid = j.get("array_id")
        if not aid:
            continue
        row = rows.setdefault(aid, {"array": aid, "name": j["name"], "elements": 0, "counts": {},
                                    "indices": [], "nodes": 0})
        row["elements"] += 1
        row["counts"][j["state"]] = row["counts"].get(j["state"], 0) + 1
        row["indices"].append(j.get("array_index"))
        row["nodes"] += len(j.get("nodes") or ())
    for row in rows.values():
        row["done"] = all(JobState(s).terminal for s in row["counts"])
    return list(rows.values())
