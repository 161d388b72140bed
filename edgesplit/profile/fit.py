"""Fit a processor's roofline efficiencies to published whole-model latencies.

The model, per (device, processor, precision), for a zoo model with nodes i:

    latency_ms = call_ms + sum_i [ overhead_ms + max(F_i / (peak x e_c x r_i), B_i x s / (bandwidth
    x e_m)) ]

F_i and B_i are the node's FLOPs and fp32 bytes from our loader (:func:`edgesplit.load_model`
and :mod:`edgesplit.model.flops`), s the precision's element size over 4, r_i the plain
roofline's efficiency of the node's op class relative to dense Conv (so depthwise and
elementwise ops keep their place), peak and bandwidth the spec's datasheet figures, call_ms the
fixed cost of one call into the processor's runtime (an NPU's remote call, a GPU queue submit;
the predictor reports it as the part dispatch cost). The four unknowns (e_c, e_m, overhead_ms,
call_ms) are fitted by least squares on log(latency), with a weak pull (weight
:data:`PRIOR_WEIGHT` per parameter, in log space) towards the plain roofline's figures (and
:data:`PRIOR_CALL_MS`) so that a handful of points cannot send a poorly determined parameter to a
bound.

Leave-one-out leaves out every figure of one zoo model at a time (a model measured with two
runtimes is one point of evidence, not two), fits on the rest, and predicts the figures left out.
"""

from __future__ import annotations

import datetime as _dt
import functools
import itertools
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgesplit.device.spec import DeviceSpec, Processor
from edgesplit.model.graph import ModelGraph
from edgesplit.profile.predict import (
    _ELEMENT_NBYTES,
    _MEMORY_EFFICIENCY,
    conv_efficiency,
    plain_efficiency,
)
from edgesplit.profile.published import ProcessorFit, PublishedFigure, PublishedSet, data_dir
from edgesplit.util import atomic_write_text

PRIOR_WEIGHT = 0.1
PRIOR_CALL_MS = 0.05
_BOUNDS = ((1e-3, 20.0), (1e-2, 20.0), (1e-5, 1.0), (1e-4, 10.0))  # e_c, e_m, overhead_ms, call_ms


@dataclass(frozen=True)
class NodeArrays:
    """Per-node costs of one model on one processor kind, as the fit needs them."""

    flops: np.ndarray
    nbytes: np.ndarray
    relative_efficiency: np.ndarray

    @property
    def n_nodes(self) -> int:
        return len(self.flops)


@functools.cache
def zoo_graph(zoo_model: str, input_shape: tuple[int, ...]) -> ModelGraph:
    """A zoo model loaded with our loader, its input resized to ``input_shape`` when it differs."""
    from edgesplit.model import zoo
    from edgesplit.model.load import load_model

    model = zoo.build(zoo_model)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    if tuple(d.dim_value for d in dims) != tuple(input_shape):
        for d, v in zip(dims, input_shape, strict=True):
            d.dim_value = v
        del model.graph.value_info[:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{zoo_model}.onnx"
        path.write_bytes(model.SerializeToString())
        return load_model(path)


def node_arrays(graph: ModelGraph, kind: str) -> NodeArrays:
    conv = conv_efficiency(kind)
    return NodeArrays(
        np.array([n.flops for n in graph.nodes], dtype=float),
        np.array([n.bytes_read + n.bytes_written for n in graph.nodes], dtype=float),
        np.array([plain_efficiency(n, kind, graph) / conv for n in graph.nodes]),
    )


def model_ms(
    arrays: NodeArrays,
    processor: Processor,
    precision: str,
    compute_eff: float,
    memory_eff: float,
    overhead_ms: float,
    call_ms: float = 0.0,
) -> float:
    """Whole-model latency under the calibrated roofline (see the module docstring)."""
    compute = arrays.flops / (
        processor.peak_gflops * 1e9 * compute_eff * arrays.relative_efficiency
    )
    scale = _ELEMENT_NBYTES[precision] / 4
    memory = arrays.nbytes * scale / (processor.mem_bandwidth_gbps * 1e9 * memory_eff)
    return float(call_ms + arrays.n_nodes * overhead_ms + np.maximum(compute, memory).sum() * 1e3)


def plain_ms(arrays: NodeArrays, processor: Processor) -> float:
    """Whole-model latency under today's uncalibrated roofline (what the predictor did before)."""
    return model_ms(
        arrays,
        processor,
        "fp32",
        conv_efficiency(processor.kind),
        _MEMORY_EFFICIENCY,
        processor.launch_overhead_ms,
    )


def fit_efficiencies(
    cases: Sequence[tuple[NodeArrays, float]], processor: Processor, precision: str
) -> tuple[float, float, float, float]:
    """Least-squares fit in log space of (compute_eff, memory_eff, overhead_ms, call_ms) to observed
    ms."""
    from scipy.optimize import least_squares

    prior = np.log(
        [
            conv_efficiency(processor.kind),
            _MEMORY_EFFICIENCY,
            max(processor.launch_overhead_ms, 1e-4),
            PRIOR_CALL_MS,
        ]
    )
    lo, hi = np.log([b[0] for b in _BOUNDS]), np.log([b[1] for b in _BOUNDS])
    observed = np.log([ms for _, ms in cases])

    def residuals(theta: np.ndarray) -> np.ndarray:
        pred = np.log([model_ms(a, processor, precision, *np.exp(theta)) for a, _ in cases])
        return np.concatenate([pred - observed, PRIOR_WEIGHT * (theta - prior)])

    best = None
    # The max() makes the objective piecewise smooth, and a per-node and a per-call overhead trade
    # off against each other: start from a small fixed grid, keep the best.
    for offset in itertools.product((-1.0, 0.0, 1.0), (-1.0, 0.0, 1.0), (0.0,), (-1.0, 1.5)):
        start = np.clip(prior + offset, lo + 1e-9, hi - 1e-9)
        r = least_squares(residuals, start, bounds=(lo, hi), method="trf")
        if best is None or r.cost < best.cost:
            best = r
    ec, em, oh, call = np.exp(best.x)
    return float(ec), float(em), float(oh), float(call)


@dataclass(frozen=True)
class Group:
    """The usable figures of one (processor, precision) of a device, with their node arrays."""

    processor: Processor
    precision: str
    figures: tuple[PublishedFigure, ...]
    arrays: tuple[NodeArrays, ...]

    @property
    def models(self) -> list[str]:
        return sorted({f.zoo_model for f in self.figures if f.zoo_model})


def groups(spec: DeviceSpec, published: PublishedSet) -> list[Group]:
    """Figures with a zoo model, grouped by (processor, precision), in file order."""
    out: dict[tuple[str, str], list[PublishedFigure]] = {}
    for f in published.figures:
        if f.zoo_model is not None:
            out.setdefault((f.processor, f.precision), []).append(f)
    result = []
    for (proc_name, precision), figs in out.items():
        proc = spec.processor(proc_name)
        arrays = tuple(node_arrays(zoo_graph(f.zoo_model, f.input_shape), proc.kind) for f in figs)
        result.append(Group(proc, precision, tuple(figs), arrays))
    return result


def fit_group(group: Group) -> ProcessorFit:
    ec, em, oh, call = fit_efficiencies(
        [(a, f.latency_ms) for a, f in zip(group.arrays, group.figures, strict=True)],
        group.processor,
        group.precision,
    )
    ids = tuple(f.id for f in group.figures)
    return ProcessorFit(
        group.processor.name,
        group.precision,
        round(ec, 4),
        round(em, 4),
        round(oh, 6),
        round(call, 5),
        ids,
    )


@dataclass(frozen=True)
class Prediction:
    """One published figure against the plain roofline and the leave-one-model-out fit."""

    figure: PublishedFigure
    plain_ms: float
    loo_ms: float | None  # None when fewer than two other models remain to fit on


def leave_one_out(group: Group) -> list[Prediction]:
    """Per figure: plain roofline, and the fit on every other zoo model's figures."""
    out = []
    for model in group.models:
        rest = [
            (a, f.latency_ms)
            for a, f in zip(group.arrays, group.figures, strict=True)
            if f.zoo_model != model
        ]
        params = (
            fit_efficiencies(rest, group.processor, group.precision)
            if len({f.zoo_model for f in group.figures} - {model}) >= 2
            else None
        )
        for a, f in zip(group.arrays, group.figures, strict=True):
            if f.zoo_model == model:
                loo = model_ms(a, group.processor, group.precision, *params) if params else None
                out.append(Prediction(f, plain_ms(a, group.processor), loo))
    order = {f.id: i for i, f in enumerate(group.figures)}
    return sorted(out, key=lambda p: order[p.figure.id])


def calibration_document(
    spec: DeviceSpec, published: PublishedSet, entries: Sequence[ProcessorFit]
) -> dict:
    """The JSON document of ``profiles/fitted/DEVICE.json``."""
    rel = Path(published.path).resolve()
    try:
        rel = rel.relative_to(data_dir().resolve().parent)
    except ValueError:
        pass
    return {
        "device": spec.name,
        "fitted": _dt.date.today().isoformat(),
        "published_file": str(rel),
        "what": "Fitted, not datasheet, figures: per processor and precision, the share of the "
        "spec's "
        "peak_gflops reached on dense Conv (compute_efficiency), of mem_bandwidth_gbps "
        "(memory_efficiency), a per-node overhead_ms and a per-call call_ms, fitted by "
        "edgesplit.profile.fit to the "
        "published figures listed in each entry.",
        "method": f"least squares on log latency, prior weight {PRIOR_WEIGHT} towards the plain "
        "roofline",
        "entries": [
            {
                "processor": e.processor,
                "precision": e.precision,
                "compute_efficiency": e.compute_efficiency,
                "memory_efficiency": e.memory_efficiency,
                "overhead_ms": e.overhead_ms,
                "call_ms": e.call_ms,
                "figures": list(e.figures),
            }
            for e in entries
        ],
    }


def write_calibration(path: Path, document: dict) -> None:
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")
