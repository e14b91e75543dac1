"""Real, finite job streams: the ``philly`` workload, ``pollux-done`` (a second job list of the same trace,
sampled as Pollux samples its workloads), the ``scarce`` mix and ``--jobs-file`` lists.

The six Pollux models' curves (one simulated node: one 4-GPU node), the Philly stream (work, offered
load, compressed arrivals, rigid sizes) and the scarce mix (:data:`SCARCE_PER_MODEL` jobs of each model
arriving over :data:`SCARCE_ARRIVAL_S` s) are described in docs/research/evaluation.md (real, finite
job streams). Every job may use 1..16 nodes (the measured range).

**Jobs files.** ``name,time,application[,num_replicas,batch_size,samples,budget_node_hours,deadline,``
``commit_interval_s]``: ``time`` in seconds from the start of the replayed window, ``application`` one of the six
models, ``num_replicas`` GPUs (rigid size ``ceil(num_replicas / 4)`` nodes), ``batch_size`` the per-GPU batch,
``samples`` the job's length (default: :data:`DEFAULT_JOB_WORK_S` node-seconds of work at one node),
``budget_node_hours`` and ``deadline`` (seconds from the start, as ``time``) as in the daemon's job file,
``commit_interval_s`` the seconds between the job's checkpoint commits (default: the calibration's).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np

from curves import throughput_at
from simulator.jobs import JobSpec, Workload, WorkloadError
from traces.data import find_data

MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
GPUS_PER_NODE = 4
MAX_NODES = 16
PLACEMENT_NODES = (1, 2, 3, 4)
SCALABILITY_NODES = (6, 8, 12, 16)
PHILLY_FILE = "philly-jobs.csv.gz"
DEFAULT_JOB_WORK_S = 4 * 3600.0  # a jobs-file job without samples: 4 node-hours of work at one node
SCARCE_PER_MODEL = 2  # the scarce mix: 12 jobs, on 64 nodes fewer jobs than nodes
SCARCE_ARRIVAL_S = 600.0
JOBS_FILE_COLUMNS = ("name", "time", "application")
JOBS_FILE_OPTIONAL = ("num_replicas", "batch_size", "samples", "budget_node_hours", "deadline", "commit_interval_s")


@dataclass(frozen=True)
class Measured:
    """One model's measured step times: (nodes, per-GPU batch) -> samples/s."""

    model: str
    rates: dict[tuple[int, int], float]

    def batches(self) -> list[int]:
        """Per-GPU batches measured at every node count."""
        per_count = [{b for (n, b) in self.rates if n == c} for c in PLACEMENT_NODES + SCALABILITY_NODES]
        per_count = [s for s in per_count if s]
        common = set.intersection(*per_count) if per_count else set()
        return sorted(common)

    def curve(self, batch: int | None = None) -> dict[int, float]:
        """Rate by node count at per-GPU ``batch`` (nearest measured; default: the median common one)."""
        choices = self.batches() or sorted({b for _, b in self.rates})
        if not choices:
            raise WorkloadError(f"pollux/{self.model}: no measurements")
        b = choices[len(choices) // 2] if batch is None else min(choices, key=lambda c: (abs(c - batch), c))
        return {n: r for (n, bb), r in sorted(self.rates.items()) if bb == b}


def _data_dir(data_dir: Path | None) -> Path:
    if data_dir is not None:
        return data_dir
    found = find_data(PHILLY_FILE)
    if found is None:
        raise WorkloadError(f"{PHILLY_FILE} not found in the data dir (set MALLETRAIN_DATA)")
    return found.parent


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return list(csv.DictReader(io.StringIO(text)))


def _float(row: dict[str, str], key: str, where: str) -> float:
    try:
        v = float(row[key])
    except (KeyError, TypeError, ValueError):
        raise WorkloadError(f"{where}: field {key!r} is not a number: {row.get(key)!r}") from None
    if not math.isfinite(v):
        raise WorkloadError(f"{where}: field {key!r} is not finite: {row.get(key)!r}")
    return v


@lru_cache(maxsize=16)
def measured(model: str, data_dir: Path | None = None) -> Measured:
    """The Pollux measurements of ``model`` (placements and scalability, whole 4-GPU nodes only)."""
    if model not in MODELS:
        raise WorkloadError(f"unknown application {model!r} (known: {', '.join(MODELS)})")
    base = _data_dir(data_dir) / "pollux" / model
    rates: dict[tuple[int, int], float] = {}
    for k, row in enumerate(_rows(base / "placements.csv")):
        where = f"{base / 'placements.csv'}:{k + 2}"
        placement = row.get("placement", "")
        if not placement or set(placement) != {"4"}:
            continue
        n = len(placement)
        b = int(_float(row, "local_bsz", where))
        rates[(n, b)] = GPUS_PER_NODE * n * b / _float(row, "step_time", where)
    for k, row in enumerate(_rows(base / "scalability.csv")):
        where = f"{base / 'scalability.csv'}:{k + 2}"
        n, replicas = int(_float(row, "num_nodes", where)), int(_float(row, "num_replicas", where))
        if replicas != GPUS_PER_NODE * n:
            continue
        b = int(_float(row, "local_bsz", where))
        rates[(n, b)] = replicas * b / _float(row, "step_time", where)
    if not rates:
        raise WorkloadError(f"{base}: no whole-node measurements")
    return Measured(model, rates)


def curves(data_dir: Path | None = None) -> dict[str, dict[int, float]]:
    """Each model's curve at its default per-GPU batch."""
    return {m: measured(m, data_dir).curve() for m in MODELS}


@dataclass(frozen=True)
class PhillyJob:
    submit: float  # unix seconds
    gpus: int
    gpu_time: float  # GPU-seconds
    duration: float = 0.0  # wall seconds the job ran in the trace


@lru_cache(maxsize=2)
def philly_jobs(path: Path) -> tuple[PhillyJob, ...]:
    """The trace's jobs with a timestamp and a positive GPU time, by submit time."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read: {exc}") from None
    if not rows or rows[0][:4] != ["timestamp", "duration", "num_gpus", "gpu_time"]:
        raise WorkloadError(f"{path}: expected the header timestamp,duration,num_gpus,gpu_time,cluster")
    out = []
    for k, row in enumerate(rows[1:]):
        stamp = row[0].strip() if row else ""
        if not stamp:
            continue  # one row of the trace has none (its README says so)
        where = f"{path}:{k + 2}"
        try:
            t = datetime.fromisoformat(stamp).replace(tzinfo=timezone.utc).timestamp()
            duration, gpus, gpu_time = float(row[1]), int(float(row[2])), float(row[3])
        except (ValueError, IndexError):
            raise WorkloadError(f"{where}: expected a YYYY-MM-DD HH:MM:SS time, duration, num_gpus and gpu_time: "
                                f"{row!r}") from None
        if gpus >= 1 and gpu_time > 0 and math.isfinite(gpu_time):
            out.append(PhillyJob(t, gpus, gpu_time, duration if math.isfinite(duration) else 0.0))
    out.sort(key=lambda j: j.submit)
    if not out:
        raise WorkloadError(f"{path}: no jobs")
    return tuple(out)


def rigid_size(gpus: int) -> int:
    return max(1, min(MAX_NODES, math.ceil(gpus / GPUS_PER_NODE)))


def one_node_rate(curve: dict[int, float]) -> float:
    return throughput_at(curve, 1)


FINISHING_ARRIVAL_SHARE = 0.5  # philly-done: arrivals in the first half of the window
FINISHING_WORK_CAP_SHARE = 0.05  # ... and no job longer than 5% of what 16 nodes at its 1-node rate do in it


def philly_workload(seed: int, duration_s: float, idle_node_seconds: float, offered_load: float,
                    data_dir: Path | None = None, finishing: bool = False) -> Workload:
    """The seeded Philly stream for a replay window of ``duration_s`` with ``idle_node_seconds``;
    ``finishing`` (``philly-done``): arrivals in the first :data:`FINISHING_ARRIVAL_SHARE` of the window
    and each job's work capped at :data:`FINISHING_WORK_CAP_SHARE` of the window at 16 nodes, so that
    every job can finish (the unsaturated regime: what differs is completion time)."""
    if not offered_load > 0 or math.isinf(offered_load):
        raise WorkloadError(f"--offered-load must be a finite number > 0, got {offered_load}")
    if not idle_node_seconds > 0:
        raise WorkloadError("philly workload: the replay window has no idle node-seconds to offer work against")
    base = _data_dir(data_dir)
    jobs = philly_jobs(base / PHILLY_FILE)
    cs = curves(base)
    rng = np.random.default_rng([seed, 18])
    target = offered_load * idle_node_seconds
    # a job's work: its GPU time over 4, capped at what it could do in the window (MAX_NODES nodes at one
    # node's rate each): the rest of a heavy-tailed job lies beyond the window and is never offered in it
    cap = duration_s * MAX_NODES * (FINISHING_WORK_CAP_SHARE if finishing else 1.0)
    works = np.minimum(np.array([j.gpu_time / GPUS_PER_NODE for j in jobs]), cap)
    if works.sum() < target:
        raise WorkloadError(f"philly workload: the whole trace offers {works.sum():.3g} node-s, less than "
                            f"--offered-load {offered_load:g} x {idle_node_seconds:.3g} idle node-s")
    # a seeded start in the trace with enough jobs after it (the trace's cumulative work from there)
    tail = np.cumsum(works[::-1])[::-1]  # work from job i to the end
    last_start = int(np.flatnonzero(tail >= target)[-1])
    first = int(rng.integers(0, last_start + 1))
    stop = first + int(np.searchsorted(np.cumsum(works[first:]), target)) + 1
    chosen = jobs[first:stop]
    # their arrivals, compressed (or stretched) into the window, in the trace's order and spacing
    t0 = chosen[0].submit
    span = (jobs[stop].submit if stop < len(jobs) else chosen[-1].submit + 1.0) - t0
    squeeze = duration_s * (FINISHING_ARRIVAL_SHARE if finishing else 1.0) / span if span > 0 else 0.0
    models = [MODELS[int(i)] for i in rng.integers(len(MODELS), size=len(chosen))]
    specs = []
    for i, (j, m) in enumerate(zip(chosen, models)):
        curve = cs[m]
        specs.append(JobSpec(name=f"philly-{m}#{i}", model=m,
                             samples=float(works[first + i]) * one_node_rate(curve), scaling=curve,
                             min_nodes=1, max_nodes=MAX_NODES, arrival_s=min(duration_s, (j.submit - t0) * squeeze),
                             requested_nodes=rigid_size(j.gpus)))
    label = f"philly{'-done' if finishing else ''} (load {offered_load:g})"
    return Workload(label, str(base / "pollux"), timed=specs, finite=True, models=dict(cs))


POLLUX_MIN_DURATION_S = 60.0
POLLUX_MAX_GPU_TIME_S = 1000 * 3600.0
POLLUX_MODELS_BY_GPU_HOURS: tuple[tuple[float, tuple[str, ...]], ...] = (
    (1.0, ("cifar10", "ncf")), (10.0, ("deepspeech2", "bert")), (100.0, ("yolov3",)), (math.inf, ("imagenet",)))
DAY_S = 86400.0


def pollux_model(gpu_time_s: float, pick: float) -> str:
    """The model Pollux's sampler gives a job of ``gpu_time_s`` GPU-seconds (``pick`` in [0, 1) chooses
    between the two of a class)."""
    for hours, models in POLLUX_MODELS_BY_GPU_HOURS:
        if gpu_time_s < hours * 3600.0:
            return models[min(len(models) - 1, int(pick * len(models)))]
    raise AssertionError("the last class has no upper bound")


def pollux_workload(seed: int, duration_s: float, idle_node_seconds: float, offered_load: float,
                    data_dir: Path | None = None) -> Workload:
    """A second, independent Philly job list (``pollux-done``), sampled as Pollux's artifact samples its workloads: jobs
    of the trace drawn at random (seeded) among those of at least :data:`POLLUX_MIN_DURATION_S` and under
    :data:`POLLUX_MAX_GPU_TIME_S`, until their work reaches ``offered_load`` x ``idle_node_seconds``; each arrives at
    its time of day, the day compressed into the first :data:`FINISHING_ARRIVAL_SHARE` of the window, and its model is
    given by its GPU time (:func:`pollux_model`). Work and sizes as in ``philly-done``: GPU time over 4, capped at
    :data:`FINISHING_WORK_CAP_SHARE` of the window at 16 nodes; rigid size ``ceil(num_gpus / 4)``."""
    if not offered_load > 0 or math.isinf(offered_load):
        raise WorkloadError(f"--offered-load must be a finite number > 0, got {offered_load}")
    if not idle_node_seconds > 0:
        raise WorkloadError("pollux workload: the replay window has no idle node-seconds to offer work against")
    base = _data_dir(data_dir)
    pool = [j for j in philly_jobs(base / PHILLY_FILE)
            if j.duration >= POLLUX_MIN_DURATION_S and j.gpu_time < POLLUX_MAX_GPU_TIME_S]
    cs = curves(base)
    rng = np.random.default_rng([seed, 21])
    target = offered_load * idle_node_seconds
    cap = duration_s * MAX_NODES * FINISHING_WORK_CAP_SHARE
    works = np.minimum(np.array([j.gpu_time / GPUS_PER_NODE for j in pool]), cap)
    if works.sum() < target:
        raise WorkloadError(f"pollux workload: the trace's jobs offer {works.sum():.3g} node-s, less than "
                            f"--offered-load {offered_load:g} x {idle_node_seconds:.3g} idle node-s")
    order = rng.permutation(len(pool))
    stop = int(np.searchsorted(np.cumsum(works[order]), target)) + 1
    chosen = order[:stop]
    picks = rng.random(size=len(chosen))
    arrival = [float((pool[i].submit % DAY_S) / DAY_S * duration_s * FINISHING_ARRIVAL_SHARE) for i in chosen]
    specs = []
    for k in sorted(range(len(chosen)), key=lambda k: (arrival[k], k)):
        j = pool[int(chosen[k])]
        m = pollux_model(j.gpu_time, float(picks[k]))
        specs.append(JobSpec(name=f"pollux-{m}#{len(specs)}", model=m,
                             samples=float(works[int(chosen[k])]) * one_node_rate(cs[m]), scaling=cs[m],
                             min_nodes=1, max_nodes=MAX_NODES, arrival_s=arrival[k],
                             requested_nodes=rigid_size(j.gpus)))
    return Workload(f"pollux-done (load {offered_load:g})", str(base / "pollux"), timed=specs, finite=True,
                    models=dict(cs))


def scarce_workload(seed: int, duration_s: float, data_dir: Path | None = None) -> Workload:
    """The scarce mix (see the module doc): every model :data:`SCARCE_PER_MODEL` times, in a seeded
    order, arrivals spread over :data:`SCARCE_ARRIVAL_S`, none finishing in the window."""
    cs = curves(_data_dir(data_dir))
    rng = np.random.default_rng([seed, 31])
    models = [MODELS[int(i)] for i in rng.permutation(np.repeat(np.arange(len(MODELS)), SCARCE_PER_MODEL))]
    arrivals = np.sort(rng.uniform(0.0, SCARCE_ARRIVAL_S, size=len(models)))
    work_s = 2.0 * max(duration_s, 1.0) * MAX_NODES  # more than 16 nodes at the 1-node rate can do
    specs = [JobSpec(name=f"scarce-{m}#{i}", model=m, samples=work_s * one_node_rate(cs[m]), scaling=cs[m],
                     min_nodes=1, max_nodes=MAX_NODES, arrival_s=float(t), requested_nodes=4)
             for i, (m, t) in enumerate(zip(models, arrivals))]
    return Workload("scarce mix", str(_data_dir(data_dir) / "pollux"), timed=specs, finite=True, models=dict(cs))


def jobs_file_workload(path: str | Path, data_dir: Path | None = None) -> Workload:
    """A job list ``name,time,application[,num_replicas,batch_size,samples,budget_node_hours,deadline,``
    ``commit_interval_s]`` (see the module docstring; a deadline in seconds after the start, as ``time``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadError(f"--jobs-file {p}: cannot read: {exc.strerror or exc}") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in JOBS_FILE_COLUMNS if c not in header]
    unknown = [c for c in header if c not in JOBS_FILE_COLUMNS + JOBS_FILE_OPTIONAL]
    if missing or unknown:
        raise WorkloadError(f"--jobs-file {p}: columns are name,time,application"
                            "[,num_replicas,batch_size,samples,budget_node_hours,deadline,commit_interval_s]"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unknown {', '.join(unknown)}" if unknown else ""))
    base = _data_dir(data_dir)
    specs: list[JobSpec] = []
    for k, raw in enumerate(reader):
        row = {key.strip(): (v or "").strip() for key, v in raw.items() if key}
        where = f"--jobs-file {p}: row {k + 2} ({row.get('name') or 'no name'})"
        app = row.get("application", "")
        if app not in MODELS:
            raise WorkloadError(f"{where}: application {app!r} has no measured curves (known: {', '.join(MODELS)})")
        batch = int(_float(row, "batch_size", where)) if row.get("batch_size") else None
        curve = measured(app, base).curve(batch)
        replicas = int(_float(row, "num_replicas", where)) if row.get("num_replicas") else None
        if replicas is not None and replicas < 1:
            raise WorkloadError(f"{where}: num_replicas must be >= 1, got {replicas}")
        samples = _float(row, "samples", where) if row.get("samples") else DEFAULT_JOB_WORK_S * one_node_rate(curve)
        time_s = _float(row, "time", where)
        budget = _float(row, "budget_node_hours", where) if row.get("budget_node_hours") else None
        deadline = _float(row, "deadline", where) if row.get("deadline") else None
        commit = _float(row, "commit_interval_s", where) if row.get("commit_interval_s") else None
        try:
            specs.append(JobSpec(name=row.get("name") or f"job#{k}", model=app, samples=samples, scaling=curve,
                                 min_nodes=1, max_nodes=MAX_NODES, arrival_s=time_s,
                                 requested_nodes=None if replicas is None else rigid_size(replicas),
                                 budget_node_hours=budget, deadline=deadline, commit_interval_s=commit))
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: {exc}") from None
    if not specs:
        raise WorkloadError(f"--jobs-file {p}: no jobs")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise WorkloadError(f"--jobs-file {p}: job name(s) given twice: {', '.join(dup)}")
    return Workload(str(p), str(base / "pollux"), timed=specs, finite=True,
                    models={m: measured(m, base).curve() for m in sorted({s.model for s in specs})})


def is_jobs_file(path: Path) -> bool:
    """A CSV whose header (after ``#`` lines) has an ``application`` column."""
    if path.suffix.lower() != ".csv":
        return False
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip() and not line.lstrip().startswith("#"):
                    return "application" in [c.strip() for c in line.split(",")]
    except (OSError, UnicodeDecodeError):
        return False
    return False
