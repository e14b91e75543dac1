"""What a change of size costs a job under each launcher: ``torchrun`` (restarted) against in-process.

    python benchmarks/bench_launchers.py [--reps 3]

One run, the same job shape on the same 2 local nodes (min 1, max 2 nodes, one worker a node,
8 samples a rank per step, a linear model on CPU, 50 ms of pretend work a step), once per
launcher, one after the other in the same daemon configuration (``runtime = "torch"``):

* ``torchrun``: ``malletrain.examples.torchrun_ddp``, a plain DDP script with its own checkpoint
  every 20 steps, run with ``launcher = "torchrun"``: each change of size stops every rank
  and starts the script again at the new size (a new interpreter, ``import torch``, a new
  process group, its checkpoint loaded);
* in-process: ``malletrain.examples.train`` (``malletrain.elastic``): the running ranks change
  their world at their next commit; only a joining rank starts a process, ahead of time.

Per repetition one node is recalled (the job shrinks 2 -> 1) and comes back (it grows
1 -> 2). A change's time runs from the moment the daemon publishes the new member list
(the ``members`` event; the ranks are stopped right after it under ``torchrun``) to the
first step any rank takes at the new size. Printed per launcher: each change, then the
medians; the last line compares them (baseline: the in-process launcher, x1.0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from malletrain.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.examples.tracelog import steps as elastic_steps
from malletrain.examples.tracelog import torchrun_steps
from malletrain.jobspec import JobSpec, Launcher

NODES = 2
BATCH = 8
STEP_SLEEP = "0.05"
WAIT_S = 300.0


def job_spec(launcher: Launcher, scratch: Path) -> JobSpec:
    """The same job shape under either launcher (only the script differs: each launcher's own example)."""
    if launcher is Launcher.TORCHRUN:
        cmd = (sys.executable, "-m", "malletrain.examples.torchrun_ddp", "--steps", "100000000", "--batch", str(BATCH),
               "--checkpoint", str(scratch / "ddp.pt"), "--checkpoint-every", "20", "--step-sleep", STEP_SLEEP)
    else:
        cmd = (sys.executable, "-m", "malletrain.examples.train", "--model", "linear", "--batch", str(BATCH),
               "--samples", "100000000000", "--trace", "--step-sleep", STEP_SLEEP)
    return JobSpec(f"bench-{launcher.value}", cmd, 1, NODES, False, {1: 100.0, 2: 200.0},
                   env={"OMP_NUM_THREADS": "1"}, launcher=launcher, worker_batch=BATCH)


def step_times(logs: Path, job: str, launcher: Launcher) -> list[tuple[float, int]]:
    """(time, world size) of every step any rank of ``job`` took."""
    out = []
    for path in logs.glob(f"{job}.*.log"):
        found = torchrun_steps(path) if launcher is Launcher.TORCHRUN else elastic_steps(path)
        out += [(float(s["t"]), int(s["world"])) for s in found]
    return out


def run_until(d: Daemon, pred: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {WAIT_S:.0f} s; events: {list(d.store.events())[-8:]}")
        d.step()
        d.monitor.drain(timeout_ms=int(d.cfg.loop_interval * 1000))


def published_at(d: Daemon, job: str, size: int, after: float) -> float | None:
    """When the daemon published a member list of ``size`` nodes for ``job`` after ``after``."""
    for ev in d.store.events("members"):
        if ev.get("job") == job and len(ev.get("nodes") or ()) == size and ev["time"] > after:
            return float(ev["time"])
    return None


def change(d: Daemon, job: str, launcher: Launcher, logs: Path, size: int, since: float, what: str) -> float:
    """Seconds from the publication of ``size`` nodes (after ``since``) to the first step at that size."""
    run_until(d, lambda: published_at(d, job, size, since) is not None, f"{what}: published")
    t0 = published_at(d, job, size, since)
    assert t0 is not None

    def first() -> float | None:
        return min((t for t, w in step_times(logs, job, launcher) if w == size and t > t0), default=None)

    run_until(d, lambda: first() is not None, f"{what}: the first step at {size}")
    t1 = first()
    assert t1 is not None
    return t1 - t0


def measure(launcher: Launcher, reps: int, root: Path) -> list[float]:
    state = root / launcher.value
    state.mkdir(mode=0o700)
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=NODES, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    d = Daemon(cfg)
    logs = state / "logs"
    out: list[float] = []
    try:
        job = d.store.submit(job_spec(launcher, root))
        run_until(d, lambda: any(w == NODES for _, w in step_times(logs, job, launcher)), "the first steps at 2")
        for rep in range(reps):
            victim = d.runs[job].members[-1]
            t = time.time()
            d.backend.recall(victim)
            down = change(d, job, launcher, logs, NODES - 1, t, f"rep {rep}: shrink")
            t = time.time()
            d.backend.make_idle(victim)
            up = change(d, job, launcher, logs, NODES, t, f"rep {rep}: grow")
            print(f"{launcher.value}: rep {rep}: shrink {NODES} -> {NODES - 1} {down:.2f} s; "
                  f"grow {NODES - 1} -> {NODES} {up:.2f} s", flush=True)
            out += [down, up]
    finally:
        d.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3, help="recall-and-return cycles per launcher")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-launchers-") as tmp:
        restarted = measure(Launcher.TORCHRUN, args.reps, Path(tmp))
        in_process = measure(Launcher.ELASTIC, args.reps, Path(tmp))
    x, y = statistics.median(restarted), statistics.median(in_process)
    for name, changes in (("torchrun", restarted), ("in-process", in_process)):
        down, up = changes[0::2], changes[1::2]
        print(f"{name}: {len(changes)} changes, median {statistics.median(changes):.2f} s, max {max(changes):.2f} s; "
              f"shrink median {statistics.median(down):.2f} s, grow median {statistics.median(up):.2f} s")
    print(f"launchers: torchrun stop -> first step at the new size median {x:.2f} s; "
          f"in-process median {y:.2f} s; ratio {x / y:.1f}")


if __name__ == "__main__":
    main()
