"""Attention and residual norms of a zoo decoder as ONNX Runtime's fused contrib operators.

:func:`fuse_attention` replaces each layer's attention, from its projections' outputs to the input
of its output projection (heads, rotary embeddings, cache concatenation, scores, mask, softmax and
context: 31 operators), by one ``GroupQueryAttention`` (``com.microsoft``), which appends the
step's keys and values to the cache and applies the rotary embedding itself. Its inputs and outputs
are the model's own; it reads the cache's length and the positions from ``attention_mask`` (see
the function's contract).

:func:`fuse_skip_norm` turns each residual ``Add`` and the RMSNorm after it into one
``SkipSimplifiedLayerNormalization`` (``com.microsoft``), which returns the sum as well.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesplit.model.decoder_fusion import add_ms_domain, consumers, fuse_rotary, prune_unused
from edgesplit.model.zoo_decoder import (
    config_of,
    past_key_name,
    past_value_name,
    present_key_name,
    present_value_name,
)

SEQLENS_K = "attention.seqlens_k"
TOTAL_LENGTH = "attention.total_sequence_length"


def fuse_attention(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each layer's attention in the pattern of
    :mod:`edgesplit.model.zoo_decoder` as one ``GroupQueryAttention``, and how many were fused.

    Rotary embeddings are fused first (:func:`fuse_rotary`) and then move into the attention
    (``do_rotary``, the same cos/sin tables). The query, key and value go in as the projections
    give them, ``(B, S, heads * head_dim)``: separately, or packed when one projection and a
    ``Split`` into heads (:func:`fuse_head_split`) produce them. ``present.N.key/value`` keep
    their layout, ``(B, kv_heads, past + S, head_dim)``.

    The contract the fused model keeps is the one :class:`~edgesplit.generate.Generator` relies
    on: the cache holds its real tokens first, then at most some slots of padding, and padding in
    a step's ``input_ids`` comes only after its real tokens. The fused graph counts the real
    tokens of the past from ``attention_mask`` and takes the step's tokens to follow them, at
    positions counted the same way; ``position_ids`` is then not read. A padded slot of the past
    is overwritten by the next step's keys and values, so its ``present`` tensors differ from the
    unfused model's after the real tokens, where the unfused model masks them anyway. The logits
    of every real token are the same up to float rounding.

    Rotary embeddings are fused even where an attention does not match.
    """
    model, _ = fuse_rotary(model)
    try:
        config = config_of(model)
    except ValueError:  # no past key/value inputs: not a decoder of the zoo's layout
        return model, 0
    graph = model.graph
    made_by = {o: n for n in graph.node for o in n.output}
    users = consumers(graph)
    inits = {t.name: t for t in graph.initializer}
    replaced: dict[str, onnx.NodeProto | None] = {}  # a node's name -> its GQA, or None: dropped
    for layer in range(config.layers):
        match = _attention(layer, config, made_by, users, inits)
        if match is None:
            continue
        (q, k, v), tables, end, scale, concats = match
        replaced[end.name] = helper.make_node(
            "GroupQueryAttention",
            [q, k, v, past_key_name(layer), past_value_name(layer), SEQLENS_K, TOTAL_LENGTH,
             *tables],
            [end.output[0], present_key_name(layer), present_value_name(layer)],
            f"model.layers.{layer}.self_attn.gqa",
            domain="com.microsoft",
            num_heads=config.heads,
            kv_num_heads=config.kv_heads,
            do_rotary=1,
            rotary_interleaved=0,
            scale=scale,
        )  # fmt: skip
        replaced.update({c.name: None for c in concats})
    if not replaced:
        return model, 0
    nodes = _cache_lengths(graph)
    for n in graph.node:
        fused = replaced.get(n.name, n)
        if fused is not None:
            nodes.append(fused)
    del graph.node[:]
    graph.node.extend(nodes)
    prune_unused(graph)
    add_ms_domain(model)
    return model, sum(1 for n in replaced.values() if n is not None)


def fuse_skip_norm(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each RMSNorm of a residual sum (``Add``, then ``x / sqrt(mean(x^2) + eps)
    * w`` in the pattern of :mod:`edgesplit.model.zoo_decoder`) as one
    ``SkipSimplifiedLayerNormalization`` (``com.microsoft``), which also returns the sum for the
    next residual; and how many were fused.

    ORT fuses a lone RMSNorm into ``SimplifiedLayerNormalization`` by itself; the residual ``Add``
    before it stays a kernel of its own, one per norm, which this fusion removes.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    made_by = {o: n for n in graph.node for o in n.output}
    users = consumers(graph)
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    replaced: dict[str, onnx.NodeProto | None] = {}  # the Add -> the fused node; the Mul -> None
    for mul in graph.node:
        match = _skip_norm(mul, made_by, users, inits, outputs) if mul.op_type == "Mul" else None
        if match is None:
            continue
        add, weight, eps = match
        replaced[add.name] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [add.input[0], add.input[1], weight],
            [mul.output[0], "", "", add.output[0]],
            f"{mul.name}.skip",
            domain="com.microsoft",
            epsilon=eps,
        )
        replaced[mul.name] = None
    if not replaced:
        return model, 0
    nodes = [replaced.get(n.name, n) for n in graph.node]
    del graph.node[:]
    graph.node.extend(n for n in nodes if n is not None)
    prune_unused(graph)
    add_ms_domain(model)
    return model, len(replaced) // 2


def _skip_norm(mul, made_by, users, inits, outputs) -> tuple[onnx.NodeProto, str, float] | None:
    """(the residual Add, the norm's weight, its epsilon) when ``mul`` ends an RMSNorm of an
    ``Add`` of two computed tensors, else None."""
    div, weight = made_by.get(mul.input[0]), mul.input[1]
    if not (div and div.op_type == "Div" and weight in inits):
        return None
    x = div.input[0]
    chain, name = [], div.input[1]
    for op in ("Sqrt", "Add", "ReduceMean", "Pow"):
        node = made_by.get(name)
        if not node or node.op_type != op:
            return None
        chain.append(node)
        name = node.input[0]
    sqrt, eps_add, mean, pow_ = chain
    if pow_.input[0] != x or _const_float(inits, pow_.input[1]) != 2.0:
        return None
    eps = _const_float(inits, eps_add.input[1])
    axes = _attr(mean, "axes") if len(mean.input) < 2 else None
    if eps is None or axes not in ([-1], [2]) or _attr(mean, "keepdims") == 0:
        return None
    inner = [div, sqrt, eps_add, mean, pow_]
    if any(len(users.get(n.output[0], [])) != 1 or n.output[0] in outputs for n in inner[1:]):
        return None
    add = made_by.get(x)
    if not add or add.op_type != "Add" or any(i in inits for i in add.input):
        return None
    return add, weight, eps


def _cache_lengths(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes computing ``GroupQueryAttention``'s ``seqlens_k`` (the real tokens of the past, from
    ``attention_mask``, plus the step's tokens, minus one) and ``total_sequence_length`` (the
    mask's length), both int32."""
    consts = {
        "attention.one": np.asarray([1], np.int64),
        "attention.zero": np.asarray([0], np.int64),
        "attention.one_scalar": np.asarray(1, np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    a = "attention."
    steps = [
        ("Shape", ["input_ids"], "ids_shape", {}),
        ("Gather", [f"{a}ids_shape", f"{a}one_scalar"], "seq", {}),
        ("Shape", ["attention_mask"], "mask_shape", {}),
        ("Gather", [f"{a}mask_shape", f"{a}one"], "total", {}),  # (1,)
        ("Sub", [f"{a}total", f"{a}seq"], "past", {}),
        ("Slice", ["attention_mask", f"{a}zero", f"{a}past", f"{a}one"], "past_mask", {}),
        ("ReduceSum", [f"{a}past_mask", f"{a}one"], "past_real", {"keepdims": 0}),
        ("Add", [f"{a}past_real", f"{a}seq"], "real", {}),
        ("Sub", [f"{a}real", f"{a}one_scalar"], "last", {}),
        ("Cast", [f"{a}last"], SEQLENS_K, {"to": onnx.TensorProto.INT32}),
        ("Squeeze", [f"{a}total", f"{a}zero"], "total_scalar", {}),
        ("Cast", [f"{a}total_scalar"], TOTAL_LENGTH, {"to": onnx.TensorProto.INT32}),
    ]
    nodes = []
    for op, inputs, out, attrs in steps:
        name = out if out.startswith(a) else f"{a}{out}"
        nodes.append(helper.make_node(op, inputs, [name], name, **attrs))
    return nodes


def _attention(layer, config, made_by, users, inits):
    """((q, k, v), (cos, sin), the last node, scale, the two cache Concats) when ``layer``'s
    attention is in the zoo's pattern, with rotary embeddings fused; else None."""
    kcat = made_by.get(present_key_name(layer))
    vcat = made_by.get(present_value_name(layer))
    for cat, past in ((kcat, past_key_name(layer)), (vcat, past_value_name(layer))):
        if not cat or cat.op_type != "Concat" or list(cat.input[:1]) != [past]:
            return None
        if _attr(cat, "axis") != 2 or len(cat.input) != 2:
            return None
    k_rot, v_heads = made_by.get(kcat.input[1]), vcat.input[1]
    kt = _only_user(users, kcat.output[0], "Transpose")
    scores = kt and _only_user(users, kt.output[0], "MatMul")
    if not (k_rot and k_rot.op_type == "RotaryEmbedding" and scores):
        return None
    if _attr(kt, "perm") != [0, 1, 3, 2] or scores.input[1] != kt.output[0]:
        return None
    chain = [scores]
    for op in ("Mul", "Add", "Softmax", "MatMul", "Reshape", "Transpose", "Reshape"):
        chain.append(_only_user(users, chain[-1].output[0], op))
        if chain[-1] is None:
            return None
    _, mul, _, softmax, context, _, merge, end = chain
    scale = _const_float(inits, mul.input[1])
    if scale is None or _attr(softmax, "axis") not in (-1, 3) or context.input[1] != vcat.output[0]:
        return None
    if _attr(merge, "perm") != [0, 2, 1, 3]:
        return None
    groups = made_by.get(scores.input[0])
    q_rot = groups and groups.op_type == "Reshape" and made_by.get(groups.input[0])
    if not (q_rot and q_rot.op_type == "RotaryEmbedding"):
        return None
    if list(q_rot.input[1:]) != list(k_rot.input[1:]) or q_rot.input[1] != "position_ids":
        return None
    if any(_attr(r, "interleaved") for r in (q_rot, k_rot)) or q_rot.input[2] not in inits:
        return None
    sources = _projections([q_rot.input[0], k_rot.input[0], v_heads], config, made_by, inits)
    if sources is None:
        return None
    return sources, (q_rot.input[2], q_rot.input[3]), end, scale, (kcat, vcat)


def _projections(heads, config, made_by, inits) -> tuple[str, str, str] | None:
    """(q, k, v) in ``(B, S, heads * head_dim)`` for tensors in heads ``(B, heads, S, head_dim)``:
    each from its own ``Transpose(Reshape(x))``, or all three the outputs of one ``Split`` of
    such a tensor (then ``(qkv, "", "")``, packed)."""
    split = made_by.get(heads[0])
    if split and split.op_type == "Split":
        if list(split.output) != heads or _attr(split, "axis") != 1 or len(split.input) < 2:
            return None
        sizes = inits.get(split.input[1])
        want = [config.heads, config.kv_heads, config.kv_heads]
        if sizes is None or numpy_helper.to_array(sizes).tolist() != want:
            return None
        packed = _unheads(split.input[0], sum(want), config, made_by, inits)
        return (packed, "", "") if packed else None
    found = [
        _unheads(h, n, config, made_by, inits)
        for h, n in zip(heads, (config.heads, config.kv_heads, config.kv_heads), strict=True)
    ]
    return tuple(found) if all(found) else None  # type: ignore[return-value]


def _unheads(name, heads, config, made_by, inits) -> str | None:
    """``x`` when ``name`` is ``Transpose(Reshape(x, (0, 0, heads, head_dim)), (0, 2, 1, 3))``."""
    t = made_by.get(name)
    r = (
        t
        and t.op_type == "Transpose"
        and _attr(t, "perm") == [0, 2, 1, 3]
        and made_by.get(t.input[0])
    )
    if not (r and r.op_type == "Reshape" and r.input[1] in inits):
        return None
    shape = numpy_helper.to_array(inits[r.input[1]]).tolist()
    return r.input[0] if shape == [0, 0, heads, config.head_dim] else None


def _only_user(users, tensor: str, op: str) -> onnx.NodeProto | None:
    found = users.get(tensor, [])
    return found[0] if len(found) == 1 and found[0].op_type == op else None


def _attr(node: onnx.NodeProto, name: str):
    a = next((a for a in node.attribute if a.name == name), None)
    return None if a is None else helper.get_attribute_value(a)


def _const_float(inits, name: str) -> float | None:
    t = inits.get(name)
    value = numpy_helper.to_array(t).reshape(-1) if t is not None else np.zeros(0)
    return float(value[0]) if value.size == 1 else None
