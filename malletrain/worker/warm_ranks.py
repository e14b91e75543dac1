"""Warm ranks: a process per local rank that imported torch once and forks each start of the rank.

    python -m malletrain.worker.warm_ranks --fd N --import torch,lightning

A ``torchrun`` job restarts every rank at every change of its world; a rank server (:class:`RankServer`)
imports what the script imports once, then forks each start (:func:`serve`), so a restart costs the script's
own work, not an interpreter and an import. What a fork takes over and why it is safe (one thread, no CUDA
context) is in docs/design/resilience.md (warm ranks); a command a server cannot run as a fresh interpreter
would starts cold.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import logging
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from spawner.entry import Entry, entry_of, take_thread_count

log = logging.getLogger("malletrain.torchrun")

ENV_WARM = "WARM_RANKS"
"""``0`` in a job's environment: its ranks start cold (a new interpreter each start)."""
ENV_WARM_IMPORTS = "WARM_IMPORTS"
"""Modules (comma-separated) a job declares for its rank servers to import, besides the learned ones."""
ALWAYS = ("torch", "torch.distributed", "torch._dynamo", "torch.nn.parallel", "malletrain.worker.client")
"""Imported by every rank server: what a torchrun script and :mod:`malletrain.worker.launch` import, and
``torch._dynamo``, which ``DistributedDataParallel``'s constructor imports (as long as torch's own import)."""
READY_WAIT_S = 300.0
"""How long a rank agent waits for its rank servers' imports before it says it is ready (a cold start would
import the same modules on the same CPU, never first)."""
SPAWN_WAIT_S = 10.0
"""How long the agent waits for a server to name the pid of a child it asked for."""
POLL_S = 0.02
LINE_MAX = 1 << 20


def script_of(command: Sequence[str]) -> tuple[str | None, str | None]:
    """(the script file, the module name) a Python ``command`` runs, through :mod:`malletrain.worker.launch` or
    not; (None, None) if it runs neither."""
    argv = list(command[1:])
    if argv[:2] == ["-m", "malletrain.worker.launch"]:
        argv = argv[2:]
    if argv[:1] == ["-m"] and len(argv) >= 2:
        try:
            spec = importlib.util.find_spec(argv[1])
        except (ImportError, ValueError):
            return None, argv[1]
        origin = spec.origin if spec is not None else None
        return (origin if origin and origin.endswith(".py") else None), argv[1]
    if argv and not argv[0].startswith("-"):
        return argv[0], None
    return None, None


def imports_of(source: str) -> list[str]:
    """The absolute module names ``source`` imports anywhere (``import a.b`` -> ``a.b``; ``from a import b``
    -> ``a``), in order, each once."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        out += [n for n in names if n not in out]
    return out


def learned_imports(command: Sequence[str], declared: str = "") -> tuple[str, ...]:
    """What the rank servers of ``command`` import: :data:`ALWAYS`, the installed modules its script imports (not
    the script's own, which may do work at import), and ``declared`` (the job's ``WARM_IMPORTS``)."""
    script, module = script_of(command)
    found: list[str] = []
    if script is not None:
        try:
            with open(script, encoding="utf-8") as fh:
                found = imports_of(fh.read())
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as exc:
            log.info("warm ranks: cannot read the imports of %s: %s", script, exc)
    own_dir = os.path.dirname(os.path.abspath(script)) if script is not None and module is None else None
    out = list(ALWAYS)
    for name in [*found, *(m.strip() for m in declared.split(",") if m.strip())]:
        top = name.split(".")[0]
        if name in out or name == module or (module is not None and module.startswith(top + ".")
                                               and top != "malletrain"):
            continue
        if own_dir is not None and (os.path.exists(os.path.join(own_dir, top + ".py"))
                                    or os.path.isdir(os.path.join(own_dir, top))):
            continue
        if name == "malletrain.worker.launch" or name == "__main__":
            continue
        out.append(name)
    return tuple(out)


def os_threads() -> int:
    """The process's threads as the kernel counts them (1 where it cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _send(sock: socket.socket, line: str) -> None:
    sock.sendall(line.encode() + b"\n")


def _reap(sock: socket.socket) -> None:
    """Tell the agent of every child that ended: ``exit PID RETURNCODE`` (negative: killed by a signal)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            _send(sock, f"exit {pid} {code}")
        except OSError:
            return


def serve(sock: socket.socket) -> tuple[Entry, dict[str, str]] | None:
    """The server's loop: fork a child for each request; returns only in a child (what it runs) or when the
    agent closed the socket (None)."""
    buf = b""
    while True:
        _reap(sock)
        readable, _, _ = select.select([sock], [], [], POLL_S)
        if not readable:
            continue
        data = sock.recv(65536)
        if not data:
            return None
        buf += data
        if len(buf) > LINE_MAX:
            print("warm ranks: a request over the size limit", file=sys.stderr)
            return None
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(raw)
                argv, env = [str(a) for a in req["argv"]], {str(k): str(v) for k, v in req["env"].items()}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                _send(sock, f"refused {json.dumps(str(exc))}")
                continue
            entry = entry_of(argv)
            if isinstance(entry, str):
                _send(sock, f"refused {json.dumps(entry)}")
                continue
            pid = os.fork()
            if pid == 0:
                sock.close()
                return entry, env
            _send(sock, f"pid {pid}")


def become(entry: Entry, env: Mapping[str, str]) -> None:
    """In a forked child: the start's environment, argv, path, seeds and signals (as a fresh interpreter)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = os.getcwd() if entry.module is not None else os.path.dirname(os.path.abspath(entry.script or "."))
    sys.path[:] = [first, *extra, *[p for p in sys.path[1:] if p not in extra]]
    sys.argv = [entry.module or entry.script or "", *entry.args]
    random.seed()  # a fresh interpreter seeds from the OS: forks of one server must not share a sequence
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # as each new process's default generator (CUDA's is seeded lazily: no context made)
    take_thread_count(env)


def run_entry(entry: Entry) -> int:
    """Run ``entry`` as ``__main__``; its exit code as an interpreter gives it (an exception: 1, printed)."""
    import runpy
    import traceback

    try:
        if entry.module is not None:
            runpy.run_module(entry.module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(entry.script or "", run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter: printed, exit 1
        traceback.print_exc()
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m malletrain.worker.warm_ranks", description=__doc__.splitlines()[0])
    ap.add_argument("--fd", type=int, required=True, help="the agent's end of the request socket")
    ap.add_argument("--import", dest="modules", default="", help="modules to import ahead, comma-separated")
    args = ap.parse_args(argv)
    return serve_as_server(socket.socket(fileno=args.fd), tuple(filter(None, args.modules.split(","))))


def serve_as_server(sock: socket.socket, modules: Sequence[str]) -> int:
    """A rank server's life on ``sock``: import ``modules``, say ready, fork a rank per request; in a rank, its
    command's exit code (in the server: 0 once the agent closed the socket)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop of the agent's group is for the ranks: the agent
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # closes the socket, and the server ends then
    began = time.monotonic()
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the script imports it itself (and fails there if it must)
            missing.append(f"{name} ({type(exc).__name__})")
    threads = os_threads()
    try:
        _send(sock, f"ready {time.monotonic() - began:.3f} {threads} {json.dumps(', '.join(missing))}")
    except OSError:  # the agent went while it imported (its job ended, or it was stopped): nothing to serve
        return 0
    child = serve(sock)
    if child is None:
        return 0
    entry, env = child
    become(entry, env)
    return run_entry(entry)


def imported_ahead() -> bool:
    """Whether this process holds torch's import already (a node's warm process became this rank agent): it
    forks its rank servers from itself."""
    return "torch" in sys.modules


@dataclass(frozen=True)
class InFork:
    """What :meth:`RankServer.start` returns in a rank server forked from the agent: the exit status it ends with,
    which the caller returns at once (none of the agent's work runs in it)."""

    code: int


@dataclass
class WarmChild:
    """A rank's process forked by a :class:`RankServer`, stopped and polled as a ``Popen``."""

    pid: int
    server: RankServer
    returncode: int | None = None
    args: tuple[str, ...] = ()

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(list(self.args), timeout or 0.0)
            time.sleep(POLL_S / 2)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class RankServer:
    """The agent's end of one local rank's server (see the module doc)."""

    modules: tuple[str, ...]
    env: dict[str, str]
    cores: tuple[int, ...] = ()
    python: str = sys.executable
    proc: subprocess.Popen[bytes] | None = None
    forked: int | None = None  # the server's pid where it was forked from the agent (no Popen then)
    sock: socket.socket | None = None
    ready: bool = False
    started_at: float = 0.0
    forks: int = 0
    threads: int = 0  # the server's threads once ready (logged)
    _buf: bytes = b""
    _exits: dict[int, int] = field(default_factory=dict)
    _pids: list[int] = field(default_factory=list)
    _alive: set[int] = field(default_factory=set)

    def start(self, fork: bool = False, others: Sequence[RankServer] = ()) -> InFork | None:
        """Start the server: a new interpreter, or with ``fork`` a fork of this process (holding no thread of its
        own work yet) given the server's environment and cores; ``others``: servers started before it (their
        sockets closed in the fork). None here; in the forked server, what it ends with (:class:`InFork`)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cores = self.cores
        if fork:
            return self._fork(mine, theirs, others)
        try:
            self.proc = subprocess.Popen(
                [self.python, "-m", "malletrain.worker.warm_ranks", "--fd", str(theirs.fileno()),
                 "--import", ",".join(self.modules)],
                env=self.env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
        except OSError as exc:
            log.warning("warm ranks: cannot start a rank server: %s; ranks start cold", exc)
            mine.close()
            return None
        finally:
            theirs.close()
        self.sock, self.started_at = mine, time.monotonic()
        return None

    def _fork(self, mine: socket.socket, theirs: socket.socket, others: Sequence[RankServer]) -> InFork | None:
        sys.stdout.flush()  # nothing buffered here is written twice
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            log.warning("warm ranks: cannot fork a rank server: %s; ranks start cold", exc)
            mine.close()
            theirs.close()
            return None
        if pid == 0:  # the server: nothing of the agent's runs here from now on
            code = 1
            try:
                mine.close()
                for other in others:
                    if other.sock is not None:
                        other.sock.close()  # else that server would never see its agent close it
                if self.cores:
                    os.sched_setaffinity(0, self.cores)
                os.environ.clear()
                os.environ.update(self.env)
                code = serve_as_server(theirs, self.modules)
            except BaseException:  # noqa: BLE001 - printed; never back into the agent's code
                import traceback

                traceback.print_exc()
            return InFork(code)
        theirs.close()
        self.forked, self.sock, self.started_at = pid, mine, time.monotonic()
        return None

    @property
    def pid(self) -> int:
        """The server's pid (-1: none started)."""
        return self.proc.pid if self.proc is not None else self.forked if self.forked is not None else -1

    @property
    def usable(self) -> bool:
        return (self.proc is not None or self.forked is not None) and self.sock is not None

    def _read(self, wait_s: float) -> None:
        """Read what the server said (waiting up to ``wait_s`` for something): pids, exits, readiness."""
        if self.sock is None:
            return
        readable, _, _ = select.select([self.sock], [], [], wait_s)
        if readable:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._lost("closed its socket")
                return
            self._buf += data
        while b"\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n", 1)
            words = raw.decode(errors="replace").split(" ", 3)
            if words[0] == "ready":
                self.ready, self.threads = True, int(words[2])
                log.info("warm ranks: rank server pid %d ready after %.2f s (imports %s s, %s thread(s)%s)",
                         self.pid, time.monotonic() - self.started_at, words[1],
                         words[2], "; not imported: " + json.loads(words[3]) if len(words) > 3
                         and json.loads(words[3]) else "")
            elif words[0] == "pid":
                self._pids.append(int(words[1]))
            elif words[0] == "exit":
                self._exits[int(words[1])] = int(words[2])
            elif words[0] == "refused":
                self._pids.append(-1)
                log.warning("warm ranks: the server refused a start: %s", " ".join(words[1:]))

    def _lost(self, why: str) -> None:
        log.warning("warm ranks: rank server %s; its ranks start cold from now on", why)
        if self.sock is not None:
            self.sock.close()
        self.sock, self.ready = None, False
        for pid in self._alive - set(self._exits):  # its children are orphans now: gone means killed
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self._exits[pid] = -signal.SIGKILL

    def wait_ready(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while self.sock is not None and not self.ready and time.monotonic() < deadline:
            self._read(min(0.2, max(0.0, deadline - time.monotonic())))
        return self.ready

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> WarmChild | str:
        """Fork a child running ``argv`` with ``env``; the child, or why not (then start it cold)."""
        self._read(0.0)
        if self.sock is None or not self.ready:
            return "no rank server ready"
        entry = entry_of(argv, self.python)
        if isinstance(entry, str):
            return entry
        before = len(self._pids)
        try:
            self.sock.sendall(json.dumps({"argv": list(argv), "env": dict(env)}).encode() + b"\n")
        except OSError as exc:
            self._lost(f"took no request ({exc})")
            return "the rank server is gone"
        deadline = time.monotonic() + SPAWN_WAIT_S
        while len(self._pids) == before and self.sock is not None and time.monotonic() < deadline:
            self._read(0.05)
        if len(self._pids) == before or self._pids[-1] < 0:
            return "the rank server did not fork"
        pid = self._pids[-1]
        self._alive.add(pid)
        self.forks += 1
        return WarmChild(pid, self, args=tuple(argv))

    def exit_of(self, pid: int) -> int | None:
        self._read(0.0)
        if pid not in self._exits and self.sock is None:
            self._lost("is gone")
        code = self._exits.get(pid)
        if code is not None:
            self._alive.discard(pid)
        return code

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5.0)
        if self.forked is not None:
            pid, self.forked = self.forked, None
            deadline = time.monotonic() + 2.0
            try:
                while os.waitpid(pid, os.WNOHANG) == (0, 0):  # it ends once it sees its socket closed
                    if time.monotonic() >= deadline:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                        break
                    time.sleep(POLL_S / 2)
            except ChildProcessError:
                pass


def warm_wanted(env: Mapping[str, str]) -> bool:
    """Whether a job's ranks start from rank servers (unless its environment says ``WARM_RANKS=0``)."""
    return env.get(ENV_WARM, "1").strip().lower() not in ("0", "false", "no", "off")


if __name__ == "__main__":
    sys.exit(main())
