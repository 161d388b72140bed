"""Static FLOP counts per ONNX operator, from the shapes found by shape inference.

A multiply-add counts as 2 operations. Ops that only move data (Reshape, Transpose, Concat,
Gather ...) count 0; their cost is the bytes they read and write, which the roofline model
charges separately.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx

from edgesplit.model.scope import subgraphs

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


def _qlinear_conv(node: onnx.NodeProto, ins: list[Shape | None], outs: list[Shape]) -> int:
    """``QLinearConv``: x, x_scale, x_zero_point, w, ..., then the bias at 8."""
    bias = [ins[8]] if len(ins) > 8 else []
    return _conv(node, [ins[0], ins[3], *bias], outs)


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
    "QLinearConv": _qlinear_conv,
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


def count_flops(
    node: onnx.NodeProto, in_shapes: list[Shape | None], out_shapes: list[Shape]
) -> int:
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


def static_shapes(g: onnx.GraphProto) -> dict[str, Shape]:
    """The static shapes a graph declares: its inputs', outputs', value infos' and weights'."""
    out: dict[str, Shape] = {}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if vi.type.HasField("tensor_type") and tt.HasField("shape") and all(d >= 0 for d in dims):
            out[vi.name] = tuple(dims)
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    return out


def _elementwise_shape(node: onnx.NodeProto, ins: list[Shape | None]) -> Shape | None:
    """The broadcast shape of an elementwise node's inputs, for subgraphs inference left open."""
    if node.op_type not in _ELEMENTWISE and node.op_type != "Identity" or len(node.output) != 1:
        return None
    if not ins or any(s is None for s in ins):
        return None
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*ins))  # type: ignore[arg-type]
    except ValueError:
        return None


def _graph_flops(g: onnx.GraphProto, outer: Mapping[str, Shape]) -> int:
    """FLOPs of one run of a subgraph; nodes whose shapes inference left open count 0."""
    shapes = {**outer, **static_shapes(g)}
    total = 0
    for n in g.node:
        if n.op_type in ("If", "Loop", "Scan"):
            total += control_flow_flops(n, shapes, 1)
            continue
        ins = [shapes.get(t) if t else None for t in n.input]
        outs = [shapes.get(t) for t in n.output if t]
        if any(o is None for o in outs):
            guessed = _elementwise_shape(n, ins)
            if guessed is None:
                continue
            outs = [guessed]
            shapes[n.output[0]] = guessed
        try:
            total += count_flops(n, ins, outs)  # type: ignore[arg-type]
        except (AssertionError, TypeError, ValueError, IndexError):
            continue  # an input shape left open: no estimate for this node
    return total


def _bound_inputs(
    node: onnx.NodeProto, body: onnx.GraphProto, shapes: Mapping[str, Shape]
) -> dict[str, Shape]:
    """Shapes of a Loop's or Scan's body inputs, from the node inputs they are bound to."""
    names = [i.name for i in body.input]
    if node.op_type == "Loop":  # body (iteration, cond, carried...) <- node (M, cond, carried...)
        pairs = list(zip(names[2:], node.input[2:]))
        return {b: shapes[t] for b, t in pairs if t in shapes}
    if node.op_type != "Scan":
        return {}
    n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    n_state = len(node.input) - n_scan
    out = {b: shapes[t] for b, t in zip(names[:n_state], node.input[:n_state]) if t in shapes}
    for b, t in zip(names[n_state:], node.input[n_state:]):
        if shapes.get(t):
            out[b] = shapes[t][1:]  # one slice along the scan axis (0 unless scan_input_axes says)
    return out


def control_flow_flops(node: onnx.NodeProto, shapes: Mapping[str, Shape], trips: int) -> int:
    """FLOPs of an If (its costlier branch), or a Loop or Scan (its body times ``trips``).

    Args:
        shapes: Static shapes of the enclosing scope's tensors.
        trips: Iterations of a Loop or Scan, where known (else 1).
    """
    per_graph = [
        _graph_flops(g, {**shapes, **_bound_inputs(node, g, shapes)}) for g in subgraphs(node)
    ]
    if not per_graph:
        return 0
    if node.op_type == "If":
        return max(per_graph)
    return sum(per_graph) * max(trips, 1)
