"""Training through repeated daemon ``kill -9``s, on the Slurm test cluster (or the local backend).

    python benchmarks/bench_restart_stall.py [--kills 5] [--nodes 4] [--down 1] [--backend slurm|local] [--short]
    python benchmarks/bench_restart_stall.py --backend local --short   # the quick mode CI runs: 1 kill, 2 nodes

A daemon subprocess (runtime ``torch``; ``[scavenger] kind = "slurm"`` on a Slurm cluster
started on this machine, or the local backend) runs two elastic jobs of the example
trainer (linear model, ``--trace``, a step every ~0.05 s) on half the nodes each. Then,
``--kills`` times, with both jobs training: the daemon is SIGKILLed, left down ``--down``
seconds and started again on the same state dir; the next kill waits until every worker
of both jobs runs in a generation the new daemon published. Printed from the workers'
own step traces and the daemon's store:

* ``daemon kill -9 -> training resumed``: per kill and job, the longest time any worker of
  the job went without a step, counted from the kill until 1 s after the republished
  generation's first step (training that never stops scores one step interval);
* ``committed steps lost``: steps a worker trained again after a kill (its step counter
  going back), summed over kills and workers;
* ``samples counted twice``: what the daemon counted beyond what the workers trained
  (its stored samples after a clean stop, minus the newest ``samples`` in the traces);
* workers started afresh during the kills (0: every worker was re-adopted).

Baseline (before the store reconnected and adopted workers kept their rank): 3 of 4 kills stopped training for 44-56 s (rank 0
blocked in torch's 30 s TCPStore connect, the others rolled back), and 1,523 steps were
trained twice after a double SIGTERM.
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
from pathlib import Path
from typing import Any, Callable

from harness import add_short, last_line

from malletrain.worker.examples.tracelog import steps
from malletrain.cli.procs import procs_mentioning

CONFIG = """
state_dir = "{state}"
runtime = "torch"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = {dead_after}
backend = "{backend}"
{backend_table}
"""

LOCAL = """[local]
nodes = {nodes}
trace = "none"
"""

SLURM = """[scavenger]
kind = "slurm"
partition = "preemptable"
job_name = "mt-restart-stall"
poll_interval = 0.3
submit_rate = 50.0
"""

JOB = """
name = "{name}"
command = ["{python}", "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
           "--trace", "--step-sleep", "0.05"]
min_nodes = 1
max_nodes = {size}
scaling = {{ 1 = 100.0, 2 = 199.0, 3 = 297.0, 4 = 394.0 }}
env = {{ OMP_NUM_THREADS = "1" }}
"""


def wait(pred: Callable[[], Any], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


class Bench:
    """The daemon subprocess, its two jobs and their workers' logs."""

    def __init__(self, tmp: Path, backend: str, nodes: int, dead_after: float, env: dict[str, str]) -> None:
        self.state = tmp / "state"
        self.cfg = tmp / "daemon.toml"
        table = LOCAL.format(nodes=nodes) if backend == "local" else SLURM
        self.cfg.write_text(CONFIG.format(state=self.state, dead_after=dead_after,
                                          backend="local" if backend == "local" else "slurm", backend_table=table))
        self.log = tmp / "daemon.log"
        self.env = env
        self.proc = self.start()
        wait(lambda: (self.state / "daemon.json").exists(), "daemon.json", 120)
        self.jobs: list[str] = []
        for name in ("a", "b"):
            spec = tmp / f"{name}.toml"
            spec.write_text(JOB.format(name=name, python=sys.executable, size=max(1, nodes // 2)))
            res = subprocess.run([sys.executable, "-m", "malletrain", "submit", str(spec), "--state-dir",
                                  str(self.state)], capture_output=True, text=True, timeout=60, env=env)
            if res.returncode:
                raise RuntimeError(f"submit {name}: {res.stderr}")
            self.jobs.append(res.stdout.strip())

    def start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "malletrain", "daemon", "--config", str(self.cfg)],
                                stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=self.env)

    def logs(self, job: str) -> list[Path]:
        return sorted((self.state / "logs").glob(f"{job}.*.log"))

    def training(self, job: str, since: float) -> bool:
        """Every worker log of ``job`` that traced a step has one after ``since`` (and there is one)."""
        live = [p for p in self.logs(job) if steps(p)]
        return bool(live) and all(steps(p)[-1]["t"] > since for p in live)

    def generation(self, job: str) -> int:
        return max((s["gen"] for p in self.logs(job) for s in steps(p)), default=0)


def longest_gap(logs: list[Path], start: float, end: float) -> float:
    """The longest time any of ``logs`` went without a step in ``[start, end]`` (``start`` counts as a step)."""
    worst = 0.0
    for p in logs:
        times = [start] + [s["t"] for s in steps(p) if start < s["t"] <= end]
        worst = max([worst] + [b - a for a, b in zip(times, times[1:])])
    return worst


def steps_lost(logs: list[Path], t_kill: float) -> int:
    """Steps trained again after the kill: the step counter going back, per worker."""
    lost = 0
    for p in logs:
        trace = steps(p)
        before = [s["step"] for s in trace if s["t"] <= t_kill]
        after = [s["step"] for s in trace if s["t"] > t_kill]
        if before and after:
            lost += max(0, max(before) + 1 - min(after))
    return lost


def run(args: argparse.Namespace, env: dict[str, str], nodes: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"resumed": [], "lost": [], "twice": [], "fresh": []}
    with tempfile.TemporaryDirectory(prefix="mt-restart-stall-") as tmp_s:
        tmp = Path(tmp_s)
        b = Bench(tmp, args.backend, nodes, args.dead_after, env)
        try:
            t0 = time.time()
            wait(lambda: all(b.training(j, t0 + 2.0) for j in b.jobs), "both jobs training", 300)
            for k in range(args.kills):
                now = time.time()
                wait(lambda: all(b.training(j, now) for j in b.jobs), "both jobs training", 120)
                logs = {j: b.logs(j) for j in b.jobs}
                gens = {j: b.generation(j) for j in b.jobs}
                b.proc.send_signal(signal.SIGKILL)
                b.proc.wait(timeout=10)
                t_kill = time.time()
                time.sleep(args.down)
                b.proc = b.start()
                wait(lambda: all(min((s["gen"] for s in steps(p)[-1:]), default=0) > gens[j]
                                 for j in b.jobs for p in logs[j]), "every worker in a republished generation", 180)
                t_new = max(min(s["t"] for s in steps(p) if s["gen"] > gens[j]) for j in b.jobs for p in logs[j])
                time.sleep(1.0)
                for j in b.jobs:
                    gap = longest_gap(logs[j], t_kill, t_new + 1.0)
                    lost = steps_lost(logs[j], t_kill)
                    out["resumed"].append(gap)
                    out["lost"].append(float(lost))
                    out["fresh"].append(float(len(b.logs(j)) - len(logs[j])))
                    print(f"kill {k + 1}, job {j}: longest step gap {gap:.2f} s, steps trained again {lost}, "
                          f"republished {t_new - t_kill:.2f} s after the kill", flush=True)
        finally:
            if b.proc.poll() is None:
                b.proc.send_signal(signal.SIGTERM)
                b.proc.wait(timeout=120)
        from malletrain.daemon.store import Store

        db = Store.open(b.state / "store.db")
        try:
            for j in b.jobs:
                trained = max((s["samples"] for p in b.logs(j) for s in steps(p)), default=0)
                counted = db.require(j).samples
                out["twice"].append(float(max(0, counted - trained)))
                print(f"job {j}: the workers trained {trained} samples, the daemon counted {counted}", flush=True)
        finally:
            db.close()
        time.sleep(1.0)
        for p in procs_mentioning(str(b.state)):
            p.kill()
    return out


def report(out: dict[str, list[float]], kills: int, backend: str) -> None:
    res = out["resumed"]
    print(f"\n{kills} daemon kill -9s, 2 jobs training ({backend} backend; timings on a shared, loaded machine):")
    print(f"workers started afresh: {int(sum(out['fresh']))}")
    print(f"daemon kill -9 -> training resumed: median {statistics.median(res):.2f} s, max {max(res):.2f} s "
          f"over {len(res)} (kill, job) pairs")
    last_line(f"committed steps lost: {int(sum(out['lost']))}; samples counted twice: {int(sum(out['twice']))}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--down", type=float, default=1.0, help="seconds the daemon stays down")
    ap.add_argument("--dead-after", type=float, default=10.0, help="agent_dead_after of the daemon")
    ap.add_argument("--backend", choices=("slurm", "local"), default="slurm")
    add_short(ap, "one kill, 2 nodes")
    args = ap.parse_args(argv)
    if args.short:
        args.kills, args.nodes = 1, 2
    env = dict(os.environ)
    if args.backend == "local":
        report(run(args, env, args.nodes), args.kills, "local")
        return 0
    from tests.clusters.slurm_cluster import ClusterUnavailable, SlurmCluster

    try:
        cluster = SlurmCluster(args.nodes).start()
    except ClusterUnavailable as exc:
        print(f"bench_restart_stall: no Slurm cluster: {exc}", file=sys.stderr)
        return 2
    try:
        env.update(cluster.env)
        out = run(args, env, len(cluster.nodes))
    finally:
        cluster.cancel_all()
        cluster.stop()
    report(out, args.kills, "slurm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
