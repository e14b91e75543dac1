"""Generated job streams for the simulator: ``nas``, ``hpo``, ``stress``, ``imagenet7``.

Every stream is seeded and offline. Rates and curves of ``nas`` and ``hpo`` come from :mod:`simulator.perfmodel`
(calibrated on the measured Summit curves when they are at hand, else its stored Summit constants) applied to analytic
network costs (:mod:`simulator.netcost`, :mod:`simulator.nb101`).

* ``nas``: each job trains one NASBench-101-like architecture (:func:`simulator.nb101.sample_cell`) at 224x224 with a
  per-GPU batch of ``min(32, what fits in 16 GB)``. With the published skeleton at 224x224 (a full-resolution
  128-channel stem), these networks cost 7-80 GMACs per sample (p10-p90) for 1-12M parameters, so compute dwarfs the
  allreduce and they scale almost linearly (efficiency at 64 nodes about 0.98): what varies is their rate (about 10x)
  and their length.
* ``hpo``: each job draws a model of :data:`HPO_MODELS` and a per-GPU batch from :data:`HPO_PER_GPU_BATCHES` (capped by
  memory): small batches amortise the allreduce and per-layer costs over fewer samples, so they scale worse. Its trials
  are searches of :data:`HPO_SEARCH_TRIALS` consecutive trials each (``JobSpec.group``), and the policy treats them as a
  sweep's trials: a stream admitted within its bound, a trial near its end not grown (:mod:`policy.sweeps`), the very
  rules the daemon applies to a ``[sweep]`` or a job array.
* ``stress``: labelled Amdahl / USL curves that scale badly, some past a peak
  (``rate(n) = r1 n / (1 + s (n - 1) + k n (n - 1))``), where knowing the curve matters.
* ``imagenet7``: the 7 measured curves drawn uniformly (the former ``nas``), unchanged.

**Job length.** ImageNet-1k has :data:`IMAGENET_TRAIN` training images; a job trains a whole number of epochs. ``nas``
uses the NASBench-101 epoch budgets (4, 12, 36, 108) weighted 27:9:3:1, and ``hpo`` the budgets (10, 30, 90) weighted
9:3:1, as in one successive-halving bracket with eta = 3 (many short trials, few long ones). ``stress`` trains a
log-uniform 5-100 epochs. ``imagenet7`` keeps the published evaluation's 130M samples (about 100 epochs).

``Workload.models`` (what a policy may know, e.g. freetrain's mean prior): for ``hpo`` and ``imagenet7`` the curve of
each model a stream draws from, for ``nas`` and ``stress`` a seeded population of :data:`POPULATION` draws (not jobs).
"""

from __future__ import annotations

import math
import random
import zlib
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator

import numpy as np

from simulator import nb101
from simulator.netcost import MEASURED_MODELS, REFERENCE_MODELS, Cost
from simulator.perfmodel import (
    GPUS_PER_NODE, NODE_COUNTS, SUMMIT_V100, Calibration, Machine, calibrate, curve, max_per_gpu_batch,
)
from simulator.jobs import DEFAULT_SAMPLES, Curve, JobSpec, ScalingSet, Workload, WorkloadError

IMAGENET_TRAIN = 1_281_167
NAS_EPOCHS = (4, 12, 36, 108)
HPO_EPOCHS = (10, 30, 90)
ETA = 3  # successive halving: each budget has ETA times fewer trials than the one below
STRESS_EPOCHS = (5.0, 100.0)
NAS_PER_GPU_BATCH = 32
HPO_PER_GPU_BATCHES = (8, 16, 32, 64, 128, 256)
HPO_MODELS = tuple(REFERENCE_MODELS)  # the 7 measured models and resnet50
HPO_SEARCH_TRIALS = 12  # the hpo stream's trials are searches of this many consecutive trials each
POPULATION = 16
STREAMS = ("nas", "hpo", "stress", "imagenet7")


@dataclass(frozen=True)
class Draw:
    """One generated job before it becomes a :class:`JobSpec`: what it is and how it scales."""

    model: str  # a label: "nb101-<ops>-<edges>", "<model>-b<per-GPU batch>", "stress-..."
    curve: dict[int, float]
    samples: float
    params: int = 0
    macs: int = 0
    per_node_batch: int = 0


def _key(scaling: ScalingSet) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...] | None:
    if scaling.synthetic or not all(m in scaling.curves for m in MEASURED_MODELS):
        return None
    return tuple((m, tuple(sorted(scaling.curves[m].items()))) for m in MEASURED_MODELS)


@lru_cache(maxsize=8)
def _calibrated(key: tuple[tuple[str, tuple[tuple[int, float], ...]], ...]) -> Calibration:
    measured = {m: dict(points) for m, points in key}
    return calibrate(measured, reference_costs())


def calibration(scaling: ScalingSet) -> Calibration | None:
    """The fit on ``scaling`` when it holds the 7 measured models (cached), else ``None``."""
    key = _key(scaling)
    return None if key is None else _calibrated(key)


def machine_for(scaling: ScalingSet) -> Machine:
    """Calibrated on the measured curves when present, else the stored Summit constants."""
    cal = calibration(scaling)
    return SUMMIT_V100 if cal is None else cal.machine


@lru_cache(maxsize=1)
def reference_costs() -> dict[str, Cost]:
    return {m: f() for m, f in REFERENCE_MODELS.items()}


def _epochs(rng: np.random.Generator, budgets: tuple[int, ...]) -> int:
    """A budget of one successive-halving bracket: weights ETA^(k-1), ..., ETA, 1. ``rng.choice(len(budgets),
    p=weights)`` is numpy's search of one ``rng.random()`` in the weights' cdf (``searchsorted(side="right")``); the
    same search here skips choice's checks of ``p``, which cost ten times the draw (a test holds the two equal)."""
    return int(budgets[bisect_right(_budget_cdf(budgets), rng.random())])


@lru_cache(maxsize=8)
def _budget_cdf(budgets: tuple[int, ...]) -> tuple[float, ...]:
    """The cdf numpy's ``choice`` makes of :func:`_epochs`'s weights."""
    w = float(ETA) ** np.arange(len(budgets) - 1, -1, -1)
    cdf = (w / w.sum()).cumsum()
    cdf /= cdf[-1]
    return tuple(cdf.tolist())


@lru_cache(maxsize=4096)
def _nas_network(spec: nb101.CellSpec, machine: Machine) -> tuple[Cost, int, tuple[tuple[int, float], ...]]:
    """Cost, node batch and curve of a cell's network. Cached: a week's stream draws about 2,500
    distinct cells in 7,000 jobs (the small ones again and again)."""
    cost = nb101.network_cost(spec)
    batch = GPUS_PER_NODE * min(NAS_PER_GPU_BATCH, max_per_gpu_batch(cost))
    return cost, batch, tuple(curve(cost, batch, machine).items())


def nas_draw(rng: np.random.Generator, machine: Machine) -> Draw:
    """One NASBench-101-like job (see the module docstring)."""
    spec = nb101.sample_cell(rng)
    cost, batch, points = _nas_network(spec, machine)
    label = "nb101-" + spec.label().replace("|", "-")
    return Draw(label, dict(points), float(_epochs(rng, NAS_EPOCHS) * IMAGENET_TRAIN),
                cost.params, cost.macs, batch)  # each job its own curve dict


def hpo_draw(rng: np.random.Generator, machine: Machine) -> Draw:
    """One HPO trial: a model of :data:`HPO_MODELS` and a per-GPU batch (capped by memory)."""
    model = HPO_MODELS[int(rng.integers(len(HPO_MODELS)))]
    cost = reference_costs()[model]
    per_gpu = min(int(rng.choice(HPO_PER_GPU_BATCHES)), max_per_gpu_batch(cost))
    batch = GPUS_PER_NODE * per_gpu
    return Draw(f"{model}-b{per_gpu}", curve(cost, batch, machine),
                float(_epochs(rng, HPO_EPOCHS) * IMAGENET_TRAIN), cost.params, cost.macs, batch)


def usl_curve(r1: float, serial: float, crosstalk: float, counts: tuple[int, ...] = NODE_COUNTS) -> dict[int, float]:
    """``r1 n / (1 + serial (n - 1) + crosstalk n (n - 1))``: Amdahl when ``crosstalk`` = 0."""
    return {n: round(r1 * n / (1.0 + serial * (n - 1) + crosstalk * n * (n - 1)), 1) for n in counts}


def stress_draw(rng: np.random.Generator, machine: Machine) -> Draw:
    """A job that scales badly: Amdahl with a serial share log-uniform in [2%, 50%]; one in three
    also has a crosstalk term that makes it slow down past a peak (USL)."""
    model = MEASURED_MODELS[int(rng.integers(len(MEASURED_MODELS)))]
    r1 = curve(reference_costs()[model], GPUS_PER_NODE * 32, machine, (1,))[1]
    serial = float(math.exp(rng.uniform(math.log(0.02), math.log(0.5))))
    crosstalk = float(math.exp(rng.uniform(math.log(1e-4), math.log(5e-3)))) if rng.random() < 1 / 3 else 0.0
    kind = "usl" if crosstalk else "amdahl"
    epochs = math.exp(rng.uniform(*map(math.log, STRESS_EPOCHS)))
    label = f"stress-{kind}-{model}-s{serial:.3f}" + (f"-k{crosstalk:.4f}" if crosstalk else "")
    return Draw(label, usl_curve(r1, serial, crosstalk), float(round(epochs * IMAGENET_TRAIN)))


DRAWS: dict[str, Callable[[np.random.Generator, Machine], Draw]] = {
    "nas": nas_draw, "hpo": hpo_draw, "stress": stress_draw,
}


def _rng(seed: int, stream: str, part: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(f"{stream}/{part}".encode())])


def draws(stream: str, seed: int, machine: Machine = SUMMIT_V100) -> Iterator[Draw]:
    """The endless seeded sequence of draws of a generated stream."""
    draw = DRAWS[stream]
    rng = _rng(seed, stream, "jobs")
    while True:
        yield draw(rng, machine)


def _specs(stream: str, seed: int, machine: Machine, limit: int | None) -> Iterator[JobSpec]:
    for i, d in enumerate(draws(stream, seed, machine)):
        if limit is not None and i >= limit:
            return
        group = f"hpo-search-{i // HPO_SEARCH_TRIALS}" if stream == "hpo" else ""  # consecutive trials: a search
        yield JobSpec(name=f"{d.model}#{i}", model=d.model, samples=d.samples, scaling=d.curve, group=group)


def _population(stream: str, seed: int, machine: Machine) -> dict[str, dict[int, float]]:
    if stream == "hpo":  # the candidate models at the reference batch
        costs = reference_costs()
        return {m: curve(costs[m], GPUS_PER_NODE * 32, machine) for m in HPO_MODELS}
    rng = _rng(seed, stream, "population")
    out: dict[str, dict[int, float]] = {}
    for _ in range(POPULATION):
        d = DRAWS[stream](rng, machine)
        out[d.model] = d.curve
    return out


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


def make_stream(name: str, scaling: ScalingSet, seed: int = 0, n_jobs: int | None = None) -> Workload:
    """The :class:`Workload` of a generated stream (``nas``, ``hpo``, ``stress``, ``imagenet7``)."""
    if n_jobs is not None and n_jobs < 1:
        raise WorkloadError(f"--jobs must be >= 1, got {n_jobs}")
    finite = n_jobs is not None
    if name == "imagenet7":
        return Workload("imagenet7", scaling.source, _nas_stream(scaling, seed, n_jobs), finite=finite,
                        synthetic=scaling.synthetic, models={m: scaling.curves[m] for m in scaling.nas_models})
    if name not in DRAWS:
        raise WorkloadError(f"unknown generated workload {name!r} (known: {', '.join(STREAMS)})")
    machine = machine_for(scaling)
    return Workload(name, scaling.source, _specs(name, seed, machine, n_jobs), finite=finite,
                    synthetic=scaling.synthetic, models=_population(name, seed, machine))
