"""Models older than opset 7 upgraded with onnx's version converter, and the result checked.

ONNX Runtime guarantees opset 7 and up (it lacks most opset-6 kernels: AveragePool-1, Gemm-6,
PRelu-6 ...), and onnxslim cannot import older models, so they are upgraded to
:data:`UPGRADE_TO_OPSET`. The converter does not know every change of meaning: before opset 7 a
``PRelu`` slope of shape ``(C,)`` applied per channel (axis 1) of an input of rank 3 or more; from
opset 7 it broadcasts numpy-style, against the last axis. So such slopes get an ``Unsqueeze`` to
``(C, 1, ..., 1)`` first.

Then the upgraded model and the original (its PRelu slopes per channel already) are run on the
same made-up inputs, and must agree: the original in ONNX Runtime where ORT still runs it, else in
onnx's reference evaluator (``onnx.reference``). An upgrade that changes the outputs is refused,
naming the output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper

from edgesplit.errors import ModelLoadError
from edgesplit.model.read import first_line

UPGRADE_BELOW_OPSET = 7
"""Models of an older default-domain opset are upgraded first: ONNX Runtime guarantees opset 7
and up, and onnxslim cannot import older models."""

UPGRADE_TO_OPSET = 13

CHECK_RTOL = 1e-4
"""How far the upgraded model's outputs may be from the original's (relative to the largest)."""

_ASSERTION = re.compile(r"^\S+:\d+: \w+: Assertion `.*?` failed: ")


def default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


class Upgrade(NamedTuple):
    """What :func:`upgrade` made: the model to load, why the upgrade failed (None: it did not),
    and the model to check the upgrade against (the original, its PRelu slopes per channel)."""

    model: onnx.ModelProto
    failed: str | None
    original: onnx.ModelProto


def upgrade(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], notes: list[str]
) -> Upgrade:
    """Upgrade an old-opset model. ``shapes``: the input shapes given (the PRelu rewrite needs
    the rank and channels of its input)."""
    opset = default_opset(model)
    if opset is None or opset >= UPGRADE_BELOW_OPSET:
        return Upgrade(model, None, model)
    from onnx import version_converter

    # the check runs this, not the file: onnx.reference broadcasts a (C,) slope numpy-style where
    # it can (the last axis when that is C wide too), not per channel as opset 6 meant
    meant = _per_channel_prelu(model, shapes)
    try:
        new = version_converter.convert_version(meant, UPGRADE_TO_OPSET)
        onnx.checker.check_model(new)
    except Exception as e:  # noqa: BLE001 - the converter raises bare errors per adapter
        no_schema = sorted(
            {n.op_type for n in model.graph.node if not onnx.defs.has(n.op_type, n.domain)}
        )
        why = (
            f"no onnx schema for {', '.join(no_schema)}"
            if no_schema
            else _ASSERTION.sub("", first_line(e))
        )
        return Upgrade(
            model, f"opset {opset} could not be upgraded to {UPGRADE_TO_OPSET} ({why})", model
        )
    weights = {t.name for t in new.graph.initializer}
    keep = [i for i in new.graph.input if i.name not in weights]  # IR < 4 listed weights as inputs
    del new.graph.input[:]
    new.graph.input.extend(keep)
    new.ir_version = max(new.ir_version, helper.find_min_ir_version_for(list(new.opset_import)))
    notes.append(f"upgraded from opset {opset} to {UPGRADE_TO_OPSET} with onnx.version_converter")
    return Upgrade(new, None, meant)


def _per_channel_prelu(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]
) -> onnx.ModelProto:
    """A copy in which every opset-6 ``PRelu`` whose slope is ``(C,)`` for an input ``(N, C, ...)``
    reads its slope through ``Unsqueeze`` to ``(C, 1, ..., 1)``: what it meant before opset 7."""
    from edgesplit.model.simplify import with_input_shapes

    try:
        inferred = onnx.shape_inference.infer_shapes(with_input_shapes(model, shapes))
    except Exception:  # noqa: BLE001 - without shapes nothing is rewritten; the check says the rest
        return model
    rank = {vi.name: _dims(vi.type) for vi in [*inferred.graph.input, *inferred.graph.value_info]}
    rank.update({t.name: tuple(t.dims) for t in inferred.graph.initializer})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for i, n in enumerate(out.graph.node):
        x, slope = (
            (rank.get(t) for t in (n.input[0], n.input[1]))
            if n.op_type == "PRelu"
            else (None, None)
        )
        if x and slope and len(slope) == 1 and len(x) >= 3 and slope[0] == x[1] and slope[0] != 1:
            wide = f"{n.input[1]}_per_channel_{i}"
            axes = list(range(1, len(x) - 1))
            nodes.append(helper.make_node("Unsqueeze", [n.input[1]], [wide], axes=axes, name=wide))
            n.input[1] = wide
        nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _dims(t: onnx.TypeProto) -> tuple[int, ...] | None:
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims) if all(d.HasField("dim_value") for d in dims) else None


def check_upgrade(
    where: str, original: onnx.ModelProto, upgraded: onnx.ModelProto, feeds: Mapping[str, object]
) -> str | None:
    """Run both models on ``feeds``; None when they agree, else a note saying why it could not be
    checked.

    Raises:
        ModelLoadError: the upgraded model's outputs differ from the original's.
    """
    from edgesplit.model.validate import ort_message, quiet_ort
    from edgesplit.model.values import rel_error

    try:
        got = _ort(upgraded, feeds)
    except Exception as e:  # noqa: BLE001 - ORT's errors; the upgraded model is checked again later
        return (
            "the upgrade was not checked (ONNX Runtime cannot run the upgraded model: "
            f"{ort_message(e)})"
        )
    try:
        want, by = _ort(original, feeds), "ONNX Runtime"
    except Exception:  # noqa: BLE001 - ORT lacks the old kernels: the reference evaluator has them
        from onnx.reference import ReferenceEvaluator

        try:
            with quiet_ort():
                want, by = ReferenceEvaluator(original).run(None, dict(feeds)), "onnx.reference"
        except Exception as e:  # noqa: BLE001 - an op the reference evaluator lacks
            return (
                "the upgrade was not checked (onnx.reference cannot run the original: "
                f"{first_line(e)})"
            )
    for out, g, w in zip(upgraded.graph.output, got, want):
        err = rel_error(g, np.asarray(w) if isinstance(w, np.generic) else w)
        if not err <= CHECK_RTOL:
            raise ModelLoadError(
                where,
                f"upgrading it to opset {UPGRADE_TO_OPSET} changes output '{out.name}' (relative "
                "error "
                f"{err:.2g} against {by} on the original model); onnx.version_converter cannot "
                "convert it",
            )
    return None


def _ort(model: onnx.ModelProto, feeds: Mapping[str, object]) -> list:
    from edgesplit import limits
    from edgesplit.model.validate import ort_session

    sess = ort_session("", model)
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names}, limits.run_options())
