"""The state dir's permissions: private (0700, files 0600; a root daemon's 0711, see
:mod:`malletrain.daemon.control`). A dir others may read or write is tightened when it is ours and holds
only malletrain's files (never ``/tmp`` or a home given by mistake); otherwise the daemon warns."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("malletrain.daemon.store")

DIR_MODE = 0o700
FILE_MODE = 0o600

STATE_ENTRIES = frozenset({"daemon.json", "daemon.json.tmp", "daemon.lock", "logs", "control", "horovod", "toy",
                           "monitor.key", "agent.key", "checkpoints"})
"""What malletrain keeps in a state dir besides ``store.db*``: a folder holding only these is ours to tighten."""

PRIVATE_ENTRIES = ("monitor.key", "agent.key", "daemon.json", "checkpoints", "logs")
"""Entries of an existing state dir made private (files 0600, folders 0700) when the dir is tightened."""

OPEN_BITS = 0o066
"""Group/other read or write on the state dir: what makes it open. Execute alone (0711, what a root
daemon sets so every user can reach the control socket) lets nobody list or change it."""


def _is_state_dir(folder: Path) -> bool:
    """Only malletrain's files in it (so never /tmp, $HOME or /var/lib given by mistake)."""
    try:
        names = [e.name for e in os.scandir(folder)]
    except OSError:
        return False
    return all(n in STATE_ENTRIES or n.startswith("store.db") for n in names)


def private_state_dir(folder: Path) -> None:
    """Create ``folder`` 0700 (``OSError`` if it cannot be); tighten an existing open one (and its keys,
    checkpoints and logs) if it is ours (our uid, only our files). 0711 is not open: a root daemon sets it."""
    folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        st = folder.stat()
        mode = stat.S_IMODE(st.st_mode)
        if not mode & OPEN_BITS:
            return
        if st.st_uid == os.geteuid() and not mode & stat.S_ISVTX and _is_state_dir(folder):
            os.chmod(folder, mode & ~0o077)
            log.warning("%s: the state dir was open to other users (mode %o): made it %o, and its keys, "
                        "checkpoints and logs private", folder, mode, mode & ~0o077)
            for name in PRIVATE_ENTRIES:
                _tighten_entry(folder / name)
        else:
            log.warning("%s: the state dir is open to other users (mode %o); make it 0700", folder, mode)
    except OSError as exc:
        log.warning("%s: cannot make the state dir private: %s", folder, exc)


def _tighten_entry(path: Path) -> None:
    """``path`` (a file, or a folder and the files in it) without group/other access, if it is ours; links are left."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
        return
    os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    if stat.S_ISDIR(st.st_mode):
        for entry in os.scandir(path):
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.geteuid():
                os.chmod(entry.path, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) & ~0o077)


def private_file(path: Path) -> None:
    """Make ``path`` (the store) 0600 if it is ours and open."""
    try:
        st = path.stat()
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, FILE_MODE)
    except OSError as exc:
        log.warning("%s: cannot make the store private: %s", path, exc)


def current_umask() -> int:
    """This process's umask (read from ``/proc``; where there is none, set and set back)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
