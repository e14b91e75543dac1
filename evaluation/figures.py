"""MalleTrain's trace figures 3.7-3.9 from the real logs in the data dir (3.10 is the evaluation's).

    from evaluation.figures import paper_figures
    notes = paper_figures(Path("docs/evaluation"))   # fig3_7.png, fig3_8.png, fig3_9.png; lines for the report

3.7: idle-fragment-length CDFs of Summit against Cirrus (sacct) and KTH SP2 (SWF); Polaris's idle
data, which the paper uses, is not public. 3.8: idle nodes over the Summit week, with the line 10
jobs of at most 64 nodes can absorb. 3.9: the SYNTHETIC Summit-like week against the real one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SUMMIT = "summit-2021-02-10_17.nodes.csv.gz"
OTHERS = (("Cirrus (sacct, 557 nodes)", "cirrus-2024Q1-sacct.csv.gz"), ("KTH SP2 (SWF, 100 nodes)",
                                                                         "KTH-SP2-1996-2.1-cln.swf.gz"))


def paper_figures(out: Path, capacity_nodes: int = 640) -> list[str]:
    """Write fig3_7.png, fig3_8.png and fig3_9.png into ``out``; return report lines (markdown).
    A missing log is said, not fatal."""
    import traces
    from traces.bursts import idle_pool_ks
    from traces.data import find_data
    from traces.plots import draw_cdf, draw_idle, legend_outside, plot_comparison, pyplot
    from traces.stats import fragment_lengths
    from traces.synthetic import ks_distance, summit_like

    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    lines: list[str] = []
    path = find_data(SUMMIT)
    if path is None:
        return [f"Figures 3.7-3.9 skipped: {SUMMIT} not in the data dir (set MALLETRAIN_DATA)."]
    summit = traces.read(str(path))
    series = {f"Summit ({summit.n_nodes} nodes, node states)": (fragment_lengths(summit), "#222222")}
    colours = ("#d95f02", "#1b9e77")
    medians = [f"Summit {np.median(series[next(iter(series))][0]) / 60:.1f} min"]
    for (name, file), colour in zip(OTHERS, colours):
        p = find_data(file)
        if p is None:
            lines.append(f"- 3.7: {file} not found; left out.")
            continue
        tl = traces.read(str(p))
        lengths = fragment_lengths(tl)
        series[name] = (lengths, colour)
        medians.append(f"{name.split(' (')[0]} {np.median(lengths) / 60:.1f} min")
    fig, ax = plt.subplots(figsize=(7, 4.4))
    draw_cdf(ax, series)
    ax.set_title("Fig. 3.7: idle-fragment lengths, Summit vs other real machines\n"
                 "(Polaris's idle data, the paper's second machine, is not public)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "fig3_7.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    lines.append(f"- **3.7** `fig3_7.png`: CDF of idle-fragment lengths; medians {', '.join(medians)}. Polaris's "
                 "idle data is not public, so Summit is compared with Cirrus and KTH SP2.")

    t, c = summit.idle_counts()
    dt = np.diff(np.append(t, summit.end))
    ns = float((c * dt).sum())
    above_ns = 100.0 * float((c * dt)[c > capacity_nodes].sum()) / ns
    above_t = 100.0 * float(dt[c > capacity_nodes].sum()) / float(dt.sum())
    fig, ax = plt.subplots(figsize=(10, 3.8))
    draw_idle(ax, summit)
    ax.axhline(capacity_nodes, color="#d95f02", lw=1.0, ls="--", zorder=4,
               label=f"Pjmax x 64 = {capacity_nodes} nodes")
    legend_outside(ax)
    ax.set_title(f"Fig. 3.8: idle nodes, Summit week ({summit.n_nodes} nodes). Above {capacity_nodes}: "
                 f"{above_t:.0f}% of the time, {above_ns:.0f}% of idle node-seconds", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "fig3_8.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    lines.append(f"- **3.8** `fig3_8.png`: idle nodes over the Summit week (the one week of node states we "
                 f"have; the paper shows several). The pool is above {capacity_nodes} nodes {above_t:.1f}% of the "
                 f"time but holds {above_ns:.1f}% of the idle node-seconds then.")

    synth = summit_like()
    ks = {"fragments": ks_distance(fragment_lengths(synth), fragment_lengths(summit)),
          "pool": idle_pool_ks(synth, summit)}
    drawn = plot_comparison(summit, synth, out, ks)
    drawn.replace(out / "fig3_9.png")
    lines.append(f"- **3.9** `fig3_9.png`: the SYNTHETIC Summit-like week (`summit_like()`, bursty) against the "
                 f"real week: KS {ks['fragments']:.3f} on fragment lengths (goal <= 0.05), {ks['pool']:.3f} on "
                 "the idle-pool size over time (goal <= 0.10).")
    return lines
