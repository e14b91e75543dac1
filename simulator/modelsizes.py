"""How many MB a checkpoint of each Pollux model holds: what a rescale broadcasts and a restart loads. Each figure is
the float32 state dict (4 bytes a parameter, 1 MB = 10^6 bytes; optimizer state left out, as
``benchmarks/bench_checkpoint.py`` does) of the model class the Pollux measurements trained, from the parameter count of
the published architecture: ``bert`` BERT-base (uncased, SQuAD fine-tuning head; the reference release's ``BertModel``);
``cifar10`` the CIFAR-10 ResNet-18 (3x3 stem, no max-pool, 10-way head); ``deepspeech2`` as ``deepspeech.pytorch``'s
default (2 conv layers, 5 bidirectional LSTMs of 1024, outputs summed, 29 characters), counted from its layer shapes (an
estimate: no released state dict was weighed); ``imagenet`` torchvision's ResNet-50; ``ncf`` NeuMF on MovieLens-1M
(6,040 users, 3,706 items, GMF factor 8, MLP 64-32-16-8), counted from its layer shapes; ``yolov3`` YOLOv3 (Darknet-53
backbone, 80 classes). A model not named here (a user's own curve) has no checkpoint size: its rescales and restarts pay
the calibration's figures alone."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

BYTES_PER_PARAM = 4  # float32
_PARAMS = {
    "bert": 109_482_240, "cifar10": 11_173_962, "deepspeech2": 86_600_000, "imagenet": 25_557_032, "ncf": 392_601,
    "yolov3": 61_949_149,
}
CHECKPOINT_MB: Mapping[str, float] = MappingProxyType(
    {model: params * BYTES_PER_PARAM / 1e6 for model, params in _PARAMS.items()})


def checkpoint_mb(model: str) -> float:
    """MB of ``model``'s checkpoint (0 for a model of unknown size)."""
    return CHECKPOINT_MB.get(model, 0.0)
