"""A torch job on the GPU through the whole daemon: it trains, is recalled to zero nodes, and
resumes from its checkpoint when nodes come back.

    python benchmarks/bench_cuda_resume.py                  # on a machine with a GPU
    python benchmarks/bench_cuda_resume.py --device cpu     # the same path on CPU (no GPU needed)
    python benchmarks/bench_cuda_resume.py --device cpu --short   # the quick mode CI runs: 5 steps each side

The daemon runs with the local backend (``--nodes`` local nodes, no trace) and the ``torch``
runtime; one job of the example trainer (``--model cnn --device cuda``, min 1, max ``--nodes``)
trains until every node works for it and ``--steps`` steps are done. Then the main scheduler
recalls every node (SIGTERM on each agent, as on a cluster): rank 0 leaves its last commit in the
daemon's store, the job is SUSPENDED, and the daemon writes the checkpoint to its state dir. The
nodes come back; new pilots, agents and workers start, and the job must go on from the stored
step (not from step 0), on the GPU, for ``--steps`` more steps.

Each world's process group uses the device's own collectives (NCCL on ``cuda``, gloo on ``cpu``;
one GPU, so one worker per node and each node's worker on the same GPU: NCCL cannot put two
ranks of one world on one GPU, so ``--device cuda`` runs ``--nodes 1`` unless told otherwise).
The line before the last names the backend the workers' logs say they used and its set-up time.

The last line says PASS or FAIL (FAIL too where the backend is not the device's), with the device's name, the step the checkpoint holds, the first
step trained after the nodes came back, and the seconds from nodes back to that step. Exit 0 on
PASS, 1 on FAIL, 2 when ``--device cuda`` finds no GPU.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from harness import add_short, last_line, step_until

from malletrain.daemon.config import DaemonConfig, LocalConfig
from malletrain.daemon import Daemon
from malletrain.worker.elastic.snapshot import decode_checkpoint
from malletrain.worker.examples.tracelog import steps as steps_of
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.runtimes.torch_elastic import checkpoint_path, decode_checkpoint_file


def job_steps(state: Path, jid: str) -> list[dict[str, Any]]:
    """Every traced step of the job's workers, from their log files."""
    return [s for log in sorted((state / "logs").glob(f"{jid}.*.log")) for s in steps_of(log)]


def resumed_from_checkpoint(first_after: int, ckpt_step: int, last_before: int, devices: list[str],
                            device: str) -> bool:
    """The verdict: the checkpoint holds the last commit before the recall (at most the step in flight
    is lost), the first step after the return is the one after it (not a start from step 0), and
    every step ran on ``device``."""
    return (first_after == ckpt_step + 1 and last_before - 1 <= ckpt_step <= last_before
            and bool(devices) and all(dev.startswith(device) for dev in devices))


GROUP_LINE = re.compile(r"as rank \d+ of \d+: barrier [\d.]+ s, (\w+) group ([\d.]+) s")
"""A worker's log line on joining a world: the process group's backend and its set-up seconds."""

EXPECTED_BACKEND = {"cuda": "nccl", "cpu": "gloo"}


def group_setups(state: Path, jid: str) -> list[tuple[str, float]]:
    """(backend, seconds) of every process group the job's workers set up, from their logs."""
    out = []
    for log in sorted((state / "logs").glob(f"{jid}.*.log")):
        for m in GROUP_LINE.finditer(log.read_text(errors="replace")):
            out.append((m.group(1), float(m.group(2))))
    return out


def device_name(device: str) -> str:
    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    return f"CPU (torch {torch.__version__})"


def run(args: argparse.Namespace, state: Path) -> tuple[bool, str]:
    cfg = DaemonConfig(state_dir=str(state), runtime="torch", local=LocalConfig(nodes=args.nodes, trace="none"),
                       agent_heartbeat=0.2, agent_dead_after=5.0, loop_interval=0.05)
    cmd = (sys.executable, "-m", "malletrain.worker.examples.train", "--model", "cnn", "--device", args.device,
           "--samples", str(10**9), "--trace", "--step-sleep", "0.02")
    scaling = {n: 100.0 * n for n in range(1, args.nodes + 1)}
    d = Daemon(cfg)
    try:
        t0 = time.monotonic()
        jid = d.store.submit(JobSpec("cuda-resume", cmd, 1, args.nodes, False, scaling, env={"OMP_NUM_THREADS": "1"}))

        def world(n: int) -> bool:
            job = d.monitor.jobs.get(jid)
            return job is not None and job.world_size == n

        step_until(d, f"{args.nodes} workers training", lambda: world(args.nodes)
                   and len(job_steps(state, jid)) >= args.steps, args.timeout)
        print(f"trained on {args.nodes} nodes: {len(job_steps(state, jid))} step lines "
              f"({time.monotonic() - t0:.1f} s after submit)", flush=True)

        nodes = sorted(d.runs[jid].members)
        t_recall = time.monotonic()
        for node in nodes:
            d.backend.recall(node)  # the main scheduler takes every node back
        ckpt_file = checkpoint_path(state / "checkpoints", jid)
        step_until(d, "the job suspended with its checkpoint on disk",
                   lambda: d.store.require(jid).state is JobState.SUSPENDED and ckpt_file.exists(), args.timeout)
        before = job_steps(state, jid)
        last_before = max(s["step"] for s in before)
        _, data = decode_checkpoint_file(ckpt_file.read_bytes(), ckpt_file)
        ckpt_step = int(decode_checkpoint(data, jid, str(ckpt_file)).counters["step"])
        print(f"recalled to 0 nodes: SUSPENDED {time.monotonic() - t_recall:.1f} s later; last step trained "
              f"{last_before}, checkpoint of step {ckpt_step} in {ckpt_file.name}", flush=True)

        t_back = time.time()
        for node in nodes:
            d.backend.make_idle(node)  # the main job ended: the nodes are idle again

        def after() -> list[dict[str, Any]]:
            return [s for s in job_steps(state, jid) if s["t"] > t_back]

        step_until(d, f"{args.steps} steps after the nodes came back", lambda: len(after()) >= args.steps,
                   args.timeout)
        resumed = after()
        first = min(resumed, key=lambda s: s["t"])
        devices = sorted({s["device"] for s in before + resumed})
        setups = group_setups(state, jid)
        backends = sorted({b for b, _ in setups})
        print(f"process groups: {len(setups)} set up, backend {', '.join(backends) or 'none'}; set-up median "
              f"{statistics.median([t for _, t in setups]) * 1000 if setups else float('nan'):.0f} ms, max "
              f"{max((t for _, t in setups), default=float('nan')) * 1000:.0f} ms", flush=True)
        ok = resumed_from_checkpoint(first["step"], ckpt_step, last_before, devices, args.device) \
            and backends == [EXPECTED_BACKEND[args.device]]
        line = (f"{args.device} resume: {'PASS' if ok else 'FAIL'}: {device_name(args.device)}; trained to step "
                f"{last_before} on {len(nodes)} nodes, recalled to 0, checkpoint of step {ckpt_step}; first step "
                f"after the nodes came back: {first['step']} (world {first['world']}), "
                f"{first['t'] - t_back:.1f} s after; devices {devices}; state {d.store.require(jid).state.value}")
        return ok, line
    finally:
        d.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the job trains")
    ap.add_argument("--nodes", type=int, default=None,
                    help="local nodes, one worker each (default 2 on cpu, 1 on cuda: NCCL takes one rank per GPU)")
    ap.add_argument("--steps", type=int, default=20, help="steps to see before the recall and after the return")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds allowed for each phase")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="the daemon's state dir, kept afterwards (logs, store); default: a temporary one")
    add_short(ap, "5 steps before the recall and after the return")
    args = ap.parse_args(argv)
    if args.short:
        args.steps = 5
    if args.nodes is None:
        args.nodes = 1 if args.device == "cuda" else 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"cuda resume: SKIP: torch {torch.__version__} sees no GPU here")
        return 2
    if args.state_dir is not None:
        args.state_dir.mkdir(mode=0o700, parents=True, exist_ok=False)
        ok, line = run(args, args.state_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="mt-cuda-") as tmp:
            state = Path(tmp) / "state"
            state.mkdir(mode=0o700)
            ok, line = run(args, state)
    last_line(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
