"""The values an input may take, read off the ops that consume it, for made-up profiling data.

Random integers in a small range are wrong for an input that indexes a tensor (``Gather``'s
indices must lie within the axis, ORT stops with "indices element out of data bounds"), names an
axis (``CumSum``), divides (``Div`` by an integer 0), or for a float that is a probability
(``Dropout``'s ratio). :data:`RULES` says, per (op, input position), which values a consumer
accepts; an input's bounds are those of all its consumers, followed through ops that pass values
on unchanged (``Cast``, ``Reshape`` ...). Inputs whose values decide shapes (``Slice`` starts, a
``Reshape`` target) take the sample values the model was loaded with, not these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Bounds:
    """Values in ``[low, high)``; ``high`` may be per last-axis column (``GatherND`` indices)."""

    low: float
    high: np.ndarray  # a scalar, or one bound per column of the last axis

    def meet(self, other: Bounds) -> Bounds:
        a, b = np.asarray(self.high), np.asarray(other.high)
        if a.shape != b.shape:  # per-column against scalar, or columns of different counts
            a, b = np.asarray(a.min(initial=np.inf)), np.asarray(b.min(initial=np.inf))
        return Bounds(max(self.low, other.low), np.minimum(a, b))

    def empty(self) -> bool:
        return bool(np.any(np.asarray(self.high) <= self.low))


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next(
        (int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default
    )


Lookup = Callable[[str], Shape | None]
Const = Callable[[str], np.ndarray | None]


def _axis_dim(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """Indices into the data's ``axis`` (``Gather``, ``GatherElements``, ``ScatterElements``)."""
    data = shape(node.input[0])
    if data is None or not data:
        return None
    axis = _attr(node, "axis", 0)
    return Bounds(0, np.asarray(data[axis % len(data)]))


def _nd_columns(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """``GatherND``/``ScatterND`` indices: column ``j`` of the last axis indexes the data's dim
    ``batch_dims + j``."""
    data, idx = shape(node.input[0]), shape(node.input[1])
    if data is None or not idx:
        return None
    batch = _attr(node, "batch_dims", 0)
    k = idx[-1]
    if batch + k > len(data):
        return None
    return Bounds(0, np.asarray(data[batch : batch + k]))


def _depth(node: onnx.NodeProto, _shape: Lookup, const: Const) -> Bounds | None:
    """``OneHot`` indices below a constant depth."""
    depth = const(node.input[1]) if len(node.input) > 1 else None
    return (
        None
        if depth is None or depth.size != 1
        else Bounds(0, np.asarray(int(depth.reshape(-1)[0])))
    )


def _rank(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """An axis of the first input (``CumSum``, ``CumProd``)."""
    data = shape(node.input[0])
    return None if data is None else Bounds(0, np.asarray(max(len(data), 1)))


def _time_steps(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """``ReverseSequence`` lengths: 1 to the time axis' length."""
    data = shape(node.input[0])
    if data is None or not data:
        return None
    return Bounds(1, np.asarray(data[_attr(node, "time_axis", 0) % len(data)] + 1))


def _batch(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """``RoiAlign`` batch indices into the first input's batch."""
    data = shape(node.input[0])
    return None if not data else Bounds(0, np.asarray(data[0]))


def _split_size(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """``SplitToSequence``'s split as one size: 1 to the axis' length (a list of sizes must add
    up to it, which no bound can say)."""
    data, split = shape(node.input[0]), shape(node.input[1])
    if data is None or split != () or not data:
        return None
    return Bounds(1, np.asarray(data[_attr(node, "axis", 0) % len(data)] + 1))


def _classes(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """Class labels of a loss (``NegativeLogLikelihoodLoss``, ``SoftmaxCrossEntropyLoss``): below
    the scores' class dimension (axis 1)."""
    scores = shape(node.input[0])
    return None if scores is None or len(scores) < 2 else Bounds(0, np.asarray(scores[1]))


def _axes(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """Axes of the first input (``Pad``'s ``axes``)."""
    data = shape(node.input[0])
    return None if data is None else Bounds(0, np.asarray(max(len(data), 1)))


def _sequence_lens(node: onnx.NodeProto, shape: Lookup, _const: Const) -> Bounds | None:
    """``LSTM``/``GRU``/``RNN`` sequence lengths: 1 to the input's time steps."""
    x = shape(node.input[0])
    if x is None or len(x) < 2:
        return None
    return Bounds(1, np.asarray(x[1 if _attr(node, "layout", 0) else 0] + 1))


def _nonzero(_node: onnx.NodeProto, _shape: Lookup, _const: Const) -> Bounds:
    return Bounds(1, np.asarray(8))


def _probability(_node: onnx.NodeProto, _shape: Lookup, _const: Const) -> Bounds:
    return Bounds(0.0, np.asarray(0.5))


RULES: dict[tuple[str, int], Callable[[onnx.NodeProto, Lookup, Const], Bounds | None]] = {
    ("Gather", 1): _axis_dim,
    ("GatherElements", 1): _axis_dim,
    ("ScatterElements", 1): _axis_dim,
    ("Scatter", 1): _axis_dim,
    ("GatherND", 1): _nd_columns,
    ("ScatterND", 1): _nd_columns,
    ("OneHot", 0): _depth,
    ("CumSum", 1): _rank,
    ("CumProd", 1): _rank,
    ("ReverseSequence", 1): _time_steps,
    ("RoiAlign", 2): _batch,
    ("SplitToSequence", 1): _split_size,
    ("NegativeLogLikelihoodLoss", 1): _classes,
    ("SoftmaxCrossEntropyLoss", 1): _classes,
    ("Pad", 3): _axes,
    ("LSTM", 4): _sequence_lens,
    ("GRU", 4): _sequence_lens,
    ("RNN", 4): _sequence_lens,
    ("Div", 1): _nonzero,
    ("Mod", 1): _nonzero,
    ("Dropout", 1): _probability,
}
"""(op type, input position) -> the values that input accepts, from the node, shapes and
constants."""

PASS_ON = frozenset({"Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
"""Ops whose first input's values reach their output unchanged: bounds on the output hold for it."""


def input_bounds(
    nodes: Sequence[onnx.NodeProto], names: Sequence[str], shape: Lookup, const: Const
) -> dict[str, Bounds | None]:
    """For each of ``names`` (graph inputs) that some rule bounds: its bounds (None when a rule
    applies but cannot be met or read, e.g. a ``Gather`` on an axis of unknown length)."""
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in nodes:
        for k, t in enumerate(n.input):
            if t:
                users.setdefault(t, []).append((n, k))
    out: dict[str, Bounds | None] = {}
    for name in names:
        found: Bounds | None = None
        hit = False
        stack, seen = [name], {name}
        while stack:
            t = stack.pop()
            for node, k in users.get(t, ()):
                rule = RULES.get((node.op_type, k)) if node.domain in ("", "ai.onnx") else None
                if rule is not None:
                    hit = True
                    b = rule(node, shape, const)
                    if b is None:
                        found = Bounds(
                            0, np.asarray(0)
                        )  # a rule that cannot be met: no value is known good
                    else:
                        found = b if found is None else found.meet(b)
                elif node.op_type in PASS_ON and k == 0:
                    for o in node.output:
                        if o and o not in seen:
                            seen.add(o)
                            stack.append(o)
        if hit:
            out[name] = None if found is None or found.empty() else found
    return out


def draw(bounds: Bounds, shape: Shape, dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Seeded values of ``shape`` within ``bounds``."""
    high = np.asarray(bounds.high)
    if high.ndim == 1 and not (shape and shape[-1] == high.shape[0]):
        high = np.asarray(high.min())
    if dtype.kind == "f":
        return (
            bounds.low + rng.random(shape) * (np.broadcast_to(high, shape) - bounds.low)
        ).astype(dtype)
    return rng.integers(int(bounds.low), np.broadcast_to(high, shape).astype(np.int64)).astype(
        dtype
    )


def model_bounds(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, Bounds | None]:
    """:func:`input_bounds` in ``model``, from the shapes it declares and its constants (a model
    with inferred shapes: a bundle's part, a model loaded and simplified)."""
    from onnx import numpy_helper

    from edgesplit.model.flops import static_shapes

    shapes, consts = static_shapes(model.graph), constants(model)
    return input_bounds(
        model.graph.node,
        names,
        shapes.get,
        lambda t: numpy_helper.to_array(consts[t]) if t in consts else None,
    )


def constants(model: onnx.ModelProto) -> Mapping[str, onnx.TensorProto]:
    """Initializers and ``Constant`` outputs of the top-level graph, by name."""
    g = model.graph
    out: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.output and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = n.attribute[0].t
    return out
