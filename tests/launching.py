"""Shared by the launcher and integration tests: a real monitor, a worker's environment, torchrun runs."""

from __future__ import annotations

import os
import sys
from typing import Iterator

import pytest
import zmq

from contract.messages import new_secret
from contract.workerenv import ENV_JOB_SECRET
from malletrain.daemon.monitor import Monitor
from contract.workerenv import ENV_JOB, ENV_MONITOR, ENV_WORKER, ENV_WORKER_BATCH
from stepping import poll

JOB = "j000029"
RUN_TIMEOUT_S = 600
_INHERITED_NOT = (ENV_WORKER_BATCH, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                  "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def mon() -> Iterator[tuple[Monitor, str]]:
    """A real monitor with the job registered under a fresh secret: (monitor, secret)."""
    ctx = zmq.Context()
    m = Monitor(ctx=ctx)
    secret = new_secret()
    m.register(JOB, secret)
    yield m, secret
    m.close()
    ctx.destroy(linger=0)


def worker_env(mon: Monitor, secret: str, worker_batch: int | None, worker: str = f"{JOB}.n0.0") -> dict[str, str]:
    """This process's environment plus what the daemon gives a worker (a fresh ``worker`` id per start)."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_NOT}
    env.update({ENV_MONITOR: mon.address, ENV_JOB: JOB, ENV_WORKER: worker, ENV_JOB_SECRET: secret,
                "OMP_NUM_THREADS": "1"})
    if worker_batch is not None:
        env[ENV_WORKER_BATCH] = str(worker_batch)
    return env


def torchrun_cmd(nproc: int, target: list[str]) -> list[str]:
    """``torchrun --standalone --nproc-per-node=N -m malletrain.worker.launch TARGET...``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "malletrain.worker.launch", *target]


def wait_received(mon: Monitor, n: int, ceiling_s: float = 60) -> None:
    """Drain until ``n`` frames arrived (a generous ceiling), then assert exactly ``n``."""
    poll(lambda: mon.received >= n, ceiling_s, tick=lambda: mon.drain(timeout_ms=100), pause=0)
    assert mon.received == n, mon.counts()
