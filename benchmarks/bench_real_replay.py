"""A real replay that checks the simulator: a window of a real node-state log on the Slurm test cluster.

    python benchmarks/bench_real_replay.py --trace FILE --start S --duration D --nodes N --compress X --jobs K
    python benchmarks/bench_real_replay.py --trace FILE --start S --short   # the quick mode CI runs (slurm marker)

The window ``[S, S + D)`` seconds after the log's first timestamp (``D`` in the log's
time) is cut from the log; ``N`` of its nodes (``--pick``: drawn by idle time, or those with
the most state changes) are mapped onto the test cluster's ``node1..nodeN``, and each busy period of
theirs becomes a production job (``-p prod -w NODE``, ``sleep`` for its length), the
whole window ``X`` times faster than the log. Nodes busy when the window opens are held
by a placeholder prod job until it opens, so both runs start alike.

The window is replayed twice, paired:

1. control: no daemon; each prod job's start delay (``sbatch`` to its script writing on
   its node) is recorded;
2. with the daemon (``[scavenger] kind = "slurm"``, torch runtime, warm workers) and
   ``K`` small real training jobs (the example trainer, linear model); it is given until
   its jobs train on the idle nodes (at most ``--warmup`` s) before the window opens.

Measured in replay seconds over the window: each prod job's extra start delay (its delay
with the daemon minus the control's), the idle node-seconds (the log's, compressed), the
node-seconds the daemon's pilots held (``pilot_started`` to ``pilot_ended``) and the
node-seconds trained, from the workers' own step reports: the time between a worker's
consecutive steps, where the gap is at most ``TRAIN_GAP_S`` (a pause longer than that
is not training). Then the same window, jobs and calibration are replayed in the
simulator (:func:`simulator_predicts`), whose productive node-seconds are the
prediction. Last line:

``real replay: prod delay median A s, p95 B s, max C s; idle I node-s, held H, trained T (T/I = R); simulator predicts P (error E%)``

Needs Slurm (``python -m tests.clusters.slurm_cluster install``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from harness import add_short, last_line
from malletrain.worker.examples.tracelog import steps
sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository: its test clusters (tests/clusters)

from tests.clusters.slurm_cluster import ClusterUnavailable, SlurmCluster  # noqa: E402
from traces import IdleTimeline, read

TRAIN_GAP_S = 1.0
"""Consecutive steps of a worker at most this far apart count as training in between."""
STEP_SLEEP_S = 0.05
"""The example trainer's extra time per step (keeps its CPU use small on a shared machine)."""
DEFAULT_CALIBRATION = Path(__file__).resolve().parent.parent / "simulator" / "calibration.json"


@dataclass(frozen=True)
class ProdJob:
    """One busy period of one node: submitted ``at`` seconds into the replay, ``length`` s long."""

    index: int
    node: str
    at: float
    length: float


def pick_nodes(tl: IdleTimeline, n: int, how: str = "random", seed: int = 0) -> list[str]:
    """``n`` nodes of ``tl``: ``random`` draws among the nodes idle at some time in the window, each
    as likely as its idle time (so the sample looks like the idle node-seconds a scavenger gets;
    seeded); ``changes`` takes the nodes with the most state changes (the hardest case; ties by name)."""
    changes = np.bincount(tl.node_ids, minlength=len(tl.nodes))
    if how == "changes":
        ranked = sorted(range(len(tl.nodes)), key=lambda i: (-int(changes[i]), tl.nodes[i]))[:n]
        if len(ranked) < n or any(changes[i] == 0 for i in ranked):
            raise ValueError(f"{tl.source}: fewer than {n} nodes change state in the window")
        return [tl.nodes[i] for i in ranked]
    if how != "random":
        raise ValueError(f"--pick {how!r}: choose random or changes")
    idle = np.zeros(len(tl.nodes))
    mask = tl.initial_mask()
    last = tl.start
    for t, i, up in zip(tl.times.tolist(), tl.node_ids.tolist(), tl.idle.tolist()):
        idle[mask] += t - last  # every idle node accrues until this change
        mask[i], last = up, t
    idle[mask] += tl.end - last
    cands = np.flatnonzero(idle > 0)
    if len(cands) < n:
        raise ValueError(f"{tl.source}: fewer than {n} nodes are idle in the window")
    rng = np.random.default_rng(seed)
    chosen = rng.choice(cands, size=n, replace=False, p=idle[cands] / idle[cands].sum())
    return [tl.nodes[i] for i in sorted(chosen.tolist())]


def compressed(tl: IdleTimeline, picked: list[str], names: tuple[str, ...], compress: float) -> IdleTimeline:
    """``picked`` of ``tl`` renamed ``names``, re-based to 0 and ``compress`` times faster."""
    index = {name: k for k, name in enumerate(picked)}
    sel = np.array([tl.nodes[i] in index for i in tl.node_ids.tolist()], dtype=bool)
    ids = np.array([index[tl.nodes[i]] for i in tl.node_ids[sel].tolist()], dtype=np.int64)
    return IdleTimeline.from_arrays(
        source=f"{tl.source} [{tl.start:.0f}, {tl.end:.0f}] {len(picked)} nodes / {compress:g}",
        format=tl.format, nodes=names, start=0.0, end=(tl.end - tl.start) / compress,
        initial_idle=np.array([p in tl.initial_idle for p in picked], dtype=bool),
        times=(tl.times[sel] - tl.start) / compress, node_ids=ids, idle=tl.idle[sel],
    )


def prod_jobs(tl: IdleTimeline) -> list[ProdJob]:
    """Each busy period of each node of ``tl`` as a prod job (a period open at the end runs to it)."""
    busy_since: dict[str, float] = {n: tl.start for n in tl.nodes if n not in tl.initial_idle}
    periods: list[tuple[float, str, float]] = []
    for ev in tl.events():
        if ev.idle and ev.node in busy_since:
            a = busy_since.pop(ev.node)
            periods.append((a, ev.node, ev.time - a))
        elif not ev.idle:
            busy_since[ev.node] = ev.time
    periods += [(a, n, tl.end - a) for n, a in busy_since.items()]
    periods.sort()
    return [ProdJob(k, n, a, length) for k, (a, n, length) in enumerate(periods)]


def wait_for(what: str, pred: Callable[[], bool], timeout: float, tick: Callable[[], None] | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not within {timeout:g} s")


def replay(cluster: SlurmCluster, jobs: list[ProdJob], span: float, initial_busy: list[str], out: Path,
           tick: Callable[[], None] | None = None, before: Callable[[], None] | None = None) -> tuple[float, dict[int, float]]:
    """Run the prod jobs on their schedule; (the window's start time, job index -> start delay)."""
    out.mkdir(parents=True, exist_ok=True)
    hold = []
    for node in initial_busy:  # busy when the window opens: held by a placeholder until then
        hold.append(cluster.run(["sbatch", "--parsable", "-p", "prod", "-w", node, "-N1", "-o", "/dev/null",
                                 "--wrap", "sleep 100000"]).stdout.strip().split(";")[0])
    if before is not None:
        before()
    t0 = time.time()
    submitted: dict[int, float] = {}
    pending = list(jobs)
    while time.time() - t0 < span:
        now = time.time() - t0
        while pending and pending[0].at <= now:
            job = pending.pop(0)
            mark = out / f"{job.index}"
            submitted[job.index] = time.time()
            cluster.run(["sbatch", "--parsable", "-p", "prod", "-w", job.node, "-N1", "-o", "/dev/null",
                         "--wrap", f"date +%s.%N > {mark}; sleep {max(job.length, 0.1):.2f}"])
            if job.at == 0.0 and job.node in initial_busy and hold:
                cluster.run(["scancel", hold[initial_busy.index(job.node)]], check=False)
        if tick is not None:
            tick()
        time.sleep(0.05)
    cluster.run(["scancel", *hold], check=False) if hold else None
    delays = {}
    for k, sent in submitted.items():
        mark = out / f"{k}"
        text = mark.read_text().strip() if mark.exists() else ""
        delays[k] = (float(text.split()[0]) if text else time.time()) - sent
    return t0, delays


def trained_seconds(logs: list[Path], lo: float, hi: float) -> float:
    """Node-seconds trained in ``[lo, hi]``: gaps of at most TRAIN_GAP_S between a worker's steps."""
    total = 0.0
    for log in logs:
        ts = sorted(float(s["t"]) for s in steps(log))
        for a, b in zip(ts, ts[1:]):
            if b - a <= TRAIN_GAP_S:
                total += max(0.0, min(b, hi) - max(a, lo))
    return total


def held_seconds(events: list[dict], lo: float, hi: float) -> float:
    """Node-seconds the daemon's pilots were running in ``[lo, hi]`` (from its event log)."""
    since: dict[str, float] = {}
    total = 0.0
    for e in events:
        for node in e.get("nodes") or []:
            if e["kind"] == "pilot_started":
                since[node] = float(e["time"])
            elif e["kind"] == "pilot_ended" and node in since:
                a = since.pop(node)
                total += max(0.0, min(float(e["time"]), hi) - max(a, lo))
    return total + sum(max(0.0, hi - max(a, lo)) for a in since.values())


def load_calibration(path: Path | None) -> dict[str, float]:
    """``NAME -> value`` of a calibration file (``{"schema": 1, "values": {NAME: {"value": ...}}}``); {} if none."""
    if path is None or not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {k: float(v["value"]) for k, v in data.get("values", {}).items()}


def warmed(tl: IdleTimeline, warmup: float) -> IdleTimeline:
    """``tl`` with ``warmup`` seconds of its initial state before it (its events ``warmup`` s later)."""
    return IdleTimeline.from_arrays(
        source=f"{tl.source} + {warmup:g} s warm-up", format=tl.format, nodes=tl.nodes, start=tl.start,
        end=tl.end + warmup, initial_idle=np.array([n in tl.initial_idle for n in tl.nodes], dtype=bool),
        times=tl.times + warmup, node_ids=tl.node_ids, idle=tl.idle,
    )


def simulator_predicts(tl: IdleTimeline, n_jobs: int, max_nodes: int, calibration: Path | None,
                       tmp: Path, warmup: float = 0.0) -> float:
    """The simulator's trained node-seconds for the replayed window and jobs: the one place this
    bench calls the simulator (its public API).

    ``warmup`` > 0 replays, as the real run does, that long of the window's initial state first (the
    jobs start on the initially idle nodes before the window opens) and counts the window only: the
    trained node-seconds to the window's end less those to its start (the engine is deterministic).

    The jobs are the trainer's (linear throughput, never finishing in the window). A simulator
    that charges a calibration file (``simulator.calibration``, ``SimConfig.calibration``) is given
    ``calibration`` and reports ``trained_node_seconds``; an older one gets the file's rescale pause
    and start cost as the jobs' own costs and reports productive node-seconds (no pilot latency)."""
    import simulator
    from simulator import SimConfig, simulate

    values = load_calibration(calibration)
    charged = hasattr(simulator, "Calibration") and calibration is not None and calibration.exists()
    pause = values.get("rescale_pause_s", 0.0)
    costs = {} if charged else {"up_cost_s": values.get("cold_start_s", pause), "down_cost_s": pause}
    jobs = [{"name": f"lin{k}", "scaling": {str(n): 100.0 * n for n in range(1, max_nodes + 1)},
             "samples": 1e12, "min_nodes": 1, "max_nodes": max_nodes, "arrival_s": 0.0, **costs}
            for k in range(n_jobs)]
    path = tmp / "jobs.json"
    path.write_text(json.dumps({"jobs": jobs}))
    if charged:
        from simulator.calibration import load

        config = SimConfig(calibration=load(calibration))  # type: ignore[call-arg]
    else:
        config = SimConfig(charge_start=True)
    if warmup <= 0:
        return _trained(simulate(tl, policy="malletrain", workload=str(path), config=config).summary)
    longer = warmed(tl, warmup)
    ends = [replace(config, end=longer.start + warmup), replace(config, end=longer.end)]
    before, through = (_trained(simulate(longer, policy="malletrain", workload=str(path), config=c).summary)
                       for c in ends)
    return through - before


def _trained(summary: dict) -> float:
    return float(summary.get("trained_node_seconds", summary["productive_node_seconds"]))


def daemon_replay(cluster: SlurmCluster, tmp: Path, jobs: list[ProdJob], span: float, initial_busy: list[str],
                  k: int, warmup: float) -> tuple[float, dict[int, float], float, float]:
    """The replay with the daemon and ``k`` jobs: (window start, delays, held node-s, trained node-s)."""
    from malletrain.daemon.config import DaemonConfig, ScavengerConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.jobspec import JobSpec

    n = len(cluster.nodes)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["OMP_NUM_THREADS"] = "1"  # the pilots' environment, so their warm workers', is the jobs'
    cfg = DaemonConfig(state_dir=str(tmp / "daemon"), runtime="torch", agent_heartbeat=0.2, agent_dead_after=10.0,
                       loop_interval=0.05, scavenger=ScavengerConfig(
                           kind="slurm", partition="preemptable", job_name="mt-real-replay", poll_interval=0.3,
                           submit_rate=50.0))
    train = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000000",
             "--trace", "--step-sleep", f"{STEP_SLEEP_S:g}")
    d = Daemon(cfg)
    try:
        # one worker a node (the test cluster's nodes declare 4 GPUs): the replay's unit is the node
        ids = [d.store.submit(JobSpec(f"lin{j}", train, 1, n, False, {m: 100.0 * m for m in range(1, n + 1)},
                                      env={"OMP_NUM_THREADS": "1"}, workers_per_node=1)) for j in range(k)]

        def tick() -> None:
            d.step()
            d.monitor.drain(timeout_ms=10)

        def logs() -> list[Path]:
            return sorted((d.state_dir / "logs").glob(f"{ids[0][:1]}*.log"))

        def training() -> bool:
            members = sum(len(d.runs[j].members) for j in ids if j in d.runs)
            return members >= n - len(initial_busy) and any(steps(p) for p in logs())

        def warm_up() -> None:
            try:
                wait_for("daemon's jobs training", training, warmup, tick)
            except RuntimeError as exc:
                print(f"bench_real_replay: {exc}; the window opens anyway", file=sys.stderr)

        t0, delays = replay(cluster, jobs, span, initial_busy, tmp / "daemon-marks", tick, warm_up)
        events = [e for e in d.store.events() if e["kind"] in ("pilot_started", "pilot_ended")]
        return t0, delays, held_seconds(events, t0, t0 + span), trained_seconds(logs(), t0, t0 + span)
    finally:
        d.close()
        cluster.cancel_all()


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="a node-state log (any format traces.read knows)")
    ap.add_argument("--start", type=float, required=True, help="window start, s after the log's first timestamp")
    ap.add_argument("--duration", type=float, help="window length in the log's seconds (required but with --short)")
    ap.add_argument("--nodes", type=int, default=4, help="nodes of the log mapped onto the test cluster")
    ap.add_argument("--compress", type=float, default=20.0, help="replay this many times faster than the log")
    ap.add_argument("--jobs", type=int, default=2, help="small real training jobs under the daemon")
    ap.add_argument("--pick", choices=("random", "changes"), default="random",
                    help="which nodes of the log: random by idle time (default) or the most state changes")
    ap.add_argument("--seed", type=int, default=0, help="seed of --pick random")
    ap.add_argument("--warmup", type=float, default=120.0, help="at most this long for the daemon's jobs to train")
    ap.add_argument("--sim-warmup", type=float, default=120.0,
                    help="the simulator replays this long of the window's initial state first, as the real run's "
                         "warm-up (0: its jobs start when the window opens)")
    ap.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION,
                    help="the calibration file the simulator is given (default: simulator/calibration.json)")
    ap.add_argument("--simulate-only", action="store_true",
                    help="no Slurm: print the window's idle node-s and the simulator's prediction only")
    add_short(ap, "a 300 s window 10x faster on 2 nodes, 1 job, at most 60 s of warm-up on each side")
    args = ap.parse_args(argv)
    if args.short:
        args.duration, args.nodes, args.compress, args.jobs = 300.0, 2, 10.0, 1
        args.warmup, args.sim_warmup = 60.0, 60.0
    if args.duration is None:
        ap.error("--duration is required (or --short)")
    if args.nodes < 1 or args.jobs < 1 or args.duration <= 0 or args.compress <= 0 or args.sim_warmup < 0:
        ap.error("--nodes and --jobs must be >= 1, --duration and --compress > 0, --sim-warmup >= 0")
    full = read(args.trace)
    lo = full.start + args.start
    tl = full.window(lo, min(lo + args.duration, full.end))
    if args.simulate_only:
        picked = pick_nodes(tl, args.nodes, args.pick, args.seed)
        window = compressed(tl, picked, tuple(f"node{i + 1}" for i in range(args.nodes)), args.compress)
        with tempfile.TemporaryDirectory(prefix="mt-real-replay-") as tmpdir:
            predicted = simulator_predicts(window, args.jobs, args.nodes, args.calibration, Path(tmpdir),
                                           args.sim_warmup)
        last_line(f"window: nodes {', '.join(picked)}; idle {window.idle_node_seconds():.0f} node-s; "
                  f"simulator predicts {predicted:.0f} (calibration {args.calibration})")
        return 0
    try:
        cluster = SlurmCluster(args.nodes).start()
    except ClusterUnavailable as exc:
        print(f"bench_real_replay: no Slurm cluster: {exc}", file=sys.stderr)
        return 2
    try:
        picked = pick_nodes(tl, args.nodes, args.pick, args.seed)
        window = compressed(tl, picked, tuple(cluster.nodes), args.compress)
        jobs = prod_jobs(window)
        span = window.span
        busy0 = [nd for nd in window.nodes if nd not in window.initial_idle]
        idle = window.idle_node_seconds()
        print(f"window: {args.trace} [{args.start:g}, {args.start + args.duration:g}) s, nodes {', '.join(picked)} "
              f"-> {', '.join(cluster.nodes)}; {len(jobs)} prod jobs; replay {span:.0f} s; idle {idle:.0f} node-s",
              flush=True)
        with tempfile.TemporaryDirectory(prefix="mt-real-replay-") as tmpdir:
            tmp = Path(tmpdir)
            _, control = replay(cluster, jobs, span, busy0, tmp / "control-marks")
            cluster.cancel_all()
            if control:
                print(f"control: prod start delay median {statistics.median(control.values()):.2f} s", flush=True)
            _, with_d, held, trained = daemon_replay(cluster, tmp, jobs, span, busy0, args.jobs, args.warmup)
            predicted = simulator_predicts(window, args.jobs, args.nodes, args.calibration, tmp, args.sim_warmup)
    finally:
        cluster.stop()
    extra = [with_d[k] - control[k] for k in control if k in with_d]
    ratio = trained / idle if idle > 0 else 0.0
    error = (predicted - trained) / trained * 100 if trained > 0 else float("inf")
    delay = (f"prod delay median {statistics.median(extra):.2f} s, p95 {p95(extra):.2f} s, max {max(extra):.2f} s"
             if extra else "no prod job started in the window")
    last_line(f"real replay: {delay}; idle {idle:.0f} node-s, held {held:.0f}, trained {trained:.0f} "
              f"(T/I = {ratio:.2f}); simulator predicts {predicted:.0f} (error {error:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
