"""CLI: ``malletrain trace stats FILE`` and ``malletrain trace synth``."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    trace = sub.add_parser("trace", help="read, summarise and synthesise idle-node traces",
                           description="Read scheduler logs as idle-node timelines, summarise them, "
                           "and write SYNTHETIC ones fitted to them.")
    tsub = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    trace.set_defaults(func=lambda args: trace.print_help() or 2)  # no subcommand: the help, exit 2

    stats = tsub.add_parser("stats", help="nodes, span, idle nodes, fragment lengths of a log",
                            description="Print a log's nodes, span, idle fraction and idle-fragment "
                            "percentiles (and how its jobs became a timeline); --plot writes its figures.")
    stats.add_argument("file", type=Path, help="node-state CSV, SWF, sacct or ALCF log (gzip ok)")
    stats.add_argument("--format", default=None, help="force the format: nodes-csv, swf, sacct, alcf")
    stats.add_argument("--nodes", type=int, default=None, help="machine size for job logs")
    stats.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write PNG figures here")
    stats.add_argument("--json", action="store_true", help="print the figures as JSON")
    stats.set_defaults(func=run_stats)

    synth = tsub.add_parser("synth", help="write a SYNTHETIC node-state trace (nodes-csv), bursty by default",
                            description="Write a SYNTHETIC node-state trace (nodes-csv) from the embedded "
                            "Summit model or one fitted to --fit, and print its KS distances to the log.")
    synth.add_argument("--nodes", type=int, required=True, help="number of nodes")
    synth.add_argument("--duration", type=float, required=True, metavar="S", help="length in seconds")
    synth.add_argument("--fit", type=Path, default=None, metavar="FILE",
                       help="fit the model to this log and print KS distances against it "
                            "(default: the embedded Summit model)")
    synth.add_argument("--against", type=Path, default=None, metavar="FILE",
                       help="print KS distances against this log (default: the --fit log)")
    synth.add_argument("--format", default=None, help="format of the --fit/--against log (default: detected)")
    synth.add_argument("--independent", action="store_true",
                       help="nodes alternate independently (no bursts): the model of earlier versions")
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    synth.add_argument("--out", type=Path, required=True, metavar="FILE", help="output (.csv or .csv.gz)")
    synth.add_argument("--plot", type=Path, default=None, metavar="DIR",
                       help="write the synthetic trace's figures and synthetic_vs_real.png here")
    synth.set_defaults(func=run_synth)


def run_stats(args: argparse.Namespace) -> int:
    import traces
    from traces.stats import trace_stats

    tl = traces.read(args.file, args.format, nodes=args.nodes)
    figures = trace_stats(tl)
    if args.json:
        record = {"file": str(args.file), "format": tl.format, **figures.as_dict(), "notes": list(tl.notes)}
        print(json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in record.items()}, indent=2))
    else:
        print(format_stats(str(args.file), tl.format, figures.as_dict(), tl.notes))
    if args.plot is not None:
        from traces.plots import plot_trace

        for path in plot_trace(tl, args.plot):
            print(f"wrote {path}")
    return 0


def format_stats(file: str, fmt: str, d: dict[str, float | int], notes: tuple[str, ...]) -> str:
    """The human-readable summary printed by ``trace stats``."""
    pct = " ".join(f"p{p}={_dur(d[f'fragment_p{p}_s'])}" for p in (10, 50, 90, 99))
    lines = [
        f"file            {file}",
        *(["kind            SYNTHETIC (generated, not a real log)"] if any(n.startswith("SYNTHETIC") for n in notes)
          else []),
        f"format          {fmt}",
        f"nodes           {d['nodes']}",
        f"span            {_dur(d['span_s'])} ({d['span_s']:.0f} s)",
        f"mean idle       {d['mean_idle']:.1f} nodes",
        f"peak idle       {d['peak_idle']} nodes",
        f"idle fraction   {100 * d['idle_fraction']:.2f}%",
        f"fragments       {d['fragments']}: {pct}",
        f"events/hour     {d['events_per_hour']:.1f}",
    ]
    lines += [f"note            {n}" for n in notes]
    return "\n".join(lines)


def _dur(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f}min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def run_synth(args: argparse.Namespace) -> int:
    import traces
    from traces import synthetic
    from traces.nodes_csv import write_nodes_csv
    from traces.stats import trace_stats

    real = traces.read(args.fit, args.format) if args.fit is not None else None
    model = _synth_model(real, args.independent)
    if args.independent:
        tl = synthetic.generate(args.nodes, args.duration, fragments=model, seed=args.seed)
    else:
        tl = synthetic.generate(args.nodes, args.duration, bursts=model, seed=args.seed)
    kind = "independent nodes" if args.independent else "bursty"
    comment = f"synthetic trace ({kind}): {args.nodes} nodes, {args.duration:g} s, seed {args.seed}\n{model}"
    write_nodes_csv(tl, args.out, comment=comment)
    back = traces.read(args.out)
    figures = trace_stats(back)
    print(f"wrote {args.out}: SYNTHETIC ({kind}), {back.n_nodes} nodes, {back.n_events} events, "
          f"idle fraction {100 * figures.idle_fraction:.2f}%, peak {figures.peak_idle} idle nodes")
    against = real if args.against is None else traces.read(args.against, args.format)
    ks: dict[str, float] = {}
    if against is not None:
        ks = _print_ks(back, against, args.against or args.fit)
    if args.plot is not None:
        from traces.plots import plot_comparison, plot_trace

        for path in plot_trace(back, args.plot):
            print(f"wrote {path}")
        if against is not None:
            print(f"wrote {plot_comparison(against, back, args.plot, ks)}")
    return 0


def _synth_model(real, independent: bool):  # type: ignore[no-untyped-def]
    from traces import synthetic

    if real is None:
        return synthetic.SUMMIT if independent else synthetic.SUMMIT_BURSTS
    fragments = synthetic.fit_fragments(real)
    return fragments if independent else synthetic.fit_bursts(real, fragments)


def _print_ks(synth, real, path: Path) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from traces.bursts import idle_pool_ks
    from traces.stats import fragment_lengths
    from traces.synthetic import ks_distance

    ks = {"fragments": ks_distance(fragment_lengths(synth), fragment_lengths(real)), "pool": idle_pool_ks(synth, real)}
    print(f"KS distance of fragment lengths vs {path}: {ks['fragments']:.4f} (goal <= 0.05)")
    print(f"KS distance of idle-pool size over time (idle fraction, time-weighted) vs {path}: "
          f"{ks['pool']:.4f} (goal <= 0.10)")
    return ks
