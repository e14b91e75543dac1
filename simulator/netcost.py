"""Analytic cost of convolutional networks: parameters, multiply-adds, activations.

A network is described layer by layer with small pure functions that take a tensor :data:`Shape` ``(channels, height,
width)`` of ONE sample and return the layer's :class:`Cost` and its output shape. Nothing is executed.

What the counts assume:

* ``params``: trainable parameters (conv and dense weights, biases when the layer has them, batch-norm scale and shift:
  2 per channel). Batch-norm running statistics are not trainable and not counted.
* ``macs``: forward multiply-adds of convolutions and dense layers per sample
  (``out_h * out_w * c_out * (c_in / groups) * k * k``). Element-wise layers (batch norm, ReLU, adds, pooling) count no
  MACs: they are memory-bound.
* ``activations``: output elements of every layer per sample, element-wise ones included. It is a proxy for the memory
  traffic of a training step and for the activation memory a sample holds (see :mod:`simulator.perfmodel`).

The reference ImageNet models (:data:`REFERENCE_MODELS`) follow the torchvision definitions, written from their
published layer tables; their parameter counts match torchvision's exactly (tested), which checks the counter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Shape = tuple[int, int, int]  # (channels, height, width) of one sample


@dataclass(frozen=True)
class Cost:
    """Parameters, forward multiply-adds and activation elements (per sample)."""

    params: int = 0
    macs: int = 0
    activations: int = 0
    layers: int = 0  # layer ops (kernels launched per forward pass)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.params + other.params, self.macs + other.macs, self.activations + other.activations,
                    self.layers + other.layers)


def total(costs: list[Cost]) -> Cost:
    out = Cost()
    for c in costs:
        out = out + c
    return out


def _out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def conv(x: Shape, c_out: int, k: int, stride: int = 1, pad: int | None = None, groups: int = 1,
         bias: bool = False) -> tuple[Cost, Shape]:
    """A 2-D convolution (``pad`` defaults to ``k // 2``, i.e. 'same' at stride 1)."""
    c_in, h, w = x
    if c_in % groups or c_out % groups:
        raise ValueError(f"conv: channels {c_in}->{c_out} not divisible by groups={groups}")
    p = k // 2 if pad is None else pad
    oh, ow = _out(h, k, stride, p), _out(w, k, stride, p)
    weights = c_out * (c_in // groups) * k * k
    return Cost(weights + (c_out if bias else 0), oh * ow * weights, c_out * oh * ow, 1), (c_out, oh, ow)


def bn(x: Shape) -> tuple[Cost, Shape]:
    """Batch norm: 2 trainable parameters per channel, one element-wise pass."""
    c, h, w = x
    return Cost(2 * c, 0, c * h * w, 1), x


def eltwise(x: Shape) -> tuple[Cost, Shape]:
    """ReLU, an add, a channel shuffle: one element-wise pass, no parameters."""
    c, h, w = x
    return Cost(0, 0, c * h * w, 1), x


def pool(x: Shape, k: int, stride: int, pad: int = 0) -> tuple[Cost, Shape]:
    c, h, w = x
    oh, ow = _out(h, k, stride, pad), _out(w, k, stride, pad)
    return Cost(0, 0, c * oh * ow, 1), (c, oh, ow)


def dense(features: int, units: int, bias: bool = True) -> Cost:
    return Cost(features * units + (units if bias else 0), features * units, units, 1)


def chain(x: Shape, *layers: Callable[[Shape], tuple[Cost, Shape]]) -> tuple[Cost, Shape]:
    """Apply layers in sequence; the cost is their sum."""
    costs = []
    for layer in layers:
        c, x = layer(x)
        costs.append(c)
    return total(costs), x


def conv_bn(c_out: int, k: int, stride: int = 1, groups: int = 1, act: bool = True,
            pad: int | None = None) -> Callable[[Shape], tuple[Cost, Shape]]:
    """conv (no bias) + batch norm (+ ReLU when ``act``), the usual block."""
    def layer(x: Shape) -> tuple[Cost, Shape]:
        steps: list[Callable[[Shape], tuple[Cost, Shape]]] = [lambda s: conv(s, c_out, k, stride, pad, groups), bn]
        if act:
            steps.append(eltwise)
        return chain(x, *steps)
    return layer


IMAGE: Shape = (3, 224, 224)
CLASSES = 1000


def alexnet() -> Cost:
    """torchvision AlexNet: 5 convs with bias and ReLU, 3 max-pools, adaptive 6x6 pool, 3 dense."""
    def cr(c: int, k: int, s: int, p: int) -> Callable[[Shape], tuple[Cost, Shape]]:
        return lambda x: chain(x, lambda y: conv(y, c, k, s, p, bias=True), eltwise)
    mp = lambda x: pool(x, 3, 2)  # noqa: E731
    c, x = chain(IMAGE, cr(64, 11, 4, 2), mp, cr(192, 5, 1, 2), mp, cr(384, 3, 1, 1), cr(256, 3, 1, 1),
                 cr(256, 3, 1, 1), mp)
    return c + dense(256 * 6 * 6, 4096) + dense(4096, 4096) + dense(4096, CLASSES) + Cost(0, 0, 2 * 4096, 2)


def vgg16() -> Cost:
    """torchvision VGG-16 (no batch norm): 13 3x3 convs with bias and ReLU, 5 max-pools, 3 dense."""
    cfg = [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0]
    layers: list[Callable[[Shape], tuple[Cost, Shape]]] = []
    for v in cfg:
        if v:
            layers.append(lambda x, v=v: chain(x, lambda y: conv(y, v, 3, bias=True), eltwise))
        else:
            layers.append(lambda x: pool(x, 2, 2))
    c, x = chain(IMAGE, *layers)
    return c + dense(512 * 7 * 7, 4096) + dense(4096, 4096) + dense(4096, CLASSES) + Cost(0, 0, 2 * 4096, 2)


def _resnet_stem() -> tuple[Cost, Shape]:
    return chain(IMAGE, conv_bn(64, 7, 2), lambda x: pool(x, 3, 2, 1))


def _basic_block(x: Shape, c_out: int, stride: int) -> tuple[Cost, Shape]:
    main, y = chain(x, conv_bn(c_out, 3, stride), conv_bn(c_out, 3, act=False))
    short = chain(x, conv_bn(c_out, 1, stride, act=False))[0] if (stride != 1 or x[0] != c_out) else Cost()
    return main + short + eltwise(y)[0] + eltwise(y)[0], y  # add, ReLU


def _bottleneck(x: Shape, width: int, stride: int) -> tuple[Cost, Shape]:
    c_out = 4 * width
    main, y = chain(x, conv_bn(width, 1), conv_bn(width, 3, stride), conv_bn(c_out, 1, act=False))
    short = chain(x, conv_bn(c_out, 1, stride, act=False))[0] if (stride != 1 or x[0] != c_out) else Cost()
    return main + short + eltwise(y)[0] + eltwise(y)[0], y


def _resnet(block: Callable[[Shape, int, int], tuple[Cost, Shape]], depths: tuple[int, ...]) -> Cost:
    cost, x = _resnet_stem()
    for stage, n in enumerate(depths):
        for i in range(n):
            c, x = block(x, 64 * 2 ** stage, 2 if (i == 0 and stage > 0) else 1)
            cost = cost + c
    return cost + dense(x[0], CLASSES)


def resnet18() -> Cost:
    """torchvision ResNet-18: basic blocks (2, 2, 2, 2)."""
    return _resnet(_basic_block, (2, 2, 2, 2))


def resnet50() -> Cost:
    """torchvision ResNet-50 (v1.5, stride on the 3x3): bottlenecks (3, 4, 6, 3)."""
    return _resnet(_bottleneck, (3, 4, 6, 3))


def densenet121() -> Cost:
    """torchvision DenseNet-121: growth 32, bottleneck 4x, blocks (6, 12, 24, 16), pre-activation. Each layer
    concatenates its 32 new channels to its input, a full copy (counted as activations)."""
    cost, x = chain(IMAGE, conv_bn(64, 7, 2), lambda y: pool(y, 3, 2, 1))
    for b, n in enumerate((6, 12, 24, 16)):
        for _ in range(n):
            c, y = chain(x, bn, eltwise, lambda s: conv(s, 128, 1), bn, eltwise, lambda s: conv(s, 32, 3))
            x = (x[0] + 32, x[1], x[2])
            cost = cost + c + eltwise(x)[0]  # the concatenation
        if b < 3:
            c, x = chain(x, bn, eltwise, lambda s: conv(s, s[0] // 2, 1), lambda s: pool(s, 2, 2))
            cost = cost + c
    c, x = chain(x, bn, eltwise)
    return cost + c + dense(x[0], CLASSES)


def _inverted_residual(x: Shape, c_out: int, k: int, stride: int, expand: int) -> tuple[Cost, Shape]:
    hidden = x[0] * expand
    layers = [conv_bn(hidden, 1)] if expand != 1 else []
    layers += [conv_bn(hidden, k, stride, groups=hidden), conv_bn(c_out, 1, act=False)]
    c, y = chain(x, *layers)
    if stride == 1 and x[0] == c_out:
        c = c + eltwise(y)[0]
    return c, y


def mobilenet_v2() -> Cost:
    """torchvision MobileNetV2 (width 1.0): inverted residuals, ReLU6, 1280-channel head."""
    cost, x = chain(IMAGE, conv_bn(32, 3, 2))
    for t, c_out, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                           (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            c, x = _inverted_residual(x, c_out, 3, s if i == 0 else 1, t)
            cost = cost + c
    c, x = chain(x, conv_bn(1280, 1))
    return cost + c + dense(x[0], CLASSES)


def mnasnet1_0() -> Cost:
    """torchvision MNASNet 1.0: a separable stem, then six stacks of inverted residuals."""
    cost, x = chain(IMAGE, conv_bn(32, 3, 2), conv_bn(32, 3, groups=32), conv_bn(16, 1, act=False))
    for c_out, k, s, t, n in ((24, 3, 2, 3, 3), (40, 5, 2, 3, 3), (80, 5, 2, 6, 3), (96, 3, 1, 6, 2),
                              (192, 5, 2, 6, 4), (320, 3, 1, 6, 1)):
        for i in range(n):
            c, x = _inverted_residual(x, c_out, k, s if i == 0 else 1, t)
            cost = cost + c
    c, x = chain(x, conv_bn(1280, 1))
    return cost + c + dense(x[0], CLASSES)


def shufflenet_v2_x1_0() -> Cost:
    """torchvision ShuffleNetV2 x1.0: stages of (4, 8, 4) units, channels (116, 232, 464), 1024 head."""
    cost, x = chain(IMAGE, conv_bn(24, 3, 2), lambda y: pool(y, 3, 2, 1))
    for c_out, n in ((116, 4), (232, 8), (464, 4)):
        half = c_out // 2
        for i in range(n):
            if i == 0:
                b1, y = chain(x, conv_bn(x[0], 3, 2, groups=x[0], act=False), conv_bn(half, 1))
                b2, _ = chain(x, conv_bn(half, 1), conv_bn(half, 3, 2, groups=half, act=False), conv_bn(half, 1))
                c = b1 + b2
            else:
                c, y = chain((half, x[1], x[2]), conv_bn(half, 1), conv_bn(half, 3, groups=half, act=False),
                             conv_bn(half, 1))
            x = (c_out, y[1], y[2])
            cost = cost + c + eltwise(x)[0] + eltwise(x)[0]  # concat, shuffle
    c, x = chain(x, conv_bn(1024, 1))
    return cost + c + dense(x[0], CLASSES)


# name in summit-scaling.csv (or a new name) -> the architecture assumed for it
REFERENCE_MODELS: dict[str, Callable[[], Cost]] = {
    "AlexNet": alexnet, "vgg16": vgg16, "resnet18": resnet18, "DenseNet": densenet121, "mnasnet1": mnasnet1_0,
    "shufflenet": shufflenet_v2_x1_0, "mobilenet": mobilenet_v2, "resnet50": resnet50,
}
MEASURED_MODELS = ("AlexNet", "vgg16", "resnet18", "DenseNet", "mnasnet1", "shufflenet", "mobilenet")
