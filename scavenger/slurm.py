"""The Slurm backend: pilots are ``sbatch --no-requeue --exclusive`` jobs in a preemptable partition.

Facts it relies on (Slurm 22.05): a node is ours when ``sinfo`` says ``idle`` with no flag
(``planned``: backfill keeps it; ``squeue --start`` gives those claims). Preemption SIGTERMs job
*steps*, so the agent runs under ``srun``; in the grace time ``squeue`` says RUNNING with the end
cut short (:attr:`PilotState.ENDING`). A preempted pilot that exits promptly ends COMPLETED: only
``PreemptTime`` in ``scontrol show job -o`` tells (one lookup per ended pilot). A bad reply is a
:class:`~scavenger.base.BadReply` naming the command and the line.
"""

from __future__ import annotations

import calendar
import math
import re
import shlex
import time
import logging
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Callable, Sequence

from hostlist import expand_hostlist
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
from contract.nodeshape import NodeShapeError, parse_gres_gpus
from scavenger.pilots import BatchBackend, BatchConfig, Observation, require_ok

log = logging.getLogger("malletrain.slurm")

# ---- states ----------------------------------------------------------------------------

SLURM_STATES: dict[str, tuple[PilotState, EndReason | None]] = {
    # queued: no node yet (CONFIGURING: nodes allocated but booting, not usable yet)
    "PENDING": (PilotState.QUEUED, None),
    "CONFIGURING": (PilotState.QUEUED, None),
    "REQUEUED": (PilotState.QUEUED, None),
    "REQUEUE_HOLD": (PilotState.QUEUED, None),
    "REQUEUE_FED": (PilotState.QUEUED, None),
    "RESV_DEL_HOLD": (PilotState.QUEUED, None),
    # running on its nodes
    "RUNNING": (PilotState.RUNNING, None),
    "RESIZING": (PilotState.RUNNING, None),
    "SIGNALING": (PilotState.RUNNING, None),
    # on the way out
    "COMPLETING": (PilotState.ENDING, None),
    "STAGE_OUT": (PilotState.ENDING, None),
    # stopped in place: a recall
    "SUSPENDED": (PilotState.SUSPENDED, None),
    "STOPPED": (PilotState.SUSPENDED, None),
    # ended; None: only PreemptTime can tell a preemption from an exit or someone's cancel
    "COMPLETED": (PilotState.ENDED, None),
    "CANCELLED": (PilotState.ENDED, EndReason.CANCELLED),
    "PREEMPTED": (PilotState.ENDED, EndReason.PREEMPTED),
    "TIMEOUT": (PilotState.ENDED, EndReason.TIMEOUT),
    "DEADLINE": (PilotState.ENDED, EndReason.TIMEOUT),
    "FAILED": (PilotState.ENDED, EndReason.FAILED),
    "NODE_FAIL": (PilotState.ENDED, EndReason.FAILED),
    "BOOT_FAIL": (PilotState.ENDED, EndReason.FAILED),
    "OUT_OF_MEMORY": (PilotState.ENDED, EndReason.FAILED),
    "SPECIAL_EXIT": (PilotState.ENDED, EndReason.FAILED),
    "REVOKED": (PilotState.ENDED, EndReason.FAILED),
}
"""Slurm job state (``squeue %T``, ``scontrol JobState``) -> pilot state and, when the state
says it, why it ended. Anything else is :attr:`PilotState.UNKNOWN`."""


def translate_job_state(raw: str) -> tuple[PilotState, EndReason | None]:
    return SLURM_STATES.get(raw.strip().upper(), (PilotState.UNKNOWN, None))


NODE_STATES: dict[str, NodeState] = {
    "idle": NodeState.IDLE,
    "planned": NodeState.IDLE,  # idle but planned: NodeInfo.planned
    "allocated": NodeState.BUSY,
    "mixed": NodeState.BUSY,
    "completing": NodeState.BUSY,
    "reserved": NodeState.BUSY,
    "maint": NodeState.BUSY,
    "blocked": NodeState.BUSY,
    "down": NodeState.DOWN,
    "drained": NodeState.DOWN,
    "draining": NodeState.DOWN,
    "fail": NodeState.DOWN,
    "failing": NodeState.DOWN,
    "future": NodeState.DOWN,
    "inval": NodeState.DOWN,
    "powered_down": NodeState.DOWN,
    "powering_down": NodeState.DOWN,
    "powering_up": NodeState.DOWN,
    "power_down": NodeState.DOWN,
    "reboot_issued": NodeState.DOWN,
    "reboot_requested": NodeState.DOWN,
    "perfctrs": NodeState.BUSY,
    "unknown": NodeState.UNKNOWN,
}
"""``sinfo %T`` base state -> node state. Flags after it: ``-`` planned; ``$`` maintenance
reservation (busy); ``* ~ # ! % @ ^`` not responding / powered off / powering / reboot (down);
``+`` more states follow (not plainly idle)."""

_NODE_SUFFIX_DOWN = set("*~#!%@^")


def translate_node_state(raw: str) -> tuple[NodeState, bool]:
    """``sinfo %T`` text -> (state, planned). Unknown words give UNKNOWN (never idle)."""
    text = raw.strip().lower()
    base = text.rstrip("*~#!%$@^-+")
    flags = set(text[len(base):])
    state = NODE_STATES.get(base, NodeState.UNKNOWN)
    planned = base == "planned" or "-" in flags
    if flags & _NODE_SUFFIX_DOWN:
        state = NodeState.DOWN
    elif "$" in flags and state is NodeState.IDLE:
        state = NodeState.BUSY
    elif "+" in flags and state is NodeState.IDLE:
        state = NodeState.UNKNOWN
    return state, planned


# ---- small pure parsers ------------------------------------------------------------------


def parse_time(text: str) -> float | None:
    """Slurm's ``2026-11-24T17:21:51`` (local time) -> epoch seconds; N/A, Unknown, None -> None."""
    text = text.strip()
    if text in ("", "N/A", "Unknown", "None", "(null)"):
        return None
    if _ISO_TIME.fullmatch(text):  # the layout Slurm prints: the value strptime gives, 10x faster
        try:
            return datetime(int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]), int(text[14:16]),
                            int(text[17:19])).timestamp()
        except ValueError:
            pass  # out of range (month 13, 24:00:00): strptime says why
    return _strptime(text)


_EPOCH_DAY = date(1970, 1, 1).toordinal()
_ISO_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")


def _strptime(text: str) -> float:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        raise ValueError(f"bad Slurm time {text!r}") from None


def parse_duration(text: str) -> float | None:
    """Slurm's ``[D-]HH:MM:SS`` / ``MM:SS`` / ``M`` -> seconds; UNLIMITED, INVALID, NOT_SET -> None."""
    text = text.strip()
    if text.upper() in ("", "UNLIMITED", "INFINITE", "INVALID", "NOT_SET", "N/A"):
        return None
    days = 0
    if "-" in text:
        d, _, text = text.partition("-")
        if not d.isdigit():
            raise ValueError(f"bad Slurm duration {text!r}")
        days = int(d)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        raise ValueError(f"bad Slurm duration {text!r}")
    nums = [int(p) for p in parts]
    if len(parts) == 1:
        secs = nums[0] * 60
    elif len(parts) == 2:
        secs = nums[0] * 60 + nums[1]
    else:
        secs = nums[0] * 3600 + nums[1] * 60 + nums[2]
    return float(days * 86400 + secs)


class ReplyTimes:
    """:func:`parse_time` and :func:`parse_duration` for the lines of one reply (10,000 at full
    scale), same values and errors, fast: the local UTC offset is looked up once per hour (an hour
    in which it changes, a DST switch, is converted the slow way). Make one per reply.
    """

    def __init__(self) -> None:
        self._hours: dict[str, float | None] = {}  # "YYYY-MM-DDTHH" -> its first second, epoch (None: not one offset)
        self._durations: dict[str, float | None] = {}
        self._times: dict[str, float | None] = {}  # a time's text -> its value (pilots start in bursts)

    def time(self, text: str) -> float | None:
        if text in self._times:
            return self._times[text]
        value = self._times[text] = self._time(text)  # (a bad one raises: never kept)
        return value

    def _time(self, text: str) -> float | None:
        if len(text) != 19 or not _ISO_TIME.fullmatch(text):
            return parse_time(text)
        hour = text[:13]
        if hour in self._hours:
            start = self._hours[hour]
        else:
            start = self._hours[hour] = _hour_start(text)
        minute, second = int(text[14:16]), int(text[17:19])
        if start is None or minute > 59 or second > 59:
            return parse_time(text)  # a DST hour, or out of range (then parse_time names it)
        return start + minute * 60 + second

    def duration(self, text: str) -> float | None:
        if text not in self._durations:
            self._durations[text] = parse_duration(text)
        return self._durations[text]


def _hour_start(text: str) -> float | None:
    """Epoch seconds of the first second of the hour of ``text`` (local time); None when that hour
    has not one UTC offset throughout (or is not valid)."""
    offset = _hour_offset(text)
    if offset is None:
        return None
    day = date(int(text[0:4]), int(text[5:7]), int(text[8:10])).toordinal() - _EPOCH_DAY
    return day * 86400.0 + int(text[11:13]) * 3600 + offset


def _hour_offset(text: str) -> float | None:
    """Local time minus UTC over the hour of ``text``; None when not one offset (or not valid)."""
    try:
        y, mo, d, h = int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13])
        first, last = datetime(y, mo, d, h).timestamp(), datetime(y, mo, d, h, 59, 59).timestamp()
    except (ValueError, OverflowError):
        return None
    if last - first != 3599.0:
        return None
    return first - calendar.timegm((y, mo, d, h, 0, 0))


def parse_scontrol_record(text: str) -> dict[str, str]:
    """One ``scontrol show job -o`` line -> fields. Values may contain spaces, so a new field
    starts only at ``␠Key=`` with a known-looking key; the first occurrence of a key wins."""
    out: dict[str, str] = {}
    matches = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=", text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        out.setdefault(m.group(1), text[m.end():end].strip())
    return out


# ---- config and dialect ----------------------------------------------------------------------

SQUEUE_FORMAT = "%i|%P|%T|%r|%N|%S|%e|%l"
SINFO_FORMAT = "%N|%T|%G"
"""Node, state and generic resources (``gpu:4``: the node's shape, see :mod:`contract.nodeshape`)."""
START_FORMAT = "%i|%P|%j|%S|%Y"


@dataclass(frozen=True)
class SlurmConfig(BatchConfig):
    """Where and how pilots run: ``partition``/``qos`` the preemptable queue (set at least one).
    ``job_name`` tags our pilots (``squeue -n``): make it unique per daemon."""

    partition: str | None = "preemptable"
    qos: str | None = None
    job_name: str = "malletrain-pilot"
    workdir: str | None = None
    exclusive: bool = True
    extra_sbatch_args: tuple[str, ...] = ()

    def check(self) -> None:
        super().check()
        if not (self.partition or self.qos):
            raise ValueError("slurm config: set a preemptable partition or QOS")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.job_name):
            raise ValueError(f"slurm config: job_name {self.job_name!r} must be letters, digits, _ . -")


def format_minutes(seconds: float) -> str:
    """``--time`` value: whole minutes, rounded up, at least 1 (Slurm keeps limits in minutes)."""
    return str(max(1, math.ceil(seconds / 60.0)))


@dataclass
class SlurmDialect:
    """Slurm's commands (pure render/parse). See the module docstring for the facts."""

    config: SlurmConfig
    name: str = field(default="slurm", init=False)
    _last_poll: dict[str, Observation] = field(default_factory=dict, init=False, repr=False, compare=False)
    _last_nodes: dict[str, NodeInfo] = field(default_factory=dict, init=False, repr=False, compare=False)
    """The last ``squeue`` reply's lines -> their observations (a line's observation depends on its
    text alone): a poll parses only the lines that changed since the last one."""

    # -- nodes
    def render_nodes(self) -> list[str]:
        argv = ["sinfo", "-N", "-h", "-o", SINFO_FORMAT]
        if self.config.partition:
            argv[3:3] = ["-p", self.config.partition]
        return argv

    def parse_nodes(self, res: CommandResult) -> tuple[NodeInfo, ...]:
        """Every node of ``sinfo`` once, by name (a line the last reply had is not parsed again)."""
        require_ok(res, "sinfo")
        seen: dict[str, NodeInfo] = {}
        states: dict[str, tuple[NodeState, bool]] = {}  # raw state -> translated, for this reply
        last, lines = self._last_nodes, {}
        for no, line in enumerate(res.stdout.splitlines(), 1):
            known = last.get(line)
            if known is not None:  # (a line's node is what its text says: the one parsed from it before)
                lines[line] = known
                seen.setdefault(known.name, known)  # once per partition: first wins
                continue
            if not line.strip():
                continue
            fields = line.split("|")
            if len(fields) not in (2, 3) or not fields[0].strip() or not fields[1].strip():
                raise BadReply(f"sinfo line {no}: expected NODE|STATE|GRES, got {line!r}", res)
            name, raw = fields[0].strip(), fields[1].strip()
            try:
                gpus = parse_gres_gpus(fields[2]) if len(fields) == 3 else None
            except NodeShapeError as exc:  # one node's Gres unread: that node is not held, the others are
                log.warning("sinfo: node %s skipped (line %d): %s", name[:80], no, exc)
                continue
            if name in seen:
                continue  # once per partition: first wins
            if raw not in states:
                states[raw] = translate_node_state(raw)
            state, planned = states[raw]
            seen[name] = lines[line] = NodeInfo(name, state, planned, raw, gpus)
        self._last_nodes = lines
        return tuple(seen[n] for n in sorted(seen))

    def render_claims(self) -> list[str]:
        return ["squeue", "-h", "--start", "-t", "PD", "-o", START_FORMAT]

    def parse_claims(self, res: CommandResult) -> tuple[Claim, ...]:
        require_ok(res, "squeue --start")
        out = []
        for no, line in enumerate(res.stdout.splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("|")
            if len(fields) != 5:
                raise BadReply(f"squeue --start line {no}: expected {START_FORMAT}, got {line!r}", res)
            job, part, name, start, nodes = (f.strip() for f in fields)
            if name == self.config.job_name:
                continue  # our own pilots are not claims
            try:
                when, hosts = parse_time(start), expand_hostlist(nodes) or ()
            except ValueError as exc:
                raise BadReply(f"squeue --start line {no}: {exc}", res) from None
            if hosts:
                out.append(Claim(job, hosts, when, part))
        return tuple(out)

    # -- submit / cancel
    def agent_command(self) -> str:
        """The batch script: one agent per node under ``srun`` (so preemption signals reach it),
        named after ``$SLURMD_NODENAME`` (``agent_args``: ``--key-file PATH``, never the key). A recalled agent exits 143; the task's shell (``trap :
        TERM``) reports that as 0, so a pilot that left promptly ends COMPLETED."""
        cfg = self.config
        agent = " ".join(
            [shlex.quote(cfg.python), "-m", "scavenger.agent", "--node", '"$SLURMD_NODENAME"',
             "--daemon", shlex.quote(cfg.daemon_address), *(shlex.quote(a) for a in cfg.agent_args)]
        )
        task = f'trap : TERM; {agent}; code=$?; [ "$code" -eq 143 ] && exit 0; exit "$code"'
        return (
            "exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 "
            f"/bin/sh -c {shlex.quote(task)}"
        )

    def render_submit(self, request: PilotRequest, walltime_s: float) -> list[str]:
        cfg = self.config
        argv = ["sbatch", "--parsable", f"--job-name={cfg.job_name}"]
        if cfg.partition:
            argv.append(f"--partition={cfg.partition}")
        if cfg.qos:
            argv.append(f"--qos={cfg.qos}")
        if cfg.account:
            argv.append(f"--account={cfg.account}")
        argv += [f"--nodes={cfg.nodes_per_pilot}", "--ntasks-per-node=1", "--no-requeue",
                 f"--time={format_minutes(walltime_s)}", f"--output={cfg.output}"]
        if cfg.exclusive:
            argv.append("--exclusive")
        if request.nodes:
            argv.append(f"--nodelist={','.join(request.nodes)}")
        if request.after is not None:
            argv += [f"--dependency=afterany:{request.after}", "--kill-on-invalid-dep=yes"]
        if cfg.workdir:
            argv.append(f"--chdir={cfg.workdir}")
        argv += list(cfg.extra_sbatch_args)
        argv += ["--wrap", self.agent_command()]
        return argv

    def parse_submit(self, res: CommandResult) -> PilotId:
        require_ok(res, "sbatch")
        text = res.stdout.strip()
        job = text.split(";", 1)[0]
        if not re.fullmatch(r"\d+", job):
            raise BadReply(f"sbatch --parsable: expected a job id, got {text[:100]!r}", res)
        return PilotId(job)

    def render_cancel(self, pilots: Sequence[PilotId]) -> list[str]:
        return ["scancel", *pilots]

    def check_cancel(self, res: CommandResult) -> None:
        require_ok(res, "scancel", ("already completing or completed", "Invalid job id specified"))  # idempotent

    # -- poll
    def render_poll(self, pilots: Sequence[PilotId]) -> list[str]:
        return ["squeue", "-h", "-t", "all", "-n", self.config.job_name, "-o", SQUEUE_FORMAT]

    def parse_poll(self, res: CommandResult, pilots: Sequence[PilotId]) -> list[Observation]:
        """Our pilots' lines of ``squeue``, parsed (a line the last reply had too is not parsed
        again: at 10,000 pilots most lines do not change from one poll to the next)."""
        require_ok(res, "squeue")
        wanted = set(pilots)
        out = []
        times = ReplyTimes()
        last, seen = self._last_poll, {}
        for no, line in enumerate(res.stdout.splitlines(), 1):
            obs = last.get(line)
            if obs is None:
                if not line or line.isspace():
                    continue
                obs = parse_squeue_line(line, res, no, times)
            seen[line] = obs
            if obs.pilot in wanted:
                out.append(obs)
        self._last_poll = seen
        return out

    def render_detail(self, pilot: PilotId) -> list[str]:
        return ["scontrol", "show", "job", "-o", str(pilot)]

    def parse_detail(self, res: CommandResult, pilot: PilotId) -> Observation | None:
        if res.returncode != 0 and "Invalid job id" in res.stderr:
            return None
        require_ok(res, "scontrol show job")
        line = next((ln for ln in res.stdout.splitlines() if ln.strip()), "")
        rec = parse_scontrol_record(line)
        if rec.get("JobId") != str(pilot) or "JobState" not in rec:
            raise BadReply(f"scontrol show job {pilot}: no JobId={pilot} JobState=... in {line[:120]!r}", res)
        state, reason = translate_job_state(rec["JobState"])
        try:
            preempt = parse_time(rec.get("PreemptTime", "None"))
            start, end = parse_time(rec.get("StartTime", "")), parse_time(rec.get("EndTime", ""))
            nodes = expand_hostlist(rec.get("NodeList", "")) or ()
        except ValueError as exc:
            raise BadReply(f"scontrol show job {pilot}: {exc}", res) from None
        detail = rec["JobState"] + (f" (preempted at {rec['PreemptTime']})" if preempt is not None else "")
        return Observation(pilot, state, rec["JobState"], nodes, start, end, None, reason,
                           preempted=preempt is not None, detail=detail)


def parse_squeue_line(line: str, res: CommandResult, no: int, times: ReplyTimes | None = None) -> Observation:
    """One ``squeue -o SQUEUE_FORMAT`` line -> an observation (``times``: the reply's
    :class:`ReplyTimes`). A RUNNING job ending before start + limit was preempted: ENDING."""
    times = times if times is not None else ReplyTimes()
    fields = line.split("|")
    if len(fields) != 8:
        raise BadReply(f"squeue line {no}: expected {SQUEUE_FORMAT}, got {line!r}", res)
    if not line.isascii() or not line.isprintable() or " " in line:  # (Slurm's own lines are neither)
        fields = [f.strip() for f in fields]
    job, _part, raw, reason_text, nodes_text, start_text, end_text, limit_text = fields
    if not (job.isdigit() and job.isascii()) and not _JOB_ID.fullmatch(job):
        raise BadReply(f"squeue line {no}: bad job id {job!r} in {line!r}", res)
    try:
        nodes = expand_hostlist(nodes_text) or ()
        start, end, limit = times.time(start_text), times.time(end_text), times.duration(limit_text)
    except ValueError as exc:
        raise BadReply(f"squeue line {no}: {exc} in {line!r}", res) from None
    return squeue_observation(job, raw, reason_text, nodes, start, end, limit)


def squeue_observation(job: str, raw: str, reason_text: str, nodes: tuple[str, ...], start: float | None,
                       end: float | None, limit: float | None) -> Observation:
    """One ``squeue`` line's fields, converted, -> its observation."""
    state, reason = SLURM_STATES.get(raw) or translate_job_state(raw)
    preempted: bool | None = True if reason is EndReason.PREEMPTED else None
    deadline = None
    if state is PilotState.RUNNING:
        preempted = False
        if start is not None and end is not None and limit is not None and end < start + limit - 1:
            state, preempted, deadline = PilotState.ENDING, True, end
    expires = end if state in (PilotState.RUNNING, PilotState.ENDING) else None
    if state is PilotState.QUEUED:
        start = None
    detail = raw if reason_text in ("", "None") else f"{raw} ({reason_text})"
    return Observation(PilotId(job), state, raw, nodes, start, expires, deadline, reason, preempted, detail)


_JOB_ID = re.compile(r"\d+(_\d+)?")


class SlurmBackend(BatchBackend):
    """Pilots as Slurm batch jobs (see :class:`SlurmConfig`, :class:`SlurmDialect`)."""

    def __init__(self, config: SlurmConfig, clock: Callable[[], float] | None = None,
                 runner: Runner = run_command) -> None:
        super().__init__(SlurmDialect(config), config, clock or time.time, runner)
