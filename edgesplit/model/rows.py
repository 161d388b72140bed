"""Row pieces: a run of row-local operators cut along the image height into pieces that run apart.

A *row segment* is a connected run of nodes between two single tensors (the cuts of the graph:
everything that flows from the first to the second passes through them) whose every node is
*row-local*: output row ``r`` of each node depends only on a window of input rows around ``r``
(convolutions, pooling, elementwise operators, channel concatenation). Such a segment computes
rows ``[a, b)`` of its output from a band of rows of its input: the band the output rows need,
widened at each convolution and pool by its kernel (the *halo*). Two pieces of a segment, rows
``[0, a)`` and ``[a, H)``, share no work but their halos, so they can run at the same time on
two processors, and their outputs stacked along the height are the segment's output exactly.

This module finds the segments of a :class:`ModelGraph` (:func:`row_segments`) and writes one
piece as a stand-alone ONNX model (:func:`row_piece`): the segment's nodes with their padding
redone for the band (zero padding only where the band touches the image's own edge) and a
``Slice`` wherever a node needs fewer rows of a tensor than another node computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from edgesplit.model.graph import ModelGraph

H_AXIS = 2
"""The height axis of an NCHW tensor: pieces are cut along it."""

WINDOWED = frozenset({"Conv", "MaxPool", "AveragePool"})
ROW_WISE = frozenset(
    {
        "BatchNormalization", "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh",
        "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus", "Identity", "Add", "Sub", "Mul",
        "Div", "Concat", "Dropout",
    }
)  # fmt: skip
"""Operators whose output row r reads row r of each 4-D input (constants broadcast)."""


@dataclass(frozen=True)
class Rows:
    """A band of rows ``[lo, hi)``."""

    lo: int
    hi: int

    def union(self, other: Rows | None) -> Rows:
        return self if other is None else Rows(min(self.lo, other.lo), max(self.hi, other.hi))

    @property
    def n(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class RowSegment:
    """Nodes ``nodes`` (indices in graph order) that read ``input`` and write ``output``, all 4-D
    NCHW tensors of heights ``in_height`` and ``out_height``."""

    nodes: tuple[int, ...]
    input: str
    output: str
    in_height: int
    out_height: int


@dataclass(frozen=True)
class Window:
    """What a windowed node (Conv or pool) reads along the height: kernel extent, stride and the
    padding above and below."""

    extent: int
    stride: int
    pad_top: int
    pad_bottom: int

    def needs(self, out: Rows, in_height: int) -> tuple[Rows, int, int]:
        """The input rows output rows ``out`` read, and the top and bottom padding of the band."""
        first = out.lo * self.stride - self.pad_top
        last_end = (out.hi - 1) * self.stride - self.pad_top + self.extent
        rows = Rows(max(0, first), min(in_height, last_end))
        return rows, rows.lo - first, last_end - rows.hi


def _attrs(proto: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in proto.attribute}


def _explicit_pads(proto: onnx.NodeProto, graph: ModelGraph, kernel: Sequence[int]) -> list[int]:
    """The node's pads ``[top, left, bottom, right]``, auto_pad made explicit."""
    a = _attrs(proto)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        return list(a.get("pads", [0, 0, 0, 0]))
    if auto == "VALID":
        return [0, 0, 0, 0]
    strides = a.get("strides", [1, 1])
    dil = a.get("dilations", [1, 1])
    x, y = graph.tensors[proto.input[0]].shape, graph.tensors[proto.output[0]].shape
    pads = [0, 0, 0, 0]
    for i in range(2):
        extent = (kernel[i] - 1) * dil[i] + 1
        total = max(0, (y[2 + i] - 1) * strides[i] + extent - x[2 + i])
        small, big = total // 2, total - total // 2
        pads[i], pads[i + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
    return pads


def _kernel(proto: onnx.NodeProto, graph: ModelGraph) -> list[int]:
    a = _attrs(proto)
    if "kernel_shape" in a:
        return list(a["kernel_shape"])
    return list(graph.tensors[proto.input[1]].shape[2:])


def window(proto: onnx.NodeProto, graph: ModelGraph) -> Window | None:
    """The height window of a Conv or pool node; None when it cannot be cut by rows (not 2-D,
    a ceil-mode average pool that counts padding)."""
    a = _attrs(proto)
    if len(graph.tensors[proto.input[0]].shape) != 4:
        return None
    if proto.op_type == "AveragePool" and a.get("ceil_mode", 0) and a.get("count_include_pad", 0):
        return None
    kernel = _kernel(proto, graph)
    if len(kernel) != 2:
        return None
    pads = _explicit_pads(proto, graph, kernel)
    stride = a.get("strides", [1, 1])[0]
    dil = a.get("dilations", [1, 1])[0]
    extent = (kernel[0] - 1) * dil + 1
    h_in = graph.tensors[proto.input[0]].shape[H_AXIS]
    h_out = graph.tensors[proto.output[0]].shape[H_AXIS]
    # A ceil-mode pool's last window may hang below the bottom padding: the band pads it instead.
    bottom = max(pads[2], (h_out - 1) * stride + extent - h_in - pads[0])
    return Window(extent, stride, pads[0], bottom)


def _is_row_local(graph: ModelGraph, i: int, proto: onnx.NodeProto) -> bool:
    node = graph.nodes[i]
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    outs = [graph.tensors[o].shape for o in node.outputs]
    if any(len(s) != 4 for s in outs):
        return False
    data = [t for t in node.inputs if not graph.tensors[t].is_weight]
    if node.op_type in WINDOWED:
        return window(proto, graph) is not None and len(data) == 1
    if node.op_type not in ROW_WISE:
        return False
    if node.op_type == "Concat" and _attrs(proto).get("axis") not in (1, -3):
        return False
    h = outs[0][H_AXIS]
    # every data input is a full-height 4-D tensor, or broadcasts along the height
    for t in data:
        shape = graph.tensors[t].shape
        if len(shape) == 4 and shape[H_AXIS] == h:
            continue
        if len(shape) < 2 or shape[-2] == 1:
            continue
        return False
    return True


def row_local_nodes(graph: ModelGraph) -> list[bool]:
    """Per node, whether it is row-local (see the module doc)."""
    protos = graph.model.graph.node
    return [_is_row_local(graph, i, protos[i]) for i in range(len(graph.nodes))]


def cut_tensors(graph: ModelGraph) -> list[tuple[int, str]]:
    """``(i, tensor)`` where ``tensor`` is the only activation alive after node ``i`` (in graph
    order): every path from the inputs to later nodes passes through it."""
    last_read: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for t in node.inputs:
            last_read[t] = i
    outputs = set(graph.outputs)
    alive: set[str] = {t for t in graph.inputs if t in last_read}
    cuts = []
    for i, node in enumerate(graph.nodes):
        alive = {t for t in alive if last_read.get(t, -1) > i or t in outputs}
        alive |= {t for t in node.outputs if last_read.get(t, -1) > i}
        if len(alive) == 1:
            cuts.append((i, next(iter(alive))))
    return cuts


def row_segments(graph: ModelGraph) -> list[RowSegment]:
    """The graph's smallest row segments, in order: the nodes between two consecutive cuts when
    every one of them is row-local and the cut tensors are 4-D. Consecutive ones may be joined
    (:func:`join`) into larger segments."""
    local = row_local_nodes(graph)
    cuts = cut_tensors(graph)
    first_input = graph.inputs[0] if len(graph.inputs) == 1 else None
    starts = ([(-1, first_input)] if first_input else []) + cuts
    out: list[RowSegment] = []
    for (i, a), (j, b) in zip(starts, starts[1:]):
        nodes = tuple(range(i + 1, j + 1))
        if not nodes or not all(local[k] for k in nodes):
            continue
        sa, sb = graph.tensors[a].shape, graph.tensors[b].shape
        if len(sa) != 4 or len(sb) != 4 or sb[H_AXIS] < 2:
            continue
        out.append(RowSegment(nodes, a, b, sa[H_AXIS], sb[H_AXIS]))
    return out


def join(segments: Sequence[RowSegment]) -> RowSegment:
    """Consecutive segments (each one's output the next one's input) as one."""
    for s, t in zip(segments, segments[1:]):
        if s.output != t.input:
            raise ValueError(f"segments do not follow each other: {s.output} -> {t.input}")
    nodes = tuple(k for s in segments for k in s.nodes)
    return RowSegment(nodes, segments[0].input, segments[-1].output, segments[0].in_height,
                      segments[-1].out_height)  # fmt: skip


def needed_rows(graph: ModelGraph, seg: RowSegment, out: Rows) -> dict[str, Rows]:
    """For every activation of the segment, the rows of it that output rows ``out`` need."""
    protos = graph.model.graph.node
    need: dict[str, Rows] = {seg.output: out}
    for k in reversed(seg.nodes):
        node = graph.nodes[k]
        rows = need.get(node.outputs[0])
        if rows is None:
            continue
        for t, r in _reads(graph, protos[k], node, rows).items():
            need[t] = r.union(need.get(t))
    return need


def _reads(graph: ModelGraph, proto: onnx.NodeProto, node, out: Rows) -> dict[str, Rows]:
    """The rows of each full-height data input that output rows ``out`` of the node read."""
    if node.op_type in WINDOWED:
        w = window(proto, graph)
        assert w is not None
        rows, _, _ = w.needs(out, graph.tensors[node.inputs[0]].shape[H_AXIS])
        return {node.inputs[0]: rows}
    h = graph.tensors[node.outputs[0]].shape[H_AXIS]
    return {
        t: out
        for t in node.inputs
        if not graph.tensors[t].is_weight
        and len(graph.tensors[t].shape) == 4
        and graph.tensors[t].shape[H_AXIS] == h
    }


def row_shares(graph: ModelGraph, seg: RowSegment, out: Rows) -> dict[int, float]:
    """Per node of the segment, the share of its output rows (its halo included) that the piece
    computing rows ``out`` of the segment's output computes."""
    need = needed_rows(graph, seg, out)
    share = {}
    for k in seg.nodes:
        node = graph.nodes[k]
        rows = need.get(node.outputs[0])
        share[k] = (
            rows.n / graph.tensors[node.outputs[0]].shape[H_AXIS] if rows is not None else 0.0
        )
    return share


def piece_flops(graph: ModelGraph, seg: RowSegment, out: Rows) -> float:
    """The FLOPs of the piece that computes rows ``out``: each node's by its share of rows."""
    return sum(graph.nodes[k].flops * f for k, f in row_shares(graph, seg, out).items())


def row_piece_nodes(
    graph: ModelGraph, seg: RowSegment, out: Rows, tag: str
) -> tuple[list[onnx.NodeProto], dict[str, onnx.TensorProto], Rows, str]:
    """The nodes of the piece computing rows ``out`` of the segment, reading the whole of its input
    (a ``Slice`` takes the band) and writing ``<output>@<tag>``; every tensor and node it makes is
    named ``<name>@<tag>``. Returns the nodes, the weights they read, the band and the output
    name."""
    protos = graph.model.graph.node
    need = needed_rows(graph, seg, out)
    weights = {t.name: t for t in graph.model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, onnx.TensorProto] = {}
    band = need[seg.input]
    full = graph.tensors[seg.input].shape[H_AXIS]

    def local(t: str) -> str:
        return t if t in weights else f"{t}@{tag}"

    made = {seg.input: Rows(0, full)}
    if band != Rows(0, full):
        _slice(nodes, inits, seg.input, Rows(0, full), band, f"{seg.input}@{tag}")
    else:
        nodes.append(
            helper.make_node(
                "Identity", [seg.input], [f"{seg.input}@{tag}"], name=f"{seg.input}@{tag}.in"
            )
        )
    made[seg.input] = band
    for k in seg.nodes:
        node, proto = graph.nodes[k], protos[k]
        rows = need.get(node.outputs[0])
        if rows is None:
            continue
        reads = _reads(graph, proto, node, rows)
        inputs = []
        for t in proto.input:
            if t in weights:
                inits[t] = weights[t]
                inputs.append(t)
            elif t in reads and reads[t] != made[t]:
                want = f"{t}@{tag}.rows{reads[t].lo}_{reads[t].hi}"
                if not any(n.output[0] == want for n in nodes):
                    _slice(nodes, inits, local(t), made[t], reads[t], want)
                inputs.append(want)
            else:
                inputs.append(local(t) if t else t)
        attrs = _attrs(proto)
        if node.op_type in WINDOWED:
            attrs = _band_attrs(graph, proto, attrs, rows)
        outs = [local(t) for t in proto.output]
        nodes.append(
            helper.make_node(
                proto.op_type,
                inputs,
                outs,
                name=f"{proto.name}@{tag}",
                domain=proto.domain,
                **attrs,
            )
        )
        made[node.outputs[0]] = rows
    return nodes, inits, band, local(seg.output)


def row_piece(
    graph: ModelGraph, seg: RowSegment, out: Rows, name: str
) -> tuple[onnx.ModelProto, Rows]:
    """A stand-alone ONNX model of one piece: it takes the band of the segment's input that rows
    ``out`` need (named as the segment's input) and writes those rows of its output (named as the
    segment's output). Returns it with that band."""
    nodes, inits, band, out_name = row_piece_nodes(graph, seg, out, "piece")
    x, y = graph.tensors[seg.input], graph.tensors[seg.output]
    # the piece's own input is the band already: its first Slice (or Identity) reads the band whole
    first = nodes[0]
    nodes[0] = helper.make_node("Identity", [seg.input], [first.output[0]], name=first.name)
    renamed = [helper.make_node("Identity", [out_name], [seg.output], name=f"{seg.output}.out")]
    shape_x = list(x.shape[:H_AXIS]) + [band.n] + list(x.shape[H_AXIS + 1 :])
    shape_y = list(y.shape[:H_AXIS]) + [out.n] + list(y.shape[H_AXIS + 1 :])
    g = helper.make_graph(
        nodes + renamed,
        name,
        [helper.make_tensor_value_info(seg.input, _elem(x.dtype), shape_x)],
        [helper.make_tensor_value_info(seg.output, _elem(y.dtype), shape_y)],
        list(inits.values()),
    )
    model = helper.make_model(g, opset_imports=list(graph.model.opset_import))
    model.ir_version = graph.model.ir_version
    return model, band


def _elem(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _slice(nodes: list, inits: dict, tensor: str, have: Rows, want: Rows, out: str) -> str:
    """Append a Slice writing ``out``: rows ``want`` of ``tensor`` (which holds rows ``have``)."""
    consts = {
        f"{out}__starts": [want.lo - have.lo], f"{out}__ends": [want.hi - have.lo],
        f"{out}__axes": [H_AXIS],
    }  # fmt: skip
    for k, v in consts.items():
        inits[k] = onnx.numpy_helper.from_array(np.array(v, dtype=np.int64), k)
    nodes.append(helper.make_node("Slice", [tensor, *consts], [out], name=f"{out}__slice"))
    return out


def _band_attrs(graph: ModelGraph, proto: onnx.NodeProto, attrs: dict, out: Rows) -> dict:
    """A windowed node's attributes for the band computing rows ``out``: padding top and bottom
    only where the band reaches the image's edge (explicit pads; ceil mode kept, for the width).
    The band that ends with the output's last row keeps the node's own bottom padding: its length
    differs from the image's by a multiple of the stride, so its last windows are the image's (a
    ceil-mode pool's last window may hang over the edge, which ORT allows there but not as padding
    as large as the kernel). Every other band's windows fit its rows exactly."""
    w = window(proto, graph)
    assert w is not None
    _, top, bottom = w.needs(out, graph.tensors[proto.input[0]].shape[H_AXIS])
    pads = _explicit_pads(proto, graph, _kernel(proto, graph))
    if out.hi == graph.tensors[proto.output[0]].shape[H_AXIS]:
        bottom = pads[2]
    attrs = {k: v for k, v in attrs.items() if k != "auto_pad"}
    attrs["pads"] = [top, pads[1], bottom, pads[3]]
    return attrs


def split_rows(height: int, shares: Sequence[float]) -> list[Rows]:
    """Cut ``height`` rows into consecutive bands in proportion to ``shares`` (each >= 1 row;
    a share of 0 gets no band)."""
    total = sum(shares)
    bounds, acc = [0], 0.0
    for s in shares[:-1]:
        acc += s
        bounds.append(int(round(height * acc / total)))
    bounds.append(height)
    return [Rows(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
