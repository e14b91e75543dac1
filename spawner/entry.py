"""What a Python command runs, as a warm interpreter (one that imported ahead, then forks or is
assigned the command) would run it: a module (``-m``) or a script, and its arguments.

Both warm mechanisms use it; a command a warm interpreter cannot run as a fresh one would (another
interpreter, interpreter flags) is named, and starts cold. :func:`take_thread_count` gives the command the
thread count a fresh interpreter would have taken from its ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Entry:
    """What ``python ARGS`` runs: a module (``-m``) or a script path, and its arguments."""

    module: str | None
    script: str | None
    args: tuple[str, ...]


def entry_of(argv: Sequence[str], python: str = sys.executable) -> Entry | str:
    """The entry point of ``argv`` if a warm process of ``python`` can run it, else why not."""
    if len(argv) < 2:
        return "no script or module after the interpreter"
    if os.path.realpath(argv[0]) != os.path.realpath(python) and argv[0] != python:
        return f"interpreter {argv[0]!r} is not the warm one ({python})"
    if argv[1] == "-m":
        if len(argv) < 3 or not argv[2] or argv[2].startswith("-"):
            return "-m without a module name"
        return Entry(argv[2], None, tuple(argv[3:]))
    if argv[1].startswith("-"):
        return f"interpreter flag {argv[1]!r}"
    return Entry(None, argv[1], tuple(argv[2:]))


def take_thread_count(env: Mapping[str, str]) -> None:
    """Torch's thread count from ``env``'s ``OMP_NUM_THREADS``, as torch's import in a fresh interpreter takes
    it: a warm interpreter imported torch with its own (it ran no parallel operation since, so the pool is
    set by this call). Nothing where torch is not imported or the variable is not a count."""
    torch = sys.modules.get("torch")
    try:
        threads = int(env.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return
    if torch is not None and threads >= 1:
        torch.set_num_threads(threads)
