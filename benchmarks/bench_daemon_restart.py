"""A running torch job through a daemon ``kill -9`` and restart, with real processes.

    python benchmarks/bench_daemon_restart.py [--reps 2] [--down 2] [--dead-after 10]

Per repetition: a daemon subprocess (runtime ``torch``, local backend, 2 nodes)
runs ``malletrain.worker.examples.train --model linear --trace`` on both nodes. Once it
trains, the daemon is SIGKILLed, left down for ``--down`` seconds and started
again on the same state dir. Printed, from the workers' own step traces:

* steps trained while the rendezvous was away (kill -> first step of the
  generation the new daemon publishes);
* steps rolled back: last step before the kill that the new generation does
  not continue from (0: every committed step kept);
* restart -> first step in the new generation: mostly the new daemon waiting
  ``agent_dead_after`` + 1 s for the agents to report their workers;
* the switch itself (the workers' "change" rescale: teardown, barrier, new
  gloo group; no state broadcast, every rank holds the same commit);
* whether any worker was restarted (a new worker log) or any process left.

Baseline (the same job with the rendezvous in the daemon and no reconnection,
before this change): the workers died with the store and the restarted job
began again from step 0, so every step was rolled back.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import wait_for as wait

from malletrain.worker.examples.tracelog import steps, traced
from malletrain.cli.procs import procs_mentioning

CONFIG = """
state_dir = "{state}"
runtime = "torch"
loop_interval = 0.05
agent_heartbeat = 0.2
agent_dead_after = {dead_after}
backend = "local"
[local]
nodes = 2
trace = "none"
"""

JOB = """
name = "lin"
command = ["{python}", "-m", "malletrain.worker.examples.train", "--model", "linear", "--samples", "1000000000",
           "--trace", "--step-sleep", "0.02"]
min_nodes = 2
max_nodes = 2
scaling = {{ 1 = 100.0, 2 = 200.0 }}
env = {{ OMP_NUM_THREADS = "1" }}
"""


def start_daemon(cfg: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "malletrain", "daemon", "--config", str(cfg)],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def one(tmp: Path, down_s: float, dead_after: float) -> dict[str, float]:
    state = tmp / "state"
    cfg = tmp / "daemon.toml"
    cfg.write_text(CONFIG.format(state=state, dead_after=dead_after))
    (tmp / "job.toml").write_text(JOB.format(python=sys.executable))
    log = tmp / "daemon.log"
    d = start_daemon(cfg, log)
    try:
        wait(lambda: (state / "daemon.json").exists(), "daemon.json", 60)
        res = subprocess.run([sys.executable, "-m", "malletrain", "submit", str(tmp / "job.toml"),
                              "--state-dir", str(state)], capture_output=True, text=True, timeout=60)
        jid = res.stdout.strip()
        logs_of = lambda: sorted((state / "logs").glob(f"{jid}.*.log"))  # noqa: E731
        wait(lambda: len(logs_of()) == 2 and all(sum(s["world"] == 2 for s in steps(p)) >= 20 for p in logs_of()),
             "the job training on 2 nodes", 180)
        logs = logs_of()
        gen_before = max(s["gen"] for p in logs for s in steps(p))
        d.send_signal(signal.SIGKILL)
        d.wait(timeout=10)
        t_kill = time.time()
        time.sleep(down_s)
        t_restart = time.time()
        d = start_daemon(cfg, log)
        wait(lambda: all(any(s["gen"] > gen_before for s in steps(p)) for p in logs),
             "the republished generation", 120)
        rank0 = logs[0]
        all_steps = steps(rank0)
        before = max(s["step"] for s in all_steps if s["t"] <= t_kill)
        new = [s for s in all_steps if s["gen"] > gen_before]
        first_new = min(new, key=lambda s: s["t"])
        away = [s for s in all_steps if t_kill < s["t"] < first_new["t"]]
        change = [e for e in traced(rank0, "rescale") if e["kind"] == "change"]
        restarted = len(logs_of()) != 2
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            d.wait(timeout=60)
    time.sleep(1.0)
    left = procs_mentioning(str(state))
    for p in left:
        p.kill()
    return {
        "steps_before_kill": float(before),
        "steps_while_away": float(len(away)),
        "rolled_back": float(max(0, before + 1 - min(s["step"] for s in new))),
        "restart_to_first_step_s": first_new["t"] - t_restart,
        "switch_pause_s": change[-1]["pause"] if change else float("nan"),
        "workers_restarted": float(restarted),
        "leftover_processes": float(len(left)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--down", type=float, default=2.0, help="seconds the daemon stays down")
    ap.add_argument("--dead-after", type=float, default=10.0, help="agent_dead_after of the daemon")
    args = ap.parse_args(argv)
    runs = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="mt-restart-") as tmp:
            r = one(Path(tmp), args.down, args.dead_after)
        runs.append(r)
        print(f"rep {rep + 1}: " + ", ".join(f"{k}={v:.3g}" for k, v in r.items()), flush=True)
    print(f"\ndaemon kill -9, down {args.down:g} s, agent_dead_after {args.dead_after:g} s; "
          f"median / max of {len(runs)}:")
    for key, label in (
        ("steps_while_away", "steps trained from the kill to the new generation"),
        ("rolled_back", "committed steps rolled back (baseline: all, job restarted from 0)"),
        ("restart_to_first_step_s", "restart -> first step in the new generation (s)"),
        ("switch_pause_s", "switch to the republished generation, worker pause (s)"),
        ("workers_restarted", "workers restarted"),
        ("leftover_processes", "processes left behind"),
    ):
        values = [r[key] for r in runs]
        print(f"  {label:<68} {statistics.median(values):8.3f} {max(values):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
