"""A plan's accuracy, measured: its parts run in their precisions on held-out samples, against fp32.

:class:`PlanMeasurer` extracts each part between its boundary tensors, converts it to its precision
exactly as ``compile`` does (:func:`part_model`: the same calibration, the same converter), runs
the parts in order on the held-out calibration samples, and compares the model's outputs with the
fp32 model's (:func:`~edgesplit.precision.metrics.compare`). Part sessions, the fp32 reference and
results are memoised by content (model, input shapes, calibration data, method), not per measurer,
so the planner can measure many combinations of the same parts, and a sweep that partitions one
model again and again (a plan per bandwidth, say) converts and runs each part once. A measurement
takes the outputs of the parts that the one before it on the same sample began with.

Results are also kept on disk (``<cache>/accuracy``, :mod:`edgesplit.cache`),
keyed by the same content plus the parts, the onnxruntime version and the source of the code that
converts, runs and compares: ``partition``, ``deploy`` and ``explain`` run one after another on a
model (each its own process) measure each combination of parts once. A file that cannot be read
is measured again and replaced; one that cannot be written is only not kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from edgesplit.cache import cache_folder
from edgesplit.device.cpu import ort_session_options
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
from edgesplit.util import atomic_write_text, check_fields, known_fields


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
    return tuple((tuple(p.inputs), tuple(p.outputs), p.precision) for p in parts)


@cache
def _code_sha256() -> str:
    """Of onnxruntime's version and the source of the modules whose code makes the figures: a
    change to any of them measures again rather than reading what older code found."""
    import onnxruntime

    from edgesplit.model import extract
    from edgesplit.precision import convert as convert_module
    from edgesplit.precision import metrics

    h = hashlib.sha256(onnxruntime.__version__.encode())
    for file in (convert_module.__file__, metrics.__file__, extract.__file__, __file__):
        h.update(Path(file).read_bytes())
    return h.hexdigest()


def _read_accuracy(path: Path) -> Accuracy | None:
    """The accuracy kept in ``path``, or None where it is absent or not what this code writes."""
    try:
        acc = Accuracy(**known_fields(Accuracy, json.loads(path.read_text())))
        check_fields(acc, str(path), ValueError, signed=("snr_db",))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # measured again
        return None
    return acc


def _keep_accuracy(path: Path, acc: Accuracy) -> None:
    try:
        atomic_write_text(path, json.dumps(asdict(acc)))  # floats in full: the same plan again
    except OSError:  # a read-only cache: nothing is kept, nothing else changes
        pass


Chain = tuple[tuple[tuple, list], ...]  # parts run, ((inputs, outputs, precision), their outputs)


@dataclass
class _Memo:
    """What measuring one model on one calibration set has found: part sessions, results, the
    fp32 reference outputs."""

    sessions: dict[tuple, object] = field(default_factory=dict)
    results: dict[tuple, Accuracy] = field(default_factory=dict)
    reference: list[dict[str, np.ndarray]] | None = None
    chains: dict[int, Chain] = field(default_factory=dict)  # by held-out sample, see _outputs


CHAIN_MAX_NBYTES = 256 << 20  # part outputs kept for reuse, over all held-out samples


MEMO_MODELS = 2  # models whose memo is kept: a caller alternating two models keeps both
_MEMOS: OrderedDict[tuple, _Memo] = OrderedDict()
_MEMOS_LOCK = threading.Lock()


def _memo(key: tuple) -> _Memo:
    """The memo for ``key``, the most recently used; the least recent beyond :data:`MEMO_MODELS`
    are dropped (their sessions hold the int8 part models)."""
    with _MEMOS_LOCK:
        memo = _MEMOS.pop(key, None) or _Memo()
        _MEMOS[key] = memo
        while len(_MEMOS) > MEMO_MODELS:
            _MEMOS.popitem(last=False)
        return memo


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
        self.calibration_method = check_calibration_method(
            calibration_method or DEFAULT_CALIBRATION_METHOD
        )
        self._extractor = PartExtractor(graph)

    @cached_property
    def data(self) -> CalibrationSet:
        return calibration_set(self.graph, self.calibration_data)

    @cached_property
    def ranges(self) -> Path:
        return calibrate(self.graph, self.data, self.calibration_method)

    @cached_property
    def _memo(self) -> _Memo:
        g = self.graph
        shapes = tuple(sorted(g.input_shapes().items()))
        return _memo((g.sha256, shapes, g.outputs, self.data.sha256, self.calibration_method))

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
        sessions = self._memo.sessions
        if key not in sessions:
            ranges = self.ranges if precision == "int8" else None
            model = part_model(self.graph, inputs, outputs, precision, ranges, self._extractor)
            # not spinning: a plan's parts run one after another, each in its own session, and an
            # idle pool's spinning took the cores from the next (66 parts of transformer_large:
            # 39 ms a sample spinning, 13.5 ms not, the whole model in one session 10.7 ms)
            so = ort_session_options(None, None, spin=False)
            sessions[key] = ort.InferenceSession(
                model.SerializeToString(), so, providers=["CPUExecutionProvider"]
            )
        return sessions[key]

    def run(
        self, parts: Sequence[PartLike], sample: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The model's outputs from running ``parts`` (in a topological order) on one sample."""
        return self._run(parts, sample, (), 0)[0]

    def _run(
        self, parts: Sequence[PartLike], sample: Mapping[str, np.ndarray], chain: Chain, room: int
    ) -> tuple[dict[str, np.ndarray], Chain]:
        """:meth:`run`, taking the outputs of the parts ``parts`` begins with from ``chain`` (the
        same parts in the same precisions on the same sample give the same values); also the
        chain of this run, its outputs up to ``room`` bytes (none past a sequence or map output)."""
        values = dict(sample)
        kept: list[tuple[tuple, list]] = []
        same = True
        for j, p in enumerate(parts):
            key = (tuple(p.inputs), tuple(p.outputs), p.precision)
            if same and j < len(chain) and chain[j][0] == key:
                got = chain[j][1]
            else:
                same = False
                got = self._session(*key).run(list(p.outputs), {t: values[t] for t in p.inputs})
            values.update(zip(p.outputs, got))
            if len(kept) == j and all(isinstance(a, np.ndarray) for a in got):  # a prefix only
                room -= sum(a.nbytes for a in got)
                if room >= 0:
                    kept.append((key, got))
        return {t: values[t] for t in self.graph.outputs}, tuple(kept)

    @property
    def reference(self) -> list[dict[str, np.ndarray]]:
        """The fp32 model's outputs on the held-out samples."""
        memo = self._memo
        if memo.reference is None:
            whole = _Whole(self.graph)
            memo.reference = [self.run([whole], s) for s in self.data.held_out]
        return memo.reference

    def __call__(self, parts: Sequence[PartLike]) -> Accuracy:
        """The accuracy of ``parts`` against fp32; exact (no run) when every part is fp32."""
        if all(p.precision == "fp32" for p in parts):
            return EXACT
        key, results = _key(parts), self._memo.results
        if key not in results:
            path = self._cache_file(key)
            acc = _read_accuracy(path)
            if acc is None:
                acc = compare(
                    self.reference,
                    [self._outputs(parts, i) for i in range(len(self.data.held_out))],
                )
                _keep_accuracy(path, acc)
            results[key] = acc
        return results[key]

    def _outputs(self, parts: Sequence[PartLike], i: int) -> dict[str, np.ndarray]:
        """:meth:`run` on held-out sample ``i``, taking the outputs of the parts that the last
        plan measured on it began with.

        The planner measures each reduced unit of a plan alone, the rest in fp32, unit after unit
        in the plan's order: each begins with the fp32 parts up to the unit measured before it
        (on transformer_large's 128 units, half the part runs). The chain kept per sample holds
        at most :data:`CHAIN_MAX_NBYTES` over all samples.
        """
        chains = self._memo.chains
        room = CHAIN_MAX_NBYTES // max(len(self.data.held_out), 1)
        out, chains[i] = self._run(parts, self.data.held_out[i], chains.get(i, ()), room)
        return out  # the chain is replaced whole: another thread reads the old one or this one

    def _cache_file(self, key: tuple) -> Path:
        g = self.graph
        content = [
            _code_sha256(),
            g.sha256,
            sorted(g.input_shapes().items()),
            g.outputs,
            self.data.sha256,
            self.calibration_method,
            key,
        ]
        name = hashlib.sha256(json.dumps(content, default=list).encode()).hexdigest()[:40]
        return cache_folder("accuracy") / f"{name}.json"


class _Whole:
    """The whole model as one fp32 part."""

    def __init__(self, graph: ModelGraph):
        self.name = "whole"
        self.nodes = tuple(n.name for n in graph.nodes)
        self.inputs = tuple(graph.inputs)
        self.outputs = tuple(graph.outputs)
        self.precision = "fp32"
