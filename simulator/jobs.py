"""The simulator's job types: a job (:class:`JobSpec`), scaling curves (:class:`ScalingSet`), a source of jobs
(:class:`Workload`). The workload modules build on these and import none of each other's internals (no import circle).
Defaults follow the published evaluation (MalleTrain/BFTrainer): 130M samples a job, 1-64 nodes, 18 s to scale up, 12 s
to scale down."""


from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

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


ELASTIC, TORCHRUN = "elastic", "torchrun"  # the job file's launcher values (malletrain.daemon.jobspec.Launcher)
LAUNCHERS = (ELASTIC, TORCHRUN)


@dataclass(frozen=True)
class JobSpec:
    """One training job to simulate. ``scaling`` is the TRUE throughput (samples/s per node count): progress is always
    computed from it. ``believed_scaling`` is what a policy is told (a user's guess, say); it defaults to the true
    curve."""

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
    requested_nodes: int | None = None  # the count a rigid submission asks for (a trace's GPUs / node)
    budget_node_hours: float | None = None  # the most node-hours it may hold (the daemon's job file key)
    deadline: float | None = None  # when it should be done, in seconds after the start of the replay window
    launcher: str = ELASTIC  # the job file's launcher: "torchrun" restarts every worker at a change of size
    warm_ranks: bool = True  # a torchrun job's ranks start as forks of warm rank servers (False: WARM_RANKS=0)
    commit_interval_s: float | None = None  # seconds between its checkpoint commits (None: the calibration's)
    user: str = ""  # who submitted it, for fair share ("": the workload's one user; SimConfig.users)
    group: str = ""  # the sweep it is a trial of ("": none): a stream of short jobs (policy.sweeps)

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise WorkloadError(f"job {self.name}: launcher {self.launcher!r}: choose {' or '.join(LAUNCHERS)}")
        if not (self.samples > 0) or math.isinf(self.samples):
            raise WorkloadError(f"job {self.name}: samples must be a finite number > 0, got {self.samples!r}")
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise WorkloadError(f"job {self.name}: need 1 <= min_nodes <= max_nodes, "
                                f"got {self.min_nodes}..{self.max_nodes}")
        if self.up_cost_s < 0 or self.down_cost_s < 0:
            raise WorkloadError(f"job {self.name}: rescale costs must be >= 0")
        if self.commit_interval_s is not None and not (0 <= self.commit_interval_s < math.inf):
            raise WorkloadError(f"job {self.name}: commit_interval_s must be a finite number of seconds >= 0, "
                                f"got {self.commit_interval_s!r}")
        if self.requested_nodes is not None and self.requested_nodes < 1:
            raise WorkloadError(f"job {self.name}: requested_nodes must be >= 1, got {self.requested_nodes}")
        if self.arrival_s < 0:
            raise WorkloadError(f"job {self.name}: arrival must be >= 0 s after the start")
        if self.budget_node_hours is not None and not (0 < self.budget_node_hours < math.inf):
            raise WorkloadError(f"job {self.name}: budget_node_hours must be a finite number > 0, "
                                f"got {self.budget_node_hours!r}")
        if self.deadline is not None and not (0 <= self.deadline < math.inf):
            raise WorkloadError(f"job {self.name}: deadline must be a finite number of seconds >= 0 after the "
                                f"start, got {self.deadline!r}")
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
    """Built-in Amdahl-style curves, used only when no scaling file is found. These are SYNTHETIC (not measurements):
    rate(n) = r1 * n / (1 + s (n - 1))."""
    curves = {
        "synthetic-fast": _amdahl(7000.0, 0.012), "synthetic-heavy": _amdahl(1200.0, 0.002),
        "synthetic-linear": _amdahl(5000.0, 0.0), "synthetic-small": _amdahl(3000.0, 0.006),
        HPO_MODEL: _amdahl(2800.0, 0.005),
    }
    return ScalingSet(curves, "synthetic (built in)", synthetic=True)


def load_scaling(path: str | Path) -> ScalingSet:
    """Read ``model,nodes,samples_per_second`` rows (after ``#`` comment lines). The parsing is the profiler's
    (:func:`profiler.parse_scaling_table`); its errors name ``file:line`` and come back here as
    :class:`WorkloadError`."""
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
    from traces.data import find_data  # looked up at the call: a test replaces it

    found = find_data(SCALING_FILE)
    return load_scaling(found) if found is not None else synthetic_scaling()


@dataclass(frozen=True)
class StreamWindow:
    """What a real finite stream is scaled to: the replay window's length and idle node-seconds, and
    the offered load (the stream's work over those idle node-seconds)."""

    duration_s: float
    idle_node_seconds: float
    offered_load: float = 1.0


@dataclass
class Workload:
    """A source of jobs: a seeded endless stream, or a finite list. ``draw()`` gives the next job of the stream
    (``None`` once a finite stream is exhausted); ``timed`` are jobs with their own arrival times (user files)."""

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
