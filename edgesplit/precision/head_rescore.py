"""A cheap output head whose best candidates are scored again exactly, inside the graph.

A reduced-precision head (``MatMulNBits``, int8 activations) moves every logit a little, and
sometimes that is enough to change which token is largest. :func:`rescore_head` keeps the cheap
head for all ``vocab`` logits and adds, after it::

    approx = head(x)                          (batch, seq, vocab), the cheap head
    _, idx = TopK(approx, k)                  its k best tokens
    rows = Gather(weight_rows, idx)           (batch, seq, k, hidden) float32 rows
    exact = rows @ x                          (batch, seq, k), float32
    logits = ScatterElements(approx, idx, exact)

so the ``k`` candidates carry the float32 head's logits (up to the summation order) and the
others the cheap head's. Whenever the float32 head's best token is among the cheap head's ``k``
best, greedy decoding picks what the float32 head picks. The logits of the other tokens stay
approximate, so an SNR over all logits still measures the cheap head.

``weight_rows`` is the head's float weight as ``(vocab, hidden)`` rows: for a head tied to the
token embedding this is the embedding table itself, which the model already holds for its
``Gather``, so the exact rows cost no memory.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesplit.errors import CompileError

DEFAULT_TOP_K = 16
"""Candidates scored again. On SmolLM2's 199 held-out positions the float32 head's best token was
at most 9th in the 4-bit head's order (see docs/generate.md); 16 leaves room."""
TIED_ROWS = "model.embed_tokens.weight"
"""The zoo decoders' token embedding: a tied head's rows."""


def rescore_head(
    model: onnx.ModelProto,
    rows: str | np.ndarray = TIED_ROWS,
    top_k: int = DEFAULT_TOP_K,
    output: str = "logits",
) -> onnx.ModelProto:
    """``model`` with the head that computes ``output`` followed by an exact rescoring of its
    ``top_k`` best tokens (see the module doc).

    Args:
        rows: The head's float weight as ``(vocab, hidden)``: the name of an initializer of the
            model (the tied embedding), or an array, added as an initializer.
        top_k: Candidates per position, 1 to ``vocab``.
        output: The head's output (``(batch, seq, vocab)``).

    Raises:
        CompileError: naming every problem: no node makes ``output``, the node is not a
            ``MatMul`` or ``MatMulNBits``, the rows are missing or of another size, ``top_k``
            out of range.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    head = next((n for n in graph.node if output in n.output), None)
    inits = {t.name: t for t in graph.initializer}
    problems = []
    if head is None:
        problems.append(f"no node makes '{output}'")
    elif head.op_type not in ("MatMul", "MatMulNBits"):
        problems.append(f"'{output}' comes from {head.op_type}, not MatMul or MatMulNBits")
    if isinstance(rows, str):
        shape = tuple(inits[rows].dims) if rows in inits else None
        if shape is None:
            problems.append(f"no initializer '{rows}'")
    else:
        shape = tuple(rows.shape)
    vocab = _vocab(graph, output)
    if shape is not None and (len(shape) != 2 or (vocab is not None and shape[0] != vocab)):
        problems.append(f"rows {shape} are not (vocab {vocab}, hidden)")
    if vocab is not None and not 1 <= top_k <= vocab or top_k < 1:
        problems.append(f"top_k {top_k} not in 1 .. vocab {vocab}")
    if problems:
        raise CompileError("cannot rescore the head: " + "; ".join(problems))
    if not isinstance(rows, str):
        graph.initializer.append(
            numpy_helper.from_array(np.ascontiguousarray(rows, np.float32), f"{output}.rows")
        )
        rows = f"{output}.rows"
    x, name = head.input[0], f"{output}.rescore"
    approx = f"{output}.approx"
    for i, o in enumerate(head.output):
        if o == output:
            head.output[i] = approx
    k = numpy_helper.from_array(np.asarray([top_k], np.int64), f"{name}.k")
    axis = numpy_helper.from_array(np.asarray([-1], np.int64), f"{name}.axis")
    graph.initializer.extend([k, axis])
    graph.node.extend(
        [
            helper.make_node(
                "TopK",
                [approx, k.name],
                [f"{name}.values", f"{name}.idx"],
                f"{name}.topk",
                axis=-1,
                largest=1,
                sorted=0,
            ),
            helper.make_node("Gather", [rows, f"{name}.idx"], [f"{name}.rows"], f"{name}.gather"),
            helper.make_node("Unsqueeze", [x, axis.name], [f"{name}.x"], f"{name}.unsqueeze"),
            helper.make_node(
                "MatMul", [f"{name}.rows", f"{name}.x"], [f"{name}.dot"], f"{name}.matmul"
            ),
            helper.make_node(
                "Squeeze", [f"{name}.dot", axis.name], [f"{name}.exact"], f"{name}.squeeze"
            ),
            helper.make_node(
                "ScatterElements",
                [approx, f"{name}.idx", f"{name}.exact"],
                [output],
                f"{name}.scatter",
                axis=-1,
            ),
        ]
    )
    return model


def head_rows(model: onnx.ModelProto, node: str = "lm_head") -> str | np.ndarray:
    """The float weight of the float head MatMul ``node`` as ``(vocab, hidden)`` rows: the name
    of the initializer it transposes (a tied head's embedding), else its weight transposed.

    Raises:
        CompileError: when ``node`` is no MatMul over a constant weight.
    """
    inits = {t.name: t for t in model.graph.initializer}
    made_by = {o: n for n in model.graph.node for o in n.output}
    head = next((n for n in model.graph.node if n.name == node and n.op_type == "MatMul"), None)
    weight = made_by.get(head.input[1]) if head is not None else None
    if weight is not None and weight.op_type == "Transpose" and weight.input[0] in inits:
        perm = next((list(a.ints) for a in weight.attribute if a.name == "perm"), [1, 0])
        if perm == [1, 0]:
            return weight.input[0]
    if head is None or head.input[1] not in inits:
        raise CompileError(f"head '{node}': no MatMul over a constant weight")
    return np.ascontiguousarray(numpy_helper.to_array(inits[head.input[1]]).T)


def _vocab(graph: onnx.GraphProto, output: str) -> int | None:
    """The last dimension of ``output`` when the graph states it."""
    for v in graph.output:
        if v.name == output:
            dims = v.type.tensor_type.shape.dim
            return dims[-1].dim_value or None if dims else None
    return None
