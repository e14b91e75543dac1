"""A Hugging Face ``Trainer`` script as a user writes it for ``torchrun``: nothing of malletrain in it.

.. code-block:: text

    torchrun --nnodes=1:2 --nproc-per-node=1 -m malletrain.worker.examples.hf_plain --output-dir DIR
    # in a job file: launcher = "torchrun", command = ["python", "-m", "malletrain.worker.examples.hf_plain", ...]

The model (two linear layers whose ``forward`` returns ``{"loss": ...}``) and the data (a fixed random
regression problem) are built in code: nothing is downloaded. The Trainer saves a checkpoint every
``--checkpoint-every`` steps and the script, when one exists, resumes from the newest whole one (its
``trainer_state.json``, which the Trainer writes last, is there), as users of torchrun do. Each start
prints ``start rank R step S`` and each step of rank 0 ``step S world W rank R restart C t UNIXTIME``
(as :mod:`malletrain.worker.examples.lightning_plain`), so a change of its world can be seen from outside.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments


class Points(Dataset[dict[str, torch.Tensor]]):
    """``size`` points of one fixed linear problem."""

    def __init__(self, size: int) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.x[i].sum().reshape(1)}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class Notes(TrainerCallback):
    """The start and step lines (see the module doc); ``step_sleep`` seconds of pretend work a step."""

    def __init__(self, step_sleep: float) -> None:
        self.step_sleep = step_sleep

    def on_train_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        print(f"start rank {args.process_index} step {state.global_step}", flush=True)

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.step_sleep)
        if state.is_world_process_zero:
            print(f"step {state.global_step} world {args.world_size} rank 0 "
                  f"restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} t {time.time():.3f}", flush=True)


def last_whole_checkpoint(folder: str) -> str | None:
    """The newest ``checkpoint-N`` in ``folder`` with its ``trainer_state.json`` (a save cut short has none)."""
    found = [(int(m.group(1)), name) for name in (os.listdir(folder) if os.path.isdir(folder) else [])
             if (m := re.fullmatch(r"checkpoint-(\d+)", name))
             and os.path.isfile(os.path.join(folder, name, "trainer_state.json"))]
    return os.path.join(folder, max(found)[1]) if found else None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    p.add_argument("--checkpoint-every", type=int, default=5)
    p.add_argument("--step-sleep", type=float, default=0.05)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    training = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch, max_steps=args.max_steps,
        learning_rate=0.01, use_cpu=True, ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        save_strategy="steps", save_steps=args.checkpoint_every, save_total_limit=2, logging_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=Tiny(), args=training, train_dataset=Points(100_000), callbacks=[Notes(args.step_sleep)])
    trainer.train(resume_from_checkpoint=last_whole_checkpoint(args.output_dir))
    if trainer.is_world_process_zero():
        print(f"done: step {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
