"""Bursty synthetic traces: nodes released and recalled in groups, at a rate that drifts.

A real scheduler frees and takes back nodes in groups, at a rate that drifts over hours;
independent per-node renewals peak at 402 idle nodes where the real Summit week peaks at 4,083.
Fitted from a real node-state log (docs/research.md): release times are Poisson at ``rate0 *
r(t)``, ``log r`` an Ornstein-Uhlenbeck process (``rate_sigma``, ``rate_tau_s``) capped at
``rate_cap`` and normalised to mean 1; group sizes a quantile table of the real ones, scaled by
``n_nodes / ref_nodes`` and rounded at random (the mean kept); a group of ``g`` is recalled in ``1 +
Poisson(a (g-1)^b)`` subgroups, each after one fragment length (:class:`FragmentModel`). ``rate0``
follows from the idle fraction: mean idle = rate0 x mean group size x mean fragment length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from traces.fragments import FragmentModel
from traces.model import IdleTimeline

GRID_S = 60.0  # step of the rate process, and of the idle-pool series it is fitted on
SIZE_PROBS: tuple[float, ...] = tuple(np.round(np.concatenate((
    np.arange(0.0, 0.95, 0.05), [0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0]
)), 6).tolist())
RATE_SPREAD = 0.9  # share of the idle pool's log spread given to the rate (the rest is group noise)


@dataclass(frozen=True)
class BurstModel:
    """Group sizes, subgroup recall and rate drift; fragment lengths and idle fraction in ``fragments``."""

    fragments: FragmentModel
    size_probs: tuple[float, ...]
    size_quantiles: tuple[float, ...]  # release-group size (nodes) at each probability
    subgroup_a: float
    subgroup_b: float
    rate_sigma: float
    rate_tau_s: float
    rate_cap: float
    peak_fraction: float = 1.0  # the idle pool never exceeds this share of the nodes
    ref_nodes: int = 0  # nodes of the fitted machine; group sizes scale with n_nodes / ref_nodes (0: no scaling)

    def __post_init__(self) -> None:
        p, q = self.size_probs, self.size_quantiles
        if len(p) != len(q) or len(p) < 2 or p[0] != 0.0 or p[-1] != 1.0 or any(np.diff(p) <= 0):
            raise ValueError(f"size_probs must rise from 0 to 1, one per quantile: {p}")
        if min(q) < 1 or any(np.diff(q) < 0):
            raise ValueError(f"size_quantiles must be non-decreasing and >= 1: {q}")
        if self.subgroup_a < 0 or not math.isfinite(self.subgroup_b):
            raise ValueError(f"subgroup_a must be >= 0, subgroup_b finite: {self.subgroup_a}, {self.subgroup_b}")
        if not 0 < self.peak_fraction <= 1:
            raise ValueError(f"peak_fraction must be in (0, 1]: {self.peak_fraction}")
        if not (self.rate_sigma >= 0 and self.rate_tau_s > 0 and self.rate_cap >= 1):
            raise ValueError(f"need rate_sigma >= 0, rate_tau_s > 0, rate_cap >= 1: {self}")

    def sample_sizes(self, rng: np.random.Generator, n: int, n_nodes: int | None = None) -> np.ndarray:
        """Group sizes; on ``n_nodes`` nodes scaled by ``n_nodes / ref_nodes``, rounded at random (mean kept)."""
        logs = np.interp(rng.random(n), self.size_probs, np.log(self.size_quantiles))
        sizes = np.maximum(1.0, np.round(np.exp(logs))) * self._scale(n_nodes)
        whole = np.floor(sizes)
        return (whole + (rng.random(n) < sizes - whole)).astype(np.int64)

    def _scale(self, n_nodes: int | None) -> float:
        return n_nodes / self.ref_nodes if n_nodes is not None and self.ref_nodes > 0 else 1.0

    def mean_size(self, n_nodes: int) -> float:
        """Mean group size on ``n_nodes`` nodes, none above the machine (a deterministic quadrature)."""
        u = (np.arange(20000) + 0.5) / 20000
        sizes = np.maximum(1, np.round(np.exp(np.interp(u, self.size_probs, np.log(self.size_quantiles)))))
        return float(np.minimum(sizes * self._scale(n_nodes), n_nodes).mean())

    def subgroups(self, rng: np.random.Generator, g: int) -> int:
        if g <= 1:
            return 1
        return int(min(g, 1 + rng.poisson(self.subgroup_a * (g - 1) ** self.subgroup_b)))


def fit_bursts(tl: IdleTimeline, fragments: FragmentModel) -> BurstModel:
    """Fit group sizes, subgroup recall and the rate drift of ``tl`` (fragment model given)."""
    release_t, release_g = _release_groups(tl)
    if release_g.size < 20:
        raise ValueError(f"{tl.source}: {release_g.size} release groups, too few to fit bursts")
    a, b = _fit_subgroups(tl)
    sigma, tau, cap = _fit_rate(tl)
    quantiles = np.quantile(release_g.astype(float), SIZE_PROBS, method="inverted_cdf")
    return BurstModel(
        fragments=fragments,
        size_probs=SIZE_PROBS,
        size_quantiles=tuple(float(q) for q in quantiles),
        subgroup_a=round(a, 6),
        subgroup_b=round(b, 6),
        rate_sigma=round(RATE_SPREAD * sigma, 6),
        rate_tau_s=round(tau, 3),
        rate_cap=round(cap, 3),
        peak_fraction=round(max(1, int(idle_series(tl).max())) / tl.n_nodes, 6) if tl.n_nodes else 1.0,
        ref_nodes=tl.n_nodes,
    )


def _release_groups(tl: IdleTimeline) -> tuple[np.ndarray, np.ndarray]:
    """Times with nodes becoming idle, and how many at each."""
    t = tl.times[tl.idle]
    times, counts = np.unique(t, return_counts=True)
    return times, counts


def _fit_subgroups(tl: IdleTimeline) -> tuple[float, float]:
    """``a, b`` of ``E[subgroups - 1] = a (g - 1)^b``: least squares on log2 bins of ``g - 1``."""
    order = np.argsort(tl.node_ids, kind="stable")
    ids, t, st = tl.node_ids[order], tl.times[order], tl.idle[order]
    same_next = np.zeros(ids.shape[0], dtype=bool)
    same_next[:-1] = ids[1:] == ids[:-1]
    opened = np.flatnonzero(st & same_next)
    begin, end = t[opened], t[opened + 1]
    key = np.lexsort((end, begin))
    begin, end = begin[key], end[key]
    new_group = np.ones(begin.size, dtype=bool)
    new_group[1:] = begin[1:] != begin[:-1]
    new_sub = new_group.copy()
    new_sub[1:] |= end[1:] != end[:-1]
    gid = np.cumsum(new_group) - 1
    size = np.bincount(gid)
    subs = np.bincount(gid, weights=new_sub.astype(float))
    many = size >= 2
    if np.count_nonzero(many) < 3:
        return 0.0, 0.0
    bins = np.floor(np.log2(size[many] - 1)).astype(int)
    xs, ys, ws = [], [], []
    for k in np.unique(bins):
        sel = bins == k
        mean_extra = float((subs[many][sel] - 1).mean())
        if mean_extra > 0:
            xs.append(float(np.log(size[many][sel] - 1).mean()))
            ys.append(math.log(mean_extra))
            ws.append(math.sqrt(float(size[many][sel].sum())))  # big groups hold most nodes: weigh by nodes
    if len(xs) < 2:
        return (math.exp(ys[0]) if ys else 0.0), 0.0
    b, log_a = np.polyfit(xs, ys, 1, w=ws)
    return float(math.exp(log_a)), float(b)


def idle_series(tl: IdleTimeline, step: float = GRID_S) -> np.ndarray:
    """The number of idle nodes sampled every ``step`` seconds from ``start``."""
    grid = np.arange(tl.start, tl.end, step)
    t, c = tl.idle_counts()
    return c[np.searchsorted(t, grid, side="right") - 1]


def _fit_rate(tl: IdleTimeline) -> tuple[float, float, float]:
    """Spread and correlation time (1/e of the autocorrelation) of log(1 + idle nodes); peak/mean."""
    pool = idle_series(tl).astype(float)
    y = np.log1p(pool)
    sigma = float(y.std())
    yc = y - y.mean()
    denom = float(np.dot(yc, yc))
    tau = GRID_S
    if denom > 0:
        for lag in range(1, yc.size // 2):
            if float(np.dot(yc[:-lag], yc[lag:])) / denom < math.exp(-1):
                tau = lag * GRID_S
                break
        else:
            tau = yc.size / 2 * GRID_S
    mean = float(pool.mean())
    cap = float(pool.max()) / mean if mean > 0 else 1.0
    return sigma, tau, max(cap, 1.0)


def rate_profile(model: BurstModel, rng: np.random.Generator, steps: int, skip: int = 0) -> np.ndarray:
    """Rate multipliers ``r`` on the ``GRID_S`` grid: exp(OU), capped, mean 1 over ``r[skip:]``."""
    a = math.exp(-GRID_S / model.rate_tau_s)
    noise = rng.normal(0.0, model.rate_sigma * math.sqrt(1 - a * a), steps)
    x = np.empty(steps)
    x[0] = rng.normal(0.0, model.rate_sigma)
    for k in range(1, steps):  # a plain recurrence: ~10k steps a week
        x[k] = a * x[k - 1] + noise[k]
    r = np.exp(x - x.max())
    r /= r[skip:].mean()
    for _ in range(3):  # capping lowers the mean; rescale and cap again
        r = np.minimum(r, model.rate_cap)
        r /= r[skip:].mean()
    return r


@dataclass
class _Events:
    times: list[np.ndarray]
    ids: list[np.ndarray]
    idle: list[np.ndarray]

    def add(self, t: np.ndarray, ids: np.ndarray, idle: bool) -> None:
        self.times.append(t)
        self.ids.append(ids)
        self.idle.append(np.full(ids.shape[0], idle))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.times:
            return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, bool)
        return np.concatenate(self.times), np.concatenate(self.ids), np.concatenate(self.idle)


def simulate(model: BurstModel, n_nodes: int, duration_s: float, rng: np.random.Generator,
             resolution_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw reports (times relative to 0, node ids, idle) over ``[-warm-up, duration_s)``: it starts
    a day (at least ten rate correlation times) early, every node busy, so from 0 on is steady."""
    frag = model.fragments
    warm = max(86400.0, 10 * model.rate_tau_s)
    steps = int(math.ceil((duration_s + warm) / GRID_S))
    r = rate_profile(model, rng, steps, skip=int(warm // GRID_S))
    mean_idle = frag.idle_fraction * n_nodes
    rate0 = mean_idle / (model.mean_size(n_nodes) * frag.mean_idle_s)
    counts = rng.poisson(rate0 * GRID_S * r)
    release = -warm + np.repeat(np.arange(steps) * GRID_S, counts) + rng.random(int(counts.sum())) * GRID_S
    release = np.round(release / resolution_s) * resolution_s
    release = release[release < duration_s]
    sizes = model.sample_sizes(rng, release.size, n_nodes)
    until = np.full(n_nodes, -np.inf)  # when each idle node is recalled; <= now: busy
    most_idle = max(1, int(model.peak_fraction * n_nodes))
    out = _Events([], [], [])
    for now, g in zip(release.tolist(), sizes.tolist()):
        busy = np.flatnonzero(until <= now)
        g = min(g, busy.size, most_idle - (n_nodes - busy.size))
        if g <= 0:
            continue
        picked = rng.choice(busy, g, replace=False)
        lengths = _subgroup_lengths(model, rng, g, resolution_s)
        until[picked] = now + lengths
        out.add(np.full(g, now), picked, True)
        out.add(now + lengths, picked, False)
    return out.arrays()


def _subgroup_lengths(model: BurstModel, rng: np.random.Generator, g: int, resolution_s: float) -> np.ndarray:
    """One fragment length per node of a group of ``g``: equal within each recall subgroup."""
    k = model.subgroups(rng, g)
    raw = model.fragments.sample_idle(rng, k)
    lengths = np.maximum(resolution_s, np.round(raw / resolution_s) * resolution_s)
    if k == 1:
        return np.full(g, lengths[0])
    cuts = np.sort(rng.choice(np.arange(1, g), k - 1, replace=False))
    return np.repeat(lengths, np.diff(np.concatenate(([0], cuts, [g]))))


def idle_pool_ks(a: IdleTimeline, b: IdleTimeline) -> float:
    """KS distance between the time-weighted distributions of the idle fraction (idle nodes / nodes)."""
    va, wa = _pool_distribution(a)
    vb, wb = _pool_distribution(b)
    if wa.sum() <= 0 or wb.sum() <= 0:
        raise ValueError("idle-pool KS needs two timelines with a positive span")
    grid = np.union1d(va, vb)
    return float(np.max(np.abs(_weighted_cdf(va, wa, grid) - _weighted_cdf(vb, wb, grid))))


def _pool_distribution(tl: IdleTimeline) -> tuple[np.ndarray, np.ndarray]:
    t, c = tl.idle_counts()
    weights = np.diff(np.append(t, tl.end))
    return c / max(tl.n_nodes, 1), weights


def _weighted_cdf(values: np.ndarray, weights: np.ndarray, grid: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order]) / weights.sum()
    k = np.searchsorted(v, grid, side="right")
    return np.where(k > 0, cum[np.maximum(k - 1, 0)], 0.0)
