"""How everything a worker starts is held and ended with it: a cgroup where the node has one, else a subreaper.

The agent picks one :class:`Containment` at start (:func:`choose`); what each holds and where:
docs/operators/security.md (processes). The agent's folder ``malletrain-agent.PID.START`` (START: its
start time, so a reused pid never names it) lies in its installation's subtree ``malletrain.ID``:
:func:`sweep_stale` judges another agent dead by a pid read in its own pid namespace, which is wrong
for another daemon's agent in another namespace. A worker writes itself into its cgroup between fork
and exec through a ``cgroup.procs`` the agent opened before the privilege drop (the kernel checks the
opener's rights). The agent stays a subreaper in every case, so processes killed in a cgroup whose
parent died are re-parented to it and reaped.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Protocol

from scavenger import jobproc

log = logging.getLogger("scavenger.containment")

AGENT_DIR_PREFIX = "malletrain-agent."
INSTALL_DIR_PREFIX = "malletrain."
KILL_WAIT_S = 2.0
"""How long ending a cgroup waits for its processes to be gone before it leaves the folder for later."""
FREEZE_WAIT_S = 1.0


class Mode(enum.Enum):
    """Which cgroup hierarchy holds the workers."""

    V2 = "cgroup2"
    FREEZER = "freezer"
    PIDS = "pids"


CHOICES = ("auto", *(m.value for m in Mode), "subreaper")
"""What ``--containment`` accepts: ``auto`` tries cgroup2, freezer, pids, then the subreaper."""


class Containment(Protocol):
    """Holds each worker's processes and ends them with it (one per agent, see :func:`choose`)."""

    @property
    def description(self) -> str:
        """One line for the agent's log: which backend, where."""

    def prepare(self, worker: str) -> Callable[[], None] | None:
        """Get ready to hold ``worker``; what its process runs between fork and exec to join (or None)."""

    def add(self, worker: str, pid: int) -> None:
        """``pid`` (the spawned worker, or the warm process taking its place) belongs to ``worker``."""

    def release(self, pid: int) -> None:
        """``pid`` was added but did not become the worker (a warm process that refused): hand it back."""

    def end(self, worker: str) -> int:
        """Kill everything ``worker`` started and forget it; how many processes were killed."""

    def sweep(self, keep: Collection[int]) -> int:
        """Periodic: kill and reap what ended workers left (the agent's children outside ``keep``)."""

    def close(self) -> None:
        """At the agent's exit: end every worker's processes and remove what was made."""


# ---------------------------------------------------------------- the subreaper
@dataclass
class Subreaper:
    """The fallback: orphans of ended workers are re-parented to the (subreaper) agent, which kills them."""

    active: bool
    """False where the kernel refused: then nothing catches a detached process."""

    @property
    def description(self) -> str:
        if not self.active:
            return "none (cannot become a subreaper: processes a job detaches with setsid may outlive it)"
        return "subreaper (orphans of ended workers are killed; not if the agent itself is killed)"

    def prepare(self, worker: str) -> Callable[[], None] | None:
        return None  # each worker becomes a subreaper in jobproc.child_setup anyway

    def add(self, worker: str, pid: int) -> None:
        pass

    def release(self, pid: int) -> None:
        pass

    def end(self, worker: str) -> int:
        return 0  # the orphans it leaves are killed by the next sweep

    def sweep(self, keep: Collection[int]) -> int:
        return jobproc.end_orphans(os.getpid(), keep) if self.active else 0

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- where the cgroups are
@dataclass(frozen=True)
class Place:
    """The agent's own cgroup folder in one hierarchy."""

    mode: Mode
    parent: Path


def _unescape(field_: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def places(mountinfo: str, proc_cgroup: str) -> list[Place]:
    """The agent's cgroup folder per usable hierarchy, in order of preference (v2, freezer, pids), from
    the text of ``/proc/self/mountinfo`` and ``/proc/self/cgroup``."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for controller in parts[1].split(","):
            v1[controller] = parts[2]
    found: dict[Mode, Path] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype, options = _unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2 is not None:
            mode, path = Mode.V2, v2
        elif fstype == "cgroup" and "freezer" in options and "freezer" in v1:
            mode, path = Mode.FREEZER, v1["freezer"]
        elif fstype == "cgroup" and "pids" in options and "pids" in v1:
            mode, path = Mode.PIDS, v1["pids"]
        else:
            continue
        rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
        if rel.startswith(".."):
            continue  # this mount does not show the agent's cgroup
        found.setdefault(mode, Path(point) / ("" if rel == "." else rel))
    return [Place(m, found[m]) for m in Mode if m in found]


def own_places() -> list[Place]:
    """:func:`places` of this process (empty where ``/proc`` cannot be read)."""
    try:
        with open("/proc/self/mountinfo") as fh:
            mountinfo = fh.read()
        with open("/proc/self/cgroup") as fh:
            proc_cgroup = fh.read()
    except OSError:
        return []
    return places(mountinfo, proc_cgroup)


def start_ticks(pid: int) -> int | None:
    """``pid``'s start time (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def agent_dir_name(pid: int) -> str:
    return f"{AGENT_DIR_PREFIX}{pid}.{start_ticks(pid)}"


def installation_id(key: bytes) -> str:
    """The name of one daemon's cgroup subtree, from its agent key (every agent of the daemon holds it;
    another daemon has another key): 16 hex digits of a keyed hash, which tell nothing of the key."""
    return hmac.new(key, b"malletrain cgroup subtree", hashlib.sha256).hexdigest()[:16]


def install_dir(parent: Path, installation: str) -> Path:
    """The subtree below ``parent`` (the agent's own cgroup) of the daemon whose id is ``installation``."""
    if not re.fullmatch(r"[0-9a-f]{1,64}", installation):
        raise ValueError(f"installation id {installation[:80]!r}: must be 1-64 lower-case hex digits")
    return parent / f"{INSTALL_DIR_PREFIX}{installation}"


# ---------------------------------------------------------------- ending what a cgroup holds
def _pids_in(folder: Path) -> list[int]:
    """The processes in ``folder`` and every cgroup below it."""
    out: list[int] = []
    for dirpath, _dirs, _files in os.walk(folder):
        try:
            with open(os.path.join(dirpath, "cgroup.procs")) as fh:
                out.extend(int(p) for p in fh.read().split())
        except (OSError, ValueError):
            continue
    return out


def _write(path: Path, text: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(text)
        return True
    except OSError:
        return False


def _kill_each(pids: Collection[int]) -> int:
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def _freeze_v1(folder: Path, state: str) -> None:
    _write(folder / "freezer.state", state)
    deadline = time.monotonic() + FREEZE_WAIT_S
    while state == "FROZEN" and time.monotonic() < deadline:
        try:
            if (folder / "freezer.state").read_text().strip() == "FROZEN":
                return
        except OSError:
            return
        time.sleep(0.005)


def kill_cgroup(folder: Path, mode: Mode, wait_s: float = KILL_WAIT_S) -> int:
    """SIGKILL every process in the cgroup ``folder`` (and below), until none is left or ``wait_s``
    passed; how many were killed. A fork racing the kill is caught: v2 ``cgroup.kill`` and the v1
    freezer are atomic, v1 ``pids`` first forbids forking."""
    seen = set(_pids_in(folder))
    if mode is Mode.V2:
        if not _write(folder / "cgroup.kill", "1"):  # before Linux 5.14
            _write(folder / "cgroup.freeze", "1")
    elif mode is Mode.FREEZER:
        _freeze_v1(folder, "FROZEN")
        _kill_each(_pids_in(folder))
        _freeze_v1(folder, "THAWED")
    elif mode is Mode.PIDS:
        _write(folder / "pids.max", "0")
    deadline = time.monotonic() + wait_s
    while left := _pids_in(folder):
        seen.update(left)
        _kill_each(left)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    return len(seen)


def remove_tree(folder: Path) -> bool:
    """rmdir ``folder`` and the (empty) cgroups below it, deepest first; False if one is still busy."""
    ok = True
    for dirpath, _dirs, _files in os.walk(folder, topdown=False):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok


def sweep_stale(parent: Path, mode: Mode) -> int:
    """End the folders of agents that are gone (killed before their cleanup) below ``parent``: kill
    every process left in them (a job's detached grandchildren) and remove them; how many processes."""
    killed = 0
    try:
        names = [e.name for e in os.scandir(parent) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    for name in names:
        if not name.startswith(AGENT_DIR_PREFIX):
            continue
        pid_text, _, ticks_text = name[len(AGENT_DIR_PREFIX):].partition(".")
        if pid_text.isdigit() and str(start_ticks(int(pid_text))) == ticks_text:
            continue  # its agent lives
        killed += kill_cgroup(parent / name, mode)
        remove_tree(parent / name)
    return killed


# ---------------------------------------------------------------- the cgroup backend
@dataclass
class _Group:
    path: Path
    procs_fd: int | None  # cgroup.procs, opened by the agent before the spawn; closed after it


@dataclass
class CgroupContainment:
    """Each worker in a cgroup of its own below the agent's folder in ``place`` (see the module doc)."""

    place: Place
    reaper: Subreaper
    installation: str = "0"
    """The daemon's id (:func:`installation_id`): the agent's folder is in that daemon's subtree."""
    base: Path = field(init=False)
    groups: dict[str, _Group] = field(default_factory=dict)
    busy: list[Path] = field(default_factory=list)  # cgroups whose processes were not all gone yet
    seq: int = 0

    def __post_init__(self) -> None:
        self.base = install_dir(self.place.parent, self.installation) / agent_dir_name(os.getpid())
        for _ in range(3):  # another agent of the daemon may remove the (empty) subtree meanwhile
            try:
                self.base.parent.mkdir(mode=0o755, exist_ok=True)
                self.base.mkdir(mode=0o755, exist_ok=True)  # OSError: not usable (the caller falls back)
                break
            except FileNotFoundError:
                continue
        probe = self.base / "probe"
        try:
            probe.mkdir(mode=0o755)
            fd = os.open(probe / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            os.close(fd)
        except OSError:
            remove_tree(self.base)
            raise
        finally:
            remove_tree(probe)

    @property
    def description(self) -> str:
        return (f"{self.place.mode.value} cgroups at {self.base} (each worker in its own; ended with every "
                f"process in it)")

    def prepare(self, worker: str) -> Callable[[], None] | None:
        self.end(worker)  # a name reused: never join the last one's leftovers
        self.seq += 1
        path = self.base / f"w{self.seq}.{re.sub(r'[^A-Za-z0-9_.-]', '_', worker)[:64]}"
        try:
            path.mkdir(mode=0o755)
            fd = os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("worker %s: no cgroup (%s): only the subreaper holds what it starts", worker, exc)
            remove_tree(path)
            return None
        self.groups[worker] = _Group(path, fd)

        def join() -> None:  # in the child, after the privilege drop: root's open file still lets it in
            try:
                os.write(fd, b"0")
            except OSError as exc:
                os.write(2, f"malletrain agent: cannot join the worker's cgroup: {exc.strerror}\n".encode())

        return join

    def _close_fd(self, group: _Group) -> None:
        if group.procs_fd is not None:
            os.close(group.procs_fd)
            group.procs_fd = None

    def add(self, worker: str, pid: int) -> None:
        group = self.groups.get(worker)
        if group is None:
            return
        self._close_fd(group)
        try:
            with open(group.path / "cgroup.procs", "w") as fh:
                fh.write(str(pid))
        except ProcessLookupError:
            pass  # it already exited
        except OSError as exc:
            log.warning("worker %s: pid %d could not join its cgroup %s: %s", worker, pid, group.path, exc)

    def release(self, pid: int) -> None:
        _write(self.place.parent / "cgroup.procs", str(pid))

    def end(self, worker: str) -> int:
        group = self.groups.pop(worker, None)
        if group is None:
            return 0
        self._close_fd(group)
        killed = kill_cgroup(group.path, self.place.mode)
        if not remove_tree(group.path):
            self.busy.append(group.path)
        return killed

    def sweep(self, keep: Collection[int]) -> int:
        killed = self.reaper.sweep(keep)
        for path in list(self.busy):
            killed += kill_cgroup(path, self.place.mode, wait_s=0.0)
            if remove_tree(path):
                self.busy.remove(path)
        return killed

    def close(self) -> None:
        for worker in list(self.groups):
            self.end(worker)
        for path in self.busy:
            kill_cgroup(path, self.place.mode)
        kill_cgroup(self.base, self.place.mode)
        remove_tree(self.base)
        try:
            self.base.parent.rmdir()  # the daemon's subtree, once its last agent here is gone
        except OSError:
            pass


# ---------------------------------------------------------------- the choice
def choose(wanted: str = "auto", installation: str = "0") -> Containment:
    """The containment for this agent: ``wanted`` (one of :data:`CHOICES`), else the subreaper;
    stale folders of gone agents under ``installation`` are ended first (:func:`sweep_stale`)."""
    reaper = Subreaper(jobproc.become_subreaper())
    if wanted == "subreaper":
        return reaper
    tried: list[str] = []
    for place in own_places():
        if wanted not in ("auto", place.mode.value):
            continue
        try:
            chosen = CgroupContainment(place, reaper, installation)
        except OSError as exc:
            tried.append(f"{place.mode.value} at {place.parent}: {exc.strerror or exc}")
            continue
        stale = sweep_stale(chosen.base.parent, place.mode)
        if stale:
            log.warning("killed %d process(es) left in the cgroups of agents that are gone", stale)
        return chosen
    log.info("no usable cgroup for %s (%s)", wanted, "; ".join(tried) or "none mounted for this process")
    return reaper
