"""Whole nodes through the daemon: K worker processes per node, nodes recalled and returned.

    python benchmarks/bench_node_workers.py                 # 3 local nodes, K = 2, the example cnn, on CPU

The daemon runs with the local backend (``--nodes`` nodes, no trace), the ``torch`` runtime and
``[scavenger] workers_per_node = K``: every node runs K processes of the job (local ranks, each
on its share of the cores with ``OMP_NUM_THREADS`` = cores / K), ranks numbered node by node. One
job of the example trainer (``--model cnn``, min 1, max ``--nodes``) trains on every node; then
``--recalls`` times the main scheduler takes one node back (SIGTERM on its agent) and, once the
job runs on the others, gives it back.

Checked from the workers' traced steps and the daemon's event log:

- **worlds**: the generations the job's ranks trained in, and their sizes (n x K each);
- **ranks in sync after every switch**: in every generation, every rank 0 .. W-1 traced steps, and
  at every step all of them hold the same parameters (a hash of them);
- **one generation per node recall**: each recall was followed by exactly one new member list (the
  node's K ranks gone together) before the node came back, and no world ever had a size that is
  not a multiple of K;
- **pause**: the median of the workers' rescale pauses (recall, return);
- **per-node throughput K vs 1**: samples a second of the same job on the same nodes with K
  workers per node, against a job file asking ``workers_per_node = 1``, measured in this run.

The last line is the figure; exit 0 when both checks hold.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import step_until

from malletrain.daemon.config import DaemonConfig, LocalConfig, ScavengerConfig
from malletrain.daemon import Daemon
from malletrain.worker.examples.tracelog import traced
from malletrain.daemon.jobspec import JobSpec, JobState


def job_events(state: Path, jid: str, ev: str) -> list[dict[str, Any]]:
    """Every traced event of kind ``ev`` of the job's workers (all local ranks share a log)."""
    return [e for log in sorted((state / "logs").glob(f"{jid}.*.log")) for e in traced(log, ev)]


def worlds_of(steps: list[dict[str, Any]]) -> dict[int, int]:
    """generation -> world size, from the traced steps."""
    return {s["gen"]: s["world"] for s in sorted(steps, key=lambda s: s["gen"])}


def in_sync(steps: list[dict[str, Any]]) -> bool:
    """Every generation heard from all its ranks, and at each step every rank held the same parameters."""
    by_gen: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in steps:
        by_gen[s["gen"]].append(s)
    for gen_steps in by_gen.values():
        world = gen_steps[0]["world"]
        if {s["rank"] for s in gen_steps} != set(range(world)):
            return False
        hashes: dict[int, set[str]] = defaultdict(set)
        for s in gen_steps:
            hashes[s["step"]].add(s["hash"])
        if any(len(h) != 1 for h in hashes.values()):
            return False
    return bool(by_gen)


def one_generation_per_recall(d: Daemon, jid: str, recalls: list[tuple[int, int, str]], k: int,
                              steps: list[dict[str, Any]]) -> bool:
    """Each recall (event ids from, to, node) was followed by one member list, without the node,
    and every world size is a multiple of ``k``."""
    lists = [e for e in d.store.events("members") if e["job"] == jid]
    for first, last, node in recalls:
        between = [e for e in lists if first < e["id"] <= last]
        if len(between) != 1 or node in between[0]["nodes"] or \
                set(between[0]["nodes"]) != set(between[0]["before"]) - {node}:
            return False
    return all(s["world"] % k == 0 for s in steps)


def rate(steps: list[dict[str, Any]], world: int) -> float:
    """Samples a second of rank 0 in its worlds of ``world`` ranks (the job's global rate)."""
    mine = sorted((s for s in steps if s["rank"] == 0 and s["world"] == world), key=lambda s: s["t"])
    mine = mine[len(mine) // 4:]  # past the world's first steps
    if len(mine) < 2 or mine[-1]["t"] <= mine[0]["t"]:
        return 0.0
    return (mine[-1]["samples"] - mine[0]["samples"]) / (mine[-1]["t"] - mine[0]["t"])


def submit(d: Daemon, name: str, nodes: int, workers_per_node: int | None) -> str:
    cmd = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "cnn", "--samples", str(10**9),
           "--trace", "--step-sleep", "0")
    scaling = {n: 100.0 * n for n in range(1, nodes + 1)}
    return d.store.submit(JobSpec(name, cmd, 1, nodes, False, scaling, workers_per_node=workers_per_node))


def run(args: argparse.Namespace, state: Path) -> tuple[bool, str]:
    k, n = args.k, args.nodes
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=n, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05,
                       scavenger=ScavengerConfig(workers_per_node=k))
    d = Daemon(cfg)
    try:
        jid = submit(d, "node-workers", n, None)

        def world_steps(world: int, count: int) -> Callable[[], bool]:
            def enough() -> bool:
                steps = job_events(state, jid, "step")
                return len([s for s in steps if s["world"] == world and s["rank"] == 0
                            and s["gen"] == max(x["gen"] for x in steps)]) >= count
            return enough

        step_until(d, f"{n} nodes x {k} ranks training", world_steps(n * k, args.steps), args.timeout)
        print(f"K={k}: {n} nodes, world {n * k}", flush=True)
        recalls: list[tuple[int, int, str]] = []
        for i in range(args.recalls):
            node = sorted(d.runs[jid].members)[i % n]
            first = max((e["id"] for e in d.store.events()), default=0)
            d.backend.recall(node)
            step_until(d, f"the job on {n - 1} nodes after {node}'s recall",
                       world_steps((n - 1) * k, args.steps), args.timeout)
            last = max(e["id"] for e in d.store.events())
            recalls.append((first, last, node))
            print(f"recall {i + 1}: {node} taken back; the job trains on {n - 1} nodes", flush=True)
            d.backend.make_idle(node)
            step_until(d, f"the job on {n} nodes after {node} came back", world_steps(n * k, args.steps),
                       args.timeout)
            print(f"return {i + 1}: {node} back; the job trains on {n} nodes", flush=True)
        steps = job_events(state, jid, "step")
        pauses = [e["pause"] for e in job_events(state, jid, "rescale") if e["kind"] != "join"]
        rate_k = rate(steps, n * k)
        sync, one_gen = in_sync(steps), one_generation_per_recall(d, jid, recalls, k, steps)
        worlds = worlds_of(steps)

        d.store.request_cancel(jid)
        step_until(d, "the first job cancelled", lambda: d.store.require(jid).state.terminal, args.timeout)
        jid1 = submit(d, "one-worker-per-node", n, 1)

        def one_each() -> bool:
            s = job_events(state, jid1, "step")
            return len([x for x in s if x["world"] == n and x["rank"] == 0]) >= 2 * args.steps

        step_until(d, f"{n} nodes x 1 rank training", one_each, args.timeout)
        rate_1 = rate(job_events(state, jid1, "step"), n)
        ratio = rate_k / rate_1 if rate_1 > 0 else float("nan")
        sizes = ", ".join(str(worlds[g]) for g in sorted(worlds))
        line = (f"node workers: K={k} on {n} nodes, {len(worlds)} worlds (sizes {sizes}), ranks in sync after "
                f"every switch: {'yes' if sync else 'no'}, one generation per node recall: "
                f"{'yes' if one_gen else 'no'}; pause median {statistics.median(pauses) * 1000:.0f} ms; "
                f"per-node throughput K={k} vs K=1: {ratio:.2f}")
        print(f"rates: K={k} {rate_k:.1f} samples/s, K=1 {rate_1:.1f} samples/s on {n} nodes; {len(pauses)} pauses",
              flush=True)
        if d.store.require(jid1).state is not JobState.CANCELLED:
            d.store.request_cancel(jid1)
        return sync and one_gen, line
    finally:
        d.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=3, help="local nodes")
    ap.add_argument("--k", type=int, default=2, help="worker slots per node ([scavenger] workers_per_node)")
    ap.add_argument("--recalls", type=int, default=2, help="nodes recalled and returned, one after the other")
    ap.add_argument("--steps", type=int, default=10, help="steps rank 0 trains in each world before the next change")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for each phase")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mt-nodes-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        ok, line = run(args, state)
    print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
