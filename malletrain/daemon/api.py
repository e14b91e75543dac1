"""The control API: requests on the daemon's Unix socket (submit, cancel, status, nodes, shutdown,
ping), already authorised by :mod:`malletrain.control`, and the per-job report secrets."""

from __future__ import annotations

import os
from typing import Any

from malletrain.daemon.base import DaemonBase
from malletrain.control import Caller, Cancel, Nodes, Ping, Request, Shutdown, Status, Submit
from malletrain.jobspec import JobSpec, JobSpecError, parse_spec
from malletrain.monitor import job_secret


class ControlApi(DaemonBase):
    """What the control socket asks of the daemon."""

    def _serve_control(self) -> None:
        self.control.serve(0)

    def _register(self, job_id: str) -> None:
        """The monitor takes this job's reports, signed with its secret, and no more progress than
        its max_nodes could train."""
        rec = self.store.get(job_id)
        self.monitor.register(job_id, self.job_secret(job_id), max_nodes=rec.spec.max_nodes if rec else None)

    def job_secret(self, job_id: str) -> str:
        """The job's report-signing secret, derived from the daemon's private key (nothing stored per job)."""
        return job_secret(self._monitor_key, job_id)

    def _owner_of(self, job_id: str) -> int | None:
        rec = self.store.get(job_id)
        if rec is None:
            return None
        return int(rec.owner_uid) if rec.owner_uid is not None else os.geteuid()

    def handle(self, req: Request, caller: Caller) -> dict[str, Any]:
        """One authorised control request (``control.authorize`` has checked who may do it)."""
        if isinstance(req, Submit):
            spec = parse_spec(req.spec, "submitted job").resolved(where="submitted job")  # `python` -> this Python
            why = self.unknown_trainer(spec)
            if why is not None:
                raise JobSpecError(f"submitted job: {why}")
            jid = self._submit(spec, req.owner_uid, req.owner_gid)
            self._observe_store(self.clock())
            return {"ok": True, "id": jid}
        if isinstance(req, Cancel):
            state = self.store.request_cancel(req.job)
            self._observe_store(self.clock())
            return {"ok": True, "id": req.job, "state": self.store.require(req.job).state.value, "was": state.value}
        if isinstance(req, Status):
            return {"ok": True, "jobs": self.status_jobs(), "nodes": self.status_nodes()}
        if isinstance(req, Nodes):
            return {"ok": True, "nodes": self.status_nodes()}
        if isinstance(req, Shutdown):
            self.stopping = True
            return {"ok": True}
        assert isinstance(req, Ping)
        return {"ok": True, "pid": os.getpid()}

    def _submit(self, spec: JobSpec, owner_uid: int, owner_gid: int) -> str:
        return self.store.submit(spec, owner_uid=owner_uid, owner_gid=owner_gid)

    def status_jobs(self) -> list[dict[str, Any]]:
        out = []
        for rec in self.store.jobs():
            d = rec.as_dict()
            d["trainer"] = self.trainer_name(rec.spec)
            if rec.spec.budget_node_hours is not None:
                d["budget_node_hours"] = rec.spec.budget_node_hours
                if rec.id in self.accounting.node_seconds:
                    d["used_node_hours"] = self.used_node_hours(rec.id)
            if rec.spec.deadline is not None:
                d["deadline"] = rec.spec.deadline
            run = self.runs.get(rec.id)
            stats = self.monitor.jobs.get(rec.id)
            if run is not None:
                d["samples"] = max(d["samples"], run.last_progress)
                d["nodes"] = list(run.members)
                if run.waiting:
                    d["waiting"] = run.waiting
            if stats is not None and stats.world_size and d["nodes"]:
                est = stats.throughput.estimate(stats.world_size)
                d["rate"] = est.rate if est else None
            out.append(d)
        return out

    def status_nodes(self) -> list[dict[str, Any]]:
        owner = {n: r.id for r in self.runs.values() for n in r.members}
        return [{"node": node, "state": state, "job": owner.get(node, ""), "trainer": self.node_trainer(node) or ""}
                for node, state in self.scav.node_states().items()]
