"""A Slurm stand-in for load tests: ``sinfo``/``squeue``/``sbatch``/``scancel``/``scontrol`` at any size.

:class:`FakeSlurm` keeps a machine of named nodes (idle, or allocated to the main
queue) and our pilot batch jobs, and answers the argv the Slurm backend renders
(:class:`scavenger.slurm.SlurmDialect`) with replies in the real formats, so the
backend's own parsers read them:

- ``sinfo -N -h [-p P] -o '%N|%T'``: one ``NODE|STATE`` line per node (``idle`` or
  ``allocated``; a node a pilot holds is ``allocated``);
- ``squeue -h -t all -n NAME -o '%i|%P|%T|%r|%N|%S|%e|%l'``: our pilots, ended ones for
  :data:`MIN_JOB_AGE_S` (Slurm's ``MinJobAge``);
- ``squeue -h --start -t PD -o '%i|%P|%j|%S|%Y'``: our pending pilots (no main-queue claims);
- ``sbatch --parsable ... --nodelist=N``: a pilot, RUNNING at once when its node is idle
  (else PENDING until it is), ``--dependency=afterany:J`` waits for J to end;
- ``scancel J...``; ``scontrol show job -o J`` (``PreemptTime`` set for a preempted pilot).

The main queue is driven from outside: :meth:`FakeSlurm.recall` gives a node to the main
queue (a pilot there is preempted: it ends COMPLETED with ``PreemptTime``, as a pilot
whose agent left promptly does on the real cluster) and :meth:`FakeSlurm.give_back`
makes it idle again. ``on_start(node, pilot)`` and ``on_stop(node, pilot, why)`` tell the
caller when a pilot starts on a node or leaves it (its agent should then start or exit).

:func:`serve_once` answers one request of a :func:`remote_runner` (a
:data:`scavenger.base.Runner` that sends argv over ZeroMQ), so a daemon in another
process can be given the stand-in as its command runner.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Sequence

from scavenger.base import CommandResult, CommandTimeout

MIN_JOB_AGE_S = 300.0
"""How long an ended job stays in ``squeue -t all`` (Slurm's default ``MinJobAge``)."""

SLURM_TIME = "%Y-%m-%dT%H:%M:%S"


def slurm_time(t: float | None) -> str:
    """Epoch seconds as Slurm prints them (local time); None: ``N/A``."""
    return "N/A" if t is None else datetime.fromtimestamp(t).strftime(SLURM_TIME)


def slurm_duration(seconds: float) -> str:
    """``[D-]HH:MM:SS`` as ``%l`` prints a time limit."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


@dataclass
class FakeJob:
    """One of our pilot batch jobs."""

    id: str
    name: str
    partition: str
    nodes: tuple[str, ...]
    limit_s: float
    after: str | None = None
    state: str = "PENDING"
    start: float | None = None
    end: float | None = None
    preempt_time: float | None = None


NodeHook = Callable[[str, str], None]
StopHook = Callable[[str, str, str], None]


@dataclass
class FakeSlurm:
    """The machine and our pilots; :meth:`run` answers one command (see the module doc)."""

    nodes: Sequence[str]
    partition: str = "preemptable"
    clock: Callable[[], float] = time.time
    on_start: NodeHook | None = None
    on_stop: StopHook | None = None
    first_id: int = 1000
    commands: dict[str, int] = field(default_factory=dict)
    _busy: set[str] = field(default_factory=set)  # allocated to the main queue
    _holder: dict[str, str] = field(default_factory=dict)  # node -> running pilot
    _jobs: dict[str, FakeJob] = field(default_factory=dict)
    _next: int = 0

    def __post_init__(self) -> None:
        self.nodes = tuple(self.nodes)
        self._known = frozenset(self.nodes)
        self._next = self.first_id

    # ---------------------------------------------------------------- the main queue
    def recall(self, node: str) -> str | None:
        """The main queue takes ``node``; returns the pilot it preempted there (or None)."""
        self._busy.add(node)
        pid = self._holder.pop(node, None)
        if pid is None:
            return None
        job = self._jobs[pid]
        now = self.clock()
        job.state, job.end, job.preempt_time = "COMPLETED", now, now
        for other in job.nodes:
            if other != node:
                self._holder.pop(other, None)
        for n in job.nodes:
            self._stopped(n, pid, "recalled")
        return pid

    def give_back(self, node: str) -> None:
        """The main queue's job on ``node`` ended: idle again (a pending pilot may start there)."""
        self._busy.discard(node)

    def is_idle(self, node: str) -> bool:
        return node not in self._busy and node not in self._holder

    def tick(self) -> None:
        """Start pending pilots whose nodes are free (and whose dependency ended); end those past
        their time limit; forget ended jobs older than :data:`MIN_JOB_AGE_S`."""
        now = self.clock()
        for job in list(self._jobs.values()):
            if job.state == "PENDING":
                self._try_start(job, now)
            elif job.state == "RUNNING" and job.start is not None and now >= job.start + job.limit_s:
                self._end(job, "TIMEOUT", now, "timeout")
            elif job.end is not None and job.state not in ("PENDING", "RUNNING") and now - job.end > MIN_JOB_AGE_S:
                del self._jobs[job.id]

    def running(self) -> dict[str, str]:
        """Node -> the running pilot on it."""
        return dict(self._holder)

    # ---------------------------------------------------------------- commands
    def run(self, argv: Sequence[str], timeout: float = 30.0, check: bool = False,
            env: object = None) -> CommandResult:
        """Answer one command as Slurm would (a :data:`scavenger.base.Runner`)."""
        t0 = time.perf_counter()
        args = tuple(str(a) for a in argv)
        name = args[0] if args else ""
        self.commands[name] = self.commands.get(name, 0) + 1
        handler = {"sinfo": self._sinfo, "squeue": self._squeue, "sbatch": self._sbatch,
                   "scancel": self._scancel, "scontrol": self._scontrol}.get(name)
        if handler is None:
            code, out, err = 127, "", f"{name}: command not found\n"
        else:
            code, out, err = handler(args)
        return CommandResult(args, code, out, err, time.perf_counter() - t0)

    def _sinfo(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        part = _opt(args, "-p")
        if part is not None and part != self.partition:
            return 0, "", ""
        busy, held = self._busy, self._holder
        lines = [f"{n}|{'allocated' if n in busy or n in held else 'idle'}" for n in self.nodes]
        return 0, "\n".join(lines) + "\n", ""

    def _squeue(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        if "--start" in args:
            lines = [f"{j.id}|{j.partition}|{j.name}|N/A|(null)" for j in self._jobs.values() if j.state == "PENDING"]
            return 0, "".join(ln + "\n" for ln in lines), ""
        name = _opt(args, "-n")
        lines = []
        for j in self._jobs.values():
            if name is not None and j.name != name:
                continue
            reason = "Resources" if j.state == "PENDING" else "None"
            nodes = ",".join(j.nodes) if j.state != "PENDING" else ""
            end = j.end if j.end is not None else (j.start + j.limit_s if j.start is not None else None)
            lines.append(f"{j.id}|{j.partition}|{j.state}|{reason}|{nodes}|{slurm_time(j.start)}|"
                         f"{slurm_time(end)}|{slurm_duration(j.limit_s)}")
        return 0, "".join(ln + "\n" for ln in lines), ""

    def _sbatch(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        nodelist = _eq(args, "--nodelist")
        nodes = tuple(n for n in (nodelist or "").split(",") if n)
        unknown = [n for n in nodes if n not in self._known]
        if not nodes or unknown:
            return 1, "", f"sbatch: error: Invalid node name specified: {','.join(unknown) or '(none)'}\n"
        minutes = _eq(args, "--time") or "60"
        dep = _eq(args, "--dependency")
        after = dep.split(":", 1)[1] if dep and ":" in dep else None
        pid = str(self._next)
        self._next += 1
        job = FakeJob(pid, _eq(args, "--job-name") or "sbatch", _eq(args, "--partition") or self.partition,
                      nodes, float(minutes) * 60.0, after)
        self._jobs[pid] = job
        self._try_start(job, self.clock())
        return 0, f"{pid}\n", ""

    def _scancel(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        now = self.clock()
        errors = []
        for pid in args[1:]:
            job = self._jobs.get(pid)
            if job is None:
                errors.append(f"scancel: error: Kill job error on job id {pid}: Invalid job id specified")
            elif job.state in ("PENDING", "RUNNING"):
                self._end(job, "CANCELLED", now, "cancelled")
        return (1 if errors else 0), "", "".join(e + "\n" for e in errors)

    def _scontrol(self, args: tuple[str, ...]) -> tuple[int, str, str]:
        pid = args[-1]
        job = self._jobs.get(pid)
        if job is None:
            return 1, "", "slurm_load_jobs error: Invalid job id specified\n"
        preempt = slurm_time(job.preempt_time) if job.preempt_time is not None else "None"
        return 0, (f"JobId={job.id} JobName={job.name} JobState={job.state} Reason=None Partition={job.partition} "
                   f"StartTime={slurm_time(job.start)} EndTime={slurm_time(job.end)} PreemptTime={preempt} "
                   f"NodeList={','.join(job.nodes)}\n"), ""

    # ---------------------------------------------------------------- pilots
    def _try_start(self, job: FakeJob, now: float) -> None:
        if job.after is not None:
            dep = self._jobs.get(job.after)
            if dep is not None and dep.state in ("PENDING", "RUNNING"):
                return
        if not all(self.is_idle(n) for n in job.nodes):
            return
        job.state, job.start = "RUNNING", now
        for n in job.nodes:
            self._holder[n] = job.id
            if self.on_start is not None:
                self.on_start(n, job.id)

    def _end(self, job: FakeJob, state: str, now: float, why: str) -> None:
        was_running = job.state == "RUNNING"
        job.state, job.end = state, now
        if was_running:
            for n in job.nodes:
                if self._holder.get(n) == job.id:
                    del self._holder[n]
                self._stopped(n, job.id, why)

    def _stopped(self, node: str, pid: str, why: str) -> None:
        if self.on_stop is not None:
            self.on_stop(node, pid, why)


def _opt(args: tuple[str, ...], flag: str) -> str | None:
    """The value after ``flag`` (``-p X``), or None."""
    for i, a in enumerate(args[:-1]):
        if a == flag:
            return args[i + 1]
    return None


def _eq(args: tuple[str, ...], flag: str) -> str | None:
    """The value of ``--flag=X``, or None."""
    prefix = flag + "="
    for a in args:
        if a.startswith(prefix):
            return a[len(prefix):]
    return None


# ---------------------------------------------------------------- across processes
def encode_request(argv: Sequence[str]) -> bytes:
    return json.dumps([str(a) for a in argv]).encode()


def decode_request(frame: bytes) -> list[str]:
    """A request's argv; ``ValueError`` naming what is wrong."""
    try:
        argv = json.loads(frame)
    except ValueError as exc:
        raise ValueError(f"fake slurm request is not JSON: {exc}") from None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"fake slurm request is not a non-empty list of strings: {frame[:80]!r}")
    return argv


def encode_result(res: CommandResult) -> bytes:
    return json.dumps([res.returncode, res.stdout, res.stderr]).encode()


def serve_once(sock: "object", slurm: FakeSlurm) -> None:
    """Answer one request waiting on ``sock`` (a ZeroMQ REP socket)."""
    frame = sock.recv()  # type: ignore[attr-defined]
    try:
        res = slurm.run(decode_request(frame))
    except ValueError as exc:
        res = CommandResult((), 2, "", f"{exc}\n", 0.0)
    sock.send(encode_result(res))  # type: ignore[attr-defined]


def remote_runner(address: str) -> Callable[..., CommandResult]:
    """A :data:`scavenger.base.Runner` that asks the stand-in serving at ``address`` (ZeroMQ REQ).

    A reply that does not come within the command's timeout raises
    :class:`~scavenger.base.CommandTimeout` (and the socket is made afresh), as a hung
    scheduler command does."""
    import zmq

    ctx = zmq.Context.instance()  # type: ignore[var-annotated]
    state: dict[str, object] = {}

    def connect() -> object:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        state["sock"] = sock
        return sock

    def run(argv: Sequence[str], timeout: float = 30.0, check: bool = True,
            env: object = None) -> CommandResult:
        sock = state.get("sock") or connect()
        args = tuple(str(a) for a in argv)
        t0 = time.perf_counter()
        sock.send(encode_request(args))  # type: ignore[attr-defined]
        if not sock.poll(int(timeout * 1000)):  # type: ignore[attr-defined]
            sock.close(0)  # type: ignore[attr-defined]
            state.pop("sock", None)
            raise CommandTimeout(f"{args[0]}: no reply within {timeout:g} s",
                                 CommandResult(args, -1, "", "", time.perf_counter() - t0))
        code, out, err = json.loads(sock.recv())  # type: ignore[attr-defined]
        return CommandResult(args, int(code), str(out), str(err), time.perf_counter() - t0)

    return run
