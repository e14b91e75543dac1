"""Exit codes a worker and the processes around it agree on: which say "stopped", not "failed".

A worker stopped by a signal exits ``128 + N`` (a shell's convention, what batch schedulers read);
a worker whose daemon's store stayed away longer than its grace exits :data:`EXIT_STORE_LOST`.
The daemon counts neither toward a job's failures when it caused the stop.
"""

from __future__ import annotations

import signal

EXIT_STORE_LOST = 75
"""A worker whose daemon's store stayed away too long (``EX_TEMPFAIL``): the daemon starts the job again."""
EXIT_SIGTERM = 128 + signal.SIGTERM
"""143: a worker (or a node agent) stopped by SIGTERM: a recall, a stop, a restart at a new size."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP)
"""The signals that stop a worker from outside (a recall, a cancel, a killed process)."""
STOP_STATUSES = frozenset(128 + sig for sig in STOP_SIGNALS)
"""143, 137, 130, 129: the exit statuses of a process stopped by one of :data:`STOP_SIGNALS`."""


def signal_exit(signum: int) -> int:
    """The exit status of a process that ends because of signal ``signum`` (``128 + N``)."""
    return 128 + signum
