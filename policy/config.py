"""Every knob of the policy, with one set of documented defaults.

``malletrain daemon`` (its ``[policy]`` table), ``malletrain simulate`` and
``malletrain evaluate`` all build a :class:`PolicyConfig`; the simulator's named
policies (:data:`PRESETS`) are this same dataclass with a few fields changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Any, Mapping


class PolicyConfigError(ValueError):
    """A policy knob with a bad value; the message names the knob."""


class Profiling(str, Enum):
    """Which jobs the job profiling advisor profiles (inverse order) before they run."""

    NEVER = "never"
    """No job is profiled; curves come from the user, the prior and what running jobs report."""
    REQUESTED = "requested"
    """Jobs whose spec says ``profile = true`` (the daemon's default)."""
    ALWAYS = "always"
    """Every new job (MalleTrain as published)."""


class Allocation(str, Enum):
    """How node counts are chosen for the admitted jobs."""

    MILP = "milp"
    """The exact allocator (:func:`allocator.solve`) on the believed curves and rescale costs."""
    GREEDY = "greedy"
    """FCFS: each admitted job, in admission order, is grown to its max; nothing shrinks."""
    EQUAL = "equal"
    """An even split of all held nodes over the admitted jobs."""


class CostSource(str, Enum):
    """Where the allocator's rescale costs come from."""

    MEASURED = "measured"
    """The job's measured pauses (median, up and down apart), else the median of the other live jobs',
    else the configured defaults."""
    CONFIGURED = "configured"
    """Always the configured defaults (``0`` for the simulator's oracle)."""


# Tfwd: the horizon over which the allocator weighs a rescale's pause against its gain. Decisions on
# the Summit week come every ~46 s on average and an allocation usually outlives a few of them; of
# 30/60/120/300/900 s, 120 s trained the most samples on that week (chosen on the evaluation week
# itself: issue G re-tunes it on other data).
DEFAULT_TFWD_S = 120.0


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's knobs. Every field has the default the daemon, ``simulate`` and ``evaluate`` use."""

    tfwd_s: float = DEFAULT_TFWD_S
    """Allocator horizon (s)."""
    max_running: int = 10
    """Pjmax: jobs admitted at once (FCFS, batch admission); 0 = no limit."""
    profiling: Profiling = Profiling.REQUESTED
    """Which jobs are profiled before they run."""
    profile_rel_ci: float = 0.05
    """A profiling step (and a refinement) needs a relative 95% CI half-width at most this."""
    profile_time_cap_s: float = 300.0
    """A profiling step ends after this long even when its estimate is not stable (pause included)."""
    profile_counts: str = "default"
    """Counts a profile visits: ``default`` (min, powers of two, max), ``sparse`` (min, middle, max) or
    ``top`` (max/4, max/2, max)."""
    learn: bool = True
    """Refine each job's curve from the rates it reports at whatever count it runs."""
    refine_rel_change: float = 0.05
    """A count's measured rate replaces the believed one when it moved by more than this fraction."""
    rescale_costs: CostSource = CostSource.MEASURED
    """Where rescale costs come from."""
    default_up_cost_s: float = 10.0
    """Scale-up pause before any was measured (s)."""
    default_down_cost_s: float = 5.0
    """Scale-down pause before any was measured (s)."""
    prior: tuple[tuple[int, float], ...] | None = None
    """A population curve ``((nodes, samples/s), ...)`` for jobs with no curve of their own; its level
    is calibrated to what a job measures. None: linear from the median per-node rate measured so far."""
    allocation: Allocation = Allocation.MILP
    """How node counts are chosen."""
    method: str = "auto"
    """:func:`allocator.solve` method."""

    def __post_init__(self) -> None:
        for name, lo in (("tfwd_s", 0.0), ("profile_rel_ci", 0.0), ("profile_time_cap_s", 0.0)):
            _positive_finite(name, getattr(self, name), lo)
        for name in ("refine_rel_change", "default_up_cost_s", "default_down_cost_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise PolicyConfigError(f"policy.{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.max_running, int) or isinstance(self.max_running, bool) \
                or not 0 <= self.max_running <= 1_000_000:
            raise PolicyConfigError(f"policy.max_running must be an integer in 0..1000000, got {self.max_running!r}")
        for name, enum in (("profiling", Profiling), ("allocation", Allocation), ("rescale_costs", CostSource)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(value))
            except ValueError:
                choices = ", ".join(m.value for m in enum)
                raise PolicyConfigError(f"policy.{name} {value!r}: choose one of {choices}") from None
        if self.profile_counts not in ("default", "sparse", "top"):
            raise PolicyConfigError(f"policy.profile_counts {self.profile_counts!r}: choose default, sparse or top")
        if not isinstance(self.learn, bool):
            raise PolicyConfigError(f"policy.learn must be true or false, got {self.learn!r}")
        if self.prior is not None:
            object.__setattr__(self, "prior", _curve("policy.prior", self.prior))

    @property
    def prior_curve(self) -> dict[int, float] | None:
        return dict(self.prior) if self.prior is not None else None

    def with_prior(self, curve: Mapping[int, float] | None) -> "PolicyConfig":
        return replace(self, prior=None if curve is None else tuple(sorted(curve.items())))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.value if isinstance(v, Enum) else ([list(p) for p in v] if f.name == "prior" and v else v)
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "policy") -> "PolicyConfig":
        """From a ``[policy]`` table; unknown keys and bad values raise errors naming ``where.key``."""
        if not isinstance(data, Mapping):
            raise PolicyConfigError(f"{where} must be a table, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            raise PolicyConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        kwargs = dict(data)
        if "prior" in kwargs and kwargs["prior"] is not None:
            prior = kwargs["prior"]
            if isinstance(prior, Mapping):
                kwargs["prior"] = tuple((_int_key(f"{where}.prior", k), v) for k, v in prior.items())
        try:
            return cls(**kwargs)
        except PolicyConfigError as exc:
            raise PolicyConfigError(str(exc).replace("policy.", f"{where}.", 1)) from None
        except TypeError as exc:
            raise PolicyConfigError(f"{where}: {exc}") from None


def _positive_finite(name: str, v: Any, lo: float) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not v > lo:
        raise PolicyConfigError(f"policy.{name} must be a finite number > {lo:g}, got {v!r}")


def _int_key(where: str, k: Any) -> int:
    try:
        n = int(k)
    except (TypeError, ValueError):
        raise PolicyConfigError(f"{where}: node count {k!r} is not an integer") from None
    return n


def _curve(where: str, points: Any) -> tuple[tuple[int, float], ...]:
    try:
        pairs = [(int(n), float(r)) for n, r in points]
    except (TypeError, ValueError):
        raise PolicyConfigError(f"{where} must be (nodes, samples/s) pairs, got {points!r}") from None
    if not pairs:
        raise PolicyConfigError(f"{where} is empty")
    for n, r in pairs:
        if not 1 <= n <= 1_000_000 or not math.isfinite(r) or r <= 0:
            raise PolicyConfigError(f"{where}: point ({n}, {r}) needs 1 <= nodes <= 1000000 and a finite rate > 0")
    if len({n for n, _ in pairs}) != len(pairs):
        raise PolicyConfigError(f"{where}: a node count is given twice")
    return tuple(sorted(pairs))


# The simulator's named policies: this config with a few fields changed. What a preset cannot say
# (the true curves, the freetrain user's error model, free rescales) is ground truth the simulator adds.
PRESETS: dict[str, dict[str, Any]] = {
    # MalleTrain as published: profile every new job in inverse order, then refine online
    "malletrain": {"profiling": Profiling.ALWAYS},
    # FreeTrain: trust the user's curve; nothing is profiled or learned
    "freetrain": {"profiling": Profiling.NEVER, "learn": False},
    # the information ceiling: the true curves as the user's, measured rescale costs
    "milp-true": {"profiling": Profiling.NEVER, "learn": False},
    # upper bound: the true curves and free rescales
    "oracle": {"profiling": Profiling.NEVER, "learn": False, "rescale_costs": CostSource.CONFIGURED,
               "default_up_cost_s": 0.0, "default_down_cost_s": 0.0},
    "greedy": {"profiling": Profiling.NEVER, "learn": False, "allocation": Allocation.GREEDY},
    "equal": {"profiling": Profiling.NEVER, "learn": False, "allocation": Allocation.EQUAL},
}


def preset(name: str, base: PolicyConfig | None = None, **overrides: Any) -> PolicyConfig:
    """``base`` (default :class:`PolicyConfig`) with preset ``name``'s fields, then ``overrides``."""
    try:
        fields_ = PRESETS[name]
    except KeyError:
        raise PolicyConfigError(f"unknown policy {name!r}; choose one of {', '.join(PRESETS)}") from None
    return replace(base if base is not None else PolicyConfig(), **{**fields_, **overrides})
