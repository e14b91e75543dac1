"""PyTorch Lightning: exact progress reports, a checkpoint on notice of a recall, resume from it.

.. code-block:: python

    from malletrain.worker.integrations.lightning import MalletrainCallback

    ckpt = MalletrainCallback("checkpoints")            # a folder every start of the job sees
    trainer = L.Trainer(..., callbacks=[ckpt])
    trainer.fit(model, data, ckpt_path=ckpt.resume_path())   # None on the first start

Rank 0 reports the samples of each optimizer step (real batch sizes, summed over ranks); on SIGTERM
every rank finishes the step, ``DIRPATH/recall.ckpt`` is saved (whole or absent) and all exit 143.
Extra ``[lightning]``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from malletrain.worker import client
from malletrain.worker.integrations.recall import EXIT_SIGTERM, RecallNotice, agree, batch_size_of, log

CHECKPOINT_NAME = "recall.ckpt"


class MalletrainCallback(pl.Callback):
    """Reports exact samples per optimizer step and checkpoints at the step a recall is noticed."""

    def __init__(self, dirpath: str | os.PathLike[str] = "checkpoints") -> None:
        self.dirpath = Path(dirpath)
        self.notice = RecallNotice()
        self._samples = 0  # this rank's samples since the last optimizer step
        self._step = 0  # trainer.global_step at the last report

    @property
    def checkpoint_path(self) -> Path:
        return self.dirpath / CHECKPOINT_NAME

    def resume_path(self) -> str | None:
        """The checkpoint to pass as ``trainer.fit(..., ckpt_path=)``: the one saved on a recall, or None."""
        return str(self.checkpoint_path) if self.checkpoint_path.is_file() else None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            client.claim_reports()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step = trainer.global_step
        self._samples = 0
        self.notice.install()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._samples += batch_size_of(batch)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step == self._step:
            return  # accumulating gradients: no optimizer step yet
        self._step = trainer.global_step
        step = agree(self._samples, self.notice.received, trainer.strategy.root_device)
        self._samples = 0
        client.report(step.samples, world_size=trainer.world_size, rank=trainer.global_rank)
        if step.stop:
            self._save_and_exit(trainer)

    def _save_and_exit(self, trainer: pl.Trainer) -> None:
        partial = self.checkpoint_path.with_name(CHECKPOINT_NAME + ".partial")
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(partial)  # every rank calls it; rank 0 writes, then a barrier
        if trainer.is_global_zero:
            os.replace(partial, self.checkpoint_path)
            log.info("recall: saved step %d to %s", trainer.global_step, self.checkpoint_path)
        raise SystemExit(EXIT_SIGTERM)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.notice.restore()
