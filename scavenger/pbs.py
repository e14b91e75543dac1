"""The PBS Pro / OpenPBS backend: pilots are ``qsub -r y`` jobs in a preemptable queue.

Replies are OpenPBS 23.06's JSON (``pbsnodes -av -F json``, ``qstat -f -F json``; recorded in
``tests/fixtures/pbs/``). Nodes are vnodes (``select=1:ncpus=N:vnode=NAME``, read back from
``exec_vnode``). The fields and what each ``preempt_order`` does to a pilot: docs/operators/pbs.md.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence

from contract.exits import EXIT_SIGTERM
from scavenger.base import (
    BadReply,
    Claim,
    CommandResult,
    EndReason,
    NodeInfo,
    NodeState,
    PilotId,
    PilotRequest,
    PilotState,
    Runner,
    run_command,
)
from contract.nodeshape import NodeShapeError, pbs_ngpus
from scavenger.pilots import BatchBackend, BatchConfig, Observation, require_ok

log = logging.getLogger("malletrain.pbs")

PBS_STATES: dict[str, PilotState] = {
    "Q": PilotState.QUEUED,  # queued, eligible to run
    "H": PilotState.QUEUED,  # held
    "W": PilotState.QUEUED,  # waiting for its execution time (or a dependency)
    "T": PilotState.QUEUED,  # in transit to a new location
    "R": PilotState.RUNNING,  # running
    "B": PilotState.RUNNING,  # array job: at least one subjob started
    "E": PilotState.ENDING,  # exiting after having run
    "S": PilotState.SUSPENDED,  # suspended (preemption by suspension): a recall
    "U": PilotState.SUSPENDED,  # suspended because the workstation became busy: a recall
    "F": PilotState.ENDED,  # finished (job history)
    "X": PilotState.ENDED,  # subjob finished (expired)
    "M": PilotState.ENDED,  # moved to another server: no longer a pilot here
}
"""PBS ``job_state`` -> pilot state; any other letter is :attr:`PilotState.UNKNOWN`."""

NODE_STATES: dict[str, NodeState] = {
    "free": NodeState.IDLE,
    "job-busy": NodeState.BUSY,
    "job-exclusive": NodeState.BUSY,
    "resv-exclusive": NodeState.BUSY,
    "busy": NodeState.BUSY,
    "down": NodeState.DOWN,
    "offline": NodeState.DOWN,
    "stale": NodeState.DOWN,
    "state-unknown": NodeState.DOWN,
    "unresolvable": NodeState.DOWN,
    "sleep": NodeState.DOWN,
    "maintenance": NodeState.DOWN,
    "provisioning": NodeState.DOWN,
    "wait-provisioning": NodeState.DOWN,
    "initializing": NodeState.DOWN,
}
"""One component of a PBS node ``state`` -> node state; a node is idle only if every
component is ``free``. Unknown words give UNKNOWN (never idle)."""

_SEVERITY = {NodeState.IDLE: 0, NodeState.BUSY: 1, NodeState.UNKNOWN: 2, NodeState.DOWN: 3}

RERUN_SUBSTATES = frozenset({60, 61, 62, 63})
"""``substate`` of a job being requeued (OpenPBS job.h JOB_SUBSTATE_RERUN..RERUN3): still R,
then E, before it is back in Q; its node is being taken, so it counts as queued again."""
JOB_EXEC_KILL_WALLTIME = -29
"""``Exit_status`` of a job killed for exceeding its walltime (OpenPBS job.h)."""
SIGTERM_EXITS = (EXIT_SIGTERM, 256 + signal.SIGTERM)
"""Exit statuses after SIGTERM (128+15 from the agent, 256+15 when PBS reports the signal)."""
SCHEDULER_DELETE = "terminated by Scheduler@"
"""In the ``comment`` of a job the scheduler deleted to preempt it (preempt_order D); our own
``qdel`` reads "terminated by USER@host"."""
_UNKNOWN_JOB = ("Unknown Job Id", "Job has finished")


def translate_node_state(raw: str) -> NodeState:
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts:
        return NodeState.UNKNOWN
    states = [NODE_STATES.get(p.lower(), NodeState.UNKNOWN) for p in parts]  # the server prints "Stale"
    return max(states, key=_SEVERITY.__getitem__)


def parse_ctime(value: Any) -> float | None:
    """PBS's ``Tue Nov 24 17:00:00 2026`` (local time) -> epoch seconds; epoch numbers pass."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.strptime(" ".join(str(value).split()), "%a %b %d %H:%M:%S %Y").timestamp()
    except ValueError:
        raise ValueError(f"bad PBS time {value!r}") from None


def parse_walltime(value: Any) -> float | None:
    """``HH:MM:SS`` (or seconds, a number once the encoder made it one) -> seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    parts = str(value).split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"bad PBS walltime {value!r}")
    secs = 0
    for p in parts:
        secs = secs * 60 + int(p)
    return float(secs)


def format_walltime(seconds: float) -> str:
    s = max(60, int(-(-seconds // 1)))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def parse_exec_host(value: Any) -> tuple[str, ...]:
    """``n1/0+n2/0*2`` -> ``(n1, n2)`` (order kept, duplicates dropped)."""
    if not value:
        return ()
    hosts = [chunk.split("/", 1)[0].strip() for chunk in str(value).split("+")]
    if not all(hosts):
        raise ValueError(f"bad exec_host {value!r}")
    return tuple(dict.fromkeys(hosts))


def parse_exec_vnode(value: Any) -> tuple[str, ...]:
    """``(n1:ncpus=1)+(n2:ncpus=1)`` -> ``(n1, n2)``."""
    if not value:
        return ()
    out = tuple(dict.fromkeys(re.findall(r"\(([^:()+]+)", str(value))))
    if not out:
        raise ValueError(f"bad exec_vnode {value!r}")
    return out


def _load_json(res: CommandResult, what: str, key: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(res.stdout)
    except json.JSONDecodeError as exc:
        raise BadReply(f"{what}: not JSON ({exc}); output starts {res.stdout[:80]!r}", res) from None
    if not isinstance(doc, dict):
        raise BadReply(f"{what}: expected a JSON object, got {type(doc).__name__}", res)
    section = doc.get(key, {})
    if not isinstance(section, dict):
        raise BadReply(f"{what}: {key!r} is not an object", res)
    return section


# ---- config and dialect ----------------------------------------------------------------------


@dataclass(frozen=True)
class PbsConfig(BatchConfig):
    """Where and how pilots run: ``queue`` is the preemptable queue (see the module docstring
    for its ``preempt_order``); ``job_name`` tags our pilots (at most 15 characters on old
    servers); ``ncpus``: CPUs a pilot asks for on each node (with ``place=excl`` it gets all)."""

    queue: str = "preempt"
    job_name: str = "mt-pilot"
    ncpus: int = 1
    extra_qsub_args: tuple[str, ...] = ()

    def check(self) -> None:
        super().check()
        if not self.queue:
            raise ValueError("pbs config: set the preemptable queue")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]{0,235}", self.job_name):
            raise ValueError(f"pbs config: job_name {self.job_name!r} must start with a letter")


@dataclass
class PbsDialect:
    """OpenPBS commands (pure render/parse)."""

    config: PbsConfig
    name: str = field(default="pbs", init=False)

    # -- nodes
    def render_nodes(self) -> list[str]:
        return ["pbsnodes", "-av", "-F", "json"]

    def parse_nodes(self, res: CommandResult) -> tuple[NodeInfo, ...]:
        require_ok(res, "pbsnodes")
        nodes = _load_json(res, "pbsnodes -av -F json", "nodes")
        out = []
        for name, attrs in nodes.items():
            if not isinstance(attrs, dict) or not isinstance(attrs.get("state"), str):
                raise BadReply(f"pbsnodes: node {name!r} has no state string", res)
            if not runs_jobs(attrs):
                continue  # a host whose CPUs its vnodes expose (ncpus 0): no pilot can run there
            try:
                out.append(node_info(name, attrs))
            except NodeShapeError as exc:  # one node's ngpus unread: that node is not held, the others are
                log.warning("pbsnodes: node %.80r skipped: %s", name, exc)
        return tuple(sorted(out, key=lambda n: n.name))

    def render_claims(self) -> list[str]:
        return ["qstat", "-f", "-F", "json"]

    def parse_claims(self, res: CommandResult) -> tuple[Claim, ...]:
        require_ok(res, "qstat")
        jobs = _load_json(res, "qstat -f -F json", "Jobs")
        out = []
        for jid, attrs in jobs.items():
            if not isinstance(attrs, dict) or attrs.get("job_state") != "Q":
                continue
            if attrs.get("Job_Name") == self.config.job_name:
                continue
            est = attrs.get("estimated")
            if not isinstance(est, dict) or "exec_vnode" not in est:
                continue
            try:
                nodes, start = parse_exec_vnode(est["exec_vnode"]), parse_ctime(est.get("start_time"))
            except ValueError as exc:
                raise BadReply(f"qstat: job {jid}: {exc}", res) from None
            out.append(Claim(jid, nodes, start, str(attrs.get("queue", ""))))
        return tuple(out)

    # -- submit / cancel
    def agent_argv(self, nodes: Sequence[str]) -> list[str]:
        """The job's executable (``qsub -- ...``): the agent on one named node, or one per node
        through ``pbsdsh``, named after its host (``agent_args``: ``--key-file PATH``, never the key)."""
        cfg = self.config
        agent = [cfg.python, "-m", "scavenger.agent", "--daemon", cfg.daemon_address, *cfg.agent_args]
        if len(nodes) == 1:
            return agent[:3] + ["--node", nodes[0]] + agent[3:]
        script = "exec " + " ".join(shlex.quote(a) for a in agent[:3]) + ' --node "$(hostname -s)" ' + " ".join(
            shlex.quote(a) for a in agent[3:]
        )
        return ["pbsdsh", "--", "/bin/sh", "-c", script]

    def render_submit(self, request: PilotRequest, walltime_s: float) -> list[str]:
        cfg = self.config
        nodes = request.nodes
        if nodes:
            select = "+".join(f"1:ncpus={cfg.ncpus}:vnode={n}" for n in nodes)
        else:
            select = f"{cfg.nodes_per_pilot}:ncpus={cfg.ncpus}"
        argv = ["qsub", "-N", cfg.job_name, "-q", cfg.queue, "-r", "y", "-j", "oe", "-o", cfg.output,
                "-l", f"select={select}", "-l", "place=scatter:excl", "-l", f"walltime={format_walltime(walltime_s)}"]
        if cfg.account:
            argv += ["-A", cfg.account]
        if request.after is not None:
            argv += ["-W", f"depend=afterany:{request.after}"]
        argv += list(cfg.extra_qsub_args)
        return argv + ["--", *self.agent_argv(nodes)]

    def parse_submit(self, res: CommandResult) -> PilotId:
        require_ok(res, "qsub")
        text = res.stdout.strip()
        if not re.fullmatch(r"\d+(\[\d*\])?(\.[\w.-]+)?", text):
            raise BadReply(f"qsub: expected a job id like 123.server, got {text[:100]!r}", res)
        return PilotId(text)

    def render_cancel(self, pilots: Sequence[PilotId]) -> list[str]:
        return ["qdel", *pilots]

    def check_cancel(self, res: CommandResult) -> None:
        require_ok(res, "qdel", _UNKNOWN_JOB)  # already gone: cancel is idempotent

    # -- poll
    def render_poll(self, pilots: Sequence[PilotId]) -> list[str]:
        """Every unfinished job: ``qstat -F json`` prints only the first of several job ids named.
        A pilot missing from it ended (or was forgotten): the backend looks it up with ``-x``."""

        return ["qstat", "-f", "-F", "json"]

    def parse_poll(self, res: CommandResult, pilots: Sequence[PilotId]) -> list[Observation]:
        require_ok(res, "qstat", _UNKNOWN_JOB)  # every id unknown: not an error
        if not res.stdout.strip():
            return []  # every id unknown (the backend looks each one up)
        jobs = _load_json(res, "qstat", "Jobs")
        wanted = set(pilots)
        out = []
        for jid, attrs in jobs.items():
            if jid not in wanted:
                continue
            if not isinstance(attrs, dict):
                raise BadReply(f"qstat: job {jid} is not an object", res)
            try:
                out.append(job_observation(PilotId(jid), attrs))
            except (ValueError, KeyError) as exc:
                raise BadReply(f"qstat: job {jid}: {exc}", res) from None
        return out

    def render_detail(self, pilot: PilotId) -> list[str]:
        return ["qstat", "-x", "-f", "-F", "json", str(pilot)]

    def parse_detail(self, res: CommandResult, pilot: PilotId) -> Observation | None:
        found = self.parse_poll(res, [pilot])
        return found[0] if found else None


def runs_jobs(attrs: Mapping[str, Any]) -> bool:
    """False for a vnode with ``resources_available.ncpus`` 0 (a MoM's own vnode when the MoM
    exposes its CPUs as other vnodes); True when the entry does not say."""
    avail = attrs.get("resources_available")
    if not isinstance(avail, dict) or "ncpus" not in avail:
        return True
    return avail["ncpus"] not in (0, "0")


def node_info(name: str, attrs: Mapping[str, Any]) -> NodeInfo:
    """One ``pbsnodes`` entry -> a node. ``free`` with jobs or assigned CPUs is busy for an
    exclusive pilot; a node in a reservation (``resv``) is planned for it."""
    raw = attrs["state"]
    state = translate_node_state(raw)
    assigned = attrs.get("resources_assigned") or {}
    used = bool(attrs.get("jobs")) or bool(isinstance(assigned, dict) and assigned.get("ncpus"))
    if state is NodeState.IDLE and used:
        state = NodeState.BUSY
    return NodeInfo(name, state, planned=bool(attrs.get("resv")), raw=raw, gpus=pbs_ngpus(attrs))


def job_observation(pid: PilotId, attrs: Mapping[str, Any]) -> Observation:
    """One ``qstat -f -F json`` job -> an observation (end reason for F/X jobs included)."""
    raw = attrs.get("job_state")
    if not isinstance(raw, str):
        raise ValueError("no job_state")
    state = PBS_STATES.get(raw, PilotState.UNKNOWN)
    if raw in ("R", "E") and attrs.get("substate") in RERUN_SUBSTATES:
        state = PilotState.QUEUED  # being requeued: the node is lost, the job will wait in the queue
    nodes = parse_exec_vnode(attrs.get("exec_vnode")) or parse_exec_host(attrs.get("exec_host"))
    limits = attrs.get("Resource_List") or {}
    used = attrs.get("resources_used") or {}
    limit = parse_walltime(limits.get("walltime")) if isinstance(limits, dict) else None
    start = parse_ctime(attrs.get("stime"))
    expires = start + limit if start is not None and limit is not None else None
    comment = str(attrs.get("comment", ""))
    if state is not PilotState.ENDED:
        preempted = True if state is PilotState.SUSPENDED else (False if state is PilotState.RUNNING else None)
        if state is PilotState.QUEUED:
            start, expires = None, None
        return Observation(pid, state, raw, nodes, start, expires, None, None, preempted, comment or raw)
    exit_status = attrs.get("Exit_status")
    ran = parse_walltime(used.get("walltime")) if isinstance(used, dict) else None
    reason: EndReason | None
    by_scheduler = SCHEDULER_DELETE in comment
    if by_scheduler:
        reason = EndReason.PREEMPTED
    elif exit_status == JOB_EXEC_KILL_WALLTIME or (ran is not None and limit is not None and ran >= limit):
        reason = EndReason.TIMEOUT
    elif exit_status in SIGTERM_EXITS:
        reason = EndReason.PREEMPTED  # SIGTERM we did not send (ours is told apart by the backend)
    elif raw == "M":
        reason = EndReason.FAILED
    elif isinstance(exit_status, int) and exit_status != 0:
        reason = EndReason.FAILED
    else:
        reason = EndReason.EXITED
    detail = f"{raw} exit {exit_status}" + (f": {comment}" if comment else "")
    # The scheduler's delete is a preemption whatever we did; otherwise a SIGTERM exit is only a
    # hint (our own qdel sends SIGTERM too), weighed by classify_end after our cancels.
    return Observation(pid, state, raw, nodes, start, expires, None, reason, preempted=by_scheduler, detail=detail)


class PbsBackend(BatchBackend):
    """Pilots as PBS jobs (see :class:`PbsConfig`, :class:`PbsDialect`)."""

    def __init__(self, config: PbsConfig, clock: Callable[[], float] | None = None,
                 runner: Runner = run_command) -> None:
        super().__init__(PbsDialect(config), config, clock or time.time, runner)
