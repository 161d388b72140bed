"""Split a model into its plan's parts, and check each part against the whole model.

Each part is extracted between the tensors it reads and the tensors it writes by
:class:`~edgesplit.model.extract.PartExtractor`, which (unlike ``onnx.utils.Extractor``) follows
the outer-scope tensors that If, Loop and Scan subgraphs read. Then every part is run alone in
ONNX Runtime on the intermediate tensors of one random whole-model run, and must reproduce the
whole model's tensors (fp32 parts to float rounding; int8 and fp16 parts, whose own check is by the
plan's accuracy measure in :mod:`edgesplit.compile.precision_check`, only to the boundary).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from edgesplit.device.cpu import ort_session_options
from edgesplit.errors import CompileError
from edgesplit.limits import run_options
from edgesplit.model.extract import PartExtractor
from edgesplit.model.feeds import random_inputs, run_failure
from edgesplit.model.graph import ModelGraph
from edgesplit.model.validate import ort_message
from edgesplit.model.values import rel_error


@dataclass(frozen=True)
class PartModel:
    """One extracted part: its ONNX model and the tensors crossing its boundary."""

    name: str
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def extract_parts(
    graph: ModelGraph, parts: Sequence[tuple[str, Sequence[str], Sequence[str]]]
) -> list[PartModel]:
    """Extract ``(name, input tensors, output tensors)`` parts from the graph's model."""
    extractor = PartExtractor(graph)
    out = []
    for name, ins, outs in parts:
        try:
            sub = extractor.extract(list(ins), list(outs), f"{graph.name}_{name}")
        except (ValueError, KeyError) as e:
            raise CompileError(
                f"part {name}: cannot extract between {list(ins)} and {list(outs)} ({e})"
            ) from e
        del sub.metadata_props[:]
        sub.metadata_props.add(key="edgesplit.part", value=name)
        out.append(PartModel(name, sub, tuple(ins), tuple(outs)))
    return out


def probe_session(graph: ModelGraph, names: Sequence[str]):
    """An ORT session of the whole model that also outputs the tensors ``names`` (with the same
    optimisations as the parts get; tensors named as outputs survive the fusions)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(graph.model)
    have = {o.name for o in probe.graph.output}
    for n in names:
        if n not in have and n not in graph.inputs:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(n))
    so = ort_session_options(None, None)
    return ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])


def reference_tensors(
    graph: ModelGraph, names: Sequence[str], seed: int = 0
) -> dict[str, np.ndarray]:
    """Values of the given tensors (and graph inputs) in one ORT run of the whole model."""
    sess = probe_session(graph, names)
    feeds = random_inputs(graph, seed)
    wanted = [o.name for o in sess.get_outputs()]
    try:
        got = sess.run(wanted, feeds, run_options())
    except Exception as e:  # noqa: BLE001 - ORT's run errors: on made-up inputs, say which
        raise run_failure(
            graph, "running the whole model to check the parts", ort_message(e)
        ) from e
    return {**feeds, **dict(zip(wanted, got))}


REDUCED_RTOL = 0.1
"""The fp32 extraction of an int8 or fp16 part is checked only to its boundary: a wrong boundary
gives errors of order 1, while float rounding that the whole model amplifies can pass 1e-3 (3e-3
was seen at PP-OCRv4 det's sigmoid output on random inputs). What ships, the reduced-precision
artifact, is checked by the plan's accuracy measure (:mod:`edgesplit.compile.precision_check`)."""


def check_parts(
    graph: ModelGraph, parts: Sequence[PartModel], rtol: float = 1e-3, reduced: Collection[str] = ()
) -> dict[str, float]:
    """Run each part alone in ORT on the whole model's tensors; return max relative error per part.

    The error is the largest absolute difference over the largest magnitude of the tensor. A wrong
    boundary gives errors of order 1; fused kernels differ in the last bits (up to ~3e-4 seen on
    PP-OCR det), hence the default tolerance. Parts named in ``reduced`` (those that ship in int8
    or fp16) are held to :data:`REDUCED_RTOL` only.

    Raises:
        CompileError: when a part does not reproduce the whole model's tensors.
    """
    import onnxruntime as ort

    names = {t for p in parts for t in (*p.inputs, *p.outputs)}
    ref = reference_tensors(graph, sorted(names))
    errors = {}
    for p in parts:
        tol = REDUCED_RTOL if p.name in reduced else rtol
        so = ort_session_options(None, None)
        sess = ort.InferenceSession(
            p.model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        got = sess.run(list(p.outputs), {t: ref[t] for t in p.inputs}, run_options())
        worst = 0.0
        for t, value in zip(p.outputs, got):
            expected = ref[t]
            if getattr(value, "shape", None) != getattr(expected, "shape", None):
                raise CompileError(
                    f"part {p.name}: output {t} has shape {value.shape}, whole model "
                    f"{expected.shape}"
                )
            err = rel_error(value, expected)
            worst = max(worst, err)
            if err > tol:
                what = "" if tol == rtol else " in its fp32 form (boundary check)"
                raise CompileError(
                    f"part {p.name}: output {t} differs from the whole model{what} (rel error "
                    f"{err:.2e})"
                )
        errors[p.name] = worst
    return errors
