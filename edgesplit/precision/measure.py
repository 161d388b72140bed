"""A plan's accuracy, measured: its parts run in their precisions on held-out samples, against fp32.

:class:`PlanMeasurer` extracts each part between its boundary tensors, converts it to its precision
exactly as ``compile`` does (:func:`part_model`: the same calibration, the same converter), runs
the parts in order on the held-out calibration samples, and compares the model's outputs with the
fp32 model's (:func:`~edgesplit.precision.metrics.compare`). Part models, sessions and results are
memoised, so the planner can measure many combinations of the same parts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from edgesplit.cpu import ort_session_options
from edgesplit.model.calibration_data import CalibrationSet, calibration_set
from edgesplit.model.extract import PartExtractor
from edgesplit.model.graph import ModelGraph
from edgesplit.precision.convert import (
    DEFAULT_CALIBRATION_METHOD,
    calibrate,
    check_calibration_method,
    convert,
)
from edgesplit.precision.metrics import EXACT, Accuracy, compare


class PartLike(Protocol):
    """What a part of a plan says about itself (an ``optimize.plan.Part`` is one)."""

    name: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    precision: str


def part_model(
    graph: ModelGraph,
    inputs: Sequence[str],
    outputs: Sequence[str],
    precision: str,
    ranges: Path | None = None,
    extractor: PartExtractor | None = None,
) -> onnx.ModelProto:
    """The part between ``inputs`` and ``outputs`` in ``precision``, float32 at its boundary.

    int8 parts are quantized with ``ranges``, the whole model's calibration
    (:func:`~edgesplit.precision.convert.calibrate`), so that parts agree on the scales of the
    tensors they pass each other. ``compile`` and :class:`PlanMeasurer` both come through here.
    """
    model = (extractor or PartExtractor(graph)).extract(list(inputs), list(outputs))
    return convert(model, precision, ranges if precision == "int8" else None)


def _key(parts: Sequence[PartLike]) -> tuple:
    return tuple((p.inputs, p.outputs, p.precision) for p in parts)


class PlanMeasurer:
    """Measures plans of one model against its fp32 outputs on held-out calibration samples.

    Args:
        calibration_data: ``--calibration-data`` (an ``.npz`` or a folder of ``.npy``); None: the
            photographs for a vision model, else synthetic inputs (see ``calibration_data``).
        calibration_method: ``--calibration-method``, one of
            :data:`~edgesplit.precision.convert.CALIBRATION_METHODS` (None: the default).
    """

    def __init__(
        self,
        graph: ModelGraph,
        calibration_data: str | os.PathLike | None = None,
        calibration_method: str | None = None,
    ):
        self.graph = graph
        self.calibration_data = None if calibration_data is None else str(calibration_data)
        self.calibration_method = check_calibration_method(calibration_method or DEFAULT_CALIBRATION_METHOD)
        self._extractor = PartExtractor(graph)
        self._sessions: dict[tuple, object] = {}
        self._results: dict[tuple, Accuracy] = {}

    @cached_property
    def data(self) -> CalibrationSet:
        return calibration_set(self.graph, self.calibration_data)

    @cached_property
    def ranges(self) -> Path:
        return calibrate(self.graph, self.data, self.calibration_method)

    def describe(self) -> dict[str, object]:
        """The calibration data and method, for the plan (loads the data)."""
        return (
            self.data.describe()
            | ({"path": os.path.abspath(self.calibration_data)} if self.calibration_data else {})
            | {"method": self.calibration_method}
        )

    def _session(self, inputs: tuple[str, ...], outputs: tuple[str, ...], precision: str):
        import onnxruntime as ort

        key = (inputs, outputs, precision)
        if key not in self._sessions:
            ranges = self.ranges if precision == "int8" else None
            model = part_model(self.graph, inputs, outputs, precision, ranges, self._extractor)
            so = ort_session_options(None, None)
            self._sessions[key] = ort.InferenceSession(
                model.SerializeToString(), so, providers=["CPUExecutionProvider"]
            )
        return self._sessions[key]

    def run(self, parts: Sequence[PartLike], sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The model's outputs from running ``parts`` (in a topological order) on one sample."""
        values = dict(sample)
        for p in parts:
            sess = self._session(tuple(p.inputs), tuple(p.outputs), p.precision)
            got = sess.run(list(p.outputs), {t: values[t] for t in p.inputs})
            values.update(zip(p.outputs, got))
        return {t: values[t] for t in self.graph.outputs}

    @cached_property
    def reference(self) -> list[dict[str, np.ndarray]]:
        """The fp32 model's outputs on the held-out samples."""
        whole = _Whole(self.graph)
        return [self.run([whole], s) for s in self.data.held_out]

    def __call__(self, parts: Sequence[PartLike]) -> Accuracy:
        """The accuracy of ``parts`` against fp32; exact (no run) when every part is fp32."""
        if all(p.precision == "fp32" for p in parts):
            return EXACT
        key = _key(parts)
        if key not in self._results:
            got = [self.run(parts, s) for s in self.data.held_out]
            self._results[key] = compare(self.reference, got)
        return self._results[key]


class _Whole:
    """The whole model as one fp32 part."""

    def __init__(self, graph: ModelGraph):
        self.name = "whole"
        self.nodes = tuple(n.name for n in graph.nodes)
        self.inputs = tuple(graph.inputs)
        self.outputs = tuple(graph.outputs)
        self.precision = "fp32"
