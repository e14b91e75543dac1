"""Hugging Face ``Trainer``: exact progress reports, a checkpoint on notice of a recall, resume from it.

.. code-block:: python

    from malletrain.worker.integrations.huggingface import MalletrainCallback, last_checkpoint

    args = TrainingArguments(output_dir="out", ...)     # a folder every start of the job sees
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[MalletrainCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))   # None on the first start

Rank 0 reports the samples of each optimizer step (real batch sizes, summed over ranks); on SIGTERM
every rank finishes the step, the trainer saves ``checkpoint-STEP`` and all exit 143; the epoch is
carried across restarts at another world size (:func:`epoch_now`). Extra ``[huggingface]``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from malletrain.worker import client
from malletrain.worker.integrations.recall import EXIT_SIGTERM, RecallNotice, agree, batch_size_of, log

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
"""The file the Trainer writes last into a checkpoint: a folder without it was not finished."""


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest finished ``checkpoint-STEP`` folder in ``output_dir`` (None: none, or no folder)."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _CHECKPOINT_DIR.match(p.name)) and (p / TRAINER_STATE).is_file()]
    return str(max(found)[1]) if found else None


def epoch_now(saved: float, start_step: int, hf_epoch: float, updates_per_epoch: int) -> float:
    """The epoch carried across restarts: ``saved`` (the checkpoint's epoch, 0 on a first start) plus
    how far the Trainer counted since this start at ``start_step`` (``hf_epoch``, its own epoch now,
    less where it put ``start_step`` at ``updates_per_epoch`` optimizer steps an epoch at this world
    size). Without a restart, or after one at the same size, it is the Trainer's own figure."""
    return saved + hf_epoch - start_step / max(1, updates_per_epoch)


class MalletrainCallback(TrainerCallback):
    """Reports exact samples per optimizer step and checkpoints at the step a recall is noticed."""

    def __init__(self) -> None:
        self.notice = RecallNotice()
        self.recalled = False
        self._samples = 0  # this rank's samples since the last optimizer step
        self._hook: Any = None
        self._start: tuple[float, int] = (0.0, 0)  # the epoch and the global step this start resumed at

    def _count_batch(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module.training:
            self._samples += batch_size_of((args, kwargs))

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        client.claim_reports()
        model = kwargs.get("model")
        if model is None:
            raise ValueError("MalletrainCallback: the Trainer passed no model to on_train_begin")
        self._hook = model.register_forward_pre_hook(self._count_batch, with_kwargs=True)
        self._samples = 0
        self._start = (float(state.epoch or 0.0), int(state.global_step))
        self.notice.install()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        step = agree(self._samples, self.notice.received, args.device)
        self._samples = 0
        loader = kwargs.get("train_dataloader")
        if state.epoch is not None and loader is not None and hasattr(loader, "__len__"):
            per_epoch = len(loader) // max(1, args.gradient_accumulation_steps)
            state.epoch = epoch_now(*self._start, state.epoch, per_epoch)
        client.report(step.samples, world_size=args.world_size, rank=args.process_index)
        if step.stop:
            self.recalled = True
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self.recalled:
            log.info("recall: saved step %d in %s", state.global_step, args.output_dir)
            raise SystemExit(EXIT_SIGTERM)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.notice.restore()
