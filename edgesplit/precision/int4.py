"""int4 weight-only parts: ``MatMulNBits`` from ``onnxruntime.quantization``'s n-bit quantizer.

Each MatMul whose weight is a constant becomes ORT's ``MatMulNBits`` (contrib domain
``com.microsoft``): 4-bit weights in blocks of :data:`BLOCK_SIZE` along the input dimension,
each block with its own float scale (symmetric: no zero point), activations kept in float32. No
calibration data is needed. A weight reached through a ``Transpose`` of an initializer (a tied
output head) is transposed first, so the head is quantized too; the embedding ``Gather`` keeps
its float32 table (a step reads one row of it).

``accuracy_level`` 4 lets ORT's CPU kernel quantize the activations to int8 per block and run the
dot products in integers (VNNI here); 0 keeps them in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from edgesplit.errors import CompileError
from edgesplit.precision.convert import _quiet

BLOCK_SIZE = 32
"""Weights per scale: ORT GenAI's model builder's default for int4."""
ACCURACY_LEVEL = 4
"""int8 activations inside the kernel (ORT's ``accuracy_level``): the fastest on x86 CPUs."""


def fold_transposed_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every ``Transpose`` of an initializer that feeds a MatMul replaced by the
    transposed initializer (the original initializer kept for its other users)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
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


def quantize_int4(
    model: onnx.ModelProto,
    ranges: Path | None = None,
    nodes: Sequence[str] = (),
    block_size: int = BLOCK_SIZE,
    accuracy_level: int = ACCURACY_LEVEL,
) -> onnx.ModelProto:
    """``model`` with its constant-weight MatMuls (``nodes`` only, when given) in int4
    ``MatMulNBits``; ``ranges`` is unused (weight-only quantization needs no calibration).

    Raises:
        CompileError: when ORT's quantizer fails.
    """
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )
    except ImportError as e:
        raise CompileError(f"int4 needs onnxruntime's n-bit quantizer ({e})") from e
    prepared = fold_transposed_weights(model)
    config = DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level
    )
    # ORT quantizes a node when it is included *or* its op type is listed: keep the others out.
    wanted = set(nodes)
    exclude = [n.name for n in prepared.graph.node if wanted and n.name not in wanted]
    try:
        with _quiet():
            q = MatMulNBitsQuantizer(
                prepared,
                block_size=block_size,
                is_symmetric=True,
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
