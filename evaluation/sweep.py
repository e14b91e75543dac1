"""Many replays as Dask tasks: the evaluation's runner.

    from evaluation.sweep import Replays, RunSpec, run_replays
    done = run_replays(Replays(timeline, scaling), [RunSpec("nas", "malletrain", seed=s) for s in range(5)],
                       workers=2)               # a dask.distributed LocalCluster of 2 worker processes
    done = run_replays(..., scheduler="tcp://head:8786")   # an existing cluster (e.g. dask-jobqueue on Slurm)
    done = run_replays(..., workers=0)          # in this process, no Dask (debugging, tests)

Each replay is one task (single-threaded, deterministic for its spec); the timeline and the
curves are scattered to every worker once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence, TextIO

from policy import PolicyConfig
from simulator.engine import SimConfig
from simulator.policies import Overrides
from simulator.workload import ScalingSet
from traces.model import IdleTimeline


NO_PRIOR = ("milp-true", "oracle", "greedy", "equal", "rigid-preemptible")  # policies no prior reaches


@dataclass(frozen=True)
class RunSpec:
    """One replay: a workload stream and seed under a named policy, with the knobs the sweep varies
    (``None``: the evaluation's base value). ``prior``: freetrain's user curve (``mean``, ``linear``,
    ``other``, ``noise:X``) or a learning policy's starting belief."""

    workload: str
    policy: str
    seed: int = 0
    prior: str = "mean"
    max_running: int | None = None
    max_nodes: int | None = None
    tfwd_s: float | None = None
    fixed_pjmax: int | None = None  # fixed admission at this Pjmax (the "freetrain at fixed Pjmax N" baseline)
    bound: bool = False  # the oracle reference: free rescales, free starts (calibration free), no admission cap

    @property
    def label(self) -> str:
        if self.bound:
            return "oracle-reference"  # not an upper bound: the allocator is a heuristic over time
        if self.fixed_pjmax is not None:
            return f"{self.policy}-fixed:{self.fixed_pjmax}"
        if self.policy == "freetrain" or (self.prior != "mean" and self.policy not in NO_PRIOR):
            return f"{self.policy}:{self.prior}"  # freetrain's user curve, a learning policy's starting belief
        return self.policy

    @property
    def learning_prior(self) -> str:
        """A learning policy's starting belief (``mean`` for every other policy)."""
        return self.prior if self.policy != "freetrain" and self.policy not in NO_PRIOR else "mean"

    @property
    def stream(self) -> tuple[str, float]:
        """The workload name and offered load: ``philly@1.5`` -> (``philly``, 1.5); others load 1."""
        return split_workload(self.workload)

    @property
    def cell(self) -> tuple[str, int | None, int | None, float | None]:
        """What the seeds and policies of one comparison share."""
        return (self.workload, self.max_running, self.max_nodes, self.tfwd_s)

    def describe(self) -> str:
        knobs = [f"seed {self.seed}"]
        if self.max_running is not None:
            knobs.append(f"Pjmax {self.max_running}")
        if self.max_nodes is not None:
            knobs.append(f"max {self.max_nodes} nodes")
        if self.tfwd_s is not None:
            knobs.append(f"Tfwd {self.tfwd_s:g} s")
        return f"{self.workload}/{self.label} ({', '.join(knobs)})"


@dataclass(frozen=True)
class Replays:
    """What every replay of a sweep shares."""

    timeline: IdleTimeline
    scaling: ScalingSet
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    sim_config: SimConfig = field(default_factory=SimConfig)
    n_jobs: int | None = None  # a finite job list of this many jobs; None: endless streams
    overrides: Overrides | None = None  # win over every preset (the evaluation: the default's admission)
    flags: Overrides | None = None  # what the user gave on the command line: wins over jpa's own admission too

    def overrides_for(self, spec: RunSpec) -> Overrides | None:
        """The evaluation's overrides for ``spec``: its Pjmax, a fixed-Pjmax baseline's fixed admission, the
        reference's uncapped admission; jpa (the paper's policy) keeps its own admission unless the user's
        flags (``flags``) name one."""
        base = self.overrides if self.overrides is not None else Overrides()
        if spec.policy == "jpa":
            given = self.flags.fields() if self.flags is not None else {}
            base = Overrides(**{"objective": base.objective, **given})
        if spec.max_running is not None:
            base = dataclasses.replace(base, max_running=spec.max_running)
        if spec.fixed_pjmax is not None:
            base = dataclasses.replace(base, admission="fixed", max_running=spec.fixed_pjmax, admission_cap=None)
        if spec.bound:
            base = dataclasses.replace(base, admission="adaptive", admission_cap=0)
        return base if base.fields() else None

    def config_for(self, spec: RunSpec) -> tuple[PolicyConfig, SimConfig]:
        changes: dict[str, object] = {}
        if spec.max_running is not None:
            changes["max_running"] = spec.max_running
        if spec.tfwd_s is not None:
            changes["tfwd_s"] = spec.tfwd_s
        pcfg = dataclasses.replace(self.policy_config, **changes) if changes else self.policy_config
        scfg = self.sim_config if spec.max_nodes is None else dataclasses.replace(self.sim_config,
                                                                                  max_nodes=spec.max_nodes)
        return pcfg, scfg


def split_workload(name: str) -> tuple[str, float]:
    """``philly@1.5`` -> (``philly``, 1.5); a name without ``@`` has offered load 1."""
    base, _, load = name.partition("@")
    if not load:
        return name, 1.0
    try:
        x = float(load)
    except ValueError:
        x = math.nan
    if not x > 0 or math.isinf(x):
        raise ValueError(f"workload {name!r}: the offered load after @ must be a number > 0")
    return base, x


def run_one(replays: Replays, spec: RunSpec) -> tuple[RunSpec, dict]:
    """Replay ``spec`` (the task every worker runs); returns it with its summary."""
    from simulator import simulate
    from simulator.calibration import free

    pcfg, scfg = replays.config_for(spec)
    over = replays.overrides_for(spec)
    if spec.bound:
        scfg = dataclasses.replace(scfg, calibration=free())
    workload, load = spec.stream
    res = simulate(replays.timeline, spec.policy, workload, scaling=replays.scaling, seed=spec.seed,
                   n_jobs=replays.n_jobs, config=scfg, freetrain_model=spec.prior, policy_config=pcfg,
                   learning_prior=spec.learning_prior, overrides=over, offered_load=load)
    summary = dict(res.summary)
    summary["label"] = spec.label
    summary["max_nodes_cap"] = spec.max_nodes
    return spec, summary


def duplicates(specs: Sequence[RunSpec], replays: Replays) -> dict[RunSpec, RunSpec]:
    """Specs that would replay exactly what an earlier spec replays (two names for one learning
    preset, e.g. ``jpa`` while it equals ``malletrain``): spec -> the one to copy from."""
    from simulator.policies import BASELINES, resolve_config

    seen: dict[tuple, RunSpec] = {}
    out: dict[RunSpec, RunSpec] = {}
    for spec in specs:
        if spec.policy in BASELINES or spec.bound or spec.fixed_pjmax is not None:
            continue
        pcfg, _ = replays.config_for(spec)
        cfg = resolve_config(spec.policy, pcfg, replays.overrides_for(spec)).as_dict()
        key = (repr(sorted(cfg.items())), spec.workload, spec.seed, spec.max_nodes, spec.prior)
        if key in seen:
            out[spec] = seen[key]
        else:
            seen[key] = spec
    return out


OnDone = Callable[[RunSpec, dict], None]


class Progress:
    """A tqdm bar on a terminal; plain ``[k/N]`` lines when the stream is not one; silent if quiet."""

    def __init__(self, total: int, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total = total
        self.done = 0
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.bar = None
        if not quiet and _isatty(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="replay", file=self.stream, dynamic_ncols=True)

    def __call__(self, spec: RunSpec, summary: dict) -> None:
        self.done += 1
        if self.quiet:
            return
        what = (f"{spec.describe()}: work {summary['work_node_seconds']:.4g} node-s, "
                f"{summary.get('cpu_seconds', 0.0):.1f} s CPU")
        if self.bar is not None:
            self.bar.set_postfix_str(what[:60], refresh=False)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {what} ({time.monotonic() - self.t0:.0f} s elapsed)",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def run_replays(replays: Replays, specs: Sequence[RunSpec], *, workers: int = 2, scheduler: str | None = None,
                on_done: OnDone | None = None) -> list[tuple[RunSpec, dict]]:
    """Run every spec (duplicates once); ``(spec, summary)`` in ``specs`` order. ``scheduler``: an
    existing Dask scheduler's address; else ``workers`` > 0 single-threaded processes of a
    ``LocalCluster``; ``workers == 0``: in this process, no Dask."""
    if workers < 0:
        raise ValueError(f"workers must be >= 0, got {workers}")
    copies = duplicates(specs, replays)
    unique = [s for s in specs if s not in copies]
    results: dict[RunSpec, dict] = {}

    def finished(spec: RunSpec, summary: dict) -> None:
        results[spec] = summary
        if on_done is not None:
            on_done(spec, summary)
        for dup, src in copies.items():
            if src == spec:
                copy = {**summary, "policy": dup.policy, "label": dup.label, "replayed_as": spec.policy}
                results[dup] = copy
                if on_done is not None:
                    on_done(dup, copy)

    order = sorted(unique, key=_expected_cost, reverse=True)  # slowest first, so workers finish together
    if scheduler is None and workers == 0:
        for spec in order:
            finished(*run_one(replays, spec))
    else:
        _run_on_dask(replays, order, workers, scheduler, finished)
    return [(s, results[s]) for s in specs]


def _expected_cost(spec: RunSpec) -> float:
    learning = spec.policy not in ("freetrain", "milp-true", "oracle", "greedy", "equal", "rigid-preemptible")
    cheap = spec.policy in ("greedy", "equal", "rigid-preemptible")
    return (3.0 if learning else 0.3 if cheap else 1.0) * (spec.max_running or spec.fixed_pjmax or 10) \
        * spec.stream[1]


def _run_on_dask(replays: Replays, specs: Iterable[RunSpec], workers: int, scheduler: str | None,
                 finished: OnDone) -> None:
    from distributed import Client, LocalCluster, as_completed

    specs = list(specs)
    if scheduler is not None:
        client = Client(scheduler)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                               dashboard_address=":0", silence_logs=logging.ERROR)
        client = Client(cluster)
    try:
        shared = client.scatter(replays, broadcast=True)
        futures = [client.submit(run_one, shared, spec, pure=False, priority=len(specs) - i)
                   for i, spec in enumerate(specs)]
        for fut in as_completed(futures):
            finished(*fut.result())
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
