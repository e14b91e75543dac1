"""A tiny PyTorch Lightning job on synthetic data, with malletrain's callback: runs under torchrun and the daemon.

.. code-block:: text

    python -m malletrain.worker.examples.lightning_train --max-steps 200                    # one process
    torchrun --standalone --nproc-per-node=2 -m malletrain.worker.examples.lightning_train   # two ranks
    # in a job file: launcher = "torchrun", command = ["python", "-m", "malletrain.worker.examples.lightning_train"]

The model (a 2-layer MLP) and the data (``--samples`` points of a fixed random regression
problem, generated from their index, so every rank and every restart sees the same data set)
are built in code: nothing is downloaded. Lightning shards the data over the ranks with a
``DistributedSampler`` and runs DDP over gloo on the CPU. Under torchrun (or the daemon's
``launcher = "torchrun"``) the world comes from torchrun's variables: ``devices`` is
``LOCAL_WORLD_SIZE`` and ``num_nodes`` is ``GROUP_WORLD_SIZE``, as Lightning requires.

:class:`~malletrain.worker.integrations.lightning.MalletrainCallback` reports the exact samples of
every step and, on SIGTERM, saves ``--ckpt-dir/recall.ckpt`` and exits 143; the next start
resumes from it at the next step. The last line rank 0 prints is ``done: step N``.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from malletrain.worker.integrations.lightning import MalletrainCallback

FEATURES = 16


class Regression(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``size`` points of one fixed linear problem with noise; point ``i`` depends only on ``i``."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.seed = seed
        self.weight = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(FEATURES, generator=gen)
        return x, x @ self.weight + 0.01 * torch.randn(1, generator=gen)


class TinyRegressor(pl.LightningModule):
    """Two linear layers and SGD with momentum: small enough for any CPU."""

    def __init__(self, hidden: int = 32, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=4096, help="size of the data set (all ranks together)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps (-1: after --epochs)")
    p.add_argument("--ckpt-dir", default="checkpoints/lightning", help="where the recall checkpoint goes")
    return p.parse_args(argv)


def make_trainer(args: argparse.Namespace, callback: MalletrainCallback) -> pl.Trainer:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp" if world > 1 else "auto",
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    callback = MalletrainCallback(args.ckpt_dir)
    trainer = make_trainer(args, callback)
    data = DataLoader(Regression(args.samples), batch_size=args.batch, shuffle=True)
    trainer.fit(TinyRegressor(), data, ckpt_path=callback.resume_path())
    if trainer.is_global_zero:
        print(f"done: step {trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
