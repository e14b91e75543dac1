"""``sinfo``/``squeue`` replies for a whole machine, parsed by the Slurm backend's own parsers: the
figures ``python benchmarks/bench_daemon_scale.py --parse-only`` prints (and every run prints first)."""

from __future__ import annotations

import time
from typing import Any

from scavenger.base import PilotRequest
from scavenger.slurm import SlurmConfig, SlurmDialect
from tests.clusters.fake_slurm import FakeSlurm

PARTITION = "preemptable"


def parse_figures(nodes: int = 10_624, repeat: int = 5) -> str:
    """``sinfo`` and ``squeue`` replies for ``nodes`` nodes (one pilot each) parsed by the Slurm
    dialect's own parsers; best of ``repeat``, with the ratio to splitting the same text into
    fields (``str.split`` per line: the least any parser of these formats does).

    Each parser is a new dialect's (every line parsed: a dialect does not parse again a line its
    last reply had), and ``squeue`` twice: that first reply, and the next poll's reply,
    in which 1% of the pilots changed (a dialect that parsed the one before: what a daemon's poll
    costs once it runs)."""
    names = [f"n{i:05d}" for i in range(nodes)]
    ticks = iter(range(10**9))
    base = time.time()
    slurm = FakeSlurm(names, clock=lambda: base + 0.5 * next(ticks))  # pilots start seconds apart
    dialect = SlurmDialect(SlurmConfig(daemon_address="tcp://127.0.0.1:1", partition=PARTITION))
    pilots = []
    for i, n in enumerate(names):
        res = slurm.run(dialect.render_submit(_request(n), 86400.0))
        pilots.append(dialect.parse_submit(res))
        if i % 2:
            slurm.recall(n)  # half of them preempted: ended lines too
    sinfo = slurm.run(dialect.render_nodes())
    squeue = slurm.run(dialect.render_poll(pilots))
    for n in names[: nodes // 100 * 2: 2]:  # 1% of the machine recalled before the next poll
        slurm.recall(n)
    squeue_next = slurm.run(dialect.render_poll(pilots))

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    def next_poll() -> Any:
        polled = SlurmDialect(dialect.config)
        polled.parse_poll(squeue, pilots)  # the poll before (not timed)
        t0 = time.perf_counter()
        polled.parse_poll(squeue_next, pilots)
        return time.perf_counter() - t0

    t_sinfo = best(lambda: SlurmDialect(dialect.config).parse_nodes(sinfo))  # a new dialect: every line
    t_squeue = best(lambda: SlurmDialect(dialect.config).parse_poll(squeue, pilots))  # a new dialect: every line
    t_next = min(next_poll() for _ in range(repeat))
    b_sinfo = best(lambda: [ln.split("|") for ln in sinfo.stdout.splitlines()])
    b_squeue = best(lambda: [ln.split("|") for ln in squeue.stdout.splitlines()])
    b_next = best(lambda: [ln.split("|") for ln in squeue_next.stdout.splitlines()])
    again = SlurmDialect(dialect.config)
    again.parse_poll(squeue, pilots)
    assert len(dialect.parse_nodes(sinfo)) == nodes and len(dialect.parse_poll(squeue, pilots)) == nodes
    assert again.parse_poll(squeue_next, pilots) == SlurmDialect(dialect.config).parse_poll(squeue_next, pilots)
    return (f"parse: {nodes} nodes: sinfo {t_sinfo * 1e3:.1f} ms ({t_sinfo / b_sinfo:.1f}x split-only "
            f"{b_sinfo * 1e3:.1f} ms), squeue {t_squeue * 1e3:.1f} ms ({t_squeue / b_squeue:.1f}x split-only "
            f"{b_squeue * 1e3:.1f} ms), squeue next poll (1% changed) {t_next * 1e3:.1f} ms ({t_next / b_next:.1f}x "
            f"split-only {b_next * 1e3:.1f} ms); target <= 100 ms each")


def _request(node: str) -> PilotRequest:
    return PilotRequest((node,))
