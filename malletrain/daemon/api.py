"""The control API: requests on the daemon's Unix socket (submit, cancel, status, nodes, shutdown,
ping), already authorised by :mod:`malletrain.daemon.control`. A submit or cancel is written into the store;
the loop observes it right after serving (:meth:`.observe.Observe.submissions`), so the API keeps no
"decide again" flag of its own; observe and decide never call the API."""

from __future__ import annotations

import os
from typing import Any

from malletrain.daemon import arrays
from malletrain.daemon import sweepfile as sweeps
from malletrain.daemon.control import Caller, Cancel, Nodes, Ping, Request, Shutdown, Status, Submit
from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.decide import Decide
from malletrain.daemon.state import JobTable
from malletrain.daemon.sweeps import SweepDriver

GROUP_KEYS = frozenset({"array", "sweep"})
"""Keys of a submitted job file that make it many jobs: ``array`` (``submit --array``) and ``sweep``."""
from malletrain.daemon.jobspec import JobSpecError, JobState, parse_spec
from malletrain.daemon.monitor import Monitor
from malletrain.daemon.scavenging import Scavenging
from malletrain.daemon.store import Store
from policy.health import pending_reason, rate_is_current


class ControlApi:
    """What the control socket asks of the daemon."""

    def __init__(self, table: JobTable, store: Store, monitor: Monitor, scav: Scavenging,
                 accounting: NodeAccounting, decide: Decide, sweep_driver: SweepDriver | None = None) -> None:
        self.table = table
        self.store = store
        self.monitor = monitor
        self.scav = scav
        self.accounting = accounting
        self.decide = decide
        self.sweep_driver = sweep_driver

    def owner_of(self, job_id: str) -> int | None:
        """The owner of a job, of an array's elements (``a000001``, ``a000001_3``: its first element's)
        or of a sweep (its name, where no job has that id: the submitter's)."""
        if self._is_sweep(job_id):
            return int(sweeps.registered(self.store)[job_id]["owner"][0])
        if arrays.is_array_ref(job_id):
            ids = arrays.resolve(self.store.jobs(), job_id)
            if not ids:
                return None
            job_id = ids[0]
        rec = self.store.get(job_id)
        if rec is None:
            return None
        return int(rec.owner_uid) if rec.owner_uid is not None else os.geteuid()

    def handle(self, req: Request, caller: Caller) -> dict[str, Any]:
        """One authorised control request (``control.authorize`` has checked who may do it)."""
        if isinstance(req, Submit) and GROUP_KEYS & set(req.spec):
            return self._submit_group(req)
        if isinstance(req, Submit):
            spec = parse_spec(req.spec, "submitted job").resolved(where="submitted job")  # `python` -> this Python
            if spec.array_id is not None or spec.sweep_name is not None:
                raise JobSpecError("submitted job: array_id, array_index, sweep_name and trial are set by "
                                   "malletrain (submit --array, a [sweep] table), not by a job")
            why = self.table.unknown_trainer(spec)
            if why is not None:
                raise JobSpecError(f"submitted job: {why}")
            jid = self.store.submit(spec, owner_uid=req.owner_uid, owner_gid=req.owner_gid, owner_umask=req.umask)
            return {"ok": True, "id": jid}
        if isinstance(req, Cancel) and self._is_sweep(req.job):
            ids = sweeps.cancel(self.store, req.job)
            return {"ok": True, "id": req.job, "jobs": ids, "sweep": req.job, "state": "cancelled"}
        if isinstance(req, Cancel) and arrays.is_array_ref(req.job):
            ids = arrays.resolve(self.store.jobs(), req.job)
            states = [self.store.request_cancel(j) for j in ids]
            return {"ok": True, "id": req.job, "jobs": ids, "state": "cancelled" if ids else "none",
                    "was": ",".join(sorted({s.value for s in states}))}
        if isinstance(req, Cancel):
            state = self.store.request_cancel(req.job)
            return {"ok": True, "id": req.job, "state": self.store.require(req.job).state.value, "was": state.value}
        if isinstance(req, Status):
            return {"ok": True, "jobs": self.status_jobs(), "nodes": self.status_nodes(),
                    "sweeps": self.sweep_driver.status() if self.sweep_driver is not None else []}
        if isinstance(req, Nodes):
            return {"ok": True, "nodes": self.status_nodes()}
        if isinstance(req, Shutdown):
            self.table.stopping = True
            return {"ok": True}
        assert isinstance(req, Ping)
        return {"ok": True, "pid": os.getpid()}

    def _is_sweep(self, ref: str) -> bool:
        """Whether ``ref`` names a sweep (a job or an array of that id goes first)."""
        return (not arrays.is_array_ref(ref) and self.store.get(ref) is None
                and ref in sweeps.registered(self.store))

    def _submit_group(self, req: Submit) -> dict[str, Any]:
        """A job file with ``array`` (an index spec: one job per index) or ``sweep`` (its ``[sweep]``
        table: registered, the sweep part asks its trials), never both."""
        raw = dict(req.spec)
        array, sweep_table = raw.pop("array", None), raw.pop("sweep", None)
        if array is not None and sweep_table is not None:
            raise JobSpecError("submitted job: an array and a [sweep] table do not go together")
        where = "submitted array" if array is not None else "submitted sweep"
        spec = parse_spec(raw, where).resolved(where=where)
        why = self.table.unknown_trainer(spec)
        if why is not None:
            raise JobSpecError(f"{where}: {why}")
        if array is not None:
            indices = arrays.parse_indices(array)
            array_id, ids = arrays.submit_array(self.store, spec, indices, req.owner_uid, req.owner_gid, req.umask)
            return {"ok": True, "id": array_id, "jobs": ids}
        sweep = sweeps.parse_sweep(sweep_table, spec.name, where)
        name = sweeps.register(self.store, spec, sweep, req.owner_uid, req.owner_gid, req.umask)
        return {"ok": True, "id": name, "sweep": name}

    def status_jobs(self) -> list[dict[str, Any]]:
        out = []
        for rec in self.store.jobs():
            d = rec.as_dict()
            d["trainer"] = self.table.trainer_name(rec.spec)
            if rec.spec.budget_node_hours is not None:
                d["budget_node_hours"] = rec.spec.budget_node_hours
                if rec.id in self.accounting.node_seconds:
                    d["used_node_hours"] = self.accounting.used_node_hours(rec.id)
            if rec.spec.deadline is not None:
                d["deadline"] = rec.spec.deadline
            run = self.table.runs.get(rec.id)
            stats = self.monitor.jobs.get(rec.id)
            if run is not None:
                d["samples"] = max(d["samples"], run.last_progress)
                d["nodes"] = list(run.members)
                if run.waiting:
                    d["waiting"] = run.waiting
                if run.stalled:
                    d["stalled"], d["stalled_s"] = run.stalled, run.stalled_s
            if rec.state is JobState.PENDING:  # every queued job says why (policy.health.pending_reason)
                d["waiting"] = pending_reason(
                    run.waiting if run is not None else "", len(run.workers) if run is not None else 0,
                    len(run.ready_at) if run is not None else 0, run is not None, self.table.adopt_until > 0)
            current = stats is not None and run is not None and rate_is_current(
                bool(d["nodes"]) and rec.state in (JobState.RUNNING, JobState.PROFILING), bool(run.stalled), stats.generation,
                max(stats.worlds, default=0))
            if stats is not None and stats.world_size and current:
                est = stats.throughput.estimate(stats.world_size)
                d["rate"] = est.rate if est else None
            out.append(d)
        return out

    def status_nodes(self) -> list[dict[str, Any]]:
        owner = {n: r.id for r in self.table.runs.values() for n in r.members}
        return [{"node": node, "state": state, "job": owner.get(node, ""),
                 "trainer": self.decide.node_trainer(node) or ""}
                for node, state in self.scav.node_states().items()]
