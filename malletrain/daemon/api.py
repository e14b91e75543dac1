"""The control API: requests on the daemon's Unix socket (submit, cancel, status, nodes, shutdown,
ping), already authorised by :mod:`malletrain.control`. A submit or cancel is observed at once
(:meth:`.observe.Observe.submissions`); observe and decide never call the API."""

from __future__ import annotations

import os
from typing import Any, Callable

from malletrain.control import Caller, Cancel, ControlServer, Nodes, Ping, Request, Shutdown, Status, Submit
from malletrain.daemon.accounting import NodeAccounting
from malletrain.daemon.observe import Observe
from malletrain.daemon.state import JobTable
from malletrain.daemon.trainers import Decide
from malletrain.jobspec import JobSpec, JobSpecError, JobState, parse_spec
from malletrain.monitor import Monitor
from malletrain.scavenging import Scavenging
from malletrain.store import Store
from policy.health import pending_reason, rate_is_current


class ControlApi:
    """What the control socket asks of the daemon."""

    def __init__(self, table: JobTable, store: Store, monitor: Monitor, scav: Scavenging,
                 accounting: NodeAccounting, observe: Observe, decide: Decide, clock: Callable[[], float]) -> None:
        self.table = table
        self.store = store
        self.monitor = monitor
        self.scav = scav
        self.accounting = accounting
        self.observe = observe
        self.decide = decide
        self.clock = clock
        self._observed_change = False  # a request since the last serve() observed something new

    def serve(self, control: ControlServer) -> bool:
        """Answer the requests waiting on ``control``; returns whether one (or one handled since the
        last serve) changed the jobs."""
        control.serve(0)
        changed, self._observed_change = self._observed_change, False
        return changed

    def owner_of(self, job_id: str) -> int | None:
        rec = self.store.get(job_id)
        if rec is None:
            return None
        return int(rec.owner_uid) if rec.owner_uid is not None else os.geteuid()

    def handle(self, req: Request, caller: Caller) -> dict[str, Any]:
        """One authorised control request (``control.authorize`` has checked who may do it)."""
        if isinstance(req, Submit):
            spec = parse_spec(req.spec, "submitted job").resolved(where="submitted job")  # `python` -> this Python
            why = self.table.unknown_trainer(spec)
            if why is not None:
                raise JobSpecError(f"submitted job: {why}")
            jid = self._submit(spec, req.owner_uid, req.owner_gid)
            self._observed_change |= self.observe.submissions(self.clock())
            return {"ok": True, "id": jid}
        if isinstance(req, Cancel):
            state = self.store.request_cancel(req.job)
            self._observed_change |= self.observe.submissions(self.clock())
            return {"ok": True, "id": req.job, "state": self.store.require(req.job).state.value, "was": state.value}
        if isinstance(req, Status):
            return {"ok": True, "jobs": self.status_jobs(), "nodes": self.status_nodes()}
        if isinstance(req, Nodes):
            return {"ok": True, "nodes": self.status_nodes()}
        if isinstance(req, Shutdown):
            self.table.stopping = True
            return {"ok": True}
        assert isinstance(req, Ping)
        return {"ok": True, "pid": os.getpid()}

    def _submit(self, spec: JobSpec, owner_uid: int, owner_gid: int) -> str:
        return self.store.submit(spec, owner_uid=owner_uid, owner_gid=owner_gid)

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
