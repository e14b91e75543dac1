"""What the framework callbacks share: notice of a recall, and one agreement of all ranks per step.

SIGTERM becomes a flag (:class:`RecallNotice`); :func:`agree` sums samples and flags over all ranks in
one all-reduce a step, so all save at the same step and exit 143, never 0. Torch only inside :func:`agree`.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from collections.abc import Mapping
from types import FrameType
from typing import Any, Callable

from contract.exits import EXIT_SIGTERM  # a rank that saved its checkpoint on notice of a recall

log = logging.getLogger("malletrain.worker.integrations")


class RecallNotice:
    """A SIGTERM handler that only notes the signal (:attr:`received`); install it in the main thread."""

    def __init__(self) -> None:
        self.received = False
        self._previous: Callable[[int, FrameType | None], Any] | int | None = None
        self._installed = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if not self.received:
            log.info("SIGTERM: finishing this step, then saving a checkpoint and exiting %d", EXIT_SIGTERM)
        self.received = True

    def install(self) -> None:
        """Catch SIGTERM from now on (the handler it replaces comes back with :meth:`restore`)."""
        if self._installed:
            return
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._note)
        self._installed = True

    def restore(self) -> None:
        """Put the SIGTERM handler from before :meth:`install` back (training ended normally)."""
        if not self._installed:
            return
        signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        self._installed = False


@dataclass(frozen=True)
class StepAgreement:
    """What all ranks agree on at the end of one optimizer step."""

    samples: int
    """Samples all ranks trained in the step (the sum of the real batch sizes)."""
    stop: bool
    """Some rank got notice of a recall: every rank saves and exits at this step."""


def agree(local_samples: int, stop: bool, device: Any = None) -> StepAgreement:
    """Sum ``local_samples`` and the stop flags over the default process group (one all-reduce);
    without one (a single process) the local values."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return StepAgreement(local_samples, stop)
    both = torch.tensor([local_samples, int(stop)], dtype=torch.int64, device=device)
    dist.all_reduce(both)
    return StepAgreement(int(both[0]), bool(both[1]))


def batch_size_of(batch: Any) -> int:
    """Samples in one batch: the first dimension of its first tensor (in a tensor, a mapping such as
    ``{"input_ids": ..., "labels": ...}``, or a list/tuple such as ``(x, y)``)."""
    found = _first_tensor(batch)
    if found is None:
        raise TypeError(f"cannot tell the size of a batch of type {type(batch).__name__}: no tensor in it")
    if found.dim() == 0:
        raise TypeError("cannot tell the size of a batch whose first tensor is a scalar")
    return int(found.shape[0])


def _first_tensor(batch: Any) -> Any:
    if hasattr(batch, "shape") and hasattr(batch, "dim"):
        return batch
    if isinstance(batch, Mapping):
        items = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
    else:
        return None
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None
