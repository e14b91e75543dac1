"""The simulator's named policies: the daemon's :class:`policy.Policy` plus ground truth.

A named policy is a :data:`policy.PRESETS` entry of :class:`policy.PolicyConfig` and, where the comparison needs it,
what only the simulator knows, handed to the policy as a user would hand it:

* ``malletrain``: the daemon's MalleTrain preset. Jobs carry no curve; the prior is the mean of the workload's model
  curves (the user knows the candidate models, not which job is which), or with ``learning_prior = "linear"`` a linear
  curve at its 1-node rate (:func:`learning_prior`: what a user without data gives).
* ``jpa``: the paper's JPA policy: every job profiled in inverse order, refined online (the ``jpa`` preset when
  :data:`policy.PRESETS` has one, else ``malletrain`` with ``profiling="always"``); same prior as ``malletrain``.
* ``freetrain``: every job comes with a user's curve (:func:`believed_curve` under an error model: ``mean``,
  ``linear``, ``other`` or ``noise:X``), trusted as given.
* ``milp-true``: the true curve as the user's (the information ceiling); costs measured.
* ``oracle``: the true curve and free rescales (the simulator charges no pause), an upper bound.
* ``greedy`` / ``equal``: the count-picking baselines.
* ``rigid-preemptible``: each job at one fixed node count (:func:`rigid_nodes`) in a preemptable queue, killed by the
  recall of any of its nodes and requeued from its last checkpoint: the ``greedy`` preset on jobs whose min and max are
  that count (the user's submission, not a rule).

:class:`Overrides` (``--admission``, ``--max-running``, ``--admission-cap``, ``--objective``) are applied after the
preset; a combination that cannot run (an admission cap under fixed admission, adaptive admission with no Pjmax floor)
is an error naming both. Rates and rescale costs reach the policy as a monitor would have measured them
(:class:`simulator.monitor.SimJobMonitor`), never as true values.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from curves import throughput_at
from policy import PRESETS, Policy, PolicyConfig, Profiling, preset
from policy.config import Admission, Objective
from simulator.jobs import JobSpec

Curve = Mapping[int, float]


@dataclass(frozen=True)
class PolicyContext:
    """What a named policy may be given: the workload's model curves (a user can know the models'
    names, not which job is which), the seed, and the freetrain error model."""

    curves: Mapping[str, Curve] = field(default_factory=dict)
    seed: int = 0
    freetrain_model: str = "mean"
    learning_prior: str = "mean"  # a learning preset's starting belief (:func:`learning_prior`)


UserCurve = Callable[[JobSpec], "Curve | None"]
Submission = Callable[[JobSpec], JobSpec]
RIGID = "rigid-preemptible"
DEFAULT_RIGID_NODES = 8  # a rigid job's count when its spec names none (requested_nodes)


@dataclass(frozen=True)
class Overrides:
    """Knobs given on the command line that win over every preset (None: the preset's, else the base's)."""

    admission: str | None = None
    max_running: int | None = None
    admission_cap: int | None = None
    objective: str | None = None

    def __post_init__(self) -> None:
        if self.admission is not None and self.admission not in {a.value for a in Admission}:
            raise ValueError(f"--admission {self.admission!r}: choose {', '.join(a.value for a in Admission)}")
        if self.objective is not None and self.objective not in {o.value for o in Objective}:
            raise ValueError(f"--objective {self.objective!r}: choose {', '.join(o.value for o in Objective)}")

    def fields(self) -> dict[str, object]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def apply(self, name: str, cfg: PolicyConfig) -> PolicyConfig:
        """``cfg`` (the preset ``name`` on the base) with these overrides, checked by
        :meth:`policy.PolicyConfig.overridden` (a bad value or an impossible combination is a ValueError
        naming the flags, or the preset's own knobs)."""
        flags = {knob: "--" + knob.replace("_", "-") for knob in ("admission", "max_running", "admission_cap",
                                                                    "objective")}
        names = {knob: flags[knob] if getattr(self, knob) is not None else f"policy {name}'s {knob}" for knob in flags}
        return cfg.overridden(self.fields(), names)


@dataclass
class SimPolicy:
    """A named policy for the simulator: the shared policy plus the ground truth it is handed."""

    name: str
    policy: Policy
    user_curve: UserCurve
    free_rescales: bool = False
    label: str = ""  # e.g. the freetrain error model
    submission: Submission | None = None  # how a job is submitted under this policy (rigid: a fixed count)

    @property
    def config(self) -> PolicyConfig:
        return self.policy.config


# the baselines that never learn from the true curves; any other preset is a learning policy like
# malletrain and gets the population prior
BASELINES = ("freetrain", "milp-true", "oracle", "greedy", "equal", RIGID)
POLICIES: tuple[str, ...] = tuple(PRESETS) + (() if "jpa" in PRESETS else ("jpa",)) + (RIGID,)


def resolve_config(name: str, config: PolicyConfig | None = None, overrides: Overrides | None = None) -> PolicyConfig:
    """The preset ``name`` on ``config``, then ``overrides``. ``jpa`` (the paper's JPA: inverse-order
    profiling of every job) is read from :data:`policy.PRESETS` when it is there; until then it is the
    ``malletrain`` preset with ``profiling="always"``, which is what the paper's MalleTrain does.
    ``rigid-preemptible`` is the ``greedy`` preset (its jobs are rigid: :func:`rigid_spec`)."""
    if name == "jpa" and "jpa" not in PRESETS:
        cfg = preset("malletrain", config, profiling=Profiling.ALWAYS)
    else:
        cfg = preset("greedy" if name == RIGID else name, config)
    return overrides.apply(name, cfg) if overrides is not None else cfg


def rigid_nodes(spec: JobSpec) -> int:
    """The fixed count a rigid job asks for: its ``requested_nodes`` (e.g. a Philly job's GPUs / 4),
    else :data:`DEFAULT_RIGID_NODES`, within its min..max."""
    want = spec.requested_nodes if spec.requested_nodes is not None else DEFAULT_RIGID_NODES
    return max(spec.min_nodes, min(spec.max_nodes, want))


def rigid_spec(spec: JobSpec) -> JobSpec:
    """The job as a rigid submission: min = max = :func:`rigid_nodes`."""
    n = rigid_nodes(spec)
    return dataclasses.replace(spec, min_nodes=n, max_nodes=n)


def make_policy(name: str, context: PolicyContext | None = None, config: PolicyConfig | None = None,
                overrides: Overrides | None = None) -> SimPolicy:
    """The named policy on ``config`` (default :class:`PolicyConfig`), then ``overrides``."""
    ctx = context if context is not None else PolicyContext()
    cfg = resolve_config(name, config, overrides)
    mean = mean_curve(ctx.curves) if ctx.curves else None
    if name not in BASELINES:  # malletrain, jpa and any learning preset
        if mean is not None and cfg.prior is None:
            cfg = cfg.with_prior(learning_prior(ctx.learning_prior, mean))
        return SimPolicy(name, Policy(cfg), lambda spec: spec.believed_scaling)  # a job file's user curve
    if name == "freetrain":
        model = parse_error_model(ctx.freetrain_model)
        if model.kind in ("mean", "other") and not ctx.curves:
            raise ValueError(f"freetrain model {model.kind!r} needs the workload's model curves (PolicyContext.curves)")

        def user(spec: JobSpec) -> Curve:
            given = spec.believed_scaling
            return given if given is not None else believed_curve(model, spec, mean, ctx.seed, ctx.curves)

        return SimPolicy(name, Policy(cfg), user, label=model.label)
    if name == RIGID:
        return SimPolicy(name, Policy(cfg), lambda spec: None, submission=rigid_spec)
    if name in ("milp-true", "oracle"):
        return SimPolicy(name, Policy(cfg), lambda spec: spec.scaling, free_rescales=name == "oracle")
    return SimPolicy(name, Policy(cfg), lambda spec: None)


@dataclass(frozen=True)
class ErrorModel:
    """How far a user's curve is from the truth: ``mean``, ``linear``, ``other`` or ``noise`` (``pct`` %)."""

    kind: str
    pct: float = 0.0

    @property
    def label(self) -> str:
        return f"noise:{self.pct:g}" if self.kind == "noise" else self.kind


def parse_error_model(text: str) -> ErrorModel:
    """``mean`` | ``linear`` | ``other`` | ``noise:X`` (X in %, 0 <= X < 100)."""
    t = text.strip().lower()
    if t in ("mean", "linear", "other"):
        return ErrorModel(t)
    if t.startswith("noise:"):
        try:
            pct = float(t.split(":", 1)[1])
        except ValueError:
            pct = -1.0
        if 0.0 <= pct < 100.0:
            return ErrorModel("noise", pct)
    raise ValueError(f"freetrain model {text!r}: use mean, linear, other or noise:X with 0 <= X < 100 (percent)")


LEARNING_PRIORS = ("mean", "linear")  # what a learning preset may start from (PolicyContext.learning_prior)


def learning_prior(kind: str, mean: Curve) -> dict[int, float]:
    """A learning preset's starting belief: the population's ``mean`` curve, or ``linear`` at its
    1-node rate (what a user without data gives); any other error model is refused."""
    if kind == "mean":
        return dict(mean)
    if kind == "linear":
        one = throughput_at(mean, 1)
        return {n: one * n for n in sorted(mean)}
    raise ValueError(f"a learning policy starts from one of {', '.join(LEARNING_PRIORS)}, not {kind!r}")


def mean_curve(curves: Mapping[str, Curve]) -> dict[int, float]:
    """The population's mean curve over the union of their node counts (piecewise-linear between points): the mean
    1-node rate times the point-wise mean of each curve over its own 1-node rate. A mean of the raw rates would take the
    shape of the fastest models (cifar10's samples/s are a hundred times bert's), not the population's."""
    counts = sorted({n for c in curves.values() for n in c})
    k = len(curves)
    ones = [throughput_at(c, 1) for c in curves.values()]
    level = sum(ones) / k
    return {n: level * sum(throughput_at(c, n) / one for c, one in zip(curves.values(), ones) if one > 0) / k
            for n in counts}


def believed_curve(model: ErrorModel, spec: JobSpec, mean: Curve | None, seed: int,
                   curves: Mapping[str, Curve] | None = None) -> dict[int, float]:
    """The curve a user would give for ``spec`` under ``model``.

    * ``mean``: every job scales like the mean of the workload's model curves (the user knows
      the candidate models, not which one this job is).
    * ``linear``: linear from the true rate at ``min_nodes`` (the user ran it once, small).
    * ``other``: another model's curve (one of ``curves`` other than the job's own model, drawn
      seeded by ``(seed, job name)``): the user copied a curve published for a different network.
    * ``noise:X``: the true curve, each point times ``U(1 - X%, 1 + X%)``, seeded by ``(seed, job name)``.
    """
    true = spec.scaling
    if model.kind == "mean":
        assert mean is not None
        return dict(mean)
    if model.kind == "linear":
        per_node = throughput_at(true, spec.min_nodes) / spec.min_nodes
        return {n: per_node * n for n in sorted(set(true) | {spec.min_nodes, spec.max_nodes})}
    rng = random.Random(zlib.crc32(f"{seed}:{spec.name}".encode()))
    if model.kind == "other":
        assert curves
        names = sorted(n for n in curves if n != spec.model) or sorted(curves)
        return dict(curves[names[rng.randrange(len(names))]])
    x = model.pct / 100.0
    return {n: v * rng.uniform(1.0 - x, 1.0 + x) for n, v in sorted(true.items())}
