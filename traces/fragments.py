"""Idle-fragment and busy-period length models, and the distance between two samples of lengths.

The bottom of :mod:`traces`' generators: :mod:`traces.bursts` and :mod:`traces.synthetic` both
build on it (neither imports the other's internals).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FragmentModel", "ks_distance"]


@dataclass(frozen=True)
class FragmentModel:
    """Idle-fragment lengths ``floor_s + exp(N(mu_k, sigma_k))`` with weights ``w_k``; busy lognormal."""

    floor_s: float
    weights: tuple[float, ...]
    mus: tuple[float, ...]
    sigmas: tuple[float, ...]
    idle_fraction: float
    busy_sigma: float

    def __post_init__(self) -> None:
        k = len(self.weights)
        if k == 0 or len(self.mus) != k or len(self.sigmas) != k:
            raise ValueError(f"weights/mus/sigmas must have one equal, non-zero length: {self}")
        if abs(sum(self.weights) - 1.0) > 1e-6 or min(self.weights) < 0:
            raise ValueError(f"weights must be non-negative and sum to 1: {self.weights}")
        if min(self.sigmas) <= 0 or self.busy_sigma <= 0 or self.floor_s < 0:
            raise ValueError(f"sigmas and busy_sigma must be > 0, floor_s >= 0: {self}")
        if not 0.0 < self.idle_fraction < 1.0:
            raise ValueError(f"idle_fraction must be in (0, 1): {self.idle_fraction}")

    @property
    def mean_idle_s(self) -> float:
        return self.floor_s + float(np.dot(self.weights, self._component_means()))

    @property
    def mean_busy_s(self) -> float:
        f = self.idle_fraction
        return self.mean_idle_s * (1.0 - f) / f

    @property
    def busy_mu(self) -> float:
        return math.log(self.mean_busy_s) - self.busy_sigma**2 / 2

    def _component_means(self) -> np.ndarray:
        return np.exp(np.array(self.mus) + np.array(self.sigmas) ** 2 / 2)

    def sample_idle(self, rng: np.random.Generator, n: int) -> np.ndarray:
        k = rng.choice(len(self.weights), size=n, p=np.array(self.weights))
        return self.floor_s + np.exp(rng.normal(np.array(self.mus)[k], np.array(self.sigmas)[k]))

    def sample_busy(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.exp(rng.normal(self.busy_mu, self.busy_sigma, size=n))

    def sample_idle_length_biased(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Lengths of the fragment covering a random instant (density proportional to length * pdf)."""
        mus, sigmas = np.array(self.mus), np.array(self.sigmas)
        means = np.array(self.weights) * self._component_means()
        from_floor = rng.random(n) < self.floor_s / self.mean_idle_s
        plain = self.sample_idle(rng, n)
        k = rng.choice(len(means), size=n, p=means / means.sum())
        biased = self.floor_s + np.exp(rng.normal(mus[k] + sigmas[k] ** 2, sigmas[k]))
        return np.where(from_floor, plain, biased)

    def sample_busy_length_biased(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.exp(rng.normal(self.busy_mu + self.busy_sigma**2, self.busy_sigma, size=n))


# Fitted once from the Summit node-state log (BFTrainer data, 2021-02-10..17) with
#   python -c "import traces, traces.data as d, traces.synthetic as s; \
#     print(s.fit_fragments(traces.read(d.find_data('summit-2021-02-10_17.nodes.csv.gz'))))"
# tests/test_traces_synthetic.py checks that a fresh fit still gives these numbers.


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    x, y = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if x.size == 0 or y.size == 0:
        raise ValueError(f"KS distance needs two non-empty samples, got sizes {x.size} and {y.size}")
    grid = np.concatenate((x, y))
    fx = np.searchsorted(x, grid, side="right") / x.size
    fy = np.searchsorted(y, grid, side="right") / y.size
    return float(np.max(np.abs(fx - fy)))
