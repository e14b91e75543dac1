"""Run a script written for ``torchrun`` unchanged and count its progress: ``python -m malletrain.worker.launch``.

.. code-block:: text

    python -m malletrain.worker.launch SCRIPT [ARGS...]        # as `python SCRIPT ARGS...`
    python -m malletrain.worker.launch -m MODULE [ARGS...]     # as `python -m MODULE ARGS...`

The daemon starts every rank of a ``launcher = "torchrun"`` job this way; the script runs as
``__main__`` unchanged. The launcher counts optimizer steps (``MALLETRAIN_WORKER_BATCH`` x world size
samples a step, until the script reports by itself), makes SIGTERM raise ``SystemExit(143)``, and
ends a process that used ``torch.distributed`` with ``os._exit`` (gloo's teardown can abort or hang).
docs/training.md says more.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import runpy
import signal
import sys
import threading
import traceback
import weakref
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Sequence

from contract.exits import EXIT_SIGTERM  # what a SIGTERM gives a launched script that does not handle it
from contract.workerenv import ENV_WORKER_BATCH, WorkerEnvError, configure_worker_logging, worker_batch_from_environ
from malletrain.worker import client

log = logging.getLogger("malletrain.worker.launch")

USAGE = "usage: python -m malletrain.worker.launch SCRIPT [ARGS...] | -m MODULE [ARGS...]"


class TargetKind(Enum):
    """What the launcher runs: a script file or a module."""

    SCRIPT = "script"
    MODULE = "module"


@dataclass(frozen=True)
class Target:
    """The user's command: a script path or a module name, and its arguments."""

    kind: TargetKind
    name: str
    args: tuple[str, ...] = ()


class LaunchError(ValueError):
    """The launcher's command line or environment is unusable; the message names what."""


def parse_target(argv: Sequence[str]) -> Target:
    """``[SCRIPT, ARGS...]`` or ``[-m, MODULE, ARGS...]`` -> :class:`Target`; :class:`LaunchError` otherwise."""
    if not argv:
        raise LaunchError(f"no script given; {USAGE}")
    if argv[0] == "-m":
        if len(argv) < 2 or not argv[1]:
            raise LaunchError(f"-m without a module; {USAGE}")
        return Target(TargetKind.MODULE, argv[1], tuple(argv[2:]))
    if argv[0].startswith("-"):
        raise LaunchError(f"unknown option {argv[0]!r}; {USAGE}")
    path = Path(argv[0])
    if not path.is_file():
        raise LaunchError(f"script {argv[0]!r} not found (working directory {os.getcwd()})")
    return Target(TargetKind.SCRIPT, argv[0], tuple(argv[1:]))


@dataclass
class StepCounter:
    """Counts optimizer steps of one optimizer and reports ``worker_batch`` x world size per step, each held
    until the next step (or :meth:`flush`): a script's own first report comes first and the held one drops."""

    worker_batch: int
    steps: int = 0
    sent: int = 0
    _held: bool = False
    _optimizer: Any = None  # a weak reference to the optimizer whose steps count
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_step(self, optimizer: Any) -> None:
        """The optimizer-step post hook: count the step of the counted optimizer."""
        with self._lock:
            if client.script_reports():
                self._held = False
                return
            if self._optimizer is None:
                self._optimizer = weakref.ref(optimizer)
            elif self._optimizer() is not optimizer:
                return
            self.steps += 1
            self._send_held()
            self._held = True

    def flush(self) -> None:
        """Send the step still held (the script ended), unless the script reported by itself."""
        with self._lock:
            if client.script_reports():
                self._held = False
                return
            self._send_held()

    def _send_held(self) -> None:
        if not self._held:
            return
        self._held = False
        ctx = client.context()
        if ctx.rank != 0:
            return
        rep = client.reporter()
        if rep is not None and rep.send(self.worker_batch * ctx.world_size, ctx.world_size, ctx.generation):
            self.sent += 1


def _raise_exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    # the first stops the script; a second (the node agent signals the rank's process group, its rank
    # agent the rank) must not raise again while it exits: no "SystemExit: 143" traceback in its log
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(EXIT_SIGTERM)


def run_target(target: Target) -> int:
    """Run ``target`` as ``__main__`` with its own argv and path; its exit code (exceptions propagate)."""
    try:
        if target.kind is TargetKind.SCRIPT:
            sys.argv = [target.name, *target.args]
            sys.path[0] = str(Path(target.name).resolve().parent)
            runpy.run_path(target.name, run_name="__main__")
        else:
            sys.argv = [target.name, *target.args]  # runpy puts the module's file in argv[0]
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exit_code(exc.code)
    return 0


def exit_code(code: object) -> int:
    """The process exit code of ``SystemExit(code)``: None -> 0, an int as is, anything else printed -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def process_group_left() -> bool:
    """True when the script ended with torch's default process group still initialized."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def exit_without_finalizing(code: int) -> NoReturn:
    """End the process as the interpreter would, without tearing down torch's process group (a live gloo
    group can abort finalization, destroying it can deadlock): join threads, run ``atexit``, flush."""
    main = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    deliver_queued_frames()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def deliver_queued_frames() -> None:
    """Let ZeroMQ send what is queued (the last reports) before ``os._exit``: a closed socket's frames
    go out from ZeroMQ's own thread, which only the context's termination waits for."""
    zmq = sys.modules.get("zmq")
    if zmq is None:
        return
    with contextlib.suppress(Exception):
        zmq.Context.instance().destroy(linger=client.LINGER_MS)


def start_counting() -> StepCounter | None:
    """Install the step hook when ``MALLETRAIN_WORKER_BATCH`` is set; say once why not otherwise."""
    worker_batch = worker_batch_from_environ()
    if worker_batch is None:
        log.info("%s is not set: optimizer steps are not counted (the script's own report() calls, "
                 "if any, still are)", ENV_WORKER_BATCH)
        return None
    from torch.optim.optimizer import register_optimizer_step_post_hook

    counter = StepCounter(worker_batch)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: counter.on_step(optimizer))
    log.info("counting optimizer steps: %d samples per worker per step", worker_batch)
    return counter


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, install the hook and the SIGTERM exit, run the script; the script's exit code."""
    configure_worker_logging()
    try:
        target = parse_target(sys.argv[1:] if argv is None else argv)
        counter = start_counting()
    except (LaunchError, WorkerEnvError) as exc:
        print(f"malletrain.worker.launch: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_exit_on_sigterm)  # the script may catch SystemExit and checkpoint
    try:
        code = run_target(target)
    except Exception:
        if not process_group_left():
            raise  # the interpreter prints it and exits 1
        traceback.print_exc()
        code = 1
    finally:
        if counter is not None:
            counter.flush()
            log.info("counted %d optimizer steps, %d reports sent", counter.steps, counter.sent)
        client.close()
    if "torch.distributed" in sys.modules:
        # gloo's threads can abort the interpreter's finalization even after the script destroyed its
        # group ("terminate called without an active exception", SIGABRT: 1 exit in 5 here, torch
        # 2.13), which would make a finished rank look failed
        exit_without_finalizing(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
