"""A tiny elastic runtime without torch, for tests and machines without torch.

Membership lives in files (``DIR/<job>.json`` = ``{"gen": g, "members": [...]}``,
written atomically); each worker is a plain Python process
(``python -m malletrain.toy_runtime --rate R``) that "trains" by sleeping one
step per iteration at a modelled speed ``rate * n**alpha`` samples/s on ``n``
workers, and whose rank 0 sends real :class:`~malletrain.messages.Report`
frames to the job monitor. Like the ``torch`` runtime, a worker joins when it
is in the published member list, changes world size at its next step, and
exits 0 when it is dropped from the list.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from malletrain.runtimes import LaunchSpec

ENV_DIR = "MALLETRAIN_TOY_DIR"


class ToyRuntime:
    """Daemon side: publishes member lists as files in ``directory``."""

    name = "toy"

    def __init__(self, directory: str | None = None, monitor: str | None = None) -> None:
        self._own = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="malletrain-toy-"))
        self.monitor = monitor
        self._gen: dict[str, int] = {}

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        pass

    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str) -> LaunchSpec:
        env = {"MALLETRAIN_JOB": job_id, "MALLETRAIN_WORKER": worker_id, ENV_DIR: str(self.directory)}
        if self.monitor:
            env["MALLETRAIN_MONITOR"] = self.monitor
        return LaunchSpec(tuple(command), env)

    def _path(self, job_id: str) -> Path:
        return self.directory / f"{job_id}.json"

    def generation(self, job_id: str) -> int:
        if job_id not in self._gen:
            try:
                self._gen[job_id] = int(json.loads(self._path(job_id).read_text())["gen"])
            except (OSError, ValueError, KeyError):
                self._gen[job_id] = 0
        return self._gen[job_id]

    def set_members(self, job_id: str, members: Sequence[str]) -> int:
        gen = self.generation(job_id) + 1
        tmp = self._path(job_id).with_suffix(".tmp")
        tmp.write_text(json.dumps({"gen": gen, "members": list(members)}))
        os.replace(tmp, self._path(job_id))
        self._gen[job_id] = gen
        return gen

    def ready(self, job_id: str, worker_id: str) -> bool:
        return (self.directory / f"{job_id}.ready.{worker_id}").exists()

    def forget(self, job_id: str, keep_state: bool = True) -> None:
        self._gen.pop(job_id, None)
        for p in self.directory.glob(f"{job_id}.*"):
            p.unlink(missing_ok=True)


def _read(path: Path) -> tuple[int, list[str]]:
    try:
        obj = json.loads(path.read_text())
        return int(obj["gen"]), [str(m) for m in obj["members"]]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, []


def worker_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m malletrain.toy_runtime")
    ap.add_argument("--rate", type=float, default=200.0, help="samples/s on one worker")
    ap.add_argument("--alpha", type=float, default=0.9, help="scaling exponent: rate * n**alpha on n workers")
    ap.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    ap.add_argument("--exit-after-samples", type=int, default=0, help="rank 0 exits 0 after this many (0: never)")
    args = ap.parse_args(argv)
    job = os.environ["MALLETRAIN_JOB"]
    me = os.environ["MALLETRAIN_WORKER"]
    directory = Path(os.environ[ENV_DIR])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    (directory / f"{job}.ready.{me}").touch()
    reporter = None
    if os.environ.get("MALLETRAIN_MONITOR"):
        from malletrain.client import Reporter

        reporter = Reporter(os.environ["MALLETRAIN_MONITOR"], job, me)
    path = directory / f"{job}.json"
    joined = False
    done = 0
    while True:
        gen, members = _read(path)
        if me not in members:
            if joined:
                break  # dropped from the job: leave at this commit point
            time.sleep(0.02)
            continue
        joined = True
        n = len(members)
        samples = args.batch * n
        time.sleep(samples / (args.rate * n**args.alpha))
        if members.index(me) == 0:
            done += samples
            if reporter is not None:
                reporter.send(samples, n, gen)
            if args.exit_after_samples and done >= args.exit_after_samples:
                break
    if reporter is not None:
        reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
