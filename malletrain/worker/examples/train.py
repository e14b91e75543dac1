"""A tiny elastic training job on synthetic data: the client API end to end.

``python -m malletrain.worker.examples.train --model mlp --samples 20000``

Models of different scalability, on CPU with one thread (``--device cuda``: on the GPU, the
collectives still through gloo, which carries CUDA tensors):

``mlp``     big fully-connected layers (``--width``): few flops per byte of
            gradient, communication-heavy, scales poorly.
``cnn``     a small convolutional net on 32x32 images: compute-heavy, few
            parameters, scales well.
``linear``  logistic regression: the smallest possible job (tests).

Each step trains on ``--batch`` samples per worker, reports the global batch
(``--batch`` x world size) with :func:`malletrain.worker.client.report` and commits.
The job ends when ``--samples`` samples were trained (rounded up to whole
steps). Under the daemon, give it the job's own target so the two agree:
``command = ["python", "-m", "malletrain.worker.examples.train", "--samples", "{samples}"]``
with ``samples = N`` in the job file (the daemon then stops it at N, or it
exits 0 at N; both are COMPLETED). With a smaller ``--samples`` than the job's
target the script exits 0 early, and ``malletrain status`` says so. Data is drawn from a
generator seeded by (seed, step, rank), so a rescale replays nothing.
With ``--trace`` every committed step prints one JSON line (worker, generation,
rank, world, step, samples, a hash of the parameters) and every rescale one
more: the tests and ``benchmarks/bench_rescale.py`` read them (:mod:`malletrain.worker.examples.tracelog`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from malletrain.worker.client import report
from malletrain.worker.elastic import State, run

IMAGE = 32
CLASSES = 10

_TRACED: dict[int, int] = {}  # id(state) -> rescale events already printed


def build_model(name: str, width: int) -> tuple[nn.Module, tuple[int, ...]]:
    """The model and the shape of one input sample."""
    if name == "mlp":
        features = 256
        model = nn.Sequential(
            nn.Linear(features, width), nn.ReLU(),
            nn.Linear(width, width), nn.ReLU(),
            nn.Linear(width, CLASSES),
        )
        return model, (features,)
    if name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(32, CLASSES),
        )
        return model, (3, IMAGE, IMAGE)
    if name == "linear":
        return nn.Linear(16, CLASSES), (16,)
    raise ValueError(f"--model {name!r}: choose mlp, cnn or linear")


def batch(shape: tuple[int, ...], size: int, seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic, learnable batch: labels come from a fixed projection of the inputs."""
    gen = torch.Generator().manual_seed(hash((seed, step, rank)) & 0x7FFFFFFF)
    x = torch.randn((size, *shape), generator=gen)
    proj = torch.Generator().manual_seed(seed)
    w = torch.randn((int(torch.tensor(shape).prod()), CLASSES), generator=proj)
    y = (x.reshape(size, -1) @ w).argmax(dim=1)
    return x, y


def param_hash(model: nn.Module) -> str:
    h = hashlib.sha1()
    for p in model.state_dict().values():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Options:
    model: str
    width: int
    batch: int
    samples: int
    lr: float
    seed: int
    step_sleep: float
    trace: bool
    manual_allreduce: bool
    device: str = "cpu"


def pick_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` (this worker's first visible GPU) or ``auto`` (cuda when there is one)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU here (torch.cuda.is_available() is False; "
                         f"torch {torch.__version__}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    return torch.device(name)


def train(state: State, opts: Options, shape: tuple[int, ...]) -> int:
    net = state.model if opts.manual_allreduce else state.ddp()
    loss_fn = nn.CrossEntropyLoss()
    assert state.optimizer is not None
    _trace_rescales(state, opts)
    device = next(state.model.parameters()).device
    while state.samples < opts.samples:
        x, y = batch(shape, opts.batch, opts.seed, state.step, state.rank)  # drawn on the CPU: same data anywhere
        x, y = x.to(device), y.to(device)
        state.optimizer.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        if opts.manual_allreduce:
            state.allreduce_gradients()
        state.optimizer.step()
        global_batch = opts.batch * state.world_size
        state.step += 1
        state.samples += global_batch
        state.extra["loss"] = float(loss.item())
        report(global_batch)
        if opts.trace:
            _emit({"ev": "step", "worker": state.worker, "gen": state.generation, "rank": state.rank,
                   "world": state.world_size, "step": state.step, "samples": state.samples,
                   "hash": param_hash(state.model), "device": str(device), "t": time.time()})
        if opts.step_sleep > 0:
            time.sleep(opts.step_sleep)
        state.commit()
    return state.step


def _trace_rescales(state: State, opts: Options) -> None:
    if not opts.trace:
        return
    for ev in state.rescales[_TRACED.get(id(state), 0):]:
        _emit({"ev": "rescale", "worker": state.worker, "kind": ev.kind, "from": ev.from_generation,
               "to": ev.to_generation, "world_before": ev.world_before, "world_after": ev.world_after,
               "started": ev.started, "finished": ev.finished, "pause": ev.pause})
    _TRACED[id(state)] = len(state.rescales)


def _emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def parse_args(argv: Sequence[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m malletrain.worker.examples.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "linear"])
    p.add_argument("--width", type=int, default=1024, help="hidden width of the mlp")
    p.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    p.add_argument("--samples", type=int, default=20_000,
                   help="total samples to train, then exit 0 (in a job file: \"{samples}\", the job's target)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (tests)")
    p.add_argument("--trace", action="store_true", help="print a JSON line per step and per rescale")
    p.add_argument("--manual-allreduce", action="store_true", help="average gradients by hand instead of DDP")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                   help="where the model trains (auto: cuda when torch sees a GPU); checkpoints are portable")
    a = p.parse_args(argv)
    for name in ("width", "batch", "samples"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    return Options(a.model, a.width, a.batch, a.samples, a.lr, a.seed, a.step_sleep, a.trace, a.manual_allreduce,
                   a.device)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(opts.seed)
    model, shape = build_model(opts.model, opts.width)
    model = model.to(pick_device(opts.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=opts.lr, momentum=0.9)
    state = State(model, optimizer)
    steps = run(train, state, opts, shape)
    if opts.trace:
        _trace_rescales(state, opts)
        _emit({"ev": "done", "worker": state.worker, "step": steps, "samples": state.samples,
               "hash": param_hash(state.model), "loss": state.extra.get("loss")})
    else:
        print(f"trained {state.samples} samples (target --samples {opts.samples}) in {steps} steps; "
              f"last loss {state.extra.get('loss', float('nan')):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
