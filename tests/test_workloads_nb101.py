"""The NASBench-101-like search space: sampling, pruning, channel rules and network cost."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.nb101 import (
    CONV1X1,
    CONV3X3,
    INPUT,
    MAX_EDGES,
    MAX_VERTICES,
    MAXPOOL3X3,
    OPS,
    OUTPUT,
    CellSpec,
    cell_cost,
    is_valid,
    network_cost,
    prune,
    sample_cell,
    vertex_channels,
)
from simulator.netcost import REFERENCE_MODELS, Cost, conv_bn, eltwise, pool


def _on_path(spec: CellSpec) -> bool:
    """Every vertex reachable from the input and reaching the output (checked independently)."""
    m = spec.array()
    n = spec.num_vertices
    fwd = {0}
    for v in range(n):
        if v in fwd:
            fwd |= {int(u) for u in np.flatnonzero(m[v])}
    bwd = {n - 1}
    for v in range(n - 1, -1, -1):
        if v in bwd:
            bwd |= {int(u) for u in np.flatnonzero(m[:, v])}
    return fwd == bwd == set(range(n))


def test_sampler_only_yields_valid_specs():
    rng = np.random.default_rng(7)
    sizes = set()
    for _ in range(1500):
        spec = sample_cell(rng)
        m = spec.array()
        assert 2 <= spec.num_vertices <= MAX_VERTICES
        assert spec.num_edges <= MAX_EDGES
        assert np.all(np.tril(m) == 0), "upper triangular"
        assert spec.ops[0] == INPUT and spec.ops[-1] == OUTPUT
        assert all(op in OPS for op in spec.ops[1:-1])
        assert _on_path(spec), spec
        assert is_valid(spec)
        sizes.add(spec.num_vertices)
    assert MAX_VERTICES in sizes and min(sizes) < MAX_VERTICES  # pruning really shrinks some


def _numpy_sampler(rng: np.random.Generator) -> CellSpec:
    """The sampler as first written, on numpy arrays (what sample_cell must go on drawing)."""
    while True:
        m = np.triu(rng.integers(0, 2, size=(MAX_VERTICES, MAX_VERTICES)), 1)
        interior = [OPS[int(i)] for i in rng.integers(0, len(OPS), size=MAX_VERTICES - 2)]
        spec = prune(m, [INPUT, *interior, OUTPUT])
        if is_valid(spec):
            return spec  # type: ignore[return-value]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampler_draws_the_cells_of_the_numpy_sampler(seed: int):
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    for _ in range(3000):
        assert sample_cell(a) == _numpy_sampler(b)
    assert a.random() == b.random()  # and leaves the generator where it did


def test_plain_prune_of_a_draw_agrees_with_prune_and_is_valid():
    from simulator.nb101 import _sampled

    rng = np.random.default_rng(3)
    kept = 0
    for _ in range(20000):
        full, drawn = rng.integers(0, 2, size=(7, 7)), rng.integers(0, len(OPS), size=5)
        spec = prune(np.triu(full, 1), [INPUT, *(OPS[int(i)] for i in drawn), OUTPUT])
        fast = _sampled(full.tolist(), drawn.tolist())
        assert fast == (spec if is_valid(spec) else None)
        kept += fast is not None
    assert 0 < kept < 20000


def test_prune_drops_dangling_vertices_and_rejects_disconnected():
    # vertex 2 is fed by the input but feeds nothing: pruned; vertex 3 is unreachable: pruned
    m = [[0, 1, 1, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    spec = prune(m, [INPUT, CONV3X3, CONV1X1, MAXPOOL3X3, OUTPUT])
    assert spec is not None
    assert spec.ops == (INPUT, CONV3X3, OUTPUT)
    assert spec.matrix == ((0, 1, 0), (0, 0, 1), (0, 0, 0))
    assert prune([[0, 1, 0], [0, 0, 0], [0, 0, 0]], [INPUT, CONV3X3, OUTPUT]) is None
    with pytest.raises(ValueError, match="upper triangular"):
        prune([[0, 0], [1, 0]], [INPUT, OUTPUT])


def test_limits_are_enforced():
    full = np.triu(np.ones((7, 7), dtype=int), 1)  # 21 edges
    spec = prune(full, [INPUT] + [CONV3X3] * 5 + [OUTPUT])
    assert spec is not None and spec.num_edges == 21 and not is_valid(spec)
    big = np.triu(np.ones((8, 8), dtype=int), 1) * np.eye(8, k=1, dtype=int)  # a chain of 8 vertices
    assert not is_valid(prune(big, [INPUT] + [CONV1X1] * 6 + [OUTPUT]))
    assert not is_valid(None)


def test_vertex_channels_split_output_and_take_max_of_successors():
    m = np.array([[0, 1, 0, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])
    assert vertex_channels(16, 9, m) == [16, 5, 5, 4, 9]  # 9 = 5 + 4; vertex 1 feeds both: max
    three = np.array([[0, 1, 1, 1, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])
    assert vertex_channels(64, 128, three) == [64, 43, 43, 42, 128]
    assert vertex_channels(3, 8, np.array([[0, 1], [0, 0]])) == [3, 8]


def test_cell_cost_matches_a_hand_count():
    # input -> conv3x3 -> output, and input -> output; 4 -> 8 channels on 5x5
    spec = prune([[0, 1, 1], [0, 0, 1], [0, 0, 0]], [INPUT, CONV3X3, OUTPUT])
    assert spec is not None
    cost, shape = cell_cost(spec, (4, 5, 5), 8)
    # projection 1x1 4->8 + BN: 32 + 16 params, 25*8*4 = 800 MACs, conv/BN/ReLU 3 x 200 elements
    # conv3x3 8->8 + BN: 576 + 16 params, 25*8*8*9 = 14400 MACs, 600 elements
    # output: projection of the input again (48, 800, 600) and the add (200 elements)
    assert shape == (8, 5, 5)
    assert cost == Cost(params=48 + 592 + 48, macs=800 + 14400 + 800, activations=600 + 600 + 600 + 200,
                        layers=3 + 3 + 3 + 1)


def _cell_cost_with_layers(spec: CellSpec, x: tuple[int, int, int], c_out: int) -> tuple[Cost, tuple]:
    """The cell's cost summed from netcost's own layer functions (what cell_cost's closed forms stand for)."""
    m = spec.array()
    n = spec.num_vertices
    ch = vertex_channels(x[0], c_out, m)
    _, h, w = x
    cost = Cost()
    for t in range(1, n - 1):
        if m[0, t]:
            cost = cost + conv_bn(ch[t], 1)(x)[0]
        if int(m[:t, t].sum()) > 1:
            cost = cost + eltwise((ch[t], h, w))[0]
        if spec.ops[t] == MAXPOOL3X3:
            cost = cost + pool((ch[t], h, w), 3, 1, 1)[0]
        else:
            cost = cost + conv_bn(ch[t], 3 if spec.ops[t] == CONV3X3 else 1)((ch[t], h, w))[0]
    y = (c_out, h, w)
    if n == 2 or not m[1:n - 1, n - 1].any():
        return cost + conv_bn(c_out, 1)(x)[0], y
    if int(m[1:n - 1, n - 1].sum()) > 1:
        cost = cost + eltwise(y)[0]
    if m[0, n - 1]:
        cost = cost + conv_bn(c_out, 1)(x)[0] + eltwise(y)[0]
    return cost, y


def test_cell_cost_equals_the_sum_of_netcost_layers_on_sampled_cells():
    rng = np.random.default_rng(7)
    for _ in range(300):
        spec = sample_cell(rng)
        for x, c_out in (((128, 56, 56), 128), ((256, 28, 28), 512), ((3, 7, 9), 5)):
            assert cell_cost(spec, x, c_out) == _cell_cost_with_layers(spec, x, c_out), spec.label()


def test_network_cost_matches_a_hand_count():
    spec = prune([[0, 1], [0, 0]], [INPUT, OUTPUT])  # the cell is one projection
    assert spec is not None
    cost = network_cost(spec, image=4, labels=3, stem=2, stacks=2, cells=1)
    # stem 3x3 3->2 on 4x4: 54 + 4 params, 16*2*27 = 864 MACs, 96 elements
    # stack 0: projection 2->2 on 4x4: 4 + 4 params, 64 MACs, 96 elements
    # max-pool to 2x2 (8 elements); stack 1: projection 2->4 on 2x2: 8 + 8 params, 32 MACs, 48 elements
    # global pool (4 elements); dense 4->3: 12 + 3 params, 12 MACs, 3 elements
    assert cost == Cost(params=58 + 8 + 16 + 15, macs=864 + 64 + 32 + 12, activations=96 + 96 + 8 + 48 + 4 + 3,
                        layers=3 + 3 + 1 + 3 + 1 + 1)


def test_published_cifar_parameter_count():
    """The NASBench-101 README's example cell has 2,694,282 trainable parameters (32x32, 10 labels)."""
    m = [[0, 1, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0, 0],
         [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0]]
    spec = prune(m, [INPUT, CONV1X1, CONV3X3, CONV3X3, CONV3X3, MAXPOOL3X3, OUTPUT])
    assert spec is not None
    assert network_cost(spec, image=32, labels=10).params == 2_694_282
    at224 = network_cost(spec)
    assert at224.params == 2_694_282 - 10 * 513 + 1000 * 513  # only the dense layer changes
    assert at224.macs == pytest.approx(network_cost(spec, image=32, labels=10).macs * 49, rel=0.01)


@pytest.mark.parametrize(("model", "params", "gmacs"), [
    ("AlexNet", 61_100_840, 0.71), ("vgg16", 138_357_544, 15.47), ("resnet18", 11_689_512, 1.81),
    ("DenseNet", 7_978_856, 2.83), ("mnasnet1", 4_383_312, 0.31), ("shufflenet", 2_278_604, 0.14),
    ("mobilenet", 3_504_872, 0.30), ("resnet50", 25_557_032, 4.09),
])
def test_reference_models_match_published_counts(model: str, params: int, gmacs: float):
    """torchvision's published parameter counts (exact) and GFLOPS (= GMACs, 2 decimals)."""
    cost = REFERENCE_MODELS[model]()
    assert cost.params == params
    assert cost.macs / 1e9 == pytest.approx(gmacs, abs=0.006)
