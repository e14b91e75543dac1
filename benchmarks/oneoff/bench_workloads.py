"""The generated workloads: calibration error of the rate model and the spread of each stream.

    python benchmarks/oneoff/bench_workloads.py [--draws 1000] [--seed 0] [--scaling FILE]

Prints, for the rate model of :mod:`simulator.perfmodel` fitted on the measured Summit
curves (the data directory's ``summit-scaling.csv`` unless ``--scaling``): the fitted constants
and the mean absolute error per measured model (full model, and the brief's basic
compute + ring-allreduce model for comparison); then for each stream (``nas``, ``hpo``,
``stress``, ``imagenet7``) over ``--draws`` seeded draws: the 1-node rate, the scaling
efficiency at 64 nodes and the job length (p10 / p50 / p90), and how many distinct models;
then the parameters, forward MACs and per-node batch of the ``nas`` and ``hpo`` draws.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

from simulator.netcost import MEASURED_MODELS  # noqa: E402
from simulator.perfmodel import calibrate, efficiency  # noqa: E402
from simulator.streams import STREAMS, draws, machine_for, reference_costs  # noqa: E402
from simulator.workload import find_scaling, make_workload  # noqa: E402


def _pct(values: np.ndarray, fmt: str) -> str:
    return " / ".join(format(v, fmt) for v in np.percentile(values, [10, 50, 90]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scaling", help="model,nodes,samples_per_second CSV (default: summit-scaling.csv)")
    args = ap.parse_args(argv)
    scaling = find_scaling(args.scaling)
    print(f"scaling: {scaling.source}{' (SYNTHETIC)' if scaling.synthetic else ''}")

    costs = reference_costs()
    print("\nreference models (torchvision definitions): params, forward GMACs, activations (M), layer ops")
    for m, c in costs.items():
        print(f"  {m:11s} {c.params / 1e6:7.2f}M {c.macs / 1e9:7.3f} {c.activations / 1e6:7.2f} {c.layers:5d}")

    if all(m in scaling.curves for m in MEASURED_MODELS):
        fits = {t: calibrate(scaling.curves, {m: costs[m] for m in MEASURED_MODELS}, t) for t in ("full", "basic")}
        mach = fits["full"].machine
        print(f"\ncalibrated (full): mac_rate {mach.mac_rate / 1e12:.2f} TMAC/s/node,"
              f" sample {mach.sample_s * 1e6:.1f} us,"
              f" layer {mach.layer_s * 1e6:.0f} us/step, ring bw {mach.bandwidth / 1e9:.1f} GB/s,"
              f" latency {mach.latency_s * 1e6:.0f} us/log2 n, fs {mach.fs_bandwidth / 1e9:.1f} GB/s")
        print("calibration error, mean |predicted/measured - 1| over 1..64 nodes:")
        print(f"  {'model':11s} {'full':>6s} {'basic':>6s}   full model, per node count 1,2,4,..,64")
        for m in MEASURED_MODELS:
            full, basic = fits["full"], fits["basic"]
            per = " ".join(f"{v * 100:+4.0f}" for v in full.errors[m].values())
            print(f"  {m:11s} {full.mean_abs_error(m) * 100:5.1f}% {basic.mean_abs_error(m) * 100:5.1f}%   {per}")
        print(f"  {'all':11s} {fits['full'].overall * 100:5.1f}% {fits['basic'].overall * 100:5.1f}%")
    else:
        print("\n(no measured curves for the 7 models: streams use the stored Summit constants)")

    print(f"\nstreams over {args.draws} draws (seed {args.seed}): p10 / p50 / p90")
    print(f"  {'stream':9s} {'1-node samples/s':>26s} {'efficiency at 64':>20s} {'job length (M samples)':>26s}"
          f" {'models':>7s} {'s':>5s}")
    for name in STREAMS:
        t0 = time.perf_counter()
        wl = make_workload(name, scaling, seed=args.seed)
        jobs = [wl.draw() for _ in range(args.draws)]
        secs = time.perf_counter() - t0
        r1 = np.array([j.scaling[1] for j in jobs if j])
        eff = np.array([efficiency(j.scaling, 64) for j in jobs if j])
        length = np.array([j.samples for j in jobs if j]) / 1e6
        models = len({j.model for j in jobs if j})
        print(f"  {name:9s} {_pct(r1, '8.0f'):>26s} {_pct(eff, '.2f'):>20s} {_pct(length, '7.1f'):>26s}"
              f" {models:7d} {secs:5.1f}")
    print("\nwhat the generated models are (same draws): p10 / p50 / p90")
    print(f"  {'stream':9s} {'params (M)':>24s} {'forward GMACs':>24s} {'per-node batch':>20s}")
    machine = machine_for(scaling)
    for name in ("nas", "hpo"):
        ds = list(itertools.islice(draws(name, args.seed, machine), args.draws))
        params = np.array([d.params for d in ds]) / 1e6
        gmacs = np.array([d.macs for d in ds]) / 1e9
        batch = np.array([d.per_node_batch for d in ds])
        print(f"  {name:9s} {_pct(params, '6.1f'):>24s} {_pct(gmacs, '6.1f'):>24s} {_pct(batch, '4.0f'):>20s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
