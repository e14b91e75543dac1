"""A job as the user submits it (TOML or JSON job file; its keys are in docs/operators.md), and the job states.

``python``/``python3`` as the command's first word and ``{python}`` anywhere stand for the Python that
runs ``malletrain submit`` (it has malletrain installed); ``{samples}`` is the job's ``samples``
(:meth:`JobSpec.resolved`). :func:`parse_spec` checks structure and limits (the same rules for a job
file, a control request and a stored job); :func:`check_submit` adds what depends on the machine and
the file system. Every error names the file and the field."""

from __future__ import annotations

import datetime as dt
import enum
import json
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from contract.workerenv import ENV_DEVICES, ENV_PREFIX
from contract.world import TORCHRUN_MAX_RANKS, WORKERS_PER_NODE_MAX
from malletrain.daemon.textfile import decode_text, read_user_file, short_repr as _short

MAX_NODES_CAP = 100_000
"""No job may ask for more nodes than this, whatever the machine (the largest machines have ~10^4 nodes)."""
NAME_MAX_CHARS = 128
COMMAND_MAX_ARGS = 4096
COMMAND_MAX_BYTES = 128 * 1024
ENV_MAX_VARS = 256
ENV_MAX_BYTES = 128 * 1024
PATH_MAX_BYTES = 4096
SAMPLES_MAX = 2**53
SCALING_MAX_POINTS = 1024
JOB_FILE_MAX_BYTES = 1024 * 1024
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PYTHON_WORDS = ("python", "python3")
"""First words of ``command`` that mean "the submitting interpreter"."""
PYTHON_PLACEHOLDER = "{python}"
SAMPLES_PLACEHOLDER = "{samples}"
WORKER_BATCH_MAX = 2**31 - 1
"""As a progress report's samples (:data:`contract.messages.MAX_SAMPLES`): a worker's batch a report can carry."""
STALL_AFTER_MAX = 7 * 86400  # a week: the longest silence a job file may allow (seconds)
TRAINER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A trainer's name (the daemon config's ``[[trainers]]`` and a job's ``trainer``)."""


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
    """Cancelled by the user, or stopped by the daemon on the user's own limit (``budget_node_hours``)."""

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)

    @property
    def active(self) -> bool:
        """Holds nodes (workers may run)."""
        return self in (JobState.PROFILING, JobState.RUNNING, JobState.RESCALING)

    def can_become(self, new: "JobState") -> bool:
        """Whether :data:`JOB_TRANSITIONS` allows the move (staying put is not a move)."""
        return new in JOB_TRANSITIONS[self]


_LIVE_ENDS = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # PENDING is only where a job starts: a job that loses its nodes is SUSPENDED, not pending again
    JobState.PENDING: frozenset({JobState.PROFILING, JobState.RUNNING, JobState.RESCALING,
                                 JobState.SUSPENDED}) | _LIVE_ENDS,
    JobState.PROFILING: frozenset({JobState.RUNNING, JobState.RESCALING, JobState.SUSPENDED}) | _LIVE_ENDS,
    JobState.RUNNING: frozenset({JobState.PROFILING, JobState.RESCALING, JobState.SUSPENDED}) | _LIVE_ENDS,
    JobState.RESCALING: frozenset({JobState.PROFILING, JobState.RUNNING, JobState.SUSPENDED}) | _LIVE_ENDS,
    JobState.SUSPENDED: frozenset({JobState.PROFILING, JobState.RUNNING, JobState.RESCALING}) | _LIVE_ENDS,
    # terminal states never change
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
"""The table of a stored job's states (a running daemon's phases add two: :data:`.records.JOB_PHASES`; the
simulator's jobs have their own, :class:`simulator.engine.SimJobState`); :meth:`.store.Store.set_state` enforces it."""


class Launcher(enum.Enum):
    """How a job's workers are started and rescaled (the job file's ``launcher``)."""

    ELASTIC = "elastic"
    """In-process rescale: the script uses :mod:`malletrain.worker.elastic` (or the client API); a change of
    world is a pause inside the running processes."""
    TORCHRUN = "torchrun"
    """A script written for ``torchrun --nnodes=MIN:MAX`` (``init_process_group`` with ``env://``,
    resuming from its own checkpoint when restarted): every change of world stops its ranks and
    starts them again at the new size."""


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
    trainer: str | None = None  # None: the daemon's first trainer
    budget_node_hours: float | None = None  # None: no budget
    deadline: float | None = None  # unix seconds; None: none
    launcher: Launcher = Launcher.ELASTIC
    workers_per_node: int | None = None  # None: every worker slot of the node
    worker_batch: int | None = None  # samples one worker trains per optimizer step; None: not given
    stall_after: int | None = None  # seconds without progress before it is stalled; None: the daemon's
    # set by malletrain, never by a job file (:data:`MEMBER_KEYS`): the array or sweep a job belongs to
    array_id: str | None = None  # ``submit --array``: the array's id (``a000001``)
    array_index: int | None = None  # its index in the array
    sweep_name: str | None = None  # a ``[sweep]`` trial: the sweep's name
    trial: int | None = None  # the trial's number in the sweep

    def to_json(self) -> str:
        d = asdict(self)
        for key in ("trainer", "budget_node_hours", "deadline", "workers_per_node", "worker_batch", "stall_after") + MEMBER_KEYS:
            if d[key] is None:
                del d[key]  # stored as before these fields existed
        if self.launcher is Launcher.ELASTIC:
            del d["launcher"]
        else:
            d["launcher"] = self.launcher.value
        d["command"] = list(self.command)
        if self.scaling is not None:
            d["scaling"] = {str(k): v for k, v in self.scaling.items()}
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str = "stored spec") -> "JobSpec":
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise JobSpecError(f"{where}: not JSON: {exc}") from None
        return parse_spec(obj, where)

    def resolved(self, python: str | None = None, where: str = "job") -> "JobSpec":
        """The spec with ``python``/``python3`` (first word), ``{python}`` (default ``sys.executable``) and
        ``{samples}`` substituted; idempotent."""
        interpreter = sys.executable if python is None else python
        command = list(self.command)
        if any(a == PYTHON_PLACEHOLDER for a in command) or command[0] in PYTHON_WORDS:
            if not interpreter:
                raise JobSpecError(f"{where}: command names python, but this Python does not know its "
                                   "own path (sys.executable is empty); give the interpreter's path")
            command = [interpreter if a == PYTHON_PLACEHOLDER else a for a in command]
            if command[0] in PYTHON_WORDS:
                command[0] = interpreter
        if SAMPLES_PLACEHOLDER in command:
            if self.samples is None:
                raise JobSpecError(f"{where}: command uses {SAMPLES_PLACEHOLDER} but samples is not set")
            command = [str(self.samples) if a == SAMPLES_PLACEHOLDER else a for a in command]
        return replace(self, command=tuple(command))


MEMBER_KEYS = ("array_id", "array_index", "sweep_name", "trial")
"""Fields of a stored job that malletrain sets (an array's element, a sweep's trial); a job file
that gives one is refused (:func:`load_spec`)."""
GROUP_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""An array's id or a sweep's name."""
MEMBER_INDEX_MAX = 10**9

_KEYS = {"name", "command", "min_nodes", "max_nodes", "profile", "scaling", "samples", "cwd", "env", "trainer",
         "budget_node_hours", "deadline", "launcher", "workers_per_node", "worker_batch", "stall_after", *MEMBER_KEYS}


def _int(obj: Mapping[str, Any], key: str, where: str, default: int | None, low: int, high: int) -> int | None:
    v = obj.get(key, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not low <= v <= high:
        raise JobSpecError(f"{where}: {key} must be an integer >= {low} and <= {high}, got {_short(v)}")
    return v


def _text(value: str, field_name: str, where: str) -> str:
    """A string that can reach the OS: no NUL byte, encodable as UTF-8 (no lone surrogates)."""
    if "\x00" in value:
        raise JobSpecError(f"{where}: {field_name} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise JobSpecError(f"{where}: {field_name} is not valid Unicode (lone surrogate)") from None
    return value


def _utf8_len(value: str) -> int:
    return len(value.encode("utf-8"))


def _command(raw: Any, where: str) -> tuple[str, ...]:
    if isinstance(raw, str):
        raise JobSpecError(f"{where}: command must be a list of strings (no shell), got a string")
    if not isinstance(raw, list) or not raw or not all(isinstance(c, str) and c for c in raw):
        raise JobSpecError(f"{where}: command must be a non-empty list of non-empty strings, got {_short(raw)}")
    if len(raw) > COMMAND_MAX_ARGS:
        raise JobSpecError(f"{where}: command has {len(raw)} words; at most {COMMAND_MAX_ARGS}")
    for i, word in enumerate(raw):
        _text(word, f"command[{i}]", where)
    if sum(_utf8_len(c) + 1 for c in raw) > COMMAND_MAX_BYTES:
        raise JobSpecError(f"{where}: command is longer than {COMMAND_MAX_BYTES} bytes")
    return tuple(raw)


def _default_name(command: tuple[str, ...]) -> str:
    """The job's name when the file gives none: the last word's stem, printable characters only."""
    stem = Path(command[-1]).stem
    clean = "".join(ch for ch in stem if ch.isprintable())[:NAME_MAX_CHARS]
    return clean or "job"


def _name(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise JobSpecError(f"{where}: name must be a non-empty string, got {_short(raw)}")
    _text(raw, "name", where)
    if len(raw) > NAME_MAX_CHARS:
        raise JobSpecError(f"{where}: name is {len(raw)} characters; at most {NAME_MAX_CHARS}")
    bad = next((ch for ch in raw if not ch.isprintable()), None)
    if bad is not None:
        raise JobSpecError(f"{where}: name {_short(raw)} contains the non-printable character {bad!r} "
                           "(newlines, tabs and terminal escape codes are refused)")
    return raw


def _env(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise JobSpecError(f"{where}: env must map names to string values, got {_short(raw)}")
    if len(raw) > ENV_MAX_VARS:
        raise JobSpecError(f"{where}: env has {len(raw)} variables; at most {ENV_MAX_VARS}")
    for key, value in raw.items():
        _text(key, "env key", where)
        if not ENV_KEY.fullmatch(key):
            raise JobSpecError(f"{where}: env key {_short(key)} is not a variable name "
                               "(letters, digits and _, not starting with a digit)")
        if key == ENV_DEVICES and value == "all":
            continue
        if key.upper().startswith(ENV_PREFIX):
            raise JobSpecError(f"{where}: env key {key} is refused: {ENV_PREFIX}* variables are "
                               f"set by the daemon (but {ENV_DEVICES} = \"all\")")
        _text(value, f"env[{key}]", where)
    if sum(_utf8_len(k) + _utf8_len(v) + 2 for k, v in raw.items()) > ENV_MAX_BYTES:
        raise JobSpecError(f"{where}: env is larger than {ENV_MAX_BYTES} bytes")
    return dict(raw)


def _cwd(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise JobSpecError(f"{where}: cwd must be a path string, got {_short(raw)}")
    _text(raw, "cwd", where)
    if _utf8_len(raw) > PATH_MAX_BYTES:
        raise JobSpecError(f"{where}: cwd is longer than {PATH_MAX_BYTES} bytes")
    return raw


def parse_spec(obj: Any, where: str = "job") -> JobSpec:
    """Validate a decoded job file (dict) into a :class:`JobSpec` (structure and limits only)."""
    if not isinstance(obj, dict):
        raise JobSpecError(f"{where}: a job must be a table/object, got {type(obj).__name__}")
    unknown = {str(k) for k in obj} - _KEYS
    if unknown:
        names = ", ".join(_short(k, 40) for k in sorted(unknown))
        raise JobSpecError(f"{where}: unknown field(s) {names}; known: {', '.join(sorted(_KEYS))}")
    command = _command(obj.get("command"), where)
    name = _name(obj["name"], where) if "name" in obj else _default_name(command)
    min_nodes = _int(obj, "min_nodes", where, 1, 1, MAX_NODES_CAP)
    max_nodes = _int(obj, "max_nodes", where, min_nodes, 1, MAX_NODES_CAP)
    assert min_nodes is not None and max_nodes is not None
    if max_nodes < min_nodes:
        raise JobSpecError(f"{where}: max_nodes {max_nodes} < min_nodes {min_nodes}")
    profile = obj.get("profile", False)
    if not isinstance(profile, bool):
        raise JobSpecError(f"{where}: profile must be true or false, got {_short(profile)}")
    samples = _int(obj, "samples", where, None, 1, SAMPLES_MAX)
    scaling = _scaling(obj.get("scaling"), where)
    cwd = _cwd(obj.get("cwd"), where)
    env = _env(obj.get("env", {}), where)
    trainer = _trainer(obj.get("trainer"), where)
    budget = _budget(obj.get("budget_node_hours"), where)
    deadline = _deadline(obj.get("deadline"), where)
    launcher = _launcher(obj.get("launcher"), where)
    workers_per_node = _int(obj, "workers_per_node", where, None, 1, WORKERS_PER_NODE_MAX)
    worker_batch = _int(obj, "worker_batch", where, None, 1, WORKER_BATCH_MAX)
    stall_after = _int(obj, "stall_after", where, None, 1, STALL_AFTER_MAX)
    spec = JobSpec(name, command, min_nodes, max_nodes, profile, scaling, samples, cwd, env, trainer, budget,
                   deadline, launcher, workers_per_node, worker_batch, stall_after=stall_after)
    return _membership(spec, obj, where)


def _membership(spec: JobSpec, obj: Mapping[str, Any], where: str) -> JobSpec:
    """The :data:`MEMBER_KEYS` of a stored job: an array's id and index, or a sweep's name and trial, in pairs."""
    out: dict[str, Any] = {}
    for group, index in (("array_id", "array_index"), ("sweep_name", "trial")):
        if (group in obj) != (index in obj):
            raise JobSpecError(f"{where}: {group} and {index} go together")
        if group not in obj:
            continue
        if not isinstance(obj[group], str) or not GROUP_ID.fullmatch(obj[group]):
            raise JobSpecError(f"{where}: {group} must be 1-64 of A-Z a-z 0-9 _ . -, got {_short(obj[group])}")
        out[group] = obj[group]
        out[index] = _int(obj, index, where, None, 0, MEMBER_INDEX_MAX)
    return replace(spec, **out) if out else spec


def _launcher(raw: Any, where: str) -> Launcher:
    """``launcher``: one of :class:`Launcher`'s values; the default is the in-process elastic one."""
    if raw is None:
        return Launcher.ELASTIC
    known = ", ".join(repr(m.value) for m in Launcher)
    if not isinstance(raw, str):
        raise JobSpecError(f"{where}: launcher must be one of {known}, got {_short(raw)}")
    try:
        return Launcher(raw)
    except ValueError:
        raise JobSpecError(f"{where}: launcher must be one of {known}, got {_short(raw)}") from None


def _budget(raw: Any, where: str) -> float | None:
    """``budget_node_hours``: a finite number > 0."""
    if raw is None:
        return None
    if not isinstance(raw, (int, float)) or isinstance(raw, bool):
        raise JobSpecError(f"{where}: budget_node_hours must be a number of node-hours > 0, got {_short(raw)}")
    try:
        value = float(raw)
    except OverflowError:  # an int beyond float range
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise JobSpecError(f"{where}: budget_node_hours must be a finite number > 0, got {_short(raw)}")
    return value


def _deadline(raw: Any, where: str) -> float | None:
    """``deadline`` as unix seconds: a number, or an ISO 8601 time with a timezone (a string or a TOML
    offset date-time); one without a timezone is refused (the daemon and the submitter may not share one)."""
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise JobSpecError(f"{where}: deadline must be unix seconds or an ISO 8601 time with a timezone, "
                           f"got {_short(raw)}")
    if isinstance(raw, (int, float)):
        try:
            value = float(raw)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value) or value < 0:
            raise JobSpecError(f"{where}: deadline must be finite unix seconds >= 0, got {_short(raw)}")
        return value
    if isinstance(raw, str):
        try:
            when = dt.datetime.fromisoformat(raw.strip())
        except ValueError:
            raise JobSpecError(f"{where}: deadline {_short(raw)} is not an ISO 8601 time "
                               "(e.g. 2026-03-01T12:00:00+00:00) nor unix seconds") from None
    elif isinstance(raw, dt.datetime):
        when = raw
    else:
        raise JobSpecError(f"{where}: deadline must be unix seconds or an ISO 8601 time with a timezone, "
                           f"got {_short(raw)}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise JobSpecError(f"{where}: deadline {_short(str(raw))} has no timezone; add one "
                           "(e.g. Z or +02:00) or give unix seconds")
    return when.timestamp()


def _trainer(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not TRAINER_NAME.fullmatch(raw):
        raise JobSpecError(f"{where}: trainer must be a trainer's name (1-64 of A-Z a-z 0-9 _ . -), "
                           f"got {_short(raw)}")
    return raw


_NODE_COUNT = re.compile(r"[1-9][0-9]{0,9}")


def _scaling(raw: Any, where: str) -> dict[int, float] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise JobSpecError(f"{where}: scaling must map node counts to samples/s, got {_short(raw)}")
    if len(raw) > SCALING_MAX_POINTS:
        raise JobSpecError(f"{where}: scaling has {len(raw)} points; at most {SCALING_MAX_POINTS}")
    out: dict[int, float] = {}
    for k, v in raw.items():
        if isinstance(k, int) and not isinstance(k, bool):
            n = k
        elif isinstance(k, str) and _NODE_COUNT.fullmatch(k):
            n = int(k)
        else:
            raise JobSpecError(f"{where}: scaling key {_short(k)} is not a node count (digits, >= 1)")
        if not 1 <= n <= MAX_NODES_CAP:
            raise JobSpecError(f"{where}: scaling key {_short(k)} must be >= 1 and <= {MAX_NODES_CAP}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not _finite_rate(v):
            raise JobSpecError(f"{where}: scaling[{n}] = {_short(v)} is not a finite rate >= 0")
        out[n] = float(v)
    return out


def _finite_rate(v: int | float) -> bool:
    try:
        f = float(v)
    except OverflowError:  # an int beyond float range
        return False
    return math.isfinite(f) and f >= 0


NODE_SLOTS_KEY = "node_slots"
"""The store's meta key where the daemon records its nodes' shape (:func:`node_slots_text`), for submit."""


def node_slots_text(most: int, shape: str) -> str:
    """The most worker slots a node of the machine has, and the sentence saying where that count comes
    from, as the daemon records them (the store's :data:`NODE_SLOTS_KEY`)."""
    return json.dumps({"most": int(most), "shape": str(shape)})


def node_slots(raw: str | None) -> tuple[int, str] | None:
    """What :func:`node_slots_text` recorded (None: nothing yet, or unreadable)."""
    if raw is None:
        return None
    try:
        obj = json.loads(raw)
        most, shape = int(obj["most"]), str(obj["shape"])
    except (ValueError, TypeError, KeyError):
        return None
    return (most, shape) if most > 0 else None


def check_submit(spec: JobSpec, where: str = "job", machine_nodes: int | None = None,
                 node_shape: str | None = None) -> None:
    """Checks that depend on the world at submit time (``cwd``, the machine's size, ``node_shape``: what
    the daemon recorded, :func:`node_slots_text`), apart from :func:`parse_spec` so a stored job stays readable."""
    if spec.cwd is not None:
        cwd = Path(spec.cwd)
        if not cwd.is_absolute():
            raise JobSpecError(f"{where}: cwd {spec.cwd!r} must be an absolute path (a job file's cwd is "
                               "resolved against the file's directory)")
        try:
            is_dir = stat.S_ISDIR(os.stat(cwd).st_mode)
        except PermissionError:  # (a folder above it is closed to the submitting user)
            raise JobSpecError(f"{where}: cwd {spec.cwd}: permission denied (a folder above it is closed to you)") \
                from None
        except OSError:
            is_dir = False
        if not is_dir:
            raise JobSpecError(f"{where}: cwd {spec.cwd} is not an existing directory")
        if not os.access(cwd, os.X_OK):  # the agent enters it as the job's owner, who submits it
            raise JobSpecError(f"{where}: cwd {spec.cwd}: you cannot enter it (the job runs as you)")
    ranks = spec.max_nodes * (spec.workers_per_node or 1)
    if spec.launcher is Launcher.TORCHRUN and ranks > TORCHRUN_MAX_RANKS:
        raise JobSpecError(f"{where}: a torchrun world of {spec.max_nodes} nodes x {spec.workers_per_node or 1} "
                           f"workers is {ranks} ranks; at most {TORCHRUN_MAX_RANKS} (its places go to every "
                           "rank in one message of the daemon's store)")
    if machine_nodes is not None and spec.min_nodes > machine_nodes:
        raise JobSpecError(f"{where}: min_nodes {spec.min_nodes} is more than the machine's {machine_nodes} nodes")
    if machine_nodes is not None and spec.max_nodes > machine_nodes:
        raise JobSpecError(f"{where}: max_nodes {spec.max_nodes} is more than the machine's {machine_nodes} nodes")
    slots = node_slots(node_shape)
    if slots is not None and spec.workers_per_node is not None and spec.workers_per_node > slots[0]:
        raise JobSpecError(f"{where}: workers_per_node {spec.workers_per_node} is more than this machine's nodes "
                           f"have: {slots[1]}")


def decode_job_file(path: Path, data: bytes) -> Any:
    """The decoded content of a job file (``.json`` or TOML); errors name the file."""
    text = decode_text(path, data, JOB_FILE_MAX_BYTES, "job file", JobSpecError)
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise JobSpecError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobSpecError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise JobSpecError(f"{path}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise JobSpecError(f"{path}: bad value: {exc}") from None


def load_spec(path: str | Path, python: str | None = None) -> JobSpec:
    """Read and check a job file for submission: ``cwd`` resolved against the file's folder (default:
    that folder), and the interpreter rule applied (:meth:`JobSpec.resolved`)."""
    p = Path(path)
    data = read_user_file(p, JOB_FILE_MAX_BYTES, "job file", JobSpecError)  # never /dev/zero nor a FIFO
    return spec_of_file(p, decode_job_file(p, data), python)


def spec_of_file(p: Path, obj: Any, python: str | None = None) -> JobSpec:
    """:func:`load_spec` of a job file already decoded (``obj``): checked, ``cwd`` resolved, the
    interpreter rule applied. A file giving a field malletrain sets (:data:`MEMBER_KEYS`) is refused."""
    given = sorted(k for k in MEMBER_KEYS if isinstance(obj, dict) and k in obj)
    if given:
        raise JobSpecError(f"{p}: {', '.join(given)} is set by malletrain (submit --array, a [sweep] table), "
                           "not by a job file")
    spec = parse_spec(obj, str(p))
    cwd = Path(spec.cwd) if spec.cwd else Path(".")
    cwd = (p.resolve().parent / cwd).resolve()  # links resolved now, by the submitting user (absolute ones too)
    spec = replace(spec, cwd=str(cwd)).resolved(python, str(p))
    check_submit(spec, str(p))
    return spec
