"""A job's scalability: measured points, where they came from, and a fitted model.

The model
---------
Elastic data-parallel training keeps the per-node batch ``B`` fixed and grows the global batch with the node count ``n``
(weak scaling). One step then takes ``T(n) = T_compute + alpha*log2(n) + beta*n``: the compute of one node's batch, the
latency term of a tree/recursive-doubling allreduce, and a term growing with the number of workers (ring-allreduce hops,
stragglers). The per-sample time ``tau(n) = T(n) / (n*B)`` is therefore **linear in three non-negative coefficients**::

    tau(n) = a + b/n + c*log2(n)/n        rate(n) = 1/tau(n) = n / (b + c*log2(n) + a*n)

It is fitted by non-negative least squares on relative error (rows weighted by ``1/tau``), solved exactly by trying
every subset of the three terms (an active-set enumeration, 7 small ``lstsq`` calls). With one point only ``b`` is used
(linear scaling through the origin, the same assumption the allocator's ``throughput_at`` makes below its first point);
with two points at most two terms (``b, c`` preferred). ``c`` alone is never used (it would give an infinite rate on one
node).

Why this and not ``a + b/n + c*log2(n)``: that form models a *fixed* global batch (strong scaling), which is not how
these jobs scale; on the real Summit data (``benchmarks/bench_profiler.py``) the fit gives its log term weight 0 on
every curve, so it degrades to Amdahl's law, with a leave-one-out error of 3.2%, against 1.7% for the model above and
2.3% for piecewise-linear interpolation between measured points.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import Enum
from itertools import combinations
from typing import Callable, Iterable, Mapping

import numpy as np

from curves import throughput_at


class ScalabilityError(ValueError):
    """Unusable scalability data; the message names the node count or the line."""


class Source(Enum):
    """Where a job's scalability came from."""

    USER = "user"
    """The curve the user gave with the job (never measured here)."""
    PROFILED = "profiled"
    """Measured by the job profiling advisor's inverse-order profile."""
    REFINED = "refined"
    """At least one point measured while the job ran under the allocator."""


# Terms of tau(n), by index: 0 a (per-worker), 1 b (compute), 2 c (allreduce latency). Subsets in preference order.
_SUBSETS: tuple[tuple[int, ...], ...] = tuple(
    s for size in (1, 2, 3) for s in sorted(combinations(range(3), size), key=lambda s: (1 not in s, s != (1, 2), s))
    if 0 in s or 1 in s
)


def _features(n: float) -> list[float]:
    return [1.0, 1.0 / n, math.log2(n) / n]


@dataclass(frozen=True)
class ScalingModel:
    """``rate(n) = 1 / (a + b/n + c*log2(n)/n)`` samples/s; coefficients are >= 0."""

    a: float
    b: float
    c: float

    def per_sample_s(self, n: float) -> float:
        f = _features(n)
        return self.a * f[0] + self.b * f[1] + self.c * f[2]

    def predict(self, n: float) -> float:
        """Samples/s at ``n`` nodes (0 for ``n < 1``)."""
        if n < 1:
            return 0.0
        tau = self.per_sample_s(n)
        return 1.0 / tau if tau > 0 else 0.0


def _check_points(points: Mapping[int, float], what: str) -> None:
    """Raise naming ``what`` for a count that is not an int >= 1 or a rate that is not finite > 0."""
    for n, v in points.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ScalabilityError(f"{what}: node count {n!r} is not an int >= 1")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ScalabilityError(f"{what}: rate at {n} nodes is {v!r}, not a finite number > 0")


def fit_model(points: Mapping[int, float]) -> ScalingModel:
    """Fit :class:`ScalingModel` to ``{nodes: samples/s}`` (see the module doc); needs >= 1 point."""
    if not points:
        raise ScalabilityError("fit_model: no measured points")
    _check_points(points, "fit_model")
    return _fit(tuple(sorted(points.items())))


def _fit(items: tuple[tuple[int, float], ...]) -> ScalingModel:
    """:func:`fit_model` of checked, sorted points (a pure function of them: cached, as the same
    curves are fitted again and again while a job's points do not change)."""
    rows = []
    for n, v in items:  # features / tau, tau = 1 / rate
        f = _features(float(n))
        rows.append([v * f[0], v * f[1], v * f[2]])
    # the normal equations of every subset are sub-blocks of the full ones: summed once, row after
    # row as a sum over the rows adds them (the products are symmetric: the lower half mirrors)
    g00 = g01 = g02 = g11 = g12 = g22 = h0 = h1 = h2 = 0.0
    for r0, r1, r2 in rows:
        g00 += r0 * r0
        g01 += r0 * r1
        g02 += r0 * r2
        g11 += r1 * r1
        g12 += r1 * r2
        g22 += r2 * r2
        h0 += r0
        h1 += r1
        h2 += r2
    gram = [[g00, g01, g02], [g01, g11, g12], [g02, g12, g22]]
    rhs = [h0, h1, h2]
    best: tuple[float, list[float]] | None = None
    for subset in _SUBSETS:
        if len(subset) > len(rows):
            continue
        columns = functools.partial(_columns, rows, subset)
        coef = _least_squares([[gram[i][j] for j in subset] + [rhs[i]] for i in subset], columns)
        if coef is None or any(c < 0 or not math.isfinite(c) for c in coef):
            continue
        resid = sum((sum(r[k] * c for k, c in zip(subset, coef)) - 1.0) ** 2 for r in rows)
        if best is None or resid < best[0] - 1e-12:
            full = [0.0, 0.0, 0.0]
            for k, c in zip(subset, coef):
                full[k] = c
            best = (resid, full)
    if best is None:  # cannot happen: the b-only fit has a positive solution
        raise ScalabilityError(f"fit_model: no non-negative fit to {dict(items)}")
    a, b, c = best[1]
    return ScalingModel(a, b, c)


def _columns(rows: list[list[float]], subset: tuple[int, ...]) -> list[list[float]]:
    return [[r[k] for k in subset] for r in rows]


def _lstsq(x: list[list[float]]) -> list[float]:
    coef, *_ = np.linalg.lstsq(np.array(x), np.ones(len(x)), rcond=None)
    return [float(v) for v in coef]


def _least_squares(a: list[list[float]], columns: Callable[[], list[list[float]]]) -> list[float] | None:
    """``argmin |x c - 1|`` for at most 3 columns from its normal equations ``a`` = ``[x'x | x'1]``, by Gaussian
    elimination (a 3x3 system needs no SVD), or numpy's lstsq on ``x = columns()`` when they are near singular."""
    k = len(a)
    a = [row[:] for row in a]
    scale = max(abs(a[i][i]) for i in range(k)) or 1.0
    for col in range(k):
        piv, top = col, abs(a[col][col])  # partial pivoting: the first row of largest magnitude
        for i in range(col + 1, k):
            if abs(a[i][col]) > top:
                piv, top = i, abs(a[i][col])
        if top <= 1e-10 * scale:
            return _lstsq(columns())
        a[col], a[piv] = a[piv], a[col]
        pivot = a[col]
        for i in range(col + 1, k):
            row = a[i]
            f = row[col] / pivot[col]
            for j in range(col, k + 1):
                row[j] -= f * pivot[j]
    out = [0.0] * k
    for i in range(k - 1, -1, -1):
        row = a[i]
        acc = 0.0
        for j in range(i + 1, k):
            acc += row[j] * out[j]
        out[i] = (row[k] - acc) / row[i]
    return out


def model_error(points: Mapping[int, float], held_out: Mapping[int, float]) -> float:
    """Mean ``|predicted - true| / true`` in % over ``held_out``, the model fitted to ``points``."""
    if not held_out:
        raise ScalabilityError("model_error: no held-out points")
    _check_points(held_out, "model_error held_out")
    model = fit_model(points)
    return 100.0 * sum(abs(model.predict(n) - v) / v for n, v in held_out.items()) / len(held_out)


def leave_one_out_errors(points: Mapping[int, float]) -> dict[int, float]:
    """For every interior count (not the smallest or largest): % error when it is held back."""
    ns = sorted(points)
    return {
        h: model_error({n: v for n, v in points.items() if n != h}, {h: points[h]}) for h in ns[1:-1]
    }


def curve_error_pct(predicted: Mapping[int, float], true: Mapping[int, float], counts: Iterable[int]) -> float:
    """Mean ``|predicted - true| / true`` in % over ``counts`` (both curves piecewise-linear). What the simulator's
    ``scalability_error_pct`` reports over the counts a job ran at."""
    errs = []
    for n in counts:
        t = throughput_at(true, n)
        if t <= 0:
            raise ScalabilityError(f"curve_error_pct: true rate at {n} nodes is {t}, not > 0")
        errs.append(abs(throughput_at(predicted, n) - t) / t)
    if not errs:
        raise ScalabilityError("curve_error_pct: no counts")
    return 100.0 * sum(errs) / len(errs)


class Scalability:
    """A job's curve: the user's ``prior`` points and our ``measured`` ones, plus the fitted model. :attr:`points` is
    what the model is fitted to: every measured point, and the prior points at counts not measured, **calibrated** by
    the median ratio measured/prior over the measured counts (a user curve measured on other hardware is usually off by
    a factor, not in shape). Not to be changed once made: :meth:`refine` returns a new object. The :attr:`model` is
    fitted when first read: a curve asked only at its points (the policy's, mostly) never pays for a fit."""

    def __init__(self, prior: Mapping[int, float], measured: Mapping[int, float], source: Source) -> None:
        self.prior: dict[int, float] = dict(prior)
        self.measured: dict[int, float] = dict(measured)
        self.source = source
        _check_points(self.prior, f"{source.value} scalability prior")
        _check_points(self.measured, f"{source.value} scalability measured")
        if not self.prior and not self.measured:
            raise ScalabilityError("scalability has no points (neither prior nor measured)")
        scale = self.calibration
        out = {n: v * scale for n, v in self.prior.items() if n not in self.measured}
        out.update(self.measured)
        self._points = dict(sorted(out.items()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Scalability):
            return NotImplemented
        return (self.prior, self.measured, self.source) == (other.prior, other.measured, other.source)

    __hash__ = None  # type: ignore[assignment]  # (holds dicts)

    def __repr__(self) -> str:
        return f"Scalability(prior={self.prior!r}, measured={self.measured!r}, source={self.source!r})"

    @functools.cached_property
    def model(self) -> ScalingModel:
        """The :class:`ScalingModel` fitted to :attr:`points` (once, when first read)."""
        return fit_model(self._points)

    @classmethod
    def from_user(cls, points: Mapping[int, float]) -> Scalability:
        return cls(prior=points, measured={}, source=Source.USER)

    @classmethod
    def profiled(cls, points: Mapping[int, float]) -> Scalability:
        return cls(prior={}, measured=points, source=Source.PROFILED)

    @property
    def calibration(self) -> float:
        """Median measured/prior ratio over measured counts (1 without both)."""
        if not self.prior or not self.measured:
            return 1.0
        ratios = sorted(v / throughput_at(self.prior, n) for n, v in self.measured.items())
        k = len(ratios)
        return ratios[k // 2] if k % 2 else 0.5 * (ratios[k // 2 - 1] + ratios[k // 2])

    @property
    def points(self) -> dict[int, float]:
        return dict(self._points)

    def predict(self, n: int) -> float:
        """The fitted model's samples/s at ``n`` (not snapped to measured points)."""
        return self.model.predict(n)

    def rate(self, n: int) -> float:
        """Samples/s at ``n``: the point if there is one, else the model."""
        pts = self._points
        return pts[n] if n in pts else self.model.predict(n)

    def scaling_for(self, min_nodes: int, max_nodes: int, counts: Iterable[int] | None = None) -> dict[int, float]:
        """A full curve for ``allocator.Job.scaling``: every count in ``[min_nodes, max_nodes]``
        (or just ``counts``), points exact, the model elsewhere."""
        if min_nodes < 1 or max_nodes < min_nodes:
            raise ScalabilityError(f"scaling_for: bad range [{min_nodes}, {max_nodes}]")
        wanted = range(min_nodes, max_nodes + 1) if counts is None else sorted(set(counts))
        pts = self._points
        return {n: pts[n] if n in pts else self.model.predict(n) for n in wanted}

    def refine(self, n: int, rate: float) -> Scalability:
        """A new curve with ``rate`` measured at ``n`` nodes (replacing an older measurement)."""
        measured = dict(self.measured)
        measured[n] = rate
        return Scalability(prior=self.prior, measured=measured, source=Source.REFINED)


def parse_scaling_table(text: str, origin: str = "<text>") -> dict[str, dict[int, float]]:
    """``model,nodes,samples_per_second`` CSV text (``#`` comment lines) -> ``{model: {nodes: rate}}``. Pure (the caller
    reads the file); errors name ``origin:line``."""
    out: dict[str, dict[int, float]] = {}
    header_seen = False
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if not header_seen:
            if fields != ["model", "nodes", "samples_per_second"]:
                raise ScalabilityError(f"{origin}:{lineno}: expected header model,nodes,samples_per_second, "
                                       f"got {line!r}")
            header_seen = True
            continue
        if len(fields) != 3:
            raise ScalabilityError(f"{origin}:{lineno}: expected 3 fields, got {len(fields)}: {line!r}")
        model, nodes_s, rate_s = fields
        try:
            nodes, rate = int(nodes_s), float(rate_s)
        except ValueError:
            raise ScalabilityError(f"{origin}:{lineno}: bad nodes or rate in {line!r}") from None
        if nodes < 1 or not math.isfinite(rate) or rate <= 0:
            raise ScalabilityError(f"{origin}:{lineno}: nodes must be >= 1 and rate > 0 in {line!r}")
        if nodes in out.setdefault(model, {}):
            raise ScalabilityError(f"{origin}:{lineno}: {model} at {nodes} nodes given twice")
        out[model][nodes] = rate
    if not header_seen:
        raise ScalabilityError(f"{origin}: no header line model,nodes,samples_per_second")
    return out
