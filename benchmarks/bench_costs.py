"""What charging the calibration's costs costs the default, on the real Philly stream.

    python benchmarks/bench_costs.py            # 64 nodes of the Summit dev week, +78h..+79h, load 1.5, 5 seeds
    python benchmarks/bench_costs.py --short    # the quick mode CI runs: 16 nodes, 15 minutes, 1 seed

Replays ``malletrain`` twice per seed, paired: with the shipped calibration
(simulator/calibration.json: pilot start, cold start, restart with rollback, rescale pause) and
with the ``free`` ablation (what the simulator charged before it had a measured calibration); prints the share of the
work the costs take, the mean and per seed; then the share the grow's join (``join_s``) alone takes:
the shipped calibration against the same with ``join_s`` 0; then what warm starts save
(``warm_start_s``: a start or restart on nodes whose warm workers are ready): the same calibration
without it (every start pays its full figure) against the shipped one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import traces  # noqa: E402
from simulator import SimConfig, simulate  # noqa: E402
from simulator.calibration import default, free  # noqa: E402
from simulator.policies import Overrides  # noqa: E402
from simulator.window import restrict  # noqa: E402
from traces.data import find_data  # noqa: E402

from harness import add_short, last_line  # noqa: E402

TRACE = "summit-2021-02-10_17.nodes.csv.gz"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start-h", type=float, default=78.0, help="window start, hours after the log's start")
    ap.add_argument("--hours", type=float, default=1.0, help="window length (h)")
    ap.add_argument("--nodes", type=int, default=64, help="the N longest-idle nodes of the window")
    ap.add_argument("--load", type=float, default=1.5, help="offered load of the philly stream")
    ap.add_argument("--seeds", type=int, default=5)
    add_short(ap, "16 nodes, 15 minutes, 1 seed")
    args = ap.parse_args()
    if args.short:
        args.nodes, args.hours, args.seeds = 16, 0.25, 1
    path = find_data(TRACE)
    if path is None:
        print(f"bench_costs: {TRACE} not found (set MALLETRAIN_DATA)", file=sys.stderr)
        return 2
    tl = traces.read(str(path))
    start = tl.start + args.start_h * 3600.0
    tl = restrict(tl, args.nodes, start, start + args.hours * 3600.0)
    work = {}
    cals = (("charged", default()), ("free", free()), ("no join", replace(default(), join_s=0.0)),
            ("no warm", replace(default(), warm_start_s=None)))
    for name, cal in cals:
        work[name] = [simulate(tl, "malletrain", "philly", seed=k, config=SimConfig(calibration=cal),
                               overrides=Overrides(objective="work"), offered_load=args.load)
                      .summary["work_node_seconds"] for k in range(args.seeds)]
    loss = [100.0 * (1.0 - c / f) for c, f in zip(work["charged"], work["free"])]
    print(f"philly@{args.load:g} malletrain, {args.nodes} nodes of Summit +{args.start_h:g}h for {args.hours:g} h, "
          f"{args.seeds} seeds: charging the calibration's costs costs {statistics.fmean(loss):.1f}% of the work "
          f"(per seed {', '.join(f'{x:.1f}' for x in loss)}; baseline: the same replays with --calibration free)")
    join = [100.0 * (1.0 - c / n) for c, n in zip(work["charged"], work["no join"])]
    print(f"of which the grow's join ({default().join_s:g} s) costs {statistics.fmean(join):.1f}% of the work "
          f"(per seed {', '.join(f'{x:.1f}' for x in join)}; baseline: the same calibration with join_s 0)")
    warm = [100.0 * (c / n - 1.0) for c, n in zip(work["charged"], work["no warm"])]
    last_line(f"warm starts ({default().warm_start_s:g} s on ready nodes) add {statistics.fmean(warm):.1f}% to the work "
          f"(per seed {', '.join(f'{x:.1f}' for x in warm)}; baseline: the same calibration without warm_start_s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
