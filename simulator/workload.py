"""Workloads for the simulator: measured scaling curves and job streams.

* ``nas``, ``hpo``, ``stress``: generated streams from a calibrated rate model (:mod:`simulator.streams`);
* ``imagenet7``: jobs drawn (seeded) from the ImageNet models of ``summit-scaling.csv``;
* ``philly`` (a real finite stream), ``pollux-done`` and a jobs file ``name,time,application[,...]``:
  :mod:`simulator.philly`;
* a user file (JSON, TOML or CSV) listing jobs.

Defaults: :mod:`simulator.jobs`. The NAS and HPO streams never drain unless ``n_jobs`` is given.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path
from typing import Any, Mapping

from simulator.jobs import (  # noqa: F401  (re-exported: the workload API)
    DEFAULT_DOWN_COST_S, DEFAULT_MAX_NODES, DEFAULT_MIN_NODES, DEFAULT_SAMPLES, DEFAULT_UP_COST_S, GENERATED_STREAMS,
    HPO_MODEL, SCALING_FILE, Curve, StreamWindow, JobSpec, ScalingSet, Workload, WorkloadError, find_scaling,
    load_scaling, synthetic_scaling,
)
from simulator.philly import is_jobs_file, jobs_file_workload, philly_workload, pollux_workload, scarce_workload
from simulator.streams import make_stream

REAL_STREAMS = ("philly", "philly-done", "pollux-done", "scarce")
OFFERED_STREAMS = ("philly", "philly-done", "pollux-done")  # real streams offered at a load


def make_workload(
    name: str, scaling: ScalingSet, seed: int = 0, n_jobs: int | None = None, window: StreamWindow | None = None,
) -> Workload:
    """``nas``, ``hpo``, ``stress``, ``imagenet7`` (generated, endless unless ``n_jobs``), ``philly`` (a
    real finite stream for ``window``), a jobs file ``name,time,application[,...]``
    (:func:`simulator.philly.jobs_file_workload`) or a JSON/TOML/CSV job file."""
    if n_jobs is not None and n_jobs < 1:
        raise WorkloadError(f"--jobs must be >= 1, got {n_jobs}")
    if name in GENERATED_STREAMS:  # nas, hpo, stress, imagenet7: simulator/streams.py
        return make_stream(name, scaling, seed, n_jobs)
    if name in OFFERED_STREAMS:  # philly, philly-done, and pollux-done: the trace sampled as Pollux samples it
        pollux = name == "pollux-done"
        if window is None:
            raise WorkloadError(f"the {'pollux-done' if pollux else 'philly'} workload needs the replay window (its "
                                "length, idle node-seconds and --offered-load)")
        args = (seed, window.duration_s, window.idle_node_seconds, window.offered_load)
        wl = pollux_workload(*args) if pollux else philly_workload(*args, finishing=name == "philly-done")
        return _first(wl, n_jobs)
    if name == "scarce":  # fewer jobs than nodes, the six models' curves: how nodes are shared
        return _first(scarce_workload(seed, window.duration_s if window is not None else 86400.0), n_jobs)
    path = Path(name)
    if not path.exists():
        raise WorkloadError(f"workload {name!r} is neither nas, hpo nor an existing file "
                            f"(streams: {', '.join(GENERATED_STREAMS + REAL_STREAMS)})")
    if is_jobs_file(path):
        return _first(jobs_file_workload(path), n_jobs)
    specs = load_jobs_file(path, scaling)
    if n_jobs is not None:
        specs = specs[:n_jobs]
    models = {s.model if s.model != "custom" else s.name: s.scaling for s in specs}
    return Workload(str(path), scaling.source, timed=specs, finite=True, synthetic=scaling.synthetic, models=models)


def _first(wl: Workload, n_jobs: int | None) -> Workload:
    if n_jobs is not None:
        wl.timed = wl.timed[:n_jobs]
    return wl


_FIELDS = {
    "name", "model", "samples", "min_nodes", "max_nodes", "arrival", "arrival_s",
    "up_cost_s", "down_cost_s", "scaling", "believed_scaling", "count", "budget_node_hours", "deadline",
    "launcher", "warm_ranks", "commit_interval_s", "user",
}


def load_jobs_file(path: str | Path, scaling: ScalingSet) -> list[JobSpec]:
    """Jobs from a JSON (list, or ``{"jobs": [...]}``), TOML (``[[jobs]]``) or CSV file."""
    p = Path(path)
    suffix = p.suffix.lower()
    try:
        text = p.read_text()
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read job file: {exc}") from exc
    if suffix == ".json":
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from None
        entries = data.get("jobs") if isinstance(data, dict) else data
        labels = None
    elif suffix == ".toml":
        try:
            entries = tomllib.loads(text).get("jobs")
        except tomllib.TOMLDecodeError as exc:
            raise WorkloadError(f"{p}: invalid TOML: {exc}") from None
        labels = None
    elif suffix == ".csv":
        entries, labels = _csv_entries(text)
    else:
        raise WorkloadError(f"{p}: unknown job file type {suffix!r} (use .json, .toml or .csv)")
    if not isinstance(entries, list) or not entries:
        raise WorkloadError(f"{p}: expected a non-empty list of jobs")
    specs: list[JobSpec] = []
    for i, entry in enumerate(entries):
        where = f"{p}: {labels[i] if labels else f'job #{i + 1}'}"
        specs.extend(_entry_specs(entry, scaling, where, len(specs)))
    return specs


def _csv_entries(text: str) -> tuple[list[dict[str, str]], list[str]]:
    rows = [r for r in text.splitlines() if r.strip() and not r.lstrip().startswith("#")]
    reader = csv.DictReader(rows)
    entries: list[dict[str, str]] = []
    labels: list[str] = []
    for k, row in enumerate(reader):
        entries.append({key.strip(): (v or "").strip() for key, v in row.items() if key and (v or "").strip()})
        labels.append(f"row {k + 2} (after comments)")
    return entries, labels


def _parse_curve(value: Any, where: str) -> dict[int, float]:
    """``{"1": 100, "2": 190}``, ``[[1, 100], [2, 190]]`` or ``"1:100;2:190"``."""
    try:
        if isinstance(value, str):
            pairs = [part.split(":") for part in value.split(";") if part.strip()]
            return {int(a): float(b) for a, b in pairs}
        if isinstance(value, Mapping):
            return {int(k): float(v) for k, v in value.items()}
        if isinstance(value, list):
            return {int(a): float(b) for a, b in value}
    except (ValueError, TypeError):
        pass
    raise WorkloadError(f"{where}: cannot read a scaling curve from {value!r}")


def _number(entry: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = entry.get(key, default)
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: field {key!r} is not a number: {value!r}") from None
    if math.isnan(out):
        raise WorkloadError(f"{where}: field {key!r} is NaN")
    return out


def _optional(entry: Mapping[str, Any], key: str, where: str) -> float | None:
    """Field ``key`` as a number, or None when the entry has none."""
    return _number(entry, key, 0.0, where) if key in entry else None


def _flag(entry: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    """Field ``key`` as a boolean (true or false; a CSV cell: true, false, 1 or 0)."""
    value = entry.get(key, default)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if not isinstance(value, bool):
        raise WorkloadError(f"{where}: field {key!r} must be true or false, got {value!r}")
    return value


def _integer(entry: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = _number(entry, key, default, where)
    if value != int(value):
        raise WorkloadError(f"{where}: field {key!r} must be an integer, got {entry.get(key)!r}")
    return int(value)


def _entry_specs(entry: Any, scaling: ScalingSet, where: str, first_index: int) -> list[JobSpec]:
    if not isinstance(entry, Mapping):
        raise WorkloadError(f"{where}: expected a table of fields, got {entry!r}")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    model = str(entry.get("model", "")) or None
    if "scaling" in entry:
        curve = _parse_curve(entry["scaling"], f"{where}: field 'scaling'")
    elif model:
        curve = scaling.curve(model, f"{where}: ")
    else:
        raise WorkloadError(f"{where}: needs a 'model' (a curve of the scaling file) or a 'scaling' curve")
    believed = None
    if "believed_scaling" in entry:
        believed = _parse_curve(entry["believed_scaling"], f"{where}: field 'believed_scaling'")
    count = _integer(entry, "count", 1, where)
    if count < 1:
        raise WorkloadError(f"{where}: field 'count' must be >= 1")
    arrival_key = "arrival_s" if "arrival_s" in entry else "arrival"
    base = str(entry.get("name", "")) or (model or "job")
    specs = []
    for k in range(count):
        name = base if count == 1 and "name" in entry else f"{base}#{first_index + k}"
        try:
            specs.append(JobSpec(
                name=name, model=model or "custom", samples=_number(entry, "samples", DEFAULT_SAMPLES, where),
                scaling=curve, min_nodes=_integer(entry, "min_nodes", DEFAULT_MIN_NODES, where),
                max_nodes=_integer(entry, "max_nodes", DEFAULT_MAX_NODES, where),
                up_cost_s=_number(entry, "up_cost_s", DEFAULT_UP_COST_S, where),
                down_cost_s=_number(entry, "down_cost_s", DEFAULT_DOWN_COST_S, where),
                arrival_s=_number(entry, arrival_key, 0.0, where), believed_scaling=believed,
                budget_node_hours=_optional(entry, "budget_node_hours", where),
                deadline=_optional(entry, "deadline", where), launcher=str(entry.get("launcher", "elastic")),
                warm_ranks=_flag(entry, "warm_ranks", True, where),
                commit_interval_s=_optional(entry, "commit_interval_s", where), user=str(entry.get("user", "")),
            ))
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: {exc}") from None
    return specs
