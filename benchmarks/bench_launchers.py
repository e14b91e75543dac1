"""What a change of world costs a job under each launcher: ``torchrun`` warm and cold, torch elastic, in-process.

    python benchmarks/bench_launchers.py [--reps 3] [--short]

One run, the same job shape on the same 2 local "nodes" (min 1, max 2, one rank a node, 8 samples
a rank per step, a linear model on CPU, 50 ms of pretend work a step), one launcher after the other:

* ``torchrun script warm``: ``malletrain.worker.examples.torchrun_ddp`` (a plain DDP script with its own
  checkpoint every 20 steps) under the daemon with ``launcher = "torchrun"``: each change stops every
  rank and starts the script again at the new size, each start a fork of its rank server, which
  imported torch once (:mod:`malletrain.worker.warm_ranks`);
* ``cold``: the same with ``WARM_RANKS=0`` in the job's environment: each start a new interpreter
  importing torch (what every change cost before warm ranks);
* ``torch elastic``: PyTorch's own launcher, the anchor: two ``torchrun --nnodes=1:2
  --rdzv-backend=c10d`` agents on this machine, the same script; the second agent is stopped
  (SIGTERM to its process group: a recall) and started again (the node's return). Its rendezvous
  waits ``last_call_timeout`` for more nodes once it has its minimum: 2 s here (30 s by default). A change
  that does not complete within ``WAIT_S`` (its rendezvous timed out: seen here under load) is printed
  and left out of its median;
* ``in-process``: ``malletrain.worker.examples.train`` (``malletrain.worker.elastic``): the running ranks change their
  world at their next commit; only a joining rank starts a process, ahead of time.

Per repetition one node is recalled (2 -> 1) and comes back (1 -> 2). A change's cost to the job is its
pause: from the last step any rank took in the old world to the first step any rank takes in the new one,
the time the job trains nothing (while a returning node imports, the old world trains on). Each change is
also timed from the recall (the node's return) to that first step; the grows' times from the node's return
are the ``node return`` line. Then an unchanged Lightning script (``malletrain.worker.examples.lightning_plain``,
strategy="ddp", its own ``ModelCheckpoint``) runs under the daemon through the same changes, and the
rank agents' SIGKILLs are counted. The last line gives the medians and that count.
``--short``: one repetition each (a few minutes on a loaded 2-core machine). ``--launchers warm,in-process``
measures those only (no last line then). Where both are measured, a line compares a node's return to the first
step on it under the torchrun launcher, warm, and in-process (the grows).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from harness import add_short, free_port, last_line, load, step_until

from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.worker.examples.tracelog import steps as elastic_steps
from malletrain.worker.examples.tracelog import torchrun_steps
from malletrain.daemon.jobspec import JobSpec, Launcher

NODES = 2
BATCH = 8
STEP_SLEEP = "0.05"
WAIT_S = 300.0
RETURN_AFTER_S = 20.0
"""Torch elastic: how long after the shrink the recalled agent comes back. Sooner, the new agent met the
stopped one's place in the c10d rendezvous (its keep-alive, 3 x 5 s, not yet expired) and both timed out."""


@dataclass(frozen=True)
class Variant:
    """One launcher as measured: its name in the output and the job (or the torchrun anchor) it runs."""

    name: str
    launcher: Launcher
    module: str = "malletrain.worker.examples.torchrun_ddp"
    warm: bool = True


def job_command(v: Variant, scratch: Path) -> tuple[str, ...]:
    if v.module == "malletrain.worker.examples.lightning_plain":
        return (sys.executable, "-m", v.module, "--ckpt-dir", str(scratch / "lightning"), "--step-sleep", STEP_SLEEP)
    if v.launcher is Launcher.TORCHRUN:
        return (sys.executable, "-m", v.module, "--steps", "100000000", "--batch", str(BATCH),
                "--checkpoint", str(scratch / "ddp.pt"), "--checkpoint-every", "20", "--step-sleep", STEP_SLEEP)
    return (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--batch", str(BATCH),
            "--samples", "100000000000", "--trace", "--step-sleep", STEP_SLEEP)


def job_spec(v: Variant, scratch: Path) -> JobSpec:
    """The same job shape under every launcher (the script differs: each launcher's own example)."""
    env = {"OMP_NUM_THREADS": "1"} if v.warm else {"OMP_NUM_THREADS": "1", "WARM_RANKS": "0"}
    return JobSpec(f"bench-{v.name.replace(' ', '-')}", job_command(v, scratch), 1, NODES, False, {1: 100.0, 2: 200.0},
                   env=env, launcher=v.launcher, worker_batch=BATCH)


def step_times(logs: Path, job: str, launcher: Launcher) -> list[tuple[float, int]]:
    """(time, world size) of every step any rank of ``job`` took."""
    out = []
    for path in logs.glob(f"{job}.*.log"):
        found = torchrun_steps(path) if launcher is Launcher.TORCHRUN else elastic_steps(path)
        out += [(float(s["t"]), int(s["world"])) for s in found]
    return out


def run_until(d: Daemon, pred: Callable[[], bool], what: str) -> None:
    step_until(d, what, pred, WAIT_S)


def first_step(times: list[tuple[float, int]], size: int, after: float) -> float | None:
    return min((t for t, w in times if w == size and t > after), default=None)


@dataclass(frozen=True)
class Change:
    """One change of world: seconds from the recall (the node's return) to the first step in the new world,
    and the job's pause (its last step in the old world to that first step)."""

    since: float
    pause: float


def change(times: list[tuple[float, int]], old: int, new: int, at: float) -> Change:
    """The change from ``old`` to ``new`` ranks that began at ``at`` (a recall or a return)."""
    first = first_step(times, new, at) or at
    last = max((t for t, w in times if w == old and t < first), default=at)
    return Change(first - at, first - last)


def published_at(d: Daemon, job: str, size: int, after: float) -> float | None:
    """When the daemon published a member list of ``size`` nodes for ``job`` after ``after``."""
    for ev in d.store.events("members"):
        if ev.get("job") == job and len(ev.get("nodes") or ()) == size and ev["time"] > after:
            return float(ev["time"])
    return None


def measure(v: Variant, reps: int, root: Path) -> tuple[list[Change], int]:
    """The changes under the daemon (a recall, then the node's return), and the SIGKILLs the job's rank
    agents logged."""
    state = root / v.name.replace(" ", "-")
    state.mkdir(mode=0o700)
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=NODES, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    d = Daemon(cfg)
    logs = state / "logs"
    out: list[Change] = []
    try:
        job = d.store.submit(job_spec(v, state))
        times = lambda: step_times(logs, job, v.launcher)  # noqa: E731
        run_until(d, lambda: any(w == NODES for _, w in times()), f"{v.name}: the first steps at 2")
        for rep in range(reps):
            victim = d.runs[job].members[-1]
            t = time.time()
            d.backend.recall(victim)
            run_until(d, lambda: first_step(times(), NODES - 1, t) is not None, f"{v.name} rep {rep}: shrink")
            down = change(times(), NODES, NODES - 1, t)
            t_down, t = t, time.time()
            d.backend.make_idle(victim)
            run_until(d, lambda: first_step(times(), NODES, t) is not None, f"{v.name} rep {rep}: grow")
            up = change(times(), NODES - 1, NODES, t)
            pub = [(first_step(times(), size, t0) or 0.0) - (published_at(d, job, size, t0) or 0.0)
                   for size, t0 in ((NODES - 1, t_down), (NODES, t))]
            print(f"{v.name}: rep {rep}: shrink {NODES} -> {NODES - 1} pause {down.pause:.2f} s "
                  f"({down.since:.2f} s from the recall); grow {NODES - 1} -> {NODES} pause {up.pause:.2f} s "
                  f"({up.since:.2f} s from the node's return); first step from the publication of the new "
                  f"world: {pub[0]:.2f} s, {pub[1]:.2f} s", flush=True)
            out += [down, up]
    finally:
        d.close()
    kills = sum(p.read_text(errors="replace").count("SIGTERM: SIGKILL") for p in logs.glob("*.log"))
    return out, kills


def torch_elastic_agent(port: int, scratch: Path, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """One ``torchrun`` agent of the anchor (a "node"), in its own process group. Torch's opt-out of sharing
    the rendezvous store with the workers (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) is set: with sharing, a
    staying rank 0 publishes its store's address in the first round only, and a returning agent waits for it
    in the new round until both time out (60 s; seen with torch 2.13 at every return here)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench-launchers",
            "--rdzv-conf=last_call_timeout=2", "--max-restarts=100", "--monitor-interval=0.1",
            *job_command(Variant("torch elastic", Launcher.TORCHRUN), scratch)[1:]]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass


def measure_torch_elastic(reps: int, root: Path) -> list[Change]:
    """The anchor: the same changes under PyTorch's elastic launcher (the first agent hosts the
    rendezvous store and stays; the second is recalled and returns)."""
    scratch = root / "torch-elastic"
    scratch.mkdir()
    port = free_port()
    logs = [scratch / "agent0.log", scratch / "agent1.log"]
    files = [open(p, "ab") for p in logs]
    procs = [torch_elastic_agent(port, scratch, files[0])]

    def times() -> list[tuple[float, int]]:
        return [(float(s["t"]), int(s["world"])) for p in logs for s in torchrun_steps(p)]

    def until(pred: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not pred():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise TimeoutError(f"torch elastic: {what}: not within {WAIT_S:.0f} s (see {logs[0]})")
            time.sleep(0.05)

    out: list[Change] = []
    try:
        time.sleep(1.0)  # the first agent binds the rendezvous store before the second looks for it
        procs.append(torch_elastic_agent(port, scratch, files[1]))
        until(lambda: any(w == NODES for _, w in times()), "the first steps at 2")
        for rep in range(reps):
            t = time.time()
            stop(procs[1])
            until(lambda: first_step(times(), NODES - 1, t) is not None, f"rep {rep}: shrink")
            down = change(times(), NODES, NODES - 1, t)
            out.append(down)
            time.sleep(RETURN_AFTER_S)  # the recalled agent's place in the rendezvous expires first
            t = time.time()
            procs[1] = torch_elastic_agent(port, scratch, files[1])
            until(lambda: first_step(times(), NODES, t) is not None, f"rep {rep}: grow")
            up = change(times(), NODES - 1, NODES, t)
            print(f"torch elastic: rep {rep}: shrink {NODES} -> {NODES - 1} pause {down.pause:.2f} s "
                  f"({down.since:.2f} s from the recall); grow {NODES - 1} -> {NODES} pause {up.pause:.2f} s "
                  f"({up.since:.2f} s from the agent's return)", flush=True)
            out.append(up)
    except TimeoutError as exc:
        print(f"torch elastic: {exc}; {len(out)} change(s) measured", flush=True)
    finally:
        for proc in reversed(procs):
            stop(proc)
        for f in files:
            f.close()
    return out


LAUNCHERS = ("warm", "cold", "torch elastic", "in-process", "lightning")


def node_return_line(changes: dict[str, list[Change]]) -> str | None:
    """A node's return to the first step on it, torchrun warm against in-process (the grows' medians, one run)."""
    if not changes.get("warm", [])[1::2] or not changes.get("in-process", [])[1::2]:
        return None
    warm, inproc = (statistics.median(c.since for c in changes[name][1::2]) for name in ("warm", "in-process"))
    return (f"node return -> first step on it: torchrun warm {warm:.2f} s, in-process {inproc:.2f} s "
            f"(medians of the grows, same run; difference {warm - inproc:+.2f} s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3, help="recall-and-return cycles per launcher")
    p.add_argument("--launchers", default=",".join(LAUNCHERS),
                   help=f"which to measure, comma-separated, of {', '.join(LAUNCHERS)} (the last line needs all)")
    add_short(p, "one cycle per launcher")
    args = p.parse_args()
    reps = 1 if args.short else args.reps
    chosen = [name.strip() for name in args.launchers.split(",") if name.strip()]
    if unknown := [name for name in chosen if name not in LAUNCHERS]:
        p.error(f"--launchers: unknown {', '.join(unknown)} (known: {', '.join(LAUNCHERS)})")
    print(f"load before: {load()}", flush=True)
    changes: dict[str, list[Change]] = {}
    lightning: list[Change] = []
    kills = 0
    with tempfile.TemporaryDirectory(prefix="bench-launchers-") as tmp:
        root = Path(tmp)
        if "warm" in chosen:
            changes["warm"], _ = measure(Variant("torchrun warm", Launcher.TORCHRUN), reps, root)
        if "cold" in chosen:
            changes["cold"], _ = measure(Variant("torchrun cold", Launcher.TORCHRUN, warm=False), reps, root)
        if "torch elastic" in chosen:
            changes["torch elastic"] = measure_torch_elastic(reps, root)
        if "in-process" in chosen:
            changes["in-process"], _ = measure(Variant("in-process", Launcher.ELASTIC), reps, root)
        if "lightning" in chosen:
            lightning, kills = measure(Variant("lightning unchanged", Launcher.TORCHRUN,
                                               module="malletrain.worker.examples.lightning_plain"), reps, root)
    for name, got in changes.items():
        if not got:
            print(f"{name}: no change measured")
            continue
        pauses = [c.pause for c in got]
        down, up = pauses[0::2], pauses[1::2] or [float("nan")]
        since = statistics.median(c.since for c in got)
        print(f"{name}: {len(got)} changes, pause median {statistics.median(pauses):.2f} s, max {max(pauses):.2f} s; "
              f"shrink median {statistics.median(down):.2f} s, grow median {statistics.median(up):.2f} s; "
              f"from the recall or return, median {since:.2f} s")
    if (line := node_return_line(changes)) is not None:
        print(line, flush=True)
    if set(chosen) != set(LAUNCHERS):
        print(f"load after: {load()}")
        return
    med = {name: statistics.median(c.pause for c in got) if got else float("nan") for name, got in changes.items()}
    print(f"ratios: warm / cold {med['warm'] / med['cold']:.2f}, warm / torch elastic "
          f"{med['warm'] / med['torch elastic']:.2f}, warm / in-process {med['warm'] / med['in-process']:.1f}; "
          f"load after: {load()}")
    last_line(f"launchers: torchrun script warm {med['warm']:.2f} s, cold {med['cold']:.2f} s, torch elastic "
          f"{med['torch elastic']:.2f} s, in-process {med['in-process']:.2f} s (medians); "
          f"Lightning unchanged: {kills} SIGKILLs in {len(lightning)} changes")


if __name__ == "__main__":
    main()
