"""Predicted costs from a roofline model of a processor, for processors not present here.

latency = launch overhead + max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency)).
The efficiencies per op class are what well-tuned mobile kernels reach in published
measurements (e.g. nn-Meter, MobiSys 2021, Fig. 3; MLPerf Mobile): dense convolutions and
GEMMs reach a good share of peak, depthwise convolutions and elementwise ops are memory bound.

Where ``profiles/fitted/DEVICE.json`` has an entry for the processor at the precision it
runs, its fitted figures replace the guesses: the dense-Conv efficiency (other op classes keep
their ratio to it), the memory efficiency and the per-node overhead; bytes scale with the
precision's element size, and the fitted per-call cost becomes the part dispatch cost. See
:mod:`edgesplit.profile.fit` for how they are fitted.
"""

from __future__ import annotations

import time
from dataclasses import replace

from edgesplit.device.spec import Backend, DeviceSpec, Processor
from edgesplit.model.graph import ModelGraph, Node
from edgesplit.profile.published import ProcessorFit, load_fits
from edgesplit.profile.store import PREDICTED, NodeCost, ProcessorProfile, Profile

# Share of peak FLOPs reached, by op type and processor kind.
_COMPUTE_EFFICIENCY = {
    "cpu": {
        "Conv": 0.55,
        "ConvTranspose": 0.4,
        "Gemm": 0.6,
        "MatMul": 0.6,
        "LSTM": 0.3,
        "GRU": 0.3,
    },
    "gpu": {
        "Conv": 0.45,
        "ConvTranspose": 0.3,
        "Gemm": 0.55,
        "MatMul": 0.5,
        "LSTM": 0.1,
        "GRU": 0.1,
    },
    "npu": {"Conv": 0.6, "ConvTranspose": 0.4, "Gemm": 0.5, "MatMul": 0.5},
    "dsp": {"Conv": 0.5, "Gemm": 0.4, "MatMul": 0.4},
}
_DEFAULT_COMPUTE = 0.25
_MEMORY_EFFICIENCY = 0.6
_ELEMENT_NBYTES = {"fp32": 4, "fp16": 2, "int8": 1}


def _depthwise(node: Node, graph: ModelGraph | None) -> bool:
    if node.op_type != "Conv" or graph is None or len(node.inputs) < 2:
        return False
    w = graph.tensors[node.inputs[1]].shape
    return len(w) >= 2 and w[1] == 1


def plain_efficiency(node: Node, kind: str, graph: ModelGraph | None = None) -> float:
    """Uncalibrated share of peak FLOPs for ``node`` on a processor of this kind."""
    if _depthwise(node, graph):
        return 0.1
    return _COMPUTE_EFFICIENCY.get(kind, {}).get(node.op_type, _DEFAULT_COMPUTE)


def conv_efficiency(kind: str) -> float:
    """The plain share of peak for dense Conv, the reference a calibration rescales."""
    return _COMPUTE_EFFICIENCY.get(kind, {}).get("Conv", _DEFAULT_COMPUTE)


def run_precision(processor: Processor, backend: Backend) -> str:
    """The precision ``processor`` runs a part in on ``backend``: the backend's own (``ort-int8``
    runs int8 QDQ parts, ``ort-fp16`` float16 ones), except that an fp32 backend that converts as
    it runs (QNN HTP's ``enable_htp_fp16_precision``) runs fp16."""
    if backend.precision != "fp32":
        return backend.precision
    if str(backend.options.get("enable_htp_fp16_precision", "")) == "1":
        return "fp16"
    return "fp32"


def roofline_ms(
    node: Node,
    processor: Processor,
    graph: ModelGraph | None = None,
    calibration: ProcessorFit | None = None,
) -> float:
    """Predicted latency of ``node`` on ``processor`` in ms (fitted figures when calibrated)."""
    eff = plain_efficiency(node, processor.kind, graph)
    mem_eff, overhead_ms = _MEMORY_EFFICIENCY, processor.launch_overhead_ms
    nbytes = float(node.bytes_read + node.bytes_written)
    if calibration is not None:
        eff *= calibration.compute_efficiency / conv_efficiency(processor.kind)
        mem_eff, overhead_ms = calibration.memory_efficiency, calibration.overhead_ms
        nbytes *= _ELEMENT_NBYTES[calibration.precision] / 4
    compute_ms = node.flops / (processor.peak_gflops * 1e9 * eff) * 1e3
    memory_ms = nbytes / (processor.mem_bandwidth_gbps * 1e9 * mem_eff) * 1e3
    return overhead_ms + max(compute_ms, memory_ms)


def published_fit_for(
    device: str | None, processor: Processor, backend: Backend
) -> ProcessorFit | None:
    """The shipped calibration entry for this processor at the precision it runs, if any."""
    spec = processor.server or device
    cal = load_fits(spec) if spec else None
    return cal.lookup(processor.name, run_precision(processor, backend)) if cal else None


def _stays_home(graph: ModelGraph, name: str) -> bool:
    """A value the offload server's protocol cannot carry: a sequence, an optional, strings."""
    t = graph.tensors.get(name)
    return t is not None and (t.kind != "tensor" or t.dtype == "object")


def predict(
    graph: ModelGraph, processor: Processor, backend: Backend, *, device: str | None = None
) -> ProcessorProfile:
    """Roofline costs for every node the processor and backend support.

    Args:
        device: Name of the device spec the processor belongs to; with it, the spec's shipped
            calibration (``profiles/fitted/``) is used where it covers the processor.
    """
    started = time.perf_counter()
    calibration = published_fit_for(device, processor, backend)
    nodes: dict[str, NodeCost] = {}
    unsupported: dict[str, str] = {}
    for node in graph.nodes:
        dtypes = tuple(
            dict.fromkeys(
                graph.tensors[t].dtype
                for t in node.inputs
                if t in graph.tensors and not graph.tensors[t].is_weight
            )
        )
        if not processor.supports(node.op_type, dtypes):
            unsupported[node.name] = f"{node.op_type} is not supported by {processor.name}"
            continue
        if not backend.supports(node.op_type):
            unsupported[node.name] = (
                f"{node.op_type} is not supported by {processor.name}/{backend.key}"
            )
            continue
        if processor.is_remote and any(
            _stays_home(graph, t) for t in (*node.inputs, *node.outputs)
        ):
            unsupported[node.name] = (
                f"{node.op_type} reads or writes a sequence or strings, which stay on the device"
            )
            continue
        ms = roofline_ms(node, processor, graph, calibration)
        nodes[node.name] = NodeCost(
            round(ms, 6), round(ms, 6), PREDICTED, round(ms * processor.active_w, 6), 0
        )
    # The per-call cost goes to dispatch_ms (paid per part by the cost model), not into the
    # whole-model figure: costs.py rescales node costs by whole / sum, which would count it twice.
    call_ms = calibration.call_ms if calibration is not None else None
    whole = sum(c.latency_ms for c in nodes.values()) if not unsupported else None
    return ProcessorProfile(
        processor.name,
        backend.key,
        PREDICTED,
        nodes,
        unsupported,
        whole_model_ms=whole,
        whole_model_p90_ms=whole,
        elapsed_s=time.perf_counter() - started,
        dispatch_ms=call_ms,
    )


def complete_profile(graph: ModelGraph, device: DeviceSpec, profile: Profile | None) -> Profile:
    """``profile`` with roofline predictions added for the processors it lacks.

    With no profile at all every entry is predicted; measure the local processors first
    (``edgesplit profile``) for a plan worth running.
    """
    if profile is None:
        profile = Profile(graph.sha256, graph.name, device.name, graph.input_shapes(), ())
    entries = list(profile.entries)
    for proc in device.processors:
        measured = any(e.source == "measured" for e in profile.for_processor(proc.name))
        for backend in proc.backends:
            # A backend left out when the processor itself was measured is not a candidate:
            # a roofline guess must not outbid measurements (untuned TVM is 3.5-35x slower than
            # ORT here, DESIGN.md, while the roofline model knows nothing of tuning).
            if profile.entry(proc.name, backend.key) is None and not measured:
                entries.append(predict(graph, proc, backend, device=device.name))
    return replace(profile, entries=tuple(entries))
