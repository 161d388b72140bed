"""Operators split into pieces that run at once on several processors, written into the model.

Two kinds of split (CoDL, MobiSys'22; muLayer, EuroSys'19):

* **rows**: a run of row-local nodes (:mod:`edgesplit.model.rows`) cut along the image height; each
  piece reads the band of rows its output rows need (their halo included) and writes its rows.
* **channels**: one Conv, Gemm or MatMul with a constant weight, and the per-channel nodes after it
  (BatchNormalization, activations, a bias or a residual Add), cut along output channels (the
  last axis for Gemm and MatMul); each piece holds its slice of the weights.

:func:`rewrite` writes a split into the model as its pieces followed by a ``Concat`` that joins
their
outputs back into the original tensor, so the rest of the graph is unchanged and the pieces are
independent branches: every later stage (profile, schedule, compile, runtime) handles them as any
other nodes, and a piece on another processor runs at the same time as its sibling. The rewritten
model computes what the original does (each piece is checked against it when compiled).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesplit.errors import PlanError
from edgesplit.model.graph import ModelGraph
from edgesplit.model.rows import H_AXIS, Rows, RowSegment, join, row_piece_nodes, row_segments

PIECE_MARK = "edgesplit: piece"
JOIN_MARK = "edgesplit: joins the pieces of a split"

CHANNEL_HEADS = frozenset({"Conv", "Gemm", "MatMul"})
CHANNEL_FOLLOWERS = frozenset(
    {
        "BatchNormalization",
        "Relu",
        "LeakyRelu",
        "Clip",
        "Sigmoid",
        "Tanh",
        "HardSigmoid",
        "HardSwish",
        "Add",
        "Mul",
    }
)
"""Nodes whose output channel c reads channel c of their input only (given per-channel
constants)."""


@dataclass(frozen=True)
class Split:
    """One split as a plan records it.

    Attributes:
        kind: ``rows`` or ``channels``.
        nodes: The original nodes the pieces replace (graph order).
        input: The tensor the pieces read (for channels: the head's data input).
        output: The tensor their outputs are joined into.
        bands: Per piece, ``(lo, hi)``: its rows (or channels) of ``output``.
        processors: Per piece, where the plan runs it.
    """

    kind: str
    nodes: tuple[str, ...]
    input: str
    output: str
    bands: tuple[tuple[int, int], ...]
    processors: tuple[str, ...]

    def tag(self, k: int) -> str:
        """The suffix of piece ``k``'s node and tensor names."""
        return f"{self.output}.{self.kind[0]}{k}"

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "nodes": list(self.nodes),
            "input": self.input,
            "output": self.output,
            "bands": [list(b) for b in self.bands],
            "processors": list(self.processors),
        }

    @staticmethod
    def from_json(d: Mapping) -> Split:
        return Split(
            str(d["kind"]),
            tuple(d["nodes"]),
            str(d["input"]),
            str(d["output"]),
            tuple((int(a), int(b)) for a, b in d["bands"]),
            tuple(d["processors"]),
        )


def split_bands(size: int, shares: Sequence[float], align: int = 1) -> tuple[tuple[int, int], ...]:
    """Consecutive bands of ``size`` in proportion to ``shares``, bounds on multiples of ``align``
    (the last one ends at ``size``); bands that come out empty are dropped."""
    total = float(sum(shares))
    bounds, acc = [0], 0.0
    for s in shares[:-1]:
        acc += s
        b = int(round(size * acc / total / align)) * align
        bounds.append(min(max(b, bounds[-1]), size))
    bounds.append(size)
    return tuple((a, b) for a, b in zip(bounds, bounds[1:]) if b > a)


# ---- channels


def _attrs(proto: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in proto.attribute}


def _weights(graph: ModelGraph) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in graph.model.graph.initializer}


def channel_axis(graph: ModelGraph, head: int) -> int | None:
    """The output axis a head node is cut along (1 for Conv, the last for Gemm and MatMul), or None
    when it cannot be cut (a grouped Conv, a weight that is not a constant, a transposed A)."""
    node = graph.nodes[head]
    proto = graph.model.graph.node[head]
    weights = _weights(graph)
    if node.op_type not in CHANNEL_HEADS or len(proto.input) < 2 or proto.input[1] not in weights:
        return None
    a = _attrs(proto)
    if node.op_type == "Conv":
        return 1 if a.get("group", 1) == 1 else None
    if node.op_type == "Gemm" and a.get("transA", 0):
        return None
    if node.op_type == "MatMul" and len(graph.tensors[proto.input[1]].shape) != 2:
        return None
    return len(graph.tensors[node.outputs[0]].shape) - 1


def channel_segment(graph: ModelGraph, head: int) -> tuple[int, ...] | None:
    """The head and the per-channel nodes after it that can go into its pieces (each the only
    reader of the one before), or None when the head cannot be cut."""
    axis = channel_axis(graph, head)
    if axis is None:
        return None
    weights = _weights(graph)
    chain = [head]
    out = graph.nodes[head].outputs[0]
    shape = graph.tensors[out].shape
    while True:
        readers = graph.consumers.get(out, ())
        if len(readers) != 1 or out in graph.outputs:
            break
        k = readers[0]
        node = graph.nodes[k]
        if node.op_type not in CHANNEL_FOLLOWERS or len(node.outputs) != 1:
            break
        others = [t for t in node.inputs if t != out]
        if not all(_per_channel(graph, t, shape, axis, t in weights) for t in others):
            break
        chain.append(k)
        out = node.outputs[0]
    return tuple(chain)


def _per_channel(graph: ModelGraph, t: str, shape: tuple[int, ...], axis: int, const: bool) -> bool:
    """A second input a piece can take its slice of: the full shape (sliced in the piece), a
    per-channel constant, or a scalar."""
    s = graph.tensors[t].shape
    if tuple(s) == tuple(shape):
        return True
    if not const:
        return False
    if int(np.prod(s)) == 1:
        return True
    n = len(shape) - axis  # the channel's place from the end
    return len(s) >= n and s[-n] == shape[axis] and all(d == 1 for i, d in enumerate(s[-n + 1 :]))


def channel_piece_nodes(
    graph: ModelGraph, chain: Sequence[int], band: tuple[int, int], tag: str
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """The nodes of the piece computing output channels ``band`` of the chain (see
    :func:`channel_segment`), its own weights, and its output's name (``<output>@<tag>``)."""
    lo, hi = band
    protos = graph.model.graph.node
    weights = _weights(graph)
    head = protos[chain[0]]
    axis = channel_axis(graph, chain[0])
    assert axis is not None
    out_shape = graph.tensors[graph.nodes[chain[0]].outputs[0]].shape
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    chain_outs = {graph.nodes[k].outputs[0] for k in chain}

    def sliced_weight(t: str, along: int) -> str:
        arr = numpy_helper.to_array(weights[t])
        idx = [slice(None)] * arr.ndim
        idx[along] = slice(lo, hi)
        name = f"{t}@{tag}"
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr[tuple(idx)]), name))
        return name

    def local(t: str) -> str:
        return f"{t}@{tag}"

    for k in chain:
        proto = protos[k]
        ins = []
        for i, t in enumerate(proto.input):
            if k == chain[0]:
                ins.append(_head_input(graph, head, i, t, sliced_weight) if t else t)
            elif t in chain_outs:
                ins.append(local(t))
            elif t in weights:
                ins.append(_follower_const(graph, t, out_shape, axis, sliced_weight))
            else:  # a full-shape activation (a residual): its slice of channels
                want = f"{t}@{tag}.ch{lo}_{hi}"
                _channel_slice(nodes, inits, t, lo, hi, axis, want)
                ins.append(want)
        outs = [local(t) for t in proto.output]
        nodes.append(
            helper.make_node(proto.op_type, ins, outs, name=f"{proto.name}@{tag}", **_attrs(proto))
        )
    return nodes, inits, local(graph.nodes[chain[-1]].outputs[0])


def _head_input(graph: ModelGraph, head: onnx.NodeProto, i: int, t: str, sliced) -> str:
    """The head's inputs in a piece: the data whole, the weight and bias sliced."""
    if i == 0:
        return t
    if head.op_type == "Conv":
        return sliced(t, 0)  # W [M, C, kh, kw], B [M]
    if head.op_type == "Gemm":
        if i == 1:
            return sliced(t, 0 if _attrs(head).get("transB", 0) else 1)  # B [N, K] or [K, N]
        c = graph.tensors[t].shape
        return sliced(t, len(c) - 1) if c and c[-1] > 1 else t  # C broadcast along N
    return sliced(t, 1)  # MatMul's weight [K, N]


def _follower_const(graph: ModelGraph, t: str, shape: tuple[int, ...], axis: int, sliced) -> str:
    s = graph.tensors[t].shape
    if int(np.prod(s)) == 1:
        return t
    if tuple(s) == tuple(shape):
        return sliced(t, axis)
    return sliced(t, len(s) - (len(shape) - axis))


def _channel_slice(nodes: list, inits: list, t: str, lo: int, hi: int, axis: int, out: str) -> None:
    consts = {f"{out}__starts": [lo], f"{out}__ends": [hi], f"{out}__axes": [axis]}
    for k, v in consts.items():
        inits.append(numpy_helper.from_array(np.array(v, dtype=np.int64), k))
    nodes.append(helper.make_node("Slice", [t, *consts], [out], name=f"{out}__slice"))


# ---- the rewrite


def _row_segment(graph: ModelGraph, split: Split) -> RowSegment:
    """The split's nodes as a row segment: consecutive smallest segments of the graph (each one's
    output the next one's input) from ``split.input`` to ``split.output``."""
    units = {s.input: s for s in row_segments(graph)}
    run, t = [], split.input
    while t in units and (not run or run[-1].output != split.output):
        run.append(units[t])
        t = units[t].output
    names = tuple(graph.nodes[k].name for s in run for k in s.nodes)
    if not run or run[-1].output != split.output or names != tuple(split.nodes):
        raise PlanError(
            f"split of {split.output}: its nodes are not one run of row-local nodes from "
            f"{split.input}"
        )
    return join(run)


def check_split(graph: ModelGraph, split: Split) -> None:
    """That ``split`` fits ``graph``: known nodes, a kind that applies to them, bands that tile the
    output exactly, one processor per band.

    Raises:
        PlanError: naming the split and what is wrong.
    """
    where = f"split of {split.output}"
    missing = [n for n in split.nodes if n not in graph.index]
    if missing or split.output not in graph.tensors or split.input not in graph.tensors:
        raise PlanError(
            f"{where}: names nodes or tensors the model lacks ({', '.join(missing[:3])})"
        )
    if len(split.bands) != len(split.processors) or len(split.bands) < 2:
        raise PlanError(f"{where}: needs two bands or more, one processor each")
    shape = graph.tensors[split.output].shape
    if split.kind == "rows":
        size = shape[H_AXIS] if len(shape) == 4 else -1
        _row_segment(graph, split)
    elif split.kind == "channels":
        chain = channel_segment(graph, graph.index[split.nodes[0]])
        if chain is None or [graph.nodes[k].name for k in chain][: len(split.nodes)] != list(
            split.nodes
        ):
            raise PlanError(
                f"{where}: {split.nodes[0]} and the nodes after it cannot be cut by channels"
            )
        axis = channel_axis(graph, chain[0])
        size = shape[axis] if axis is not None else -1
    else:
        raise PlanError(f"{where}: unknown kind '{split.kind}' (rows or channels)")
    edges = [b for band in split.bands for b in band]
    tiled = edges[0] == 0 and edges[-1] == size and all(a < b for a, b in split.bands)
    if not tiled or any(
        split.bands[i][1] != split.bands[i + 1][0] for i in range(len(split.bands) - 1)
    ):
        raise PlanError(f"{where}: bands {list(split.bands)} do not tile 0..{size}")


def rewrite(graph: ModelGraph, splits: Sequence[Split]) -> ModelGraph:
    """``graph`` with each split written in: its nodes replaced by the pieces and a ``Concat`` of
    their outputs named as the original output (graph order kept, pieces first). The model's
    sha256 stays the original's: the rewritten model computes the same function.

    Raises:
        PlanError: for a split that does not fit the graph (:func:`check_split`), or two splits
            sharing a node.
    """
    from edgesplit.model.shapes import build_graph

    if not splits:
        return graph
    owner: dict[str, str] = {}
    for s in splits:
        check_split(graph, s)
        for n in s.nodes:
            if n in owner:
                raise PlanError(f"node {n} is in two splits ({owner[n]} and {s.output})")
            owner[n] = s.output
    by_last = {s.nodes[-1]: s for s in splits}
    g = graph.model.graph
    nodes: list[onnx.NodeProto] = []
    inits = list(g.initializer)
    for proto in g.node:
        if proto.name in by_last:
            made, extra = _pieces(graph, by_last[proto.name])
            nodes += made
            inits += extra
        elif proto.name not in owner:
            nodes.append(proto)
    used = {t for n in nodes for t in n.input}
    new = helper.make_graph(
        nodes, g.name, list(g.input), list(g.output), [t for t in inits if t.name in used]
    )
    model = helper.make_model(new, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    model = onnx.shape_inference.infer_shapes(model)
    return build_graph(graph.path, graph.sha256, model, graph.sample_inputs, 1 << 20, graph.notes)


def _pieces(graph: ModelGraph, split: Split) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Every piece's nodes, then the ``Concat`` of their outputs."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    outs = []
    for k, band in enumerate(split.bands):
        if split.kind == "rows":
            seg = _row_segment(graph, split)
            made, weights, _, out = row_piece_nodes(graph, seg, Rows(*band), split.tag(k))
            extra = [w for w in weights.values() if w.name not in graph.tensors]
        else:
            chain = [graph.index[n] for n in split.nodes]
            made, extra, out = channel_piece_nodes(graph, chain, band, split.tag(k))
        for n in made:
            n.doc_string = f"{PIECE_MARK} {split.tag(k)}"
        nodes += made
        inits += extra
        outs.append(out)
    if split.kind == "rows":
        axis = H_AXIS
    else:
        axis = channel_axis(graph, graph.index[split.nodes[0]])
    join_node = helper.make_node(
        "Concat", outs, [split.output], name=f"{split.output}.join", axis=axis
    )
    join_node.doc_string = JOIN_MARK
    nodes.append(join_node)
    return nodes, inits


def piece_layout(graph: ModelGraph) -> tuple[tuple[int, ...], frozenset[int]]:
    """For a rewritten graph: each node's piece (numbered in graph order; -1 for a node in none)
    and the join nodes. A part never mixes a piece with other nodes and never begins before a
    join: a piece merged into the part before it would wait for that part's end, and a join in
    the part of a piece would hold that piece's output back until the other pieces end; either way
    the pieces would not run at the same time."""
    ids: dict[str, int] = {}
    piece = []
    joins = set()
    for i, n in enumerate(graph.model.graph.node):
        if n.doc_string.startswith(PIECE_MARK):
            piece.append(ids.setdefault(n.doc_string, len(ids)))
        else:
            piece.append(-1)
            if n.doc_string == JOIN_MARK:
                joins.add(i)
    return tuple(piece), frozenset(joins)


def piece_nodes(split: Split, rewritten: ModelGraph) -> list[list[int]]:
    """Per piece of ``split``, the indices of its nodes in the rewritten graph."""
    out = []
    for k in range(len(split.bands)):
        mine = re.compile(re.escape(f"@{split.tag(k)}") + r"(?!\d)")
        out.append([i for i, n in enumerate(rewritten.nodes) if mine.search(n.name)])
    return out
