"""Elastic Horovod example: a tiny CPU model on synthetic data.

Run under the ``horovod`` runtime (or by hand)::

    horovodrun -np 2 --min-np 1 --host-discovery-script ./discover.sh \\
        --network-interfaces lo python -m malletrain.worker.examples.hvd_train --steps 200

It uses Horovod's own elastic API (``hvd.elastic.TorchState`` and
``@hvd.elastic.run``): the state is committed every ``--commit-every`` steps,
and on a membership change Horovod rolls back to the last commit, re-ranks the
workers and syncs the state from a surviving one. Rank 0 reports each step to
the job monitor with :func:`malletrain.worker.client.report` (when that module and
``MALLETRAIN_MONITOR`` are there) and, with ``--progress FILE``, appends one
JSON line per step: ``{"t", "step", "size", "rank", "generation", "loss"}``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Sequence

import horovod.torch as hvd
import torch

try:  # the client API may be absent (an older malletrain); training works without it
    from malletrain.worker import client as _client
except ImportError:  # pragma: no cover - depends on the installed malletrain
    _client = None

from contract.horovod import current_generation

FEATURES = 16


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="global training steps to run")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per worker per step")
    parser.add_argument("--commit-every", type=int, default=1, help="steps between state.commit()")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (slow it down)")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate per worker")
    parser.add_argument("--stop-file", type=Path, default=None,
                        help="end training (all ranks, at the same step) once this file exists")
    parser.add_argument("--progress", type=Path, default=None, help="rank 0 appends one JSON line per step")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "commit_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def synthetic_batch(step: int, rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch: y = x . w_true + noise, different per (step, rank)."""
    gen = torch.Generator().manual_seed(step * 100_003 + rank)
    x = torch.randn(batch_size, FEATURES, generator=gen)
    w_true = torch.arange(1, FEATURES + 1, dtype=torch.float32) / FEATURES
    y = x @ w_true + 0.01 * torch.randn(batch_size, generator=gen)
    return x, y.unsqueeze(1)


def stop_requested(stop_file: Path | None) -> bool:
    """True once any rank sees ``stop_file``; agreed by an allreduce so all ranks stop together."""
    if stop_file is None:
        return False
    seen = torch.tensor([1.0 if stop_file.exists() else 0.0])
    return float(hvd.allreduce(seen, op=hvd.Sum, name="malletrain.stop")) > 0


def make_reporter(progress: Path | None, batch_size: int) -> Callable[[int, float], None]:
    """What rank 0 does after each step: progress line + client report."""

    def on_step(step: int, loss: float) -> None:
        size = hvd.size()
        generation = current_generation()
        if _client is not None:
            _client.set_context(hvd.rank(), size, generation)
            _client.report(batch_size * size)
        if progress is not None and hvd.rank() == 0:
            line = {"t": time.time(), "step": step, "size": size, "rank": hvd.rank(),
                    "generation": generation, "loss": loss}
            with open(progress, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")

    return on_step


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    def on_reset() -> None:  # the world size changed: scale the learning rate with it
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([on_reset])
    on_step = make_reporter(args.progress, args.batch_size)
    loss_fn = torch.nn.MSELoss()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps and not stop_requested(args.stop_file):
            x, y = synthetic_batch(state.step, hvd.rank(), args.batch_size)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            state.step += 1
            on_step(state.step, float(loss))
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
            if state.step % args.commit_every == 0:
                state.commit()

    train(state)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
