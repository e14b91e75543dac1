"""The ``malletrain`` command: one subcommand per module, registered below.

Each of ``malletrain.cli``'s command modules (daemon, simulate, sweep, trace) exposes
``register(subparsers)``, which adds its subcommands and sets ``func(args) -> int`` on them.
Heavy imports (torch, matplotlib, zmq) happen inside the handlers, so ``malletrain --help`` is fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from malletrain import __version__
from malletrain.cli import daemon as cli_daemon
from malletrain.cli import simulate as cli_simulate
from malletrain.cli import sweep as cli_sweep
from malletrain.cli import trace as cli_trace

MODULES = (cli_trace, cli_simulate, cli_daemon, cli_sweep)


class UserError(Exception):
    """A bad input from the command line; printed without a traceback."""


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors printed as one line naming the bad input, exit code 2: ValueError (ConfigError, JobSpecError,
    bad arguments), StoreError (an unusable store), ControlError (a socket this user may not use)."""
    from malletrain.daemon.control import ControlError
    from malletrain.daemon.store import StoreError

    return (UserError, ValueError, FileNotFoundError, StoreError, ControlError)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit finds no closed pipe (no traceback)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="malletrain",
        description="Train elastic deep-learning jobs on a supercomputer's idle nodes.",
    )
    parser.add_argument("--version", action="version", version=f"malletrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    errors = _user_errors()
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # here, not at exit: a reader that went away is handled below
        return code
    except BrokenPipeError:  # `malletrain status | head`: the reader has what it wanted
        _quiet_stdout()
        return 141  # (128 + SIGPIPE, as a shell tool killed by it)
    except errors as exc:
        print(f"malletrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"malletrain {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
