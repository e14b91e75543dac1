"""The costs the simulator charges, from one calibration file, written by the project's own real benchmarks
(``benchmarks/calibrate.py``, ``benchmarks/bench_checkpoint.py``) and shipped as :file:`simulator/calibration.json`::

    {"schema": 1, "values": {NAME: {"value": 12.0, "unit": "s", "how": "...",
                                    "when": "YYYY-MM-DD", "command": "..."}}}

with every name of :data:`REQUIRED` and any of :data:`OPTIONAL` (0, or the fallback its field names, when a file has
none). What each value is and how the engine charges it: docs/research/real-system.md and docs/research/evaluation.md.
``free`` (:func:`free`) is the named ablation with no start, restart, pilot, join or rollback cost (rescale pauses: each
job's own). Every ``summary.json`` names the calibration it ran with.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from datetime import date
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

SCHEMA = 1
REQUIRED = ("pilot_start_s", "cold_start_s", "restart_s", "rescale_pause_s", "commit_interval_s")
OPTIONAL = ("join_s", "warm_start_s", "torchrun_restart_s", "torchrun_cold_restart_s",
            "state_broadcast_s_per_mb", "checkpoint_load_s_per_mb", "checkpoint_save_s_per_mb")
PER_MB = ("state_broadcast_s_per_mb", "checkpoint_load_s_per_mb", "checkpoint_save_s_per_mb")  # unit s/MB
DEFAULT_FILE = "calibration.json"
FREE = "free"


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True)
class Calibration:
    """The charged costs (seconds). ``rescale_pause_s`` None: each job's own rescale costs."""

    name: str  # the file it came from, or "free"
    pilot_start_s: float = 0.0  # a node goes idle -> its pilot runs (the node is usable only after this)
    cold_start_s: float = 0.0  # a job's first start: it holds its nodes without progress this long
    restart_s: float = 0.0  # a start after a stop (cold start + checkpoint load); work since the commit is lost
    rescale_pause_s: float | None = None
    commit_interval_s: float = 0.0  # how often a running job commits a checkpoint (0: every step)
    join_s: float = 0.0  # a grow: the new node adds to the job's rate this long after its warm worker began
    warm_start_s: float | None = None  # None: no warm discount (every start pays its full figure)
    torchrun_restart_s: float | None = None  # None: not measured (a torchrun job's stop -> first step, warm ranks)
    torchrun_cold_restart_s: float | None = None  # None: not measured (the same with its ranks started cold)
    state_broadcast_s_per_mb: float = 0.0  # a rescale's broadcast of a job's state, per MB of its checkpoint
    checkpoint_load_s_per_mb: float = 0.0  # a restart's load of a job's checkpoint, per MB
    checkpoint_save_s_per_mb: float = 0.0  # a commit's save, per MB (measured; not charged: commits overlap)

    def __post_init__(self) -> None:
        for key in ("pilot_start_s", "cold_start_s", "restart_s", "commit_interval_s", "join_s") + PER_MB:
            _check(self.name, key, getattr(self, key))
        if self.rescale_pause_s is not None:
            _check(self.name, "rescale_pause_s", self.rescale_pause_s)
        for key in ("warm_start_s", "torchrun_restart_s", "torchrun_cold_restart_s"):
            if getattr(self, key) is not None:
                _check(self.name, key, getattr(self, key))

    @property
    def is_free(self) -> bool:
        return self.name == FREE

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{key: getattr(self, key) for key in REQUIRED + OPTIONAL}}

    def broadcast_s(self, mb: float) -> float:
        """Seconds to broadcast ``mb`` MB of a job's state to a new world at a rescale."""
        return self.state_broadcast_s_per_mb * mb

    def torchrun_change_s(self, warm_ranks: bool) -> float:
        """What a change of size costs a ``launcher = "torchrun"`` job before its checkpoint's load: the
        warm restart (``torchrun_restart_s``), or the cold one for a job whose ranks start cold
        (``torchrun_cold_restart_s``, else the warm figure), else ``restart_s``."""
        warm = self.torchrun_restart_s if self.torchrun_restart_s is not None else self.restart_s
        if warm_ranks or self.torchrun_cold_restart_s is None:
            return warm
        return self.torchrun_cold_restart_s

    def load_s(self, mb: float) -> float:
        """Seconds to load a checkpoint of ``mb`` MB at a restart."""
        return self.checkpoint_load_s_per_mb * mb


def _check(where: str, key: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise CalibrationError(f"{where}: {key} must be a finite number of seconds >= 0, got {value!r}")


def free() -> Calibration:
    """The ablation: starts, restarts, pilots and rollbacks cost nothing (rescales: the jobs' own pauses)."""
    return Calibration(FREE)


def default_path() -> Path:
    return Path(str(resources.files("simulator").joinpath(DEFAULT_FILE)))


def parse(data: Any, where: str) -> Calibration:
    """A calibration from the decoded JSON of ``where`` (errors name ``where`` and the entry)."""
    if not isinstance(data, Mapping):
        raise CalibrationError(f"{where}: expected a JSON object with 'schema' and 'values'")
    if data.get("schema") != SCHEMA:
        raise CalibrationError(f"{where}: schema {data.get('schema')!r} is not {SCHEMA}")
    values = data.get("values")
    if not isinstance(values, Mapping):
        raise CalibrationError(f"{where}: 'values' must be an object of NAME -> {{value, unit, how, when, command}}")
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise CalibrationError(f"{where}: missing value(s) {', '.join(missing)}")
    got: dict[str, float] = {}
    for key in REQUIRED + tuple(k for k in OPTIONAL if k in values):
        entry = values[key]
        if not isinstance(entry, Mapping):
            raise CalibrationError(f"{where}: values.{key} must be an object with 'value', 'unit', 'how', 'when'")
        for field_ in ("value", "unit", "how", "when"):
            if field_ not in entry:
                raise CalibrationError(f"{where}: values.{key} has no {field_!r}")
        unit = "s/MB" if key in PER_MB else "s"
        if entry["unit"] != unit:
            raise CalibrationError(f"{where}: values.{key}.unit {entry['unit']!r}: must be {unit!r}")
        try:
            date.fromisoformat(str(entry["when"]))
        except ValueError:
            raise CalibrationError(f"{where}: values.{key}.when {entry['when']!r} is not YYYY-MM-DD") from None
        _check(f"{where}: values.{key}", "value", entry["value"])
        got[key] = float(entry["value"])
    return Calibration(where, **got)


def load(path: str | Path) -> Calibration:
    """Read a calibration file (``free`` is the named ablation, not a file)."""
    if str(path) == FREE:
        return free()
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(f"{p}: cannot read calibration file: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{p}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    return parse(data, str(p))


def default() -> Calibration:
    """The shipped calibration, named ``simulator/calibration.json``."""
    return replace(load(default_path()), name=f"simulator/{DEFAULT_FILE}")


def resolve(spec: str | None) -> Calibration:
    """``None`` -> the shipped default; ``free`` -> the ablation; else a file."""
    return default() if spec is None else load(spec)
