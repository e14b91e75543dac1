"""The daemon at full-machine scale: N node agents, M workers, J jobs, one head node.

    python benchmarks/bench_daemon_scale.py --nodes 4608 --jobs 100      # Summit
    python benchmarks/bench_daemon_scale.py --nodes 10624 --jobs 200     # Aurora
    python benchmarks/bench_daemon_scale.py --parse-only                 # sinfo/squeue parse at 10,624 nodes

Runs the real daemon (``benchmarks/scale/daemon_proc.py``: :class:`malletrain.daemon.Daemon`
with its Slurm backend, hub, monitor, store and policy) in its own process against

* a scheduler stand-in (:class:`tests.clusters.fake_slurm.FakeSlurm`, served from this
  process) answering ``sinfo``/``squeue``/``sbatch``/``scancel``/``scontrol`` for N nodes
  in Slurm's formats, read by the backend's own parsers (the daemon's command runner asks
  the stand-in instead of forking the commands);
* ``--procs`` load processes (``benchmarks/scale/load.py``) running the node agents (one
  per pilot the stand-in starts: the authenticated channel, hello, heartbeats every
  ``--heartbeat`` s, worker events) and the workers the daemon starts (signed reports at
  ``--rate`` steps a second from each job's rank 0, or from every worker with
  ``--reporters all``);
* recalls and returns from the Summit node-state log (``summit-2021-02-10_17.nodes.csv.gz``
  via :func:`traces.read`): machine node i follows log node ``i mod 4734`` (tiles beyond
  the log's 4,734 nodes replay it a day later per tile), over the log's busiest window
  (most recalls), ``--time-scale`` log seconds per wall second.

The machine starts idle, so the daemon holds all N nodes (N agents) before the measured
window; then the log recalls and returns nodes for ``--duration`` wall seconds while the
jobs' workers report. Figures are taken over that window only:

* decision: wall time of the daemon's decide step (``Daemon.decide.decide``: views, evidence, every trainer's policy,
  placing the decisions), p50 and p99;
* recall -> new plan: a recalled agent's ``leaving`` (its send time) to the end of the first
  decision that started after the daemon learnt of the loss; p99 over the recalls of held
  nodes (a recall with no such decision counts as infinite);
* reports: accepted by the monitor per second; lost = sent - accepted (refused by a full
  send queue, rejected, or never read);
* daemon CPU (psutil, the daemon's own process, user + system over the window) and its peak
  RSS; the load processes' and this process's CPU are printed apart;
* store: SQLite transactions committed per second (``Store.commits``).

The last line reads::

    scale: N agents, M workers, J jobs: decision p50 A ms, p99 B ms; recall -> new plan p99 C s;
    reports D/s, 0 lost; daemon CPU E%, RSS F MiB; store G writes/s

On a shared machine the load generator competes with the daemon for the same cores:
every figure is an upper bound on what the daemon alone needs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness import free_port  # noqa: E402
from scale_parse import parse_figures  # noqa: E402  (benchmarks/scale_parse.py: --parse-only)
from tests.clusters.fake_slurm import FakeSlurm, serve_once  # noqa: E402

TRACE = "summit-2021-02-10_17.nodes.csv.gz"
TILE_SHIFT_S = 86400.0
PARTITION = "preemptable"


# ---------------------------------------------------------------- the log
@dataclass(frozen=True)
class Change:
    at: float  # wall seconds after the window opens
    node: str
    idle: bool


def machine_nodes(log_nodes: tuple[str, ...], n: int) -> list[str]:
    """Machine node i is log node ``i mod len(log_nodes)``; tile k > 0 adds ``-k``."""
    out = []
    for i in range(n):
        k, j = divmod(i, len(log_nodes))
        out.append(log_nodes[j] if k == 0 else f"{log_nodes[j]}-{k}")
    return out


def log_changes(n: int, duration_s: float, time_scale: float, busy_pct: float = 90.0
                ) -> tuple[list[str], list[Change], float]:
    """The machine's node names and the log's changes over a busy window: of the windows starting
    every 10 minutes, the one at the ``busy_pct`` percentile of recalls (100: the busiest, where a
    full-machine job recalls nearly every node at once)."""
    from traces import read
    from traces.data import find_data

    path = find_data(TRACE)
    if path is None:
        raise SystemExit(f"{TRACE} not found (set MALLETRAIN_DATA to the shared data directory)")
    tl = read(path)
    span = duration_s * time_scale
    names = machine_nodes(tl.nodes, n)
    tiles = (n + tl.n_nodes - 1) // tl.n_nodes
    recalls = tl.times[~tl.idle]
    last_start = tl.end - span - (tiles - 1) * TILE_SHIFT_S
    starts = np.arange(tl.start, max(tl.start + 1, last_start), 600.0)
    counts = np.searchsorted(recalls, starts + span) - np.searchsorted(recalls, starts)
    order = np.argsort(counts, kind="stable")
    t0 = float(starts[order[min(len(order) - 1, int(len(order) * busy_pct / 100.0))]])
    changes: list[Change] = []
    for k in range(tiles):
        lo = t0 + k * TILE_SHIFT_S
        sel = (tl.times > lo) & (tl.times <= lo + span)
        for t, j, idle in zip(tl.times[sel], tl.node_ids[sel], tl.idle[sel]):
            i = k * tl.n_nodes + int(j)
            if i < n:
                changes.append(Change((float(t) - lo) / time_scale, names[i], bool(idle)))
    changes.sort(key=lambda c: c.at)
    return names, changes, t0


# ---------------------------------------------------------------- processes
def job_specs(jobs: int, max_nodes: int, seed: int) -> list[dict[str, Any]]:
    """``jobs`` jobs of 1..``max_nodes`` nodes (sizes drawn uniformly from [max/8, max]), each with
    its scalability given (no profiling), commands the load processes simulate."""
    rng = random.Random(seed)
    out = []
    for i in range(jobs):
        top = rng.randint(max(1, max_nodes // 8), max_nodes)
        base = rng.uniform(50.0, 500.0)
        out.append({
            "name": f"scale{i:04d}", "command": ["simulated-by-the-harness"], "min_nodes": 1, "max_nodes": top,
            "scaling": {str(k): round(base * k ** 0.85, 3) for k in sorted({1, max(1, top // 2), top})},
        })
    return out


@dataclass
class Run:
    args: argparse.Namespace
    work: Path
    nodes: list[str]
    changes: list[Change]
    slurm: FakeSlurm = field(init=False)
    ctx: Any = field(default_factory=zmq.Context)
    controls: list[Any] = field(default_factory=list)
    loads: list[subprocess.Popen[bytes]] = field(default_factory=list)
    daemon: subprocess.Popen[bytes] | None = None
    node_proc: dict[str, int] = field(default_factory=dict)
    next_tick: float = 0.0

    def __post_init__(self) -> None:
        self.node_proc = {n: i % self.args.procs for i, n in enumerate(self.nodes)}
        self.slurm = FakeSlurm(self.nodes, PARTITION, on_start=self._start, on_stop=self._stop)
        self.rep = self.ctx.socket(zmq.REP)
        self.rep.setsockopt(zmq.LINGER, 0)
        port = self.rep.bind_to_random_port("tcp://127.0.0.1")
        self.slurm_address = f"tcp://127.0.0.1:{port}"
        self.status = self.ctx.socket(zmq.PULL)
        self.status_address = f"tcp://127.0.0.1:{self.status.bind_to_random_port('tcp://127.0.0.1')}"

    def _start(self, node: str, pilot: str) -> None:
        self._tell(node, {"op": "start", "node": node, "pilot": pilot})

    def _stop(self, node: str, pilot: str, why: str) -> None:
        self._tell(node, {"op": "stop", "node": node, "why": "recalled"})

    def _tell(self, node: str, msg: dict[str, Any]) -> None:
        if self.controls:
            self.controls[self.node_proc[node]].send_json(msg)

    def tell_all(self, msg: dict[str, Any]) -> None:
        for c in self.controls:
            c.send_json(msg)

    def serve(self, seconds: float) -> None:
        """Answer the daemon's scheduler commands for ``seconds``; the stand-in ticks meanwhile."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                break
            if self.rep.poll(int(min(left, 0.05) * 1000) + 1):
                serve_once(self.rep, self.slurm)
            if time.monotonic() >= self.next_tick:
                self.next_tick = time.monotonic() + 0.2
                self.slurm.tick()

    def start(self) -> None:
        a = self.args
        state = self.work / "state"
        agents_port, monitor_port = free_port(), free_port()
        config = {
            "state_dir": str(state), "runtime": "toy", "loop_interval": a.loop_interval,
            "agent_heartbeat": a.heartbeat, "agent_dead_after": a.dead_after,
            "scavenger": {"kind": "slurm", "partition": PARTITION, "nodes_per_pilot": 1, "walltime": 86400.0,
                          "max_pilots": min(100_000, a.nodes + 100), "submit_rate": 1000.0, "max_queued": 60.0,
                          "poll_interval": a.poll_interval, "command_timeout": 15.0, "renew_before": 0.0},
            "ports": {"agents": agents_port, "monitor": monitor_port},
            "policy": {"max_running": a.jobs},
            "log": {"level": "warning"},
        }
        self._submit(state, config)
        settings = {"config": config, "slurm": self.slurm_address, "out": str(self.work / "daemon.json"),
                    "submit_burst": 1000, "profile": a.profile}
        (self.work / "daemon_settings.json").write_text(json.dumps(settings))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        tree = Path(a.daemon_tree).resolve() if a.daemon_tree else ROOT  # the daemon's code (a baseline's?)
        denv = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(tree), str(ROOT)]))}
        log = open(self.work / "daemon.log", "wb")
        self.daemon = subprocess.Popen([sys.executable, str(ROOT / "benchmarks/scale/daemon_proc.py"),
                                        str(self.work / "daemon_settings.json")], stdout=log, stderr=log, env=denv)
        place(self.daemon.pid, a.daemon_cpus, 0)
        key = state / "agent.key"
        deadline = time.monotonic() + 60
        while not (state / "daemon.json").exists():
            self.serve(0.1)
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start: see {self.work / 'daemon.log'}")
        for i in range(a.procs):
            ctl = self.ctx.socket(zmq.PUSH)
            addr = f"tcp://127.0.0.1:{ctl.bind_to_random_port('tcp://127.0.0.1')}"
            self.controls.append(ctl)
            ls = {"hub": f"tcp://127.0.0.1:{agents_port}", "monitor": f"tcp://127.0.0.1:{monitor_port}",
                  "key_file": str(key), "heartbeat": a.heartbeat, "rate": a.rate, "reporters": a.reporters,
                  "control": addr, "status": self.status_address, "out": str(self.work / f"load{i}.json")}
            (self.work / f"load{i}_settings.json").write_text(json.dumps(ls))
            llog = open(self.work / f"load{i}.log", "wb")
            self.loads.append(subprocess.Popen([sys.executable, str(ROOT / "benchmarks/scale/load.py"),
                                                str(self.work / f"load{i}_settings.json")],
                                               stdout=llog, stderr=llog, env=env))
            place(self.loads[-1].pid, a.load_cpus, a.load_nice)
        for n, pilot in self.slurm.running().items():  # pilots that started before the loads listened
            self._start(n, pilot)

    def check_alive(self) -> None:
        """Stop with the log to read when the daemon or a load process died."""
        for name, proc in [("daemon", self.daemon)] + [(f"load{i}", p) for i, p in enumerate(self.loads)]:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"{name} exited {proc.returncode}: see {self.work / (name + '.log')}")

    def _submit(self, state: Path, config: dict[str, Any]) -> None:
        from malletrain.daemon.jobspec import parse_spec
        from malletrain.daemon.store import Store

        store = Store.open(state / "store.db")
        try:
            for spec in job_specs(self.args.jobs, self.args.max_job_nodes, self.args.seed):
                store.submit(parse_spec(spec, spec["name"]))
        finally:
            store.close()

    def counts(self) -> dict[str, int]:
        """Reports sent and refused so far, over every load process."""
        self.tell_all({"op": "count"})
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while len(got) < len(self.loads) and time.monotonic() < deadline:
            if self.status.poll(10):
                got.append(self.status.recv_json())
            if self.rep.poll(0):
                serve_once(self.rep, self.slurm)
        return {"sent": sum(g["sent"] for g in got), "refused": sum(g["refused"] for g in got)}

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 120
            while self.daemon.poll() is None and time.monotonic() < deadline:
                self.serve(0.1)
            if self.daemon.poll() is None:
                print("the daemon did not stop within 120 s of SIGTERM: killed", flush=True)
                self.daemon.kill()
            elif self.daemon.returncode:
                print(f"the daemon exited {self.daemon.returncode}: see {self.work / 'daemon.log'}", flush=True)
        self.tell_all({"op": "exit"})
        for p in self.loads:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.ctx.destroy(linger=0)


def cpu_set(text: str) -> set[int]:
    """``--daemon-cpus``/``--load-cpus``: comma-separated CPU numbers ("" = any)."""
    try:
        return {int(c) for c in text.split(",") if c.strip()}
    except ValueError:
        raise SystemExit(f"bad CPU list {text!r}: expected numbers like 0 or 1,2") from None


def place(pid: int, cpus: str, nice: int) -> None:
    """Pin process ``pid`` to ``cpus`` (none: where the OS likes) and lower its priority by ``nice``
    (the daemon keeps its own: the load generator must not take the daemon's core)."""
    if cpus:
        os.sched_setaffinity(pid, cpu_set(cpus))
    if nice:
        os.setpriority(os.PRIO_PROCESS, pid, nice)


def run_queue_wait(pid: int) -> float:
    """Seconds process ``pid``'s threads have waited for a CPU while runnable (Linux schedstat; 0 elsewhere).
    High while the daemon's CPU stays low: the machine, not the daemon, is the bottleneck."""
    total = 0.0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0
    return total


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank; inf counts as the largest value), nan for none."""
    if not xs:
        return float("nan")
    ordered = sorted(xs)
    return float(ordered[min(len(ordered) - 1, max(0, int(np.ceil(q / 100.0 * len(ordered))) - 1))])


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    names, changes, t0 = log_changes(args.nodes, args.duration, args.time_scale, args.busy)
    work = Path(tempfile.mkdtemp(prefix="malletrain-scale-"))
    run = Run(args, work, names, changes)
    me = psutil.Process()
    try:
        run.start()
        dproc = psutil.Process(run.daemon.pid)  # type: ignore[union-attr]
        lprocs = [psutil.Process(p.pid) for p in run.loads]
        # warm-up: the daemon holds every node (one agent each) and places the jobs
        t_warm = time.monotonic()
        while len(run.slurm.running()) < args.nodes and time.monotonic() - t_warm < args.warmup_timeout:
            run.serve(0.5)
            run.check_alive()
        held = len(run.slurm.running())
        print(f"warm-up: {held} of {args.nodes} nodes held after {time.monotonic() - t_warm:.0f} s; "
              f"settling {args.settle:g} s", flush=True)
        run.serve(args.settle)
        # the measured window: the log's recalls and returns
        c0 = run.counts()
        cpu0 = dproc.cpu_times()
        wait0 = run_queue_wait(dproc.pid)
        lcpu0 = [p.cpu_times() for p in lprocs]
        mcpu0 = me.cpu_times()
        w0, m0 = time.time(), time.monotonic()
        rss = 0
        recalled_held: list[tuple[str, float]] = []
        i = 0
        next_sample = 0.0
        while time.monotonic() - m0 < args.duration:
            now = time.monotonic() - m0
            while i < len(changes) and changes[i].at <= now:
                ch = changes[i]
                if ch.idle:
                    run.slurm.give_back(ch.node)
                elif run.slurm.recall(ch.node) is not None:
                    recalled_held.append((ch.node, time.time()))
                i += 1
            if now >= next_sample:
                rss = max(rss, dproc.memory_info().rss)
                next_sample = now + 1.0
                run.check_alive()
            run.serve(0.02)
        wall = time.monotonic() - m0
        w1 = time.time()
        cpu1 = dproc.cpu_times()
        wait1 = run_queue_wait(dproc.pid)
        lcpu1 = [p.cpu_times() for p in lprocs]
        mcpu1 = me.cpu_times()
        c1 = run.counts()
        run.tell_all({"op": "quiet"})
        run.serve(3.0)  # the last reports reach the monitor
    finally:
        run.stop()
    dout = json.loads((work / "daemon.json").read_text())
    louts = [json.loads((work / f"load{i}.json").read_text()) for i in range(args.procs)]
    sent_total = sum(lo["sent"] for lo in louts)
    refused_total = sum(lo["refused"] for lo in louts)
    accepted = dout["monitor"]["accepted"]
    lost = sent_total + refused_total - accepted
    decisions = [d for end, d in dout["decisions"] if w0 <= end <= w1]
    decision_cpu = [c for (end, _), c in zip(dout["decisions"], dout["decision_cpu"]) if w0 <= end <= w1]
    decision_ends = sorted((end, d) for end, d in dout["decisions"])
    lost_at = dout["lost"]
    latencies = []
    for node, t_rec in recalled_held:
        seen = [t for t in lost_at.get(node, []) if t >= t_rec - 1.0]
        if not seen:
            latencies.append(float("inf"))
            continue
        learnt = seen[0]
        nxt = next((end for end, d in decision_ends if end - d >= learnt), None)
        latencies.append(float("inf") if nxt is None else nxt - t_rec)
    slow = sorted((st for st in dout.get("slow_steps", []) if w0 <= st[0] <= w1), key=lambda st: -st[1])
    commits = [(t, c) for t, c in dout["commits"] if w0 <= t <= w1]
    store_rate = (commits[-1][1] - commits[0][1]) / (commits[-1][0] - commits[0][0]) if len(commits) > 1 else 0.0
    dcpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall * 100
    lcpu = sum((b.user + b.system - a.user - a.system) for a, b in zip(lcpu0, lcpu1)) / wall * 100
    mcpu = (mcpu1.user + mcpu1.system - mcpu0.user - mcpu0.system) / wall * 100
    inside = [(a, w) for t, a, w in dout["sizes"] if w0 <= t <= w1] or [(dout["usable"], sum(dout["jobs"].values()))]
    agents, workers = max(a for a, _ in inside), max(w for _, w in inside)  # the most the window saw
    est = cpu_estimate(dout["counters"], w0, w1, agents, workers, args)
    fig = {
        "nodes": args.nodes, "agents": agents, "workers": workers, "jobs": args.jobs, **est,
        "agents_end": dout["usable"], "workers_end": sum(dout["jobs"].values()),
        "decision_p50_ms": pct(decisions, 50) * 1e3, "decision_p99_ms": pct(decisions, 99) * 1e3,
        "decisions": len(decisions), "decision_cpu_p50_ms": pct(decision_cpu, 50) * 1e3,
        "decision_cpu_p99_ms": pct(decision_cpu, 99) * 1e3,
        "daemon_waited_pct": (wait1 - wait0) / wall * 100,
        "step_p50_ms": pct([s for s in dout["steps"]], 50) * 1e3, "step_p99_ms": pct(dout["steps"], 99) * 1e3,
        "recalls": len(recalled_held), "recall_plan_p50_s": pct(latencies, 50), "recall_plan_p99_s": pct(latencies, 99),
        "reports_per_s": (c1["sent"] - c0["sent"]) / wall, "lost": lost, "sent": sent_total, "refused": refused_total,
        "accepted": accepted, "rejected": dout["monitor"]["rejected"],
        "daemon_cpu_pct": dcpu, "daemon_rss_mib": rss / 2**20, "load_cpu_pct": lcpu, "harness_cpu_pct": mcpu,
        "store_writes_per_s": store_rate, "window_s": wall, "log_window_start": t0, "changes": i,
        "recall_bursts": {f"{int(t - w0)}": k for t, k in _per_second([t for _, t in recalled_held]) if k >= 10},
        "slowest_steps": [{"at_s": round(t - w0, 2), "s": round(d, 3), **{k: round(v, 3) for k, v in ph.items()}}
                          for t, d, ph in slow[:5]],
        "daemon_tree": args.daemon_tree,
        "hub_rejected": dout["hub_rejected"], "commands": dout["commands"], "work": str(work),
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return fig


def _per_second(times: list[float]) -> list[tuple[float, int]]:
    """How many of ``times`` fall in each whole second (its first time, the count), in order."""
    out: list[tuple[float, int]] = []
    for t in sorted(times):
        if out and int(t) == int(out[-1][0]):
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def cpu_estimate(counters: list[Any], w0: float, w1: float, agents: int, workers: int,
                 args: argparse.Namespace) -> dict[str, float]:
    """The daemon's CPU per unit of work over the window (thread CPU time: what it costs, not how
    long it waited for a core) and the CPU it would need to keep up with the whole load: agents'
    heartbeats (and the pings that go with them), reports, one step per loop interval, and the
    decisions of the steps that decided. On a machine too busy to give the daemon that much, the
    measured CPU is what it got, and this is what it needs."""
    inside = [c for c in counters if w0 <= c[0] <= w1]
    if len(inside) < 2:
        return {}
    (_, s0, f0, r0, d0, c0), (_, s1, f1, r1, d1, c1) = inside[0], inside[-1]
    steps, frames, reports, decisions = s1 - s0, f1 - f0, r1 - r0, d1 - d0
    cpu = {k: c1[k] - c0[k] for k in c1}
    per_frame = cpu["hub"] / frames if frames else 0.0
    per_report = cpu["monitor"] / reports if reports else 0.0
    per_decision = cpu["decide"] / decisions if decisions else 0.0
    besides = cpu["besides"] if "besides" in cpu else cpu["step"] - cpu["hub"] - cpu["decide"] - cpu["monitor"]
    per_step = max(0.0, besides) / steps if steps else 0.0
    steps_s = 1.0 / args.loop_interval
    frames_s = agents / args.heartbeat
    reports_s = args.rate * (workers if args.reporters == "all" else args.jobs)
    decisions_s = steps_s * min(1.0, decisions / steps) if steps else 0.0
    need = frames_s * per_frame + reports_s * per_report + steps_s * per_step + decisions_s * per_decision
    return {"cpu_per_frame_us": per_frame * 1e6, "cpu_per_report_us": per_report * 1e6,
            "cpu_per_step_ms": per_step * 1e3, "cpu_per_decision_ms": per_decision * 1e3,
            "cpu_needed_pct": need * 100, "frames_s_needed": frames_s, "reports_s_needed": reports_s,
            "decisions_s_needed": decisions_s}


def keeps_up(f: dict[str, Any]) -> tuple[bool, str]:
    """Whether decisions keep up at this size, and what broke first if not."""
    broke = []
    if not f["decision_p99_ms"] <= 100:
        broke.append(f"decision p99 {f['decision_p99_ms']:.0f} ms > 100 ms")
    if f["recalls"] and not f["recall_plan_p99_s"] <= 1.0:
        broke.append(f"recall -> new plan p99 {f['recall_plan_p99_s']:.2f} s > 1 s")
    if f["daemon_cpu_pct"] > 100:
        broke.append(f"daemon CPU {f['daemon_cpu_pct']:.0f}% > one core")
    if f["daemon_rss_mib"] > 1024:
        broke.append(f"RSS {f['daemon_rss_mib']:.0f} MiB > 1 GiB")
    if f["lost"]:
        broke.append(f"{f['lost']} reports lost")
    if f["agents"] < 0.95 * f["nodes"]:
        broke.append(f"only {f['agents']} of {f['nodes']} agents up")
    note = "" if f["recalls"] else " (no recall of a held node in the window: recall -> new plan not judged)"
    return not broke, "; ".join(broke) + note


def line(f: dict[str, Any]) -> str:
    return (f"scale: {f['agents']} agents, {f['workers']} workers, {f['jobs']} jobs: "
            f"decision p50 {f['decision_p50_ms']:.1f} ms, p99 {f['decision_p99_ms']:.1f} ms; "
            f"recall -> new plan p99 {f['recall_plan_p99_s']:.2f} s; "
            f"reports {f['reports_per_s']:.0f}/s, {f['lost']} lost; "
            f"daemon CPU {f['daemon_cpu_pct']:.0f}%, RSS {f['daemon_rss_mib']:.0f} MiB; "
            f"store {f['store_writes_per_s']:.0f} writes/s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4608)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--max-job-nodes", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0, help="measured window, wall seconds")
    ap.add_argument("--time-scale", type=float, default=10.0, help="log seconds per wall second")
    ap.add_argument("--busy", type=float, default=90.0,
                    help="which window of the log: percentile of recalls per window (100: the busiest)")
    ap.add_argument("--procs", type=int, default=4, help="load processes (agents and workers)")
    ap.add_argument("--rate", type=float, default=10.0, help="steps (reports) a second per reporting worker")
    ap.add_argument("--reporters", choices=("all", "rank0"), default="rank0",
                    help="who reports each step: each job's rank 0 (the toy and torch runtimes) or every worker")
    ap.add_argument("--heartbeat", type=float, default=5.0,
                    help="agent_heartbeat (the daemon's default is 0.5 s: at thousands of nodes see docs/research/scale.md)")
    ap.add_argument("--dead-after", type=float, default=30.0, help="agent_dead_after (the daemon's default)")
    ap.add_argument("--loop-interval", type=float, default=0.1)
    ap.add_argument("--poll-interval", type=float, default=1.0)
    ap.add_argument("--warmup-timeout", type=float, default=300.0)
    ap.add_argument("--settle", type=float, default=15.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load-nice", type=int, default=0,
                    help="nice value of the load processes (19: the daemon first whenever it is runnable)")
    ap.add_argument("--daemon-cpus", default="", help="CPUs the daemon runs on, e.g. 0 (default: any)")
    ap.add_argument("--load-cpus", default="",
                    help="CPUs the load processes and this harness run on, e.g. 1 (default: any)")
    ap.add_argument("--daemon-tree", default="",
                    help="run the daemon's code from this tree (e.g. a checkout of main: the baseline); the "
                         "harness, stand-in and load processes stay this tree's")
    ap.add_argument("--sweep", default="", help="comma-separated node counts: find the largest that keeps up")
    ap.add_argument("--parse-only", action="store_true")
    ap.add_argument("--profile", default="", help="write the daemon's cProfile stats here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, store)")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args(argv)
    if args.load_cpus:
        os.sched_setaffinity(0, cpu_set(args.load_cpus))  # the stand-in too (its own process is the harness)
    print(parse_figures(), flush=True)
    if args.parse_only:
        return 0
    sizes = [int(s) for s in args.sweep.split(",") if s] or [args.nodes]
    results = []
    for n in sizes:
        sub = argparse.Namespace(**{**vars(args), "nodes": n,
                                    "jobs": args.jobs if not args.sweep else max(1, args.jobs * n // args.nodes)})
        f = run_once(sub)
        ok, why = keeps_up(f)
        f["keeps_up"], f["broke"] = ok, why
        results.append(f)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in f.items()}), flush=True)
        print(f"{n} nodes{' (the daemon of ' + args.daemon_tree + ')' if args.daemon_tree else ''}: "
              f"{'keeps up' + why if ok else 'breaks: ' + why}; decision CPU p50 "
              f"{f['decision_cpu_p50_ms']:.1f} ms, p99 {f['decision_cpu_p99_ms']:.1f} ms; the daemon waited for a CPU "
              f"{f['daemon_waited_pct']:.0f}% of the window; load generator CPU {f['load_cpu_pct']:.0f}%, stand-in "
              f"{f['harness_cpu_pct']:.0f}% (all on {os.cpu_count()} shared cores: figures are upper bounds)", flush=True)
        if "cpu_needed_pct" in f:
            print(f"daemon CPU per unit: {f['cpu_per_frame_us']:.0f} us/agent frame, {f['cpu_per_report_us']:.0f} us/report, "
                  f"{f['cpu_per_step_ms']:.1f} ms/step besides, {f['cpu_per_decision_ms']:.1f} ms/decision -> "
                  f"{f['cpu_needed_pct']:.0f}% of a core to keep up ({f['frames_s_needed']:.0f} frames/s, "
                  f"{f['reports_s_needed']:.0f} reports/s, {1 / args.loop_interval:.0f} steps/s, "
                  f"{f['decisions_s_needed']:.1f} decisions/s)", flush=True)
        if f["slowest_steps"]:
            print("slowest steps (wall s by phase, at s into the window): " + "; ".join(
                f"{st['s']:.2f} at {st['at_s']:.1f}: " + ", ".join(f"{k} {v:.2f}" for k, v in st.items()
                                                                   if k not in ("s", "at_s"))
                for st in f["slowest_steps"]), flush=True)
        print(line(f), flush=True)
    if args.sweep:
        good = [f for f in results if f["keeps_up"]]
        best = max(good, key=lambda f: f["nodes"]) if good else None
        print("limits: " + (f"decisions keep up up to N = {best['agents']} agents, M = {best['workers']} workers"
                            if best else "no size kept up") + f" (sizes tried: {', '.join(map(str, sizes))})")
        print(line(results[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
