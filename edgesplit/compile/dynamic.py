"""A decoder's whole-model part keeps its sequence and cache lengths dynamic.

Loading fixes every input shape and folds the graph for it (:mod:`edgesplit.model.load`), so a
part extracted from the loaded graph runs only the shapes it was profiled with. A decoder
(``input_ids`` and ``past_key_values.N.key/value`` inputs) is run at a new length every step; so
when the plan is one local fp32 ONNX Runtime part holding the whole decoder, that part is the
original model file as it is, its symbolic dimensions kept, and the bundle's specs list those
axes as ``dynamic_axes`` (:class:`edgesplit.bundle.format.TensorSpec`). The part is still checked
against the whole model on the profiled shapes (:func:`edgesplit.compile.split.check_parts`).

Every other plan and model compiles the shape-resolved graph, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from edgesplit.errors import CompileError, ModelLoadError
from edgesplit.model.graph import ModelGraph
from edgesplit.model.load import DEFAULT_MAX_MODEL_MB
from edgesplit.model.read import read_model
from edgesplit.optimize.plan import Plan

__all__ = ["DynamicPart", "dynamic_part", "is_decoder"]


@dataclass(frozen=True)
class DynamicPart:
    """The one part's ONNX model with its symbolic dimensions, and the dynamic axes of each of
    its inputs and outputs (only those with any)."""

    model: onnx.ModelProto
    dynamic_axes: Mapping[str, tuple[int, ...]]


def is_decoder(names: set[str] | frozenset[str]) -> bool:
    """Whether graph inputs ``names`` are a decoder's, in the layout ``generate`` takes."""
    return "input_ids" in names and any(n.startswith("past_key_values.") for n in names)


def _symbolic_axes(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = vi.type.tensor_type.shape.dim
    return tuple(k for k, d in enumerate(dims) if not d.HasField("dim_value"))


def dynamic_part(graph: ModelGraph, plan: Plan) -> DynamicPart | None:
    """The original model as the plan's one part, when the plan is one local fp32 ORT part of a
    decoder with symbolic input dimensions and the file is the one the graph was loaded from;
    else None (the part is extracted from the shape-resolved graph).

    Raises:
        CompileError: the model file changed since it was loaded.
    """
    if len(plan.parts) != 1 or plan.server or plan.splits or not graph.path:
        return None
    (part,) = plan.parts
    if (part.backend or "ort") != "ort" or part.precision != "fp32" or part.remote:
        return None
    if set(part.inputs) != set(graph.inputs) or set(part.outputs) != set(graph.outputs):
        return None
    if not is_decoder(set(graph.inputs)) or not Path(graph.path).is_file():
        return None
    try:
        model, sha256 = read_model(Path(graph.path), DEFAULT_MAX_MODEL_MB)
    except ModelLoadError as e:
        raise CompileError(f"{graph.path}: cannot read the model again ({e})") from e
    if sha256 != graph.sha256:
        raise CompileError(f"{graph.path}: the model file changed since it was loaded")
    g = model.graph
    inits = {i.name for i in g.initializer}
    ins = [i for i in g.input if i.name not in inits]
    if [i.name for i in ins] != list(graph.inputs) or [o.name for o in g.output] != list(
        graph.outputs
    ):
        return None  # renamed or upgraded at load: the resolved graph is what was checked
    axes = {vi.name: _symbolic_axes(vi) for vi in (*ins, *g.output)}
    if not any(axes[i.name] for i in ins):
        return None
    for vi in (*ins, *g.output):
        if len(vi.type.tensor_type.shape.dim) != len(graph.tensors[vi.name].shape):
            return None
    kept = [(m.key, m.value) for m in model.metadata_props if m.key != "edgesplit.part"]
    del model.metadata_props[:]
    for key, value in kept:  # a decoder's own (its position limit) stay
        model.metadata_props.add(key=key, value=value)
    model.metadata_props.add(key="edgesplit.part", value=part.name)
    return DynamicPart(model, {k: v for k, v in axes.items() if v})
