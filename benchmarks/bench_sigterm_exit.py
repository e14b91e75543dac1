"""How fast stopped torch workers exit, and with which code: two SIGTERMs 30 ms apart, as Slurm and
the agent send them.

    python benchmarks/bench_sigterm_exit.py [--reps 3]

Per repetition a two-worker job of the example trainer (linear model) trains 20 steps in
a :class:`~tests.clusters.localjob.LocalJob`; then each worker's session gets SIGTERM,
and again 30 ms later. Printed: each worker's exit code and the time from the first
SIGTERM to its exit, and whether rank 0 stored its checkpoint. The agent gives a stopped
worker 2 s (a clean stop) or ``RECALL_GRACE_S`` before SIGKILL; the goal is exit 143 well
within that. Baseline (before this change, measured the same way): exit 143 after 5.03 s,
so the agent's SIGKILL came first.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository: its test support (tests/clusters)

from tests.clusters.localjob import LocalJob, example_command  # noqa: E402


def one(rep: int) -> list[tuple[int, float]]:
    cmd = example_command("--model", "linear", "--batch", "4", "--samples", str(10**9), "--trace",
                          "--step-sleep", "0.02")
    with LocalJob(f"sig{rep}", cmd) as job:
        workers = [job.spawn(w) for w in ("w0", "w1")]
        gen, _ = job.set_members(["w0", "w1"])
        for w in ("w0", "w1"):
            job.wait_steps(w, gen, 20)
        t0 = time.monotonic()
        for w in workers:
            os.killpg(w.proc.pid, signal.SIGTERM)
        time.sleep(0.03)
        for w in workers:
            try:
                os.killpg(w.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        out = []
        for w in workers:
            w.proc.wait(60)
            out.append((int(w.proc.returncode), time.monotonic() - t0))
        stored = job.runtime.checkpoint_generation(job.job) == gen
    print(f"rep {rep + 1}: " + ", ".join(f"w{i} exit {c} after {t:.2f} s" for i, (c, t) in enumerate(out))
          + f"; checkpoint stored: {stored}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    results = [r for rep in range(args.reps) for r in one(rep)]
    times = [t for _, t in results]
    codes = sorted({c for c, _ in results})
    print(f"SIGTERM x2 -> worker exit: median {statistics.median(times):.2f} s, max {max(times):.2f} s "
          f"over {len(results)} workers; exit codes {codes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
