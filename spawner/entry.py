"""What a Python command runs, as a warm interpreter (one that imported ahead, then forks or is
assigned the command) would run it: a module (``-m``) or a script, and its arguments.

Both warm mechanisms use it; a command a warm interpreter cannot run as a fresh one would (another
interpreter, interpreter flags) is named, and starts cold.
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
    """Torch's thread count from ``env``'s ``OMP_NUM_THREADS``, as a fresh interpreter's import takes it (the
    warm one imported torch with its own and ran no parallel operation since)."""
    threads = env.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit() and int(threads) >= 1:
        sys.modules["torch"].set_num_threads(int(threads))
