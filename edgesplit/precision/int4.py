"""int4 weight-only parts: ORT's ``MatMulNBits`` (contrib domain ``com.microsoft``).

Each MatMul whose weight is a constant becomes ``MatMulNBits``: 4-bit weights in blocks of
:data:`BLOCK_SIZE` along the input dimension, each block with its own float scale, activations
kept in float32. No calibration data is needed. A weight reached through a ``Transpose`` of an
initializer (a tied output head) is transposed first, so the head can be quantized too; the
embedding ``Gather`` keeps its float32 table (a step reads one row of it).

Weights reach ``MatMulNBits`` in one of two ways:

- :func:`quantize_int4` quantizes float weights with one of :data:`METHODS`;
- :func:`with_block_weights` takes weights that are already in blocks (:class:`BlockWeights`),
  such as a GGUF file's own 4-bit blocks (:mod:`edgesplit.model.gguf_decoder`).

A block is ``w = scale * (q - zero_point) + offset``. ORT's CPU kernel is fast only with integer
zero points (float zero points run about 10x slower per MatMul and ignore ``accuracy_level`` in
onnxruntime 1.32), so a float per-block offset (a Q4_1 block's minimum) is computed from the
input's block sums, ``x @ W = MatMulNBits(x) + blocksum(x) @ offsets.T``, in one of the ways of
:data:`OFFSETS`: by a small float32 MatMul, or inside the same ``MatMulNBits`` as extra blocks.

``accuracy_level`` 4 lets ORT's CPU kernel quantize the activations to int8 per block and run the
dot products in integers (AVX2 on this host); 0 keeps them in float32.

Projections with offsets that read the same input (q, k and v; gate and up) share one
``MatMulNBits``; q, k and v then go into heads together
(:func:`~edgesplit.model.decoder_fusion.fuse_head_split`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesplit.errors import CompileError
from edgesplit.model.decoder_fusion import consumers, fuse_head_split, prune_unused
from edgesplit.precision.blocks import BlockWeights, quantize_blocks
from edgesplit.precision.convert import _quiet

BLOCK_SIZE = 32
"""Weights per scale: ORT GenAI's model builder's default for int4."""
ACCURACY_LEVEL = 4
"""int8 activations inside the kernel (ORT's ``accuracy_level``): the fastest on x86 CPUs."""
METHODS = ("rtn_sym", "rtn_asym", "k_quant", "minmax_offset")
"""How :func:`quantize_int4` picks each block's grid (see :mod:`edgesplit.precision.blocks`)."""
HEADS = ("int4", "int8", "fp32")
"""What :func:`quantize_int4` does with the output head: the method's int4, symmetric int8
blocks, or float32 kept."""
DEFAULT_METHOD = "rtn_sym"
DEFAULT_HEAD = "int8"
OFFSETS = ("matmul", "centered", "digits2", "digits3", "int8")
"""How :func:`with_block_weights` computes blocks with float offsets:

- ``matmul``: a float32 MatMul of the input's block sums by the offsets, added to the
  ``MatMulNBits`` output (exact);
- ``centered``: the same after moving each block's zero point next to its offset
  (:meth:`BlockWeights.centered`, exact; the int8 activations then cost less accuracy);
- ``digits2``, ``digits3``: centred, then the offsets inside the same ``MatMulNBits``: its input
  gets its block sums appended 2 or 3 times and the offsets become as many extra 4-bit blocks,
  one base-14 digit each (:meth:`BlockWeights.offset_digits`);
- ``int8``: 8-bit blocks with integer zero points, each offset rounded to a sixteenth of its
  block's step (:meth:`BlockWeights.as_8bit`).
"""
HEAD_NODE = "lm_head"
"""The zoo decoders' output head MatMul."""


def fold_transposed_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every ``Transpose`` of an initializer that feeds a MatMul replaced by the
    transposed initializer (the original initializer kept for its other users)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users = consumers(graph)
    kept = []
    for n in graph.node:
        out = n.output[0] if n.output else ""
        if n.op_type == "Transpose" and n.input[0] in inits and out not in {
            o.name for o in graph.output
        } and all(u.op_type == "MatMul" for u in users.get(out, [])):  # fmt: skip
            perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
            value = numpy_helper.to_array(inits[n.input[0]])
            value = np.ascontiguousarray(np.transpose(value, perm))
            graph.initializer.append(numpy_helper.from_array(value, out))
            continue
        kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    return model


def _weight_matmuls(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Node name -> MatMul whose second input is a 2-D initializer."""
    inits = {t.name: t for t in model.graph.initializer}
    return {
        n.name: n
        for n in model.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2
    }


def with_block_weights(
    model: onnx.ModelProto,
    weights: Mapping[str, BlockWeights],
    accuracy_level: int = ACCURACY_LEVEL,
    accuracy_levels: Mapping[str, int] | None = None,
    offsets: str = "matmul",
) -> onnx.ModelProto:
    """``model`` with the MatMul of each node named in ``weights`` turned into ``MatMulNBits``
    over those blocks (a tied head's ``Transpose`` folded first), with ``accuracy_level``, or
    the node's entry in ``accuracy_levels``.

    Args:
        offsets: How blocks with float offsets are computed, one of :data:`OFFSETS`.

    Raises:
        CompileError: naming every node that is missing or whose sizes do not match, or an
            unknown ``offsets``.
    """
    if offsets not in OFFSETS:
        raise CompileError(f"int4 offsets '{offsets}': one of {OFFSETS}")
    if offsets != "matmul":
        change = BlockWeights.as_8bit if offsets == "int8" else BlockWeights.centered
        weights = {k: bw if bw.offsets is None else change(bw) for k, bw in weights.items()}
    model = fold_transposed_weights(model)
    graph = model.graph
    matmuls = _weight_matmuls(model)
    inits = {t.name: t for t in graph.initializer}
    problems = []
    for name, bw in weights.items():
        node = matmuls.get(name)
        if node is None:
            problems.append(f"{name}: no MatMul with a constant weight")
        elif tuple(inits[node.input[1]].dims) != bw.shape:
            problems.append(f"{name}: weight {tuple(inits[node.input[1]].dims)}, blocks {bw.shape}")
    if problems:
        raise CompileError("int4 blocks do not fit: " + "; ".join(problems))
    block_sums: dict[tuple, str] = {}
    levels = accuracy_levels or {}
    groups = _offset_groups(graph, weights, levels, accuracy_level)
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        bw = weights.get(node.name) if node.op_type == "MatMul" else None
        if bw is None:
            new_nodes.append(node)
            continue
        level = levels.get(node.name, accuracy_level)
        group = groups.get(node.name)
        if group is not None:
            if node.name != group[0].name:
                continue  # made with the group's first node
            node, bw, split = _fused(group, weights)
        nodes, tensors = _nbits_nodes(node, bw, level, block_sums, offsets)
        new_nodes.extend(nodes)
        graph.initializer.extend(tensors)
        if group is not None:
            tensors = [numpy_helper.from_array(split, f"{node.name}.split_sizes")]
            graph.initializer.extend(tensors)
            outs = [n.output[0] for n in group]
            new_nodes.append(
                helper.make_node(
                    "Split", [node.output[0], tensors[0].name], outs, f"{node.name}.split", axis=-1
                )
            )
    del graph.node[:]
    graph.node.extend(new_nodes)
    prune_unused(graph)  # a folded head's Transpose
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    # q, k and v out of one MatMulNBits: into heads once, then split (4 operators fewer a layer).
    return fuse_head_split(model)[0] if groups else model


def _offset_groups(
    graph: onnx.GraphProto,
    weights: Mapping[str, BlockWeights],
    levels: Mapping[str, int],
    accuracy_level: int,
) -> dict[str, list[onnx.NodeProto]]:
    """Node name -> the MatMuls with offsets that read the same input (q, k and v; gate and up):
    one MatMulNBits and one offset correction serve them all, then a Split. On a CPU each op
    costs some microseconds whatever its size, and a decode step runs hundreds of them."""
    by_input: dict[tuple, list[onnx.NodeProto]] = {}
    for n in graph.node:
        bw = weights.get(n.name) if n.op_type == "MatMul" else None
        if bw is not None and bw.offsets is not None:
            key = (
                n.input[0],
                bw.bits,
                bw.block_size,
                bw.shape[0],
                levels.get(n.name, accuracy_level),
            )
            by_input.setdefault(key, []).append(n)
    return {n.name: g for g in by_input.values() if len(g) > 1 for n in g}


def _fused(
    group: Sequence[onnx.NodeProto], weights: Mapping[str, BlockWeights]
) -> tuple[onnx.NodeProto, BlockWeights, np.ndarray]:
    """A MatMul standing for ``group`` (its output the outputs side by side), their blocks
    concatenated along N, and the Split sizes."""
    parts = [weights[n.name] for n in group]
    cat = lambda field: np.concatenate([getattr(b, field) for b in parts])  # noqa: E731
    zero = cat("zero_points") if all(b.zero_points is not None for b in parts) else None
    if zero is None and any(b.zero_points is not None for b in parts):
        zero = np.concatenate([b.zero_points if b.zero_points is not None else np.full(
            b.scales.shape, 2 ** (b.bits - 1), np.uint8) for b in parts])  # fmt: skip
    bw = BlockWeights(cat("q"), cat("scales"), zero, cat("offsets"), parts[0].bits,
                      parts[0].block_size)  # fmt: skip
    name = f"{group[0].name}.group"
    node = helper.make_node("MatMul", [group[0].input[0], ""], [f"{name}.out"], name)
    return node, bw, np.asarray([b.shape[1] for b in parts], np.int64)


def _nbits_nodes(
    node: onnx.NodeProto,
    bw: BlockWeights,
    accuracy_level: int,
    block_sums: dict[tuple, str],
    offsets: str = "matmul",
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The MatMulNBits (and, for offsets, the block-sum correction) that replace ``node``."""
    x, name = node.input[0], node.name
    nodes: list[onnx.NodeProto] = []
    tensors: list[onnx.TensorProto] = []
    if bw.offsets is not None and offsets.startswith("digits"):
        digits = int(offsets.removeprefix("digits"))
        bw, width = bw.offset_digits(digits)
        sums = _block_sums(x, bw.shape[0] - digits * width, bw.block_size, width, block_sums,
                           name, nodes, tensors)  # fmt: skip
        key = (x, bw.block_size, "digits", digits)
        if key not in block_sums:
            block_sums[key] = f"{name}.with_sums"
            nodes.append(helper.make_node("Concat", [x] + [sums] * digits, [block_sums[key]],
                                          block_sums[key], axis=-1))  # fmt: skip
        x = block_sums[key]
    k, n = bw.shape
    packed, scales, zero_points = bw.packed()
    tensors += [
        numpy_helper.from_array(packed, f"{name}.q{bw.bits}"),
        numpy_helper.from_array(scales, f"{name}.scales"),
    ]
    inputs = [x, f"{name}.q{bw.bits}", f"{name}.scales"]
    if zero_points is not None:
        tensors.append(numpy_helper.from_array(zero_points, f"{name}.zero_points"))
        inputs.append(tensors[-1].name)
    attrs = {"K": k, "N": n, "bits": bw.bits, "block_size": bw.block_size}
    if accuracy_level:
        attrs["accuracy_level"] = accuracy_level
    out = node.output[0] if bw.offsets is None else f"{name}.nbits"
    nodes.append(
        helper.make_node(
            "MatMulNBits", inputs, [out], f"{name}.nbits", domain="com.microsoft", **attrs
        )
    )
    if bw.offsets is None:
        return nodes, tensors
    sums = _block_sums(x, k, bw.block_size, k // bw.block_size, block_sums, name, nodes, tensors)
    offsets_t = np.ascontiguousarray(bw.offsets.T.astype(np.float32))
    tensors.append(numpy_helper.from_array(offsets_t, f"{name}.offsets"))
    nodes.append(
        helper.make_node("MatMul", [sums, f"{name}.offsets"], [f"{name}.shift"], f"{name}.shift")
    )
    nodes.append(helper.make_node("Add", [out, f"{name}.shift"], [node.output[0]], name))
    return nodes, tensors


def _block_sums(
    x: str,
    k: int,
    block_size: int,
    width: int,
    made: dict[tuple, str],
    name: str,
    nodes: list[onnx.NodeProto],
    tensors: list[onnx.TensorProto],
) -> str:
    """``x``'s sums over each block of ``block_size`` along its last axis, zero-padded to
    ``width`` values: one 0/1 MatMul (any rank), made once per input and shared by its users."""
    key = (x, block_size, width)
    if key not in made:
        ones = np.zeros((k, width), np.float32)
        blocks = np.arange(k) // block_size
        ones[np.arange(k), blocks] = 1.0
        made[key] = f"{name}.block_sums"
        tensors.append(numpy_helper.from_array(ones, f"{made[key]}.ones"))
        nodes.append(helper.make_node("MatMul", [x, f"{made[key]}.ones"], [made[key]], made[key]))
    return made[key]


def quantize_int4(
    model: onnx.ModelProto,
    ranges: Path | None = None,
    nodes: Sequence[str] = (),
    block_size: int = BLOCK_SIZE,
    accuracy_level: int = ACCURACY_LEVEL,
    method: str = DEFAULT_METHOD,
    head: str = DEFAULT_HEAD,
) -> onnx.ModelProto:
    """``model`` with its constant-weight MatMuls (``nodes`` only, when given) in int4
    ``MatMulNBits``; ``ranges`` is unused (weight-only quantization needs no calibration).

    Args:
        method: One of :data:`METHODS`: ``rtn_sym`` and ``rtn_asym`` are ORT's n-bit quantizer
            (round to nearest, symmetric or with integer zero points); ``k_quant`` is ORT's
            k-quant search (integer zero points); ``minmax_offset`` spans each block's range
            with a float offset (llama.cpp's Q4_1). The last three leave a weight whose input
            size is not a multiple of ``block_size`` in float32.
        head: One of :data:`HEADS`, for the node :data:`HEAD_NODE` when it is quantized.

    Raises:
        CompileError: for an unknown method or head, or when ORT's quantizer fails.
    """
    if method not in METHODS or head not in HEADS:
        raise CompileError(f"int4: method '{method}' (one of {METHODS}), head '{head}' ({HEADS})")
    prepared = fold_transposed_weights(model)
    matmuls = _weight_matmuls(prepared)
    wanted = [n for n in matmuls if not nodes or n in set(nodes)]
    body = [n for n in wanted if n != HEAD_NODE or head == "int4"]
    blocks: dict[str, BlockWeights] = {}
    if HEAD_NODE in wanted and head == "int8":
        blocks[HEAD_NODE] = quantize_blocks(_init(prepared, matmuls[HEAD_NODE]), "sym8", block_size)
    if method in ("rtn_sym", "rtn_asym"):
        prepared = _ort_rtn(prepared, body, block_size, accuracy_level, method == "rtn_sym")
    else:
        for n in body:
            weight = _init(prepared, matmuls[n])
            if weight.shape[0] % block_size == 0:
                blocks[n] = quantize_blocks(weight, method, block_size)
    return with_block_weights(prepared, blocks, accuracy_level) if blocks else prepared


def _init(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    t = next(t for t in model.graph.initializer if t.name == node.input[1])
    return numpy_helper.to_array(t).astype(np.float32)


def _ort_rtn(
    model: onnx.ModelProto,
    names: Sequence[str],
    block_size: int,
    accuracy_level: int,
    symmetric: bool,
) -> onnx.ModelProto:
    """``names`` quantized by ``onnxruntime.quantization``'s default n-bit quantizer."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )
    except ImportError as e:
        raise CompileError(f"int4 needs onnxruntime's n-bit quantizer ({e})") from e
    config = DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level
    )
    # ORT quantizes a node when it is included *or* its op type is listed: keep the others out.
    wanted = set(names)
    exclude = [n.name for n in model.graph.node if n.name not in wanted]
    try:
        with _quiet():
            q = MatMulNBitsQuantizer(
                model,
                block_size=block_size,
                is_symmetric=symmetric,
                accuracy_level=accuracy_level,
                nodes_to_exclude=exclude,
                algo_config=config,
            )
            q.process()
    except Exception as e:  # noqa: BLE001 - ORT raises plain exceptions of many kinds
        raise CompileError(f"int4 quantization failed: {type(e).__name__}: {e}") from e
    return q.model.model


def int4_matmuls(model: onnx.ModelProto) -> int:
    """MatMulNBits nodes in ``model``."""
    return sum(1 for n in model.graph.node if n.op_type == "MatMulNBits")
