"""Checkpoint save, load and state broadcast for state dicts of real models' sizes.

    python benchmarks/bench_checkpoint.py [--models resnet50,bert-base,yolov3,resnet18] [--reps 3] [--short]

A rescale, restart or preemption of a real job moves its whole state: a restart loads the
checkpoint its last commit saved, a rescale broadcasts the state to the new world, and a commit
saves it. What that costs grows with the model, so the figures are per model, for state dicts of
the sizes of the Pollux models (float32 parameters; the optimizer state is left out, so these are
lower bounds for Adam, which keeps two more copies):

* ``save``: ``torch.save`` of the state dict to a file on the local disk, ``fsync`` included;
* ``load``: ``torch.load`` of that file (right after the save: from the page cache, as a restart on
  the same node finds it);
* ``broadcast``: ``torch.distributed.broadcast`` of every tensor of the state dict from rank 0 to
  rank 1 over gloo on this host (what an in-process rescale's state broadcast does, one peer);
* the baseline, measured in the same run: the same bytes written raw (``numpy.tofile`` + ``fsync``);
  each figure's ratio to it is printed.

Printed per model: MB, then median seconds over ``--reps`` and MB/s for each, and the ratio of save
to the raw write. Run on 2 shared cores, the absolute figures are what this machine gave under its
load; the per-MB rates are what the calibration takes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import add_short, last_line

# parameters (float32) of the models the Pollux measurements are of, from their published sizes
MODEL_PARAMS = {
    "resnet50": 25_557_032,  # imagenet
    "bert-base": 109_482_240,  # bert (SQuAD fine-tuning)
    "yolov3": 61_949_149,  # yolov3
    "resnet18": 11_689_512,  # cifar10
}
CHUNKS = 64  # tensors per state dict: the figure depends on the bytes, hardly on the count


def state_dict(params: int):  # type: ignore[no-untyped-def]
    import torch

    size = params // CHUNKS
    sd = {f"layer{k}.weight": torch.randn(size) for k in range(CHUNKS - 1)}
    sd[f"layer{CHUNKS - 1}.weight"] = torch.randn(params - size * (CHUNKS - 1))
    return sd


def nbytes(sd) -> int:  # type: ignore[no-untyped-def]
    return sum(t.numel() * t.element_size() for t in sd.values())


def timed_save(sd, path: Path) -> float:  # type: ignore[no-untyped-def]
    import torch

    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def timed_load(path: Path) -> float:
    import torch

    t0 = time.perf_counter()
    torch.load(path, weights_only=True)
    return time.perf_counter() - t0


def timed_raw_write(sd, path: Path) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for t in sd.values():
            t.numpy().tofile(f)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def _broadcast_rank(rank: int, params: int, port: int, reps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sd = state_dict(params) if rank == 0 else {k: torch.empty_like(v) for k, v in state_dict(params).items()}
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for t in sd.values():
            dist.broadcast(t, src=0)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 1:
        Path(out).write_text(repr(times))
    dist.destroy_process_group()


def timed_broadcast(params: int, reps: int) -> list[float]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "times")
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_broadcast_rank, args=(r, params, port, reps, out)) for r in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
            if p.is_alive():
                p.kill()
                raise RuntimeError("broadcast did not finish in 600 s")
        return list(eval(Path(out).read_text()))  # noqa: S307 (our own repr of a list of floats)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODEL_PARAMS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-broadcast", action="store_true", help="skip the two-process broadcast")
    add_short(ap, "resnet18 alone, one repetition")
    args = ap.parse_args(argv)
    if args.short:
        args.models, args.reps = "resnet18", 1
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODEL_PARAMS]
    if unknown:
        print(f"bench_checkpoint: unknown model(s) {', '.join(unknown)}; known: {', '.join(MODEL_PARAMS)}",
              file=sys.stderr)
        return 2
    print(f"{'model':<10} {'MB':>7} {'save s':>8} {'MB/s':>7} {'load s':>8} {'MB/s':>7} {'bcast s':>8} {'MB/s':>7} "
          f"{'raw write s':>11} {'save/raw':>8}")
    ratios = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        for name in names:
            sd = state_dict(MODEL_PARAMS[name])
            mb = nbytes(sd) / 1e6
            path, raw = Path(d) / f"{name}.pt", Path(d) / f"{name}.raw"
            save = statistics.median(timed_save(sd, path) for _ in range(args.reps))
            load = statistics.median(timed_load(path) for _ in range(args.reps))
            write = statistics.median(timed_raw_write(sd, raw) for _ in range(args.reps))
            del sd
            bcast = math_nan() if args.no_broadcast else statistics.median(timed_broadcast(MODEL_PARAMS[name], args.reps))
            print(f"{name:<10} {mb:7.0f} {save:8.2f} {mb / save:7.0f} {load:8.2f} {mb / load:7.0f} {bcast:8.2f} "
                  f"{mb / bcast:7.0f} {write:11.2f} {save / write:8.2f}", flush=True)
            ratios.append(save / write)
            path.unlink()
            raw.unlink()
    last_line(f"checkpoint: {len(names)} model(s), {args.reps} repetition(s): save / raw write median "
              f"{statistics.median(ratios):.2f}x (baseline: the same bytes written raw, same run)")
    return 0


def math_nan() -> float:
    return float("nan")


if __name__ == "__main__":
    sys.exit(main())
