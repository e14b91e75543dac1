"""Main-queue impact of the PBS pilots, on a real OpenPBS server started on this machine.

    python benchmarks/bench_pbs.py [--runs 10] [--kill-delay 2] [--prod-nodes 2] [--daemon-runs 3] [--short]
    python benchmarks/bench_pbs.py --short   # the quick mode CI runs (pbs marker): 1 paired run, 1 daemon run

Needs root and OpenPBS (built and installed by ``python -m tests.clusters.pbs_cluster install``;
no PBS may run already). Four vnodes, ``preempt_order`` R (``--preempt-order D`` to compare).

Per run, the same production job (queue ``prod``, ``--prod-nodes`` vnodes) is submitted twice:
once on idle vnodes (the baseline: a run without the daemon), once on vnodes our pilots hold
(real node agents connected to an agent hub, which exit within a second of SIGTERM). A job's
start is the time its command writes on its vnode; its delay is start minus ``qsub`` time.
The extra delay is held minus idle; its floor is the preemptable queue's ``kill_delay`` (PBS
runs the prod job only once the pilots' processes are gone or ``kill_delay`` passed).

Then the daemon (``[scavenger] kind = "pbs"``, polling every 0.3 s) runs a real torch
training job (the example trainer, linear model) on every held vnode, and per run a prod job
takes ``--prod-nodes`` of them for a few seconds:

* preemption -> training resumed: prod ``qsub`` to the first step a surviving worker trains
  at the smaller world size (its step counter goes on from its last commit);
* node back -> pilot running there: the prod job's end (its command writes the time as it
  exits) to the daemon's ``pilot_started`` for its vnodes (under R the requeued pilots rerun
  by themselves);
* node back -> first step on it: the prod job's end to the first step at the full size.

The last lines read ``main-queue delay (paired with a run without the daemon): median X s,
p95 Y s, max Z s``, ``preemption -> training resumed: ...`` and ``node back -> first step on it: ...``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from harness import add_short, last_line
from malletrain.worker.examples.tracelog import steps
from scavenger.base import AgentUp, PilotEvent, PilotRequest, PilotStarted
from scavenger.hub import AgentHub
from scavenger.pbs import PbsBackend, PbsConfig
sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository: its test clusters (tests/clusters)

from tests.clusters.pbs_cluster import ClusterUnavailable, PbsCluster, PreemptOrder  # noqa: E402


def wait_for(what: str, pred: Callable[[], bool], timeout: float = 60.0, tick: Callable[[], None] | None = None,
             ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not within {timeout:g} s")


def stamp(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return float(text.split()[0]) if text else None


def prod_start_delay(cluster: PbsCluster, vnodes: list[str], out: Path, tick=None) -> float:
    """Submit the prod job; its delay until its command ran on its vnode."""
    out.unlink(missing_ok=True)
    t0 = time.time()
    cluster.qsub("prod", tuple(vnodes), ["/bin/sh", "-c", f"date +%s.%N > {out}"])
    wait_for("prod job start", lambda: stamp(out) is not None, tick=tick)
    return stamp(out) - t0  # type: ignore[operator]


def one_run(cluster: PbsCluster, tmp: Path, run: int, prod_nodes: list[str]) -> tuple[float, float]:
    """(delay on idle vnodes, delay on held vnodes)."""
    wait_for("vnodes free", lambda: cluster.free_vnodes() == set(cluster.vnodes))
    idle_delay = prod_start_delay(cluster, prod_nodes, cluster.jobdir / f"prod-idle-{run}")
    wait_for("vnodes free", lambda: cluster.free_vnodes() == set(cluster.vnodes))
    hub = AgentHub(dead_after_s=30.0)
    cfg = PbsConfig(daemon_address=hub.address, queue="preemptable", job_name=f"mt-bench-{run}", env=cluster.env,
                    submit_rate=50.0, submit_burst=50, output="/dev/null", agent_args=("--key-file", hub.key_file))
    backend = PbsBackend(cfg)
    events: list[PilotEvent] = []
    agents: set[str] = set()

    def tick() -> None:
        for ev in hub.poll(20):
            if isinstance(ev, AgentUp):
                agents.add(ev.node)
        events.extend(backend.poll())

    try:
        pilots = {backend.submit(PilotRequest((n,))): n for n in sorted(backend.discover().idle)}
        started = lambda: set(pilots) <= {e.pilot for e in events if isinstance(e, PilotStarted)}  # noqa: E731
        wait_for("pilots running, agents up", lambda: started() and set(pilots.values()) <= agents, tick=tick)
        held_delay = prod_start_delay(cluster, prod_nodes, cluster.jobdir / f"prod-held-{run}", tick=tick)
    finally:
        backend.close()
        cluster.delete_all()
        hub.close()
    return idle_delay, held_delay


def steps_after(logs: list[Path], world: int, after: float) -> float | None:
    """The time of the first traced step at ``world`` after ``after`` in any of ``logs``."""
    best = None
    for log in logs:
        later = [s["t"] for s in steps(log) if s.get("world") == world and s["t"] > after]
        if later:
            best = later[0] if best is None else min(best, later[0])
    return best


def daemon_runs(cluster: PbsCluster, tmp: Path, runs: int,
                prod_nodes: list[str]) -> list[tuple[float, float, float]]:
    """(preemption -> training resumed, node back -> pilot running there, node back -> first step on it)
    per run."""
    from malletrain.daemon.config import DaemonConfig, ScavengerConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.jobspec import JobSpec

    n_all = len(cluster.vnodes)
    os.environ["PATH"] = cluster.env["PATH"]
    cfg = DaemonConfig(state_dir=str(tmp / "daemon"), runtime="torch", agent_heartbeat=0.2, agent_dead_after=10.0,
                       loop_interval=0.05, scavenger=ScavengerConfig(
                           kind="pbs", queue="preemptable", job_name="mt-bench-daemon", poll_interval=0.3,
                           submit_rate=50.0))
    train = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
             "--trace", "--step-sleep", "0.05")
    d = Daemon(cfg)
    out = []
    try:
        # one worker a vnode (the test cluster's vnodes declare 4 GPUs): the figures are per vnode, as before
        jid = d.store.submit(JobSpec("lin", train, 1, n_all, False, {n: 100.0 * n for n in range(1, n_all + 1)},
                                     env={"OMP_NUM_THREADS": "1"}, workers_per_node=1))

        def tick() -> None:
            d.step()
            d.monitor.drain(timeout_ms=20)

        def logs() -> list[Path]:
            run = d.runs[jid]
            return [d.state_dir / "logs" / f"{w}.log" for w in run.workers.values()]

        wait_for("job on every vnode", lambda: len(d.runs[jid].members) == n_all
                 and steps_after(logs(), n_all, 0.0) is not None, timeout=240, tick=tick)
        small = n_all - len(prod_nodes)
        for run in range(runs):
            end = cluster.jobdir / f"prod-daemon-end-{run}"
            t0 = time.time()
            cluster.qsub("prod", tuple(prod_nodes), ["/bin/sh", "-c", f"sleep 8; date +%s.%N > {end}"])
            wait_for("training resumed", lambda: steps_after(logs(), small, t0) is not None, timeout=120, tick=tick)
            resumed_s = steps_after(logs(), small, t0) - t0  # type: ignore[operator]
            wait_for("prod job ended", lambda: stamp(end) is not None, timeout=120, tick=tick)
            t1 = stamp(end)
            assert t1 is not None
            wait_for("first step on the nodes back", lambda: steps_after(logs(), n_all, t1) is not None,
                     timeout=180, tick=tick)
            back_s = steps_after(logs(), n_all, t1) - t1  # type: ignore[operator]
            held = [float(e["time"]) for e in d.store.events("pilot_started")
                    if float(e["time"]) > t1 and set(e["nodes"]) & set(prod_nodes)]
            held_s = max(held[: len(prod_nodes)]) - t1 if len(held) >= len(prod_nodes) else float("nan")
            out.append((resumed_s, held_s, back_s))
            print(f"daemon run {run + 1}: preemption -> training resumed on {small} vnodes {resumed_s:.2f} s; "
                  f"node back -> pilot running there {held_s:.2f} s, -> first step on it {back_s:.2f} s", flush=True)
    finally:
        d.close()
        cluster.delete_all()
    return out


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--kill-delay", type=int, default=2, help="the preemptable queue's kill_delay (s)")
    ap.add_argument("--preempt-order", choices=("R", "D"), default="R")
    ap.add_argument("--prod-nodes", type=int, default=2)
    ap.add_argument("--daemon-runs", type=int, default=3, help="runs of the daemon figures (0: skip them)")
    add_short(ap, "1 paired run and 1 daemon run (--runs 1 --daemon-runs 1)")
    args = ap.parse_args(argv)
    if args.short:
        args.runs, args.daemon_runs = 1, 1
    try:
        cluster = PbsCluster(4, args.kill_delay, PreemptOrder(args.preempt_order)).start()
    except ClusterUnavailable as exc:
        print(f"bench_pbs: no PBS cluster: {exc}", file=sys.stderr)
        return 2
    extra, idle_d, held_d = [], [], []
    try:
        prod_nodes = list(cluster.vnodes[: args.prod_nodes])
        with tempfile.TemporaryDirectory(prefix="mt-bench-pbs-") as tmp:
            for run in range(args.runs):
                i, h = one_run(cluster, Path(tmp), run, prod_nodes)
                idle_d.append(i), held_d.append(h), extra.append(h - i)
                print(f"run {run + 1}: prod start on idle vnodes {i:.2f} s, on held vnodes {h:.2f} s, "
                      f"extra {h - i:+.2f} s", flush=True)
            figures = daemon_runs(cluster, Path(tmp), args.daemon_runs, prod_nodes) if args.daemon_runs else []
    finally:
        cluster.stop()
    med = statistics.median
    lines = [f"kill_delay {args.kill_delay} s, preempt_order {args.preempt_order}, {len(extra)} paired runs "
             f"({args.prod_nodes} of 4 vnodes)",
             f"prod start delay on idle vnodes: median {med(idle_d):.2f} s, max {max(idle_d):.2f} s",
             f"prod start delay on held vnodes: median {med(held_d):.2f} s, max {max(held_d):.2f} s",
             f"main-queue delay (paired with a run without the daemon): median {med(extra):.2f} s, "
             f"p95 {p95(extra):.2f} s, max {max(extra):.2f} s"]
    for i, name in enumerate(("preemption -> training resumed", "node back -> pilot running there",
                              "node back -> first step on it")):
        col = [f[i] for f in figures]
        if col:
            lines.append(f"{name}: median {med(col):.2f} s, max {max(col):.2f} s over {len(col)} runs")
    for line in lines[:-1]:
        print(line)
    last_line(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
