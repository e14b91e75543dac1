"""The toy runtime's worker: a tiny elastic worker without torch, for tests and machines without torch.

Membership is a file (``DIR/<job>.json``: ``{"gen": g, "members": [...]}``); a worker "trains" by
sleeping at ``rate * n**alpha`` samples/s on ``n`` workers, rank 0 reports to the monitor, and a
worker dropped from the list exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

from contract.exits import EXIT_SIGTERM
from contract.workerenv import WorkerEnv, configure_worker_logging


log = logging.getLogger("malletrain.toy")


def _read(path: Path) -> tuple[int, list[str]]:
    try:
        obj = json.loads(path.read_text())
        return int(obj["gen"]), [str(m) for m in obj["members"]]
    except (OSError, ValueError, KeyError, TypeError):
        return 0, []


def worker_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m malletrain.worker.toy")
    ap.add_argument("--rate", type=float, default=200.0, help="samples/s on one worker")
    ap.add_argument("--alpha", type=float, default=0.9, help="scaling exponent: rate * n**alpha on n workers")
    ap.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    ap.add_argument("--exit-after-samples", type=int, default=0, help="rank 0 exits 0 after this many (0: never)")
    args = ap.parse_args(argv)
    env = WorkerEnv.from_environ()
    job, me, directory = env.require_job(), env.require_worker(), env.require_toy_dir()
    configure_worker_logging(env.log_level)
    log.info("worker %s: start (job %s, toy runtime, directory %s)", me, job, directory)

    def on_term(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not raise again while it exits
        log.info("worker %s: SIGTERM (a stop or a recall): exit %d", me, EXIT_SIGTERM)
        sys.exit(EXIT_SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    (directory / f"{job}.ready.{me}").touch()
    reporter = None
    if env.monitor:
        from malletrain.worker.client import Reporter

        reporter = Reporter(env.monitor, job, me)
    path = directory / f"{job}.json"
    joined = False
    done = 0
    current = (0, 0)  # (generation, world size) this worker trains in
    reason = ""
    while True:
        gen, members = _read(path)
        if me not in members:
            if joined:
                reason = f"not in generation {gen}: left the job"
                break  # dropped from the job: leave at this commit point
            time.sleep(0.02)
            continue
        joined = True
        n = len(members)
        if (gen, n) != current:
            log.info("worker %s: %s generation %d, rank %d of %d", me, "join" if not current[0] else "rescale to",
                     gen, members.index(me), n)
            current = (gen, n)
        samples = args.batch * n
        time.sleep(samples / (args.rate * n**args.alpha))
        if members.index(me) == 0:
            done += samples
            if reporter is not None:
                reporter.send(samples, n, gen)
            if args.exit_after_samples and done >= args.exit_after_samples:
                reason = f"trained {done} samples (--exit-after-samples)"
                break
    if reporter is not None:
        reporter.close()
    log.info("worker %s: exit 0: %s", me, reason)
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
