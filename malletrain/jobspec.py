"""A job as the user submits it (TOML or JSON job file), and the job states.

    name = "resnet"
    command = ["python", "-m", "malletrain.examples.train"]
    min_nodes = 1
    max_nodes = 4
    profile = true                  # let the profiler measure its scaling
    samples = 200000                # optional: done when this many samples are trained
    scaling = { 1 = 100.0, 2 = 190.0 }   # optional: user-given samples/s per node count
    cwd = "."                       # optional, relative to the job file
    env = { OMP_NUM_THREADS = "1" } # optional

Every error names the file and the field.
"""

from __future__ import annotations

import enum
import json
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping


class JobSpecError(ValueError):
    """A job file or spec that is not valid; the message names the file and the field."""


class JobState(enum.Enum):
    """Where a job is in its life."""

    PENDING = "pending"
    """Queued: waiting for nodes."""
    PROFILING = "profiling"
    """Running under the profiler's plan to measure its scalability."""
    RUNNING = "running"
    """Running on the nodes the allocator gave it."""
    RESCALING = "rescaling"
    """Changing its node set (workers joining or leaving at the next commit)."""
    SUSPENDED = "suspended"
    """Was running; fell below min_nodes (recall or plan); back in the queue, progress kept."""
    COMPLETED = "completed"
    """Its command exited 0 or it trained the requested samples."""
    FAILED = "failed"
    """Its command failed (non-zero exit not caused by us)."""
    CANCELLED = "cancelled"
    """Cancelled by the user."""

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)

    @property
    def active(self) -> bool:
        """Holds nodes (workers may run)."""
        return self in (JobState.PROFILING, JobState.RUNNING, JobState.RESCALING)


@dataclass(frozen=True)
class JobSpec:
    name: str
    command: tuple[str, ...]
    min_nodes: int = 1
    max_nodes: int = 1
    profile: bool = False
    scaling: dict[int, float] | None = None
    samples: int | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["command"] = list(self.command)
        if self.scaling is not None:
            d["scaling"] = {str(k): v for k, v in self.scaling.items()}
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "stored spec") -> "JobSpec":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"{where}: not JSON: {exc}") from None
        return parse_spec(obj, where)


_KEYS = {"name", "command", "min_nodes", "max_nodes", "profile", "scaling", "samples", "cwd", "env"}


def _int(obj: Mapping[str, Any], key: str, where: str, default: int | None, low: int) -> int | None:
    v = obj.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise JobSpecError(f"{where}: {key} must be an integer >= {low}, got {v!r}")
    return v


def parse_spec(obj: Any, where: str = "job") -> JobSpec:
    """Validate a decoded job file (dict) into a :class:`JobSpec`."""
    if not isinstance(obj, dict):
        raise JobSpecError(f"{where}: a job must be a table/object, got {type(obj).__name__}")
    unknown = set(obj) - _KEYS
    if unknown:
        raise JobSpecError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(_KEYS))}")
    command = obj.get("command")
    if isinstance(command, str):
        raise JobSpecError(f"{where}: command must be a list of strings (no shell), got a string")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) and c for c in command):
        raise JobSpecError(f"{where}: command must be a non-empty list of strings, got {command!r}")
    name = obj.get("name", Path(command[-1]).stem or "job")
    if not isinstance(name, str) or not name:
        raise JobSpecError(f"{where}: name must be a non-empty string, got {name!r}")
    min_nodes = _int(obj, "min_nodes", where, 1, 1)
    max_nodes = _int(obj, "max_nodes", where, min_nodes, 1)
    assert min_nodes is not None and max_nodes is not None
    if max_nodes < min_nodes:
        raise JobSpecError(f"{where}: max_nodes {max_nodes} < min_nodes {min_nodes}")
    profile = obj.get("profile", False)
    if not isinstance(profile, bool):
        raise JobSpecError(f"{where}: profile must be true or false, got {profile!r}")
    samples = _int(obj, "samples", where, None, 1)
    scaling = _scaling(obj.get("scaling"), where)
    cwd = obj.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise JobSpecError(f"{where}: cwd must be a path string, got {cwd!r}")
    env = obj.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise JobSpecError(f"{where}: env must map names to string values, got {env!r}")
    return JobSpec(name, tuple(command), min_nodes, max_nodes, profile, scaling, samples, cwd, dict(env))


def _scaling(raw: Any, where: str) -> dict[int, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise JobSpecError(f"{where}: scaling must map node counts to samples/s, got {raw!r}")
    out: dict[int, float] = {}
    for k, v in raw.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            raise JobSpecError(f"{where}: scaling key {k!r} is not a node count") from None
        if n < 1:
            raise JobSpecError(f"{where}: scaling key {k!r} must be >= 1")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not (v >= 0) or v == float("inf"):
            raise JobSpecError(f"{where}: scaling[{k}] = {v!r} is not a finite rate >= 0")
        out[n] = float(v)
    return out


def load_spec(path: str | Path) -> JobSpec:
    """Read a job file (``.toml`` or ``.json``); a relative ``cwd`` is resolved against its folder."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"job file not found: {p}") from None
    if p.suffix == ".json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise JobSpecError(f"{p}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    else:
        try:
            obj = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobSpecError(f"{p}: not valid TOML: {exc}") from None
    spec = parse_spec(obj, str(p))
    cwd = Path(spec.cwd) if spec.cwd else Path(".")
    if not cwd.is_absolute():
        cwd = (p.resolve().parent / cwd).resolve()
    return JobSpec(spec.name, spec.command, spec.min_nodes, spec.max_nodes, spec.profile,
                   spec.scaling, spec.samples, str(cwd), spec.env)
