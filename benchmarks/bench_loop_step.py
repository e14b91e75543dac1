"""CPU of one daemon loop iteration on a whole machine, this tree against a baseline tree, same run.

    python benchmarks/bench_loop_step.py --nodes 4608 --jobs 100 --baseline /path/to/main

No load generator: the daemon (:class:`malletrain.daemon.Daemon`, its Slurm backend and parsers,
its hub, store, monitor and policy) runs in one process against the scheduler stand-in
(:class:`tests.clusters.fake_slurm.FakeSlurm`), and each pilot's agent is a message handed to
the hub (hello when its pilot starts, ``leaving`` when the stand-in recalls its node; the hub's
own frame decoding is not measured here, ``bench_daemon_scale.py`` measures it). Workers start at
once. The clock is injected: 0.1 s per iteration (``poll_interval`` 1 s: one poll in ten).

Measured, as thread CPU time (what a quiet head node pays; the wall time on a shared box is not):

* idle iteration: the machine held, every job placed, nothing happens;
* recall: one node recalled, from the iteration that reads its agent's ``leaving`` to the end of
  that iteration's decision (the new plan), one recall at a time.

Each tree runs in its own process (``PYTHONPATH`` = the tree), alternately, ``--rounds`` times;
the best round of each is printed, and the ratio baseline / this tree. ``--short``: 512 nodes, 20 jobs,
a burst of 20 recalls, one round (seconds; with ``--baseline .`` the comparison runs against this tree
itself, which checks the path, not a figure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import add_short, last_line

ROOT = Path(__file__).resolve().parents[1]


def measure(nodes: int, jobs: int, idle_steps: int, recalls: int, burst: int = 0,
            profile: str = "") -> dict[str, float]:
    """One tree's figures (run inside the tree's process)."""
    from malletrain.daemon.config import parse_config
    from malletrain.daemon import Daemon, DaemonParts
    from malletrain.daemon.jobspec import parse_spec
    from scavenger import protocol as P
    from scavenger.hub import AgentHub
    from scavenger.slurm import SlurmBackend, SlurmConfig
    from tests.clusters.fake_slurm import FakeSlurm
    from tests.fakes import FakeRuntime

    clock = [1_790_000_000.0]
    names = [f"n{i:05d}" for i in range(nodes)]
    inbox: list[Any] = []

    class Hub(AgentHub):
        """The real hub, its frames handed over decoded (no socket per agent)."""

        def poll(self, timeout_ms: int = 0, max_frames: int = 0) -> list[Any]:
            msgs, inbox[:] = list(inbox), []
            now = self.clock()
            return [ev for m in msgs for ev in self._handle(m, now)]

        def send(self, msg: Any) -> bool:
            if isinstance(msg, P.StartWorker):
                inbox.append(P.WorkerStarted(msg.node, msg.worker, 4242))
            return True

    slurm = FakeSlurm(names, "preemptable", clock=lambda: clock[0],
                      on_start=lambda node, pilot: inbox.append(P.Hello(node, 1, (), pilot)),
                      on_stop=lambda node, pilot, why: inbox.append(P.Leaving(node, "recalled")))
    work = Path(tempfile.mkdtemp(prefix="malletrain-step-"))
    cfg = parse_config({"state_dir": str(work / "state"), "runtime": "toy", "loop_interval": 0.1,
                        "agent_heartbeat": 5.0, "agent_dead_after": 86400.0,
                        "scavenger": {"kind": "slurm", "partition": "preemptable", "nodes_per_pilot": 1,
                                      "walltime": 86400.0, "max_pilots": nodes + 100, "submit_rate": 1000.0,
                                      "max_queued": 60.0, "poll_interval": 1.0, "renew_before": 0.0},
                        "policy": {"max_running": jobs}, "log": {"level": "error"}}, "step bench")
    backend = SlurmBackend(SlurmConfig(daemon_address="tcp://127.0.0.1:1", partition="preemptable",
                                       walltime_s=86400.0, max_pilots=nodes + 100, renew_before_s=0.0,
                                       submit_rate=1e6, submit_burst=10**6, max_queued_s=60.0),
                           clock=lambda: clock[0], runner=slurm.run)
    hub = Hub(dead_after_s=1e9, clock=lambda: clock[0], key_file=work / "agent.key")
    d = Daemon(cfg, clock=lambda: clock[0], parts=DaemonParts(backend=backend, hub=hub, runtime=FakeRuntime()))
    sizes = [max(1, 64 - 3 * (i % 20)) for i in range(jobs)]
    for i, top in enumerate(sizes):
        d.store.submit(parse_spec({"name": f"j{i}", "command": ["x"], "min_nodes": 1, "max_nodes": top,
                                   "scaling": {"1": 100.0, str(top): 100.0 * top ** 0.85}}, "bench"))

    def step() -> float:
        c0 = time.thread_time()
        d.step()
        clock[0] += 0.1
        slurm.tick()
        return time.thread_time() - c0

    try:
        for _ in range(nodes // 32 + 200):  # the warm-up: every node held, every job placed
            step()
            if len(d.scav.usable()) == nodes and all(r.members for r in d.runs.values()):
                break
        held, placed = len(d.scav.usable()), sum(bool(r.members) for r in d.runs.values())
        for _ in range(20):
            step()
        idle = [step() for _ in range(idle_steps)]
        recall = []
        members = sorted(n for r in d.runs.values() for n in r.members)
        for k in range(recalls):
            slurm.recall(members[(k * 37) % len(members)])
            c0 = time.thread_time()
            before = d.last_decision
            for _ in range(5):  # the iteration that reads the leaving decides on it
                step()
                if d.last_decision is not before:
                    break
            recall.append(time.thread_time() - c0)
            for _ in range(3):
                step()
        burst_s = burst_wall = 0.0
        if burst:
            burst_s, burst_wall = recall_burst(d, slurm, step, burst, profile)
        return {"burst": burst, "burst_ms": burst_s * 1e3, "burst_wall_ms": burst_wall * 1e3,"held": held, "placed": placed, "idle_ms": statistics.median(idle) * 1e3,
                "idle_mean_ms": statistics.mean(idle) * 1e3,
                "idle_p99_ms": sorted(idle)[int(0.99 * (len(idle) - 1))] * 1e3,
                "recall_ms": statistics.median(recall) * 1e3, "recall_max_ms": max(recall) * 1e3}
    finally:
        d.close()
        hub.close()
        shutil.rmtree(work, ignore_errors=True)


def recall_burst(d: Any, slurm: Any, step: Any, burst: int, profile: str) -> tuple[float, float]:
    """``burst`` nodes of running jobs recalled at once (the harness's window saw 484 in one poll):
    thread CPU and wall time from the recalls to the end of the first decision that sees them all
    (what comes after it in that iteration, act, is not the new plan's)."""
    import random

    members = sorted(n for r in d.runs.values() for n in r.members)
    recalled = random.Random(7).sample(members, min(burst, len(members)))
    for node in recalled:
        slurm.recall(node)
    ends: list[tuple[float, float]] = []
    # the decide step: the daemon's decide part (a baseline tree built of mixins: its own _decide)
    owner, name = (d.decide, "decide") if hasattr(d, "decide") else (d, "_decide")
    decide = getattr(owner, name)

    def timed_decide(now: float) -> Any:
        out = decide(now)
        usable = d.scav.usable()
        if not any(n in usable for n in recalled):
            ends.append((time.thread_time(), time.perf_counter()))
        return out

    setattr(owner, name, timed_decide)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(10):
        step()
        if ends:
            break
    if prof is not None:
        prof.disable()
        prof.dump_stats(profile)
    delattr(owner, name)
    if not ends:
        raise SystemExit(f"no decision saw the {len(recalled)} recalls in 10 iterations")
    return ends[0][0] - c0, ends[0][1] - w0


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--nodes", str(args.nodes), "--jobs",
           str(args.jobs), "--idle-steps", str(args.idle_steps), "--recalls", str(args.recalls),
           "--burst", str(args.burst)] + (["--profile", str(Path(args.profile).resolve())] if args.profile else [])
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, timeout=3600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4608)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--idle-steps", type=int, default=50)
    ap.add_argument("--recalls", type=int, default=20)
    ap.add_argument("--burst", type=int, default=0,
                    help="then recall this many nodes of running jobs at once and time their new plan")
    ap.add_argument("--profile", default="", help="write the cProfile of the burst here (no --baseline)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline", default="", help="another tree (e.g. a clone of main) to measure beside this one")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_short(ap, "512 nodes, 20 jobs, 10 idle steps, 3 recalls, a burst of 20, one round")
    args = ap.parse_args(argv)
    if args.short:
        args.nodes, args.jobs, args.idle_steps, args.recalls, args.burst, args.rounds = 512, 20, 10, 3, 20, 1
    if args.profile and args.baseline:
        raise SystemExit("--profile slows the tree it profiles: give it without --baseline")
    if args.child:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(measure(args.nodes, args.jobs, args.idle_steps, args.recalls, args.burst,
                                 os.path.abspath(args.profile) if args.profile else "")))
        return 0
    trees = {"this tree": ROOT} | ({"baseline": Path(args.baseline).resolve()} if args.baseline else {})
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            f = run_tree(tree, args)
            if name not in best or f["idle_ms"] + f["recall_ms"] < best[name]["idle_ms"] + best[name]["recall_ms"]:
                best[name] = f
    lines = []
    for name, f in best.items():
        lines.append(f"{name}: {args.nodes} nodes ({f['held']:.0f} held), {args.jobs} jobs ({f['placed']:.0f} placed): "
              f"idle iteration {f['idle_ms']:.1f} ms CPU (mean with the polls {f['idle_mean_ms']:.1f}, p99 "
              f"{f['idle_p99_ms']:.1f}), recall -> new plan "
              f"{f['recall_ms']:.1f} ms CPU (max {f['recall_max_ms']:.1f})"
              + (f"; {f['burst']:.0f} recalls at once -> new plan {f['burst_ms']:.1f} ms CPU, {f['burst_wall_ms']:.1f} ms wall"
                 if f.get("burst") else ""))
    if "baseline" in best:
        b, t = best["baseline"], best["this tree"]
        lines.append(f"step: {args.nodes} nodes: idle iteration {t['idle_ms']:.1f} ms CPU ({b['idle_ms'] / t['idle_ms']:.1f}x "
              f"less than baseline {b['idle_ms']:.1f} ms; mean with the polls {t['idle_mean_ms']:.1f} ms, "
              f"{b['idle_mean_ms'] / t['idle_mean_ms']:.1f}x less than {b['idle_mean_ms']:.1f} ms), recall -> new plan {t['recall_ms']:.1f} ms CPU "
              f"({b['recall_ms'] / t['recall_ms']:.1f}x less than baseline {b['recall_ms']:.1f} ms)"
              + (f"; {t['burst']:.0f} recalls at once -> new plan {t['burst_ms']:.1f} ms CPU "
                 f"({b['burst_ms'] / t['burst_ms']:.1f}x less than baseline {b['burst_ms']:.1f} ms)" if args.burst else ""))
    print("\n".join(lines[:-1]), flush=True)
    last_line(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
