"""A warm process's command line and environment as ``ps`` and ``/proc`` show them, made the worker's.

A warm process becomes its worker without an ``exec``, so ``ps`` and ``/proc/PID/environ`` showed
what started it. Both are read live from the memory the process was started with (``arg_start``..
``env_end`` in ``/proc/self/stat``), which it may write: :func:`show_command` writes the worker's argv
there (room reserved: :data:`ROOM`), :func:`show_environ` its environment (whole variables, as many
as fit); the thread name becomes the script's. Only ``ctypes``: setproctitle is not a dependency.
"""

from __future__ import annotations

import ctypes
import os
from typing import Mapping, Sequence

ROOM = 1024
"""Bytes of blank argument the agent starts a warm process with: room for the worker's command line."""
PR_SET_NAME = 15
COMM_MAX = 15


def _areas() -> tuple[int, int, int, int] | None:
    """``(arg_start, arg_end, env_start, env_end)`` of this process, or None where /proc hides them."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2:].split()
        # fields 48-51 of proc(5), counted from 1 with pid and comm: index 45-48 after comm
        start, end, env_start, env_end = (int(f) for f in fields[45:49])
    except (OSError, ValueError, IndexError):
        return None
    if not 0 < start < end or not 0 < env_start <= env_end:
        return None
    return start, end, env_start, env_end


def _write(start: int, end: int, data: bytes) -> None:
    """``data`` into this process's memory at ``start`` (truncated to ``end``), NUL-padded to ``end``."""
    size = end - start
    body = data[:max(0, size - 1)]
    ctypes.memmove(start, body + b"\0" * (size - len(body)), size)


def show_command(argv: Sequence[str]) -> bool:
    """``ps`` shows ``argv`` for this process (truncated to the room it was started with); False if it cannot."""
    name = os.path.basename(argv[1] if len(argv) > 1 and not argv[1].startswith("-") else argv[0])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode(errors="replace")[:COMM_MAX]), 0, 0, 0)
    areas = _areas()
    if areas is None:
        return False
    _write(areas[0], areas[1], b"\0".join(a.encode(errors="surrogateescape") for a in argv))
    return True


def show_environ(env: Mapping[str, str]) -> bool:
    """``/proc/PID/environ`` shows ``env`` (whole variables, as many as fit; never the old ones)."""
    areas = _areas()
    if areas is None:
        return False
    start, end = areas[2], areas[3]
    out = b""
    for key, value in env.items():
        item = f"{key}={value}".encode(errors="surrogateescape") + b"\0"
        if len(out) + len(item) > end - start:
            break
        out += item
    _write(start, end, out)
    return True
