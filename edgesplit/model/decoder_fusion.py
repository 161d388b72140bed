"""Fewer, larger operators in a zoo decoder graph: the same numbers from fewer ORT kernels.

A decode step runs every operator of the graph once for a single row, so on a CPU each costs a
few microseconds whatever its size, and a 30-layer decoder runs well over a thousand of them.
:func:`fuse_rotary` replaces the six operators of each rotary embedding (two slices, ``Neg``,
``Concat``, two ``Mul`` and an ``Add``, ``x * cos + rotate_half(x) * sin``) by ORT's
``RotaryEmbedding`` (contrib domain ``com.microsoft``), which reads the cos/sin tables by
``position_ids`` itself. It applies to the float32 model and to any reduced-precision one alike.

:func:`fuse_head_split` serves a graph whose query, key and value come out of one projection and a
``Split`` (the int4 graphs of :mod:`edgesplit.precision.int4` read them through one
``MatMulNBits``): instead of splitting first and giving each part its own ``Reshape`` and
``Transpose`` into heads, it reshapes and transposes once and splits the heads (three operators
instead of seven per layer).

The attention and residual-norm fusions are in :mod:`edgesplit.model.attention_fusion`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesplit.errors import CompileError


def fuse_rotary(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each rotary embedding in the pattern of
    :mod:`edgesplit.model.zoo_decoder` as one ``RotaryEmbedding``, and how many were fused.

    The pattern: ``Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h, 2h)), Slice(x, 0, h)), sin))`` on
    ``x`` ``(B, heads, S, 2h)``, where ``cos`` and ``sin`` are the tables ``(positions, h)``
    gathered by ``position_ids``, each half repeated (``Concat(g, g)``) and unsqueezed.

    Raises:
        CompileError: when a rotary embedding's tables cannot be traced to constant tables.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    made_by = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    replaced: dict[str, onnx.NodeProto] = {}  # the Add's name -> its RotaryEmbedding
    for add in graph.node:
        match = _rotary(add, made_by, inits) if add.op_type == "Add" else None
        if match is None:
            continue
        x, cos_table, sin_table, positions = match
        replaced[add.name] = helper.make_node(
            "RotaryEmbedding",
            [x, positions, cos_table, sin_table],
            [add.output[0]],
            f"{add.name}.fused",
            domain="com.microsoft",
            interleaved=0,
        )
    if not replaced:
        return model, 0
    nodes = [replaced.get(n.name, n) for n in graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    prune_unused(graph)
    add_ms_domain(model)
    return model, len(replaced)


def fuse_head_split(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with every ``Split`` (last axis) whose outputs each go into heads
    (``Reshape`` to ``(0, 0, heads, head_dim)``, then ``Transpose`` ``(0, 2, 1, 3)``) turned into
    one ``Reshape``, one ``Transpose`` and a ``Split`` of the heads; and how many were.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users = consumers(graph)
    outputs = {o.name for o in graph.output}
    replace: dict[str, list[onnx.NodeProto]] = {}  # the Split's name -> its nodes
    gone: set[str] = set()
    for split in graph.node:
        match = _head_split(split, users, inits, outputs) if split.op_type == "Split" else None
        if match is None:
            continue
        heads, head_dim, ends = match
        name = f"{split.name}.heads"
        shape = numpy_helper.from_array(
            np.asarray([0, 0, sum(heads), head_dim], np.int64), f"{name}.shape"
        )
        sizes = numpy_helper.from_array(np.asarray(heads, np.int64), f"{name}.sizes")
        graph.initializer.extend([shape, sizes])
        replace[split.name] = [
            helper.make_node("Reshape", [split.input[0], shape.name], [f"{name}.r"], f"{name}.r"),
            helper.make_node(
                "Transpose", [f"{name}.r"], [f"{name}.t"], f"{name}.t", perm=[0, 2, 1, 3]
            ),
            helper.make_node("Split", [f"{name}.t", sizes.name], ends, name, axis=1),
        ]
        for out in split.output:
            reshape = users[out][0]
            gone |= {reshape.name, users[reshape.output[0]][0].name}
    if not replace:
        return model, 0
    nodes = []
    for n in graph.node:
        if n.name in replace:
            nodes.extend(replace[n.name])
        elif n.name not in gone:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    prune_unused(graph)
    return model, len(replace)


def add_ms_domain(model: onnx.ModelProto) -> None:
    """Declare the ``com.microsoft`` contrib domain in ``model`` (once)."""
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _head_split(split, users, inits, outputs) -> tuple[list[int], int, list[str]] | None:
    """(heads per output, head dim, the transposed outputs) when ``split`` feeds heads only."""
    axis = next((a.i for a in split.attribute if a.name == "axis"), 0)
    if axis not in (-1, 2) or len(split.input) < 2 or split.input[1] not in inits:
        return None
    sizes = numpy_helper.to_array(inits[split.input[1]]).tolist()
    heads, dims, ends = [], set(), []
    for out, size in zip(split.output, sizes, strict=False):
        reshape = users.get(out, [None])
        if out in outputs or len(reshape) != 1 or reshape[0].op_type != "Reshape":
            return None
        shape = inits.get(reshape[0].input[1])
        shape = numpy_helper.to_array(shape).tolist() if shape is not None else None
        after = users.get(reshape[0].output[0], [])
        if not shape or len(shape) != 4 or shape[:2] != [0, 0] or shape[2] * shape[3] != size:
            return None
        if len(after) != 1 or after[0].op_type != "Transpose" or reshape[0].output[0] in outputs:
            return None
        perm = next((list(a.ints) for a in after[0].attribute if a.name == "perm"), None)
        if perm != [0, 2, 1, 3]:
            return None
        heads.append(shape[2])
        dims.add(shape[3])
        ends.append(after[0].output[0])
    return (heads, dims.pop(), ends) if len(dims) == 1 and len(heads) == len(sizes) else None


def _rotary(add, made_by, inits) -> tuple[str, str, str, str] | None:
    """(x, cos table, sin table, positions) when ``add`` ends a rotary embedding, else None."""
    a, b = (made_by.get(i) for i in add.input)
    if not (a and b and a.op_type == "Mul" and b.op_type == "Mul"):
        return None
    x, cos = a.input
    rot, sin = b.input
    concat = made_by.get(rot)
    if not concat or concat.op_type != "Concat" or len(concat.input) != 2:
        return None
    neg, low = (made_by.get(i) for i in concat.input)
    if not (neg and low and neg.op_type == "Neg" and low.op_type == "Slice"):
        return None
    high = made_by.get(neg.input[0])
    if not (high and high.op_type == "Slice" and high.input[0] == x and low.input[0] == x):
        return None
    half = _const(inits, low.input[2])
    axes = {_const(inits, s.input[3]) if len(s.input) > 3 else None for s in (low, high)}
    if half is None or _const(inits, low.input[1]) != 0 or _const(inits, high.input[1]) != half:
        return None
    if axes not in ({-1}, {3}):
        return None
    tables = [_table(t, made_by, inits) for t in (cos, sin)]
    if any(t is None for t in tables) or tables[0][1] != tables[1][1]:
        raise CompileError(f"rotary embedding at '{add.name}': its cos/sin are not constant tables")
    (cos_table, positions), (sin_table, _) = tables
    if inits[cos_table].dims[-1] != half:
        return None
    return x, cos_table, sin_table, positions


def _table(name, made_by, inits) -> tuple[str, str] | None:
    """(table, positions) for ``Unsqueeze(Concat(g, g))`` with ``g = Gather(table, positions)``."""
    unsqueeze = made_by.get(name)
    if not unsqueeze or unsqueeze.op_type != "Unsqueeze":
        return None
    concat = made_by.get(unsqueeze.input[0])
    if not concat or concat.op_type != "Concat" or len(set(concat.input)) != 1:
        return None
    gather = made_by.get(concat.input[0])
    if not gather or gather.op_type != "Gather" or gather.input[0] not in inits:
        return None
    return gather.input[0], gather.input[1]


def _const(inits, name: str) -> int | None:
    t = inits.get(name)
    value = numpy_helper.to_array(t).reshape(-1) if t is not None else np.zeros(0)
    return int(value[0]) if value.size == 1 else None


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Each tensor's name -> the nodes that read it."""
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    return users


def prune_unused(graph: onnx.GraphProto) -> None:
    """Drop nodes and initializers that nothing reads any more."""
    while True:
        needed = {o.name for o in graph.output} | {i for n in graph.node for i in n.input}
        dead = [n for n in graph.node if not any(o in needed for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    needed = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(kept)
