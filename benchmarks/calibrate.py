"""Measure what the simulator charges, on the real system, and write the calibration file.

    python benchmarks/calibrate.py [--rounds 3] [--out simulator/calibration.json]
    python benchmarks/calibrate.py --short   # the quick mode CI runs (slurm marker): 1 round, written to a temp file

Runs the daemon (torch runtime, warm workers, ``[scavenger] kind = "slurm"``) on a 2-node
Slurm test cluster with one job of the example trainer (linear model, ``--step-sleep
0.05``), and per round: a prod job takes one node and ends (a rescale down and up), then a
prod job takes both (the job is suspended) and ends (a restart from its checkpoint).
Measured (medians over every occurrence):

``pilot_start_s``      node idle -> pilot usable: the daemon's ``sbatch`` of a pilot to its
                       agent's hello (``pilot_submitted`` -> ``agent_up`` in the event log);
``cold_start_s``       a fresh worker on a fresh node at the job's start from zero: agent
                       hello -> the first step of the worker there (process, framework
                       import -- overlapped by the warm worker --, rendezvous, first step);
``join_s``             the same for the node a running job grows onto (its other nodes train
                       on meanwhile; the simulator adds the node's work only after this);
``restart_s``          the same for a suspended job coming back: agent hello -> first step,
                       its state loaded from the checkpoint rank 0 left on SIGTERM;
``rescale_pause_s``    what the workers report as their pause at an ``up`` or ``down`` switch;
``commit_interval_s``  time between two commits of the trainer (it commits every step, so a
                       preemption loses at most this much work; a SIGTERMed rank 0 also
                       checkpoints its last commit);
``warm_start_s``       after the rounds the job is cancelled, its nodes stay held and their agents
                       prepare warm workers (``WARM_SETTLE_S``); a second job then starts there:
                       worker started (the agent's report) -> its first step.

Writes ``{"schema": 1, "values": {NAME: {"value", "unit", "how", "when", "command"}}}``
(the format ``simulator/calibration.py`` reads) and prints each value. Needs Slurm.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_slurm import StepTail, wait_for  # noqa: E402  (a sibling script)
from harness import add_short, last_line  # noqa: E402

from malletrain.worker.examples.tracelog import steps, traced  # noqa: E402
from tests.clusters.slurm_cluster import ClusterUnavailable, SlurmCluster  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "simulator" / "calibration.json"
STEP_SLEEP_S = 0.05
WARM_SETTLE_S = 30.0
"""Seconds the held nodes are left alone before the warm-start job: the agents' warm workers import
torch meanwhile (about 2 s on an idle 2-core machine, several times that under load)."""


def _times(d, kind: str, since: int = 0) -> list[tuple[float, str]]:  # type: ignore[no-untyped-def]
    out = []
    for e in d.store.events(kind, since_id=since):
        for node in e.get("nodes") or [e.get("node")]:
            out.append((float(e["time"]), str(node)))
    return out


def pilot_starts(d) -> list[float]:  # type: ignore[no-untyped-def]
    """``pilot_submitted`` -> the next ``agent_up`` on the same node, for every pilot."""
    ups = _times(d, "agent_up")
    out = []
    for t, node in _times(d, "pilot_submitted"):
        later = [u for u, n in ups if n == node and u >= t]
        if later:
            out.append(min(later) - t)
    return out


def started_to_first_step(d, jid: str, node: str) -> float | None:  # type: ignore[no-untyped-def]
    """``jid``'s ``worker_started`` on ``node`` -> that worker's first step."""
    for e in d.store.events("worker_started"):
        if e.get("job") == jid and e.get("node") == node and e.get("worker"):
            first = [float(s["t"]) for s in steps(d.state_dir / "logs" / f"{e['worker']}.log")]
            return first[0] - float(e["time"]) if first else None
    return None


def hello_to_first_step(d, jid: str, node: str, after: float) -> float | None:  # type: ignore[no-untyped-def]
    """The first ``agent_up`` of ``node`` after ``after`` -> the first step of the worker there."""
    ups = [t for t, n in _times(d, "agent_up") if n == node and t > after]
    wid = d.runs[jid].workers.get(node)
    if not ups or not wid:
        return None
    log = d.state_dir / "logs" / f"{wid}.log"
    first = [float(s["t"]) for s in steps(log) if float(s["t"]) > ups[0]]
    return first[0] - ups[0] if first else None


def measure(cluster: SlurmCluster, tmp: Path, rounds: int) -> dict[str, list[float]]:
    from malletrain.daemon.config import DaemonConfig, ScavengerConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.jobspec import JobSpec

    nodes = list(cluster.nodes)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["OMP_NUM_THREADS"] = "1"  # the pilots' environment, so their warm workers', is the job's
    cfg = DaemonConfig(state_dir=str(tmp / "daemon"), runtime="torch", agent_heartbeat=0.2, agent_dead_after=10.0,
                       loop_interval=0.05, scavenger=ScavengerConfig(
                           kind="slurm", partition="preemptable", job_name="mt-calibrate", poll_interval=0.3,
                           submit_rate=50.0))
    train = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000000",
             "--trace", "--step-sleep", f"{STEP_SLEEP_S:g}")
    d = Daemon(cfg)
    steps_after = StepTail().first_after  # each worker log read on from where the last look stopped
    got: dict[str, list[float]] = {"cold_start_s": [], "restart_s": [], "rescale_pause_s": [], "commit_interval_s": [],
                                   "join_s": [], "warm_start_s": []}
    try:
        # one worker a node (the test cluster's nodes declare 4 GPUs): the calibration's unit is the node
        jid = d.store.submit(JobSpec("cal", train, 1, len(nodes), False, {1: 100.0, 2: 200.0},
                                     env={"OMP_NUM_THREADS": "1"}, workers_per_node=1))

        def tick() -> None:
            d.step()
            d.monitor.drain(timeout_ms=20)

        def logs() -> list[Path]:
            return sorted((d.state_dir / "logs").glob("j*.log"))

        t_start = time.time()
        wait_for("job on every node", lambda: len(d.runs[jid].members) == len(nodes)
                 and steps_after(logs(), len(nodes), 0.0) is not None, timeout=240, tick=tick)
        for node in nodes:
            v = hello_to_first_step(d, jid, node, t_start)
            if v is not None:
                got["cold_start_s"].append(v)

        def prod(on: list[str], sleep: str = "600") -> str:
            return cluster.run(["sbatch", "--parsable", "-p", "prod", f"-N{len(on)}", "-w", ",".join(on),
                                "-o", "/dev/null", "--wrap", f"sleep {sleep}"]).stdout.strip().split(";")[0]

        for r in range(rounds):
            t0 = time.time()
            p = prod(nodes[-1:])
            wait_for("rescaled down", lambda: steps_after(logs(), len(nodes) - 1, t0) is not None, 120, tick)
            t1 = time.time()
            cluster.run(["scancel", p])
            wait_for("rescaled up", lambda: steps_after(logs(), len(nodes), t1) is not None, 120, tick)
            grown = hello_to_first_step(d, jid, nodes[-1], t1)  # a fresh worker joining a running job
            got["join_s"].append(grown) if grown is not None else None
            t2 = time.time()
            p = prod(nodes)
            wait_for("job suspended", lambda: not d.runs[jid].members, 120, tick)
            t3 = time.time()
            cluster.run(["scancel", p])
            wait_for("job back", lambda: steps_after(logs(), len(nodes), t3) is not None, 180, tick)
            back = [v for n in nodes if (v := hello_to_first_step(d, jid, n, t3)) is not None]
            got["restart_s"].append(min(back)) if back else None
            print(f"round {r + 1}: down/up {t2 - t0:.1f} s, suspended and back {time.time() - t2:.1f} s; "
                  f"restart (hello -> first step) {min(back) if back else float('nan'):.2f} s", flush=True)
        d.store.request_cancel(jid)  # the nodes stay held; their agents prepare warm workers again
        wait_for("job cancelled", lambda: d.store.require(jid).state.terminal and not (jid in d.runs and d.runs[jid].members), 120, tick)
        settle = time.monotonic() + WARM_SETTLE_S
        wait_for("warm workers settled", lambda: time.monotonic() > settle, WARM_SETTLE_S + 10, tick)
        warm = d.store.submit(JobSpec("cal-warm", train, len(nodes), len(nodes), False, {1: 100.0, 2: 200.0},
                                      env={"OMP_NUM_THREADS": "1"}, workers_per_node=1))
        wait_for("warm job on every node", lambda: len(d.runs[warm].members) == len(nodes) and all(
            started_to_first_step(d, warm, n) is not None for n in nodes), 120, tick)
        got["warm_start_s"] = [v for n in nodes if (v := started_to_first_step(d, warm, n)) is not None]
        print(f"warm start (worker started -> first step): {', '.join(f'{v:.2f} s' for v in got['warm_start_s'])}",
              flush=True)
        for log in logs():
            for ev in traced(log, "rescale"):
                if ev.get("kind") in ("up", "down"):
                    got["rescale_pause_s"].append(float(ev["finished"]) - float(ev["started"]))
            ts = [float(s["t"]) for s in steps(log)]
            got["commit_interval_s"] += [b - a for a, b in zip(ts, ts[1:]) if b - a < 1.0]
        got["pilot_start_s"] = pilot_starts(d)
    finally:
        d.close()
        cluster.cancel_all()
    return got


HOW = {
    "pilot_start_s": "node idle -> pilot usable on the Slurm test cluster: the daemon's sbatch of a pilot to its "
                     "agent's authenticated hello (median over every pilot of the run)",
    "cold_start_s": "a fresh worker on a fresh node, a job starting from zero: agent hello -> the worker's first "
                    "step (warm worker: torch imported while the agent says hello; rendezvous; first step), "
                    "example trainer",
    "join_s": "a running job grows onto a returning node: agent hello -> the first step of the new worker there "
              "(the job's other nodes train on meanwhile), example trainer",
    "restart_s": "a suspended job back on its nodes: agent hello -> first step, state from the checkpoint its "
                 "rank 0 left on SIGTERM, example trainer",
    "rescale_pause_s": "the pause the workers report at a rescale (up and down) of a running job, 1 <-> 2 nodes",
    "commit_interval_s": "time between two commits of the example trainer (it commits every step; a SIGTERMed "
                         "rank 0 also checkpoints its last commit), so the work a preemption loses",
    "warm_start_s": "a job's start on held nodes whose warm workers are ready (imported): worker started -> its "
                    "first step, a second job after the first was cancelled and the nodes left alone "
                    f"{WARM_SETTLE_S:g} s; a restart adds restart_s - cold_start_s (the checkpoint's load) in the "
                    "simulator",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help=f"the file written (default {DEFAULT_OUT.name} under "
                    "simulator/; with --short a temporary file, so a quick run leaves the checkout as it was)")
    add_short(ap, "1 round, written to a temporary file unless --out names one")
    args = ap.parse_args(argv)
    if args.short:
        args.rounds = 1
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="mt-calibrate-out-")) / "calibration.json" if args.short else DEFAULT_OUT
    try:
        cluster = SlurmCluster(2).start()
    except ClusterUnavailable as exc:
        print(f"calibrate: no Slurm cluster: {exc}", file=sys.stderr)
        return 2
    try:
        with tempfile.TemporaryDirectory(prefix="mt-calibrate-") as tmp:
            got = measure(cluster, Path(tmp), args.rounds)
    finally:
        cluster.stop()
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    command = f"python benchmarks/calibrate.py --rounds {args.rounds}"
    values = {}
    for name, how in HOW.items():
        if not got.get(name):
            print(f"calibrate: {name}: nothing measured; not written", file=sys.stderr)
            continue
        med = statistics.median(got[name])
        values[name] = {"value": round(med, 3), "unit": "s", "how": f"{how}; n = {len(got[name])}",
                        "when": today, "command": command}
        print(f"{name}: {med:.3f} s (median of {len(got[name])}, min {min(got[name]):.3f}, "
              f"max {max(got[name]):.3f})")
    if len(values) < len(HOW):
        return 1
    args.out.write_text(json.dumps({"schema": 1, "values": values}, indent=2) + "\n")
    last_line(f"calibration: {len(values)} values ({args.rounds} round(s)) written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
