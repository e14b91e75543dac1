"""Job logs to idle timelines: idle = machine size - nodes busy.

Rules (docs/research.md): each job gets concrete nodes deterministically (the names its log gives
when complete, else the lowest-numbered free ones, synthetic ``n0000``... first so named nodes stay
free for the jobs that name them); at one timestamp ends come before starts, and a node freed and
retaken then makes no event. A job that starts when fewer nodes are free than it asks for gets only
the free ones ("clamped", counted in ``IdleTimeline.notes``): logs overlap jobs by a few seconds.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from traces._text import MAX_NODES
from traces.model import IdleTimeline, TraceError


@dataclass
class JobTable:
    """Parsed job records, before node assignment. Parallel lists, one entry per job."""

    path: Path
    format: str
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)  # may be inf: still running
    sizes: list[int] = field(default_factory=list)
    names: list[tuple[str, ...] | None] = field(default_factory=list)
    machine_size: int | None = None  # from the log's header, if it says
    machine_source: str = "from the log header"  # how the header gave it, for the notes
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # the reader's own remarks

    def add(self, start: float, end: float, size: int, names: tuple[str, ...] | None = None) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.sizes.append(size)
        self.names.append(names)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def jobs_to_timeline(table: JobTable, nodes: int | None = None) -> IdleTimeline:
    """Assign nodes to the jobs of ``table`` and return the idle-node timeline."""
    n_jobs = len(table.starts)
    if n_jobs == 0:
        detail = ", ".join(f"{n} {why}" for why, n in sorted(table.skipped.items()))
        raise TraceError(
            f"{table.path}: empty log: no job with a run time" + (f" (skipped: {detail})" if detail else "")
        )
    starts = np.array(table.starts, dtype=np.float64)
    ends = np.array(table.ends, dtype=np.float64)
    sizes = np.array(table.sizes, dtype=np.int64)
    _check_jobs(table, starts, ends, sizes)
    t0 = float(starts.min())
    finite = ends[np.isfinite(ends)]
    t1 = float(max(starts.max(), finite.max() if finite.size else t0))
    running = int(np.count_nonzero(~np.isfinite(ends)))
    ends = np.where(np.isfinite(ends), ends, t1)
    named = sorted({n for names, size in zip(table.names, table.sizes) if _complete(names, size) for n in names})
    machine = _machine_size(table, nodes, starts, ends, sizes, len(named))
    universe = _universe(named, machine)
    a = _Assigner(universe, n_fill=len(universe) - len(named))
    times, ids, idle = a.run(starts, ends, sizes, table.names)
    notes = _notes(table, machine, a, running, nodes)
    return IdleTimeline.from_arrays(
        source=str(table.path),
        format=table.format,
        nodes=universe,
        start=t0,
        end=t1,
        initial_idle=np.ones(len(universe), dtype=bool),
        times=times,
        node_ids=ids,
        idle=idle,
        notes=notes,
    )


def _check_jobs(table: JobTable, starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray) -> None:
    """Readers validate each line; this guards the sweep (a NaN time would never advance it)."""
    if not np.all(np.isfinite(starts)) or np.any(np.isnan(ends)) or np.any(ends == -np.inf):
        raise TraceError(f"{table.path}: a job has a NaN or infinite time")
    if np.any(sizes < 1) or np.any(sizes > MAX_NODES):
        raise TraceError(f"{table.path}: a job has a node count outside [1, {MAX_NODES}]")


def _complete(names: tuple[str, ...] | None, size: int) -> bool:
    return names is not None and len(names) == size and len(set(names)) == size


def peak_busy(starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray) -> int:
    """Peak of the summed sizes of running jobs (ends before starts at one time)."""
    t = np.concatenate((ends, starts))
    d = np.concatenate((-sizes, sizes))
    order = np.lexsort((d, t))  # by time, then negative deltas first
    return int(max(0, np.cumsum(d[order]).max()))


def _machine_size(table: JobTable, nodes: int | None, starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray,
                  n_named: int) -> int:
    if nodes is not None:
        if not 1 <= nodes <= MAX_NODES:
            raise TraceError(f"{table.path}: machine size must be 1 to {MAX_NODES} nodes, got {nodes}")
        if nodes < n_named:
            raise TraceError(
                f"{table.path}: the log names {n_named} distinct nodes, more than the machine size {nodes}"
            )
        return nodes
    size = max(table.machine_size, n_named) if table.machine_size is not None else max(
        peak_busy(starts, ends, sizes), n_named, 1
    )
    if size > MAX_NODES:
        raise TraceError(
            f"{table.path}: the jobs need {size} nodes at once, more than the {MAX_NODES} a machine may have "
            f"(give the machine size with --nodes)"
        )
    return size


def synthetic_names(count: int, taken: set[str] | None = None) -> list[str]:
    """``n0000``, ``n0001``, ... (at least 4 digits), skipping names in ``taken``."""
    taken = taken or set()
    width = max(4, len(str(max(count - 1, 0))))
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"n{i:0{width}d}"
        if name not in taken:
            out.append(name)
        i += 1
    return out


def _universe(named: list[str], machine: int) -> list[str]:
    """Node names in allocation order: synthetic fill first, then the named nodes."""
    return synthetic_names(max(0, machine - len(named)), set(named)) + named


class _Assigner:
    """Sweep over job starts and ends, handing out concrete nodes."""

    def __init__(self, universe: list[str], n_fill: int) -> None:
        self.index = {name: i for i, name in enumerate(universe)}
        self.n = len(universe)
        self.busy = np.zeros(self.n, dtype=bool)
        self.n_busy = 0
        self.free: list[int] = list(range(self.n))  # heap with stale entries (lazy deletion)
        self.clamped_jobs = 0
        self.clamped_node_seconds = 0.0
        self.name_conflicts = 0
        self.n_fill = n_fill

    def run(self, starts: np.ndarray, ends: np.ndarray, sizes: np.ndarray,
            names: list[tuple[str, ...] | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n_jobs = starts.shape[0]
        t = np.concatenate((ends, starts))
        kind = np.concatenate((np.zeros(n_jobs, np.int8), np.ones(n_jobs, np.int8)))  # 0 end, 1 start
        job = np.concatenate((np.arange(n_jobs), np.arange(n_jobs)))
        order = np.lexsort((job, kind, t))
        t_l, k_l, j_l = t[order].tolist(), kind[order].tolist(), job[order].tolist()
        held: dict[int, list[int]] = {}
        out_t: list[float] = []
        out_i: list[int] = []
        out_s: list[bool] = []
        t_sorted = t[order]
        cuts = np.flatnonzero(t_sorted[1:] != t_sorted[:-1]) + 1  # finite times: every group ends
        bounds = zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(t_l)])).tolist())
        for lo, hi in bounds:
            now = t_l[lo]
            freed: list[int] = []
            taken: list[int] = []
            for k in range(lo, hi):
                j = j_l[k]
                if k_l[k] == 0:
                    freed.extend(self._release(held.pop(j, [])))
                else:
                    got = self._claim(int(sizes[j]), names[j], float(ends[j] - starts[j]))
                    held[j] = got
                    taken.extend(got)
            freed_set, taken_set = set(freed), set(taken)
            for i in freed:
                if i not in taken_set:
                    out_t.append(now), out_i.append(i), out_s.append(True)
            for i in taken:
                if i not in freed_set:
                    out_t.append(now), out_i.append(i), out_s.append(False)
        return np.array(out_t, np.float64), np.array(out_i, np.int64), np.array(out_s, bool)

    def _release(self, ids: list[int]) -> list[int]:
        for i in ids:
            self.busy[i] = False
            heapq.heappush(self.free, i)
        self.n_busy -= len(ids)
        return ids

    def _claim(self, size: int, names: tuple[str, ...] | None, duration: float) -> list[int]:
        got: list[int] = []
        if names is not None and len(names) == size and len(set(names)) == size:
            for name in names:
                i = self.index[name]
                if self.busy[i]:
                    self.name_conflicts += 1
                else:
                    self.busy[i] = True
                    got.append(i)
        want = min(size - len(got), self.n - self.n_busy - len(got))
        if len(got) + want < size:
            self.clamped_jobs += 1
            self.clamped_node_seconds += (size - len(got) - want) * duration
        while want > 0:
            i = heapq.heappop(self.free)
            if not self.busy[i]:
                self.busy[i] = True
                got.append(i)
                want -= 1
        self.n_busy += len(got)
        return got


def _notes(table: JobTable, machine: int, a: _Assigner, running: int, nodes: int | None) -> list[str]:
    how = "given" if nodes is not None else table.machine_source if table.machine_size else "peak busy"
    notes = [f"machine size {machine} nodes ({how})", f"{len(table.starts)} jobs"]
    notes += table.notes
    notes += [f"skipped {n} jobs: {why}" for why, n in sorted(table.skipped.items())]
    if running:
        notes.append(f"{running} jobs without an end time: busy until the end of the log")
    if a.clamped_jobs:
        notes.append(
            f"clamped {a.clamped_jobs} jobs to the free nodes "
            f"({a.clamped_node_seconds / 3600:.1f} node-hours dropped)"
        )
    if a.name_conflicts:
        notes.append(f"{a.name_conflicts} named nodes were busy when a job named them: other nodes used")
    return notes
