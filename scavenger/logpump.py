"""A worker's log behind a pipe, so its cap holds whatever the job writes.

A log file the agent rotated after the fact grew to 256 MB in 10 s under ``yes``. Now the worker
writes into a pipe and a thread of the agent copies it into the file, bounded as it writes: past
``max_bytes`` the file becomes ``PATH.1`` (at most twice the cap on disk), and while the file system
has less free space than :func:`reserve_bytes` output is dropped (said once per episode in the log).
A writer faster than the disk waits on the full pipe: the job slows itself, not the node.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import IO

from scavenger import jobproc

CHUNK = 1 << 16
RESERVE_MIN = 32 << 20
RESERVE_MAX = 1 << 30
SPACE_EVERY_BYTES = 1 << 20
"""Free space is looked at again after this much output (and at least every :data:`SPACE_EVERY_S`)."""
SPACE_EVERY_S = 1.0
CLOSE_WAIT_S = 1.0
"""How long :meth:`LogPump.close` waits for the last output (the worker is gone by then)."""


def reserve_bytes(total: int) -> int:
    """Free space a log never writes into, on a file system of ``total`` bytes."""
    return min(RESERVE_MAX, max(RESERVE_MIN, total // 10))


def free_and_reserve(folder: Path) -> tuple[int, int]:
    """``(free bytes for an unprivileged writer, reserve)`` of the file system holding ``folder``."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize, reserve_bytes(st.f_blocks * st.f_frsize)


class LogPump:
    """A worker's log: give :attr:`write_end` to the worker as stdout and stderr, then call
    :meth:`spawned`; :meth:`close` once it exited. ``owner``: (uid, gid) the files belong to."""

    def __init__(self, path: Path, max_bytes: int, owner: tuple[int, int] | None = None) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.owner = owner
        self.dropped = 0
        self._file = jobproc.open_private(path, *(owner or (None, None)))
        self._written = os.fstat(self._file.fileno()).st_size
        self._space_at = (-1, 0.0)  # (bytes written, monotonic time) of the last look at free space
        self._short = False
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        self._read_fd = read_fd
        self.write_end: IO[bytes] = os.fdopen(write_fd, "wb", buffering=0)
        self._thread = threading.Thread(target=self._pump, name=f"log {path.name}", daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """(The thread keeps the bounds as it writes: nothing to do from the agent's loop.)"""
        return False

    def spawned(self) -> None:
        """The worker holds its own copy of the write end now: the agent's is closed, so the pipe
        ends (and the thread with it) when the worker and everything it started are gone."""
        if not self.write_end.closed:
            self.write_end.close()

    def close(self) -> None:
        self.spawned()
        self._thread.join(CLOSE_WAIT_S)

    # -- the thread ---------------------------------------------------------------------
    def _pump(self) -> None:
        try:
            while chunk := os.read(self._read_fd, CHUNK):
                self._write(chunk)
        except OSError:
            pass
        finally:
            os.close(self._read_fd)
            self._file.close()

    def _write(self, chunk: bytes) -> None:
        if self._written + len(chunk) > self.max_bytes and self._written > 0:
            self._rotate()
        if not self._room(len(chunk)):
            self.dropped += len(chunk)
            return
        try:
            self._file.write(chunk)
            self._file.flush()  # (the file object buffers: a line must be there as soon as it is written)
            self._written += len(chunk)
        except OSError:
            self.dropped += len(chunk)

    def _rotate(self) -> None:
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            new = jobproc.open_private(self.path, *(self.owner or (None, None)))
        except OSError:
            return  # (the next chunk tries again; the reserve still holds)
        size = self._written
        self._file.close()
        self._file, self._written = new, 0
        self._note(f"log rotated at {size} bytes (cap {self.max_bytes}); the previous part is "
                   f"{self.path.name}.1, older output was dropped")

    def _room(self, n: int) -> bool:
        """Whether ``n`` more bytes leave the file system its reserve (looked at every MiB or second)."""
        at_bytes, at_time = self._space_at
        now = time.monotonic()
        if at_bytes >= 0 and self._written - at_bytes < SPACE_EVERY_BYTES and now - at_time < SPACE_EVERY_S \
                and self._written >= at_bytes:
            return not self._short
        try:
            free, reserve = free_and_reserve(self.path.parent)
        except OSError:
            free, reserve = 0, 0
        short = free - n < reserve
        if short and not self._short:
            self._short = True
            self._note(f"output dropped: the file system holding this log has {free} bytes free, under the "
                       f"{reserve} kept for the daemon and the other jobs")
        elif not short and self._short:
            self._short = False
            self._note(f"output written again ({self.dropped} bytes dropped so far)")
        self._space_at = (self._written, now)
        return not short

    def _note(self, text: str) -> None:
        try:
            line = f"[malletrain agent: {text}]\n".encode()
            self._file.write(line)
            self._file.flush()
            self._written += len(line)
        except OSError:
            pass
