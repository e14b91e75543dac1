"""The ``horovod`` runtime: Elastic Horovod jobs behind the :class:`Runtime` protocol (docs/training/horovod.md).

Horovod's own driver (``horovodrun --host-discovery-script``) spawns, re-ranks and retires the
workers; the daemon only says where a job may run. The driver runs beside the daemon (one per job,
wrapped by ``python -m malletrain.runtimes.horovod_elastic drive``, which records its exit code), so
recalling any node never kills the job. Each worker is a slot holder (``... hold``) the node agent runs:
it exits 0 once a later membership drops it, or with the job's exit code once the driver ended.
:meth:`HorovodRuntime.set_members` rewrites the job's ``hosts`` file atomically (``host:slots`` lines;
``localhost:<members>`` on the local backend), which the discovery script prints. A member is a slot on
a host, not one Horovod process. Drivers run in their own session and outlive a daemon ``kill -9``;
:meth:`HorovodRuntime.readopt` finds a job's driver again and goes on from ``members.json``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import psutil

from contract.exits import EXIT_SIGTERM
from contract.horovod import MEMBERS_FILE
from contract.workerenv import ENV_HOROVOD_JOB_DIR, ENV_JOB_SECRET, WorkerEnv
from malletrain.runtimes import LaunchSpec, Runtime

MODULE = "malletrain.runtimes.horovod_elastic"
HOSTS_FILE = "hosts"
EXIT_CODE_FILE = "exit_code"
CANCELLED_FILE = "cancelled"
DISCOVERY_SCRIPT = "discover.sh"
DRIVER_LOG = "driver.log"
HOLD_POLL_S = 0.2
STOP_GRACE_S = 10.0


class JobPhase(Enum):
    """Where a Horovod job is in its life, as the runtime sees it."""

    PENDING = "pending"
    """Workers launched (slot holders), no membership published yet: no driver."""
    RUNNING = "running"
    """The driver process runs; membership changes go to its hosts file."""
    EXITED = "exited"
    """The driver ended; its exit code is in the job directory."""


@dataclass
class _Job:
    job_id: str
    dir: Path
    command: tuple[str, ...]
    nodes: dict[str, str] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)  # worker -> Horovod slots on its host (its node's K)
    generation: int = 0
    ever_members: set[str] = field(default_factory=set)
    driver: "subprocess.Popen[bytes] | AdoptedDriver | None" = None


class AdoptedDriver:
    """A driver started by an earlier daemon: the subset of ``Popen`` the runtime uses, over psutil."""

    def __init__(self, proc: psutil.Process, job_dir: Path) -> None:
        self._proc = proc
        self._job_dir = job_dir
        self.pid = proc.pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            if self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.NoSuchProcess:
            pass
        if self.returncode is None:  # not our child: its code is the one it recorded
            recorded = read_exit_code(self._job_dir)
            self.returncode = recorded if recorded is not None else -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        try:
            self._proc.wait(timeout=timeout)
        except psutil.TimeoutExpired:
            raise subprocess.TimeoutExpired(f"driver pid {self.pid}", timeout or 0.0) from None
        except psutil.NoSuchProcess:
            pass
        code = self.poll()
        return -signal.SIGKILL if code is None else code

    def kill(self) -> None:
        try:
            self._proc.kill()
        except psutil.NoSuchProcess:
            pass


def hosts_lines(members: Sequence[str], nodes: dict[str, str], *, local: bool,
                per_member: Mapping[str, int] | None = None) -> list[str]:
    """The ``host:slots`` lines for ``members`` (order of first appearance kept); each member brings
    ``per_member[member]`` slots (its node's worker slots; default 1)."""
    slots: dict[str, int] = {}
    for member in members:
        host = "localhost" if local else nodes[member]
        slots[host] = slots.get(host, 0) + (per_member or {}).get(member, 1)
    return [f"{host}:{count}" for host, count in slots.items()]


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_exit_code(job_dir: Path) -> int | None:
    """The driver's exit code recorded in ``job_dir``, or None while it runs."""
    try:
        text = (job_dir / EXIT_CODE_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError as exc:
        raise ValueError(f"{job_dir / EXIT_CODE_FILE}: not an integer exit code: {text!r}") from exc


class HorovodRuntime(Runtime):
    """Elastic Horovod behind the :class:`~malletrain.runtimes.Runtime` protocol.

    ``work_dir``: a directory per job (a temporary one when omitted); ``local=True``: every node is this
    host (``network_interfaces`` then ``("lo",)``); ``horovodrun``: the launcher's argv prefix; ``env``:
    added to the driver's and so every Horovod worker's environment (the holders' env never reaches them)."""

    COMMAND_BESIDE_DAEMON = True
    """The job's command runs under the driver, a process of the daemon's user: a root daemon
    refuses other users' jobs with this runtime (it cannot run them as their owners)."""

    name = "horovod"

    def __init__(self, work_dir: str | os.PathLike[str] | None = None, *, local: bool = True, min_np: int = 1,
                 max_np: int | None = None, network_interfaces: Sequence[str] | None = None,
                 python: str = sys.executable, horovodrun: Sequence[str] | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        if min_np < 1:
            raise ValueError(f"min_np must be >= 1, got {min_np}")
        if max_np is not None and max_np < min_np:
            raise ValueError(f"max_np ({max_np}) must be >= min_np ({min_np})")
        self._work_dir = Path(work_dir) if work_dir is not None else None
        self._own_work_dir = work_dir is None
        self.local = local
        self.min_np = min_np
        self.max_np = max_np
        self.network_interfaces = tuple(network_interfaces) if network_interfaces is not None else (
            ("lo",) if local else ()
        )
        self.python = python
        self.horovodrun = tuple(horovodrun) if horovodrun is not None else (python, "-m", "horovod.runner.launch")
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        # per-job variables for the driver and so every Horovod worker (the daemon puts the job's
        # report-signing secret here: the workers the driver spawns never see the slot holders' env)
        self.job_env: Callable[[str], dict[str, str]] = lambda job_id: {}
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- protocol
    def use_secrets(self, secret_for: Callable[[str], str]) -> None:
        """Each job's report-signing secret goes into its driver's env, so every worker it spawns has it."""
        self.job_env = lambda job_id: {ENV_JOB_SECRET: secret_for(job_id)}

    def start(self) -> None:
        """Create the work directory (a temporary one if none was given)."""
        with self._lock:
            if self._work_dir is None:
                self._work_dir = Path(tempfile.mkdtemp(prefix="malletrain-hvd-"))
            self._work_dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Stop every job's driver and holders; remove a temporary work dir. Idempotent."""
        for job_id in list(self._jobs):
            self.forget(job_id)
        with self._lock:
            if self._own_work_dir and self._work_dir is not None:
                shutil.rmtree(self._work_dir, ignore_errors=True)
                self._work_dir = None

    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str,
                    slots: int = 1) -> LaunchSpec:
        """A slot holder for ``worker_id`` on ``node`` (Horovod's driver runs the job's ``slots`` ranks there)."""
        if not command:
            raise ValueError(f"job {job_id}: empty command for worker {worker_id}")
        with self._lock:
            job = self._job_or_create(job_id, tuple(command))
            if job.command != tuple(command):
                raise ValueError(
                    f"job {job_id}: worker {worker_id} launched with command {list(command)!r}, "
                    f"but the job's command is {list(job.command)!r}"
                )
            job.nodes[worker_id] = node
            job.slots[worker_id] = slots
            job.ever_members.discard(worker_id)  # a relaunched id starts fresh
            argv = (self.python, "-m", MODULE, "hold", "--job-dir", str(job.dir), "--worker", worker_id)
            return LaunchSpec(argv=argv, env=WorkerEnv(job=job_id, worker=worker_id).to_environ())

    def set_members(self, job_id: str, members: Sequence[str]) -> int:
        """Publish the new membership (hosts file + members.json); start the driver the first time."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise KeyError(f"job {job_id}: set_members before any launch_spec")
            self._check_members(job, members)
            job.generation += 1
            lines = hosts_lines(members, job.nodes, local=self.local, per_member=job.slots)
            write_atomic(job.dir / HOSTS_FILE, "".join(f"{line}\n" for line in lines))
            job.ever_members.update(members)
            retired = sorted(job.ever_members.difference(members))
            record = {"generation": job.generation, "members": list(members), "hosts": lines, "retired": retired}
            write_atomic(job.dir / MEMBERS_FILE, json.dumps(record) + "\n")
            if job.driver is None and members:
                job.driver = self._start_driver(job, len(members))
            return job.generation

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        """Stop the job's driver (and its workers), drop its directory; idempotent (Horovod keeps no state outside
        its workers: ``keep_state`` is there for the protocol)."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
        if job is None:
            return
        try:
            write_atomic(job.dir / CANCELLED_FILE, "")  # holders exit 0 whatever the driver's code
        except FileNotFoundError:
            pass  # the directory is gone already (another runtime took the job over and forgot it)
        if job.driver is not None:
            stop_process_tree(job.driver.pid, grace_s=STOP_GRACE_S)
            try:
                job.driver.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                job.driver.kill()
                job.driver.wait(timeout=STOP_GRACE_S)
        for proc in job_processes(job.dir):  # local workers orphaned by a driver that died first
            stop_process_tree(proc.pid, grace_s=STOP_GRACE_S)
        shutil.rmtree(job.dir, ignore_errors=True)

    def readopt(self, job_id: str, command: Sequence[str], workers: dict[str, str]) -> int:
        """Take over a job a dead daemon ran in this work directory (``workers``: worker id -> node): its
        generation and retired workers from ``members.json``, a driver still running adopted. Returns the
        generation (0: nothing to take over); idempotent."""
        if not command:
            raise ValueError(f"job {job_id}: empty command")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                job_dir = self._find_job_dir(job_id)
                if job_dir is None:
                    job = self._job_or_create(job_id, tuple(command))
                else:
                    job = _Job(job_id=job_id, dir=job_dir, command=tuple(command))
                    record = _read_members(job_dir)
                    job.generation = int(record.get("generation", 0))
                    job.ever_members = {str(m) for m in [*record.get("members", []), *record.get("retired", [])]}
                    driver = _find_driver(job_dir)
                    job.driver = AdoptedDriver(driver, job_dir) if driver is not None else None
                    self._jobs[job_id] = job
            job.nodes.update(workers)
            return job.generation

    def _find_job_dir(self, job_id: str) -> Path | None:
        """The newest directory of ``job_id`` in the work directory that published a membership."""
        if self._work_dir is None:
            raise RuntimeError("HorovodRuntime.start() was not called")
        prefix = _safe(job_id) + "-"
        found = [d for d in self._work_dir.iterdir()
                 if d.is_dir() and d.name.startswith(prefix) and (d / MEMBERS_FILE).exists()
                 and not (d / CANCELLED_FILE).exists()]
        return max(found, key=lambda d: d.stat().st_mtime, default=None)

    # ------------------------------------------------------------------ queries
    def job_dir(self, job_id: str) -> Path:
        """The directory of ``job_id`` (hosts file, driver log, exit code)."""
        return self._require(job_id).dir

    def phase(self, job_id: str) -> JobPhase:
        """Pending (no driver yet), running, or exited."""
        job = self._require(job_id)
        if job.driver is None:
            return JobPhase.PENDING
        return JobPhase.RUNNING if job.driver.poll() is None else JobPhase.EXITED

    def exit_code(self, job_id: str) -> int | None:
        """The driver's exit code once it has ended, else None."""
        job = self._require(job_id)
        if job.driver is None or job.driver.poll() is None:
            return None
        recorded = read_exit_code(job.dir)
        return recorded if recorded is not None else job.driver.returncode

    def wait(self, job_id: str, timeout: float) -> int:
        """Wait for the job's driver to end; its exit code. Raises TimeoutError naming the job."""
        job = self._require(job_id)
        if job.driver is None:
            raise RuntimeError(f"job {job_id}: no driver started (set_members never called with members)")
        try:
            waited = job.driver.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"job {job_id}: driver still running after {timeout} s") from exc
        code = self.exit_code(job_id)
        return code if code is not None else waited

    def driver_argv(self, job_id: str, np: int) -> list[str]:
        """The ``horovodrun`` argv this runtime uses for ``job_id`` starting on ``np`` slots."""
        job = self._require(job_id)
        return self._horovodrun_argv(job, np)

    # ---------------------------------------------------------------- internals
    def _require(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise KeyError(f"job {job_id}: unknown to the horovod runtime")
        return job

    def _job_or_create(self, job_id: str, command: tuple[str, ...]) -> _Job:
        job = self._jobs.get(job_id)
        if job is not None:
            return job
        if self._work_dir is None:
            raise RuntimeError("HorovodRuntime.start() was not called")
        job_dir = Path(tempfile.mkdtemp(prefix=f"{_safe(job_id)}-", dir=self._work_dir))
        hosts = job_dir / HOSTS_FILE
        write_atomic(hosts, "")
        script = job_dir / DISCOVERY_SCRIPT
        script.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(hosts))}\n", encoding="utf-8")
        script.chmod(0o755)
        job = _Job(job_id=job_id, dir=job_dir, command=command)
        self._jobs[job_id] = job
        return job

    @staticmethod
    def _check_members(job: _Job, members: Sequence[str]) -> None:
        seen: set[str] = set()
        for member in members:
            if member not in job.nodes:
                raise ValueError(f"job {job.job_id}: member {member!r} was never launched (no launch_spec)")
            if member in seen:
                raise ValueError(f"job {job.job_id}: member {member!r} listed twice")
            seen.add(member)

    def _horovodrun_argv(self, job: _Job, np: int) -> list[str]:
        argv = [*self.horovodrun, "--gloo", "-np", str(np)]
        argv += ["--min-np", str(min(self.min_np, np))]
        if self.max_np is not None:
            argv += ["--max-np", str(max(self.max_np, np))]
        argv += ["--host-discovery-script", str(job.dir / DISCOVERY_SCRIPT)]
        if self.network_interfaces:
            argv += ["--network-interfaces", ",".join(self.network_interfaces)]
        argv += list(self.extra_args)
        argv += list(job.command)
        return argv

    def _start_driver(self, job: _Job, np: int) -> subprocess.Popen[bytes]:
        argv = [self.python, "-m", MODULE, "drive", "--job-dir", str(job.dir), "--"]
        argv += self._horovodrun_argv(job, np)
        own = WorkerEnv(job=job.job_id, runtime=self.name, horovod_job_dir=job.dir).to_environ()
        env = {**os.environ, **self.env, **self.job_env(job.job_id), **own}
        with open(job.dir / DRIVER_LOG, "ab") as log:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )


def _safe(job_id: str) -> str:
    """``job_id`` as a directory name prefix."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)


def _read_members(job_dir: Path) -> dict[str, Any]:
    """``members.json`` of ``job_dir`` ({} if absent); a bad file is a ValueError naming it."""
    path = job_dir / MEMBERS_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("generation", 0), int):
        raise ValueError(f"{path}: not a membership record: {record!r}")
    return record


def _find_driver(job_dir: Path) -> psutil.Process | None:
    """The live ``drive`` wrapper of ``job_dir`` (started by an earlier runtime), if any."""
    for proc in job_processes(job_dir):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if MODULE in cmdline and "drive" in cmdline:
            return proc
    return None


def stop_process_tree(pid: int, *, grace_s: float) -> None:
    """SIGTERM ``pid`` and all its descendants, then SIGKILL whatever is left after ``grace_s``."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def job_processes(job_dir: Path) -> list[psutil.Process]:
    """Live local processes of a job: those whose environment names ``job_dir`` (driver, workers)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(ENV_HOROVOD_JOB_DIR) == str(job_dir):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


# ---------------------------------------------------------------- subprocesses
class HoldOutcome(Enum):
    """Why a slot holder ended."""

    REMOVED = "removed"
    """A later membership no longer lists the worker: exit 0."""
    JOB_ENDED = "job_ended"
    """The driver ended: exit with its code."""
    FORGOTTEN = "forgotten"
    """The runtime forgot (cancelled) the job, or its directory is gone: exit 0."""


def _read_retired(job_dir: Path) -> set[str]:
    """Workers that were members of some generation and are not in the latest one."""
    try:
        record = json.loads((job_dir / MEMBERS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set()
    retired = record.get("retired")
    if not isinstance(retired, list):
        raise ValueError(f"{job_dir / MEMBERS_FILE}: field 'retired' is not a list: {retired!r}")
    return {str(m) for m in retired}


def hold(job_dir: Path, worker: str, poll_s: float = HOLD_POLL_S) -> tuple[HoldOutcome, int]:
    """Hold ``worker``'s slot until a membership that listed it is followed by one that does not, or the
    job ends or is forgotten."""
    while True:
        if not job_dir.is_dir() or (job_dir / CANCELLED_FILE).exists():
            return HoldOutcome.FORGOTTEN, 0
        code = read_exit_code(job_dir)
        if code is not None:
            return HoldOutcome.JOB_ENDED, code
        if worker in _read_retired(job_dir):
            return HoldOutcome.REMOVED, 0
        time.sleep(poll_s)


def drive(job_dir: Path, argv: Sequence[str]) -> int:
    """Run the horovodrun driver; record its exit code in ``job_dir``; forward SIGTERM/SIGINT."""
    if not argv:
        raise ValueError("drive: empty horovodrun argv")
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = proc.wait()
    try:
        write_atomic(job_dir / EXIT_CODE_FILE, f"{code}\n")
    except FileNotFoundError:
        pass  # the runtime forgot the job (its directory is gone): nobody to tell
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_hold = sub.add_parser("hold", help="hold one worker's slot (what a node agent runs)")
    p_hold.add_argument("--job-dir", type=Path, required=True)
    p_hold.add_argument("--worker", required=True)
    p_drive = sub.add_parser("drive", help="run the horovodrun driver, record its exit code")
    p_drive.add_argument("--job-dir", type=Path, required=True)
    p_drive.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.cmd == "hold":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_SIGTERM))
        _, code = hold(args.job_dir, args.worker)
        return code
    rest = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return drive(args.job_dir, rest)


if __name__ == "__main__":
    sys.exit(main())
