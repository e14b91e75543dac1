"""A tiny Hugging Face ``Trainer`` job on synthetic data, with malletrain's callback: runs under torchrun and the daemon.

.. code-block:: text

    python -m malletrain.worker.examples.hf_train --max-steps 200                    # one process
    torchrun --standalone --nproc-per-node=2 -m malletrain.worker.examples.hf_train   # two ranks
    # in a job file: launcher = "torchrun", command = ["python", "-m", "malletrain.worker.examples.hf_train"]

The model (a 2-layer MLP whose ``forward`` returns ``{"loss": ...}``, as the Trainer expects)
and the data (``--samples`` points of a fixed random regression problem, generated from their
index) are built in code: nothing is downloaded. The Trainer reads torchrun's variables
itself, shards the data with a ``DistributedSampler`` and runs DDP over gloo on the CPU.

:class:`~malletrain.worker.integrations.huggingface.MalletrainCallback` reports the exact samples of
every step and, on SIGTERM, saves ``--output-dir/checkpoint-STEP`` and exits 143; the next
start resumes from it (:func:`~malletrain.worker.integrations.huggingface.last_checkpoint`) at the next
step. The last line rank 0 prints is ``done: step N``.
"""

from __future__ import annotations

import argparse
import os
from typing import Sequence

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from malletrain.worker.integrations.huggingface import MalletrainCallback, last_checkpoint

FEATURES = 16


class Regression(Dataset[dict[str, torch.Tensor]]):
    """``size`` points of one fixed linear problem with noise; point ``i`` depends only on ``i``."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size = size
        self.seed = seed
        self.weight = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(FEATURES, generator=gen)
        return {"x": x, "labels": x @ self.weight + 0.01 * torch.randn(1, generator=gen)}


class TinyRegressor(nn.Module):
    """Two linear layers; returns the loss the Trainer minimises."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.net(x)
        if labels is None:
            return {"logits": out}
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=4096, help="size of the data set (all ranks together)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps (-1: after --epochs)")
    p.add_argument("--output-dir", default="checkpoints/hf", help="where the Trainer's checkpoints go")
    return p.parse_args(argv)


def training_arguments(args: argparse.Namespace) -> TrainingArguments:
    return TrainingArguments(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=0.05,
        use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        save_strategy="no",  # the callback saves on notice of a recall
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    training = training_arguments(args)
    trainer = Trainer(model=TinyRegressor(), args=training, train_dataset=Regression(args.samples),
                      callbacks=[MalletrainCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))
    if trainer.is_world_process_zero():
        print(f"done: step {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
