"""A first-principles throughput model for data-parallel training, calibrated on Summit.

One training step of synchronous data parallelism on ``n`` nodes, each with a
per-node batch of ``B`` samples (``GPUS_PER_NODE`` GPUs x a per-GPU batch), takes

    T(n, B) = max(T_compute, T_io) + T_allreduce

    T_compute   = B * (macs / mac_rate + sample_s) + layer_s * layers
    T_io        = B * n * SAMPLE_BYTES / fs_bandwidth
    T_allreduce = 2 (n - 1) / n * BYTES_PER_VALUE * params / bandwidth + latency_s * log2(n)

and the job processes ``n * B / T(n, B)`` samples/s. What each term assumes:

* **Compute** (the brief's "multiply-adds / device rate"): ``macs`` are the forward multiply-adds of one sample
  (:mod:`simulator.netcost`); ``mac_rate`` is the node's *effective* rate for a whole training step (forward + backward,
  about 3x the forward work, at whatever efficiency the GPUs reach). ``sample_s`` is a per-sample cost that does not
  depend on the model (input pipeline, loss). ``layer_s * layers`` is a per-step cost per layer op (kernel launches,
  per-layer synchronisation, memory-bound element-wise passes); it is what makes thin, deep networks (MobileNet,
  ShuffleNet, DenseNet) slower than their MACs say, and it is amortised by larger batches.
* **Input I/O**: every node reads its samples (ImageNet JPEGs of ``SAMPLE_BYTES``) from a shared parallel file system
  that gives the job ``fs_bandwidth`` in total, split over the nodes. Reading overlaps compute (prefetch), hence the
  ``max``. It is what makes very fast models (AlexNet) scale badly at many nodes.
* **Allreduce**: a bandwidth-optimal ring over the nodes on the gradients (fp32) once per step, not overlapped with
  compute (a pessimistic simplification), plus a latency term per doubling of the node count (tree-like phases). One
  node pays nothing: the intra-node allreduce over NVLink is folded into the compute constants.

The reference per-node batch of the measured curves is not published with them; it is taken as :data:`REFERENCE_BATCH`
(32 per GPU). Only ratios are identified: a different reference batch rescales ``bandwidth``, ``latency_s`` and
``fs_bandwidth`` alike and leaves the fitted curves unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from simulator.netcost import Cost

GPUS_PER_NODE = 6  # Summit: 6 V100 (16 GB) per node
GPU_MEMORY_BYTES = 16e9
GPU_RESERVED_BYTES = 2e9  # CUDA context, workspace, allocator slack
BYTES_PER_VALUE = 4  # fp32 weights, gradients and activations
SAMPLE_BYTES = 110e3  # mean ImageNet training JPEG
REFERENCE_PER_GPU_BATCH = 32
REFERENCE_BATCH = GPUS_PER_NODE * REFERENCE_PER_GPU_BATCH
NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)

Curve = Mapping[int, float]


@dataclass(frozen=True)
class Machine:
    """The calibrated constants of one node type and its interconnect (see the module docstring)."""

    mac_rate: float  # effective training MAC/s of one node
    sample_s: float  # model-independent seconds per sample
    layer_s: float  # seconds per layer op per step
    bandwidth: float  # allreduce bytes/s per node
    latency_s: float  # allreduce seconds per doubling of nodes
    fs_bandwidth: float  # shared file-system bytes/s for the whole job (inf: no I/O limit)

    def as_array(self) -> np.ndarray:
        return np.array([self.mac_rate, self.sample_s, self.layer_s, self.bandwidth, self.latency_s,
                         self.fs_bandwidth], dtype=float)


# The result of calibrate() on the data directory's summit-scaling.csv (rounded); used when no
# measured curves are at hand (the synthetic fallback). bench_workloads.py prints the refit.
SUMMIT_V100 = Machine(mac_rate=2.80e13, sample_s=3.77e-5, layer_s=3.79e-4, bandwidth=2.30e10,
                      latency_s=6.3e-5, fs_bandwidth=3.08e10)


def step_seconds(cost: Cost, batch: int, n: int, m: Machine) -> float:
    """Seconds of one synchronous step on ``n`` nodes with a per-node batch ``batch``."""
    if n < 1 or batch < 1:
        raise ValueError(f"need n >= 1 and batch >= 1, got n={n}, batch={batch}")
    compute = batch * (cost.macs / m.mac_rate + m.sample_s) + m.layer_s * cost.layers
    io = batch * n * SAMPLE_BYTES / m.fs_bandwidth
    ring = 2.0 * (n - 1) / n * BYTES_PER_VALUE * cost.params / m.bandwidth
    return max(compute, io) + ring + m.latency_s * math.log2(n)


def io_bound(cost: Cost, batch: int, n: int, m: Machine) -> bool:
    """True when reading the input takes longer than computing a step (the file system limits)."""
    compute = batch * (cost.macs / m.mac_rate + m.sample_s) + m.layer_s * cost.layers
    return batch * n * SAMPLE_BYTES / m.fs_bandwidth > compute


def rate(cost: Cost, batch: int, n: int, m: Machine) -> float:
    """Samples/s of the job on ``n`` nodes."""
    return n * batch / step_seconds(cost, batch, n, m)


def curve(cost: Cost, batch: int, m: Machine, counts: tuple[int, ...] = NODE_COUNTS) -> dict[int, float]:
    """The scaling curve (samples/s by node count), rounded to 0.1 samples/s."""
    return {n: round(rate(cost, batch, n, m), 1) for n in counts}


def efficiency(c: Curve, n: int) -> float:
    """rate(n) / (n * rate(1)): 1 is linear scaling."""
    return float(c[n]) / (n * float(c[1]))


def max_per_gpu_batch(cost: Cost) -> int:
    """The largest per-GPU batch whose activations fit (>= 1). Assumes every layer output of a sample is kept for the
    backward pass (``activations * BYTES_PER_VALUE`` bytes) and that weights, gradients and two optimizer moments (4
    copies of the parameters) stay resident."""
    free = GPU_MEMORY_BYTES - GPU_RESERVED_BYTES - 4 * BYTES_PER_VALUE * cost.params
    return max(1, int(free // (BYTES_PER_VALUE * max(cost.activations, 1))))


@dataclass(frozen=True)
class Calibration:
    """Fitted constants and the error of the model on each measured curve."""

    machine: Machine
    terms: str  # "full" or "basic"
    errors: dict[str, dict[int, float]]  # model -> node count -> (predicted - measured) / measured

    def mean_abs_error(self, model: str) -> float:
        e = self.errors[model]
        return float(np.mean(np.abs(list(e.values()))))

    @property
    def overall(self) -> float:
        """Mean absolute relative error over every measured point."""
        return float(np.mean([abs(v) for e in self.errors.values() for v in e.values()]))


def _predict(theta: np.ndarray, macs: np.ndarray, params: np.ndarray, layers: np.ndarray, n: np.ndarray,
             batch: int) -> np.ndarray:
    mac_rate, sample_s, layer_s, bw, lat, fs = theta
    compute = batch * (macs / mac_rate + sample_s) + layer_s * layers
    io = batch * n * SAMPLE_BYTES / fs
    ring = 2.0 * (n - 1) / n * BYTES_PER_VALUE * params / bw
    return n * batch / (np.maximum(compute, io) + ring + lat * np.log2(n))


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iters: int = 3000,
                step: float = 0.5, tol: float = 1e-12) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (a plain, deterministic Nelder-Mead simplex)."""
    dim = len(x0)
    pts = np.vstack([x0] + [x0 + step * np.eye(dim)[i] for i in range(dim)])
    vals = np.array([f(p) for p in pts])
    for _ in range(iters):
        order = np.argsort(vals, kind="stable")
        pts, vals = pts[order], vals[order]
        if vals[-1] - vals[0] < tol:
            break
        centre = pts[:-1].mean(axis=0)
        worst = pts[-1]
        xr = centre + (centre - worst)
        fr = f(xr)
        if fr < vals[0]:
            xe = centre + 2.0 * (centre - worst)
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centre + 0.5 * (worst - centre)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts[1:] = pts[0] + 0.5 * (pts[1:] - pts[0])
                vals[1:] = [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


def calibrate(measured: Mapping[str, Curve], costs: Mapping[str, Cost], terms: str = "full",
              batch: int = REFERENCE_BATCH, start: Machine = SUMMIT_V100) -> Calibration:
    """Fit :class:`Machine`'s six constants to the measured curves of the models in ``costs`` by Nelder-Mead on squared
    log errors of every (model, node count) point. ``terms="basic"`` fits the brief's two-term model alone, to show what
    the two extra terms buy: compute (``mac_rate``, ``sample_s``) and the ring allreduce (``bandwidth``, ``latency_s``),
    ``layer_s`` = 0 and no I/O limit."""
    if terms not in ("full", "basic"):
        raise ValueError(f"terms must be 'full' or 'basic', got {terms!r}")
    names = [m for m in costs if m in measured]
    if not names:
        raise ValueError("no measured curve for any of the given models")
    rows = [(costs[m], n, float(r)) for m in names for n, r in sorted(measured[m].items())]
    macs = np.array([c.macs for c, _, _ in rows], dtype=float)
    params = np.array([c.params for c, _, _ in rows], dtype=float)
    layers = np.array([c.layers for c, _, _ in rows], dtype=float)
    n = np.array([k for _, k, _ in rows], dtype=float)
    log_y = np.log([r for _, _, r in rows])
    free = [0, 1, 2, 3, 4, 5] if terms == "full" else [0, 1, 3, 4]
    base = start.as_array()
    if terms == "basic":
        base[2], base[5] = 0.0, np.inf

    def theta_of(x: np.ndarray) -> np.ndarray:
        th = base.copy()
        th[free] = np.exp(x)
        return th

    def loss(x: np.ndarray) -> float:
        return float(np.sum((np.log(_predict(theta_of(x), macs, params, layers, n, batch)) - log_y) ** 2))

    x = np.log(start.as_array()[free])
    for _ in range(3):  # restarts: Nelder-Mead stalls on a shrunken simplex
        x = nelder_mead(loss, x)
    th = theta_of(x)
    machine = Machine(*map(float, th))
    pred = _predict(th, macs, params, layers, n, batch)
    errors: dict[str, dict[int, float]] = {m: {} for m in names}
    for (c, k, r), p, m in zip(rows, pred, [m for m in names for _ in measured[m]]):
        errors[m][k] = float(p / r - 1.0)
    return Calibration(machine, terms, errors)

