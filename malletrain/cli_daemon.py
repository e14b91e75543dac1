"""CLI: ``daemon``, ``submit``, ``status``, ``cancel``, ``nodes``, ``demo``.

``submit`` and ``cancel`` write to the store directly, so they work while the
daemon is down (it picks the change up when it runs). ``status`` asks the
daemon when one runs (live rates, nodes) and reads the store otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

STATE_HELP = "state directory (store, daemon address); default $MALLETRAIN_STATE_DIR or ~/.malletrain"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("daemon", help="run the daemon (reconcile loop) in the foreground")
    p.add_argument("--config", help="TOML config file (see malletrain/config.py); defaults otherwise")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.add_argument("--duration", type=float, default=None, help="stop after S seconds (default: run until signalled)")
    p.set_defaults(func=cmd_daemon)

    p = sub.add_parser("submit", help="submit a job file (TOML or JSON)")
    p.add_argument("jobfile")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="jobs and nodes, like squeue")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("id")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("nodes", help="the nodes of the running daemon")
    p.add_argument("--state-dir", help=STATE_HELP)
    p.set_defaults(func=cmd_nodes)

    p = sub.add_parser("demo", help="a bounded local demo: 6 nodes, a compressed trace, real PyTorch jobs")
    p.add_argument("--duration", type=float, default=150.0, help="seconds to run (default 150)")
    p.add_argument("--out", default="runs/demo", help="report directory (default runs/demo)")
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--runtime", choices=("torch", "horovod", "toy"), default="torch",
                   help="torch: real PyTorch jobs (default); horovod: Elastic Horovod jobs; "
                        "toy: sleeping workers, no torch")
    p.add_argument("--quiet", action="store_true", help="no live status table")
    p.set_defaults(func=cmd_demo)


def _store(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from malletrain.control import state_dir
    from malletrain.store import Store

    return Store.open(state_dir(args.state_dir) / "store.db")


def cmd_daemon(args: argparse.Namespace) -> int:
    from malletrain.config import DaemonConfig, load_config
    from malletrain.control import state_dir
    from malletrain.daemon import Daemon, DaemonError

    cfg = load_config(args.config) if args.config else DaemonConfig()
    if args.state_dir or not args.config:
        cfg = cfg.with_state_dir(state_dir(args.state_dir))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        daemon = Daemon(cfg)
    except DaemonError as exc:
        print(f"malletrain daemon: error: {exc}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: object) -> None:
        daemon.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"malletrain daemon: pid {os.getpid()}, control {daemon.control_address}, "
          f"state {cfg.state_path}", flush=True)
    try:
        daemon.run(args.duration)
    finally:
        daemon.close()
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from malletrain.jobspec import load_spec

    spec = load_spec(args.jobfile)
    store = _store(args)
    try:
        jid = store.submit(spec)
    finally:
        store.close()
    print(jid)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from malletrain.store import StoreError

    store = _store(args)
    try:
        was = store.request_cancel(args.id)
        now = store.require(args.id).state
    except StoreError as exc:
        print(f"malletrain cancel: error: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    if now.value == "cancelled":
        print(f"{args.id}: cancelled")
    elif now.terminal:
        print(f"{args.id}: already {now.value}")
    else:
        print(f"{args.id}: cancel requested (was {was.value}); the daemon stops its workers")
    return 0


def status_data(args: argparse.Namespace) -> dict[str, Any]:
    from malletrain.control import ask, state_dir

    reply = ask(state_dir(args.state_dir), {"cmd": "status"})
    if reply and reply.get("ok"):
        reply["daemon"] = True
        return reply
    store = _store(args)
    try:
        jobs = [r.as_dict() for r in store.jobs()]
    finally:
        store.close()
    return {"ok": True, "daemon": False, "jobs": jobs, "nodes": []}


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    rows = [("JOBID", "NAME", "STATE", "NODES", "MIN-MAX", "SAMPLES", "TARGET", "RATE/S", "NODELIST")]
    for j in jobs:
        rate = j.get("rate")
        rows.append((
            j["id"], str(j["name"])[:16], j["state"], str(len(j["nodes"])),
            f"{j['min_nodes']}-{j['max_nodes']}", str(j["samples"]),
            str(j["target"] or "-"), f"{rate:.1f}" if rate else "-", ",".join(j["nodes"]) or "-",
        ))
    return _table(rows)


def format_nodes(nodes: list[dict[str, Any]]) -> str:
    return _table([("NODE", "STATE", "JOB")] + [(n["node"], n["state"], n["job"] or "-") for n in nodes])


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    data = status_data(args)
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    print(format_jobs(data["jobs"]))
    if data["daemon"]:
        print()
        print(format_nodes(data["nodes"]))
    else:
        print("\n(daemon not running: states as stored)")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    from malletrain.control import ask, state_dir

    reply = ask(state_dir(args.state_dir), {"cmd": "nodes"})
    if not reply or not reply.get("ok"):
        print("malletrain nodes: no daemon is running on this state dir", file=sys.stderr)
        return 1
    print(format_nodes(reply["nodes"]))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from malletrain.demo import run_demo

    return run_demo(args.out, args.duration, args.nodes, args.runtime, live=not args.quiet)
