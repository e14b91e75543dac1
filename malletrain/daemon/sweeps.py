"""Sweeps (a daemon part): the trials of each registered sweep, asked, submitted and told.

At each step, after observe and before decide: a COMPLETED trial with no value is FAILED instead; an
ended trial is told to its study; running trials report intermediate values (the pruner may end one);
new trials open as :func:`policy.sweeps.trials_to_open` says; a cancelled sweep opens none. A trial is
a job like any other (a recall suspends it, it resumes as the same trial); after a restart the journal
gives every trial back. Every Optuna call is in :mod:`malletrain.daemon.sweepfile`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from malletrain.daemon.records import JobRun
from malletrain.daemon.state import JobTable, log
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.store import Store, StoreError
from malletrain.daemon.sweepfile import (
    CANCELLED_PREFIX, SweepError, SweepSpec, SweepStudy, journal_path, read_steps, read_value, registered, result_path,
    steps_path, summary, sweep_dir, trial_spec,
)
from contract.workerenv import ENV_ARRAY_INDEX, ENV_TRIAL, ENV_TRIAL_RESULT, ENV_TRIAL_STEPS
from policy.sweeps import SweepProgress, trials_to_open


def member_environ(spec: JobSpec, state: Path) -> dict[str, str]:
    """The variables an array element's or a trial's workers get (none for any other job)."""
    env: dict[str, str] = {}
    if spec.array_index is not None:
        env[ENV_ARRAY_INDEX] = str(spec.array_index)
    if spec.sweep_name is not None and spec.trial is not None:
        env[ENV_TRIAL] = str(spec.trial)
        env[ENV_TRIAL_RESULT] = str(result_path(state, spec.sweep_name, spec.trial))
        env[ENV_TRIAL_STEPS] = str(steps_path(state, spec.sweep_name, spec.trial))
    return env


class SweepDriver:
    """Drives every registered sweep's study (one :class:`malletrain.daemon.sweepfile.SweepStudy` each)."""

    def __init__(self, table: JobTable, store: Store, state_dir: Path, clock: Callable[[], float]) -> None:
        self.table = table
        self.store = store
        self.state_dir = Path(state_dir)
        self.clock = clock
        self.studies: dict[str, SweepStudy] = {}
        self.owners: dict[str, tuple[int, int]] = {}
        self.umasks: dict[str, int | None] = {}  # the submitter's umask, for every trial
        self.specs: dict[str, JobSpec] = {}
        self.broken: dict[str, str] = {}  # sweep -> why it cannot run (e.g. Optuna not installed)
        self.finished: set[str] = set()  # every trial asked and told: nothing left to drive

    def step(self, now: float) -> bool:
        """One pass over every sweep; returns whether a trial ended or was submitted."""
        sweeps = registered(self.store)
        changed = False
        for name, reg in sweeps.items():
            if name in self.broken or name in self.finished:
                continue
            try:
                study = self._study(name, reg)
                changed |= self._pass(name, study, bool(reg.get("cancelled")))
            except (SweepError, ValueError, KeyError, TypeError, OSError, RuntimeError) as exc:
                self.broken[name] = str(exc)  # one bad sweep stops alone, saying why; the daemon goes on
                self.store.log_event("sweep_error", sweep=name, error=str(exc)[:500])
                log.error("sweep %s stopped: %s", name, exc)
        return changed

    def _study(self, name: str, reg: dict[str, Any]) -> SweepStudy:
        study = self.studies.get(name)
        if study is None:
            sweep = SweepSpec.from_json(reg["sweep"])
            self.specs[name] = JobSpec.from_json(json.dumps(reg["spec"]), f"sweep {name}")
            uid, gid = (int(x) for x in reg["owner"])
            self.owners[name] = (uid, gid)
            self.umasks[name] = reg.get("umask")  # a sweep registered before umasks were kept: None
            self._results_dir(name, uid, gid)
            study = self.studies[name] = SweepStudy(sweep, journal_path(self.state_dir, name))
        return study

    def _results_dir(self, name: str, uid: int, gid: int) -> None:
        """The folder the trials write their values in: a root daemon's trials run as their owner."""
        d = sweep_dir(self.state_dir, name)
        d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and uid != 0:
            os.chown(d, uid, gid)
            os.chmod(d, 0o700)

    def _pass(self, name: str, study: SweepStudy, cancelled: bool) -> bool:
        changed = False
        waiting = 0
        jobs_of: dict[int, str] | None = None  # trial -> job, read from the store only when the journal lacks one
        for number, values, job, last_step in study.open_trials():
            if job is None and cancelled:  # asked, never submitted (the daemon died in between)
                study.tell_failed(number, f"{CANCELLED_PREFIX}: the sweep was cancelled before its job was submitted")
                changed = True
                continue
            if job is None:
                if jobs_of is None:
                    jobs_of = {r.spec.trial: r.id for r in self.store.jobs()
                               if r.spec.sweep_name == name and r.spec.trial is not None}
                job = jobs_of.get(number) or self._submit(name, study, number, values)
                study.set_job(number, job)
                waiting += 1
                changed = True
                continue
            run = self.table.runs.get(job)
            if run is not None and not run.state.terminal:
                self._check_value(name, run)
                self._prune(study, name, run, last_step)
                waiting += not run.members and not run.state.active
                continue
            rec = self.store.get(job)
            if rec is None or rec.state.terminal:
                self._tell(study, name, number, rec.state if rec else JobState.FAILED,
                           rec.message if rec else f"job {job} is gone from the store")
                changed = True
            else:
                waiting += 1  # in the store, not yet taken by observe
        open_now = len(study.open_trials())
        progress = SweepProgress(study.sweep.trials, study.asked(), waiting)
        if open_now == 0 and (cancelled or progress.asked >= progress.trials):
            self.finished.add(name)
        if cancelled:
            return changed  # a cancelled sweep opens no trial
        for _ in range(trials_to_open(progress)):
            number, values = study.ask()
            study.set_job(number, self._submit(name, study, number, values))
            changed = True
        return changed

    def _submit(self, name: str, study: SweepStudy, number: int, values: dict[str, Any]) -> str:
        uid, gid = self.owners[name]
        jid = self.store.submit(trial_spec(self.specs[name], study.sweep, number, values), uid, gid,
                                self.umasks.get(name))
        self.store.log_event("trial_submit", jid, sweep=name, trial=number, values=values)
        log.info("sweep %s: trial %d is job %s (%s)", name, number, jid, values)
        return jid

    def _check_value(self, name: str, run: JobRun) -> None:
        """A trial observe marked COMPLETED with no value is FAILED, saying so (act ends it so)."""
        if run.ending is None or run.ending[0] is not JobState.COMPLETED or run.spec.trial is None:
            return
        value, why = read_value(result_path(self.state_dir, name, run.spec.trial))
        if value is None:
            run.end_failed_instead(why)

    def _prune(self, study: SweepStudy, name: str, run: JobRun, last_step: int) -> None:
        if study.sweep.pruner == "none" or run.spec.trial is None or not run.phase.live:
            return
        steps = read_steps(steps_path(self.state_dir, name, run.spec.trial), last_step)
        at = study.report(run.spec.trial, steps) if steps else None
        if at is not None:
            run.end(JobState.CANCELLED, f"pruned at step {at} by the sweep's {study.sweep.pruner} pruner")

    def _tell(self, study: SweepStudy, name: str, number: int, state: JobState, message: str) -> None:
        if state is JobState.COMPLETED:
            value, why = read_value(result_path(self.state_dir, name, number))
            if value is not None:
                study.tell_value(number, value)
                self.store.log_event("trial_value", sweep=name, trial=number, value=value)
                return
            message = why
        if state is JobState.CANCELLED and message.startswith("pruned"):
            study.tell_pruned(number, message)
        else:
            study.tell_failed(number, f"{state.value}: {message}")
        self.store.log_event("trial_ended", sweep=name, trial=number, state=state.value, reason=message[:300])

    def status(self) -> list[dict[str, Any]]:
        """Every sweep's summary (status --json's ``sweeps``)."""
        out = []
        for name, reg in registered(self.store).items():
            try:
                study = self._study(name, reg)
                states = {}
                for row in study.rows():
                    if row.job and row.state == "running":
                        run = self.table.runs.get(row.job)
                        rec = self.store.get(row.job) if run is None else None
                        states[row.job] = run.state.value if run is not None else rec.state.value if rec else "?"
                out.append(summary(study.sweep, study.rows(), states, bool(reg.get("cancelled")))
                           | {"error": self.broken.get(name)})
            except (SweepError, StoreError, ValueError, KeyError, OSError) as exc:
                out.append({"name": name, "error": str(exc), "trials": [], "best": None})
        return out
