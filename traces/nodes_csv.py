"""Node-state logs: ``time,node,idle`` CSV (after ``#`` comments), gzip or plain.

The first timestamp lists every node's state; each later row is one node
changing state. A node first named later is taken as busy until then. Rows
that repeat a node's current state are dropped (see ``IdleTimeline.from_arrays``).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from traces._text import Lines, data_lines, empty_error, read_text
from traces.model import IdleTimeline

FORMAT = "nodes-csv"
COLUMNS = ("time", "node", "idle")


def read_nodes_csv(path: Path) -> IdleTimeline:
    columns = _fast_columns(read_text(path))
    if columns is None:  # anything irregular: the careful path finds and names the bad line
        columns = _careful_columns(path)
    times, names, idle = columns
    nodes, ids = _node_ids(names)
    return IdleTimeline.from_arrays(
        source=str(path),
        format=FORMAT,
        nodes=nodes,
        start=float(times.min()),
        end=float(times.max()),
        initial_idle=np.zeros(len(nodes), dtype=bool),
        times=times,
        node_ids=ids,
        idle=idle,
    )


Columns = tuple[np.ndarray, list[str], np.ndarray]


def _fast_columns(text: str) -> Columns | None:
    """Whole-buffer parse of a regular file (comments only on top, header, 3 fields a row); else None."""
    pos = 0
    while text.startswith("#", pos):
        pos = text.find("\n", pos) + 1
        if pos == 0:
            return None
    header_end = text.find("\n", pos)
    if header_end < 0 or text[pos:header_end] != ",".join(COLUMNS) or "\r" in text:
        return None
    body = text[header_end + 1 :].rstrip("\n")
    if not body or "\n\n" in body or "\n#" in body or " " in body:
        return None
    buf = np.frombuffer(body.encode(), dtype=np.uint8)
    newlines = np.flatnonzero(buf == 10)
    commas = np.flatnonzero(buf == 44)
    per_line = np.diff(np.searchsorted(commas, np.concatenate(([0], newlines, [buf.size]))))
    if not np.all(per_line == 2):
        return None
    fields = body.replace("\n", ",").split(",")
    idle_raw = fields[2::3]
    if not set(idle_raw) <= {"0", "1"}:
        return None
    try:
        times = np.fromiter(map(float, fields[0::3]), dtype=np.float64, count=len(idle_raw))
    except ValueError:
        return None
    names = fields[1::3]
    if not np.all(np.isfinite(times)) or "" in set(names):
        return None
    return times, names, np.fromiter(map("1".__eq__, idle_raw), dtype=bool, count=len(idle_raw))


def _node_ids(names: list[str]) -> tuple[list[str], np.ndarray]:
    """Sorted distinct names, and each row's index into them."""
    order = sorted(set(names))
    index = {name: i for i, name in enumerate(order)}
    return order, np.fromiter(map(index.__getitem__, names), dtype=np.int64, count=len(names))


def _careful_columns(path: Path) -> Columns:
    lines = data_lines(path)
    if not lines.texts:
        raise empty_error(path, "header or rows")
    header = [c.strip().lower() for c in lines.texts[0].split(",")]
    if sorted(header) != sorted(COLUMNS):
        raise lines.error(0, f"expected the header {','.join(COLUMNS)}")
    col = [header.index(c) for c in COLUMNS]
    if len(lines.texts) == 1:
        raise empty_error(path, "rows after the header")
    parts = [text.split(",") for text in lines.texts[1:]]
    for k, row in enumerate(parts):
        if len(row) != 3:
            raise lines.error(k + 1, f"expected 3 comma-separated fields, got {len(row)}")
    t_raw, n_raw, i_raw = ([row[c].strip() for row in parts] for c in col)
    for k, name in enumerate(n_raw):
        if not name:
            raise lines.error(k + 1, "empty node name")
    return _times(lines, t_raw), n_raw, _idle_flags(lines, i_raw)


def _times(lines: Lines, raw: list[str]) -> np.ndarray:
    try:
        times = np.array(raw, dtype=np.float64)
    except ValueError:
        times = None
    if times is None or not np.all(np.isfinite(times)):
        for k, text in enumerate(raw):
            try:
                ok = np.isfinite(float(text))
            except ValueError:
                ok = False
            if not ok:
                raise lines.error(k + 1, f"time {text!r} is not a number of seconds")
    assert times is not None
    return times


def _idle_flags(lines: Lines, raw: list[str]) -> np.ndarray:
    arr = np.array(raw)
    ones = arr == "1"
    bad = np.flatnonzero(~(ones | (arr == "0")))
    if bad.size:
        k = int(bad[0])
        raise lines.error(k + 1, f"idle {raw[k]!r} is not 0 or 1")
    return ones


def write_nodes_csv(tl: IdleTimeline, path: Path, comment: str = "") -> Path:
    """Write ``tl`` in this format (gzip if the name ends in .gz); ``read`` gives it back."""
    path = Path(path)
    out = [f"# {line}" for line in comment.splitlines() if line.strip()]
    out.append(f"# idle-node timeline of {tl.n_nodes} nodes from {tl.source} ({tl.format})")
    out.append(",".join(COLUMNS))
    start = _fmt(tl.start)
    mask = tl.initial_mask()
    out.extend(f"{start},{name},{int(m)}" for name, m in zip(tl.nodes, mask.tolist()))
    names = tl.nodes
    out.extend(
        f"{_fmt(t)},{names[i]},{int(s)}"
        for t, i, s in zip(tl.times.tolist(), tl.node_ids.tolist(), tl.idle.tolist())
    )
    if tl.end > (float(tl.times[-1]) if tl.n_events else tl.start):
        # Mark the end of the span with a row that repeats a state (dropped on read).
        last = names[0]
        out.append(f"{_fmt(tl.end)},{last},{int(last in tl.idle_at(tl.end))}")
    data = ("\n".join(out) + "\n").encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def _fmt(t: float) -> str:
    return str(int(t)) if float(t).is_integer() else repr(float(t))
