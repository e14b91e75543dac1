"""Elastic Horovod rescale pauses under HorovodRuntime, on this host.

    python benchmarks/bench_horovod.py [--rounds 2] [--step-sleep 0.05] [--short]
    python benchmarks/bench_horovod.py --short   # the quick mode CI runs (slow marker, with Horovod): 1 round

Each round starts malletrain/worker/examples/hvd_train.py on 2 slots and rescales it
2 -> 3 (up), 3 -> 1 (down), 1 -> 2 (up) with ``set_members``. From the example's
progress file (one line per step, written by rank 0) it prints, per rescale:

* pause    - the gap between the last step at the old size and the first at the new one;
* reaction - from ``set_members`` to the first step at the new size (adds the
             discovery poll, <= 1 s, and the wait for the next commit);
* baseline - the median step interval at the old size just before, in the same run.

Needs ``horovod.torch`` (``bash .ci/build-horovod.sh .venv``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import add_short, last_line
from malletrain.runtimes.horovod_elastic import HorovodRuntime

STEPS_BEFORE_RESCALE = 8
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Rescale:
    kind: str
    old: int
    new: int
    pause_s: float
    reaction_s: float
    baseline_s: float


def read_progress(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_steps_at(progress: Path, size: int, count: int) -> list[dict[str, Any]]:
    """Wait until the latest run of steps at ``size`` has ``count`` steps; return it."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        records = read_progress(progress)
        tail = []
        for rec in reversed(records):
            if rec["size"] != size:
                break
            tail.append(rec)
        if len(tail) >= count:
            return list(reversed(tail))
        time.sleep(0.05)
    raise TimeoutError(f"{progress}: no {count} steps at size {size} within {TIMEOUT_S} s")


def measure(progress: Path, old: list[dict[str, Any]], new_size: int, t_set: float) -> Rescale:
    first_new = wait_steps_at(progress, new_size, 2)[0]
    records = read_progress(progress)
    at = records.index(first_new)
    last_old = records[at - 1]  # the old size's real last step (it ran on after set_members)
    intervals = [b["t"] - a["t"] for a, b in zip(old, old[1:])]
    kind = "up" if new_size > old[0]["size"] else "down"
    return Rescale(kind, old[0]["size"], new_size, first_new["t"] - last_old["t"],
                   first_new["t"] - t_set, statistics.median(intervals))


def one_round(work: Path, step_sleep: float) -> tuple[float, list[Rescale]]:
    progress, stop = work / "progress.jsonl", work / "stop"
    command = [sys.executable, "-m", "malletrain.worker.examples.hvd_train", "--steps", "1000000",
               "--step-sleep", str(step_sleep), "--progress", str(progress), "--stop-file", str(stop)]
    rt = HorovodRuntime(work / "rt")
    rt.start()
    holders: list[subprocess.Popen[bytes]] = []

    def launch(worker: str) -> None:
        spec = rt.launch_spec("bench", command, worker, "localhost")
        holders.append(subprocess.Popen(list(spec.argv), env={**os.environ, **spec.env}))

    results: list[Rescale] = []
    try:
        launch("w0")
        launch("w1")
        t0 = time.time()
        rt.set_members("bench", ["w0", "w1"])
        start_s = wait_steps_at(progress, 2, 1)[0]["t"] - t0
        members = ["w0", "w1"]
        for new_members in (["w0", "w1", "w2"], ["w0"], ["w0", "w3"]):
            old = wait_steps_at(progress, len(members), STEPS_BEFORE_RESCALE)
            for worker in new_members:
                if worker not in members:
                    launch(worker)
            t_set = time.time()
            rt.set_members("bench", new_members)
            results.append(measure(progress, old, len(new_members), t_set))
            members = new_members
        stop.touch()
        code = rt.wait("bench", timeout=TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"driver exited {code}; log: {rt.job_dir('bench') / 'driver.log'}")
    finally:
        rt.close()
        for proc in holders:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
    return start_s, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    add_short(parser, "1 round (three rescales: up, down, up)")
    args = parser.parse_args(argv)
    if args.short:
        args.rounds = 1
    starts: list[float] = []
    rescales: list[Rescale] = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-hvd-") as tmp:
            start_s, res = one_round(Path(tmp), args.step_sleep)
        starts.append(start_s)
        rescales += res
        for r in res:
            print(f"round {i + 1}: {r.kind:4s} {r.old}->{r.new}: pause {r.pause_s:5.2f} s, "
                  f"reaction {r.reaction_s:5.2f} s, baseline step {r.baseline_s:.3f} s "
                  f"(pause = {r.pause_s / r.baseline_s:.0f}x a step)")
    print(f"start (set_members -> first step at 2): median {statistics.median(starts):.2f} s")
    lines = []
    for kind in ("up", "down"):
        sel = [r for r in rescales if r.kind == kind]
        pauses = [r.pause_s for r in sel]
        reactions = [r.reaction_s for r in sel]
        base = statistics.median(r.baseline_s for r in sel)
        lines.append(f"scale {kind:4s} (n={len(sel)}): pause median {statistics.median(pauses):.2f} s "
                     f"(max {max(pauses):.2f}), reaction median {statistics.median(reactions):.2f} s, "
                     f"baseline step {base:.3f} s")
    print(lines[0])
    last_line(lines[1])  # the scale-down line
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
