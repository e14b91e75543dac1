"""A Lightning script as a user writes it for ``torchrun`` (strategy="ddp"): nothing of malletrain in it.

.. code-block:: text

    torchrun --nnodes=1:2 --nproc-per-node=1 -m malletrain.worker.examples.lightning_plain --ckpt-dir DIR
    # in a job file: launcher = "torchrun", command = ["python", "-m", "malletrain.worker.examples.lightning_plain", ...]

The model (one linear layer) and the data (a fixed random regression problem) are built in code:
nothing is downloaded. It checkpoints every ``--checkpoint-every`` steps (Lightning's
``ModelCheckpoint``, ``last.ckpt``) and, when that file exists, resumes from it, as users of
torchrun do. Each start prints ``start rank R step S`` and each step of rank 0 ``step S world W
rank R restart C t UNIXTIME`` (as :mod:`malletrain.worker.examples.torchrun_ddp`; ``--events FILE``
also appends them there), so a change of its world can be timed from outside.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Tiny(pl.LightningModule):
    """One linear layer, SGD; ``step_sleep`` seconds of pretend work a step."""

    def __init__(self, step_sleep: float) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)
        self.step_sleep = step_sleep

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        time.sleep(self.step_sleep)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Notes(Callback):
    """The start and step lines (see the module doc)."""

    def __init__(self, events: str | None) -> None:
        self.events = events

    def note(self, line: str) -> None:
        print(line, flush=True)
        if self.events:
            with open(self.events, "a") as fh:
                fh.write(line + "\n")

    def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        self.note(f"start rank {trainer.global_rank} step {trainer.global_step}")

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_rank == 0:
            self.note(f"step {trainer.global_step} world {trainer.world_size} rank 0 "
                      f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} t {time.time():.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--events", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    x = torch.randn(100_000, 8, generator=torch.Generator().manual_seed(0))
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                         num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")), strategy="ddp",
                         max_steps=args.max_steps, max_epochs=-1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False,
                         callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.checkpoint_every,
                                                    save_last=True), Notes(args.events)])
    last = os.path.join(args.ckpt_dir, "last.ckpt")
    trainer.fit(Tiny(args.step_sleep), data, ckpt_path=last if os.path.exists(last) else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
