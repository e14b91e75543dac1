"""CLI: ``daemon``, ``submit``, ``status``, ``cancel``, ``nodes``, ``demo``, ``config check``.

``submit`` and ``cancel`` write the store directly, so they work while the daemon is down. ``status``
asks a running daemon (else reads the store), and says why a job failed or stopped short and where its
worker logs are. Text from jobs is printed with control characters escaped, so a job cannot drive
the operator's terminal."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from malletrain.cli.sweep import STATE_HELP, ask_daemon, open_store, refused, state_of
from malletrain.cli.status_view import (  # noqa: F401  (re-exported for callers)
    LOG_DIR, format_details, format_jobs, format_nodes, job_logs, job_note, printable,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("daemon", help="run the daemon (reconcile loop) in the foreground",
                       description="Run the daemon in the foreground: hold idle nodes through the configured "
                       "backend and train the submitted jobs on them until SIGTERM or --duration.")
    p.add_argument("--config", metavar="FILE",
                   help="TOML config file (every key: docs/operators.md, or `malletrain config check FILE`); "
                   "without it the defaults: 6 local nodes following a synthetic trace")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds (default: run until signalled)")
    p.set_defaults(func=cmd_daemon)

    p = sub.add_parser("submit", help="submit a job file (TOML or JSON)",
                       description="Submit a job file (TOML or JSON; fields: docs/operators.md) and print its id. "
                       "Works while no daemon runs: the job waits in the store.")
    p.add_argument("jobfile", help="the job file (name, command, min_nodes, max_nodes, samples, ...); "
                   "with a [sweep] table, a search: one job a trial (docs/training.md, Sweeps)")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.add_argument("--array", metavar="INDICES",
                   help="a job array: one job per index (0-19, 0-19:2, 1,3,5); each gets MALLETRAIN_ARRAY_INDEX "
                   "and {index} in its command; prints the array's id (cancel takes it)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="jobs and nodes, like squeue; why jobs failed and where their logs are",
                       description="Print every job (state, nodes, samples, rate, why it waits or failed, "
                       "its log files) and, when a daemon runs, every node. Reads the store when none runs.")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--elements", action="store_true", help="each element of a job array on its own line "
                   "(default: one line an array)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("wait", help="wait until a job has trained N samples; say why if it ends first",
                       description="Wait until job ID has trained --samples samples (exit 0); exit 1 with the "
                       "reason when it ends first, time runs out or no daemon is running.")
    p.add_argument("id", help="the job id `malletrain submit` printed (e.g. j000001)")
    p.add_argument("--samples", type=int, default=1, help="samples to wait for (default 1: it trains)")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after S seconds (default 600)")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("config", help="daemon configuration files",
                       description="Check daemon configuration files.")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    c = csub.add_parser("check", help="validate a daemon config file and print the effective config",
                        description="Validate a daemon config file (an error names the bad key) and print "
                        "the effective config, defaults filled in.")
    c.add_argument("file", help="the daemon's TOML config file")
    c.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    c.set_defaults(func=cmd_config_check)

    p = sub.add_parser("cancel", help="cancel a job",
                       description="Cancel a job: the daemon stops its workers and releases its nodes. "
                       "Works while no daemon runs (the store records the request).")
    p.add_argument("id", help="the job id (e.g. j000001), an array's id (a000001: every element), an "
                   "element's (a000001_3) or a sweep's name (every trial; it opens no more)")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("nodes", help="the nodes of the running daemon",
                       description="Print the nodes the running daemon holds: state, job, trainer.")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("demo", help="a bounded local demo: 6 nodes, a compressed trace, real PyTorch jobs",
                       description="Run the daemon for --duration seconds on local nodes whose idleness follows "
                       "a synthetic Summit-like trace (5x real time), with three small training jobs; print "
                       "a status table every 10 s and write report.md, report.json and nodes.png to --out.")
    p.add_argument("--duration", type=float, default=150.0, help="seconds to run (default 150)")
    p.add_argument("--out", default="runs/demo", help="report directory (default runs/demo)")
    p.add_argument("--nodes", type=int, default=6, help="local nodes (default 6)")
    p.add_argument("--runtime", choices=("torch", "horovod", "toy"), default="torch",
                   help="torch: real PyTorch jobs (default); horovod: Elastic Horovod jobs; "
                        "toy: sleeping workers, no torch")
    p.add_argument("--quiet", action="store_true", help="no live status table")
    p.add_argument("--policy", choices=("malletrain", "jpa"), default="malletrain",
                   help="malletrain: the daemon's default policy; jpa: the paper's (profile every job)")
    p.set_defaults(func=cmd_demo)


def cmd_daemon(args: argparse.Namespace) -> int:
    from malletrain.daemon.config import DaemonConfig, load_config
    from malletrain.daemon.control import state_dir
    from malletrain.daemon import Daemon, DaemonError

    cfg = load_config(args.config) if args.config else DaemonConfig()
    if args.state_dir or not args.config:
        cfg = cfg.with_state_dir(state_dir(args.state_dir))
    from malletrain.daemon.logs import setup_logging

    setup_logging(cfg.log.format, cfg.log.level)  # [log]: text (default) or JSON lines, on stderr
    try:
        daemon = Daemon(cfg)
    except DaemonError as exc:
        print(f"malletrain daemon: error: {exc}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: object) -> None:
        daemon.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    metrics = getattr(getattr(daemon, "metrics", None), "address", "")
    print(f"malletrain daemon: pid {os.getpid()}, control {daemon.control_address}, "
          f"state {cfg.state_path}" + (f", metrics http://{metrics}/metrics" if metrics else ""), flush=True)
    try:
        daemon.run(args.duration)
    finally:
        daemon.close()
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from malletrain.daemon.config import check_files, load_config, to_json, to_toml

    cfg = load_config(args.file)
    check_files(cfg, args.file)
    if args.json:
        print(to_json(cfg))
    else:
        print(f"# {args.file}: valid; effective config (defaults filled in); state dir {cfg.state_path}")
        print(f"# metrics: {'http://' + cfg.metrics.address + '/metrics' if cfg.metrics.enabled else 'off'}; "
              f"log: {cfg.log.format} at level {cfg.log.level} on stderr")
        print(to_toml(cfg), end="")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    """Through the running daemon (it records the caller, from the kernel, as the owner);
    straight into the store only when no daemon answers (then only the store's owner can)."""
    import json

    from malletrain.cli.sweep import submit_group
    from malletrain.daemon.jobspec import load_spec
    from malletrain.daemon.submitcheck import check_command

    grouped = submit_group(args)  # an array (--array) or a [sweep] search: many jobs of one file
    if grouped is not None:
        return grouped
    spec = load_spec(args.jobfile)  # the interpreter rule: `python` -> this Python (jobspec.py)
    check_command(spec.command, spec.cwd or os.getcwd(), spec.env, args.jobfile)  # its script is there
    from malletrain.daemon.statedir import current_umask

    reply = ask_daemon(args, {"cmd": "submit", "spec": json.loads(spec.to_json()), "umask": current_umask()})
    if refused(reply, "submit"):
        return 1
    if reply is None:
        with open_store(args) as store:
            reply = {"id": store.submit(spec, owner_uid=os.geteuid(), owner_gid=os.getegid())}
    print(reply["id"])
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Through the running daemon (only the job's owner or an admin may); straight into the
    store only when no daemon answers."""
    from malletrain.daemon.arrays import is_array_ref
    from malletrain.daemon.store import StoreError

    if is_array_ref(args.id):
        return _cancel_array(args)
    reply = ask_daemon(args, {"cmd": "cancel", "id": args.id})
    if reply is not None and reply.get("sweep") or reply is None and _stored_sweep(args):
        return _cancel_sweep(args, reply)
    if refused(reply, "cancel"):
        return 1
    if reply is not None:
        now, was = str(reply["state"]), str(reply["was"])
    else:
        with open_store(args) as store:
            try:
                was = store.request_cancel(args.id).value
                now = store.require(args.id).state.value
            except StoreError as exc:
                print(f"malletrain cancel: error: {exc} (no daemon is running at {state_of(args)}; its store "
                      "has no such job)", file=sys.stderr)
                return 1
    if now == "cancelled":
        print(f"{args.id}: cancelled")
    elif now in ("completed", "failed"):
        print(f"{args.id}: already {now}")
    else:
        print(f"{args.id}: cancel requested (was {was}); the daemon stops its workers")
    return 0


def _stored_sweep(args: argparse.Namespace) -> bool:
    """With no daemon running: whether ``args.id`` names a sweep and no job."""
    from malletrain.daemon.sweepfile import registered

    with open_store(args) as store:
        return store.get(args.id) is None and args.id in registered(store)


def _cancel_sweep(args: argparse.Namespace, reply: dict[str, Any] | None) -> int:
    """``cancel`` of a sweep: every trial job not ended is stopped and no trial is opened again."""
    from malletrain.daemon.sweepfile import cancel

    if reply is not None:
        jobs = list(reply.get("jobs") or [])
    else:
        with open_store(args) as store:
            jobs = cancel(store, args.id)
    print(f"sweep {args.id}: cancelled; {len(jobs)} trial job(s) stopped or ended, no trial is opened again "
          f"(malletrain sweep show {args.id})")
    return 0


def _cancel_array(args: argparse.Namespace) -> int:
    """``cancel`` of an array (every element) or one element (``a000001_3``)."""
    from malletrain.daemon.arrays import resolve

    reply = ask_daemon(args, {"cmd": "cancel", "id": args.id})
    if refused(reply, "cancel"):
        return 1
    if reply is not None:
        jobs = list(reply.get("jobs") or [])
    else:
        with open_store(args) as store:
            jobs = resolve(store.jobs(), args.id)
            for jid in jobs:
                store.request_cancel(jid)
    if not jobs:
        print(f"malletrain cancel: error: no array element {args.id} at {state_of(args)}", file=sys.stderr)
        return 1
    print(f"{args.id}: cancel requested for {len(jobs)} job(s) ({jobs[0]}{' to ' + jobs[-1] if len(jobs) > 1 else ''})")
    return 0


def status_data(args: argparse.Namespace) -> dict[str, Any]:
    """The daemon's status (live) or the store's; each job gets ``logs`` (its log files, newest last)
    and ``note`` (why it failed or stopped short of its target, or None)."""
    from malletrain.daemon.control import ask

    state = state_of(args)  # absolute: log paths printed in full
    if not state.is_dir():  # a typo must not look like "no jobs" (nor leave a new empty state dir behind)
        raise FileNotFoundError(f"no state dir at {state} (no daemon has run there; give the one the daemon "
                                "uses with --state-dir or MALLETRAIN_STATE_DIR)")
    reply = ask(state, {"cmd": "status"})
    if reply and reply.get("ok"):
        reply["daemon"] = True
    else:
        with open_store(args) as store:
            jobs = [{**r.as_dict(), "trainer": r.spec.trainer} for r in store.jobs()]  # None: the first
        reply = {"ok": True, "daemon": False, "jobs": jobs, "nodes": []}
    reply["log_dir"] = str(state / LOG_DIR)
    reply["state_dir"] = str(state)
    for j in reply["jobs"]:
        j["logs"] = [str(p) for p in job_logs(state, str(j["id"]))]
        j["note"] = job_note(j)
    from malletrain.cli.sweep import group_status

    group_status(args, reply)  # `arrays`: one summary an array; `sweeps`: each search's trials and best
    return reply


def cmd_status(args: argparse.Namespace) -> int:
    import json

    data = status_data(args)
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    from malletrain.cli.sweep import print_groups

    shown = [j for j in data["jobs"] if getattr(args, "elements", False) or not j.get("array_id")]
    print(format_jobs(shown))
    print_groups(data)  # one line an array (--elements: each element above), one a sweep
    print()
    print(format_details(data["jobs"], data["log_dir"]))
    if data["daemon"]:
        print()
        print(format_nodes(data["nodes"]))
    else:
        print(f"\n(no daemon is running at {data['state_dir']}: job states as stored)")
    return 0


WAIT_POLL_S = 0.5
NO_DAEMON_GRACE_S = 30.0  # a job that no daemon drives fails `wait` after this long, saying so


def cmd_wait(args: argparse.Namespace) -> int:
    """0 once the job has trained ``--samples`` (per the store); 1 if it ended first or time ran out."""
    import time

    from malletrain.daemon.store import StoreError

    state = state_of(args)
    deadline = time.monotonic() + max(0.0, args.timeout)
    with open_store(args) as store:  # one connection: each read sees the daemon's latest commit (WAL)
        try:
            return _wait_loop(args, store, state, deadline)
        except StoreError as exc:  # e.g. no such job: say which state dir was asked
            raise StoreError(f"{exc} in the store at {state}") from None


def _wait_loop(args: argparse.Namespace, store: Any, state: Path, deadline: float) -> int:
    import time

    from malletrain.daemon.control import ask

    daemon_seen = time.monotonic()  # when a daemon last answered (or when waiting began)
    while True:
        rec = store.require(args.id)
        j = rec.as_dict()
        if rec.samples >= args.samples:
            print(f"{printable(rec.id)}: {rec.state.value}, {rec.samples:,} samples")
            return 0
        now = time.monotonic()
        if not rec.state.terminal and ask(state, {"cmd": "ping"}, timeout_s=5.0) is not None:
            daemon_seen = now
        no_daemon = now - daemon_seen >= min(NO_DAEMON_GRACE_S, max(0.0, args.timeout))
        if rec.state.terminal or now >= deadline or no_daemon:
            j["logs"] = [str(p) for p in job_logs(state, rec.id)]
            j["note"] = job_note(j) or (rec.message if rec.state.terminal else None)
            why = "ended" if rec.state.terminal else f"timed out after {args.timeout:g} s"
            if no_daemon and not rec.state.terminal:
                why = (f"is not driven: no daemon is running at {state} (start one with "
                       f"`malletrain daemon --state-dir {state}`)")
            elif rec.state.value == "pending":
                why += " (pending: the daemon found no idle node for it; see `malletrain nodes`)"
            print(f"malletrain wait: {printable(rec.id)} {why} at {rec.samples:,} of {args.samples:,} samples "
                  f"(state {rec.state.value})", file=sys.stderr)
            if j["note"] or rec.state.value == "failed":
                j["note"] = j["note"] or "no reason stored"
                print(format_details([j], str(state / LOG_DIR)), file=sys.stderr)
            return 1
        time.sleep(WAIT_POLL_S)


def cmd_nodes(args: argparse.Namespace) -> int:
    from malletrain.daemon.control import ask, state_dir

    state = state_dir(args.state_dir)
    reply = ask(state, {"cmd": "nodes"})
    if not reply or not reply.get("ok"):
        print(f"malletrain nodes: no daemon is running at {state}", file=sys.stderr)
        return 1
    print(format_nodes(reply["nodes"]))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from malletrain.cli.demo import run_demo

    return run_demo(args.out, args.duration, args.nodes, args.runtime, live=not args.quiet, policy=args.policy)
