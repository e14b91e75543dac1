"""Ending a worker-side process at once: logs and streams flushed, none of the interpreter's teardown.

With torch loaded the teardown takes seconds, past the grace a scheduler or an agent gives before
SIGKILL; a process that has nothing left to save ends this way instead."""

from __future__ import annotations

import logging
import os
import sys


def exit_now(code: int) -> None:
    """Flush the logs and the standard streams, then end the process with ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
