"""The Horovod runtime's membership file: what the daemon writes and a Horovod worker reads.

The daemon's Horovod runtime publishes each membership of a job in ``members.json`` of the job's
directory (``$MALLETRAIN_HOROVOD_JOB_DIR``): its generation, and the workers retired from it; a
worker reads the generation it trains in with :func:`current_generation`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from contract.workerenv import ENV_HOROVOD_JOB_DIR

MEMBERS_FILE = "members.json"


def current_generation(job_dir: str | os.PathLike[str] | None = None) -> int:
    """The latest membership generation published for this job (0 if none or unknown), from inside
    a Horovod worker (``job_dir`` default: ``$MALLETRAIN_HOROVOD_JOB_DIR``)."""
    where = job_dir if job_dir is not None else os.environ.get(ENV_HOROVOD_JOB_DIR)
    if not where:
        return 0
    try:
        record = json.loads((Path(where) / MEMBERS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return 0
    generation = record.get("generation")
    if not isinstance(generation, int):
        raise ValueError(f"{Path(where) / MEMBERS_FILE}: field 'generation' is not an integer: {generation!r}")
    return generation
