"""A NASBench-101-like search space: cell specs, their sampling, and the networks' cost.

Written from the description in Ying et al., "NAS-Bench-101: Towards Reproducible Neural Architecture Search" (ICML
2019) and its public reference code (read, not copied). What it assumes:

* **Cell.** A DAG of at most :data:`MAX_VERTICES` = 7 vertices (input, output, up to 5 interior) and at most
  :data:`MAX_EDGES` = 9 edges, given by an upper-triangular adjacency matrix (so it is acyclic, vertex 0 is the input,
  the last the output). Interior vertices carry one of :data:`OPS`.
* **Pruning.** A vertex that is not both reachable from the input and able to reach the output is removed (with its
  edges); a spec whose input no longer reaches the output is invalid. The limits apply to the pruned spec.
* **Sampling** (:func:`sample_cell`) is the benchmark's random search: each of the
  21 upper-triangular entries of a 7x7 matrix is an edge with probability 1/2, each
  interior vertex draws an op uniformly; the draw is pruned and rejected until valid.
* **Network** (:func:`network_cost`): a 3x3 conv-bn-relu stem of 128 channels, then 3 stacks of 3 cells; before stacks 2
  and 3 a 2x2 max-pool (stride 2) halves the resolution and the channels double; then global average pooling and a dense
  layer. The benchmark trains at 32x32 with 10 labels; here the input is 224x224 with 1000 labels (ImageNet-sized),
  which makes the networks far heavier than the benchmark's.
* **Channels in a cell** (:func:`vertex_channels`): the cell's output channels are split evenly over the vertices that
  feed the output (their outputs are concatenated; the first ``remainder`` of them get one more channel); any other
  interior vertex takes the largest channel count among the vertices it feeds. Edges from the input go through a 1x1
  conv-bn-relu projection to the receiving vertex's channels; edges between interior vertices are summed, truncating the
  (at most one) extra channel. The output also adds a projection of the input when the input feeds it directly (a
  projection alone when nothing else does).
* conv ops are conv (no bias) + batch norm + ReLU at stride 1 and 'same' padding;
  maxpool3x3 is stride 1 and keeps the channels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.netcost import Cost, Shape, conv_bn, dense, eltwise

INPUT, OUTPUT = "input", "output"
CONV3X3, CONV1X1, MAXPOOL3X3 = "conv3x3-bn-relu", "conv1x1-bn-relu", "maxpool3x3"
OPS = (CONV3X3, CONV1X1, MAXPOOL3X3)
MAX_VERTICES = 7
MAX_EDGES = 9

STEM_CHANNELS = 128
NUM_STACKS = 3
CELLS_PER_STACK = 3
IMAGE_SIZE = 224
NUM_LABELS = 1000


@dataclass(frozen=True)
class CellSpec:
    """A (pruned) cell: an upper-triangular 0/1 adjacency matrix and one op per vertex."""

    matrix: tuple[tuple[int, ...], ...]
    ops: tuple[str, ...]

    @property
    def num_vertices(self) -> int:
        return len(self.ops)

    @property
    def num_edges(self) -> int:
        return int(sum(map(sum, self.matrix)))

    def array(self) -> np.ndarray:
        return np.array(self.matrix, dtype=int)

    def label(self) -> str:
        """A short readable id: ops' initials (``proj`` for none) and the upper-triangle edge bits,
        e.g. ``3m1|0110...``."""
        short = {CONV3X3: "3", CONV1X1: "1", MAXPOOL3X3: "m"}
        bits = "".join(str(self.matrix[i][j]) for i in range(self.num_vertices)
                       for j in range(i + 1, self.num_vertices))
        return ("".join(short[o] for o in self.ops[1:-1]) or "proj") + "|" + bits


Rows = "tuple[tuple[int, ...], ...] | list[list[int]]"


def _path_masks(rows: Rows) -> tuple[list[int], int]:
    """Each vertex's out-edges as a bit mask (upper triangle only), and the bit mask of the vertices
    on some input->output path (0 when the input does not reach the output). Edges only go up, so one
    pass in each direction finds what the input reaches and what reaches the output."""
    n = len(rows)
    masks = [sum(1 << j for j in range(i + 1, n) if row[j]) for i, row in enumerate(rows)]
    fwd = 1
    for i in range(n):
        if fwd >> i & 1:
            fwd |= masks[i]
    bwd = 1 << (n - 1)
    for i in range(n - 2, -1, -1):
        if masks[i] & bwd:
            bwd |= 1 << i
    keep = fwd & bwd
    return masks, keep if keep & 1 else 0


def prune(matrix: np.ndarray | list[list[int]], ops: list[str] | tuple[str, ...]) -> CellSpec | None:
    """Drop vertices not on an input->output path; ``None`` when input cannot reach output."""
    m = np.asarray(matrix, dtype=int)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(ops):
        raise ValueError("matrix must be square and match the ops")
    if np.any(np.tril(m) != 0):
        raise ValueError("matrix must be strictly upper triangular")
    rows = m.tolist()
    _, on_path = _path_masks(rows)
    if not on_path:
        return None
    keep = [i for i in range(len(rows)) if on_path >> i & 1]
    return CellSpec(tuple(tuple(rows[i][j] for j in keep) for i in keep), tuple(ops[i] for i in keep))


def is_valid(spec: CellSpec | None) -> bool:
    """Within the limits, input/output at the ends, known ops, every vertex on an input->output path."""
    if spec is None or not (2 <= spec.num_vertices <= MAX_VERTICES) or spec.num_edges > MAX_EDGES:
        return False
    if spec.ops[0] != INPUT or spec.ops[-1] != OUTPUT or any(o not in OPS for o in spec.ops[1:-1]):
        return False
    rows = spec.matrix
    n = spec.num_vertices
    if any(len(row) != n for row in rows) or any(v not in (0, 1) for row in rows for v in row):
        return False
    if any(rows[i][j] for i in range(n) for j in range(i + 1)):
        return False  # not strictly upper triangular
    return _path_masks(rows)[1] == (1 << n) - 1


def sample_cell(rng: np.random.Generator) -> CellSpec:
    """One valid cell, by the benchmark's rejection sampling (see the module docstring)."""
    while True:
        # two draws per try, always both (the stream of cells depends on it); numpy only draws: on a
        # 7x7 matrix its calls cost more than the plain-Python prune of _sampled
        full = rng.integers(0, 2, size=(MAX_VERTICES, MAX_VERTICES)).tolist()
        drawn = rng.integers(0, len(OPS), size=MAX_VERTICES - 2).tolist()
        spec = _sampled(full, drawn)
        if spec is not None:
            return spec


def _sampled(full: list[list[int]], drawn: list[int]) -> CellSpec | None:
    """``prune`` of the upper triangle of ``full`` with ops ``drawn`` when :func:`is_valid`, else ``None``. On a drawn
    matrix the checks of :func:`is_valid` reduce to the edge limit: the pruned cell keeps input and output, known ops
    and the upper triangle, has at most ``MAX_VERTICES`` vertices, and a vertex on an input->output path has its whole
    path kept."""
    masks, on_path = _path_masks(full)
    if not on_path:
        return None  # the input does not reach the output
    kept = [i for i in range(len(full)) if on_path >> i & 1]
    if sum((masks[i] & on_path).bit_count() for i in kept) > MAX_EDGES:
        return None
    ops = (INPUT, *(OPS[k] for k in drawn), OUTPUT)
    return CellSpec(tuple(tuple(masks[i] >> j & 1 for j in kept) for i in kept), tuple(ops[i] for i in kept))


def vertex_channels(c_in: int, c_out: int, matrix: np.ndarray | Rows) -> list[int]:
    """Channels of every vertex of a pruned cell (the published rule; see the module docstring)."""
    rows = matrix.tolist() if isinstance(matrix, np.ndarray) else matrix
    n = len(rows)
    ch = [0] * n
    ch[0], ch[-1] = c_in, c_out
    if n == 2:
        return ch
    feeders = [v for v in range(1, n - 1) if rows[v][n - 1]]
    base, extra = divmod(c_out, len(feeders))
    for k, v in enumerate(feeders):
        ch[v] = base + (1 if k < extra else 0)
    for v in range(n - 3, 0, -1):
        if not rows[v][n - 1]:
            ch[v] = max(ch[d] for d in range(v + 1, n - 1) if rows[v][d])
    return ch


def _conv_bn(c_in: int, c_out: int, k: int, h: int, w: int) -> tuple[int, int, int, int]:
    """(params, macs, activations, layers) of :func:`simulator.netcost.conv_bn` at stride 1, 'same'
    padding and odd ``k`` (so the output is ``h x w``): the conv, batch norm and ReLU."""
    weights = c_out * c_in * k * k
    return weights + 2 * c_out, h * w * weights, 3 * c_out * h * w, 3


def cell_cost(spec: CellSpec, x: Shape, c_out: int) -> tuple[Cost, Shape]:
    """Cost of one cell with ``c_out`` output channels on input ``x`` (counted as
    :mod:`simulator.netcost` counts conv_bn, eltwise and pool layers; the tests hold it to them)."""
    rows = spec.matrix
    n = spec.num_vertices
    ch = vertex_channels(x[0], c_out, rows)
    c_in, h, w = x
    params = macs = acts = layers = 0

    def add(c: tuple[int, int, int, int]) -> None:
        nonlocal params, macs, acts, layers
        params += c[0]
        macs += c[1]
        acts += c[2]
        layers += c[3]

    for t in range(1, n - 1):
        fan_in = sum(rows[s][t] for s in range(t))
        if rows[0][t]:
            add(_conv_bn(c_in, ch[t], 1, h, w))  # projection of the input
        if fan_in > 1:
            add((0, 0, ch[t] * h * w, 1))  # the sum
        if spec.ops[t] == MAXPOOL3X3:
            add((0, 0, ch[t] * h * w, 1))  # 3x3 pool, stride 1, pad 1: same size
        else:
            add(_conv_bn(ch[t], ch[t], 3 if spec.ops[t] == CONV3X3 else 1, h, w))
    y: Shape = (c_out, h, w)
    feeders = sum(rows[v][n - 1] for v in range(1, n - 1))
    if n == 2 or not feeders:
        add(_conv_bn(c_in, c_out, 1, h, w))
        return Cost(params, macs, acts, layers), y
    if feeders > 1:
        add((0, 0, c_out * h * w, 1))  # the concatenation
    if rows[0][n - 1]:
        add(_conv_bn(c_in, c_out, 1, h, w))  # projected input,
        add((0, 0, c_out * h * w, 1))  # added
    return Cost(params, macs, acts, layers), y


def network_cost(spec: CellSpec, image: int = IMAGE_SIZE, labels: int = NUM_LABELS,
                 stem: int = STEM_CHANNELS, stacks: int = NUM_STACKS, cells: int = CELLS_PER_STACK) -> Cost:
    """Parameters, MACs and activations of the whole network built from ``spec``."""
    cost, x = conv_bn(stem, 3)((3, image, image))
    channels = stem
    seen: dict[tuple[Shape, int], tuple[Cost, Shape]] = {}  # a stack's cells after its first are alike
    for s in range(stacks):
        if s > 0:
            x = (x[0], -(-x[1] // 2), -(-x[2] // 2))  # 2x2/2 max-pool, 'same' padding: ceil(h / 2)
            cost = cost + eltwise(x)[0]
            channels *= 2
        for _ in range(cells):
            key = (x, channels)
            if key not in seen:
                seen[key] = cell_cost(spec, x, channels)
            c, x = seen[key]
            cost = cost + c
    return cost + Cost(0, 0, x[0], 1) + dense(x[0], labels)


__all__ = [
    "CONV1X1", "CONV3X3", "CellSpec", "INPUT", "MAXPOOL3X3", "MAX_EDGES", "MAX_VERTICES", "OPS", "OUTPUT",
    "cell_cost", "is_valid", "network_cost", "prune", "sample_cell", "vertex_channels",
]
