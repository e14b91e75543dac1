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

Workers stay alive across rescales. At :meth:`State.commit` the state
(model, optimizer and counters) is snapshot in memory and rank 0 reads the
job's generation from the daemon's store (:mod:`malletrain.runtimes.torch_elastic`)
and broadcasts its decision, so every rank switches at the same step. A switch
happens once all members of the new generation have connected (new workers are
started ahead and wait): the old gloo group is destroyed, workers not in the new
member list leave (``SystemExit(0)`` from :func:`run`), the others meet at a
store barrier, create a gloo group for the new world (its rendezvous served by
the world's rank 0, never by the daemon's store) and take the state of the member with the newest commit (a survivor). Then
:meth:`commit` raises :class:`Rescaled` and :func:`run` calls the training
function again, which picks up the counters and wraps the model in a new DDP.

On a recall a peer dies: a collective fails at once ("connection closed by
peer") or after the short collective timeout (``MALLETRAIN_COLLECTIVE_TIMEOUT``,
3 s). :func:`run` then rolls back to the last commit, waits for the next
generation (the job manager publishes it after the recall) and re-joins.

A daemon restart (even ``kill -9``) takes the store away. Training goes on:
rank 0's check at a commit fails soft while a background thread probes the
store's address every half second (nothing on the training thread waits for
it); a store operation a worker cannot do without (a switch, a wait for a
generation) waits for the store to come back. Once it is back (a new, empty
store on the same port), rank 0 marks its whole world ready and reports its
generation, the daemon publishes the re-adopted workers as a newer generation
and the world takes its number at its next commit (the same world: no new
group, no rollback), keeping every step. If the store stays away longer than ``MALLETRAIN_STORE_GRACE``
(60 s), the workers exit with code 75 (:data:`EXIT_STORE_LOST`).

On SIGTERM (a stop or a recall; often twice) rank 0 leaves its last commit in
the store and the worker exits 143 at once; a second signal is ignored. Reports
(:func:`malletrain.worker.client.report`) are held until their step is committed, so a
rollback never counts a sample twice.

Outside malletrain (no ``MALLETRAIN_STORE``) the same script runs as a
single worker in a one-process gloo group.

Modules: :mod:`~contract.storekeys` (the store's key schema),
:mod:`~contract.wire` (the store's authenticated channel and client),
:mod:`~malletrain.worker.elastic.rendezvous` (a worker's keys, reconnection, checkpoints in
the store), :mod:`~malletrain.worker.elastic.snapshot` (committed state,
its broadcast and its safe checkpoint bytes), :mod:`~malletrain.worker.elastic.state`
(:class:`State`: join, commit, switch, recover, leave), :mod:`~malletrain.worker.elastic.loop`
(:func:`run`) and :mod:`~malletrain.worker.elastic.errors`. Nothing here unpickles
bytes another process sent: the state a world broadcasts when it forms and the
checkpoints in the store are both ``torch.save`` bytes read with
``weights_only=True``. The environment variables a
worker reads are in :mod:`contract.workerenv`.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names below load their module on first use: the rank agent imports the errors and the rendezvous
# (no torch) without paying for torch, which the snapshot and the state need.
_EXPORTS = {
    "EXIT_STORE_LOST": "errors",
    "LeaveJob": "errors",
    "Rescaled": "errors",
    "StoreLost": "errors",
    "StoreUnavailable": "errors",
    "is_comm_failure": "errors",
    "is_store_loss": "errors",
    "run": "loop",
    "HANDOVER_WAIT_S": "rendezvous",
    "POLL_S": "rendezvous",
    "PUBLISH_POLL_S": "rendezvous",
    "RECONNECT_EVERY_S": "rendezvous",
    "Rendezvous": "rendezvous",
    "CheckpointError": "snapshot",
    "Snapshot": "snapshot",
    "broadcast_snapshot": "snapshot",
    "decode_checkpoint": "snapshot",
    "encode_checkpoint": "snapshot",
    "MAX_RECOVERIES_WITHOUT_COMMIT": "state",
    "RescaleEvent": "state",
    "State": "state",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'malletrain.worker.elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"malletrain.worker.elastic.{module}"), name)
    globals()[name] = value
    return value
