"""Warm workers: a process that imported the framework before its job was known.

    python -m scavenger.warm --fd N --import torch,malletrain.worker.elastic

A node agent started with ``--warm MODULES`` keeps one per worker slot while it has no worker (:class:`WarmSlot`,
pinned to the slot's cores); the next :class:`~scavenger.protocol.StartWorker` it can run is handed to it as an
:class:`Assignment` and it becomes the worker exactly as a fresh ``python`` would (the steps: docs/research/
real-system.md, warm joins); what it cannot run so starts cold (:func:`warm_refusal`). A worker that starts its
own ranks (a ``torchrun`` rank agent) takes slot 0's process unpinned, whatever its thread count.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import pkgutil  # noqa: F401  (runpy.run_path imports it lazily: loaded before the privilege drop)
import runpy
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Mapping, Sequence

from spawner.entry import Entry, entry_of, take_thread_count
from scavenger import jobproc, proctitle

log = logging.getLogger("scavenger.warm")

READY = b"ready"
"""The warm process's word once imported: ``ready IMPORT_S CPU_S\n`` (for the agent's log)."""
READY_MAX = 64
ASSIGN_MAX = 1 << 20
START_TIME_VARS = ("LD_", "PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_", "MALLOC_")
"""Prefixes of variables read when an interpreter or its framework starts: a warm process made with others differs."""
WARM_WAIT_S = 300.0
"""How long a worker assigned while the warm process still imports waits for it (a cold start would import the
same modules on the same CPU, never first): one still importing after this is stuck (killed; the worker starts cold)."""
PR_SET_DUMPABLE = 4
RUNTIME_VARS = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED"})
"""Start-time variables a warm process applies itself (sys.path, unbuffered streams)."""


@dataclass(frozen=True)
class Assignment:
    """What a warm process becomes: the worker's argv, environment, cwd and user."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None = None
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None  # the submitter's (None: the agent's)

    def encode(self) -> bytes:
        return json.dumps({"argv": list(self.argv), "env": self.env, "cwd": self.cwd,
                           "uid": self.uid, "gid": self.gid, "umask": self.umask}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Assignment:
        """An assignment from its bytes; ValueError names what is wrong."""
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"warm assignment is not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValueError("warm assignment: not an object")
        argv, env = obj.get("argv"), obj.get("env")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("warm assignment: argv must be a non-empty list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("warm assignment: env must map strings to strings")
        for name in ("uid", "gid"):
            if obj.get(name) is not None and (not isinstance(obj[name], int) or obj[name] < 0):
                raise ValueError(f"warm assignment: {name} must be a non-negative integer or null")
        cwd = obj.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError("warm assignment: cwd must be a string or null")
        umask = obj.get("umask")
        if umask is not None and (isinstance(umask, bool) or not isinstance(umask, int) or not 0 <= umask <= 0o777):
            raise ValueError("warm assignment: umask must be an integer in [0, 0o777] or null")
        return cls(tuple(argv), dict(env), cwd, obj.get("uid"), obj.get("gid"), umask)


def start_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that only take effect when a process starts (minus :data:`RUNTIME_VARS`)."""
    return {k: v for k, v in env.items() if k.startswith(START_TIME_VARS) and k not in RUNTIME_VARS}


THREAD_VARS = frozenset({"OMP_NUM_THREADS"})
"""Start-time variables a worker may differ in from its warm process: the warm process ran no parallel
operation, and applies the worker's thread count when it becomes the worker
(:func:`spawner.entry.take_thread_count`), as each rank a rank agent forks does."""


def warm_refusal(argv: Sequence[str], env: Mapping[str, str], warm_env: Mapping[str, str],
                 python: str = sys.executable) -> str | None:
    """Why a warm process started with ``warm_env`` cannot become the worker ``argv``/``env`` (None: it can);
    :data:`THREAD_VARS` are left out of the comparison."""
    entry = entry_of(argv, python)
    if isinstance(entry, str):
        return entry
    mine, theirs = ({k: v for k, v in start_time_env(d).items() if k not in THREAD_VARS} for d in (warm_env, env))
    if mine != theirs:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        return f"start-time variable(s) {', '.join(diff)} differ from the warm process's"
    return None


# ----------------------------------------------------------------------------- agent side
@dataclass
class WarmSlot:
    """The agent's one warm process (none, starting, or ready) and how to hand it a worker."""

    modules: tuple[str, ...]
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=lambda: jobproc.worker_environ(os.environ, {}, None))  # as a cold one's
    proc: subprocess.Popen[bytes] | None = None
    sock: socket.socket | None = None
    ready: bool = False
    spawned_at: float = 0.0
    said: bytes = b""  # what the warm process said so far (its ready line)
    cores: tuple[int, ...] = ()  # the cores it is pinned to (its worker slot's share; empty: not pinned)

    @property
    def starting(self) -> bool:
        """A warm process is importing (not ready yet)."""
        return self.proc is not None and not self.ready

    def prepare(self) -> None:
        """Start a warm process if there is none (idempotent); its readiness is read by :meth:`poll`."""
        if self.proc is not None or not self.modules:
            return
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [self.python, "-m", "scavenger.warm", "--room", " " * proctitle.ROOM,  # for the worker's line in ps
                 "--fd", str(theirs.fileno()), "--import", ",".join(self.modules)],
                env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True, preexec_fn=self._pin if self.cores else None)
        except OSError as exc:
            log.warning("no warm worker: cannot start %s: %s", self.python, exc)
            mine.close()
            self.modules = ()  # do not try again at every loop
            return
        finally:
            theirs.close()
        mine.setblocking(False)
        self.sock, self.ready, self.spawned_at, self.said = mine, False, time.monotonic(), b""
        log.info("warm worker pid %d: importing %s", self.proc.pid, ", ".join(self.modules))

    def _pin(self) -> None:
        os.sched_setaffinity(0, self.cores)  # in the child, before exec: the slot's share of the cores

    def poll(self) -> None:
        """Notice that the warm process is ready (or died: then it is dropped, and made again later)."""
        if self.proc is None or self.sock is None:
            return
        if self.proc.poll() is not None:
            log.warning("warm worker pid %d exited with %s before an assignment", self.proc.pid, self.proc.returncode)
            self._drop()
            return
        if not self.ready:
            try:
                data = self.sock.recv(READY_MAX)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            self.said += data
            if b"\n" not in self.said:
                if data and len(self.said) < READY_MAX:
                    return  # the rest of the line comes next
                self.close()  # it closed (or said something else) before it was ready
                return
            words = self.said.split(b"\n", 1)[0].split()
            if not words or words[0] != READY:
                self.close()
                return
            self.ready = True
            import_s, cpu_s = (words[1:3] + [b"?", b"?"])[:2]
            log.info("warm worker pid %d ready after %.2f s (import %s s, %s s CPU)", self.proc.pid,
                     time.monotonic() - self.spawned_at, import_s.decode(errors="replace"),
                     cpu_s.decode(errors="replace"))

    def take(self, assignment: Assignment, log_file: IO[bytes] | None, own_ranks: bool = False
             ) -> subprocess.Popen[bytes] | str:
        """Hand ``assignment`` to the ready warm process; its Popen, or why not (then start it cold).
        ``own_ranks``: the worker starts its own ranks: unpinned, on every core the agent has."""
        self.poll()
        if self.proc is None or self.sock is None or not self.ready:
            return "no warm process ready"
        why = warm_refusal(assignment.argv, assignment.env, self.env, self.python)
        if why is not None:
            return why
        proc, sock = self.proc, self.sock
        if own_ranks and self.cores:
            try:
                os.sched_setaffinity(proc.pid, os.sched_getaffinity(0))
            except OSError as exc:
                return f"cannot unpin the warm process from its slot's cores: {exc}"
        fd = log_file.fileno() if log_file is not None else os.open(os.devnull, os.O_WRONLY)
        try:
            sock.setblocking(True)
            sock.settimeout(2.0)
            socket.send_fds(sock, [assignment.encode()], [fd])
            sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            self.close()
            return f"warm process did not take its assignment: {exc}"
        finally:
            if log_file is None:
                os.close(fd)
        sock.close()
        self.proc, self.sock, self.ready = None, None, False
        return proc

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.proc, self.sock, self.ready = None, None, False

    def close(self) -> None:
        """Kill the warm process (its whole session) if there is one."""
        proc = self.proc
        self._drop()
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass


def warm_modules_in(argv: Sequence[str]) -> tuple[str, ...]:
    """The modules an agent's command line (``--warm MODULES``) asks it to import ahead (none if none)."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--warm", default="")
    known, _ = ap.parse_known_args(list(argv))
    return tuple(m for m in known.warm.split(",") if m)


def early_slot(argv: Sequence[str]) -> WarmSlot | None:
    """A warm process started at once for the agent program about to run with ``argv`` (None without ``--warm``),
    before the agent's own imports: the framework's import begins with the pilot's process."""
    modules = warm_modules_in(argv)
    if not modules:
        return None
    slot = WarmSlot(modules)
    slot.prepare()
    return slot


# ----------------------------------------------------------------------------- warm side
def _receive(sock: socket.socket) -> tuple[Assignment, int]:
    chunks, fds = [], []
    total = 0
    while True:
        data, got, _flags, _addr = socket.recv_fds(sock, ASSIGN_MAX, 4)
        fds.extend(got)
        if not data:
            break
        chunks.append(data)
        total += len(data)
        if total > ASSIGN_MAX:
            raise ValueError(f"warm assignment over {ASSIGN_MAX} bytes")
    if len(fds) != 1:
        raise ValueError(f"warm assignment came with {len(fds)} descriptors, expected the log's one")
    return Assignment.decode(b"".join(chunks)), fds[0]


def become(assignment: Assignment, log_fd: int) -> Entry:
    """Turn this process into the worker: output, user, cwd, environment, argv (see the module doc)."""
    entry = entry_of(assignment.argv)
    if isinstance(entry, str):
        raise ValueError(f"warm assignment {list(assignment.argv)!r}: {entry}")
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    if log_fd > 2:
        os.close(log_fd)
    if assignment.uid is not None and assignment.uid != os.geteuid():
        gid = assignment.gid if assignment.gid is not None else os.getegid()
        os.setgroups([])
        os.setgid(gid)
        os.setuid(assignment.uid)
    if assignment.umask is not None:
        os.umask(assignment.umask)
    jobproc.child_setup(assignment.cwd)()  # a subreaper like a cold worker; cwd entered as the owner
    _dumpable()  # (the drop made it undumpable: the owner could not debug it nor get a core)
    os.environ.clear()
    os.environ.update(assignment.env)
    take_thread_count(assignment.env)
    tempfile.tempdir = None  # an import may have cached the agent's TMPDIR: the worker's counts
    proctitle.show_command(assignment.argv)
    proctitle.show_environ(assignment.env)
    extra = [p for p in assignment.env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.getcwd() if entry.module is not None else os.path.dirname(os.path.abspath(entry.script or "."))
    sys.path[:] = [first, *extra, *sys.path[1:]]
    if assignment.env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)  # type: ignore[union-attr]
    sys.argv = [entry.module or entry.script or "", *entry.args]
    return entry


def _dumpable() -> None:
    """Dumpable again, as a process that ``exec``ed is (its memory holds nothing of root's but imports)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scavenger.warm", description=__doc__.splitlines()[0])
    ap.add_argument("--fd", type=int, required=True, help="the agent's end of the assignment socket")
    ap.add_argument("--import", dest="modules", default="", help="modules to import ahead, comma-separated")
    ap.add_argument("--room", default="", help="blank: room for the worker's command line (see scavenger.proctitle)")
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    began = time.monotonic()
    for name in filter(None, args.modules.split(",")):
        importlib.import_module(name)
    sock.sendall(READY + f" {time.monotonic() - began:.3f} {time.process_time():.3f}\n".encode())
    try:
        assignment, log_fd = _receive(sock)
    except (OSError, ValueError) as exc:
        print(f"warm worker: no assignment: {exc}", file=sys.stderr)
        return 0  # the agent closed us (or sent nothing usable): nothing of a job ran
    sock.close()
    entry = become(assignment, log_fd)
    if entry.module is not None:
        runpy.run_module(entry.module, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(entry.script or "", run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
