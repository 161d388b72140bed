"""Static FLOP counts per ONNX operator, from the shapes found by shape inference.

A multiply-add counts as 2 operations. Ops that only move data (Reshape, Transpose, Concat,
Gather ...) count 0; their cost is the bytes they read and write, which the roofline model
charges separately.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx

Shape = tuple[int, ...]

# Per-element operation counts for elementwise and activation ops. Transcendentals count a few
# operations each, as in the usual roofline literature (e.g. nn-Meter's kernel FLOP tables).
_ELEMENTWISE: dict[str, int] = {
    **dict.fromkeys(
        "Add Sub Mul Div Max Min Mean Sum Pow Neg Abs Relu LeakyRelu PRelu Clip Floor Ceil "
        "Round Sign Not And Or Xor Equal Greater Less GreaterOrEqual LessOrEqual Where Mod "
        "Reciprocal ThresholdedRelu Shrink BitShift".split(),
        1,
    ),
    **dict.fromkeys("HardSigmoid HardSwish Sqrt Selu Elu Celu".split(), 3),
    **dict.fromkeys("Sigmoid Tanh Exp Log Erf Softplus Softsign Sin Cos Mish Gelu".split(), 4),
}
_NORMS: dict[str, int] = {
    "BatchNormalization": 2,
    "LayerNormalization": 8,
    "InstanceNormalization": 8,
    "GroupNormalization": 8,
    "LpNormalization": 3,
    "MeanVarianceNormalization": 8,
    "LRN": 6,
    "Softmax": 5,
    "LogSoftmax": 6,
    "Hardmax": 1,
}


def _prod(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _conv(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    w = ins[1]
    assert w is not None
    kernel = _prod(w[2:])
    macs = _prod(outs[0]) * w[1] * kernel  # w[1] = Cin / group
    bias = _prod(outs[0]) if len(ins) > 2 and ins[2] is not None else 0
    return 2 * macs + bias


def _conv_transpose(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    macs = _prod(x) * w[1] * _prod(w[2:])  # each input element feeds Cout/group * kernel outputs
    return 2 * macs + (_prod(outs[0]) if len(ins) > 2 and ins[2] is not None else 0)


def _matmul(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    a = ins[0]
    assert a is not None
    k = a[-1] if a else 1
    return 2 * _prod(outs[0]) * k


def _gemm(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    a = ins[0]
    assert a is not None
    k = a[0] if _attr(node, "transA", 0) else a[-1]
    return 2 * _prod(outs[0]) * k + (_prod(outs[0]) if len(ins) > 2 else 0)


def _pool(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    return _prod(outs[0]) * _prod(_attr(node, "kernel_shape", [1]))


def _global_pool(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    x = ins[0]
    assert x is not None
    return _prod(x)


def _reduce(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    x = ins[0]
    assert x is not None
    return _prod(x)


def _rnn(gates: int, extra: int) -> Callable[[onnx.NodeProto, list, list], int]:
    def count(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
        x, w = ins[0], ins[1]
        assert x is not None and w is not None
        seq, batch, inp = x
        dirs, hidden = w[0], w[1] // gates
        per_step = 2 * gates * hidden * (inp + hidden) + extra * hidden
        return seq * batch * dirs * per_step

    return count


def _einsum(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    # Upper bound: every output element sums over the largest input's extra dimensions.
    biggest = max(_prod(s) for s in ins if s is not None)
    return 2 * max(biggest, _prod(outs[0]))


_COUNTERS: dict[str, Callable[[onnx.NodeProto, list, list], int]] = {
    "Conv": _conv,
    "ConvInteger": _conv,
    "QLinearConv": _conv,
    "ConvTranspose": _conv_transpose,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "Gemm": _gemm,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
    "GlobalAveragePool": _global_pool,
    "GlobalMaxPool": _global_pool,
    "LSTM": _rnn(4, 10),
    "GRU": _rnn(3, 8),
    "RNN": _rnn(1, 2),
    "Einsum": _einsum,
    "Resize": lambda n, i, o: 4 * _prod(o[0]),
    "Upsample": lambda n, i, o: 4 * _prod(o[0]),
}


def count_flops(node: onnx.NodeProto, in_shapes: list[Shape | None], out_shapes: list[Shape]) -> int:
    """FLOPs of one node.

    Args:
        node: The ONNX node.
        in_shapes: Static shape of each input (None for an omitted optional input).
        out_shapes: Static shape of each output.
    """
    op = node.op_type
    if op in _COUNTERS:
        return int(_COUNTERS[op](node, in_shapes, out_shapes))
    if not out_shapes:
        return 0
    if op in _ELEMENTWISE:
        return _ELEMENTWISE[op] * _prod(out_shapes[0])
    if op in _NORMS:
        return _NORMS[op] * _prod(out_shapes[0])
    if op.startswith("Reduce") or op in ("ArgMax", "ArgMin", "CumSum", "TopK"):
        return _reduce(node, in_shapes, out_shapes)
    return 0
