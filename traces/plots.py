"""Figures of a timeline: idle nodes over time (MalleTrain Fig. 3.8), fragment-length CDF (Fig. 3.7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.model import IdleTimeline
from traces.stats import fragment_lengths


def plot_trace(tl: IdleTimeline, out_dir: str | Path) -> list[Path]:
    """Write ``idle_nodes.png`` and ``fragment_cdf.png`` into ``out_dir``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    label = Path(tl.source).name
    paths = [out / "idle_nodes.png", out / "fragment_cdf.png"]

    t, c = tl.idle_counts()
    hours = (np.append(t, tl.end) - tl.start) / 3600
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.step(hours, np.append(c, c[-1]), where="post", linewidth=0.6)
    ax.set_xlabel("hours since start")
    ax.set_ylabel("idle nodes")
    ax.set_title(f"Idle nodes over time: {label} ({tl.n_nodes} nodes)", fontsize=10)
    ax.set_xlim(0, max(hours[-1], 1e-9))
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)

    lengths = np.sort(fragment_lengths(tl))
    fig, ax = plt.subplots(figsize=(6, 4))
    if lengths.size:
        ax.step(lengths / 60, np.arange(1, lengths.size + 1) / lengths.size, where="post")
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no complete idle fragment", ha="center", transform=ax.transAxes)
    ax.set_xlabel("idle fragment length (minutes)")
    ax.set_ylabel("CDF")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Idle fragment lengths CDF\n{label}: {lengths.size} fragments", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths
