"""Sweeps: a hyperparameter search written in a job file (``[sweep]``), each trial an elastic job.

The file's keys are in docs/training/sweeps.md. Optuna asks each trial's values; the study is a
journal file in the state folder (``sweeps/NAME/study.journal``), so a restart loses no trial and no
value. ``{name}`` in the command is the trial's value of ``name``, ``{trial}`` its number; a trial
writes ``{"value": X}`` to ``MALLETRAIN_TRIAL_RESULT`` and one without a value is FAILED. Every
Optuna call of malletrain is here (:class:`SweepStudy`); Optuna is imported only when a sweep is run
or shown."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, TypeGuard, cast

from malletrain.daemon.jobspec import (
    GROUP_ID, PYTHON_PLACEHOLDER, SAMPLES_PLACEHOLDER, JobSpec, JobSpecError, parse_spec,
)
from malletrain.daemon.textfile import short_repr as _short

TRIALS_MAX = 10_000
"""No sweep runs more trials than this."""
CHOICES_MAX = 1024
GRID_MAX = 100_000
SWEEPS_DIR = "sweeps"
SWEEPS_KEY = "sweeps"
"""Store meta: every registered sweep (its definition, its job file's spec, its owner)."""
TRIAL_PLACEHOLDER = "{trial}"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median")
DIRECTIONS = ("minimize", "maximize")
_SWEEP_KEYS = {"trials", "direction", "sampler", "pruner", "seed", "space", "name"}
_BUILTIN = {PYTHON_PLACEHOLDER[1:-1], SAMPLES_PLACEHOLDER[1:-1], TRIAL_PLACEHOLDER[1:-1]}
EXTRA = "pip install 'malletrain[sweep]'"


class SweepError(JobSpecError):
    """A ``[sweep]`` table, a trial's value or a study that is not valid; the message names it."""


@dataclass(frozen=True)
class Param:
    """One entry of ``[sweep.space]``: a float or int range (``log``: sampled on a log scale), or choices."""

    name: str
    kind: str  # "float", "int" or "choice"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()


@dataclass(frozen=True)
class SweepSpec:
    """A ``[sweep]`` table, checked."""

    name: str
    trials: int
    direction: str
    space: tuple[Param, ...]
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["space"] = [asdict(p) | {"choices": list(p.choices)} for p in self.space]
        return d

    def to_table(self) -> dict[str, Any]:
        """The ``[sweep]`` table this was parsed from (:func:`parse_sweep` of it gives it back)."""
        space: dict[str, Any] = {}
        for p in self.space:
            space[p.name] = ({"choices": list(p.choices)} if p.kind == "choice"
                             else {"low": p.low, "high": p.high} | ({"log": True} if p.log else {}))
        table = {"name": self.name, "trials": self.trials, "direction": self.direction, "sampler": self.sampler,
                 "pruner": self.pruner, "space": space}
        return table | ({"seed": self.seed} if self.seed is not None else {})

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "SweepSpec":
        space = tuple(Param(p["name"], p["kind"], p.get("low"), p.get("high"), bool(p.get("log")),
                            tuple(p.get("choices") or ())) for p in obj["space"])
        return cls(obj["name"], int(obj["trials"]), obj["direction"], space, obj.get("sampler", "tpe"),
                   obj.get("pruner", "none"), obj.get("seed"))


# ---------------------------------------------------------------- the [sweep] table
def _number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _param(name: str, raw: Any, where: str) -> Param:
    at = f"{where}: [sweep.space] {name}"
    if not isinstance(raw, dict) or not raw:
        raise SweepError(f"{at}: empty or not a table; give {{ low, high }}, {{ low, high, log = true }} "
                         "or {{ choices = [...] }}")
    unknown = sorted(set(raw) - {"low", "high", "log", "choices"})
    if unknown:
        raise SweepError(f"{at}: unknown key(s) {', '.join(map(str, unknown))}; known: low, high, log, choices")
    if "choices" in raw:
        if set(raw) != {"choices"}:
            raise SweepError(f"{at}: choices go alone (no low, high or log beside them)")
        ch = raw["choices"]
        if not isinstance(ch, list) or not ch or len(ch) > CHOICES_MAX:
            raise SweepError(f"{at}: choices must be a list of 1 to {CHOICES_MAX} values, got {_short(ch)}")
        if not all(isinstance(c, (str, int, float, bool)) for c in ch) or len(set(map(repr, ch))) != len(ch):
            raise SweepError(f"{at}: choices must be distinct strings, numbers or booleans, got {_short(ch)}")
        return Param(name, "choice", choices=tuple(ch))
    if "low" not in raw or "high" not in raw:
        raise SweepError(f"{at}: a range needs both low and high")
    low, high, log = raw["low"], raw["high"], raw.get("log", False)
    if not _number(low) or not _number(high):
        raise SweepError(f"{at}: low and high must be finite numbers, got {_short(low)} and {_short(high)}")
    if not isinstance(log, bool):
        raise SweepError(f"{at}: log must be true or false, got {_short(log)}")
    if low > high:
        raise SweepError(f"{at}: low {low} > high {high}")
    if log and low <= 0:
        raise SweepError(f"{at}: a log range needs low > 0, got {low}")
    kind = "int" if isinstance(low, int) and isinstance(high, int) else "float"
    return Param(name, kind, low, high, log)


def parse_sweep(raw: Any, default_name: str, where: str) -> SweepSpec:
    """A checked :class:`SweepSpec` from a job file's ``[sweep]`` table; :class:`SweepError` names the bad field."""
    if not isinstance(raw, dict):
        raise SweepError(f"{where}: [sweep] must be a table, got {_short(raw)}")
    unknown = sorted(str(k) for k in set(raw) - _SWEEP_KEYS)
    if unknown:
        raise SweepError(f"{where}: [sweep]: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_SWEEP_KEYS))}")
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not GROUP_ID.fullmatch(name):
        raise SweepError(f"{where}: the sweep's name {_short(name)} must be 1-64 of A-Z a-z 0-9 _ . - "
                         "(the job's name, or [sweep] name)")
    trials = raw.get("trials")
    if not isinstance(trials, int) or isinstance(trials, bool) or not 1 <= trials <= TRIALS_MAX:
        raise SweepError(f"{where}: [sweep] trials must be an integer from 1 to {TRIALS_MAX}, got {_short(trials)}")
    direction = raw.get("direction")
    if direction not in DIRECTIONS:
        raise SweepError(f"{where}: [sweep] direction must be one of {', '.join(DIRECTIONS)}, got {_short(direction)}")
    sampler, pruner = raw.get("sampler", "tpe"), raw.get("pruner", "none")
    if sampler not in SAMPLERS:
        raise SweepError(f"{where}: [sweep] sampler must be one of {', '.join(SAMPLERS)}, got {_short(sampler)}")
    if pruner not in PRUNERS:
        raise SweepError(f"{where}: [sweep] pruner must be one of {', '.join(PRUNERS)}, got {_short(pruner)}")
    seed = raw.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32):
        raise SweepError(f"{where}: [sweep] seed must be an integer from 0 to 2**32-1, got {_short(seed)}")
    space_raw = raw.get("space")
    if not isinstance(space_raw, dict) or not space_raw:
        raise SweepError(f"{where}: [sweep.space] is missing or empty: name at least one value to search")
    space = []
    for pname, praw in space_raw.items():
        if not isinstance(pname, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pname) or pname in _BUILTIN:
            raise SweepError(f"{where}: [sweep.space] entry {_short(pname)} is not a usable name "
                             f"(letters, digits, _; not {', '.join(sorted(_BUILTIN))})")
        space.append(_param(pname, praw, where))
    sweep = SweepSpec(name, trials, direction, tuple(space), sampler, pruner, seed)
    if sampler == "grid":
        points = math.prod(len(v) for v in _grid(sweep, where).values())
        if trials > points:
            raise SweepError(f"{where}: [sweep] trials {trials} is more than the grid's {points} points "
                             f"(the grid sampler asks each point once): give trials = {points} at most")
    return sweep


def _grid(sweep: SweepSpec, where: str) -> dict[str, list[Any]]:
    """The grid sampler's search space: choices, and int ranges (each integer); a float range is refused."""
    grid: dict[str, list[Any]] = {}
    size = 1
    for p in sweep.space:
        if p.kind == "float":
            raise SweepError(f"{where}: [sweep.space] {p.name}: the grid sampler needs choices or an int range, "
                             "not a float range")
        values = list(p.choices) if p.kind == "choice" else list(range(int(p.low or 0), int(p.high or 0) + 1))
        size *= len(values)
        if size > GRID_MAX:
            raise SweepError(f"{where}: the grid has more than {GRID_MAX} points")
        grid[p.name] = values
    return grid


def check_placeholders(spec: JobSpec, sweep: SweepSpec, where: str) -> None:
    """Every ``{word}`` of the command is a space entry or ``{trial}`` (or the job file's own ``{python}``)."""
    names = {p.name for p in sweep.space}
    for word in spec.command:
        for m in PLACEHOLDER.finditer(word):
            if m.group(1) not in names and m.group(1) not in _BUILTIN:
                raise SweepError(f"{where}: command uses {m.group(0)}, which has no entry in [sweep.space] "
                                 f"(entries: {', '.join(sorted(names))}; or {TRIAL_PLACEHOLDER})")


def load_sweep_file(path: str | Path, python: str | None = None) -> tuple[JobSpec, SweepSpec] | None:
    """The job file's spec and its ``[sweep]`` (None if it has none), both checked; errors name the file."""
    from malletrain.daemon.jobspec import JOB_FILE_MAX_BYTES, decode_job_file, spec_of_file
    from malletrain.daemon.textfile import read_user_file

    p = Path(path)
    obj = decode_job_file(p, read_user_file(p, JOB_FILE_MAX_BYTES, "job file", JobSpecError))
    if not isinstance(obj, dict) or "sweep" not in obj:
        return None
    raw = obj.pop("sweep")
    spec = spec_of_file(p, obj, python)
    sweep = parse_sweep(raw, spec.name, str(p))
    check_placeholders(spec, sweep, str(p))
    return spec, sweep


def check_registration(spec: JobSpec, sweep: SweepSpec, where: str) -> None:
    """What the daemon checks of a sweep sent to it: the pair as :func:`load_sweep_file` leaves it."""
    if spec.array_id is not None or spec.sweep_name is not None:
        raise SweepError(f"{where}: a sweep's job cannot be an array element or a trial itself")
    check_placeholders(spec, sweep, where)
    parse_spec(json.loads(trial_spec(spec, sweep, 0, example_values(sweep)).to_json()), where)


def example_values(sweep: SweepSpec) -> dict[str, Any]:
    """A value for each entry (its low, its first choice): a trial's job can be checked before any is asked."""
    return {p.name: p.choices[0] if p.kind == "choice" else p.low for p in sweep.space}


def trial_spec(spec: JobSpec, sweep: SweepSpec, number: int, values: Mapping[str, Any]) -> JobSpec:
    """Trial ``number``'s job: ``{name}`` (in any word of the command) replaced by its value, ``{trial}``
    by its number; named ``SWEEP-tN``."""
    subs = {**{k: _text(v) for k, v in values.items()}, "trial": str(number)}

    def fill(word: str) -> str:
        return PLACEHOLDER.sub(lambda m: subs.get(m.group(1), m.group(0)), word)

    return replace(spec, name=f"{sweep.name}-t{number}"[:128], command=tuple(fill(w) for w in spec.command),
                   sweep_name=sweep.name, trial=number)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


# ---------------------------------------------------------------- files of a sweep
def stream_of(spec: JobSpec) -> str:
    """The stream a job is one of, as the policy is told (:attr:`policy.model.JobView.group`): its
    sweep's or its array's, ``""`` for any other job."""
    if spec.sweep_name is not None:
        return f"sweep:{spec.sweep_name}"
    if spec.array_id is not None:
        return f"array:{spec.array_id}"
    return ""


def sweep_dir(state: Path, name: str) -> Path:
    return Path(state) / SWEEPS_DIR / name


def journal_path(state: Path, name: str) -> Path:
    return sweep_dir(state, name) / "study.journal"


def result_path(state: Path, name: str, number: int) -> Path:
    return sweep_dir(state, name) / f"trial-{number}.json"


def steps_path(state: Path, name: str, number: int) -> Path:
    return sweep_dir(state, name) / f"trial-{number}.steps.jsonl"


RESULT_MAX_BYTES = 4096
STEPS_MAX_BYTES = 1024 * 1024


def _trial_file(path: Path, max_bytes: int) -> str:
    """A file a trial wrote (it runs as its owner): a regular file, never through a link, at most
    ``max_bytes`` read (the tail of a longer one); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        fh.seek(max(0, st.st_size - max_bytes))
        return fh.read(max_bytes).decode("utf-8", errors="replace")


def read_value(path: Path) -> tuple[float | None, str]:
    """A trial's value from its result file, or (None, why there is none). The file's text is never
    quoted back (it may not be the trial's)."""
    try:
        text = _trial_file(path, RESULT_MAX_BYTES)
    except FileNotFoundError:
        return None, "the trial ended without a value (nothing written to MALLETRAIN_TRIAL_RESULT)"
    except OSError as exc:
        return None, f"the trial's value cannot be read: {exc.strerror or exc}"
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None, "the trial's result file (MALLETRAIN_TRIAL_RESULT) is not JSON"
    value = obj.get("value") if isinstance(obj, dict) else None
    if not _number(value):
        return None, "the trial's result (MALLETRAIN_TRIAL_RESULT) has no finite number \"value\""
    return float(value), ""


def read_steps(path: Path, after: int) -> list[tuple[int, float]]:
    """Intermediate values (step, value) past step ``after``, in order; bad lines are skipped."""
    try:
        lines = _trial_file(path, STEPS_MAX_BYTES).splitlines()[-10_000:]
    except OSError:
        return []
    out: dict[int, float] = {}
    for line in lines:
        try:
            obj = json.loads(line)
            step, value = obj["step"], obj["value"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(step, int) and not isinstance(step, bool) and step > after and _number(value):
            out.setdefault(step, float(value))
    return sorted(out.items())


# ---------------------------------------------------------------- the study (every Optuna call)
def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise SweepError(f"sweeps need Optuna, which is not installed ({EXTRA})") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _grid_sampler(optuna: Any, grid: dict[str, list[Any]], seed: int | None) -> Any:
    """Optuna's grid sampler without its stop of the study once every point was asked (meant for
    ``study.optimize``; under ask-and-tell it made the last tells fail). A sweep ends at its ``trials``."""

    class SweepGridSampler(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return SweepGridSampler(grid, seed=seed)


CANCELLED_PREFIX = "cancelled"
"""How the reason of a trial told FAILED because its job was cancelled begins (``sweep show``: cancelled)."""


@dataclass(frozen=True)
class TrialRow:
    """One trial as ``sweep show`` prints it."""

    number: int
    values: dict[str, Any]
    state: str  # running, completed, failed, pruned, waiting
    value: float | None
    job: str | None
    reason: str


class SweepStudy:
    """A sweep's Optuna study, in its journal file (created if new, loaded if not)."""

    def __init__(self, sweep: SweepSpec, path: Path) -> None:
        optuna = _optuna()
        self.sweep = sweep
        path.parent.mkdir(parents=True, exist_ok=True)
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(path)))
        self.study = optuna.create_study(study_name=sweep.name, storage=storage, direction=sweep.direction,
                                         sampler=self._sampler(optuna), pruner=self._pruner(optuna),
                                         load_if_exists=True)
        self.distributions = {p.name: self._distribution(optuna, p) for p in sweep.space}

    def _sampler(self, optuna: Any) -> Any:
        if self.sweep.sampler == "random":
            return optuna.samplers.RandomSampler(seed=self.sweep.seed)
        if self.sweep.sampler == "grid":
            return _grid_sampler(optuna, _grid(self.sweep, self.sweep.name), self.sweep.seed)
        return optuna.samplers.TPESampler(seed=self.sweep.seed)

    def _pruner(self, optuna: Any) -> Any:
        if self.sweep.pruner == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
        return optuna.pruners.NopPruner()

    @staticmethod
    def _distribution(optuna: Any, p: Param) -> Any:
        d = optuna.distributions
        if p.kind == "choice":
            return d.CategoricalDistribution(list(p.choices))
        if p.kind == "int":
            return d.IntDistribution(int(p.low or 0), int(p.high or 0), log=p.log)
        return d.FloatDistribution(float(p.low or 0.0), float(p.high or 0.0), log=p.log)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """A new trial: its number and its values."""
        trial = self.study.ask(self.distributions)
        return int(trial.number), dict(trial.params)

    def _trial(self, number: int) -> Any:
        optuna = _optuna()
        return optuna.trial.Trial(self.study, self.study.get_trials(deepcopy=False)[number]._trial_id)

    def set_job(self, number: int, job: str) -> None:
        self._trial(number).set_user_attr("job", job)

    def open_trials(self) -> list[tuple[int, dict[str, Any], str | None, int]]:
        """The trials not told yet: (number, values, job id or None, last reported step or -1)."""
        optuna = _optuna()
        return [(t.number, dict(t.params), t.user_attrs.get("job"), max(t.intermediate_values, default=-1))
                for t in self.study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.RUNNING]

    def asked(self) -> int:
        return len(self.study.get_trials(deepcopy=False))

    def tell_value(self, number: int, value: float) -> None:
        self.study.tell(number, value)

    def tell_failed(self, number: int, reason: str) -> None:
        optuna = _optuna()
        self._trial(number).set_user_attr("reason", reason[:500])
        self.study.tell(number, state=optuna.trial.TrialState.FAIL)

    def tell_pruned(self, number: int, reason: str) -> None:
        optuna = _optuna()
        self._trial(number).set_user_attr("reason", reason[:500])
        self.study.tell(number, state=optuna.trial.TrialState.PRUNED)

    def report(self, number: int, steps: list[tuple[int, float]]) -> int | None:
        """Report intermediate values; the step at which the pruner stops the trial, or None."""
        trial = self._trial(number)
        for step, value in steps:
            trial.report(value, step)
        if steps and trial.should_prune():
            return steps[-1][0]
        return None

    def rows(self) -> list[TrialRow]:
        optuna = _optuna()
        names = {optuna.trial.TrialState.RUNNING: "running", optuna.trial.TrialState.COMPLETE: "completed",
                 optuna.trial.TrialState.FAIL: "failed", optuna.trial.TrialState.PRUNED: "pruned",
                 optuna.trial.TrialState.WAITING: "waiting"}
        return [TrialRow(t.number, dict(t.params), names.get(t.state, t.state.name.lower()),
                         None if t.value is None else float(t.value), t.user_attrs.get("job"),
                         str(t.user_attrs.get("reason", "")))
                for t in self.study.get_trials(deepcopy=False)]


def summary(sweep: SweepSpec, rows: list[TrialRow], job_states: Mapping[str, str],
            cancelled: bool = False) -> dict[str, Any]:
    """A sweep as ``status --json`` and ``sweep show`` carry it: its trials (a running one in its job's state)
    and the best completed one; a cancelled sweep is done once none of its trials runs."""
    trials = []
    for r in rows:
        state = job_states.get(r.job or "", r.state) if r.state == "running" else r.state
        if r.state == "running" and state in ("completed", "failed", "cancelled"):
            state = "ending"  # its job ended; its value is told at the daemon's next step
        if r.state == "failed" and r.reason.startswith(CANCELLED_PREFIX):
            state = "cancelled"
        trials.append({"number": r.number, "values": r.values, "state": state, "value": r.value, "job": r.job,
                       "reason": r.reason})
    done = [t for t in trials if t["state"] == "completed" and t["value"] is not None]
    best = None
    if done:
        pick = min if sweep.direction == "minimize" else max
        best = pick(done, key=lambda t: cast(float, t["value"]))
    ended = sum(t["state"] in ("completed", "failed", "pruned", "cancelled") for t in trials)
    finished = ended >= sweep.trials or (cancelled and ended == len(trials))
    return {"name": sweep.name, "direction": sweep.direction, "trials_wanted": sweep.trials,
            "trials_asked": len(trials), "trials_ended": ended, "done": finished, "cancelled": cancelled,
            "sampler": sweep.sampler, "pruner": sweep.pruner, "trials": trials, "best": best}


# ---------------------------------------------------------------- the registry (store meta)
def registered(store: Any) -> dict[str, dict[str, Any]]:
    """Every sweep the store holds: name -> {"sweep", "spec", "owner"}."""
    raw = store.get_meta(SWEEPS_KEY)
    try:
        obj = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def register(store: Any, spec: JobSpec, sweep: SweepSpec, owner_uid: int | None, owner_gid: int | None,
             owner_umask: int | None = None) -> str:
    """Record a sweep (the daemon asks its trials, each with the submitter's ids and umask);
    :class:`SweepError` if its name is taken."""
    import os

    check_registration(spec, sweep, f"sweep {sweep.name}")
    with store.batch():
        sweeps = registered(store)
        if sweep.name in sweeps:
            raise SweepError(f"a sweep named {sweep.name!r} exists already; give the job file another name "
                             "(or [sweep] name)")
        sweeps[sweep.name] = {"sweep": sweep.to_json(), "spec": json.loads(spec.to_json()),
                              "owner": [os.geteuid() if owner_uid is None else owner_uid,
                                        os.getegid() if owner_gid is None else owner_gid]}
        if owner_umask is not None:
            sweeps[sweep.name]["umask"] = owner_umask
        store.set_meta(SWEEPS_KEY, json.dumps(sweeps, sort_keys=True))
    store.log_event("sweep_submit", sweep=sweep.name, trials=sweep.trials)
    return sweep.name


def cancel(store: Any, name: str) -> list[str]:
    """Cancel sweep ``name`` (:class:`SweepError` if none): no trial opens again and every trial job not ended
    is asked to stop (told to the study as cancelled). Returns every trial job, in trial order."""
    with store.batch():
        sweeps = registered(store)
        if name not in sweeps:
            raise SweepError(f"no sweep {name!r}")
        sweeps[name]["cancelled"] = True
        store.set_meta(SWEEPS_KEY, json.dumps(sweeps, sort_keys=True))
    jobs = sorted((r for r in store.jobs() if r.spec.sweep_name == name), key=lambda r: r.spec.trial or 0)
    for r in jobs:
        if not r.state.terminal:
            store.request_cancel(r.id)
    store.log_event("sweep_cancel", sweep=name, jobs=len(jobs))
    return [r.id for r in jobs]


def show(state: Path, store: Any, name: str) -> dict[str, Any]:
    """A sweep's :func:`summary`, read from its journal and the store (no daemon needed)."""
    reg = registered(store).get(name)
    if reg is None:
        known = ", ".join(sorted(registered(store))) or "none"
        raise SweepError(f"no sweep {name!r} (sweeps: {known})")
    sweep = SweepSpec.from_json(reg["sweep"])
    path = journal_path(state, name)
    rows = SweepStudy(sweep, path).rows() if path.exists() else []
    states = {r.id: r.state.value for r in store.jobs() if r.spec.sweep_name == name}
    return summary(sweep, rows, states, bool(reg.get("cancelled")))
