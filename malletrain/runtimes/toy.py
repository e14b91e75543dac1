"""The toy runtime, daemon side (for tests and machines without torch): membership in ``DIR/<job>.json``,
written atomically, readiness as ``DIR/<job>.ready.<worker>``; the worker is :mod:`malletrain.worker.toy`."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Sequence

from contract.workerenv import WorkerEnv
from malletrain.runtimes import LaunchSpec, Runtime


class ToyRuntime(Runtime):
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

    def launch_spec(self, job_id: str, command: Sequence[str], worker_id: str, node: str,
                    slots: int = 1) -> LaunchSpec:
        env = WorkerEnv(job=job_id, worker=worker_id, monitor=self.monitor or None, runtime=self.name,
                        toy_dir=self.directory).to_environ()
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
