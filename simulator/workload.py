"""Workloads for the simulator: measured scaling curves and job streams.

* ``nas``, ``hpo``, ``stress``: generated streams (NASBench-101-like architectures, HPO
  trials, badly scaling curves) from a calibrated rate model; see :mod:`simulator.streams`.
* ``imagenet7``: jobs drawn (seeded) from the ImageNet models of ``summit-scaling.csv``.
* a user file (JSON, TOML or CSV) listing jobs.

Defaults follow the published evaluation (MalleTrain/BFTrainer): 130M samples
per job, 1-64 nodes, 18 s to scale up, 12 s to scale down. The NAS and HPO
streams never drain unless ``n_jobs`` is given.
"""

from __future__ import annotations

import csv
import json
import math
import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from profiler.scalability import ScalabilityError, parse_scaling_table

DEFAULT_SAMPLES = 130_000_000
DEFAULT_MIN_NODES = 1
DEFAULT_MAX_NODES = 64
DEFAULT_UP_COST_S = 18.0
DEFAULT_DOWN_COST_S = 12.0
HPO_MODEL = "shufflenet-hpo"
SCALING_FILE = "summit-scaling.csv"
GENERATED_STREAMS = ("nas", "hpo", "stress", "imagenet7")

Curve = Mapping[int, float]


class WorkloadError(ValueError):
    """A workload or scaling file that cannot be used; the message names file and entry."""


@dataclass(frozen=True)
class JobSpec:
    """One training job to simulate.

    ``scaling`` is the TRUE throughput (samples/s per node count): progress is
    always computed from it. ``believed_scaling`` is what a policy is told (a
    user's guess, say); it defaults to the true curve.
    """

    name: str
    model: str
    samples: float
    scaling: Curve
    min_nodes: int = DEFAULT_MIN_NODES
    max_nodes: int = DEFAULT_MAX_NODES
    up_cost_s: float = DEFAULT_UP_COST_S
    down_cost_s: float = DEFAULT_DOWN_COST_S
    arrival_s: float = 0.0  # offset from the start of the replay window
    believed_scaling: Curve | None = None

    def __post_init__(self) -> None:
        if not (self.samples > 0) or math.isinf(self.samples):
            raise WorkloadError(f"job {self.name}: samples must be a finite number > 0, got {self.samples!r}")
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise WorkloadError(
                f"job {self.name}: need 1 <= min_nodes <= max_nodes, got {self.min_nodes}..{self.max_nodes}"
            )
        if self.up_cost_s < 0 or self.down_cost_s < 0:
            raise WorkloadError(f"job {self.name}: rescale costs must be >= 0")
        if self.arrival_s < 0:
            raise WorkloadError(f"job {self.name}: arrival must be >= 0 s after the start")
        _check_curve(self.scaling, f"job {self.name}: scaling")
        if self.believed_scaling is not None:
            _check_curve(self.believed_scaling, f"job {self.name}: believed_scaling")

    @property
    def believed(self) -> Curve:
        return self.scaling if self.believed_scaling is None else self.believed_scaling


def _check_curve(curve: Curve, what: str) -> None:
    if not curve:
        raise WorkloadError(f"{what} has no points")
    for n, v in curve.items():
        if not isinstance(n, int) or n < 1:
            raise WorkloadError(f"{what}: node count {n!r} is not a positive integer")
        if not (v >= 0) or math.isinf(v):
            raise WorkloadError(f"{what}[{n}] = {v!r} is not a finite rate >= 0")


@dataclass(frozen=True)
class ScalingSet:
    """Throughput curves by model name, and where they came from."""

    curves: dict[str, dict[int, float]]
    source: str  # a path, or "synthetic (built in)"
    synthetic: bool = False

    def curve(self, model: str, where: str = "") -> dict[int, float]:
        try:
            return self.curves[model]
        except KeyError:
            known = ", ".join(sorted(self.curves))
            raise WorkloadError(f"{where}unknown model {model!r} (known: {known}; from {self.source})") from None

    @property
    def nas_models(self) -> tuple[str, ...]:
        """The ImageNet models (every curve but the HPO one), in file order."""
        return tuple(m for m in self.curves if m != HPO_MODEL)


def _amdahl(rate1: float, serial: float, counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> dict[int, float]:
    return {n: round(rate1 * n / (1.0 + serial * (n - 1)), 1) for n in counts}


def synthetic_scaling() -> ScalingSet:
    """Built-in Amdahl-style curves, used only when no scaling file is found.

    These are SYNTHETIC (not measurements): rate(n) = r1 * n / (1 + s (n - 1)).
    """
    curves = {
        "synthetic-fast": _amdahl(7000.0, 0.012),
        "synthetic-heavy": _amdahl(1200.0, 0.002),
        "synthetic-linear": _amdahl(5000.0, 0.0),
        "synthetic-small": _amdahl(3000.0, 0.006),
        HPO_MODEL: _amdahl(2800.0, 0.005),
    }
    return ScalingSet(curves, "synthetic (built in)", synthetic=True)


def load_scaling(path: str | Path) -> ScalingSet:
    """Read ``model,nodes,samples_per_second`` rows (after ``#`` comment lines).

    The parsing is the profiler's (:func:`profiler.parse_scaling_table`); its
    errors name ``file:line`` and come back here as :class:`WorkloadError`.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read scaling file: {exc}") from exc
    try:
        curves = parse_scaling_table(text, origin=str(p))
    except ScalabilityError as exc:
        raise WorkloadError(str(exc)) from None
    if not curves:
        raise WorkloadError(f"{p}: no scaling rows")
    return ScalingSet(curves, str(p))


def find_scaling(path: str | Path | None = None) -> ScalingSet:
    """The given file, else ``summit-scaling.csv`` from the data dir, else synthetic curves."""
    if path is not None:
        return load_scaling(path)
    try:
        from traces.data import find_data
    except ImportError:  # pragma: no cover - traces.data ships with the package
        found = _fallback_data_path()
    else:
        found = find_data(SCALING_FILE)
    return load_scaling(found) if found is not None else synthetic_scaling()


def _fallback_data_path() -> Path | None:
    import os

    env = os.environ.get("MALLETRAIN_DATA")
    candidates = [Path(env) / SCALING_FILE] if env else []
    candidates.append(Path(__file__).resolve().parent.parent.parent / "shared" / "data" / SCALING_FILE)
    return next((c for c in candidates if c.is_file()), None)


# ---------------------------------------------------------------- job streams


@dataclass
class Workload:
    """A source of jobs: a seeded endless stream, or a finite list.

    ``draw()`` gives the next job of the stream (``None`` once a finite stream
    is exhausted); ``timed`` are jobs with their own arrival times (user files).
    """

    name: str
    scaling_source: str
    _stream: Iterator[JobSpec] | None = None
    timed: list[JobSpec] = field(default_factory=list)
    finite: bool = True
    synthetic: bool = False
    # the model curves the jobs are drawn from (what a user could know: freetrain's "mean")
    models: dict[str, Curve] = field(default_factory=dict)

    def draw(self) -> JobSpec | None:
        if self._stream is None:
            return None
        return next(self._stream, None)


def _spec(model: str, curve: Curve, index: int) -> JobSpec:
    return JobSpec(name=f"{model}#{index}", model=model, samples=DEFAULT_SAMPLES, scaling=curve)


def _nas_stream(scaling: ScalingSet, seed: int, limit: int | None) -> Iterator[JobSpec]:
    rng = random.Random(seed)
    models = scaling.nas_models
    if not models:
        raise WorkloadError(f"{scaling.source}: no models for the nas workload")
    i = 0
    while limit is None or i < limit:
        model = models[rng.randrange(len(models))]
        yield _spec(model, scaling.curves[model], i)
        i += 1


def _hpo_stream(scaling: ScalingSet, limit: int | None) -> Iterator[JobSpec]:
    curve = scaling.curve(HPO_MODEL, "hpo workload: ")
    i = 0
    while limit is None or i < limit:
        yield _spec(HPO_MODEL, curve, i)
        i += 1


def make_workload(
    name: str, scaling: ScalingSet, seed: int = 0, n_jobs: int | None = None
) -> Workload:
    """``nas``, ``hpo``, ``stress``, ``imagenet7`` or a path to a JSON/TOML/CSV job file."""
    if n_jobs is not None and n_jobs < 1:
        raise WorkloadError(f"--jobs must be >= 1, got {n_jobs}")
    if name in GENERATED_STREAMS:  # nas, hpo, stress, imagenet7: simulator/streams.py (issue G §2)
        from simulator.streams import make_stream

        return make_stream(name, scaling, seed, n_jobs)
    path = Path(name)
    if not path.exists():
        raise WorkloadError(f"workload {name!r} is neither nas, hpo nor an existing file "
                            f"(streams: {', '.join(GENERATED_STREAMS)})")
    specs = load_jobs_file(path, scaling)
    if n_jobs is not None:
        specs = specs[:n_jobs]
    models = {s.model if s.model != "custom" else s.name: s.scaling for s in specs}
    return Workload(str(path), scaling.source, timed=specs, finite=True, synthetic=scaling.synthetic, models=models)


# ---------------------------------------------------------------- user job files

_FIELDS = {
    "name", "model", "samples", "min_nodes", "max_nodes", "arrival", "arrival_s",
    "up_cost_s", "down_cost_s", "scaling", "believed_scaling", "count",
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
                name=name,
                model=model or "custom",
                samples=_number(entry, "samples", DEFAULT_SAMPLES, where),
                scaling=curve,
                min_nodes=_integer(entry, "min_nodes", DEFAULT_MIN_NODES, where),
                max_nodes=_integer(entry, "max_nodes", DEFAULT_MAX_NODES, where),
                up_cost_s=_number(entry, "up_cost_s", DEFAULT_UP_COST_S, where),
                down_cost_s=_number(entry, "down_cost_s", DEFAULT_DOWN_COST_S, where),
                arrival_s=_number(entry, arrival_key, 0.0, where),
                believed_scaling=believed,
            ))
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: {exc}") from None
    return specs
