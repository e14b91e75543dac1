"""What learning recovers: the scarce mix on day-long windows of the dev week, the default from the
population mean and from a linear belief, against the same policy given the true curves.

    python benchmarks/bench_learning.py [--seeds 0,1,2,3,4] [--nodes 64] [--short]

Seed k replays the window ``+78h + 6k h`` .. a day later on its ``--nodes`` most idle nodes, with the
``scarce`` mix of seed k (12 jobs of the six Pollux models, fewer than nodes), costs charged by the
shipped calibration. Printed per policy: mean work, and its ratio to ``milp-true``'s (the baseline,
replayed in the same run) per seed, mean and worst. Needs the data dir (``MALLETRAIN_DATA``).
``--short``: seed 0 alone, 16 nodes, a 6-hour window.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from harness import add_short, last_line

POLICIES = ("malletrain", "malletrain:linear", "milp-true", "freetrain:mean", "freetrain:linear")
DAY_S = 86400.0


def replay(timeline, policy: str, seed: int, nodes: int, span_s: float = DAY_S) -> dict:  # type: ignore[no-untyped-def]
    from simulator import find_scaling, simulate
    from simulator.engine import SimConfig
    from simulator.window import restrict

    start = timeline.start + 78 * 3600 + seed * 6 * 3600
    window = restrict(timeline, nodes, start, start + span_s)
    name, _, prior = policy.partition(":")
    return simulate(window, name, "scarce", seed=seed, config=SimConfig(start=start, end=start + span_s),
                    scaling=find_scaling(None), freetrain_model=prior or "mean",
                    learning_prior=prior if name != "freetrain" and prior else "mean").summary


def main(argv: list[str] | None = None) -> int:
    from malletrain.cli.simulate import evaluation_timeline

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--nodes", type=int, default=64)
    add_short(ap, "seed 0 alone, 16 nodes, a 6-hour window")
    args = ap.parse_args(argv)
    span_s = DAY_S
    if args.short:
        args.seeds, args.nodes, span_s = "0", 16, DAY_S / 4
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    timeline, _ = evaluation_timeline(None, None)
    work = {p: [replay(timeline, p, s, args.nodes, span_s)["work_node_seconds"] for s in seeds] for p in POLICIES}
    base = work["milp-true"]
    rows = []
    for p in POLICIES:
        ratios = [w / b for w, b in zip(work[p], base)]
        rows.append(f"{p:<18} work {statistics.fmean(work[p]):.4g} node-s  vs milp-true {statistics.fmean(ratios):.3f}x "
                    f"(worst seed {min(ratios):.3f}x; {len(seeds)} seeds)")
    print("\n".join(rows[:-1]), flush=True)
    last_line(rows[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
