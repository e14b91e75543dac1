"""A search on nodes that are recalled: malletrain's sweep against Optuna's own heartbeat-and-retry way.

The same search (``malletrain/worker/examples/sweep_train.py``, a torchrun MLP whose ``--lr`` and
``--width`` are searched, 12 trials, TPE with the same seed) on the same 3 local nodes, with the same
recall schedule (every ``RECALL_EVERY_S`` one node, in turn, is taken for ``RECALL_DOWN_S``):

- **malletrain**: the daemon (local backend, in this process) runs the ``[sweep]``; each trial is a
  torchrun job of 1 to 2 nodes, suspended by a recall and resumed from its own checkpoint.
- **Optuna retry** (the baseline, as Optuna documents it for preemptible workers): one worker
  process a node runs ``study.optimize`` on an RDB study with a heartbeat (``heartbeat_interval``,
  ``grace_period``) and ``RetryHeartbeatStaleTrialCallback``; each trial is a plain process of one
  node. A recall kills the node's worker and its trial (as a preemption does); the trial goes stale, is
  failed and retried as a new trial with the same values, from scratch; the node's worker starts
  again when the node comes back.

Counted: trials restarted from scratch (malletrain: a trial's second start at step 0, from its
``starts.log``; Optuna: retried trials) and node-seconds until the 12th trial completes (each node
holding a trial's process, summed). Prints both and their ratio, with the load; the last line is
``sweep: 12 trials, recalls R, trials restarted from scratch 0 (Optuna retry: N), node-seconds to
finish S (Optuna retry: T)``.

    python benchmarks/bench_sweep.py            # 60 steps a trial, 8 recalls
    python benchmarks/bench_sweep.py --short    # the quick mode CI runs: 4 trials of 10 steps, 2 recalls
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import add_short, last_line

TRIALS = 12
NODES = ("node00", "node01", "node02")
RECALL_EVERY_S = 20.0
RECALL_DOWN_S = 10.0
SPACE = {"lr": {"low": 0.01, "high": 0.2, "log": True}, "width": {"low": 4, "high": 32}}
SEED = 1
PY = sys.executable


def trial_args(steps: int, sleep: float) -> list[str]:
    """A checkpoint at every step, as a user on preemptible nodes would ask of a model this small: a
    recall between the first step and a later first checkpoint would start the trial at step 0 again."""
    return ["--steps", str(steps), "--step-sleep", str(sleep), "--checkpoint-every", "1"]


def recalls_due(start: float, now: float, most: int) -> list[tuple[float, str, float]]:
    """The schedule: (time, node, back at), the k-th recall at k x RECALL_EVERY_S, nodes in turn, at
    most ``most`` (so both ways meet the same recalls when both run that long)."""
    out = []
    k = 1
    while start + k * RECALL_EVERY_S <= now and k <= most:
        t = start + k * RECALL_EVERY_S
        out.append((t, NODES[(k - 1) % len(NODES)], t + RECALL_DOWN_S))
        k += 1
    return out


def from_scratch_restarts(ckpt: Path) -> tuple[int, int]:
    """(starts at step 0 after an earlier run of the trial had trained steps: from scratch, training
    lost; restarts at step 0 before it had trained one, during its start: nothing lost), from each
    trial's starts.log (``start STEP world W trained T``)."""
    lost = free = 0
    for log in ckpt.glob("*/starts.log"):
        lines = [ln.split() for ln in log.read_text().splitlines() if ln.startswith("start ")]
        for words in lines[1:]:
            if words[1] == "0":
                trained = int(words[words.index("trained") + 1]) if "trained" in words else 1
                lost += trained > 0
                free += trained == 0
    return lost, free


# ---------------------------------------------------------------- malletrain
def run_malletrain(work: Path, trials: int, steps: int, sleep: float, most: int) -> dict[str, Any]:
    from malletrain.daemon.config import DaemonConfig, LocalConfig
    from malletrain.daemon import Daemon
    from malletrain.daemon.jobspec import JobSpec, Launcher
    from malletrain.daemon.sweepfile import parse_sweep, register

    ckpt = work / "ckpt"
    cfg = DaemonConfig(state_dir=str(work / "state"), runtime="toy", local=LocalConfig(nodes=len(NODES), trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    cmd = (PY, "-m", "malletrain.worker.examples.sweep_train", "--lr", "{lr}", "--width", "{width}", "--ckpt",
           f"{ckpt}/{{trial}}", *trial_args(steps, sleep))
    spec = JobSpec("bench", cmd, 1, 2, env={"OMP_NUM_THREADS": "1"}, launcher=Launcher.TORCHRUN, worker_batch=8)
    sweep = parse_sweep({"trials": trials, "direction": "minimize", "seed": SEED, "space": SPACE}, "bench", "bench")
    d = Daemon(cfg)
    node_s = 0.0
    recalled: dict[str, float] = {}
    done_recalls: set[float] = set()
    try:
        register(d.store, spec, sweep, None, None)
        start = last = time.monotonic()
        while True:
            d.step()
            d.monitor.drain(timeout_ms=int(cfg.loop_interval * 1000))
            now = time.monotonic()
            node_s += (now - last) * sum(len(r.workers) for r in d.runs.values() if r.spec.sweep_name == "bench")
            last = now
            for t, node, back in recalls_due(start, now, most):
                if t not in done_recalls:
                    done_recalls.add(t)
                    d.backend.recall(node)
                    recalled[node] = back
            for node, back in list(recalled.items()):
                if now >= back:
                    d.backend.make_idle(node)
                    del recalled[node]
            status = d.sweeps.status()[0]
            if status["done"]:
                break
            if now - start > 3600:
                raise RuntimeError("malletrain: the sweep did not finish in an hour")
        elapsed = time.monotonic() - start
    finally:
        d.close()
    completed = sum(t["state"] == "completed" for t in status["trials"])
    return {"node_s": node_s, "elapsed": elapsed, "completed": completed, "recalls": len(done_recalls),
            "restarts": from_scratch_restarts(ckpt)[0], "restarts_at_start": from_scratch_restarts(ckpt)[1],
            "best": status["best"]}


# ---------------------------------------------------------------- Optuna retry (the baseline)
def retry_storage(url: str) -> Any:
    """The baseline's study storage, as Optuna documents it for preemptible workers: a heartbeat every
    second, a trial silent for 3 s is stale, failed and retried from scratch, with no bound on retries
    (``RetryHeartbeatStaleTrialCallback``; an Optuna before 4.9 has only ``RetryFailedTrialCallback``, the
    same callback under the name later Optunas deprecate)."""
    from optuna import storages

    retry = getattr(storages, "RetryHeartbeatStaleTrialCallback", None)
    if retry is None:
        return storages.RDBStorage(url, heartbeat_interval=1, grace_period=3,
                                   failed_trial_callback=storages.RetryFailedTrialCallback(max_retry=None))
    return storages.RDBStorage(url, heartbeat_interval=1, grace_period=3,
                               heartbeat_stale_trial_callback=retry(max_retry=None))


def optuna_worker(url: str, ckpt: str, trials: int, steps: int, sleep: float, port: int) -> None:
    """One node's worker: ``study.optimize`` with a heartbeat; each trial a plain process of one node."""
    import json

    import optuna
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = retry_storage(url)
    study = optuna.load_study(study_name="bench", storage=storage, sampler=optuna.samplers.TPESampler(seed=SEED))

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", SPACE["lr"]["low"], SPACE["lr"]["high"], log=True)
        width = trial.suggest_int("width", SPACE["width"]["low"], SPACE["width"]["high"])
        result = Path(ckpt) / f"{trial.number}.json"
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "MALLETRAIN_TRIAL_RESULT": str(result)}
        subprocess.run([PY, "-m", "malletrain.worker.examples.sweep_train", "--lr", repr(lr), "--width", str(width),
                        "--ckpt", f"{ckpt}/{trial.number}", *trial_args(steps, sleep)], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=3600)
        return float(json.loads(result.read_text())["value"])

    study.optimize(objective, callbacks=[MaxTrialsCallback(trials, states=(TrialState.COMPLETE,))])


def run_optuna(work: Path, trials: int, steps: int, sleep: float, most: int) -> dict[str, Any]:
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ckpt = work / "ckpt"
    ckpt.mkdir(parents=True)
    url = f"sqlite:///{work / 'optuna.db'}"
    study = optuna.create_study(study_name="bench", storage=url, direction="minimize")
    workers: dict[str, tuple[subprocess.Popen[bytes], float]] = {}
    node_s = 0.0
    recalled: dict[str, float] = {}
    done_recalls: set[float] = set()

    def start_worker(i: int, node: str) -> None:
        argv = [PY, __file__, "--optuna-worker", url, str(ckpt), str(trials), str(steps), str(sleep), str(29600 + i)]
        workers[node] = (subprocess.Popen(argv, start_new_session=True), time.monotonic())

    def stop_worker(node: str) -> None:
        nonlocal node_s
        proc, since = workers.pop(node)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # a preemption: the worker and its trial, at once
        proc.wait()
        node_s += time.monotonic() - since

    start = time.monotonic()
    for i, node in enumerate(NODES):
        start_worker(i, node)
    try:
        while len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < trials:
            time.sleep(0.2)
            now = time.monotonic()
            for t, node, back in recalls_due(start, now, most):
                if t not in done_recalls:
                    done_recalls.add(t)
                    if node in workers:
                        stop_worker(node)
                    recalled[node] = back
            for node, back in list(recalled.items()):
                if now >= back:
                    del recalled[node]
                    start_worker(NODES.index(node) + 10 * len(done_recalls), node)
            for node, (proc, _) in list(workers.items()):
                if proc.poll() is not None:  # done (MaxTrialsCallback) or failed: its node is free
                    stop_worker(node)
            if now - start > 3600:
                raise RuntimeError("Optuna: the sweep did not finish in an hour")
        elapsed = time.monotonic() - start
    finally:
        for node in list(workers):
            stop_worker(node)
    seen = study.get_trials(deepcopy=False)
    retried = sum(1 for t in seen if t.state == TrialState.FAIL)
    return {"node_s": node_s, "elapsed": elapsed, "completed": sum(t.state == TrialState.COMPLETE for t in seen),
            "recalls": len(done_recalls), "restarts": retried, "best": study.best_value}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_short(ap, "4 trials of 10 steps each way, at most 2 recalls")
    ap.add_argument("--optuna-worker", nargs=6, metavar=("URL", "CKPT", "TRIALS", "STEPS", "SLEEP", "PORT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.optuna_worker:
        url, ckpt, n, k, pause, port = args.optuna_worker
        optuna_worker(url, ckpt, int(n), int(k), float(pause), int(port))
        return 0
    trials, steps, sleep, most = (4, 10, 0.1, 2) if args.short else (TRIALS, 60, 0.1, 8)
    work = Path(tempfile.mkdtemp(prefix="bench_sweep."))
    try:
        load0 = os.getloadavg()[0]
        ours = run_malletrain(work / "malletrain", trials, steps, sleep, most)
        theirs = run_optuna(work / "optuna", trials, steps, sleep, most)
        load1 = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average {load0:.1f} at start, {load1:.1f} at end ({os.cpu_count()} CPUs); {steps} steps a trial")
    for name, r in (("malletrain", ours), ("Optuna retry", theirs)):
        print(f"{name}: {r['completed']} completed, {r['recalls']} recalls, {r['restarts']} restarted from scratch, "
              f"{r['node_s']:.0f} node-s, {r['elapsed']:.0f} s wall")
    print(f"malletrain: {ours['restarts_at_start']} restarts at step 0 of a trial still starting (a world change "
          "before its first step: no training lost)")
    print(f"node-seconds ratio malletrain / Optuna retry: {ours['node_s'] / theirs['node_s']:.2f}")
    last_line(f"sweep: {trials} trials, recalls {ours['recalls']}, trials restarted from scratch {ours['restarts']} "
          f"(Optuna retry: {theirs['restarts']}), node-seconds to finish {ours['node_s']:.0f} "
          f"(Optuna retry: {theirs['node_s']:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
