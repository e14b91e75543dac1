"""Same results before and after a pure-core refactor: six one-day replays of the Summit log, this
checkout against a baseline commit (default 4b8a6c1: main before the ledger and the simulator's split,
after the first measured calibration), each in a fresh process; prints SAME or the fields that differ.

    .venv/bin/python benchmarks/bench_core_same.py                  # makes a git worktree of 4b8a6c1
    .venv/bin/python benchmarks/bench_core_same.py --baseline DIR   # a checkout of a baseline you have
    .venv/bin/python benchmarks/bench_core_same.py --short --baseline .   # the quick mode CI runs (see below)

The replays run with ``--calibration free`` (``SimConfig(calibration=free())``): what is compared is
the policy and the engine's bookkeeping, not the costs charged, which change when the calibration or
what it charges does (the grow's join cost changes every charged replay on purpose). A summary is
compared whole, less what is timed or counts solver calls (``wall``, ``decision_ms``, ``cpu``,
``solve``): a no-op decision may be recognised differently without changing any plan; the
``calibration_values`` are compared on the keys both sides have (a new cost is 0 under ``free``).

``--short``: the first replay alone, on the first 6 hours. CI runs it with ``--baseline .`` (this checkout
against itself: the path to the last line, and a replay that must come out the same twice).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from traces.data import find_data  # noqa: E402

from harness import add_short, last_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BASELINE_COMMIT = "4b8a6c1"
TRACE = find_data("summit-2021-02-10_17.nodes.csv.gz")  # $MALLETRAIN_DATA, else the default
# (workload, preset knobs over the default PolicyConfig, seed)
REPLAYS = (
    ("nas", {}, 0), ("hpo", {}, 1), ("stress", {}, 2),
    ("nas", {"profiling": "always", "admission": "fixed", "horizon": "tfwd"}, 0),
    ("stress", {"horizon": "learned"}, 0),
    ("nas", {"allocation": "greedy", "profiling": "never"}, 0),
)
UNTIMED = ("wall", "decision_ms", "cpu", "solve")
REPLAY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import traces
from policy import PolicyConfig
from simulator import SimConfig, find_scaling, make_workload, simulate
from simulator.calibration import free
from simulator.policies import PolicyContext, make_policy
tl = traces.read(sys.argv[2])
out = []
for workload, knobs, seed in json.loads(sys.argv[3]):
    scaling = find_scaling(None)
    wl = make_workload(workload, scaling, seed=seed)
    pol = make_policy("malletrain", PolicyContext(wl.models, seed, "mean"), PolicyConfig(**knobs))
    s = simulate(tl, pol, workload, scaling=scaling, seed=seed,
                 config=SimConfig(start=tl.start, end=tl.start + float(sys.argv[4]), calibration=free())).summary
    out.append(s)
print(json.dumps(out, default=str))
"""


def replays(checkout: Path, trace: Path, plan: tuple[tuple[str, dict[str, str], int], ...], span_s: float) -> list[dict]:
    res = subprocess.run([sys.executable, "-c", REPLAY, str(checkout), str(trace), json.dumps(plan), repr(span_s)],
                         capture_output=True, text=True, timeout=3600, env={"PATH": "/usr/bin:/bin"})
    if res.returncode != 0:
        raise RuntimeError(f"replays on {checkout} failed ({res.returncode}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def baseline_label(tree: Path) -> str:
    """``tree``, and its commit when it is a git checkout (a ``git archive`` of one is not)."""
    res = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         timeout=30)
    return f"{tree} (commit {res.stdout.strip()})" if res.returncode == 0 else str(tree)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE, help="the idle-node log replayed (default: Summit)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help=f"a checkout of the baseline (default: commit {BASELINE_COMMIT}, made with git worktree add, "
                         "removed after)")
    add_short(ap, "the first replay alone, on the first 6 hours")
    args = ap.parse_args()
    plan, span_s = (REPLAYS[:1], 21600.0) if args.short else (REPLAYS, 86400.0)
    with tempfile.TemporaryDirectory(prefix="bench-core-base-") as tmp:
        old_tree = args.baseline if args.baseline is not None else Path(tmp) / "base"
        if args.baseline is None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old_tree), BASELINE_COMMIT],
                           check=True, capture_output=True, timeout=120)
        try:
            new, old = replays(ROOT, args.trace, plan, span_s), replays(old_tree, args.trace, plan, span_s)
        finally:
            if args.baseline is None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old_tree)],
                               capture_output=True, timeout=120)
    label = f"commit {BASELINE_COMMIT}" if args.baseline is None else baseline_label(args.baseline)
    print(f"this checkout against {label}, --calibration free")
    same_all = True
    for (workload, knobs, seed), a, b in zip(plan, new, old):
        costs = set(a.get("calibration_values", {})) & set(b.get("calibration_values", {}))
        for summary in (a, b):  # a cost only one side knows is not compared
            values = summary.get("calibration_values", {})
            summary["calibration_values"] = {k: v for k, v in values.items() if k in costs}
        keys = [k for k in set(a) | set(b) if not any(t in k for t in UNTIMED)]
        differ = sorted(k for k in keys if a.get(k) != b.get(k))
        same_all &= not differ
        print(f"{'SAME' if not differ else 'DIFFER'}  {workload} seed {seed} {knobs or 'default'}: "
              f"{len(keys)} fields" + (f"; differ: {', '.join(differ)}" if differ else ""))
    last_line(f"{'all replays SAME' if same_all else 'some replays DIFFER'} ({len(plan)} replay(s) of "
              f"{span_s / 3600:g} h)")
    return 0 if same_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
