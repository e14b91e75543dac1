"""The run loop: join, call the training function, restart it after a rescale or a recovery, exit."""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from malletrain.worker import client
from malletrain.worker.ending import exit_now
from malletrain.worker.elastic.errors import (EXIT_STORE_LOST, LeaveJob, Rescaled, StoreLost, drop_frames, first_line,
                                              is_comm_failure)
from malletrain.worker.elastic.state import State

log = logging.getLogger("malletrain.worker.elastic")

T = TypeVar("T")


def run(train_fn: Callable[..., T], state: State, *args: Any, **kwargs: Any) -> T:
    """Call ``train_fn(state, *args, **kwargs)`` elastically (like ``hvd.elastic.run``): again after every
    rescale or recovery. A worker dropped from the job exits 0, one that lost the store for good 75; the
    gloo group is destroyed however it ends."""
    log.info("worker %s: start (job %s, %s)", state.worker, state.job or "-",
             "elastic" if state.elastic else "single local worker")
    outcome = "error"
    try:
        state.join()
        result = _train(train_fn, state, args, kwargs)
        client.release_reports()  # the training is done: nothing rolls back any more
        outcome = f"the training function returned at step {state.step} ({state.samples} samples)"
        return result
    except LeaveJob as exc:
        log.info("%s", exc)
        exc.__traceback__ = None  # the training function's frames hold the DDP model: free them first
        state.leave()
        outcome = "left the job (not in the new generation)"
        raise SystemExit(0) from None
    except StoreLost as exc:
        log.error("%s; exiting with code %d", exc, EXIT_STORE_LOST)
        exc.__traceback__ = None
        state.leave()
        outcome = f"lost the daemon's store (exit {EXIT_STORE_LOST})"
        raise SystemExit(EXIT_STORE_LOST) from None
    except SystemExit as exc:
        outcome = f"SystemExit({exc.code})"
        # a stop (SIGTERM) or an exit of the script: its frames (which hold the DDP model and so the
        # gloo group) must not outlive the group's teardown below; this traceback tells nobody anything
        exc.__traceback__ = None
        raise
    except BaseException as exc:
        outcome = f"{type(exc).__name__}: {first_line(exc)}"
        raise
    finally:
        state.close()
        log.info("worker %s: exit at step %d, generation %d: %s", state.worker, state.step, state.generation, outcome)
        if state.stopping is not None:
            _exit_now(128 + state.stopping)


def _exit_now(code: int) -> None:
    """End a stopped worker at once: its reports sent, then :func:`exit_now`."""
    client.close()
    exit_now(code)


def _train(train_fn: Callable[..., T], state: State, args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    while True:
        try:
            return train_fn(state, *args, **kwargs)
        except Rescaled:
            continue
        except LeaveJob:
            raise
        except Exception as exc:
            if not state.elastic or not is_comm_failure(exc):
                raise
            # its frames hold the training function's DDP model, and so the failed world's gloo group:
            # freed first, the group's connections close now, so a peer blocked on this worker fails at
            # once (not at its collective timeout) and the survivors rejoin together
            drop_frames(exc)
            state.recover(exc)
