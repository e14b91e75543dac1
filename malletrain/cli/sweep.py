"""CLI: ``submit --array SPEC`` and a job file with a ``[sweep]`` table (the part of ``submit`` that
makes many jobs of one file), ``sweep show NAME``, and the arrays' and sweeps' lines of ``status``.

Through the running daemon when one answers (it records the caller as the owner); straight into the
store when none does, as ``submit`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

STATE_HELP = "state directory (store, daemon address); default $MALLETRAIN_STATE_DIR or ~/.malletrain"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="hyperparameter searches ([sweep] job files)",
                       description="Look at the searches submitted as job files with a [sweep] table.")
    ssub = p.add_subparsers(dest="sweep_command", metavar="ACTION", required=True)
    s = ssub.add_parser("show", help="a sweep's trials (number, values, state, value) and the best",
                        description="Print a sweep's trials (number, values, state, value, job) and its best trial.")
    s.add_argument("name", help="the sweep's name (the job file's name, or its [sweep] name)")
    s.add_argument("--state-dir", help=STATE_HELP)
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_sweep_show)


def state_of(args: argparse.Namespace) -> Path:
    """``--state-dir``, else ``$MALLETRAIN_STATE_DIR``, else ``~/.malletrain``, as an absolute path."""
    from malletrain.daemon.control import state_dir

    return state_dir(args.state_dir).absolute()


def ask_daemon(args: argparse.Namespace, req: dict[str, Any]) -> dict[str, Any] | None:
    """The daemon's reply to ``req``, or None if no daemon answers on the control socket."""
    from malletrain.daemon.control import ask, state_dir

    return ask(state_dir(args.state_dir), req, timeout_s=30.0)


def refused(reply: dict[str, Any] | None, command: str) -> bool:
    """Whether the daemon answered ``command`` with an error (printed, as ``malletrain COMMAND: error: ...``)."""
    if reply is None or reply.get("ok"):
        return False
    print(f"malletrain {command}: error: {reply.get('error', reply)}", file=sys.stderr)
    return True


def open_store(args: argparse.Namespace) -> closing[Any]:
    """The state dir's store, for a ``with`` block that closes it."""
    from malletrain.daemon.store import Store

    return closing(Store.open(state_of(args) / "store.db"))


def submit_group(args: argparse.Namespace) -> int | None:
    """``submit`` of an array or a sweep (its exit code), or None for a plain job file."""
    from malletrain.daemon.sweepfile import load_sweep_file

    group = load_sweep_file(args.jobfile)
    array = getattr(args, "array", None)
    if group is not None and array is not None:
        raise ValueError(f"{args.jobfile}: --array and a [sweep] table do not go together")
    if array is not None:
        return _submit_array(args, array)
    if group is not None:
        return _submit_sweep(args, *group)
    return None


def _submit_array(args: argparse.Namespace, text: str) -> int:
    from malletrain.daemon.arrays import element_spec, parse_indices, submit_array
    from malletrain.daemon.jobspec import load_spec
    from malletrain.daemon.submitcheck import check_command

    indices = parse_indices(text)
    spec = load_spec(args.jobfile)
    first = element_spec(spec, "a000000", indices[0])
    check_command(first.command, first.cwd or os.getcwd(), first.env, args.jobfile)
    reply = ask_daemon(args, {"cmd": "submit", "spec": json.loads(spec.to_json()) | {"array": text}})
    if refused(reply, "submit"):
        return 1
    if reply is not None:
        array_id, jobs = str(reply["id"]), list(reply["jobs"])
    else:
        with open_store(args) as store:
            array_id, jobs = submit_array(store, spec, indices, os.geteuid(), os.getegid())
    print(f"{array_id}: {len(jobs)} jobs, {jobs[0]} to {jobs[-1]}")
    return 0


def _submit_sweep(args: argparse.Namespace, spec: Any, sweep: Any) -> int:
    from malletrain.daemon.submitcheck import check_command
    from malletrain.daemon.sweepfile import check_registration, example_values, register, trial_spec

    check_registration(spec, sweep, args.jobfile)
    example = trial_spec(spec, sweep, 0, example_values(sweep))
    check_command(example.command, example.cwd or os.getcwd(), example.env, args.jobfile)
    reply = ask_daemon(args, {"cmd": "submit", "spec": json.loads(spec.to_json()) | {"sweep": sweep.to_table()}})
    if refused(reply, "submit"):
        return 1
    if reply is None:
        with open_store(args) as store:
            register(store, spec, sweep, os.geteuid(), os.getegid())
    print(f"sweep {sweep.name}: {sweep.trials} trials ({sweep.direction}, sampler {sweep.sampler}); "
          f"`malletrain sweep show {sweep.name}`")
    return 0


def group_status(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Add ``arrays`` (one summary an array) and, without a daemon, ``sweeps`` to ``status`` data."""
    from malletrain.daemon.arrays import summary

    data["arrays"] = summary(data["jobs"])
    if "sweeps" in data:
        return
    from malletrain.daemon.sweepfile import SweepError, registered, show

    with open_store(args) as store:
        out = []
        for name in registered(store):
            try:
                out.append(show(state_of(args), store, name))
            except SweepError as exc:
                out.append({"name": name, "error": str(exc), "trials": [], "best": None})
        data["sweeps"] = out


def print_groups(data: dict[str, Any]) -> None:
    """The arrays' and sweeps' tables under the job table."""
    from malletrain.cli.group_view import format_arrays, format_sweeps

    if data.get("arrays"):
        print()
        print(format_arrays(data["arrays"]))
    if data.get("sweeps"):
        print()
        print(format_sweeps(data["sweeps"]))


def cmd_sweep_show(args: argparse.Namespace) -> int:
    from malletrain.cli.group_view import format_sweep
    from malletrain.daemon.sweepfile import SweepError, show

    reply = ask_daemon(args, {"cmd": "status"})
    if reply is not None and reply.get("ok") and "sweeps" in reply:
        found = [s for s in reply["sweeps"] if s.get("name") == args.name]
        if not found:
            known = ", ".join(s.get("name", "?") for s in reply["sweeps"]) or "none"
            raise SweepError(f"no sweep {args.name!r} (sweeps: {known})")
        data = found[0]
    else:
        with open_store(args) as store:
            data = show(state_of(args), store, args.name)
    if data.get("error") and not data.get("trials"):
        raise SweepError(f"sweep {args.name}: {data['error']}")
    print(json.dumps(data, indent=1) if args.json else format_sweep(data))
    return 0
