"""Fair share between two local users on the local backend; the last line is the figure.

    python benchmarks/bench_fairness.py [--short] [--nodes 4] [--window 120] [--baseline]

A root daemon (local backend, torch runtime, ``--nodes`` nodes, the default ``[policy]``: fair share on).
Root submits a job that declares a curve a million times superlinear (``scaling = {1 = 1.0, N = 1e6}``)
and trains nothing (it joins and holds its nodes): it takes every node. Once it holds them all, another local user (``nobody``,
through ``setpriv``, as the attack suite's parts submit: :func:`harness.cli`) submits a
job that joins and holds what it is given (the faults benchmark's joining job, the same file). Measured from that submit: X, the seconds until the late job holds a node; S, its nodes
``--window`` s later; F, the fair share (the nodes over two users); L, the lying job's nodes then.
Targets: X <= 30 s, S >= 0.8 x F, L <= F (exit 1 when one is missed). ``--baseline`` first runs the
same with ``fairness = "none"`` (the rule off: the late job is expected to wait with no node).
``--short``: a 45 s window (the shares hold from ``fair_wait_s`` on; the line says the window).

Last line: ``fairness: late user's first node after X s, share after W s S (fair share F), lying
job's share L``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import harness as B

sys.path.insert(0, str(Path(__file__).resolve().parent / "attacks"))  # the shares part of the attack suite

from faults_shares import CONFIG as SHARES_CONFIG  # noqa: E402
from faults_shares import VICTIM as JOINS  # noqa: E402
from faults_common import submit_file  # noqa: E402
from faults_shares import _py_job  # noqa: E402


def config(nodes: int, fairness: str) -> str:
    """The shares part's daemon config (the torch runtime, no trace) with the rule named."""
    return SHARES_CONFIG.format(runtime="torch", nodes=nodes) + f'[policy]\nfairness = "{fairness}"\n'


CLAIM = "scaling = {{ 1 = 1.0, {nodes} = 1000000.0 }}\n"
"""What the lying job declares: a million times more samples/s on every node than on one."""


@dataclass
class Result:
    first_node_s: float | None  # None: never within the window
    share: int
    fair: float
    lying: int


def _nodes(d: B.Daemon, jid: str) -> int:
    return len(d.jobs()[jid]["nodes"])


def run(nodes: int, window_s: float, fairness: str) -> Result:
    with B.workdir("mt-fairness-") as top:
        d = B.Daemon(top, config(nodes, fairness))
        d.start()
        try:
            # both jobs join the rendezvous store and hold their nodes (the faults benchmark's joining job)
            liar = submit_file(d, "liar", _py_job("liar", JOINS, hi=nodes) + CLAIM.format(nodes=nodes))
            if not B.wait(lambda: _nodes(d, liar) == nodes, 90, 0.5):
                raise RuntimeError(f"the lying job never held all {nodes} nodes: {d.jobs()[liar]}")
            late = submit_file(d, "late", _py_job("late", JOINS, hi=nodes, other_user=True), as_nobody=True)
            t0 = time.monotonic()
            first: float | None = None
            while time.monotonic() - t0 < window_s:
                if first is None and _nodes(d, late) > 0:
                    first = time.monotonic() - t0
                time.sleep(0.5)
            jobs = d.jobs()
            print(f"  fairness={fairness}: late job {late} of uid {jobs[late].get('owner_uid')}, nodes {jobs[late]['nodes']}; "
                  f"lying job {liar}, nodes {jobs[liar]['nodes']}", flush=True)
            return Result(first, len(jobs[late]["nodes"]), nodes / 2, len(jobs[liar]["nodes"]))
        finally:
            d.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--window", type=float, default=120.0, help="seconds after the late submit (default 120)")
    B.add_short(ap, "a 45 s window")
    ap.add_argument("--baseline", action="store_true", help="first the same run with fairness = \"none\"")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_fairness: needs root (the late user's job is submitted as nobody)", file=sys.stderr)
        return 2
    window = 45.0 if args.short else args.window
    print(f"load: {B.load()} (1-, 5-, 15-min), {os.cpu_count()} cores", flush=True)
    if args.baseline:
        base = run(args.nodes, window, "none")
        when = "never" if base.first_node_s is None else f"{base.first_node_s:.1f} s"
        print(f"baseline (fairness none): late user's first node after {when}, share {base.share}, "
              f"lying job's share {base.lying}", flush=True)
    r = run(args.nodes, window, "equal")
    x = "never" if r.first_node_s is None else f"{r.first_node_s:.1f}"
    ok = r.first_node_s is not None and r.first_node_s <= 30 and r.share >= 0.8 * r.fair and r.lying <= r.fair
    print("targets: X <= 30 s, S >= 0.8 x F, L <= F: " + ("PASS" if ok else "FAIL"))
    B.last_line(f"fairness: late user's first node after {x} s, share after {window:g} s {r.share} "
          f"(fair share {r.fair:g}), lying job's share {r.lying}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
