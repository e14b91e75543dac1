"""Main-queue impact of the Slurm pilots, on a real Slurm cluster started on this machine.

    python benchmarks/bench_slurm.py [--runs 10] [--nodes 4] [--prod-nodes 2] [--short]
    python benchmarks/bench_slurm.py --short   # the quick mode CI runs (slurm marker): 1 run of each kind

Per run, the same production job (``-p prod``, ``--prod-nodes`` nodes) is submitted
twice: once on idle nodes (baseline), once on nodes our pilots hold (real node
agents, connected to an agent hub, which exit within a second of SIGTERM). A
job's start is the time its batch script writes on its node; its delay is
start minus ``sbatch`` time. Printed per run and as median / max:

* the extra delay: held minus idle, the promise to the centre (goal <= 2 s);
* preemption -> ``ended(preempted)`` reported by the backend (polling every 0.2 s).

Then the daemon (``[scavenger] kind = "slurm"``, polling every 0.3 s, warm workers unless
``--cold``) runs a real torch training job (the example trainer, linear model) on every held
node, and per run (``--daemon-runs``) a prod job takes ``--prod-nodes`` of them, runs at least
``--prod-hold`` seconds, then ends:

* the prod job's start delay, paired with run ``i``'s start on idle nodes without the daemon;
* preemption -> new plan: prod ``sbatch`` to the daemon's plan without those nodes;
* preemption -> training resumed: prod ``sbatch`` to the first step a surviving worker
  trains at the smaller world size (its step counter goes on from its last commit);
* node back -> job grown: prod job's end (``scancel``) to the first step at the full size;
* each stage of a node coming back, in seconds after the prod job's end (:data:`STAGES`).

The daemon's runs alternate (one daemon, same cluster, so both see the same load): the baseline
(``Scavenging.requeue_recalled`` off: a returning node gets its pilot when the daemon's next look
finds it idle), then the default (a pilot queued for each recalled node 5 s after its preemption,
which Slurm starts when the prod job ends), ``--daemon-runs`` of each; ``--no-baseline`` runs the
default only. The last lines read ``node back -> first step on it: median X s, p95 Y s`` (with the
baseline's figures and the ratio to them) and ``main-queue delay (paired with a run without the
daemon): median X s, p95 Y s, max Z s``.
Needs Slurm (installed with apt when missing, as root).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import add_short, last_line
from malletrain.worker.examples.tracelog import steps
from scavenger.base import AgentUp, EndReason, PilotEnded, PilotEvent, PilotRequest, PilotStarted
from scavenger.hub import AgentHub
from scavenger.slurm import SlurmBackend, SlurmConfig
sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository: its test clusters (tests/clusters)

from tests.clusters.slurm_cluster import ClusterUnavailable, SlurmCluster  # noqa: E402


def wait_for(what: str, pred, timeout: float = 60.0, tick=None, pause: float = 0.05) -> None:
    """Call ``tick`` and ``pred`` until ``pred()``, sleeping ``pause`` between (0: ``tick`` waits itself)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tick is not None:
            tick()
        if pred():
            return
        if pause:
            time.sleep(pause)
    raise RuntimeError(f"{what}: not within {timeout:g} s")


def prod_start_delay(cluster: SlurmCluster, nodes: list[str], out: Path, tick=None) -> tuple[float, float]:
    """Submit the prod job; (submit time, delay until its script ran on its node)."""
    out.unlink(missing_ok=True)
    t0 = time.time()
    cluster.run(["sbatch", "--parsable", "-p", "prod", f"-N{len(nodes)}", "-w", ",".join(nodes),
                 "-o", "/dev/null", "--wrap", f"date +%s.%N > {out}"])
    wait_for("prod job start", lambda: out.exists() and out.read_text().strip() != "", tick=tick)
    return t0, float(out.read_text().split()[0]) - t0


def wait_idle(cluster: SlurmCluster, nodes: list[str]) -> None:
    def idle() -> bool:
        res = cluster.run(["sinfo", "-N", "-h", "-p", "preemptable", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
        return all(states.get(n) == "idle" for n in nodes)

    wait_for("nodes idle", idle)


def one_run(cluster: SlurmCluster, tmp: Path, run: int, prod_nodes: list[str]) -> tuple[float, float, float]:
    wait_idle(cluster, list(cluster.nodes))
    _, idle_delay = prod_start_delay(cluster, prod_nodes, tmp / "prod-idle")
    wait_idle(cluster, list(cluster.nodes))

    hub = AgentHub(dead_after_s=30.0)
    cfg = SlurmConfig(daemon_address=hub.address, job_name=f"mt-bench-{run}", env=cluster.env,
                      submit_rate=50.0, submit_burst=50, output="/dev/null",
                      agent_args=("--key-file", hub.key_file))
    backend = SlurmBackend(cfg)
    events: list[PilotEvent] = []
    agents: set[str] = set()
    ended_at: dict[str, float] = {}

    def tick() -> None:
        for ev in hub.poll(20):
            if isinstance(ev, AgentUp):
                agents.add(ev.node)
        for ev in backend.poll():
            events.append(ev)
            if isinstance(ev, PilotEnded):
                ended_at[ev.pilot] = time.time()

    try:
        pilots = {backend.submit(PilotRequest((n,))): n for n in sorted(backend.discover().idle)}
        started = lambda: set(pilots) <= {e.pilot for e in events if isinstance(e, PilotStarted)}  # noqa: E731
        wait_for("pilots running, agents up", lambda: started() and set(pilots.values()) <= agents, tick=tick)
        t0, held_delay = prod_start_delay(cluster, prod_nodes, tmp / "prod-held", tick=tick)
        victims = {p for p, n in pilots.items() if n in prod_nodes}
        wait_for("preemptions reported", lambda: victims <= set(ended_at), tick=tick)
        reasons = {e.reason for e in events if isinstance(e, PilotEnded) and e.pilot in victims}
        if reasons != {EndReason.PREEMPTED}:
            raise RuntimeError(f"run {run}: pilots ended with {reasons}, expected preempted")
        report = max(ended_at[p] for p in victims) - t0
    finally:
        backend.close()
        cluster.cancel_all()
        hub.close()
    return idle_delay, held_delay, report


class StepTail:
    """The traced steps of worker logs, each log read on from where the last call stopped (the logs
    grow by a line a step: read whole at every tick, they slowed the daemon's loop they measure)."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}
        self.steps: dict[Path, list[tuple[float, int]]] = {}  # (time, world) of each step

    def read(self, log: Path) -> list[tuple[float, int]]:
        got = self.steps.setdefault(log, [])
        try:
            with log.open("rb") as f:
                f.seek(self.offsets.get(log, 0))
                chunk = f.read()
        except FileNotFoundError:
            return got
        done = chunk.rfind(b"\n") + 1  # whole lines only: the rest is read next time
        self.offsets[log] = self.offsets.get(log, 0) + done
        for line in chunk[:done].splitlines():
            if b'"ev": "step"' not in line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            got.append((float(obj["t"]), int(obj.get("world", 0))))
        return got

    def first_after(self, logs: list[Path], world: int, after: float) -> float | None:
        """The time of the first traced step at ``world`` after ``after`` in any of ``logs``."""
        times = [t for log in logs for t, w in self.read(log) if w == world and t > after]
        return min(times) if times else None


STAGES = ("pilot submitted", "pilot running", "agent exec", "agent start", "warm import start", "agent hello", "grow decided",
          "start deferred", "warm import done", "worker spawned", "store connected", "script ready",
          "generation published", "barrier passed", "rendezvous joined", "first step")
"""Stages of a node coming back, each as seconds after the prod job's end (``scancel``): the daemon's
sbatch of a new pilot, the backend seeing it run, its agent's process start (its interpreter's exec, from
the age the agent logs) and the agent's start (after its imports; its log), the
warm process's spawn, the agent's hello, the daemon's plan that adds the node, the start the agent defers
while the warm process imports, the warm process ready, the worker's start (the daemon's event), the
worker connected to the daemon's store (its log), the training script calling join (framework imported,
model built), the daemon's member list with the node, the join barrier passed, the worker in the new
world (gloo group and state), and its first step."""

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def _stamped(path: Path) -> list[tuple[float, str]]:
    """``(unix time, line)`` of each timestamped log line of ``path`` (the agent's and the worker's format)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = _STAMP.match(line)
        if m:
            t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            out.append((t, line))
    return out


def _first_line(lines: list[tuple[float, str]], needle: str, after: float) -> float | None:
    return next((t for t, line in lines if t > after - 0.001 and needle in line), None)


def _agent_log(logs: Path, node: str, after: float) -> list[tuple[float, str]]:
    """The log of the first agent that started on ``node`` after ``after`` (its pilot's output file)."""
    best: tuple[float, list[tuple[float, str]]] | None = None
    for path in logs.glob("pilot-*.out"):
        lines = _stamped(path)
        t = _first_line(lines, f"node {node}: agent start", after)
        if t is not None and (best is None or t < best[0]):
            best = (t, lines)
    return best[1] if best else []


def _first_event(d, kind: str, node: str, after: float) -> float | None:  # type: ignore[no-untyped-def]
    for e in d.store.events(kind):
        nodes = e.get("nodes") or [e.get("node")]
        if float(e["time"]) > after and node in nodes:
            return float(e["time"])
    return None


def _submitted(d, node: str, after: float, started: float | None) -> float | None:  # type: ignore[no-untyped-def]
    """When the pilot that started on ``node`` at ``started`` was submitted: the last submission there
    before it started (before ``after`` too, for a pilot queued while the node was recalled)."""
    if started is None:
        return _first_event(d, "pilot_submitted", node, after)
    times = [float(e["time"]) for e in d.store.events("pilot_submitted")
             if node in (e.get("nodes") or []) and float(e["time"]) <= started]
    return max(times) if times else None


def node_stages(d, jid: str, node: str, after: float) -> dict[str, float | None]:  # type: ignore[no-untyped-def]
    """When each of :data:`STAGES` happened for ``node`` after ``after`` (seconds after it, negative for a
    pilot submitted before; None: not seen)."""
    from malletrain.worker.examples.tracelog import traced

    wid = d.runs[jid].workers.get(node)
    log = d.state_dir / "logs" / f"{wid}.log" if wid else None
    joins = [e for e in traced(log, "rescale") if e.get("kind") == "join"] if log else []
    first = [e["t"] for e in steps(log)] if log else []
    running = _first_event(d, "pilot_started", node, after)
    agent = _agent_log(d.state_dir / "logs", node, after)
    worker = _stamped(log) if log else []
    at = {
        "pilot submitted": _submitted(d, node, after, running),
        "pilot running": running,
        "agent exec": None,
        "agent start": _first_line(agent, "agent start", after),
        "warm import start": _first_line(agent, ": importing ", after),
        "agent hello": _first_event(d, "agent_up", node, after),
        "grow decided": _first_event(d, "plan", node, after),
        "start deferred": _first_line(agent, "waits for the warm worker", after),
        "warm import done": _first_line(agent, " ready after ", after),
        "worker spawned": _first_event(d, "worker_started", node, after),
        "store connected": _first_line(worker, "connected to the daemon's store", after),
        "script ready": float(joins[0]["started"]) if joins else None,
        "generation published": _first_event(d, "members", node, after),
        "barrier passed": None,
        "rendezvous joined": float(joins[0]["finished"]) if joins else None,
        "first step": float(first[0]) if first else None,
    }
    begun = next((line for t, line in agent if "agent start" in line), "")
    age = re.search(r"\(up ([0-9.]+) s\)", begun)
    if age and at["agent start"] is not None:
        at["agent exec"] = at["agent start"] - float(age.group(1))
    spawned = next(((t, line) for t, line in agent if ": importing " in line), None)
    early = re.search(r"started with the agent's process, ([0-9.]+) s ago", spawned[1]) if spawned else None
    if early and at["warm import start"] is not None:  # spawned before the agent's imports, logged after them
        at["warm import start"] -= float(early.group(1))
    joined = next((line for t, line in worker if t > after and ": in generation " in line), None)
    if joined is not None and at["rendezvous joined"] is not None:  # "... barrier B s, gloo group G s, state S s"
        m = re.search(r"gloo group ([0-9.]+) s, state ([0-9.]+) s", joined)
        if m:
            at["barrier passed"] = at["rendezvous joined"] - float(m.group(1)) - float(m.group(2))
    out = {k: (v - after if v is not None else None) for k, v in at.items()}
    ready = next((line for t, line in agent if " ready after " in line), "")
    m = re.search(r"\(import ([0-9.]+) s, ([0-9.]+) s CPU\)", ready)
    out["import wall s"], out["import CPU s"] = (float(m.group(1)), float(m.group(2))) if m else (None, None)
    return out


@dataclass
class DaemonRun:
    plan_s: float
    resumed_s: float
    grown_s: float
    prod_delay_s: float
    stages: list[dict[str, float | None]]  # one per node that came back
    requeue: bool = True  # a pilot was queued for each recalled node (False: the baseline)


def daemon_runs(cluster: SlurmCluster, tmp: Path, modes: list[bool], prod_nodes: list[str],
                hold_s: float = 0.0) -> list[DaemonRun]:
    """Per mode, one run: a prod job preempts ``prod_nodes`` under the daemon, then ends (see the module
    doc); the mode says whether the daemon queues a pilot for each recalled node at once (False: the
    baseline). Each prod job runs at least ``hold_s`` seconds."""
    from malletrain.daemon.config import DaemonConfig, ScavengerConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.jobspec import JobSpec

    n_all = len(cluster.nodes)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    os.environ["OMP_NUM_THREADS"] = "1"  # the pilots' (so their warm workers') environment is the job's
    cfg = DaemonConfig(state_dir=str(tmp / "daemon"), runtime="torch", agent_heartbeat=0.2, agent_dead_after=10.0,
                       loop_interval=0.05, scavenger=ScavengerConfig(
                           kind="slurm", partition="preemptable", job_name="mt-bench-daemon", poll_interval=0.3,
                           submit_rate=50.0))
    train = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
             "--trace", "--step-sleep", "0.05")
    d = Daemon(cfg)
    out: list[DaemonRun] = []
    try:
        # one worker a node (the test cluster's nodes declare 4 GPUs): the figures are per node, as before
        jid = d.store.submit(JobSpec("lin", train, 1, n_all, False, {n: 100.0 * n for n in range(1, n_all + 1)},
                                     env={"OMP_NUM_THREADS": "1"}, workers_per_node=1))

        tail = StepTail()
        steps_after = tail.first_after

        def tick() -> None:
            d.run(cfg.loop_interval)  # one iteration and its wait, as the daemon's own loop does them

        def logs() -> list[Path]:
            run = d.runs[jid]
            return [d.state_dir / "logs" / f"{w}.log" for w in run.workers.values()]

        wait_for("job on every node", lambda: len(d.runs[jid].members) == n_all
                 and steps_after(logs(), n_all, 0.0) is not None, timeout=180, tick=tick, pause=0)
        for run, requeue in enumerate(modes):
            d.scav.requeue_recalled = requeue
            label = "default" if requeue else "baseline"
            since = max(e["id"] for e in d.store.events())
            started = tmp / f"prod-daemon-{run}"
            t0 = time.time()
            prod = cluster.run(["sbatch", "--parsable", "-p", "prod", f"-N{len(prod_nodes)}", "-w", ",".join(prod_nodes),
                                "-o", "/dev/null", "--wrap", f"date +%s.%N > {started}; sleep 600"]
                               ).stdout.strip().split(";")[0]

            def new_plan() -> float | None:
                """The daemon's plan without the prod nodes: a decision, or the loss of the last of them."""
                plans = [float(e["time"]) for e in d.store.events("plan", since_id=since)
                         if e["job"] == jid and not set(e["nodes"]) & set(prod_nodes)]
                lost = {e["node"]: float(e["time"]) for e in d.store.events("node_lost", since_id=since)
                        if e["job"] == jid and e["node"] in prod_nodes}
                members = [float(e["time"]) for e in d.store.events("members", since_id=since)
                           if e["job"] == jid and not set(e["nodes"]) & set(prod_nodes)]
                cands = plans[:1] + members[:1] + ([max(lost.values())] if len(lost) == len(prod_nodes) else [])
                return min(cands) if cands else None

            wait_for("new plan", lambda: new_plan() is not None, tick=tick, pause=0)
            small = n_all - len(prod_nodes)
            wait_for("training resumed", lambda: steps_after(logs(), small, t0) is not None, tick=tick, pause=0)
            wait_for("prod job start", lambda: started.exists() and started.read_text().strip() != "", tick=tick, pause=0)
            prod_delay = float(started.read_text().split()[0]) - t0
            plan_s, resumed_s = new_plan() - t0, steps_after(logs(), small, t0) - t0  # type: ignore[operator]
            wait_for("prod job's hold", lambda: time.time() >= t0 + hold_s, timeout=hold_s + 60, tick=tick, pause=0)
            t1 = time.time()
            cluster.run(["scancel", prod])
            wait_for("job grown", lambda: steps_after(logs(), n_all, t1) is not None, timeout=120, tick=tick, pause=0)
            grown_s = steps_after(logs(), n_all, t1) - t1  # type: ignore[operator]
            stages = [node_stages(d, jid, n, t1) for n in prod_nodes]
            out.append(DaemonRun(plan_s, resumed_s, grown_s, prod_delay, stages, requeue))
            per_stage = "; ".join(
                f"{n}: " + ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in st.items())
                for n, st in zip(prod_nodes, stages))
            print(f"daemon run {run + 1} ({label}): prod start {prod_delay:.2f} s after sbatch; preemption -> new plan "
                  f"{plan_s:.2f} s, -> training resumed on {small} nodes {resumed_s:.2f} s; node back -> job grown "
                  f"{grown_s:.2f} s; stages (s after scancel) {per_stage}", flush=True)
    finally:
        d.close()
        cluster.cancel_all()
    return out


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--prod-nodes", type=int, default=2)
    ap.add_argument("--daemon-runs", type=int, default=5, help="daemon runs of each mode, alternating (0: skip them)")
    ap.add_argument("--cold", action="store_true", help="no warm workers (the baseline: every worker starts cold)")
    ap.add_argument("--prod-hold", type=float, default=10.0,
                    help="seconds each daemon run's prod job runs at least (the daemon queues a pilot for a "
                         "recalled node 5 s after the preemption)")
    ap.add_argument("--no-restart-stall", action="store_true", help="skip bench_restart_stall.py's lines at the end")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the daemon's baseline runs (no pilot queued for a recalled node)")
    add_short(ap, "1 paired run, 1 daemon run of each mode (--prod-hold 5), then bench_restart_stall.py --short "
                  "on Slurm")
    args = ap.parse_args(argv)
    if args.short:
        args.runs, args.daemon_runs, args.prod_hold = 1, 1, 5.0
    if args.cold:
        from malletrain.runtimes.torch_elastic import TorchRuntime

        TorchRuntime.warm_modules = ()  # the daemon then passes no --warm to its agents
    try:
        cluster = SlurmCluster(args.nodes).start()
    except ClusterUnavailable as exc:
        print(f"bench_slurm: no Slurm cluster: {exc}", file=sys.stderr)
        return 2
    extra, idle_d, held_d, reports = [], [], [], []
    try:
        prod_nodes = list(cluster.nodes[: args.prod_nodes])
        with tempfile.TemporaryDirectory(prefix="mt-bench-slurm-") as tmp:
            for run in range(args.runs):
                i, h, r = one_run(cluster, Path(tmp), run, prod_nodes)
                idle_d.append(i), held_d.append(h), extra.append(h - i), reports.append(r)
                print(f"run {run + 1}: prod start on idle nodes {i:.2f} s, on held nodes {h:.2f} s, "
                      f"extra {h - i:+.2f} s; preempted reported after {r:.2f} s", flush=True)
            modes = [True] * args.daemon_runs if args.no_baseline else [False, True] * args.daemon_runs
            done = daemon_runs(cluster, Path(tmp), modes, prod_nodes, args.prod_hold) if args.daemon_runs else []
            figures, base = [f for f in done if f.requeue], [f for f in done if not f.requeue]
    finally:
        cluster.stop()
    med, mx = statistics.median, max
    for name, col in (("preemption -> new plan", [f.plan_s for f in figures]),
                      ("preemption -> training resumed", [f.resumed_s for f in figures]),
                      ("node back -> job grown", [f.grown_s for f in figures])):
        if col:
            print(f"daemon: {name}: median {med(col):.2f} s, max {mx(col):.2f} s over {len(col)} runs")
    for stage in STAGES:
        col = [st[stage] for f in figures for st in f.stages if st[stage] is not None]
        old = [st[stage] for f in base for st in f.stages if st[stage] is not None]
        if col:
            was = f" (baseline: median {med(old):.2f} s, max {mx(old):.2f} s)" if old else ""
            print(f"stage (s after the prod job's end): {stage}: median {med(col):.2f} s, max {mx(col):.2f} s{was}")
    print(f"prod start delay on idle nodes: median {med(idle_d):.2f} s, max {mx(idle_d):.2f} s")
    print(f"prod start delay on held nodes: median {med(held_d):.2f} s, max {mx(held_d):.2f} s")
    print(f"prod sbatch -> ended(preempted) reported: median {med(reports):.2f} s, max {mx(reports):.2f} s")
    print(f"main-queue delay (agents only): median {med(extra):.2f} s, max {mx(extra):.2f} s over {len(extra)} runs")
    for what in ("import wall s", "import CPU s"):  # the warm process's own figures (the agent's log)
        col = [st[what] for f in figures for st in f.stages if st.get(what) is not None]
        if col:
            print(f"warm process: {what[:-2]}: median {med(col):.2f} s, max {mx(col):.2f} s")
    handed = [st["first step"] - st["worker spawned"] for f in figures for st in f.stages  # type: ignore[operator]
              if st["first step"] is not None and st["worker spawned"] is not None]
    if handed:  # what a warm worker removes: the framework's import after the daemon's decision
        print(f"worker spawned -> first step on it: median {med(handed):.2f} s, max {mx(handed):.2f} s")
    first = [st["first step"] for f in figures for st in f.stages if st["first step"] is not None]
    old = [st["first step"] for f in base for st in f.stages if st["first step"] is not None]
    if old:
        print(f"baseline (no pilot queued on recall, runs alternating): node back -> first step on it: "
              f"median {med(old):.2f} s, p95 {p95(old):.2f} s")
        paired = [f.prod_delay_s - idle_d[i % len(idle_d)] for i, f in enumerate(base)]
        print(f"baseline: main-queue delay (paired with a run without the daemon): median {med(paired):.2f} s, "
              f"p95 {p95(paired):.2f} s, max {mx(paired):.2f} s")
    if first:
        ratio = f"; {med(first) / med(old):.2f}x the baseline's median" if old else ""
        print(f"node back -> first step on it: median {med(first):.2f} s, p95 {p95(first):.2f} s{ratio}")
    if figures:
        paired = [f.prod_delay_s - idle_d[i % len(idle_d)] for i, f in enumerate(figures)]
        own = (f"main-queue delay (paired with a run without the daemon): median {med(paired):.2f} s, "
               f"p95 {p95(paired):.2f} s, max {mx(paired):.2f} s")
    else:
        own = f"main-queue delay (agents only): median {med(extra):.2f} s, max {mx(extra):.2f} s over {len(extra)} runs"
    if args.no_restart_stall:  # this script's last line; else the restart lines come last
        last_line(own)
        return 0
    print(own, flush=True)
    from bench_restart_stall import main as restart_stall  # its own cluster; the restart lines come last

    return restart_stall(["--short"] if args.short else ["--kills", "5", "--nodes", str(args.nodes)])


if __name__ == "__main__":
    sys.exit(main())
