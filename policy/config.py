"""Every knob of the policy, with one set of documented defaults: the daemon's ``[policy]`` table, ``simulate`` and
``evaluate`` all build a :class:`PolicyConfig`; the simulator's named policies (:data:`PRESETS`) change a few fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping, cast

from allocator.solve import METHODS


class PolicyConfigError(ValueError):
    """A policy knob with a bad value; the message names the knob."""


MAX_NUMBER = 1e15
"""Any number in a ``[policy]`` table at most this (no knob is anywhere near; huge ints overflow floats)."""


class Profiling(str, Enum):
    """Which jobs the job profiling advisor profiles (inverse order) before they run."""

    NEVER = "never"
    """No job is profiled; curves come from the user, the prior and what running jobs report."""
    REQUESTED = "requested"
    """Jobs whose spec says ``profile = true``, and no others (the default is ``GATED``)."""
    ALWAYS = "always"
    """Every new job (MalleTrain as published: the ``jpa`` preset)."""
    GATED = "gated"
    """Jobs whose spec asks for it, and any other only when a profile pays (nodes scarce, the curve still a prior,
    the expected gain over its remaining work above the cost): never borrowing, never blocking the queue."""


class Admission(str, Enum):
    """How many jobs hold a slot."""

    FIXED = "fixed"
    """At most ``max_running`` (Pjmax) jobs, FCFS, batch admission (MalleTrain as published)."""
    ADAPTIVE = "adaptive"
    """Pjmax is the floor: while the nodes exceed what the admitted jobs can absorb (their max, or their believed
    knee), further jobs are admitted FCFS; when nodes go, the newest beyond Pjmax are suspended first."""


class Objective(str, Enum):
    """What the allocator maximises."""

    WORK = "work"
    """Each job's rate in 1-node equivalents (``rate(n) / rate(1)``), so jobs of different sample costs count alike."""
    SAMPLES = "samples"
    """Raw samples/s summed over the jobs (MalleTrain as published)."""
    COMPLETION = "completion"
    """Work while jobs wait in the queue; once every job is admitted, each job's work weighted by how soon it can
    finish (the median remaining work over its own, within 1/4..4): a node goes where it saves the most JCT."""


class Horizon(str, Enum):
    """The horizon over which a rescale's pause is weighed against its gain."""

    TFWD = "tfwd"
    """The fixed ``tfwd_s``."""
    LEARNED = "learned"
    """The expected remaining idle time of the nodes on offer (:mod:`policy.valuation`); ``tfwd_s`` until enough
    fragments were seen."""


class Allocation(str, Enum):
    """How node counts are chosen for the admitted jobs."""

    MILP = "milp"
    """The exact allocator (:func:`allocator.solve`) on the believed curves and rescale costs."""
    GREEDY = "greedy"
    """FCFS: each admitted job, in admission order, is grown to its max; nothing shrinks."""
    EQUAL = "equal"
    """An even split of all held nodes over the admitted jobs."""


class Fairness(str, Enum):
    """How nodes are shared between users (:mod:`policy.fairness`)."""

    NONE = "none"
    """No shares: the objective alone decides (a job whose curve claims more can hold every node)."""
    EQUAL = "equal"
    """Each user with admitted work gets an equal share of the held nodes (the default; :mod:`policy.fairness`)."""
    WEIGHTED = "weighted"
    """As ``equal``, each user's share in proportion to its weight in ``user_weights`` (1 if not named)."""


class CostSource(str, Enum):
    """Where the allocator's rescale costs come from."""

    MEASURED = "measured"
    """The job's measured pauses (median, up and down apart), else the other live jobs', else the defaults."""
    CONFIGURED = "configured"
    """Always the configured defaults (``0`` for the simulator's oracle)."""


# Tfwd: the horizon over which the allocator weighs a rescale's pause against its gain. Decisions on
# the Summit week come every ~46 s on average and an allocation usually outlives a few of them; of
# 30/60/120/300/900 s, 120 s trained the most samples on that week (chosen on the evaluation week
# itself: re-tune it on other data before trusting it elsewhere).
DEFAULT_TFWD_S = 120.0


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's knobs. Every field has the default the daemon, ``simulate`` and ``evaluate`` use."""

    tfwd_s: float = DEFAULT_TFWD_S
    """Allocator horizon (s)."""
    max_running: int = 10
    """Pjmax: jobs admitted at once (FCFS, batch admission); 0 = no limit. With adaptive admission, the floor."""
    admission: Admission = Admission.ADAPTIVE
    """``adaptive`` (Pjmax is a floor) or ``fixed`` (Pjmax is a cap)."""
    admission_cap: int = 0
    """Adaptive admission admits at most this many jobs in all; 0 = no limit (the default: on the whole Summit
    machine a cap of 100 made jobs wait for about half their completion time, the same work done)."""
    admission_knee: float = 0.75
    """Adaptive admission counts a job as able to use nodes up to its believed knee: past it a node adds less than
    this fraction of its per-node rate at its min (0: its max). 0.75 rather than 0.5: a believed knee sits above
    the true one until several counts are measured, so 0.5 admitted too few (regret 8.8% on hpo, 4.5% on stress)."""
    profiling: Profiling = Profiling.GATED
    """Which jobs are profiled before they run."""
    profile_min_work_s: float = 1800.0
    """Gated profiling skips a job whose remaining work at its max count is shorter than this (s)."""
    profile_gain_fraction: float = 0.1
    """Gated profiling: the fraction of a mis-sized job's rate a profile is expected to win back."""
    objective: Objective = Objective.WORK
    """What the allocator maximises; see :class:`Objective`."""
    horizon: Horizon = Horizon.TFWD
    """``tfwd`` (fixed) or ``learned`` (node valuation); see :class:`Horizon`."""
    horizon_min_s: float = 30.0
    """Learned horizon: lower clip (s)."""
    horizon_max_s: float = 1800.0
    """Learned horizon: upper clip (s)."""
    deadline_weight: float = 2.0
    """A job whose deadline can be met, but not at its present count, has its rate weighted by this (1: ignored)."""
    profile_rel_ci: float = 0.05
    """A profiling step (and a refinement) needs a relative 95% CI half-width at most this."""
    profile_time_cap_s: float = 300.0
    """A profiling step ends after this long even when its estimate is not stable (pause included)."""
    profile_counts: str = "default"
    """Counts a profile visits: ``default`` (min, powers of two, max), ``sparse`` (min, middle, max), ``top``."""
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
    """A population curve ``((nodes, samples/s), ...)`` for jobs with no curve of their own (its level calibrated to
    what a job measures); None: linear from the median per-node rate measured so far."""
    allocation: Allocation = Allocation.MILP
    """How node counts are chosen."""
    method: str = "auto"
    """:func:`allocator.solve` method."""
    fairness: Fairness = Fairness.EQUAL
    """How nodes are shared between users: ``none``, ``equal`` (the default) or ``weighted``."""
    user_weights: tuple[tuple[str, float], ...] = ()
    """``weighted`` fairness: each named user's weight (``{ user = weight }``, > 0; others weigh 1)."""
    fair_wait_s: float = 10.0
    """The longest a user with admitted work is left below its share (s) before every job is held to its share."""
    stream_share: float = 0.5
    """The most of the Pjmax slots one sweep's or array's jobs hold at once (at least 1; 0: no bound;
    :mod:`policy.sweeps`)."""

    def __post_init__(self) -> None:
        for name, lo in (("tfwd_s", 0.0), ("profile_rel_ci", 0.0), ("profile_time_cap_s", 0.0),
                         ("horizon_min_s", 0.0), ("horizon_max_s", 0.0), ("deadline_weight", 0.0)):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not v > lo:
                raise PolicyConfigError(f"policy.{name} must be a finite number > {lo:g}, got {v!r}")
        for name in ("refine_rel_change", "default_up_cost_s", "default_down_cost_s", "profile_min_work_s",
                     "profile_gain_fraction", "admission_knee", "fair_wait_s", "stream_share"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise PolicyConfigError(f"policy.{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.max_running, int) or isinstance(self.max_running, bool) \
                or not 0 <= self.max_running <= 1_000_000:
            raise PolicyConfigError(f"policy.max_running must be an integer in 0..1000000, got {self.max_running!r}")
        if not isinstance(self.admission_cap, int) or isinstance(self.admission_cap, bool) \
                or not 0 <= self.admission_cap <= 1_000_000:
            raise PolicyConfigError(
                f"policy.admission_cap must be an integer in 0..1000000, got {self.admission_cap!r}")
        if self.admission_knee > 1:
            raise PolicyConfigError(f"policy.admission_knee must be in 0..1, got {self.admission_knee!r}")
        if self.stream_share > 1:
            raise PolicyConfigError(f"policy.stream_share must be in 0..1, got {self.stream_share!r}")
        if self.horizon_min_s > self.horizon_max_s:
            raise PolicyConfigError(f"policy.horizon_min_s ({self.horizon_min_s}) exceeds policy.horizon_max_s "
                                    f"({self.horizon_max_s})")
        for name, enum in (("profiling", Profiling), ("allocation", Allocation), ("rescale_costs", CostSource),
                           ("admission", Admission), ("horizon", Horizon), ("objective", Objective),
                           ("fairness", Fairness)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, enum(value))
            except ValueError:
                choices = ", ".join(m.value for m in enum)
                raise PolicyConfigError(f"policy.{name} {value!r}: choose one of {choices}") from None
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise PolicyConfigError(f"policy.method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.profile_counts not in ("default", "sparse", "top"):
            raise PolicyConfigError(f"policy.profile_counts {self.profile_counts!r}: choose default, sparse or top")
        if not isinstance(self.learn, bool):
            raise PolicyConfigError(f"policy.learn must be true or false, got {self.learn!r}")
        if self.prior is not None:
            object.__setattr__(self, "prior", _curve("policy.prior", self.prior))
        object.__setattr__(self, "user_weights", _weights("policy.user_weights", self.user_weights))

    @property
    def weight_of(self) -> dict[str, float]:
        """``user_weights`` as a mapping (``weighted`` fairness; the other rules weigh every user 1)."""
        return dict(self.user_weights) if self.fairness is Fairness.WEIGHTED else {}

    @property
    def prior_curve(self) -> dict[int, float] | None:
        return dict(self.prior) if self.prior is not None else None

    def with_prior(self, curve: Mapping[int, float] | None) -> "PolicyConfig":
        return replace(self, prior=None if curve is None else tuple(sorted(curve.items())))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "user_weights":
                out[f.name] = dict(v)
                continue
            out[f.name] = v.value if isinstance(v, Enum) else ([list(p) for p in v] if f.name == "prior" and v else v)
        return out

    def overridden(self, changes: Mapping[str, Any], names: Mapping[str, str] | None = None) -> "PolicyConfig":
        """This config with ``changes`` (knobs given over a preset or a file), checked as one; ``names`` says how each
        knob was given, for errors. A cap given with fixed admission, or adaptive admission with Pjmax 0, is one."""
        named = dict(names or {})

        def name(knob: str) -> str:
            return named.get(knob, f"policy.{knob}")

        try:
            out = replace(self, **changes) if changes else self
        except PolicyConfigError as exc:
            text = str(exc)
            for knob in changes:
                text = text.replace(f"policy.{knob} ", f"{name(knob)} ", 1)
            raise PolicyConfigError(text) from None
        if out.admission is Admission.FIXED and "admission_cap" in changes:
            raise PolicyConfigError(f"{name('admission_cap')} {out.admission_cap} and {name('admission')} fixed: "
                                    "a cap bounds adaptive admission only")
        if out.admission is Admission.ADAPTIVE and out.max_running == 0 and (
                "admission" in changes or "max_running" in changes):
            raise PolicyConfigError(f"{name('admission')} adaptive and {name('max_running')} 0: adaptive admission "
                                    "needs a Pjmax floor >= 1")
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
        for key, value in data.items():
            _sane_number(f"{where}.{key}", value)
        kwargs = dict(data)
        if "prior" in kwargs and kwargs["prior"] is not None:
            prior = kwargs["prior"]
            if isinstance(prior, Mapping):
                kwargs["prior"] = tuple((_int_key(f"{where}.prior", k), v) for k, v in prior.items())
        if isinstance(kwargs.get("user_weights"), Mapping):
            for user, weight in kwargs["user_weights"].items():
                _sane_number(f"{where}.user_weights.{user}", weight)
            kwargs["user_weights"] = tuple(kwargs["user_weights"].items())
        try:
            return cls(**kwargs)
        except PolicyConfigError as exc:
            raise PolicyConfigError(str(exc).replace("policy.", f"{where}.", 1)) from None
        except TypeError as exc:
            raise PolicyConfigError(f"{where}: {exc}") from None


def _sane_number(name: str, value: Any) -> None:
    """A number in a table must be finite and at most :data:`MAX_NUMBER` (before any knob reads it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    try:
        ok = math.isfinite(float(value)) and abs(value) <= MAX_NUMBER
    except OverflowError:
        ok = False
    if not ok:
        text = repr(value)
        raise PolicyConfigError(f"{name} must be a finite number of at most {MAX_NUMBER:g}, got "
                                f"{text if len(text) <= 40 else text[:37] + '...'}")


def _int_key(where: str, k: Any) -> int:
    try:
        n = int(k)
    except (TypeError, ValueError):
        raise PolicyConfigError(f"{where}: node count {k!r} is not an integer") from None
    return n


MAX_USERS = 10_000  # users named in user_weights at most


def _weights(where: str, pairs: Any) -> tuple[tuple[str, float], ...]:
    """``((user, weight), ...)`` (or a mapping) checked: names non-empty, weights finite and > 0."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    try:
        out = tuple((str(u), float(w)) for u, w in items)
    except (TypeError, ValueError):
        raise PolicyConfigError(f"{where} must be a table of user = weight, got {pairs!r}"[:200]) from None
    if len(out) > MAX_USERS:
        raise PolicyConfigError(f"{where} names {len(out)} users, at most {MAX_USERS}")
    for user, w in out:
        if not user or not math.isfinite(w) or not 0 < w <= MAX_NUMBER:
            raise PolicyConfigError(f"{where}: user {user!r} needs a name and a finite weight > 0, got {w!r}")
    if len({u for u, _ in out}) != len(out):
        raise PolicyConfigError(f"{where}: a user is named twice")
    return tuple(sorted(out))


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
PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({k: MappingProxyType(cast("dict[str, Any]", v)) for k, v in {
    # the default policy (what the daemon runs out of the box): passive learning, gated profiling,
    # adaptive admission
    "malletrain": {},
    # the default without fair share between users (``fairness = "none"``): what the shares cost in work
    "malletrain-no-share": {"fairness": Fairness.NONE},
    # MalleTrain as published (the JPA): profile every new job in inverse order, then refine online;
    # Pjmax fixed, Tfwd fixed
    "jpa": {"profiling": Profiling.ALWAYS, "admission": Admission.FIXED, "horizon": Horizon.TFWD,
            "objective": Objective.SAMPLES},
    # FreeTrain: trust the user's curve; nothing is profiled or learned
    # (published with a fixed Pjmax, as are greedy and equal; milp-true and oracle keep the base's
    # admission, so their gap to malletrain is what learning costs)
    "freetrain": {"profiling": Profiling.NEVER, "learn": False, "admission": Admission.FIXED,
                  "objective": Objective.SAMPLES},
    # the information ceiling: the true curves as the user's, measured rescale costs
    "milp-true": {"profiling": Profiling.NEVER, "learn": False},
    # upper bound: the true curves and free rescales
    "oracle": {"profiling": Profiling.NEVER, "learn": False, "rescale_costs": CostSource.CONFIGURED,
               "default_up_cost_s": 0.0, "default_down_cost_s": 0.0},
    "greedy": {"profiling": Profiling.NEVER, "learn": False, "allocation": Allocation.GREEDY,
               "admission": Admission.FIXED},
    "equal": {"profiling": Profiling.NEVER, "learn": False, "allocation": Allocation.EQUAL,
              "admission": Admission.FIXED},
}.items()})


def preset(name: str, base: PolicyConfig | None = None, **overrides: Any) -> PolicyConfig:
    """``base`` (default :class:`PolicyConfig`) with preset ``name``'s fields, then ``overrides``."""
    try:
        fields_ = PRESETS[name]
    except KeyError:
        raise PolicyConfigError(f"unknown policy {name!r}; choose one of {', '.join(PRESETS)}") from None
    return replace(base if base is not None else PolicyConfig(), **{**fields_, **overrides})
