"""The ``torch`` runtime, worker side: elastic data-parallel training with plain PyTorch.

.. code-block:: python

    from malletrain.worker.client import report
    from malletrain.worker.elastic import State, run

    def train(state: State) -> None:
        model = state.ddp()                      # DDP for the current world
        while state.samples < total:
            loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
            state.step += 1; state.samples += global_batch
            report(global_batch)                 # the one line
            state.commit()                       # rescale point

    run(train, State(model, opt))

Workers stay alive across rescales: :meth:`State.commit` snapshots the state and switches every
rank to a newer generation at the same step; a lost peer rolls back to the last commit, a daemon
restart is ridden out for up to ``MALLETRAIN_STORE_GRACE``. docs/training.md tells the whole story.
Outside malletrain (no ``MALLETRAIN_STORE``) the same script runs as one local worker.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names below load their module on first use: the rank agent imports the errors and the rendezvous
# (no torch) without paying for torch, which the snapshot and the state need.
_EXPORTS = {
    **dict.fromkeys(("EXIT_STORE_LOST", "LeaveJob", "Rescaled", "StoreLost", "StoreUnavailable", "is_comm_failure",
                     "is_store_loss"), "errors"),
    "run": "loop",
    **dict.fromkeys(("HANDOVER_WAIT_S", "POLL_S", "PUBLISH_POLL_S", "RECONNECT_EVERY_S", "Rendezvous"), "rendezvous"),
    **dict.fromkeys(("CheckpointError", "Snapshot", "broadcast_snapshot", "decode_checkpoint", "encode_checkpoint"),
                    "snapshot"),
    **dict.fromkeys(("MAX_RECOVERIES_WITHOUT_COMMIT", "RescaleEvent", "State"), "state"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'malletrain.worker.elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"malletrain.worker.elastic.{module}"), name)
    globals()[name] = value
    return value
