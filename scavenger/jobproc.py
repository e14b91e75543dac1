"""What a job's worker process gets from the agent, and how everything it starts ends with it.

The rules that keep one job from reaching the agent, the head node or another job through the
process the agent starts: its environment (:func:`worker_environ`), its working directory (entered
after the privilege drop, so the kernel checks the owner's rights), the subreapers, and the log
folder. Why each rule is what it is: docs/operators/security.md.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import sys
import time
from pathlib import Path
from typing import IO, Callable, Collection, Iterable, Mapping

ENV_ALLOW = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
             "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS")
"""Variables of the agent's environment a worker inherits (besides :data:`ENV_ALLOW_PREFIXES`): what a program
needs to run on the node, nothing that carries the agent's identity or credentials."""
ENV_ALLOW_PREFIXES = ("LC_", "NCCL_", "GLOO_")
"""Locale, and how the node's operator tells the collectives which network to use."""
ENV_ALLOW_SAME_USER = ("HOME", "USER", "LOGNAME", "PYTHONPATH", "VIRTUAL_ENV")
"""Also inherited when the worker runs as the agent's own user (nothing crosses a user boundary)."""
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
"""``PATH`` of a worker that runs as another user (the job's ``env`` may set its own)."""

EXIT_NO_CWD = 126
"""A worker's exit code when its owner cannot enter the job's ``cwd``."""
LOG_MAX_BYTES = 64 * 1024 * 1024
"""A worker's log is rotated when it grows past this (one older part is kept)."""
LOGS_MAX_TOTAL = 2 * 1024 * 1024 * 1024
"""The log folder's quota: the oldest logs of ended workers are deleted above it."""
PRUNE_MIN_AGE_S = 60.0
"""A log untouched for less than this is never pruned (it may belong to another agent's live worker)."""

PR_SET_CHILD_SUBREAPER = 36
_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - a libc-less Python
        _libc = None


# ---------------------------------------------------------------- environment
def worker_environ(base: Mapping[str, str], job_env: Mapping[str, str], owner_env: Mapping[str, str] | None,
                   ) -> dict[str, str]:
    """A worker's environment: the allowed part of ``base`` (the agent's), the job's ``env``, then
    ``owner_env`` (``HOME``, ``USER``, ``LOGNAME`` of the owner; None: the worker runs as the agent's user)."""
    allowed = ENV_ALLOW if owner_env is not None else ENV_ALLOW + ENV_ALLOW_SAME_USER
    env = {k: v for k, v in base.items() if k in allowed or k.startswith(ENV_ALLOW_PREFIXES)}
    if owner_env is not None:
        env["PATH"] = SAFE_PATH
    env.update({str(k): str(v) for k, v in job_env.items()})
    if owner_env is not None:
        env.update(owner_env)
    return env


# ---------------------------------------------------------------- the child, before exec
def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the kernel cannot."""
    if _libc is None:
        return False
    return int(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0


def child_setup(cwd: str | None, join: Callable[[], None] | None = None) -> Callable[[], None]:
    """``preexec_fn`` of a worker: ``join`` its cgroup, become a subreaper, then enter ``cwd`` as the
    owner (one it cannot enter: a line on stderr and exit :data:`EXIT_NO_CWD`)."""
    target = os.fsencode(cwd) if cwd else None

    def setup() -> None:
        if join is not None:
            join()
        become_subreaper()
        if target is None:
            return
        try:
            os.chdir(target)
        except OSError as exc:
            os.write(2, b"malletrain agent: the job's owner cannot enter its cwd " + repr(target)[2:-1].encode()
                     + b": " + (exc.strerror or "error").encode() + b"\n")
            os._exit(EXIT_NO_CWD)

    return setup


# ---------------------------------------------------------------- what is left of a job
def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    try:
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def _children(parent: int) -> list[int] | None:
    """``parent``'s children from ``/proc/PID/task/*/children``; None where the kernel does not list them."""
    try:
        tasks = os.listdir(f"/proc/{parent}/task")
        out: list[int] = []
        for task in tasks:
            with open(f"/proc/{parent}/task/{task}/children") as fh:
                out.extend(int(pid) for pid in fh.read().split())
        return out
    except (OSError, ValueError):
        return None


def orphans(parent: int, keep: Collection[int]) -> list[int]:
    """Children of ``parent`` (a subreaper: orphans of its workers land on it) not in ``keep`` (its workers)."""
    children = _children(parent)
    if children is None:  # scan every process's parent instead
        try:
            pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        except OSError:
            return []
        children = [pid for pid in pids if _parent_of(pid) == parent]
    return [pid for pid in children if pid not in keep]


def end_orphans(parent: int, keep: Collection[int], rounds: int = 20) -> int:
    """SIGKILL every orphan below ``parent`` (its children outside ``keep``) and reap it; killing one may
    re-parent its own children to ``parent``, so repeat until none is left. Returns how many were killed."""
    killed = 0
    for _ in range(rounds):
        found = orphans(parent, keep)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in found:
            _reap(pid)
    return killed


def _reap(pid: int, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.005)


# ---------------------------------------------------------------- logs
def private_dir(path: Path) -> Path:
    """Create ``path`` (a log folder) 0700, or 0711 for root (owners open their own log by name,
    nobody lists the folder), whatever the umask; an existing one of ours is set to that mode."""
    mode = 0o711 if os.geteuid() == 0 else 0o700
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    return path


def open_private(path: Path, uid: int | None = None, gid: int | None = None) -> IO[bytes]:
    """``path`` opened for appending, 0600 whatever the umask, owned by ``uid``/``gid`` if given, never a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if uid is not None and gid is not None:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def prune_logs(folder: Path, keep: Iterable[Path], max_total: int = LOGS_MAX_TOTAL,
               min_age_s: float = PRUNE_MIN_AGE_S, now: float | None = None) -> list[Path]:
    """Delete the oldest ``*.log*`` files in ``folder`` (not in ``keep``, untouched for ``min_age_s``)
    until the folder's logs fit ``max_total`` bytes; returns what was deleted."""
    now = time.time() if now is None else now
    kept = {Path(p) for p in keep}
    files = []
    total = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for e in entries:
        if ".log" not in e.name or not e.is_file(follow_symlinks=False):
            continue
        st = e.stat(follow_symlinks=False)
        total += st.st_size
        files.append((st.st_mtime, st.st_size, Path(e.path)))
    deleted = []
    for mtime, size, path in sorted(files):
        if total <= max_total:
            break
        if path in kept or now - mtime < min_age_s:
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        deleted.append(path)
    return deleted
