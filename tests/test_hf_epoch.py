"""Hugging Face's epoch counter carried across a restart at another size (one process, real Trainer).

The Trainer counts epochs in optimizer steps; a restart with fewer samples a step (a smaller world,
here a smaller batch: the same steps-per-epoch change) put the epoch back (1.5, then 0.875). With
the callback the epoch goes on from the checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from malletrain.worker.integrations.huggingface import epoch_now  # noqa: E402


def _train(out: Path, batch: int, max_steps: int) -> None:
    from transformers import Trainer, TrainingArguments

    from malletrain.worker.examples.hf_train import Regression, TinyRegressor
    from malletrain.worker.integrations.huggingface import MalletrainCallback, last_checkpoint

    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=batch, max_steps=max_steps,
                             use_cpu=True, save_strategy="steps", save_steps=max_steps, logging_strategy="no",
                             report_to="none", disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=TinyRegressor(), args=args, train_dataset=Regression(16),
                      callbacks=[MalletrainCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(out))


def _epoch(out: Path, step: int) -> float:
    return float(json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())["epoch"])


def test_the_epoch_goes_on_across_a_restart_at_another_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train(out, batch=4, max_steps=6)  # 4 steps an epoch: 1.5 epochs
    assert _epoch(out, 6) == pytest.approx(1.5)
    _train(out, batch=2, max_steps=7)  # 8 steps an epoch from here: one more step is 1/8 of an epoch
    assert _epoch(out, 7) == pytest.approx(1.625)  # the Trainer alone: 0.875


def test_epoch_now() -> None:
    assert epoch_now(0.0, 0, 0.25, 4) == 0.25  # a first start: the Trainer's own figure
    assert epoch_now(1.5, 6, 1.75, 4) == pytest.approx(1.75)  # a restart at the same size: the same
    assert epoch_now(1.5, 6, 0.875, 8) == pytest.approx(1.625)  # at another size: carried on
